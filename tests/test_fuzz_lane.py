"""The fuzz lane (slow; `make test-slow`, CI nightly): Hypothesis-generated fixtures of every family (any weight
dtype), each swept at every cut, handed off at every period cut and checked for sequence isolation against the
real llama.cpp. Upstream findings already bundled in corpora/repros (same arch and fingerprint) do not fail it.
A failing spec is shrunk by Hypothesis (its choice sequence, so every shrunk spec is still legal) and the minimal
failure is written as a repro bundle under corpora/findings/ for a bug report.

Budget: FAMILY_CERTIFY_FUZZ_EXAMPLES (default 30) examples; seeds in corpora/seeds/*.json run first."""

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, example, given, settings

from fuzz.engine.contract import Report
from fuzz.oracles.handoff_state import HandoffConfig
from fuzz.oracles.isolation import IsolationConfig
from fuzz.oracles.registry import ORACLES
from fuzz.oracles.sweep_report import SweepConfig
from fuzz.repro.bundle import bundle_findings
from fuzz.repro.campaign import layout_family
from synth.families import FAMILIES
from synth.inspect import inspect_file
from synth.make import write_fixture
from synth.spec import Knobs, ModelSpec
from synth.strategies import specs

from conftest import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.llama]
EXAMPLES = int(os.environ.get("FAMILY_CERTIFY_FUZZ_EXAMPLES", "30"))
FINDINGS = ROOT / "corpora" / "findings"


def kind_of(path: Path) -> str:
    """What an upstream isolation finding is about: the DSA lightning indexer (every arch that has one), else the
    arch."""
    info = inspect_file(str(path))
    return "dsa-indexer" if any(x.indexer for x in info.layers) else info.arch


def known_upstream() -> set[tuple[str, str, str]]:
    """(kind, status, KV layout) of the upstream isolation findings bundled in corpora/repros."""
    out = set()
    for b in sorted((ROOT / "corpora" / "repros").glob("*/bundle.json")):
        data = json.loads(b.read_text())
        if data["oracle"] == "isolation" and data["target"] == "llama-cpp":
            out.add((kind_of(b.parent / data["fixture"]), data["fingerprint"]["status"],
                     layout_family(data["fingerprint"]["phase"])))
    return out


KNOWN_UPSTREAM = known_upstream()


def seeds() -> list[ModelSpec]:
    out = []
    for f in sorted((ROOT / "corpora" / "seeds").glob("*.json")):
        for entry in json.loads(f.read_text())["specs"]:
            knobs = {k: tuple(v) if isinstance(v, list) else v for k, v in entry.items() if k != "family"}
            out.append(FAMILIES[entry["family"]].resolve(Knobs(**knobs)))
    return out


def run(oracle: str, path: Path, cfg) -> Report:
    """One oracle run; its findings (if any) reproduced, shrunk and bundled under corpora/findings/."""
    rep = ORACLES[oracle].run(path, cfg)
    if rep.findings:
        bundle_findings(rep, ORACLES[oracle].case_config(cfg), FINDINGS)
    return rep


def check(spec: ModelSpec, tmp: Path) -> None:
    path = tmp / "f.gguf"
    write_fixture(spec, path)
    rep = run("sweep", path, SweepConfig(cuts="all", tokens=4))
    assert not rep.findings, (spec.to_json(), [f.message for f in rep.findings])
    iso = ORACLES["isolation"].run(path, IsolationConfig(tokens=3))
    # Random specs are sharper than the manifest's fixtures: where a sequence sits in the cache (summation order)
    # and the batch's shape (kernel paths) move low bits, and a near-tie discrete choice downstream (MoE routing,
    # bf16/q8_1 activation rounding, top-k) can turn that into more than the tolerance. What the oracle's cause
    # analysis shows to be numerics (the batch's shape, cells and shape together, a named routing flip) is reported
    # apart and is not a finding; nothing else is excused here but an upstream finding already bundled (same kind,
    # status and KV layout, flash attention on or off alike) — and never a leak (cause "batch": the neighbours'
    # data reaches it).
    new = [f for f in iso.findings if (f.cause or {}).get("kind") == "batch"
           or (kind_of(path), f.status, layout_family(f.phase)) not in KNOWN_UPSTREAM]
    if new:
        bundle_findings(replace(iso, findings=new), ORACLES["isolation"].case_config(IsolationConfig(tokens=3)),
                        FINDINGS / f"{spec.family}-{spec.seed}")
    assert not new, (spec.to_json(), [f.message for f in new])
    if spec.pattern.count("A") and spec.pattern.count("R"):
        ho = run("handoff", path, HandoffConfig(cuts="period", prompt_len=6, tokens=2))
        assert not ho.findings, (spec.to_json(), [f.message for f in ho.findings])


def with_seed_examples(fn):
    for s in seeds():
        fn = example(spec=s)(fn)
    return fn


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=False)
@given(spec=specs(max_layers=8))
@with_seed_examples
def test_generated_fixtures_split_and_hand_off_exactly(tmp_path_factory, spec):
    assume(spec.n_layer >= 2)  # a split needs a cut
    check(spec, tmp_path_factory.mktemp("lane"))
