"""Repro bundles: a finding is reproduced again, shrunk under a fixed fingerprint, and replays with one command."""

import json

import pytest

from conftest import run_cli

pytestmark = pytest.mark.llama


def test_sweep_finding_shrinks_and_replays(fixtures, tmp_path):
    path = fixtures("qwen3next", layers=8, period=4)
    out = tmp_path / "bundles"
    r = run_cli("fuzz", "sweep", str(path), "--cuts", "3", "--target", "mutant:batched-rows-swapped",
                "--bundle", str(out))
    assert r.returncode == 1 and "bundle:" in r.stdout, r.stdout + r.stderr
    (bundle,) = list(out.iterdir())
    data = json.loads((bundle / "bundle.json").read_text())
    fp = data["fingerprint"]
    assert fp["oracle"] == "sweep" and fp["phase"] == "batched" and fp["cut_kinds"] == ["A"]
    # the shape the README promises: 2 layers (RA, cut 1), a 2-token prompt, one decode step, two sequences
    assert (data["spec"]["pattern"], data["cuts"]) == ("RA", [1])
    assert {k: data["config"][k] for k in ("phases", "tokens", "prompt_len", "n_seq")} == \
        {"phases": ["batched"], "tokens": 1, "prompt_len": 2, "n_seq": 2}
    assert data["original"]["cuts"] == [3]
    # the README says where it starts: the stage's first layer, from its very first node (its input rows)
    readme = (bundle / "README.md").read_text()
    assert "## Where it first differs" in readme and "first graph node whose bits differ" in readme, readme
    replay = run_cli("fuzz", "replay", str(bundle))
    assert replay.returncode == 1 and "REPRODUCED" in replay.stdout
    fixed = run_cli("fuzz", "replay", str(bundle), "--target", "llama-cpp")
    assert fixed.returncode == 0 and "not reproduced" in fixed.stdout


def test_a_three_stage_finding_shrinks_to_two_stages(fixtures, tmp_path):
    """Fewer stages first: the swapped-rows finding on cuts 2,5 (three stages) holds with cut 5 alone, where the
    stage it shows in became the last (its logits differ); then the leading layers go: RRRA, cut 1."""
    path = fixtures("qwen3next", layers=8, period=4)  # RRRARRRA
    out = tmp_path / "bundles"
    r = run_cli("fuzz", "sweep", str(path), "--cuts", "2,5", "--target", "mutant:batched-rows-swapped",
                "--bundle", str(out))
    assert r.returncode == 1, r.stdout + r.stderr
    (bundle,) = list(out.iterdir())
    data = json.loads((bundle / "bundle.json").read_text())
    assert data["original"]["cuts"] == [2, 5]
    assert (data["spec"]["pattern"], data["cuts"]) == ("RRRA", [1]), data["shrink"]["steps"]
    assert "dropped cut 2 → cuts [5]" in data["shrink"]["steps"]
    fp = data["fingerprint"]
    assert (fp["cut_kinds"], fp["stage"], fp["where"]) == (["R"], 1, "logits")
    assert run_cli("fuzz", "replay", str(bundle)).returncode == 1


