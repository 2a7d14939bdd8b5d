"""The upstream bug corpus (corpora/upstream, `family-certify corpus`): entries are checked as input, the committed
corpus is what the issue asks of it, the report is schema-valid and its verdict follows the rules."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fuzz.certify import corpus as cp
from fuzz.certify.schemas import validate
from synth.errors import UserError
from synth.manifest import load_manifest

from conftest import run_cli

ROWS = set(load_manifest().rows)
ENTRIES = cp.load_entries(ROWS) if cp.DIR.is_dir() else []


def write_entry(root: Path, name: str = "123-a-bug", **meta: object) -> Path:
    d = root / name
    d.mkdir(parents=True)
    toml = {"upstream": 123, "title": "a bug", "class": "state", "row": "llama",
            "threads": ["https://github.com/ggml-org/llama.cpp/issues/123"],
            "check": ["fuzz", "memory", "{fixture}", "--program", "{entry}/program.json"], **meta}
    lines = [f"{k} = {json.dumps(v)}" for k, v in toml.items() if v is not None]
    (d / "entry.toml").write_text("\n".join(lines) + "\n")
    (d / "README.md").write_text("See https://github.com/ggml-org/llama.cpp/issues/123.\n")
    (d / "0001-bug.patch").write_text("diff --git a/x b/x\n")
    return d


def test_a_well_formed_entry_loads(tmp_path):
    d = write_entry(tmp_path)
    e = cp.load_entry(d, ROWS)
    assert (e.upstream, e.klass, e.row, [p.name for p in e.patches]) == (123, "state", "llama", ["0001-bug.patch"])
    assert e.check_argv(Path("/f.gguf")) == ["fuzz", "memory", "/f.gguf", "--program", f"{d}/program.json"]


@pytest.mark.parametrize("meta, says", [
    ({"class": "weather"}, "class 'weather' is not one of"),
    ({"row": "no-such-row"}, "row 'no-such-row' is not a manifest row"),
    ({"threads": ["https://example.com/123"]}, "threads must list upstream URLs"),
    ({"threads": ["https://github.com/ggml-org/llama.cpp/pull/9"]}, "must include the upstream thread 123"),
    ({"check": ["sh", "-c", "exit 1"]}, "check must be a `fuzz` command line"),
    ({"upstream": 124}, "named <upstream>-<slug>"),
    ({"title": None}, "entry.toml lacks title"),
    ({"colour": "red"}, "unknown keys colour"),
])
def test_a_malformed_entry_is_bad_input_naming_the_fix(tmp_path, meta, says):
    d = write_entry(tmp_path, **meta)
    with pytest.raises(UserError, match=says.replace("(", r"\(")):
        cp.load_entry(d, ROWS)


def test_an_entry_must_cite_its_threads_and_carry_a_series(tmp_path):
    d = write_entry(tmp_path)
    (d / "README.md").write_text("no link here\n")
    with pytest.raises(UserError, match="README.md does not cite https://github.com/ggml-org/llama.cpp/issues/123"):
        cp.load_entry(d, ROWS)
    d = write_entry(tmp_path / "b")
    (d / "0001-bug.patch").unlink()
    with pytest.raises(UserError, match=r"no \*\.patch"):
        cp.load_entry(d, ROWS)


def test_entries_are_chosen_by_name_or_number(tmp_path):
    write_entry(tmp_path, "123-a-bug")
    write_entry(tmp_path, "45-another", upstream=45, threads=["https://github.com/ggml-org/llama.cpp/pull/45"])
    (tmp_path / "45-another" / "README.md").write_text("https://github.com/ggml-org/llama.cpp/pull/45\n")
    assert [e.name for e in cp.load_entries(ROWS, corpus=tmp_path)] == ["45-another", "123-a-bug"]
    assert [e.name for e in cp.load_entries(ROWS, ["123", "45-another"], tmp_path)] == ["123-a-bug", "45-another"]
    with pytest.raises(UserError, match="corpus entry '7': none of that name or number"):
        cp.load_entries(ROWS, ["7"], tmp_path)


def test_the_cli_refuses_a_broken_corpus_in_one_line(tmp_path):
    write_entry(tmp_path, **{"class": "weather"})
    r = run_cli("family-certify", "corpus", "--corpus", str(tmp_path))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "weather" in r.stderr, r.stderr
    bad = write_entry(tmp_path / "c")
    (bad / "0001-bug.patch").write_text("diff --git a/src/nowhere.cpp b/src/nowhere.cpp\n--- a/src/nowhere.cpp\n"
                                        "+++ b/src/nowhere.cpp\n@@ -1 +1 @@\n-x\n+y\n")
    r = run_cli("family-certify", "corpus", "--corpus", str(tmp_path / "c"))
    assert r.returncode == 2 and "does not apply" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_the_committed_corpus_is_what_the_issue_asks():
    """At least 12 upstream bugs over at least 5 classes, llama-server's among them; one directory per upstream
    number; each series applies to the pinned tree (checked by the build when the corpus runs)."""
    assert len(ENTRIES) >= 12, [e.name for e in ENTRIES]
    classes = {e.klass for e in ENTRIES}
    assert len(classes) >= 5 and "server" in classes, classes
    assert len({e.upstream for e in ENTRIES}) == len(ENTRIES)
    for e in ENTRIES:
        text = (e.path / "README.md").read_text()
        assert "## What a user saw" in text and "## How the battery sees it" in text, e.name


def fake_result(name: str, caught: bool, *, shows: bool = True, pinned_code: int = 0) -> dict:
    return {"entry": name, "upstream": int(name.split("-")[0]), "title": "t", "class": "state",
            "threads": [f"https://github.com/ggml-org/llama.cpp/issues/{name.split('-')[0]}"], "row": "llama",
            "caught": caught, "by": ["llama/memory"] if caught else [], "verdicts": {"broke": 1} if caught else
            {"unchanged": 3}, "check": {"exit_code": 1 if shows else 0, "shows": shows, "line": "x",
                                        "on_pinned": {"exit_code": pinned_code, "shows": pinned_code == 1,
                                                      "line": "y"}},
            "build_s": 0.0, "seconds": 1.0}


GATE = {"tier": 1, "rows": ["llama"], "partial": False, "description": "the gate"}
PINNED = {"passes": True, "failing": [], "totals": {"pass": 3}}


def test_the_verdict_needs_the_goal_a_clean_pin_and_checks_that_tell_the_builds_apart():
    nine = [fake_result(f"{i + 1}-bug", True) for i in range(9)]
    ok = cp.corpus_report([*nine, fake_result("10-escape", False)], PINNED, command="c", gate=GATE, wall_s=1)
    validate(ok, "corpus")
    assert (ok["exit_code"], ok["caught_share"], ok["totals"]["escaped"]) == (0, 0.9, 1)
    short = cp.corpus_report([*nine[:8], fake_result("9-e", False), fake_result("10-e", False)], PINNED,
                             command="c", gate=GATE, wall_s=1)
    assert (short["exit_code"], short["caught_share"]) == (1, 0.8)
    dirty = cp.corpus_report(nine, {**PINNED, "passes": False, "failing": ["llama/memory finding"]},
                             command="c", gate=GATE, wall_s=1)
    assert dirty["exit_code"] == 1 and "FAILS: llama/memory finding" in cp.corpus_md(dirty)
    assert cp.corpus_report([*nine[:8], fake_result("9-quiet", True, shows=False)], PINNED, command="c",
                            gate=GATE, wall_s=1)["exit_code"] == 1
    assert cp.corpus_report([*nine[:8], fake_result("9-loud", True, pinned_code=1)], PINNED, command="c",
                            gate=GATE, wall_s=1)["exit_code"] == 1
    md = cp.corpus_md(ok)
    assert md.startswith("## family-certify corpus: PASS — 9 of 10 upstream bugs caught (90 %, goal 90 %)")
    assert "| 10-escape | state | ❌ escaped |" in md and "Escapes are analysed" in md
    assert b'failures="1"' in cp.corpus_junit(ok)


def test_a_partial_gate_is_said(tmp_path):
    rep = cp.corpus_report([fake_result("1-bug", True)], PINNED, command="c",
                           gate={**GATE, "partial": True, "description": "the gate (partial: --row)"}, wall_s=1)
    cp.write_corpus(tmp_path, rep)
    assert "partial: --row" in (tmp_path / "summary.md").read_text()
    validate(json.loads((tmp_path / "report.json").read_text()), "corpus")


@pytest.mark.slow
@pytest.mark.llama
@pytest.mark.server
def test_the_corpus_command_catches_an_entry_and_says_so(tmp_path):
    """One entry through a gate narrowed to one row (the nightly corpus job runs them all through the whole gate):
    the series built, the pinned build clean, the entry caught by the memory lane, its direct check telling the
    two builds apart; the outputs schema-valid."""
    r = run_cli("family-certify", "corpus", "14742", "--row", "llama", "--jobs", "2", "--out", str(tmp_path / "out"),
                timeout=1800)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    rep = json.loads((tmp_path / "out" / "report.json").read_text())
    validate(rep, "corpus")
    (e,) = rep["entries"]
    assert e["caught"] and "llama/memory" in e["by"] and rep["gate"]["partial"]
    assert (e["check"]["exit_code"], e["check"]["on_pinned"]["exit_code"]) == (1, 0)
    assert rep["pinned"]["passes"] and "1 of 1 upstream bugs caught" in (tmp_path / "out" / "summary.md").read_text()
