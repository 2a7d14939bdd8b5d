"""The fuzz lane (slow; `make test-slow`, CI nightly): Hypothesis-generated fixtures of every family (any weight
dtype), each swept at every cut, handed off at every period cut and checked for sequence isolation against the
real llama.cpp. Upstream findings already bundled in corpora/repros (same arch and fingerprint) do not fail it.
A failing spec is shrunk by Hypothesis (its choice sequence, so every shrunk spec is still legal) and the minimal
failure is written as a repro bundle under corpora/findings/ for a bug report.

Budget: FAMILY_CERTIFY_FUZZ_EXAMPLES (default 30) examples; seeds in corpora/seeds/*.json run first."""

import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, example, given, settings

from fuzz.bundle import Case, bundle_findings, bundle_one
from fuzz.handoff import Handoff, HandoffConfig
from fuzz.isolation import Isolation, IsolationConfig
from fuzz.sweep import Sweep, SweepConfig
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


def known_upstream() -> set[tuple[str, str, bool]]:
    """(kind, status, kv_unified) of the upstream isolation findings bundled in corpora/repros."""
    out = set()
    for b in sorted((ROOT / "corpora" / "repros").glob("*/bundle.json")):
        data = json.loads(b.read_text())
        if data["oracle"] == "isolation" and data["target"] == "llama-cpp":
            out.add((kind_of(b.parent / data["fixture"]), data["fingerprint"]["status"],
                     data["fingerprint"]["kv_unified"]))
    return out


KNOWN_UPSTREAM = known_upstream()


def seeds() -> list[ModelSpec]:
    out = []
    for f in sorted((ROOT / "corpora" / "seeds").glob("*.json")):
        for entry in json.loads(f.read_text())["specs"]:
            knobs = {k: tuple(v) if isinstance(v, list) else v for k, v in entry.items() if k != "family"}
            out.append(FAMILIES[entry["family"]].resolve(Knobs(**knobs)))
    return out


def check(spec: ModelSpec, tmp: Path) -> None:
    path = tmp / "f.gguf"
    write_fixture(spec, path)
    rep = Sweep(path, SweepConfig(cuts="all", tokens=4)).run()
    data = rep.to_dict()
    bad = [r for r in data["results"] if r["status"] in ("diverged", "crash", "timeout")]
    if bad or rep.control.get("status") not in ("pass", "unsupported"):
        bundle_findings("sweep", path, data["results"], rep.kinds,
                        {"tokens": 4, "prompt_len": 24, "chunk": 7, "n_seq": 3,
                         "phases": ["prefill", "decode", "batched"], "seed": 0}, "llama-cpp", FINDINGS,
                        rep.llama_cpp_commit)
    assert not bad, (spec.to_json(), bad)
    assert rep.control.get("status") in ("pass", "unsupported"), (spec.to_json(), rep.control)
    iso = Isolation(path, IsolationConfig(tokens=3)).run()
    # Random specs are sharper than the manifest's fixtures: where a sequence sits in the cache (summation order)
    # and the batch's shape (kernel paths) move low bits, and a near-tie discrete choice downstream (MoE routing,
    # bf16/q8_1 activation rounding, top-k) can turn that into more than the tolerance. The oracle reports what its
    # cause shows to be numerics apart (batch shape; a named routing flip); activation rounding at a cell position
    # has no named flip, so a cell-position cause is excused here too. A leak (cause "batch": the neighbours' data
    # reaches it) always fails; an upstream finding of this kind excuses the same status otherwise.
    new = [f for f in iso["findings"] if f.get("cause", {}).get("kind") == "batch"
           or (f.get("cause", {}).get("kind") != "cell position"
               and (kind_of(path), f["status"], f["kv_unified"]) not in KNOWN_UPSTREAM)]
    if new:
        f = new[0]
        bundle_one(Case("isolation", path, [], {"n_seq": 4, "prompt_len": 12, "tokens": 3, "tol": 0.1, "seed": 0,
                                                "kv_unified": [f["kv_unified"]]}, "llama-cpp"),
                   FINDINGS / f"{spec.family}-isolation-{spec.seed}", iso["llama_cpp_commit"])
    assert not new, (spec.to_json(), new)
    if spec.pattern.count("A") and spec.pattern.count("R"):
        ho = Handoff(path, HandoffConfig(cuts="period", prompt_len=6, tokens=2)).run()
        bad = [r for r in ho["results"] if r["status"] in ("diverged", "crash", "timeout")]
        if bad:
            bundle_findings("handoff", path, ho["results"], ho["kinds"],
                            {"tokens": 2, "prompt_len": 6, "chunk": 5, "decode_offsets": 2,
                             "modes": ["full", "partial"], "seed": 0}, "llama-cpp", FINDINGS,
                            ho["llama_cpp_commit"])
        assert not bad, (spec.to_json(), bad)


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
