"""The skippy adapter (targets/skippy.py, targets/skippy_worker.py, the skippy oracle): its config and identity checks,
the users' outcome words, report reading — and, against the fake skippy (tests/fake_skippy/, the real llama.cpp
under skippy's CLI and HTTP), the lanes: clean on the correct fake; the fakes that mis-handle a boundary, load a
dropped family, write a malformed report or hang each fail the lane that must catch them."""

import json
import os
import stat

import pytest

from synth.errors import UserError
from synth.manifest import load_manifest
from targets.skippy import classify, identity, parse_version, read_config
from targets.skippy_worker import read_report, report_ok

from conftest import ROOT, run_cli
from helpers import impostor as impostor_server

FAKE = ROOT / "tests" / "fake-skippy.toml"


def stub(tmp_path, name="skippy", version="skippy 1.2.3 (commit abcdef1234567, abi 0.1.67)"):
    """A binary that only answers --version (for the config and identity checks)."""
    p = tmp_path / name
    p.write_text(f"#!/bin/sh\necho '{version}'\n")
    p.chmod(p.stat().st_mode | stat.S_IXUSR)
    return p


def config(tmp_path, body: str):
    p = tmp_path / "skippy.toml"
    p.write_text(body)
    return p


@pytest.mark.parametrize("body, says", [
    ("[skippy]\nbinary = 'nope'\n", "no such file"),
    ("[skippy]\n", "binary is required"),
    ("[skipy]\nbinary = 'skippy'\n", "unknown section [skipy]"),
    ("[skippy]\nbinary = 'skippy'\nport = 3\n", "unknown key [skippy] port"),
    ("[skippy]\nbinary = 'skippy'\nload_mode = 'whole'\n", "load_mode 'whole'"),
    ("[skippy]\nbinary = 'skippy'\n[timeouts]\nready = 'soon'\n", "[timeouts] ready = 'soon': wrong type"),
    ("[skippy\n", "not valid TOML"),
])
def test_config_errors_name_the_problem(tmp_path, body, says):
    stub(tmp_path)
    with pytest.raises(UserError, match="skippy config") as e:
        read_config(config(tmp_path, body))
    assert says in str(e.value)


def test_identity_checks_commit_and_abi(tmp_path):
    stub(tmp_path)
    ok = config(tmp_path, "[skippy]\nbinary = 'skippy'\nabi = '0.1.67'\ncommit = 'abcdef12'\n")
    ident = identity(ok)
    assert (ident["version"], ident["commit"], ident["abi"]) == ("1.2.3", "abcdef1234567", "0.1.67")
    wrong = tmp_path / "w"
    wrong.mkdir()
    stub(wrong)
    with pytest.raises(UserError, match=r"abi = '0.1.66' but .* is abi 0.1.67: a different skippy build"):
        identity(config(wrong, "[skippy]\nbinary = 'skippy'\nabi = '0.1.66'\n"))
    silent = tmp_path / "s"
    silent.mkdir()
    stub(silent, version="skippy 1.2.3")
    with pytest.raises(UserError, match="does not say its abi"):
        identity(config(silent, "[skippy]\nbinary = 'skippy'\nabi = '0.1.67'\n"))
    # the ABI and llama.cpp pin from skippy-api's split-certified.json when --version does not say them
    (silent / "roster.json").write_text(json.dumps({"native_recipe": {"skippy_abi": "0.1.67",
                                                                      "llama_upstream_sha": "5e03bdd87009"}}))
    ident = identity(config(silent, "[skippy]\nbinary = 'skippy'\nabi = '0.1.67'\nroster = 'roster.json'\n"))
    assert (ident["abi"], ident["llama_cpp"]) == ("0.1.67", "5e03bdd87009")


def test_parse_version_reads_the_fake_and_older_lines():
    assert parse_version("skippy-server 0.76.0-rc2") == {"version": "0.76.0-rc2", "commit": None, "abi": None,
                                                         "llama_cpp": None}
    assert parse_version("skippy 0.0.0-fake (commit 00fa4e01, abi 0.1.67, llama.cpp 5e03bdd8)")["llama_cpp"] \
        == "5e03bdd8"


