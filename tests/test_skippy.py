"""The skippy adapter (targets/skippy.py, targets/skippy_worker.py, fuzz/skippy.py): its config and identity checks,
the users' outcome words, report reading — and, against the fake skippy (tests/fake_skippy/, the real llama.cpp
under skippy's CLI and HTTP), the lanes: clean on the correct fake; the fakes that mis-handle a boundary, load a
dropped family, write a malformed report or hang each fail the lane that must catch them."""

import json
import os
import stat

import pytest

from synth.errors import UserError
from targets.skippy import classify, identity, parse_version, read_config
from targets.skippy_worker import read_report, report_ok

from conftest import ROOT, run_cli

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
    ("[skippy]\nbinary = 'skippy'\nload_mode = 'layer-package'\n", "needs [skippy] model_package"),
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
