"""`family-certify mutate` (fuzz/certify/mutate.py): mutants of the covered, non-arid lines of the groups' functions,
drawn by seed, each one a patch git applies; the score and its totals line. Building and running mutants of the
pinned tree takes minutes: the end-to-end test is slow."""

import json
import subprocess
from pathlib import Path

import pytest

from fuzz.certify import mutate as mu
from fuzz.certify.schemas import validate

from conftest import ROOT, run_cli

SOURCE = """#include "llama-kv-cache.h"

// a comment
void llama_kv_cache::seq_rm(int s, int p0, int p1) {
    LLAMA_LOG_INFO("%s: removing\\n", __func__);
    if (p0 < 0) {
        p0 = 0;
    }
    std::vector<int32_t> ids;
    cells.rm(s, p0 + 1, p1);
}
"""


def fake_coverage(tmp_path: Path) -> tuple[Path, Path]:
    """A tree with one file of the state group and a coverage run whose `memory` lane ran its body's lines."""
    root = tmp_path / "tree"
    (root / "src").mkdir(parents=True)
    (root / "src" / "llama-kv-cache.cpp").write_text(SOURCE)
    cov = tmp_path / "cov"
    (cov / "lanes").mkdir(parents=True)
    fn = "llama_kv_cache::seq_rm(int, int, int)"
    lines = [{"line_number": n, "function_name": fn, "count": 3, "branches": []} for n in (4, 5, 6, 7, 9, 10)]
    (cov / "lanes" / "memory.json").write_text(json.dumps({"files": [{"file": "src/llama-kv-cache.cpp",
                                                                      "lines": lines, "functions": []}]}))
    (cov / "coverage.json").write_text(json.dumps({"lanes": [{"row": "llama", "lane": "memory", "status": "pass"}],
                                                   "build": {"spec": "pinned"}}))
    return root, cov


def test_mutants_are_drawn_from_covered_non_arid_lines_and_each_applies_as_a_patch(tmp_path):
    root, cov = fake_coverage(tmp_path)
    covered = mu.covered_lines(cov)
    assert covered[("src/llama-kv-cache.cpp", 6)] == ["memory"]
    mutants = mu.generate(root, covered, mu.line_functions(cov))
    lines = {m.line for m in mutants}
    assert lines == {4, 6, 7, 9, 10}  # not the log line (5): arid; the comment and the include were not run
    assert all(m.group == "state" for m in mutants)
    assert any("int p1, int p0)" in m.mutated for m in mutants)  # arguments swapped: that compiles
    assert any("p0 - 1" in m.mutated or "p0 * 1" in m.mutated or "p0 / 1" in m.mutated for m in mutants)
    assert not any(x in m.mutated for m in mutants for x in ("vector<=", "vector!=", "int32_t>="))
    a, b = mu.sample(mutants, {"state": 4}, 7), mu.sample(mutants, {"state": 4}, 7)
    assert [m.id for m in a] == [m.id for m in b] and len(a) == 4  # the same seed draws the same mutants
    for m in mutants:
        work = tmp_path / "apply" / m.id
        (work / "src").mkdir(parents=True)
        (work / "src" / "llama-kv-cache.cpp").write_text(SOURCE)
        patch = work / "m.patch"
        patch.write_text(m.patch(SOURCE))
        r = subprocess.run(["git", "apply", "-p1", str(patch)], cwd=work, capture_output=True, text=True)
        assert r.returncode == 0, (m, r.stderr)
        got = (work / "src" / "llama-kv-cache.cpp").read_text()
        assert got != SOURCE and got.splitlines()[:m.line - 1] == SOURCE.splitlines()[:m.line - 1]


