"""The per-bump jobs through cmd: (slow; `make test-slow`): the unmodified llama.cpp worker run as another program, as
a user certifies their own runtime, on a row of each kind — dense, hybrid, recurrent, sliding-window, MLA with the
DSA indexer — gives exactly the built-in target's statuses, lane by lane. (A verdict that trusted the target for its
kind made laguna's hand-off a finding through cmd:. The server job runs the build's llama-server for a library
target either way: fleet.server_spec.)"""

import json
import sys

import pytest

from conftest import run_cli

pytestmark = [pytest.mark.slow, pytest.mark.llama]

ROWS = ["qwen3", "jamba", "mamba", "laguna", "deepseek3"]
WORKER = f'cmd:"{sys.executable}" -m targets.llama_cpp_worker'


def statuses(tmp_path, target: str) -> dict[tuple[str, str], str]:
    out = tmp_path / f"{target.split(':')[0]}.json"
    r = run_cli("family-certify", "run", *ROWS, "--job", "gate", "--job", "memory", "--jobs", "2", "--target", target,
                "--report", str(out), timeout=1800)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    return {(x["row"], x["lane"]): x["status"] for x in json.loads(out.read_text())["results"]}


def test_the_per_bump_jobs_behind_cmd_give_the_built_in_targets_statuses(tmp_path):
    built_in, behind_cmd = statuses(tmp_path, "llama-cpp"), statuses(tmp_path, WORKER)
    assert behind_cmd == built_in
    assert ("laguna", "handoff") in built_in and {r for r, _ in built_in} == set(ROWS)
