"""`family-certify coverage` (fuzz/certify/coverage.py) and the coverage build (targets/cmake_build.py): only
llama.cpp's own sources are instrumented, at -O0; a process's counts land under its GCOV_PREFIX; gcovr reads them
into per-function figures with the lane that first ran each function. The coverage of the pinned build itself
(minutes of building) is the slow test at the end."""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from fuzz.certify import coverage as cov
from fuzz.certify.schemas import validate
from synth.errors import UserError
from targets.cmake_build import COVERAGE_FLAGS, built, options_id

from conftest import ROOT, run_cli

CMAKE = pytest.mark.skipif(not shutil.which("cmake"), reason="skipped: cmake is not installed")


def tiny_cxx_tree(root: Path) -> Path:
    """A C++ project laid out as llama.cpp is: the library from src/ and ggml/, llama-server from tools/server/."""
    files = {"CMakeLists.txt": "cmake_minimum_required(VERSION 3.14)\nproject(tiny CXX)\n"
                               "set(CMAKE_RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)\n"
                               "set(CMAKE_LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)\n"
                               "add_library(llama SHARED src/state.cpp ggml/kernel.cpp)\n"
                               "add_executable(llama-server tools/server/main.cpp)\n"
                               "target_link_libraries(llama-server llama)\n",
             "src/state.cpp": "int kernel(int);\nint state(int x) {\n  if (x > 2)\n    return kernel(x);\n"
                              "  return -x;\n}\nint unused(int x) {\n  return x * 3;\n}\n",
             "ggml/kernel.cpp": "int kernel(int x) { return x + 1; }\n",
             "tools/server/main.cpp": "#include <cstdio>\nint state(int);\n"
                                      "int main() { std::printf(\"%d\\n\", state(5)); return 0; }\n"}
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


@CMAKE
def test_a_coverage_build_instruments_llama_cpps_own_sources_at_O0_and_counts_land_under_the_prefix(tmp_path):
    tree = tiny_cxx_tree(tmp_path / "tree")
    work = tmp_path / "work"
    with built(tree, work, "tiny", coverage=True) as (out, _):
        server = out / "llama-server"
        notes = sorted(p.name for p in (work / "build").rglob("*.gcno"))
        root = str((work / "src").resolve())
        launch = [str(work / "coverage-cc"), root, "echo", "-O3", "-c"]
        flags = {rel: subprocess.run([*launch, f"{root}/{rel}"], capture_output=True, text=True).stdout.split()
                 for rel in ("src/state.cpp", "tools/server/main.cpp", "common/arg.cpp", "ggml/kernel.cpp")}
        counts = tmp_path / "counts" / "some-lane"  # (as a coverage run lays a lane out: a directory a row)
        for row in ("tiny", "tiny2"):
            r = subprocess.run([str(server)], capture_output=True, text=True, check=True,
                               env={**os.environ, "GCOV_PREFIX": str(counts / "rows" / row), "GCOV_PREFIX_STRIP": "0"})
    assert r.stdout.strip() == "6"
    assert notes == ["main.cpp.gcno", "state.cpp.gcno"]  # ggml's kernel is not instrumented
    # the launcher adds the flags (after the build's own: -O0 wins) to llama.cpp's sources only
    assert {rel: f[2:] for rel, f in flags.items()} == {
        "src/state.cpp": [f"{root}/src/state.cpp", *COVERAGE_FLAGS],
        "tools/server/main.cpp": [f"{root}/tools/server/main.cpp", *COVERAGE_FLAGS],
        "common/arg.cpp": [f"{root}/common/arg.cpp", *COVERAGE_FLAGS], "ggml/kernel.cpp": [f"{root}/ggml/kernel.cpp"]}
    assert sorted(p.name for p in (counts / "rows" / "tiny").rglob("*.gcda")) == ["main.cpp.gcda", "state.cpp.gcda"]
    assert not list((work / "build").rglob("*.gcda"))  # nothing left in the build directory itself
    assert (work / "build" / "family-certify-options").read_text().strip() == options_id(coverage=True) != options_id()

    trace = cov.lane_tracefile(counts, (work / "src").resolve(), tmp_path / "lane.json", files=(r"src/.*",))
    fns = cov.functions_of(trace)  # (the two rows' counts merged: each ran state(5) once)
    assert fns[("src/state.cpp", "state(int)")]["count"] == 2
    assert fns[("src/state.cpp", "state(int)")]["lines"] == {2: 2, 3: 2, 4: 2, 5: 0}
    assert fns[("src/state.cpp", "unused(int)")]["count"] == 0
    assert fns[("src/state.cpp", "state(int)")]["branches"] == [1, 2]
    # the row's own lines, read by gcov for what a mutant of a line runs on (pairs.json)
    assert cov.row_lines(counts / "rows" / "tiny", (work / "src").resolve(), files=(r"src/.*",)) == \
        {"src/state.cpp": "2-4"}


