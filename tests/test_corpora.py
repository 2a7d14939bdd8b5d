"""Committed repro bundles (corpora/repros/) replay: each known bug class re-created by a mutant is still caught and
the real llama.cpp does not reproduce it; each upstream finding on the pinned llama.cpp still reproduces (when it
stops, the manifest's `known` entry and the bundle go)."""

import json

import pytest

from fuzz.repro.bundle import replay

from conftest import ROOT, run_cli

pytestmark = pytest.mark.llama
BUNDLES = sorted(p for p in (ROOT / "corpora" / "repros").iterdir() if (p / "bundle.json").is_file())


def test_there_are_repros():
    assert len(BUNDLES) >= 2


@pytest.mark.parametrize("bundle", BUNDLES, ids=[b.name for b in BUNDLES])
def test_repro_bundle_still_reproduces(bundle):
    data = json.loads((bundle / "bundle.json").read_text())
    assert data["target"].startswith("mutant:") or data["target"] in ("llama-cpp", "llama-server")
    ok, fp, _ = replay(bundle)
    assert ok, fp
    if data["target"].startswith("mutant:"):  # the bug is the mutant's: the real binary is clean
        real = "llama-server" if data["oracle"] in ("prefix-cache", "radix") else "llama-cpp"
        assert run_cli("fuzz", "replay", str(bundle), "--target", real).returncode == 0
    else:  # an upstream finding: docs/findings.md explains it
        assert f"(`{bundle.name}`)" in (ROOT / "docs" / "findings.md").read_text()
