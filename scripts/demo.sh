#!/usr/bin/env bash
# The main job on a built-in default: a hybrid fixture (period 4) through the real llama.cpp, every cut.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=.venv/bin
out=build/demo
mkdir -p "$out"
echo "== synth make hybrid --period 4"
"$bin/synth" make hybrid --period 4 -o "$out/hybrid.gguf"
echo "== synth inspect"
"$bin/synth" inspect "$out/hybrid.gguf"
echo "== fuzz run (real llama.cpp, pinned)"
"$bin/fuzz" run "$out/hybrid.gguf" --tokens 32
echo "== fuzz sweep: full model vs 2-stage chain at every cut (prefill, decode, batched decode; bit-exact)"
"$bin/fuzz" sweep "$out/hybrid.gguf" --report "$out/sweep.json"
echo "== fuzz handoff: state export/import at every prompt offset, every period cut"
"$bin/fuzz" handoff "$out/hybrid.gguf" --cuts period --report "$out/handoff.json"
echo "== the same hand-off against a target re-creating bug B1 (expected: caught at the attention-first cut)"
if "$bin/fuzz" handoff "$out/hybrid.gguf" --cuts period --modes full --target mutant:b1-first-layer-probe \
    --bundle "$out/bundles" | tail -4; then
  echo "demo: the B1 mutant was NOT caught" >&2
  exit 1
fi
echo "demo: reports in $out/, repro bundle(s) in $out/bundles/ (replay: $bin/fuzz replay <bundle>)"
