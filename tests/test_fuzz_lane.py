"""The fuzz lane (slow; `make test-slow`, CI nightly): Hypothesis-generated fixtures of every family, each swept at
every cut and handed off at every period cut against the real llama.cpp. A failing spec is shrunk by Hypothesis
(its choice sequence, so every shrunk spec is still legal) and the minimal failure is written as a repro bundle
under corpora/findings/ for a bug report.

Budget: FAMILY_CERTIFY_FUZZ_EXAMPLES (default 30) examples; seeds in corpora/seeds/*.json run first."""

import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, example, given, settings

from fuzz.bundle import bundle_findings
from fuzz.handoff import Handoff, HandoffConfig
from fuzz.sweep import Sweep, SweepConfig
from synth.families import FAMILIES
from synth.make import write_fixture
from synth.spec import Knobs, ModelSpec
from synth.strategies import specs

from conftest import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.llama]
EXAMPLES = int(os.environ.get("FAMILY_CERTIFY_FUZZ_EXAMPLES", "30"))
FINDINGS = ROOT / "corpora" / "findings"


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
