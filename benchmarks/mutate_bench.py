"""Mutants an hour: `family-certify mutate` over a coverage run's lines (each mutant built incrementally, its object
compared, the lanes that ran its line run until one fails), a seeded sample in a fresh --out, timed; printed against
the goal of 60 an hour on 2 cores as a ratio, with the seconds of each status (a build that fails costs a compile; an
equivalent mutant a compile and a comparison; a survivor every covering lane).

Run: .venv/bin/python benchmarks/mutate_bench.py COVERAGE_DIR [--state 12] [--server 4] [--seed 0]
(COVERAGE_DIR: a `family-certify coverage --out` directory of the pinned build)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

GOAL_PER_HOUR = 60.0  # the coverage-and-mutation issue: ≥ 60 mutants an hour on 2 cores
ROOT = Path(__file__).resolve().parent.parent
CLI = str(ROOT / ".venv" / "bin" / "family-certify")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("coverage", type=Path)
    ap.add_argument("--state", type=int, default=12)
    ap.add_argument("--server", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="mutate-bench-") as d:
        t0 = time.perf_counter()
        done = subprocess.run([CLI, "mutate", "--coverage", str(args.coverage), "--out", d, "--state",
                               str(args.state), "--server", str(args.server), "--seed", str(args.seed)], cwd=ROOT,
                              env={**os.environ, "CI": "true"}, stdout=subprocess.PIPE, text=True)
        wall = time.perf_counter() - t0
        if done.returncode != 0:
            sys.exit(f"mutate_bench: family-certify mutate exited {done.returncode}")
        rep = json.loads((Path(d) / "mutate.json").read_text())
    n = len(rep["results"])
    per_hour = 3600.0 * n / wall if wall else 0.0
    by: dict[str, list[float]] = defaultdict(list)
    for r in rep["results"]:
        by[r["status"]].append(r["seconds"])
    print(f"{n} mutants in {wall:.0f} s: {per_hour:.1f} an hour, {per_hour / GOAL_PER_HOUR:.2f}x the goal of "
          f"{GOAL_PER_HOUR:.0f}")
    for status, secs in sorted(by.items()):
        print(f"  {status:<13} {len(secs):>3}  mean {sum(secs) / len(secs):6.1f} s  max {max(secs):6.1f} s")
    print(done.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