def test_a_diff_mutates_only_the_changed_lines_and_names_the_changed_lines_no_lane_ran(tmp_path):
    """--diff BASE: the lines the build changes against BASE (the candidate's side of the diff), counted where they
    are code of a group's functions (not the log line), those no lane ran listed as ranges."""
    root, cov = fake_coverage(tmp_path)
    base = tmp_path / "base" / "src"
    base.mkdir(parents=True)
    old = SOURCE.replace("        p0 = 0;\n", "        p0 = 1;\n").replace("    cells.rm(s, p0 + 1, p1);\n", "")
    (base / "llama-kv-cache.cpp").write_text(old.replace("removing", "dropping"))
    changed = mu.changed_lines(base.parent, root, ["src/llama-kv-cache.cpp", "src/absent.cpp"])
    assert changed == {"src/llama-kv-cache.cpp": {5, 7, 10}}
    covered, functions = mu.covered_lines(cov), mu.line_functions(cov)
    del covered[("src/llama-kv-cache.cpp", 10)]  # a changed line no lane ran
    got = mu.diff_account(root, changed, covered, functions, ("state",))
    assert got == {"changed": 2, "ran": 1, "unrun": {"src/llama-kv-cache.cpp": "10"}}  # (5 is the log line)
    lines = {m.line for m in mu.generate(root, {k: v for k, v in covered.items() if k[1] in changed[k[0]]},
                                         functions)}
    assert lines == {7}


def test_arid_and_plausible_lines():
    assert mu.arid('    LLAMA_LOG_WARN("%s: x\\n", __func__);') and mu.arid("    // p0 = 1;") and mu.arid("")
    assert mu.arid('        throw std::runtime_error("bad magic");') and not mu.arid("    p0 = p1 + 1;")
    # trace and speculative logging (a sample's server survivor was a trace line commented out)
    assert mu.arid('    SRV_TRC("%s", "updating prompt cache\\n");') and mu.arid('  SPC_DBG("draft %d\\n", n);')
    assert not mu.plausible("    uint32_t n = 0;", "    uint1_t n = 0;")  # a digit inside a name
    assert not mu.plausible("    std::vector<int> v;", "    std::vector!=int> v;")  # a template's bracket
    assert not mu.plausible("for (int i = 0; i < n; ++i) {", "/*for (int i = 0; i < n; ++i) {*/")  # half a pair
    assert not mu.plausible("if (a != b && c) {", "(1==1) && c) {") and not mu.plausible("x = y;", "x = y;\nbreak;")
    assert not mu.plausible("for (; j < n; ++j) {", "for (; j < n; +%j) {")
    assert mu.plausible("for (; j < n; ++j) {", "for (; j < n; +-j) {")  # compiles (and never ends: a hang)
    assert mu.plausible("    if (a < b) {", "    if (a <= b) {") and mu.plausible("    n = 0;", "    n = 1;")
    assert mu.plausible("    x = f(y);", "    /*x = f(y);*/")
    # rewrites of a sample that never compiled: a declarator's `*` made an operator, a unary `%`, `+/`, a declaration
    # commented out (its name is used further on)
    assert not mu.plausible("int32_t * data = (int32_t *) dst->data;", "int32_t - data = (int32_t *) dst->data;")
    assert not mu.plausible("void f(ggml_tensor * dst) const {", "void f(ggml_tensor + dst) const {")
    assert not mu.plausible("auto * v = layers[ikv].v;", "auto / v = layers[ikv].v;")
    assert not mu.plausible("clear_compressed(-1, true);", "clear_compressed(%1, true);")
    assert not mu.plausible("for (; s < n; ++s) {", "for (; s < n; +/s) {")
    assert not mu.plausible("const bool u = (m->n() == 1);", "/*const bool u = (m->n() == 1);*/")
    assert mu.plausible("const int n = a * b;", "const int n = a / b;") and mu.plausible("x = a * b;", "x = a + b;")


def test_a_mutant_meets_every_covering_lane_and_as_many_rows_as_it_can_early():
    """Round-robin over the lanes, each turn on a row no pair before took where the lane has one: the first three
    pairs are three lanes on two rows (parity ran only on a), not three lanes of row a."""
    pairs = [("a", "load"), ("b", "load"), ("a", "memory"), ("c", "load"), ("b", "memory"), ("a", "parity")]
    assert mu.interleaved(pairs) == [("a", "load"), ("b", "memory"), ("a", "parity"), ("c", "load"),
                                     ("a", "memory"), ("b", "load")]


