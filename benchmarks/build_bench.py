"""What a fresh machine pays, measured in one run: a clean clone of HEAD with an empty FAMILY_CERTIFY_CACHE through
`make demo` (it bootstraps: the sdist download and the library part of the pinned tree's CMake build, then the
demo), then `make test` (llama-server, the rest of the same build, then the suite); with --bump, a tier-1
`family-certify bump` of the canary's per-bump jobs (gate, memory, server; the README's command) whose candidate
(a llama-cpp-python sdist) is built in the same run. Goals on 2 cores: a fresh `make demo` with the build ≤ 3 min,
`make test` after it ≤ 5 min (issue 56's, set when the suite took 373 s), the bump with its candidate build
≤ 15 min. Prints each phase's seconds (the bootstrap alone too: where the demo's
time goes) and the ratio to its goal.

Run: .venv/bin/python benchmarks/build_bench.py [--bump [--candidate pypi:0.3.35]]   (about 15 minutes; 30 with --bump)
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GOALS = {"make demo (fresh, the build included)": 3 * 60, "make test (after make demo)": 5 * 60,
         "tier-1 bump (candidate build included)": 15 * 60}


def timed(argv: list[str], cwd: Path, env: dict[str, str], log: Path, ok: tuple[int, ...] = (0,)) -> float:
    t0 = time.perf_counter()
    with log.open("w") as f:
        r = subprocess.run(argv, cwd=cwd, env=env, stdout=f, stderr=subprocess.STDOUT)
    if r.returncode not in ok:
        sys.exit(f"{' '.join(argv)} failed (exit {r.returncode}); log: {log}")
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--candidate", default="pypi:0.3.35")
    ap.add_argument("--bump", action="store_true", help="also a tier-1 bump to --candidate, its build included")
    args = ap.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="build-bench-"))
    repo, cache = scratch / "repo", scratch / "cache"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(repo)], check=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FAMILY_CERTIFY_", "VIRTUAL_ENV", "PYTHONPATH"))}
    env.update(FAMILY_CERTIFY_CACHE=str(cache), CI="true")
    got: dict[str, float] = {}
    got["make bootstrap (venv, the pinned build)"] = timed(["make", "bootstrap"], repo, env, scratch / "bootstrap.log")
    got["make demo (after the bootstrap)"] = timed(["make", "demo"], repo, env, scratch / "demo.log")
    got["make demo (fresh, the build included)"] = sum(got.values())
    got["make test (after make demo)"] = timed(["make", "test"], repo, env, scratch / "test.log")
    if args.bump:
        got["tier-1 bump (candidate build included)"] = timed(
            [".venv/bin/family-certify", "bump", "--tier", "1", "--candidate", args.candidate, "--job", "gate",
             "--job", "memory", "--job", "server", "--jobs", "2", "--out", str(scratch / "bump")],
            repo, env, scratch / "bump.log", ok=(0, 1))  # 1: something broke (a verdict)
    for name, s in got.items():
        goal = GOALS.get(name)
        print(f"{name:<42} {s:7.0f} s" + (f"   {s / goal:.2f}× the goal ({goal // 60} min)" if goal else ""))
    print(f"logs: {scratch}")


if __name__ == "__main__":
    main()
