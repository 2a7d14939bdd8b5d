#!/usr/bin/env bash
# The main job on a built-in default: a hybrid fixture (period 4) through the real llama.cpp.
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
