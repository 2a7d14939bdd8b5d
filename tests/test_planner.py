"""Cuts from a split runtime's topology planner (`--cuts planner:CMD`): the planner's answer read and checked
(quick), and the parity lane splitting where the planner would, beside its every-cut sweep (llama)."""

import hashlib
import json
import re
import sys

import pytest

from fuzz.engine.stages import cut_sets
from synth.errors import UserError

from conftest import ROOT, run_cli

PLANNER = f"planner:{sys.executable} {ROOT / 'tests' / 'data' / 'balanced_planner.py'}"


def script(tmp_path, body: str) -> str:
    """A planner command whose program is this Python body (argv: MODEL STAGES)."""
    path = tmp_path / "planner.py"
    path.write_text("import sys\n" + body + "\n")
    return f"planner:{sys.executable} {path}"


def test_the_planners_cut_sets_are_read_from_its_output(fixtures):
    model = fixtures("qwen3", layers=6)
    assert cut_sets(PLANNER, 6, 2, 1, model) == [[3]]
    assert cut_sets(PLANNER, 6, 3, 1, model) == [[2, 4]]
    assert cut_sets(PLANNER.replace("balanced_planner.py", "balanced_planner.py --avoid 3"), 6, 2, 1, model) == [[4]]
    with pytest.raises(UserError, match="a planner needs the model's file"):
        cut_sets(PLANNER, 6, 2, 1)


@pytest.mark.parametrize("body, words", [
    ("sys.exit('no topology fits')", "exited 1 for qwen3-0.gguf (2 stages): no topology fits"),
    ("print('# nothing')", "chose no cut set"),
    ("print('stage 1: layers 0-2')", "not cut sets in 1..5"),
    ("print('9')", "not cut sets in 1..5"),
    ("print('2,4')", "chose 2,4 for 2 stages; a set of 1 cut(s) was expected"),
])
def test_a_planner_that_fails_or_answers_something_else_is_bad_input(fixtures, tmp_path, body, words):
    model = fixtures("qwen3", layers=6)
    # (the fixture's file name counts the fixtures the session made before it: its own name, not qwen3-0)
    with pytest.raises(UserError, match=re.escape(words.replace("qwen3-0.gguf", model.name))):
        cut_sets(script(tmp_path, body), 6, 2, 1, model)


def test_run_refuses_a_planner_it_cannot_start_in_one_line():
    for args, words in ((["--cuts", "planner:no-such-planner"], "no such program 'no-such-planner'"),
                        (["--cuts", "3;5"], "a run takes planner:CMD"),
                        (["--stages", "3"], "give the planner too"),
                        (["--cuts", PLANNER, "--stages", "1"], "at least 2 stages")):
        r = run_cli("family-certify", "run", "qwen3", "--lane", "parity", *args)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and words in r.stderr, (args, r.stderr)


@pytest.mark.llama
def test_the_parity_lane_splits_where_the_planner_would_and_says_what_it_never_chooses(tmp_path):
    """jamba (8 layers): the planner's 2- and 3-stage sets pass beside the every-cut sweep, which certified the 6
    single cuts the planner never chooses for 2 stages; glm4: every cut is refused by its stage contract, so the
    planner's choices are reported as chosen and refused, with the reason."""
    r = run_cli("family-certify", "run", "jamba", "glm4", "--lane", "parity", "--cuts", PLANNER, "--stages", "2",
                "--stages", "3", "--out", str(tmp_path / "out"))
    assert r.returncode == 0, r.stdout + r.stderr
    lanes = {x["row"]: x for x in json.loads((tmp_path / "out" / "report.json").read_text())["results"]}
    jamba = lanes["jamba"]["data"]["planner"]
    assert [(p["stages"], p["chose"], len(p["never_chose"]), p["refused"], p["failing"]) for p in jamba] == [
        (2, [[4]], 6, [], []), (3, [[3, 6]], 5, [], [])]
    assert lanes["jamba"]["status"] == "pass" and "planner, 2 stages: chose 4: 1 pass" in lanes["jamba"]["detail"]
    glm4 = lanes["glm4"]["data"]["planner"]
    assert [(p["stages"], p["chose"], [x["cuts"] for x in p["refused"]]) for p in glm4] == [(2, [[3]], [[3]]),
                                                                                               (3, [[2, 4]], [[2, 4]])]
    assert "rope.dimension_sections" in glm4[0]["refused"][0]["reason"]
    assert lanes["glm4"]["status"] == "unsupported" and "chose and refused: 3" in lanes["glm4"]["detail"]
    # the certificate carries the planner's choices and the fixture the lanes ran (synth make --row's bytes)
    cert = json.loads((tmp_path / "out" / "certificate.json").read_text())["architectures"]
    assert cert["jamba"]["rows"]["jamba"]["planner"] == [{"stages": 2, "chose": [[4]], "refused": []},
                                                         {"stages": 3, "chose": [[3, 6]], "refused": []}]
    assert cert["glm4"]["rows"]["glm4"]["planner"][0] == {"stages": 2, "chose": [[3]], "refused": [[3]]}
    made = tmp_path / "jamba.gguf"
    assert run_cli("synth", "make", "--row", "jamba", "-o", str(made)).returncode == 0
    assert cert["jamba"]["rows"]["jamba"]["fixture_sha256"] == hashlib.sha256(made.read_bytes()).hexdigest()


def sweep_report(cuts: str, sets: list[list[int]]):
    from fuzz.engine.contract import Report

    return Report(oracle="sweep", fixture="f.gguf", sha256="0" * 64, arch="jamba", n_layer=8, kinds="", layers=[],
                  target="llama-cpp", build={}, config={"cuts": cuts},
                  results=[{"cuts": c, "status": "pass"} for c in sets], findings=[])


def test_a_lane_that_ran_fewer_cut_sets_than_planned_is_missing(fixtures):
    """Planned = executed per cut set (check_cuts): the parity lane of an 8-layer jamba plans the 7 single cuts; a
    run at its spec that reports 6 of them makes the lane missing, naming the cut set; a run at another spec (a
    planner's) does not count; all 7 pass; a lane without cut sets (isolation) is left alone."""
    from fuzz.certify.lanes import LaneResult, check_cuts
    from synth.manifest import load_manifest

    row = load_manifest(ROOT / "family_tiers.toml").row("jamba")
    path = fixtures("jamba", **{k: v for k, v in row.recipe.items() if k != "family"})
    every = [[c] for c in range(1, 8)]
    ok = check_cuts(row, "parity", path, LaneResult("jamba", "parity", "pass", "7 cut sets",
                                                    reports=[sweep_report("all", every)]))
    assert ok.status == "pass" and ok.data["cuts"] == {"spec": "all", "planned": every}
    short = check_cuts(row, "parity", path, LaneResult("jamba", "parity", "pass", "6 cut sets",
                                                       reports=[sweep_report("all", every[:3] + every[4:])]))
    assert short.status == "missing" and short.detail.startswith("planned cut sets not executed by sweep: 4 —")
    other = check_cuts(row, "parity", path, LaneResult("jamba", "parity", "pass", "",
                                                       reports=[sweep_report("planner:x", [[4]])]))
    assert other.status == "missing" and other.detail.startswith("no run at the planned cut sets (all)")
    alone = LaneResult("jamba", "isolation", "pass", "")
    assert check_cuts(row, "isolation", path, alone) is alone and "cuts" not in alone.data