def test_handoff_finding_bundle(fixtures, tmp_path):
    path = fixtures("jamba", layers=8, period=4)  # RRARRRAR: cut 2 starts a stage on attention
    out = tmp_path / "b"
    r = run_cli("fuzz", "handoff", str(path), "--cuts", "2", "--prompt", "5,1,44,2,6,3", "--modes", "full",
                "--target", "mutant:b1-first-layer-probe", "--bundle", str(out))
    assert r.returncode == 1, r.stdout + r.stderr
    (bundle,) = list(out.iterdir())
    data = json.loads((bundle / "bundle.json").read_text())
    assert data["fingerprint"]["cut_kinds"] == ["A"] and data["fingerprint"]["phase"] == "full"
    assert data["original"]["config"]["prompt"] == [5, 1, 44, 2, 6, 3]
    # shrunk to the B1 shape itself: recurrent, attention-first stage, recurrent (cut 1), a 3-token prompt, 1 step —
    # and to the smallest width where it holds: embd 8, 2 heads, ff 2, vocab 8 (from 32, 4, 64, 64)
    assert (data["spec"]["pattern"], data["cuts"]) == ("RAR", [1])
    assert (data["config"]["prompt_len"], data["config"]["tokens"]) == (3, 1)
    # the given prompt's first tokens (B1 needs no particular one), folded into the smaller vocabulary (44 % 8)
    assert data["config"]["prompt"] == [5, 1, 4]
    spec = data["spec"]
    assert (spec["n_embd"], spec["n_head"], spec["n_ff"], spec["n_vocab"]) == (8, 2, 2, 8)
    assert (bundle / "fixture.gguf").stat().st_size <= 16 * 1024
    readme = (bundle / "README.md").read_text()
    assert "first graph node whose bits differ: `cache_r_l" in readme, readme  # the recurrent state cache
    assert run_cli("fuzz", "replay", str(bundle)).returncode == 1
    assert run_cli("fuzz", "replay", str(bundle), "--target", "llama-cpp").returncode == 0


def test_broken_bundles_are_one_line_errors(tmp_path):
    r = run_cli("fuzz", "replay", str(tmp_path))
    assert r.returncode == 2 and "no bundle.json" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    (tmp_path / "bundle.json").write_text('{"schema": 1, "oracle": "sweep", "fixture": "fixture.gguf"}')
    r = run_cli("fuzz", "replay", str(tmp_path))
    assert r.returncode == 2 and "sha256" in r.stderr


def test_a_fingerprint_carries_the_cause_and_an_older_one_still_matches():
    """The cause analysis' verdict is part of what shrinking keeps fixed (a leak cannot shrink into a cell-position
    difference); a bundle recorded before the cause was in fingerprints still replays (its keys all agree)."""
    from fuzz.engine.contract import Finding, fingerprint, matches

    leak = Finding(oracle="isolation", status="finding", message="m", phase="unified-kv", seq=1,
                   cause={"kind": "batch", "detail": "other neighbours change it"})
    fp = fingerprint(leak, "AA")
    assert fp == {"oracle": "isolation", "status": "finding", "phase": "unified-kv", "seq": 1, "cause": "batch"}
    cells = fingerprint(Finding(**{**leak.__dict__, "cause": {"kind": "cell position"}}), "AA")
    assert fp != cells
    older = {k: v for k, v in fp.items() if k != "cause"}
    assert matches(older, fp) and matches(older, cells) and not matches(fp, cells)


def test_a_users_model_shrinks_to_the_layers_the_finding_needs(fixtures, tmp_path):
    """A GGUF without our spec (a user's model, here a fixture with its spec key removed) cannot be regenerated
    narrower, but its layer range can be sliced: the B1 hand-off finding on 8 layers shrinks to the layers it
    needs — recurrent, attention, recurrent, cut 1 — as a slice of the model itself (its own weights)."""
    from synth.gguf_io import read_all, write_gguf
    from synth.inspect import inspect_file
    from synth.spec import SPEC_KEY

    g, kv, tensors = read_all(fixtures("jamba", layers=8, period=4))  # RRARRRAR
    user = tmp_path / "users-model.gguf"
    write_gguf(user, g.arch, {k: v for k, v in kv.items() if k != SPEC_KEY}, tensors)
    out = tmp_path / "b"
    r = run_cli("fuzz", "handoff", str(user), "--cuts", "2", "--prompt-len", "6", "--modes", "full",
                "--target", "mutant:b1-first-layer-probe", "--bundle", str(out))
    assert r.returncode == 1, r.stdout + r.stderr
    (bundle,) = list(out.iterdir())
    data = json.loads((bundle / "bundle.json").read_text())
    assert data["spec"] is None and data["cuts"] == [1]
    kinds = "".join(x.kind[0].upper() for x in inspect_file(str(bundle / "fixture.gguf")).layers)
    assert kinds == "RAR", data["shrink"]["steps"]
    assert any(s.startswith("dropped the") for s in data["shrink"]["steps"])
    assert run_cli("fuzz", "replay", str(bundle)).returncode == 1