@pytest.mark.parametrize("log, outcome", [  # the users' own classifier's fixtures (scripts/lib/family-outcome.sh)
    ("stage 1 binary server did not become ready", "timeout"),
    ("Error: Unsupported: runtime-slice execution is not supported for this model architecture yet", "unsupported"),
    ("Unsupported: stage graph did not expose a stable output activation boundary", "unsupported"),
    ("missing tensor blk.5.ssm_in.weight", "model-invalid"),
    ("authoritative token mismatch", "mismatch"),
    ("corpus file does not exist", "harness"),
    ("listener disconnected", "runtime-error"),
    ("+ skippy serve-binary --config timed-out.json\nlistener disconnected", "runtime-error"),  # echo lines dropped
])
def test_classify_like_the_users_runner(log, outcome):
    assert classify(log) == outcome


def test_reports_of_the_wrong_shape_are_harness_problems(tmp_path):
    p = tmp_path / "single-step.json"
    assert read_report(p, "single-step") == (None, "skippy-correctness wrote no report (single-step.json)")
    p.write_text("{not json")
    assert "is not JSON" in read_report(p, "single-step")[1]
    p.write_text(json.dumps({"mode": "single-step", "status": "pass"}))
    assert read_report(p, "single-step")[1] == \
        "report single-step.json lacks matches: not a skippy-correctness single-step report"
    p.write_text(json.dumps({"status": "pass", "results": [{"matches": True}, {}], "mismatch_count": 0}))
    assert "results[].matches" in read_report(p, "split-scan")[1]
    good = {"status": "pass", "matches": True}
    p.write_text(json.dumps(good))
    assert read_report(p, "single-step") == (good, "") and report_ok(good)
    assert not report_ok({"status": "pass", "matches": False})
    assert not report_ok({"status": "pass", "results": [{"matches": True}, {"matches": False}], "mismatch_count": 1})


def test_bad_skippy_target_is_exit_2_one_line(tmp_path):
    stub(tmp_path)
    cfg = config(tmp_path, "[skippy]\nbinary = 'skippy'\nabi = '9.9.9'\n")
    r = run_cli("family-certify", "run", "qwen3", "--lane", "load", "--target", f"skippy:{cfg}", cwd=ROOT)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().count("\n") == 0 and "abi = '9.9.9' but" in r.stderr
    r = run_cli("family-certify", "run", "qwen3", "--lane", "load", "--target", f"skippy:{tmp_path}/none.toml",
                cwd=ROOT)
    assert r.returncode == 2 and "no such config file" in r.stderr


def test_the_fake_config_is_valid():
    cfg = read_config(FAKE)
    assert cfg.binary.name == "skippy" and os.access(cfg.binary, os.X_OK)
    assert cfg.correctness is not None and os.access(cfg.correctness, os.X_OK)


# ---- against the fake skippy ----------------------------------------------------------------------------------

def fake(tmp_path, bug=None, load_mode="runtime-slice", **timeouts):
    """The fake's config with FAKE_SKIPPY_BUG set (None: the correct fake), a load mode and any timeouts changed."""
    text = FAKE.read_text().replace('"fake_skippy/', f'"{ROOT}/tests/fake_skippy/').replace(
        '"runtime-slice"', f'"{load_mode}"')
    for k, v in timeouts.items():
        text = text.replace(f"\n{k} = ", f"\n{k} = {v}\n# was ", 1)
    p = tmp_path / f"skippy-{bug or 'correct'}-{load_mode}.toml"
    p.write_text(text + (f'\n[env]\nFAKE_SKIPPY_BUG = "{bug}"\n' if bug else ""))
    return p


def lanes(out):
    return {(x["row"], x["lane"]): x for x in json.loads((out / "report.json").read_text())["results"]}