def test_a_coverage_builds_workers_are_not_reused_and_get_time_to_write_their_counts(monkeypatch):
    """A worker writes the counts of everything it ran when it exits: under a coverage build each target gets a
    worker of its own (a reused one that a later program crashes would lose every earlier oracle's counts, as a
    whole row's memory lane once did) and a closed one is not killed after the usual 5 s."""
    from targets import client, open_target

    assert open_target("llama-cpp").key is not None
    monkeypatch.setenv(client.COVERAGE_ENV, "1")
    t = open_target("llama-cpp")
    assert t.key is None and client.COVERAGE_EXIT_WAIT > client.EXIT_WAIT * 10


def trace(*funcs: tuple[str, str, dict[int, int]]) -> dict:
    """A gcovr JSON tracefile of these (file, function, {line: count}) functions."""
    files: dict[str, dict] = {}
    for file, name, lines in funcs:
        f = files.setdefault(file, {"file": file, "lines": [], "functions": []})
        f["functions"].append({"demangled_name": name, "lineno": min(lines),
                               "execution_count": max(lines.values())})
        f["lines"] += [{"line_number": n, "function_name": name, "count": c, "branches": []}
                       for n, c in lines.items()]
    return {"files": list(files.values())}


def test_a_functions_first_lane_is_the_first_lane_in_run_order_that_ran_it_and_counts_add_up():
    kv, srv = "src/llama-kv-cache.cpp", "tools/server/server-context.cpp"
    sweep = trace((kv, "llama_kv_cache::seq_rm(int, int, int)", {10: 0, 11: 0}),
                  (kv, "llama_kv_cache::find_slot(ubatch)", {20: 3, 21: 3, 22: 0}))
    memory = trace((kv, "llama_kv_cache::seq_rm(int, int, int)", {10: 2, 11: 0}),
                   (kv, "llama_kv_cache::find_slot(ubatch)", {20: 1, 21: 1, 22: 1}),
                   (srv, "server_slot::reset()", {5: 0}))
    fns = cov.merge_functions([("sweep", cov.functions_of(sweep)), ("memory", cov.functions_of(memory))])
    assert fns[(kv, "llama_kv_cache::find_slot(ubatch)")]["first_lane"] == "sweep"
    assert fns[(kv, "llama_kv_cache::seq_rm(int, int, int)")]["first_lane"] == "memory"
    assert fns[(kv, "llama_kv_cache::seq_rm(int, int, int)")]["lines"] == {10: 2, 11: 0}
    assert fns[(srv, "server_slot::reset()")]["first_lane"] is None
    merged = trace((kv, "llama_kv_cache::seq_rm(int, int, int)", {10: 2, 11: 0}),
                   (kv, "llama_kv_cache::find_slot(ubatch)", {20: 4, 21: 4, 22: 1}),
                   (srv, "server_slot::reset()", {5: 0}))
    accounts = [cov.Account(r"tools/server/.*", r"^server_slot::", "todo", "a reason")]
    rep = cov.report(fns, merged, [], {"key": "k"}, "family-certify coverage", 1.0, accounts)
    groups = {g["name"]: g for g in rep["groups"]}
    assert groups["state"]["lines"] == [4, 5] and groups["state"]["line_percent"] == 80.0
    assert groups["server"]["lines"] == [0, 1] and groups["server"]["functions"] == [0, 1]
    assert groups["server"]["unaccounted"] == 0 and groups["state"]["unaccounted"] == 0
    unrun = {f["function"]: f["account"] for f in rep["functions"] if not f["calls"]}
    assert unrun == {"server_slot::reset()": {"status": "todo", "why": "a reason"}}
    assert cov.totals_line(rep) == "coverage: state functions 80.0% of lines, server paths 0.0%"
    assert {f["file"]: f["lines"] for f in rep["files"]} == {kv: [4, 5], srv: [0, 1]}
    assert "| `src/llama-kv-cache.cpp` | 4 / 5 | 80.0 |" in cov.summary_md(rep)
    validate(rep, "coverage")