def test_a_mutant_runs_on_the_rows_x_lanes_that_ran_its_line(tmp_path):
    """With the coverage run's per-row counts (pairs.json) only the pairs that executed the line; without them every
    row of a lane that did (a run from before rows were counted apart)."""
    from types import SimpleNamespace

    from fuzz.certify.coverage import ranges, unranges
    assert ranges([3, 4, 5, 9, 11, 12]) == "3-5,9,11-12" and unranges("3-5,9,11-12") == {3, 4, 5, 9, 11, 12}
    row = {k: SimpleNamespace(key=k) for k in ("llama", "mamba", "qwen3")}
    plan = [(row[k], lane) for k in row for lane in ("load", "memory")]
    m = mu.Mutant(id="m", group="state", file="src/llama-kv-cache.cpp", line=10, original="a", mutated="b", rule="r")
    (tmp_path / "pairs.json").write_text(json.dumps({
        "llama/memory": {"src/llama-kv-cache.cpp": "1-4,9-12"}, "mamba/memory": {"src/llama-kv-cache.cpp": "11"},
        "qwen3/load": {"src/llama-kv-cache.cpp": "10"}, "qwen3/memory": {"src/llama-memory.cpp": "10"}}))
    got = mu.covering(plan, m, ["load", "memory"], mu.RowLines(tmp_path))
    assert [(r.key, lane) for r, lane in got] == [("llama", "memory"), ("qwen3", "load")]
    (tmp_path / "pairs.json").unlink()
    got = mu.covering(plan, m, ["memory"], mu.RowLines(tmp_path))
    assert [(r.key, lane) for r, lane in got] == [("llama", "memory"), ("mamba", "memory"), ("qwen3", "memory")]


def test_the_score_counts_killed_over_run_and_the_totals_line():
    r = [{"group": "state", "status": s} for s in ("killed", "killed", "killed", "survived", "equivalent",
                                                   "build-failed", "error")]
    assert mu.score(r) == {"killed": 3, "survived": 1, "equivalent": 1, "build-failed": 1, "error": 1, "score": 75.0}
    assert mu.totals_line(r) == "mutation score: 3 of 4 killed (75.0%), 1 equivalent, 1 survived"


def test_a_lane_the_bump_from_the_pristine_build_says_broke_kills_the_mutant(tmp_path):
    """As a bump of the pristine build to the mutant's would: a passing lane whose conversations take fewer prompt
    tokens from the cache, or a lane known on both builds that fails more seeded cases (the pristine lanes kept in
    pristine.json, read back by a resumed run)."""
    from synth.manifest import load_manifest
    from targets.builds import Build

    def lane(cache_n, status="pass"):
        clients = {"name": "clients taking turns on two slots", "order": ["client0.0", "client1.0"],
                   "lengths": [24, 24], "shared": [0, 0], "cache_n": cache_n}
        return {"status": status, "reports": [{"oracle": "prefix-cache", "rewinds": [], "clients": clients}]}

    def known(*steps):
        return {"status": "known", "reports": [{"oracle": "memory", "target": "llama-cpp", "findings": [
            {"phase": "per-seq-kv", "step": k, "message": f"at {k}", "fingerprint": {"op": "keep"}} for k in steps]}]}

    (tmp_path / "pristine.json").write_text(json.dumps({"spec": "pinned", "lanes": {
        "qwen3/prefix-cache": lane([0, 20]), "qwen3/memory": known(1, 1)}}))
    m = load_manifest()
    base = mu.Pristine(tmp_path, "pinned", m.path)
    row, pinned = m.row("qwen3"), Build("pinned", {})
    assert mu.bump_broke(base, row, "prefix-cache", lane([0, 20]), pinned) is None
    assert mu.bump_broke(base, row, "prefix-cache", lane([0, 21]), pinned) is None
    assert "the base took 20, the candidate 3" in mu.bump_broke(base, row, "prefix-cache", lane([0, 3]), pinned)
    assert mu.bump_broke(base, row, "memory", known(1, 1), pinned) is None
    assert mu.bump_broke(base, row, "memory", known(1, 1, 4), pinned) == (
        "known, and more: 1 findings the base does not have, each of a known upstream finding's class; first: at 4")
    assert mu.bump_broke(base, row, "handoff", {"status": "pass", "reports": []}, pinned) is None  # (nothing to ask)
    (tmp_path / "pristine.json").write_text(json.dumps({"spec": "pinned", "lanes": {
        "qwen3/prefix-cache": lane([0, 20], "finding")}}))
    assert mu.bump_broke(mu.Pristine(tmp_path, "pinned", m.path), row, "prefix-cache", lane([0, 3]),
                         pinned) is None  # (a pristine lane that failed promises nothing)
    assert mu.Pristine(tmp_path, "pypi:0.3.35", m.path).lanes == {}  # (another build's lanes are not its base)