def no_fake_left():
    """Fake skippy processes and skippy workers still running that this test session started: those whose
    environment has its TMPDIR (conftest's, one per session) — another xdist worker's tests run fakes meanwhile."""
    from pathlib import Path

    ours = f"TMPDIR={os.environ['TMPDIR']}".encode()
    left = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            args = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            env = (proc / "environ").read_bytes().split(b"\0")
        except OSError:  # (gone meanwhile)
            continue
        if ("tests.fake_skippy" in args or "targets.skippy_worker" in args) and ours in env:
            left.append(args)
    return left


@pytest.mark.llama
def test_the_correct_fake_passes_every_lane(tmp_path):
    """jamba, the hybrid, has every lane a transformer row has and the boundary sweep besides; gpt2, a dropped
    family, the reject lane. Every tier-1 row through the fake: test_tier_1_through_the_fake_passes (slow)."""
    out = tmp_path / "out"
    r = run_cli("family-certify", "run", "jamba", "gpt2", "--target", f"skippy:{FAKE}", "--out", str(out),
                "--jobs", "2", cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:]
    got = lanes(out)
    m = load_manifest()
    assert set(got) == {(row, lane) for row in ("jamba", "gpt2") for lane in m.row(row).lanes}
    assert {k: v["status"] for k, v in got.items() if v["status"] != "pass"} == {
        ("gpt2", "load"): "unsupported", ("jamba", "memory"): "unsupported", ("jamba", "shift"): "unsupported",
        ("jamba", "prompt-trees"): "unsupported"}
    assert "serve-binary at cut 2: skippy stage-1 exited (exit code 1): Error: Unsupported:" in \
        got[("gpt2", "reject")]["detail"]
    # jamba's boundary lanes sweep every cut offset modulo its layer pattern's period (RRRRA RRR: 5), like our own
    # sweep: 5 cuts, each through skippy's stages and single-step
    assert got[("jamba", "boundary-sweep")]["detail"].startswith("skippy serve, single-step: 10 cases, 10 pass")
    handoff = got[("jamba", "handoff")]["reports"][0]["results"]
    assert {(r["stage"], r["payload"]) for r in handoff if r["cuts"] == [4]} == \
        {(0, "recurrent-only"), (0, "full-state"), (1, "kv-recurrent"), (1, "full-state")}
    wire = [r for r in got[("jamba", "wire")]["reports"][0]["results"] if r["cuts"] == [4]]
    assert [(r["wire"], r["status"]) for r in wire] == [("f16", "pass"), ("bf16", "pass"), ("q8_0", "pass")]
    run = json.loads((out / "report.json").read_text())
    assert run["build"]["skippy"]["abi"] == "0.1.67" and run["build"]["key"].startswith("skippy-0000")
    from fuzz.certify.outputs import merge  # an aggregate refuses a shard of another skippy build

    other = {**run, "build": {**run["build"], "key": "skippy-1111-abi-0.1.68"}}
    plan = [(p["row"], p["lanes"]) for p in run["plan"]]
    assert merge([run], plan, run["manifest"])["exit_code"] == 0
    with pytest.raises(UserError, match="shards ran on different builds"):
        merge([run, other], plan, run["manifest"])
    rep = got[("jamba", "parity")]["reports"][0]
    assert rep["skippy"]["model_id"] == f"fixture-{rep['sha256'][:12]}"  # neutral: no family name
    assert '<testcase classname="jamba" name="prefix-cache"' in (out / "junit.xml").read_text()
    assert no_fake_left() == []


