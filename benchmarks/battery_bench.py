"""The per-bump CI jobs' time on tier 1, each in one run as CI runs it: `family-certify run --tier 1 --job gate
--jobs N`, then `--job memory` and `--job server` (the manifest's [jobs]: the three required jobs of every bump,
side by side), each wall against its goal (gate ≤ 60 s, memory ≤ 60 s, server ≤ 90 s on 2 cores) as a ratio, how
busy it kept the cores (CPU time of it and every process it started, over wall × cores), and where the lanes' time
went — summed per lane, the slowest rows, the share of the lanes that report it spent inside llama.cpp's
`llama_decode`, and what the goal would cost.

Run: .venv/bin/python benchmarks/battery_bench.py [--jobs 2] [--job gate] [--row llama ...] [--report R.json]
(about 5 minutes on 2 cores; --report reads a run already made instead of running one)
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

# The goals for the per-bump jobs, tier 1, --jobs 2 on 2 cores (memory, once in the gate, keeps its goal).
GOALS_S = {"gate": 60.0, "memory": 60.0, "server": 90.0}
ROOT = Path(__file__).resolve().parent.parent


def run_battery(job: str, jobs: int, rows: list[str], out: Path) -> tuple[float, float]:
    """One CI job as a user runs it (plain lines, as in CI): its wall and the CPU seconds it and its children used."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    cmd = [str(ROOT / ".venv" / "bin" / "family-certify"), "run", "--tier", "1", "--job", job, "--jobs", str(jobs),
           "--out", str(out), *rows]
    done = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "CI": "true"}, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode not in (0, 1):  # 1: a finding, still a battery that ran
        sys.exit(f"battery_bench: {' '.join(cmd)} exited {done.returncode}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def decode_seconds(lane: dict) -> float | None:
    """llama_decode seconds the lane's oracle reports counted (sweep, wire, hand-off do; others do not)."""
    found = [r["timing"]["llama_decode_s"] for r in lane.get("reports", []) if "llama_decode_s" in r.get("timing", {})]
    return sum(found) if found else None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=2, help="rows at a time (family-certify run --jobs)")
    ap.add_argument("--job", action="append", choices=sorted(GOALS_S), help="only this CI job (repeatable)")
    ap.add_argument("--row", action="append", default=[], help="only these tier-1 rows (repeatable)")
    ap.add_argument("--report", type=Path, help="a report.json of one --job's run already made: read it, run nothing")
    args = ap.parse_args()
    chosen = args.job or list(GOALS_S)
    if args.report and len(chosen) != 1:
        sys.exit("battery_bench: --report reads one job's run: name it with --job")
    for job in chosen:
        cpu = None
        if args.report:
            report = json.loads(args.report.read_text())
            wall = report["wall_s"]
        else:
            with tempfile.TemporaryDirectory(prefix="battery-bench-") as d:
                wall, cpu = run_battery(job, args.jobs, args.row, Path(d))
                report = json.loads((Path(d) / "report.json").read_text())
        describe(job, report["results"], wall, cpu)
        print()


def describe(job: str, lanes: list[dict], wall: float, cpu: float | None) -> None:
    goal = GOALS_S[job]
    per_lane: dict[str, float] = defaultdict(float)
    per_row: dict[str, float] = defaultdict(float)
    decoded = reported = 0.0
    for x in lanes:
        per_lane[x["lane"]] += x["seconds"]
        per_row[x["row"]] += x["seconds"]
        d = decode_seconds(x)
        if d is not None:
            decoded, reported = decoded + d, reported + x["seconds"]
    summed = sum(per_lane.values())
    statuses: dict[str, int] = defaultdict(int)
    for x in lanes:
        statuses[x["status"]] += 1
    print(f"tier-1 {job} job: {len(per_row)} rows, {len(lanes)} lanes ("
          + ", ".join(f"{n} {s}" for s, n in sorted(statuses.items())) + ")")
    print(f"wall {wall:.1f} s: {wall / goal:.2f}x the {goal:.0f} s goal"
          + (f"; CPU {cpu:.0f} s, {cpu / (wall * (os.cpu_count() or 1)):.0%} of {os.cpu_count()} cores" if cpu else ""))
    print(f"lanes summed {summed:.1f} s ({summed / wall:.2f}x the wall: rows run side by side)")
    for lane, s in sorted(per_lane.items(), key=lambda kv: -kv[1]):
        print(f"  {lane:15} {s:7.1f} s  {s / summed:5.1%}")
    print("slowest rows: " + ", ".join(f"{r} {s:.1f} s" for r, s in sorted(per_row.items(), key=lambda kv: -kv[1])[:5]))
    if reported:
        print(f"llama_decode: {decoded:.1f} s of the {reported:.1f} s of the lanes that report it "
              f"({decoded / reported:.0%})")
    if wall <= goal or len(per_lane) < 2:
        return
    # what the goal would cost in coverage: the wall without a lane, estimated as the wall less that lane's share
    # of the summed lane time (its rows' neighbours then run with less contention: a rough, not a measured, figure)
    share = sorted(((lane, wall * s / summed) for lane, s in per_lane.items()), key=lambda kv: -kv[1])
    print("estimated wall without a lane: " + ", ".join(f"{lane} {wall - w:.0f} s" for lane, w in share[:4]))
    dropped: list[str] = []
    left = wall
    for lane, w in share:
        if left <= goal:
            break
        dropped.append(lane)
        left -= w
    print(f"under the goal only without {', '.join(dropped)} (estimated {left:.0f} s)")


if __name__ == "__main__":
    main()