def test_mutate_refuses_an_id_no_mutant_of_the_coverage_run_has_before_building(tmp_path):
    _, cov = fake_coverage(tmp_path)
    r = run_cli("family-certify", "mutate", "--coverage", str(cov), "--out", str(tmp_path / "m"), "--id",
                "llama-kv-cache-4-0000000000")
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1].startswith(
        "family-certify: error: --id llama-kv-cache-4-0000000000: no such mutant of the lines this coverage run ran"), \
        r.stderr
    assert "build:" not in r.stderr and not (tmp_path / "m").exists()


def test_mutate_refuses_a_directory_that_is_no_coverage_run(tmp_path):
    r = run_cli("family-certify", "mutate", "--coverage", str(tmp_path), "--out", str(tmp_path / "m"))
    assert r.returncode == 2 and "not a complete `family-certify coverage` run" in r.stderr, r.stderr


@pytest.mark.slow
@pytest.mark.server
def test_mutants_of_the_pinned_tree_are_built_and_judged(tmp_path):
    """A coverage run of llama's memory lane, then three of its mutants built and run on that lane: each ends
    killed, survived, equivalent or build-failed; the report holds to its schema and resumes (a second run runs
    nothing new)."""
    cov = tmp_path / "cov"
    assert run_cli("family-certify", "coverage", "llama", "--lane", "memory", "--out", str(cov),
                   timeout=3600).returncode == 0
    out = tmp_path / "mut"
    r = run_cli("family-certify", "mutate", "--coverage", str(cov), "--out", str(out), "--state", "3", "--server",
                "0", "--seed", "1", timeout=3600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    rep = json.loads((out / "mutate.json").read_text())
    validate(rep, "mutate")
    assert len(rep["results"]) == 3 and rep["complete"]
    assert r.stdout.strip().splitlines()[-1].startswith("mutation score: ")
    again = run_cli("family-certify", "mutate", "--coverage", str(cov), "--out", str(out), "--state", "3",
                    "--server", "0", "--seed", "1", timeout=600)
    assert again.returncode == 0 and json.loads((out / "mutate.json").read_text())["results"] == rep["results"]
    # --diff: the bump from 0.3.35 to the pin, its changed lines only
    d = run_cli("family-certify", "mutate", "--coverage", str(cov), "--out", str(tmp_path / "diff"), "--state", "2",
                "--server", "0", "--diff", "pypi:0.3.35", timeout=3600)
    assert d.returncode == 0, d.stdout[-2000:] + d.stderr[-2000:]
    rep = json.loads((tmp_path / "diff" / "mutate.json").read_text())
    validate(rep, "mutate")
    assert rep["diff"]["base"] == "pypi:0.3.35" and 0 < rep["diff"]["ran"] < rep["diff"]["changed"], rep["diff"]
    changed = mu.changed_lines(mu.base_tree("pypi:0.3.35"), mu.base_tree("pinned"), [r["file"] for r in rep["results"]])
    assert rep["results"] and all(r["line"] in changed[r["file"]] for r in rep["results"])
    assert f"changed against pypi:0.3.35: {rep['diff']['changed']} state-code lines" in d.stdout


def test_a_bump_refuses_mutants_of_a_candidate_it_cannot_build_them_in_before_any_lane(tmp_path):
    series = tmp_path / "series"
    series.mkdir()
    r = run_cli("family-certify", "bump", "qwen3", "--candidate", "pinned", "--patches", str(series),
                "--mutate-diff", "60", "--out", str(tmp_path / "b"))
    assert r.returncode == 2 and "--mutate-diff: the candidate must be pinned or pypi:VERSION" in r.stderr, r.stderr
    assert not (tmp_path / "b").exists()


@pytest.mark.slow
@pytest.mark.server
@pytest.mark.parametrize("file,where,original,mutated,row,lane", [
    # seq_div divides the cells that do not hold the sequence instead of those that do
    ("src/llama-kv-cache.cpp", "if (cells.seq_has(i, seq_id)) {\n            cells.pos_div(i, d);",
     "cells.seq_has(i, seq_id)", "!(cells.seq_has(i, seq_id))", "qwen3", "memory"),
    # every slot not processing its prompt reads its task for a progress report: an idle slot has none
    ("tools/server/server-context.cpp", "slot.state == SLOT_STATE_PROCESSING_PROMPT || slot.state == SLOT_STATE_DONE",
     "slot.state ==", "slot.state !=", "qwen3", "prefix-cache"),
], ids=["state", "server"])
def test_a_killed_mutants_bundle_replays_on_its_build_and_not_on_the_pinned_one(tmp_path, file, where, original,
                                                                                 mutated, row, lane):
    """A mutant of each group, killed by the lane that ran its line, its finding bundled (--bundles): `fuzz replay`
    exits 1 on the mutant's build (the bundle records its patch series) and 0 with --llama-cpp pinned."""
    from synth.manifest import load_manifest

    root = mu.base_tree("pinned")
    text = (root / file).read_text()
    assert text.count(where) == 1, where
    n = text.count("\n", 0, text.index(where)) + 1
    line = text.splitlines(keepends=True)[n - 1]
    m = mu.Mutant(id=f"test-{Path(file).stem}-{n}", group="state" if file.startswith("src/") else "server", file=file,
                  line=n, original=line, mutated=line.replace(original, mutated, 1), rule="test")
    _, work, pristine = mu.pristine_objects("pinned", [file])
    manifest = load_manifest()
    res = mu.run_mutant(m, root, pristine, work, [(manifest.row(row), lane)], tmp_path, "pinned", manifest.path,
                        bundles=True)
    assert res["status"] == "killed" and res["by"] == f"{row}/{lane}" and res["bundles"], res
    # (the lane bundles every finding it met, upstream's known ones too, which reproduce on the pinned build as well:
    # the mutant's own is the one that does not)
    pinned = {b: run_cli("fuzz", "replay", str(tmp_path / b), "--llama-cpp", "pinned", timeout=1800)
              for b in res["bundles"]}
    own = [b for b, r in pinned.items() if r.returncode == 0 and "not reproduced" in r.stdout]
    assert own, {b: r.stdout[-500:] for b, r in pinned.items()}
    r = run_cli("fuzz", "replay", str(tmp_path / own[0]), timeout=1800)
    assert r.returncode == 1 and "REPRODUCED" in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]


def test_every_survivor_account_is_one_of_three_and_says_why():
    """corpora/mutation.toml, which docs/mutation.md renders: each survivor accounted for once, by its id (file stem,
    line, digest), as a generator that kills it since, unobservable (why, with the direct run or the code that shows
    it) or a to-do; an account that names a killing row x lane names one of the manifest's rows."""
    import re
    import tomllib

    from synth.manifest import load_manifest

    accounts = tomllib.loads((ROOT / "corpora" / "mutation.toml").read_text())["survivor"]
    ids = [a["id"] for a in accounts]
    assert len(ids) == len(set(ids)) and all(re.fullmatch(r"[a-z0-9-]+-\d+-[0-9a-f]{10}", i) for i in ids), ids
    assert all(a["status"] in ("generator", "unobservable", "todo") and len(a["why"]) > 80 for a in accounts)
    rows = set(load_manifest().rows)
    for a in accounts:
        for row in re.findall(r"killed since by ([a-z0-9-]+)/", a["why"]):
            assert row in rows, (a["id"], row)
