"""Per family: fixture generation time and file size. Goals: ≤ 0.2 s and ≤ 1 MB per fixture.

Run: .venv/bin/python benchmarks/synth_bench.py [--layers N]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from synth.families import FAMILIES
from synth.make import resolve, write_fixture
from synth.spec import Knobs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=None, help="override every family's layer count")
    ap.add_argument("--repeat", type=int, default=5, help="best of N runs")
    args = ap.parse_args()
    print(f"{'family':<14} {'layers':>6} {'gen_s':>7} {'bytes':>9}  goal(<=0.2s, <=1MB)")
    worst_t, worst_b = 0.0, 0
    with tempfile.TemporaryDirectory() as d:
        for name in FAMILIES:
            spec = resolve(name, Knobs(layers=args.layers))
            best = float("inf")
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                size = write_fixture(spec, Path(d) / f"{name}.gguf")
                best = min(best, time.perf_counter() - t0)
            ok = best <= 0.2 and size <= 1 << 20
            worst_t, worst_b = max(worst_t, best), max(worst_b, size)
            print(f"{name:<14} {spec.n_layer:>6} {best:>7.3f} {size:>9}  {'ok' if ok else 'MISSED'}")
    print(f"worst: {worst_t:.3f} s, {worst_b} bytes")


if __name__ == "__main__":
    main()