def test_the_accounts_file_is_valid_and_the_coverage_page_lists_every_account_and_parameter(tmp_path):
    """corpora/coverage.toml: every [[function]] a file and name pattern, a status and why; every [[parameter]] of
    llama_context_params or llama-server, drawn or why not. docs/coverage.md (scripts/coverage_md.py) shows each."""
    import tomllib

    accounts = cov.load_accounts()
    assert accounts and {a.status for a in accounts} <= set(cov.ACCOUNT_STATUSES)
    params = tomllib.loads(cov.ACCOUNTS.read_text())["parameter"]
    assert {p["where"] for p in params} == {"llama_context_params", "llama-server"}
    assert {p["status"] for p in params} <= {"drawn", "todo", "unreachable"} and all(p["why"] for p in params)
    page = (ROOT / "docs" / "coverage.md").read_text()
    for a in accounts:
        assert f"`{a.file}` / `{a.match}`" in page, a.match
    for p in params:
        assert f"| `{p['name']}` | {p['where']} | {p['status']} |" in page, p["name"]
    bad = tmp_path / "coverage.toml"
    bad.write_text('[[function]]\nfile = "x"\nmatch = "y"\nstatus = "maybe"\nwhy = "z"\n')
    with pytest.raises(UserError, match="status 'maybe': use one of unreachable, todo"):
        cov.load_accounts(bad)


def test_coverage_refuses_a_lane_that_does_not_exist_before_building_anything():
    r = run_cli("family-certify", "coverage", "--lane", "nope")
    assert r.returncode == 2 and "--lane 'nope'" in r.stderr and "build:" not in r.stderr, r.stderr


@pytest.mark.slow
@pytest.mark.server
def test_the_per_bump_jobs_coverage_of_the_pinned_build(tmp_path):
    """An attention, a recurrent and a hybrid row through the per-bump jobs on the coverage build: their memories'
    files are run, the server's slot code too, the report holds to its schema and the totals line ends the log."""
    out = tmp_path / "cov"
    r = run_cli("family-certify", "coverage", "qwen3", "mamba2", "falcon-h1", "--job", "gate", "--job", "memory",
                "--job", "server", "--out", str(out), "--jobs", "2", timeout=3600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    last = r.stdout.strip().splitlines()[-1]
    assert last.startswith("coverage: state functions ") and "server paths" in last
    rep = json.loads((out / "coverage.json").read_text())
    files = {f["file"] for f in rep["files"]}
    assert {"src/llama-kv-cache.cpp", "src/llama-context.cpp", "src/llama-memory-recurrent.cpp",
            "tools/server/server-context.cpp"} <= files
    assert (out / "html" / "index.html").is_file() and (out / "junit.xml").is_file()
    validate(rep, "coverage")
    ran = {f["file"]: f["lines"][0] for f in rep["files"]}
    assert min(ran[f] for f in ("src/llama-kv-cache.cpp", "src/llama-memory-recurrent.cpp",
                                "src/llama-memory-hybrid.cpp", "tools/server/server-context.cpp")) > 0
    assert {x["lane"] for x in rep["lanes"]} >= {"parity", "memory", "prefix-cache"}
    # each row x lane's own lines (what a mutant runs on): a recurrent row's memory lane ran the recurrent memory,
    # the attention row's did not; every line a lane ran, one of its rows ran
    pairs = json.loads((out / "pairs.json").read_text())
    assert "src/llama-memory-recurrent.cpp" in pairs["mamba2/memory"], sorted(pairs["mamba2/memory"])
    assert "src/llama-memory-recurrent.cpp" not in pairs["qwen3/memory"]
    trace = json.loads((out / "lanes" / "memory.json").read_text())
    lane = {(f["file"], ln["line_number"]) for f in trace["files"] for ln in f["lines"] if ln["count"]}
    rows = {(f, n) for k, v in pairs.items() if k.endswith("/memory") for f, text in v.items()
            for n in cov.unranges(text)}
    assert lane and lane <= rows, sorted(lane - rows)[:5]