@pytest.mark.llama
def test_b1_fake_fails_the_prefix_cache_lane_and_shrinks_to_rar(tmp_path):
    b1, out = fake(tmp_path, "drops-recurrent"), tmp_path / "out"
    r = run_cli("family-certify", "run", "jamba", "--lane", "prefix-cache", "--target", f"skippy:{b1}",
                "--out", str(out), cwd=ROOT, timeout=600)
    assert r.returncode == 1
    lane = lanes(out)[("jamba", "prefix-cache")]
    # only the cut whose second stage starts on the attention layer: the first-layer probe says "not recurrent"
    assert [(x["cuts"], x["outcome"]) for x in lane["reports"][0]["results"] if x["status"] != "pass"] == \
        [([4], "mismatch")]
    (bundle,) = [out / b for b in lane["bundles"]]
    data = json.loads((bundle / "bundle.json").read_text())
    assert data["fingerprint"] == {"oracle": "skippy", "status": "finding", "phase": "prefix", "cut_kinds": ["A"],
                                   "cause": "mismatch"}
    spec = data["spec"]
    assert (spec["pattern"], data["cuts"], spec["n_embd"], spec["n_vocab"]) == ("RAR", [1], 16, 8)
    assert run_cli("fuzz", "replay", str(bundle), cwd=ROOT).returncode == 1
    assert run_cli("fuzz", "replay", str(bundle), "--target", f"skippy:{FAKE}", cwd=ROOT).returncode == 0


@pytest.mark.llama
def test_b5_fake_fails_state_handoff_where_a_stage_holds_two_kv_widths(tmp_path):
    from fuzz.oracles.skippy import SkippyRunConfig, report
    from synth.make import write_fixture
    from synth.manifest import load_manifest

    path = tmp_path / "laguna.gguf"
    write_fixture(load_manifest(None).row("laguna").spec(), path)  # K/V heads 1 on layer 0, 2 elsewhere
    b5 = fake(tmp_path, "truncates-kv")
    cfg = SkippyRunConfig(checks=("state-handoff", "prefix"), cuts="1;4", target=f"skippy:{b5}")
    rep = report(path, cfg)
    bad = {(tuple(r["cuts"]), r["check"], r.get("stage"), r.get("payload")) for r in rep.results
           if r["status"] != "pass"}
    # stage 1:8 holds a pass-through copy of layer 0 (laguna sizes RoPE from it): both widths, rows cut; at cut 4
    # every stage's layers have one width
    assert bad == {((1,), "state-handoff", 1, "resident-kv"), ((1,), "state-handoff", 1, "full-state"),
                   ((1,), "prefix", None, None)}
    assert all(f.reproduced and f.cause["kind"] == "mismatch" for f in rep.findings)
    assert "staged execution did not match full-model baseline" in rep.findings[0].message
    assert report(path, replace_target(cfg, FAKE)).findings == []


def replace_target(cfg, toml):
    from dataclasses import replace

    return replace(cfg, target=f"skippy:{toml}")


@pytest.mark.llama
def test_a_fake_that_loads_a_dropped_family_fails_the_reject_lane(tmp_path):
    r = run_cli("family-certify", "run", "--tier", "3", "--lane", "reject", "--target",
                f"skippy:{fake(tmp_path, 'loads-dropped')}", cwd=ROOT, timeout=600)
    assert r.returncode == 1
    lines = [ln for ln in r.stdout.splitlines() if " reject " in ln]
    assert len(lines) == 18 and all("FINDING      loaded; expected a clean 'unsupported family' error" in ln
                                    for ln in lines), r.stdout


@pytest.mark.llama
def test_a_malformed_report_is_a_harness_finding_never_a_pass(tmp_path):
    out = tmp_path / "report.json"
    r = run_cli("family-certify", "run", "qwen3", "--lane", "parity", "--target",
                f"skippy:{fake(tmp_path, 'malformed-report')}", "--report", str(out), cwd=ROOT, timeout=600)
    assert r.returncode == 1
    rep = json.loads(out.read_text())["results"][0]["reports"][0]
    assert {(x["check"], x["outcome"], x["status"]) for x in rep["results"]} == \
        {("serve", "pass", "pass"), ("single-step", "harness", "finding"), ("chain", "harness", "finding"),
         ("split-scan", "harness", "finding")}
    assert rep["findings"][0]["cause"]["detail"] == \
        "report single-step.json lacks status, matches: not a skippy-correctness single-step report"


