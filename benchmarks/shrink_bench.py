"""How fast a finding becomes a minimal bundle, per shipped mutant: time to find (the oracle run that reports it),
time to shrink (the second reproduction, then every candidate the shrinker tries), oracle runs, and the shrunk
shape — layers, width, vocab, bytes — in one run. Goal (issue: 24-layer jamba with the B1 mutant): the shrunk
fixture ≤ 64 KB in ≤ 20 s on 2 cores.

Run: .venv/bin/python benchmarks/shrink_bench.py [--only b1-first-layer-probe]   (about 3 minutes)
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from fuzz.oracles.registry import get_oracle
from fuzz.repro.bundle import bundle_findings
from synth.make import resolve, write_fixture
from synth.manifest import load_manifest
from synth.spec import Knobs

GOAL_KB, GOAL_S = 64, 20.0

# mutant[@case]: (oracle, family or row:ROW, knobs, config fields) — a large fixture where the mutant is caught
CASES = {
    "b1-first-layer-probe": ("handoff", "jamba", {"layers": 24, "period": 4}, {"cuts": "2", "modes": ("full",)}),
    "b4-kidx-not-exported": ("handoff", "deepseek32", {"layers": 8}, {"cuts": "2", "modes": ("full",)}),
    "b5-uniform-kv-rows": ("handoff", "row:laguna", {}, {"cuts": "all", "modes": ("full",)}),  # its uneven K/V
    "batched-rows-swapped": ("sweep", "qwen3next", {"layers": 16, "period": 4}, {"cuts": "3"}),
    "batched-rows-swapped@3-stages": ("sweep", "qwen3next", {"layers": 16, "period": 4}, {"cuts": "3,9"}),
    "seq-leak": ("isolation", "llama", {"layers": 12}, {}),
    "rollback-zeroed": ("handoff", "jamba", {"layers": 12, "period": 4}, {"cuts": "2", "modes": ("partial",)}),
    "stage-q4k-mins-dropped": ("sweep", "llama", {"layers": 8, "dtype": "q4_k", "embd": 256}, {"cuts": "4"}),
    "wire-f16-truncated": ("wire", "qwen3next", {"layers": 12, "period": 4}, {"cuts": "3", "wire": "f16"}),
    "radix-dup-leak": ("radix", "llama", {"layers": 8}, {}),
    "radix-replace-live-borrower": ("radix", "llama", {"layers": 8}, {}),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", action="append", help="only these cases, e.g. b1-first-layer-probe (repeatable)")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="shrink-bench-") as d:
        for case, (oracle_name, family, knobs, fields) in CASES.items():
            if args.only and case not in args.only:
                continue
            mutant = case.split("@")[0]
            fixture = Path(d) / f"{family.replace(':', '-')}-{case}.gguf"
            spec = load_manifest(None).row(family[4:]).spec() if family.startswith("row:") else \
                resolve(family, Knobs(**knobs))
            write_fixture(spec, fixture)
            oracle = get_oracle(oracle_name)
            cfg = oracle.config(**fields, target=f"mutant:{mutant}")
            t0 = time.perf_counter()
            rep = oracle.run(fixture, cfg)
            found = time.perf_counter() - t0
            if not rep.findings:
                rows.append((case, "NOT FOUND (no finding to shrink)", found, 0.0, 0, 0, 0.0))
                continue
            t1 = time.perf_counter()
            (bundle, *_) = bundle_findings(rep, oracle.case_config(cfg), Path(d) / "bundles", max_bundles=1)
            shrunk = time.perf_counter() - t1
            data = json.loads((bundle / "bundle.json").read_text())
            spec = data["spec"]
            shape = (f"{spec['pattern']} cuts {data['cuts']}, embd {spec['n_embd']}, heads {spec['n_head']}, "
                     f"ff {spec['n_ff']}, vocab {spec['n_vocab']}")
            kb = (bundle / "fixture.gguf").stat().st_size / 1024
            rows.append((case, shape, found, shrunk, data["shrink"]["runs"], fixture.stat().st_size // 1024, kb))
    print(f"{'mutant[@case]':28} {'find s':>7} {'shrink s':>8} {'runs':>5} {'from KB':>8} {'to KB':>6}  shrunk shape")
    for mutant, shape, found, shrunk, runs, before, kb in rows:
        print(f"{mutant:28} {found:7.1f} {shrunk:8.1f} {runs:5d} {before:8d} {kb:6.0f}  {shape}")
    for mutant, _, _, shrunk, _, _, kb in rows:
        if mutant == "b1-first-layer-probe":
            print(f"B1 on 24-layer jamba: {kb:.0f} KB (goal ≤ {GOAL_KB}: ratio {kb / GOAL_KB:.2f}), shrink "
                  f"{shrunk:.1f} s (goal ≤ {GOAL_S:g}: ratio {shrunk / GOAL_S:.2f})")


if __name__ == "__main__":
    main()