def test_a_stage_between_two_cuts_loses_its_layers_when_the_cut_moves(fixtures, tmp_path, monkeypatch):
    """The shrinker's search alone (no target: an oracle that is a rule over the cut set, registered for this test).
    The rule: a finding at the third stage whenever there are three stages, the second starting and the third
    starting on a recurrent layer. Neither cut can go; the middle stage [1, 5) loses no layer from the model's ends;
    moving cut 5 onto the first recurrent layer after cut 1 leaves trailing layers the bisection drops."""
    from dataclasses import dataclass

    from fuzz.engine.contract import FINDING, Finding, Oracle, make_report
    from fuzz.oracles import registry as oracles
    from fuzz.repro.bundle import Case, shrink

    @dataclass
    class RuleConfig:
        cuts: str = "none"
        target: str = "rule"

    def run(fixture, cfg):
        from fuzz.engine.stages import FixtureStages

        st = FixtureStages(fixture)
        cuts = [int(c) for c in cfg.cuts.split(",")]
        kinds = st.kinds
        hit = len(cuts) == 2 and all(kinds[c] == "R" for c in cuts)
        findings = [Finding("rule", FINDING, "three stages", cuts=cuts, stage=2, where="boundary", layer=cuts[1])] \
            if hit else []
        data = {"arch": st.info.arch, "n_layer": st.info.n_layer, "config": {"cuts": cfg.cuts}, "target": "rule"}
        return make_report("rule", fixture, data, results=[{"status": FINDING if hit else "pass"}],
                           findings=findings)

    monkeypatch.setitem(oracles.ORACLES, "rule", Oracle("rule", RuleConfig, run, str, per_cut=True))
    path = fixtures("jamba", layers=8, period=4)  # RRARRRAR
    case = Case("rule", path, [1, 5], {}, "rule")
    got, rep = case.run()
    sh = shrink(case, got[0], rep, tmp_path)
    assert "moved cut 5 to 3 → cuts [1, 3]" in sh.log, sh.log
    from synth.make import spec_of

    assert (spec_of(sh.case.fixture).pattern, sh.case.cuts) == ("RRAR", [1, 3]), sh.log


def test_prompt_tokens_are_deleted_ddmin_style(fixtures, tmp_path, monkeypatch):
    """The shrinker's search alone, with an oracle that is a rule over the prompt (registered for this test): a
    finding whenever token 5 comes before token 9 somewhere in it. From a 12-token prompt given as ids, halving the
    length would lose token 9 (it is last); deletion keeps exactly the two tokens the rule needs."""
    from dataclasses import dataclass

    from fuzz.engine.contract import FINDING, Finding, Oracle, make_report
    from fuzz.engine.schedule import main_prompt
    from fuzz.engine.stages import FixtureStages
    from fuzz.oracles import registry as oracles
    from fuzz.repro.bundle import Case, shrink

    @dataclass
    class PromptRule:
        prompt_len: int = 12
        prompt: tuple[int, ...] = ()
        seed: int = 0
        target: str = "rule"

    def run(fixture, cfg):
        st = FixtureStages(fixture)
        toks = main_prompt(cfg, st.info.n_vocab)
        hit = 5 in toks and 9 in toks[toks.index(5):]
        data = {"arch": st.info.arch, "n_layer": st.info.n_layer, "config": {}, "target": "rule"}
        return make_report("rule", fixture, data, results=[{"status": FINDING if hit else "pass"}],
                           findings=[Finding("rule", FINDING, "5 then 9")] if hit else [])

    monkeypatch.setitem(oracles.ORACLES, "rule", Oracle("rule", PromptRule, run, str, shrink=(("prompt_len", 1),),
                                                        case_fields=("prompt_len", "prompt", "seed")))
    prompt = [3, 1, 5, 4, 0, 2, 7, 6, 8, 11, 10, 9]
    case = Case("rule", fixtures("llama", layers=1), [], {"prompt_len": 12, "prompt": prompt}, "rule")
    got, rep = case.run()
    sh = shrink(case, got[0], rep, tmp_path)
    assert sh.case.config["prompt"] == [5, 9] and sh.case.config["prompt_len"] == 2, sh.log
    assert not any(s.startswith("prompt_len") for s in sh.log), sh.log
    # halves go first (each loses 5 or 9), then thirds, then pairs and single tokens
    assert [x.split(" → ")[1] for x in sh.log if x.startswith("deleted")] == [
        "prompt [3, 1, 5, 7, 6, 8, 11, 10, 9]", "prompt [3, 1, 5, 11, 10, 9]", "prompt [5, 11, 10, 9]",
        "prompt [5, 10, 9]", "prompt [5, 9]"], sh.log


