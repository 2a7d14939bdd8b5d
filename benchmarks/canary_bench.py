"""The canary's wall from a warm build cache (llama-upstream-canary.yml), its commands run here one after another as
its jobs run them: `build` (make bootstrap finding the wheel in the cache, `family-certify build` of the candidate,
the matrix), every `bump` shard of the three per-bump jobs (each `family-certify bump ROWS --job JOB --jobs 2`, as
a shard runs it on its own 2-core runner), then `aggregate`. On CI the shards run side by side, so the canary's wall
is the build, the longest shard and the aggregate; printed against the 5-minute goal as a ratio, with every
shard's seconds. What a runner spends outside these commands (checkout, setup-python, moving the build artifact) is
not measured here.

Run: .venv/bin/python benchmarks/canary_bench.py [--candidate pinned] [--base pinned] [--shards 4]
(about 10 minutes on 2 cores: every shard runs here in turn)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GOAL_S = 300.0  # the certificate issue: the canary's wall from a warm build cache ≤ 5 min
ROOT = Path(__file__).resolve().parent.parent
CLI = str(ROOT / ".venv" / "bin" / "family-certify")


def timed(cmd: list[str], ok: tuple[int, ...] = (0,)) -> tuple[float, str]:
    """One command as the workflow runs it (plain lines, as in CI): its wall and its stdout."""
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "CI": "true"}, stdout=subprocess.PIPE, text=True)
    wall = time.perf_counter() - t0
    if done.returncode not in ok:
        sys.exit(f"canary_bench: {' '.join(cmd)} exited {done.returncode}")
    return wall, done.stdout


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--candidate", default="pinned", help="the canary's candidate (a build already in the cache)")
    ap.add_argument("--base", default="pinned")
    ap.add_argument("--tier", default="1")
    ap.add_argument("--shards", default="4", help="bump shards per CI job (the canary's default)")
    args = ap.parse_args()
    jobs = ("gate", "memory", "server")
    build_s, _ = timed(["make", "bootstrap"])
    s, _ = timed([CLI, "build", "--llama-cpp", args.candidate, "--json"])
    build_s += s
    s, out = timed([CLI, "matrix", "--tier", args.tier, *(x for j in jobs for x in ("--job", j)),
                    "--shards", args.shards])
    build_s += s
    include = json.loads(out)["include"]
    print(f"build (warm): {build_s:.1f} s; {len(include)} bump shards")
    shards: list[tuple[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="canary-bench-") as d:
        dirs = []
        for e in include:
            out_dir = Path(d) / f"{e['job']}-{e['shard']}"
            dirs.append(str(out_dir))
            wall, _ = timed([CLI, "bump", *e["rows"].split(), "--tier", args.tier, "--job", e["job"], "--base",
                             args.base, "--candidate", args.candidate, "--jobs", "2", "--out", str(out_dir)],
                            ok=(0, 1))  # 1: a row broke, still a canary that ran
            shards.append((f"{e['job']} {e['shard']}/{e['of']}", wall))
            print(f"  bump {shards[-1][0]}: {wall:.1f} s ({e['rows']})")
        agg_s, _ = timed([CLI, "aggregate", *dirs, "--tier", args.tier, *(x for j in jobs for x in ("--job", j)),
                          "--out", str(Path(d) / "all")], ok=(0, 1))
    name, longest = max(shards, key=lambda kv: kv[1])
    wall = build_s + longest + agg_s
    print(f"aggregate: {agg_s:.1f} s")
    print(f"canary wall (build + longest shard, {name}, + aggregate): {wall:.1f} s: {wall / GOAL_S:.2f}x the "
          f"{GOAL_S:.0f} s goal; every shard one after another: {sum(s for _, s in shards):.0f} s")


if __name__ == "__main__":
    main()