@pytest.mark.llama
def test_a_hanging_fake_times_out_and_leaves_nothing_running(tmp_path):
    from fuzz.oracles.skippy import SkippyRunConfig, report
    from synth.make import resolve, write_fixture
    from synth.spec import Knobs

    path = tmp_path / "llama.gguf"
    write_fixture(resolve("llama", Knobs(layers=2)), path)
    hangs = fake(tmp_path, "hangs", request=2, lane=3)
    rep = report(path, SkippyRunConfig(checks=("serve", "single-step"), cuts="1", target=f"skippy:{hangs}"))
    assert [(r["check"], r["outcome"], r["status"], r["reproduced"]) for r in rep.results] == \
        [("serve", "timeout", "timeout", True), ("single-step", "timeout", "timeout", True)]
    assert rep.results[1]["note"] == "skippy-correctness single-step timed out after 3 s"
    assert rep.status == "timeout" and no_fake_left() == []
    log = rep.results[1]["logs"][0]
    assert "fake-skippy bug: FAKE_SKIPPY_BUG=hangs: never answering" in open(log).read()  # the log is kept


def test_require_lanes_turns_a_skipped_lane_into_a_failure(tmp_path):
    m = tmp_path / "family_tiers.toml"
    m.write_text((ROOT / "family_tiers.toml").read_text().replace(
        'recipe = { family = "qwen3", layers = 6 }', 'recipe = { family = "qwen3", layers = 6 }\ndtypes = []', 1))
    args = ["run", "qwen3", "--lane", "dtype", "--manifest", str(m)]
    r = run_cli("family-certify", *args, cwd=ROOT)
    assert r.returncode == 0 and "SKIPPED      skipped: no dtypes for this row" in r.stdout
    r = run_cli("family-certify", *args, "--require-lanes", cwd=ROOT)
    assert r.returncode == 1 and "MISSING      skipped, and --require-lanes: no dtypes for this row" in r.stdout


@pytest.mark.llama
@pytest.mark.slow
def test_tier_1_through_the_fake_passes(tmp_path):
    """The acceptance run: every tier-1 row and lane through skippy's surface (the fake), clean."""
    out = tmp_path / "out"
    r = run_cli("family-certify", "run", "--tier", "1", "--target", f"skippy:{FAKE}", "--out", str(out),
                "--require-lanes", cwd=ROOT, timeout=3600)
    assert r.returncode == 0, r.stdout[-3000:]
    got = lanes(out)
    assert len({row for row, _ in got}) == 22
    assert {v["status"] for v in got.values()} <= {"pass", "unsupported"}


@pytest.mark.llama
@pytest.mark.slow
def test_b5_fake_fails_laguna_handoff_lane_with_a_bundle(tmp_path):
    out = tmp_path / "out"
    r = run_cli("family-certify", "run", "laguna", "--lane", "handoff", "--target",
                f"skippy:{fake(tmp_path, 'truncates-kv')}", "--out", str(out), cwd=ROOT, timeout=1200)
    assert r.returncode == 1
    bundles = [out / b for b in lanes(out)[("laguna", "handoff")]["bundles"]]
    assert [b.name for b in bundles] == ["laguna-skippy-1-state-handoff", "laguna-skippy-1-state-handoff-full-state"]
    for bundle in bundles:  # one per payload kind that loses the rows: resident-kv, full-state
        data = json.loads((bundle / "bundle.json").read_text())
        assert (data["fingerprint"]["phase"], data["fingerprint"]["stage"], data["cuts"]) == ("state-handoff", 1, [1])
        assert data["spec"]["n_head_kv"][0] < max(data["spec"]["n_head_kv"])  # both K/V widths survive shrinking
        assert run_cli("fuzz", "replay", str(bundle), cwd=ROOT).returncode == 1