def test_a_finding_whose_shrinking_raises_is_bundled_unshrunk_and_said_in_one_line(fixtures, tmp_path, monkeypatch,
                                                                                     capfd):
    """A smaller candidate that cannot even be built (here: it raises RecursionError, as the radix schedule with
    nothing to continue did) is an invalid candidate, not a crash; and an error in the shrinker itself does not
    lose the finding: it is bundled as reported (its own case, not shrunk) and the error is one line."""
    from dataclasses import dataclass

    from fuzz.engine.contract import FINDING, Finding, Oracle, make_report
    from fuzz.oracles import registry as oracles
    from fuzz.repro import bundle as bd

    @dataclass
    class Steps:
        n: int = 4
        target: str = "rule"

    def run(fixture, cfg):
        if cfg.n < 4:
            raise RecursionError("maximum recursion depth exceeded")
        data = {"arch": "llama", "n_layer": 1, "config": {"n": cfg.n}, "target": "rule"}
        return make_report("rule", fixture, data, results=[{"status": FINDING}],
                           findings=[Finding("rule", FINDING, "always", phase="p")])

    monkeypatch.setitem(oracles.ORACLES, "rule", Oracle("rule", Steps, run, str, case_fields=("n",),
                                                        reduce=lambda c: [{**c, "n": c["n"] - 1}] if c["n"] else []))
    path = fixtures("llama", layers=1)
    rep = run(path, Steps())
    (made,) = bd.bundle_findings(rep, {"n": 4}, tmp_path / "a")
    steps = json.loads((made / "bundle.json").read_text())["shrink"]["steps"]
    assert [x for x in steps if "could not" in x] == [
        "a smaller candidate could not be run (RecursionError: maximum recursion depth exceeded): skipped"], steps
    assert capfd.readouterr().err.count("bundle: ") == 1

    def broken(*a, **k):
        raise KeyError("oops")

    # a finding `skip` names (a committed repro's, in a lane) is not bundled: the bundles go to what is new
    assert bd.bundle_findings(rep, {"n": 4}, tmp_path / "c", skip=lambda f: f.message == "always") == []
    assert not (tmp_path / "c").exists()

    monkeypatch.setattr(bd, "shrink", broken)
    (made,) = bd.bundle_findings(rep, {"n": 4}, tmp_path / "b")
    data = json.loads((made / "bundle.json").read_text())
    assert data["config"] == {"n": 4} and data["fingerprint"]["phase"] == "p"
    assert data["shrink"]["steps"] == ["not shrunk: shrinking or bundling failed (KeyError: 'oops')"]
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "bundled as reported, not shrunk" in err[0] and "Traceback" not in err[0], err
