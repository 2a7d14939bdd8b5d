"""Every mutant caught: the battery's power, the whole of it. Slow (about a minute and a half of two cores): the
default suite runs the mutants job with the two mutants no other default test catches (tests/test_workflows.py),
each other mutant is caught by its oracle's own tests, and the family-certify workflow's mutants job runs them all
on every push that touches the toolkit."""

from __future__ import annotations

import json

import pytest

from targets.mutants import MUTANTS

from conftest import ROOT, run_cli

pytestmark = [pytest.mark.slow, pytest.mark.llama, pytest.mark.server]


def test_every_mutant_is_caught(tmp_path):
    out = tmp_path / "out"
    r = run_cli("family-certify", "mutants", "--jobs", "2", "--out", str(out), cwd=ROOT, timeout=1800)
    assert r.returncode == 0, r.stdout[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert [(x["row"], x["status"]) for x in report["results"]] == [(f"mutant:{n}", "pass") for n in MUTANTS]
    assert f"{len(MUTANTS)} mutants: {len(MUTANTS)} caught, 0 escaped" in r.stdout
