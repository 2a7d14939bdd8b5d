"""schemas/: the JSON Schemas users validate our outputs with. The committed files are the definitions in
fuzz/certify/schemas.py, each a valid draft 2020-12 schema, and real outputs of every oracle, of bundles (the committed
corpora included) and of a family-certify run satisfy them — and a wrong one does not."""

import json

import jsonschema
import pytest

from fuzz.certify.schemas import DIR, RADIX_REPLAY, schemas, validate
from fuzz.repro.bundle import load_case, migrate

from conftest import ROOT, run_cli


def test_committed_schemas_are_the_definitions():
    assert sorted(p.name for p in DIR.glob("*.schema.json")) == sorted(schemas())
    for name, schema in schemas().items():
        assert json.loads((DIR / name).read_text()) == schema, f"regenerate: python -m fuzz.certify.schemas ({name})"
        jsonschema.Draft202012Validator.check_schema(schema)


@pytest.mark.parametrize("bundle", sorted((ROOT / "corpora" / "repros").glob("*/bundle.json")),
                         ids=lambda p: p.parent.name)
def test_committed_bundles_satisfy_the_bundle_schema(bundle):
    validate(json.loads(bundle.read_text()), "bundle")


# every oracle once, as cheaply as it runs (a finding where a mutant makes one cheaply)
RUNS = [
    ("sweep", ["--cuts", "2;1,3", "--stages", "3", "--tokens", "3"], "llama-cpp", 0),
    ("handoff", ["--cuts", "2", "--prompt-len", "4", "--tokens", "2"], "mutant:b1-first-layer-probe", 1),
    ("determinism", ["--threads", "1,2", "--ubatch", "64", "--chunks", "64", "--flash-attn", "off", "--repeats", "2",
                     "--tokens", "2"], "mutant:perturb-2-threads", 1),
    ("isolation", ["--n-seq", "2", "--prompt-len", "4", "--tokens", "2"], "mutant:seq-leak", 1),
    ("memory", ["--programs", "3", "--steps", "8"], "mutant:seq-rm-leaves-one-cell", 1),
    ("prefix-cache", ["--slots", "2", "--rounds", "1", "--tokens", "2", "--n-ctx", "256"], "llama-server", 0),
]


@pytest.mark.llama
@pytest.mark.server
@pytest.mark.parametrize("oracle,args,target,rc", RUNS, ids=[r[0] for r in RUNS])
def test_every_oracles_report_satisfies_the_report_schema(fixtures, tmp_path, oracle, args, target, rc):
    path = fixtures("jamba", layers=4, period=4) if oracle in ("sweep", "handoff") else fixtures("llama", layers=2)
    out = tmp_path / "deep" / "r.json"  # --report creates its directory
    r = run_cli("fuzz", oracle, str(path), *args, "--target", target, "--report", str(out))
    assert r.returncode == rc, r.stdout + r.stderr
    rep = json.loads(out.read_text())
    validate(rep, "report")
    assert rep["oracle"] == oracle and rep["exit_code"] == rc and bool(rep["findings"]) == bool(rc)
    assert all(f["fingerprint"]["oracle"] == oracle for f in rep["findings"])
    broken = {**rep, "status": "diverged"}  # a word outside the one vocabulary
    with pytest.raises(jsonschema.ValidationError):
        validate(broken, "report")


def test_radix_replay_strings_of_both_trees_satisfy_the_schema():
    """A report's radix replay strings (its flaky runs, its `again`): the fixed tree's (r1, a trunk length) and a
    drawn tree's (r2, the tree itself); nothing else."""
    for replay in ("r1:0:8:24:cT,s/cT:A.Bap.A", "r2:1:6:25_0@24+11_1@30+10_2@21+5:c5,k,k/c5,s,e:B.B.B.Abd.A.A"):
        jsonschema.validate(replay, RADIX_REPLAY)
    for bad in ("r2:1:6:c5,k,k:A.A.A", "r3:0:8:24:cT:A", "r1:0:8:x_1:cT:A"):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, RADIX_REPLAY)


def test_a_schema_1_bundle_is_read_in_schema_2s_words(tmp_path):
    src = ROOT / "corpora" / "repros" / "kimi-linear-isolation-per-seq-kv"
    data = json.loads((src / "bundle.json").read_text())
    v1 = {**{k: v for k, v in data.items() if k != "build"}, "schema": 1,
          "fingerprint": {"oracle": "isolation", "status": "crash", "kv_unified": False, "seq": None}}
    assert migrate(v1)["fingerprint"] == {"oracle": "isolation", "status": "crash", "phase": "per-seq-kv"}
    assert migrate({"oracle": "prefix-cache", "config": {"n_predict": 1}, "fingerprint": {
        "oracle": "prefix-cache", "status": "leaked-slot"}})["config"] == {"tokens": 1}
    (tmp_path / "fixture.gguf").write_bytes((src / "fixture.gguf").read_bytes())
    (tmp_path / "bundle.json").write_text(json.dumps(v1))
    case, fp = load_case(tmp_path)
    assert fp == data["fingerprint"]
    assert case.config == {**data["config"], "flash_attn": [False]}  # recorded before isolation ran it on too
    r = run_cli("fuzz", "replay", str(tmp_path / "nope"))
    assert r.returncode == 2


@pytest.mark.llama
def test_a_bump_report_satisfies_the_bump_schema(tmp_path):
    """A real bump (the pinned build against itself: every verdict unchanged) and the aggregate of it as a shard;
    a verdict outside the vocabulary fails."""
    out = tmp_path / "bump"
    r = run_cli("family-certify", "bump", "llama", "--lane", "load", "--candidate", "pinned", "--out", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    rep = json.loads((out / "report.json").read_text())
    validate(rep, "bump")
    assert [(x["lane"], x["verdict"]) for x in rep["results"]] == [("load", "unchanged"), ("cross-build", "unchanged")]
    agg = tmp_path / "agg"
    r = run_cli("family-certify", "aggregate", str(out), "--row", "llama", "--lane", "load", "--out", str(agg))
    assert r.returncode == 0, r.stdout + r.stderr
    validate(json.loads((agg / "report.json").read_text()), "bump")
    with pytest.raises(jsonschema.ValidationError):
        validate({**rep, "results": [{**rep["results"][0], "verdict": "regressed"}]}, "bump")
