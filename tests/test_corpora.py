"""Committed repro bundles (corpora/repros/) replay: each known bug class re-created by a mutant is still caught,
and the real llama.cpp does not reproduce it."""

import json

import pytest

from fuzz.bundle import replay

from conftest import ROOT, run_cli

pytestmark = pytest.mark.llama
BUNDLES = sorted(p for p in (ROOT / "corpora" / "repros").iterdir() if (p / "bundle.json").is_file())


def test_there_are_repros():
    assert len(BUNDLES) >= 2


@pytest.mark.parametrize("bundle", BUNDLES, ids=[b.name for b in BUNDLES])
def test_repro_bundle_still_reproduces(bundle):
    data = json.loads((bundle / "bundle.json").read_text())
    assert data["target"].startswith("mutant:")
    ok, fp, _ = replay(bundle)
    assert ok, fp
    assert run_cli("fuzz", "replay", str(bundle), "--target", "llama-cpp").returncode == 0