@pytest.mark.llama
def test_a_gated_f16_flip_at_a_near_tie_is_numerics_not_a_finding(tmp_path):
    """qwen3next at cut 3 over the f16 codec flips step 1, where the unsplit model's top-2 margin is 2.5e-3 (the
    pinned llama.cpp's own logits: skippy gives none): excused as our wire oracle excuses it (< 1e-2)."""
    from fuzz.oracles.skippy import SkippyRunConfig, report
    from synth.make import write_fixture
    from synth.manifest import load_manifest

    path = tmp_path / "qwen3next.gguf"
    write_fixture(load_manifest(None).row("qwen3next").spec(), path)
    rep = report(path, SkippyRunConfig(checks=("wire",), cuts="3", wires=("f16",), target=f"skippy:{FAKE}"))
    (r,) = rep.results
    assert (r["outcome"], r["status"], r["near_tie"]["step"]) == ("mismatch", "numerics", 1)
    assert 0 < r["near_tie"]["margin"] < 1e-2 and rep.findings == [] and rep.numerics[0].cause["kind"] == "near-tie"


@pytest.mark.llama
def test_layer_packages_and_stage_artifacts_serve_like_runtime_slices(tmp_path):
    """load_mode layer-package (a `synth package` v1 directory as model_path: where B1 first lived) and
    artifact-slice (each stage's own GGUF): the same answers; the B1 fake is caught the same way."""
    from fuzz.oracles.skippy import SkippyRunConfig, report
    from synth.make import write_fixture
    from synth.manifest import load_manifest

    path = tmp_path / "jamba.gguf"
    write_fixture(load_manifest(None).row("jamba").spec(), path)

    def bad(bug, mode):
        cfg = SkippyRunConfig(checks=("serve", "prefix"), cuts="1;4", target=f"skippy:{fake(tmp_path, bug, mode)}")
        return [(r["check"], r["cuts"], r["outcome"]) for r in report(path, cfg).results if r["status"] != "pass"]

    assert bad(None, "layer-package") == [] and bad(None, "artifact-slice") == []
    assert bad("drops-recurrent", "layer-package") == [("prefix", [4], "mismatch")]


@pytest.mark.llama
def test_a_port_another_server_took_first_is_not_mistaken_for_ours(tmp_path, monkeypatch):
    """A free port is free only until someone binds it: under parallel rows another server can take it between our
    pick and our process's bind, and answers there for ours. Here an impostor (answering /v1/models, and a TCP
    listener for a stage's port) holds the first port the reference picks and stage 1's first port: each start is
    tried again elsewhere, and the answers come from the fake's own processes."""
    import sys

    import targets.skippy_worker as w
    from synth.make import resolve, write_fixture
    from synth.spec import Knobs

    impostor, asked = impostor_server({"object": "list", "data": [{"id": "fixture", "object": "model"}]})
    taken = impostor.server_address[1]
    calls = iter(range(1, 100))
    real = w.free_port
    # picks: 1 the reference (taken), 2 its second try; 3, 4 the split's stage ports (4: stage 1's, taken), ...
    monkeypatch.setattr(w, "free_port", lambda: taken if next(calls) in (1, 4) else real())
    monkeypatch.setattr(sys, "argv", ["skippy_worker", str(fake(tmp_path))])
    path = tmp_path / "llama.gguf"
    write_fixture(resolve("llama", Knobs(layers=2)), path)
    worker = w.SkippyWorker()
    try:
        ref = worker.op_load({"path": str(path)})
        split = worker.op_split({"path": str(path), "cuts": [1], "n_layer": 2})
        stage1 = json.loads(open(split["stages"][1]["config"]).read())
        assert ref["port"] != taken and stage1["bind_addr"] != f"127.0.0.1:{taken}"
        assert sorted(p.name for p in worker.logs.iterdir()) == \
            ["run-1-reference", "run-2-reference", "run-3-split", "run-4-split"]  # one lost start of each
        assert "Address already in use" in (worker.logs / "run-3-split" / "stage-1.log").read_text()
        want = {"prompt": "abaabba", "max_tokens": 3}  # (the fixtures' tokenizer reads a, b and ab)
        got = [worker.op_complete({"via": via, "requests": [want]})["results"][0] for via in ("reference", "split")]
        assert got[0].get("text") == got[1].get("text") and got[0].get("completion_tokens") == 3, got
        assert asked and set(asked) == {"/v1/models"}  # asked whether it was ready, never to complete
    finally:
        worker.close()
        impostor.shutdown()
