"""llama.cpp builds as an input (targets/builds.py): what is refused before anything is built — a patch that does
not apply, a tree whose llama.h no longer matches the bindings that would run it, bindings missing what the worker
calls, a spec that names nothing — each in one line with exit 2; and the build identity every report records.
Building a tree takes minutes: those lanes are in tests/test_bump.py (slow)."""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from fuzz.engine.contract import build_identity
from fuzz.oracles.isolation import IsolationConfig
from fuzz.oracles.registry import ORACLES
from targets import builds
from targets.cmake_build import BUILT_FROM, OPTIONS_MARK, built, forget_other_options, options_id, sync_tree

from conftest import ROOT, run_cli

PATCHES = ROOT / "tests" / "data" / "patches"


def one_line_exit_2(r) -> str:
    """The error: one line, last on stderr (progress lines like "build: downloading ..." may come before it)."""
    assert r.returncode == 2, (r.returncode, r.stdout[-500:], r.stderr[-1500:])
    lines = r.stderr.strip().splitlines()
    errors = [ln for ln in lines if ": error: " in ln]
    assert len(errors) == 1 and lines[-1] == errors[0] and "Traceback" not in r.stderr, r.stderr
    assert all(ln.startswith("build: ") for ln in lines[:-1]), r.stderr
    return lines[-1]


@pytest.mark.parametrize("prog,args", [("fuzz", ["isolation", "llama"]), ("family-certify", ["run", "llama"])])
def test_a_patch_that_does_not_apply_is_refused_naming_it(prog, args):
    line = one_line_exit_2(run_cli(prog, *args, "--patches", str(PATCHES / "stale")))
    assert "0001-does-not-apply.patch does not apply" in line and "src/llama-memory-recurrent.cpp" in line


def test_a_tree_whose_structs_changed_is_refused_before_it_is_built():
    """The patch adds a field to llama_context_params: the pinned bindings would pass the struct in the old layout
    (silently wrong, not a crash), so the build is refused, naming the struct — before any compiling."""
    line = one_line_exit_2(run_cli("fuzz", "isolation", "llama", "--patches", str(PATCHES / "api-change")))
    assert "struct llama_context_params changed" in line and "cannot drive this build's API" in line


@pytest.mark.parametrize("spec,says", [("pypi:not-a-version", "not a version"),
                                       ("/nonexistent/llama.cpp", "not a llama.cpp source tree"),
                                       ("pypi:0.0.0", "cannot download llama-cpp-python 0.0.0")])
def test_a_build_spec_that_names_nothing_is_refused(spec, says):
    assert says in one_line_exit_2(run_cli("fuzz", "run", "llama", "--llama-cpp", spec))


def test_an_empty_patch_series_is_refused(tmp_path):
    assert "no *.patch files" in one_line_exit_2(run_cli("fuzz", "run", "llama", "--patches", str(tmp_path)))


def test_the_header_check_names_what_changed(tmp_path):
    """Struct bodies compare without comments and whitespace; each changed struct, state version and ggml_tensor
    is named."""
    ref = builds.pinned_headers()
    tree = tmp_path / "tree"
    (tree / "include").mkdir(parents=True)
    (tree / "ggml" / "include").mkdir(parents=True)
    llama = (ref / "llama.h").read_text()
    ggml = (ref / "ggml.h").read_text()
    # comments and spacing only: nothing changed
    (tree / "include" / "llama.h").write_text(llama.replace("bool kv_unified;", "bool    kv_unified; /* same */"))
    (tree / "ggml" / "include" / "ggml.h").write_text(ggml)
    assert builds.header_changes(tree, ref) == []
    llama = llama.replace("#define LLAMA_STATE_SEQ_VERSION 3", "#define LLAMA_STATE_SEQ_VERSION 4")
    llama = llama.replace("struct llama_batch {", "struct llama_batch {\n        int32_t n_extra;", 1)
    (tree / "include" / "llama.h").write_text(llama)
    (tree / "ggml" / "include" / "ggml.h").write_text(ggml.replace("struct ggml_tensor {",
                                                                   "struct ggml_tensor {\n        int flags2;", 1))
    assert builds.header_changes(tree, ref) == [
        "struct llama_batch changed (the bindings would pass it in the old layout)", "LLAMA_STATE_SEQ_VERSION 3 → 4",
        "struct ggml_tensor changed (the worker's capture helper reads its fields)"]


def test_bindings_must_declare_what_the_worker_calls(tmp_path):
    """Read from the worker's code: every llama_* function it calls and every params field it sets. The pinned
    bindings declare them all; bindings without one of each are named."""
    funcs, fields = builds.worker_needs()
    assert {"llama_decode", "llama_state_seq_get_data_ext", "llama_memory_seq_rm"} <= funcs
    assert {"kv_unified", "n_ubatch", "flash_attn_type", "load_mode"} <= fields
    assert builds.bindings_problems(builds.venv_bindings()) == []
    pkg = tmp_path / "llama_cpp"
    pkg.mkdir()
    text = (builds.venv_bindings() / "llama_cpp.py").read_text()
    text = text.replace("def llama_memory_seq_rm(", "def llama_memory_seq_rm_gone(", 1)
    text = text.replace('("kv_unified", ctypes.c_bool),', "", 1)
    (pkg / "llama_cpp.py").write_text(text)
    assert builds.bindings_problems(pkg) == ["llama_memory_seq_rm()", "field kv_unified"]


@pytest.mark.llama
def test_every_report_records_the_build(fixtures):
    rep = ORACLES["isolation"].run(fixtures("llama", layers=2), IsolationConfig(tokens=1, n_seq=2))
    b = rep.to_dict()["build"]
    assert b["spec"] == "pinned" and b["llama_cpp_python"] == "0.3.36" and b["patches"] is None
    assert b["llama_cpp_commit"] == builds.PINNED_COMMIT and b["toolkit"]
    assert build_identity()["llama_cpp_commit"] == builds.PINNED_COMMIT


def test_activating_a_build_sets_the_workers_environment_and_puts_it_back(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/somewhere")
    monkeypatch.setenv("FAMILY_CERTIFY_LLAMA_SERVER", "/my/llama-server")
    ident = {"spec": "pypi:0.3.35", "llama_cpp_python": "0.3.35", "llama_cpp_commit": None, "patches": None}
    b = builds.Build("pypi:0.3.35", ident, bindings=tmp_path / "py", server=tmp_path / "bin" / "llama-server")
    (tmp_path / "py").mkdir()
    builds.activate(b)
    try:
        assert os.environ["PYTHONPATH"] == f"{tmp_path / 'py'}{os.pathsep}/somewhere"
        assert os.environ["FAMILY_CERTIFY_LLAMA_SERVER"] == str(tmp_path / "bin" / "llama-server")
        assert json.loads(os.environ[builds.IDENTITY_ENV]) == ident
        assert build_identity()["spec"] == "pypi:0.3.35"
        builds.activate(b)  # again: not stacked
        assert os.environ["PYTHONPATH"] == f"{tmp_path / 'py'}{os.pathsep}/somewhere"
    finally:
        builds.activate(builds.resolve("pinned"))
    assert os.environ["PYTHONPATH"] == "/somewhere" and os.environ["FAMILY_CERTIFY_LLAMA_SERVER"] == "/my/llama-server"
    assert builds.IDENTITY_ENV not in os.environ


def test_syncing_a_tree_rewrites_only_what_changed(tmp_path):
    """What keeps a second patch series on the same tree an incremental build: unchanged files keep their mtime."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    (src / "a").mkdir(parents=True)
    for name in ("a/x.c", "a/y.c", "z.h"):
        (src / name).write_text(name)
    assert sync_tree(src, dst) == 3
    before = (dst / "a" / "x.c").stat().st_mtime_ns
    (src / "a" / "y.c").write_text("changed")
    (src / "z.h").unlink()
    (src / "new.c").write_text("new")
    assert sync_tree(src, dst) == 3  # y.c rewritten, new.c written, z.h removed
    assert (dst / "a" / "x.c").stat().st_mtime_ns == before
    assert sorted(p.relative_to(dst).as_posix() for p in dst.rglob("*") if p.is_file()) == ["a/x.c", "a/y.c", "new.c"]
    assert (dst / "a" / "y.c").read_text() == "changed"


OLD = 1_500_000_000  # (2017) the time a pristine file carries, as extracted from an sdist


def tiny_tree(root: Path, value: int = 0, other: int = 0) -> Path:
    """A CMake project with the targets a llama.cpp build makes (`llama`, `llama-server`): llama-server prints
    value() and other(), two functions of the library in two files. Pristine files carry an old time (an sdist's);
    a file a series changed is written now (as `git apply` writes it)."""
    files = {"CMakeLists.txt": "cmake_minimum_required(VERSION 3.14)\nproject(tiny C)\n"
                               "set(CMAKE_RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)\n"
                               "set(CMAKE_LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)\n"
                               "add_library(llama SHARED value.c other.c)\n"
                               "add_executable(llama-server main.c)\ntarget_link_libraries(llama-server llama)\n",
             "main.c": '#include <stdio.h>\nint value(void);\nint other(void);\n'
                       'int main(void) { printf("%d %d\\n", value(), other()); return 0; }\n',
             "value.c": f"int value(void) {{ return {value}; }}\n",
             "other.c": f"int other(void) {{ return {other}; }}\n"}
    changed = {"value.c"} if value else set()
    changed |= {"other.c"} if other else set()
    root.mkdir(parents=True)
    for name, text in files.items():
        (root / name).write_text(text)
        if name not in changed:
            os.utime(root / name, (OLD, OLD))
    return root


def behaves(work: Path, tree: Path) -> str:
    """What the build of `tree` in `work` does: its llama-server's output."""
    with built(tree, work, tree.name) as (out, _):
        return subprocess.run([str(out / "llama-server")], capture_output=True, text=True, check=True).stdout.strip()


@pytest.mark.skipif(not shutil.which("cmake"), reason="skipped: cmake is not installed")
@pytest.mark.parametrize("first,then", [("A", "B"), ("B", "A")])
def test_a_series_that_reverts_the_previous_series_file_is_compiled_from_its_own_content(tmp_path, first, then):
    """Series A changes value.c, series B changes other.c (so B's value.c is the pristine one, with the sdist's old
    time again). Built one after the other in one work directory, each build behaves as a clean build of its own
    tree — the first series' change does not survive in the second's library — in either order."""
    series = {"A": {"value": 1}, "B": {"other": 2}}
    trees = {name: tiny_tree(tmp_path / name, **change) for name, change in series.items()}
    clean = {name: behaves(tmp_path / f"clean-{name}", tree) for name, tree in trees.items()}
    assert clean == {"A": "1 0", "B": "0 2"}
    work = tmp_path / "work"
    assert behaves(work, trees[first]) == clean[first]
    assert behaves(work, trees[then]) == clean[then]
    assert behaves(work, trees[first]) == clean[first]  # and back


@pytest.mark.skipif(not shutil.which("cmake"), reason="skipped: cmake is not installed")
def test_a_build_directory_without_a_record_of_its_sources_is_built_afresh(tmp_path):
    """A work directory whose build recorded nothing of what it compiled (made before the record was kept) may hold
    another tree's objects: it is not reused. Its record names every file's sha256."""
    work = tmp_path / "work"
    a, b = tiny_tree(tmp_path / "A", value=1), tiny_tree(tmp_path / "B", other=2)
    assert behaves(work, a) == "1 0"
    record = json.loads((work / BUILT_FROM).read_text())
    assert set(record["files"]) == {"CMakeLists.txt", "main.c", "value.c", "other.c"}
    (work / BUILT_FROM).unlink()
    for p in (work / "src").iterdir():  # as the old sync left B: the pristine value.c with its old time
        shutil.copy2(b / p.name, p)
    (work / "build" / "marker").write_text("")
    assert behaves(work, b) == "0 2"
    assert not (work / "build" / "marker").exists()


def test_a_cache_entry_is_used_only_with_the_content_it_was_built_from(tmp_path):
    (tmp_path / "identity.json").write_text(json.dumps({"tree_sha256": "ab"}))
    assert not builds.cached_build(tmp_path, "ab")  # made before builds recorded what they were compiled from
    (tmp_path / "identity.json").write_text(json.dumps({"tree_sha256": "ab", "built_from": "ab"}))
    assert builds.cached_build(tmp_path, "ab") and not builds.cached_build(tmp_path, "cd")
    assert not builds.cached_build(tmp_path / "gone", "ab")


def test_a_build_configured_with_other_options_starts_from_cmakes_defaults(tmp_path):
    """A CMake cache from another configure (one before the options were marked: the native build) is dropped, one
    marked with today's options kept — an option such a cache holds (GGML_AVX2 off) would outlive the change."""
    cache = tmp_path / "CMakeCache.txt"
    cache.write_text("GGML_NATIVE:BOOL=ON\nGGML_AVX2:BOOL=OFF\n")
    assert forget_other_options(tmp_path) and not cache.exists()
    cache.write_text("x")
    (tmp_path / OPTIONS_MARK).write_text("0123456789ab\n")
    assert forget_other_options(tmp_path) and not cache.exists()
    cache.write_text("x")
    (tmp_path / OPTIONS_MARK).write_text(options_id() + "\n")
    assert not forget_other_options(tmp_path) and cache.exists()


@pytest.mark.llama
def test_the_pinned_build_is_portable_without_avx512_or_amx(llama):
    """The pinned llama.cpp runs the same code on every machine: no AVX-512 or AMX kernels (on an AMX host the
    native build crashes in them on quantized fixtures, upstream #20824), whatever the building machine had."""
    info = llama.hello().data["system_info"]
    assert "AVX2 = 1" in info or "x86" not in os.uname().machine, info
    assert "AMX" not in info and "AVX512" not in info, info


def test_a_bundle_made_on_a_build_names_it_when_it_is_gone(tmp_path):
    """Replay uses the build a bundle records; a patch series that is no longer there is refused in one line."""
    src = next(p.parent for p in sorted((ROOT / "corpora" / "repros").glob("*/bundle.json")))
    dst = tmp_path / "bundle"
    shutil.copytree(src, dst)
    data = json.loads((dst / "bundle.json").read_text())
    data["build"] = {**data["build"], "spec": "pinned", "key": "0123456789abcdef",
                     "patches": {"dir": str(tmp_path / "gone"), "files": ["0001-x.patch"], "sha256": "0" * 64}}
    (dst / "bundle.json").write_text(json.dumps(data))
    line = one_line_exit_2(run_cli("fuzz", "replay", str(dst)))
    assert f"--patches {tmp_path / 'gone'}: not a directory" in line


def test_another_libllama_under_the_pinned_bindings_is_refused(monkeypatch):
    """LLAMA_CPP_LIB_PATH makes llama-cpp-python load another libllama: nothing could check its structs, so every
    command refuses it and says what to pass instead."""
    monkeypatch.setenv("LLAMA_CPP_LIB_PATH", "/opt/other-llama/lib")
    line = one_line_exit_2(run_cli("fuzz", "run", "llama"))
    assert "LLAMA_CPP_LIB_PATH=/opt/other-llama/lib" in line and "--llama-cpp TREE" in line


@pytest.mark.parametrize("base,candidate,want", [
    ("pass", "pass", "unchanged"), ("pass", "finding", "broke"), ("pass", "crash", "broke"),
    ("numerics", "timeout", "broke"), ("finding", "pass", "fixed"), ("unsupported", "pass", "fixed"),
    ("unsupported", "crash", "broke"), ("pass", "unsupported", "newly unsupported"), ("known", "known", "unchanged"),
    ("finding", "crash", "unchanged"), ("pass", "missing", "broke"), ("skipped", "unsupported", "unchanged")])
def test_the_bump_verdict_of_a_lane(base, candidate, want):
    """A lane's verdict from its status on each build (known and numerics count as passing: their lanes ran)."""
    from fuzz.certify.bump import verdict

    assert verdict(base, candidate) == want


def test_a_lane_known_on_both_builds_broke_where_the_candidate_fails_more_cases_than_the_base():
    """A known lane is `unchanged` only when the candidate's findings are exactly the base's (run, phase, step, cuts,
    fingerprint; the messages' numbers may move): a new bug of a known class is `broke`. llama-server's reports
    are not compared (which schedules meet a known abort is timing)."""
    from fuzz.certify import bump as bp

    def finding(step, op="keep"):
        return {"phase": "per-seq-kv", "step": step, "cuts": None, "message": f"sequence 1 at step {step}: 0.{step}",
                "fingerprint": {"oracle": "memory", "cause": "layout", "op": op, "ops": ["decode", op]}}

    def lane(*found, server=()):
        return {"row": "qwen3", "lane": "memory", "status": "known", "detail": "known",
                "reports": [{"oracle": "memory", "target": "llama-cpp", "findings": list(found)},
                            {"oracle": "prefix-cache", "target": "llama-server", "findings": list(server)}]}

    base = lane(finding(1), finding(1))
    run = {"results": [base]}
    assert [v["verdict"] for v in bp.verdicts(run, {"results": [lane(finding(1), finding(1))]}, {})] == ["unchanged"]
    assert bp.more_known(base, lane(finding(1))) is None  # (fewer: not broke)
    assert bp.more_known(base, lane(finding(1), finding(1), server=[finding(9)])) is None
    (v,) = bp.verdicts(run, {"results": [lane(finding(1), finding(1), finding(4, "rm"))]}, {})
    assert v["verdict"] == "broke" and v["detail"].startswith(
        "known, and more: 1 findings the base does not have, each of a known upstream finding's class; first: "
        "sequence 1 at step 4: 0.4 | "), v["detail"]
    assert bp.more_known(base, lane(finding(1), finding(1), finding(1))).startswith("known, and more: 1 findings")
    # a drawn program that failed on the base too ended there (at a bug the candidate fixed): on the candidate it
    # goes on and meets a later known one — unmasked, not more; in a program the base passed it is more
    def drawn(status_of_1):
        return [{"program": 0, "kv_unified": False, "status": "pass"},
                {"program": 1, "kv_unified": False, "status": status_of_1}]

    later = {**finding(6, "rm"), "detail": {"index": 1}}
    masked = {**lane(finding(1)), "reports": [{"oracle": "memory", "target": "llama-cpp", "results": drawn("finding"),
                                               "findings": [{**finding(1), "detail": {"index": 1}}]}]}
    assert bp.more_known(masked, {**lane(), "reports": [{"oracle": "memory", "target": "llama-cpp",
                                                          "results": drawn("finding"), "findings": [later]}]}) is None
    passed = {**masked, "reports": [{**masked["reports"][0], "results": drawn("pass")}]}
    assert bp.more_known(passed, {**lane(), "reports": [{"oracle": "memory", "target": "llama-cpp",
                                                          "results": drawn("finding"), "findings": [later]}]}) \
        .startswith("known, and more: 1 findings")
    # the base's known findings gone on the candidate (a fix series): fixed — but not where llama-server had any
    passing = {"row": "qwen3", "lane": "memory", "status": "pass", "detail": "34 programs", "reports": []}
    (v,) = bp.verdicts(run, {"results": [passing]}, {})
    assert (v["verdict"], v["detail"]) == ("fixed", "fixed: the base's 2 findings of known upstream bugs are gone; "
                                           "first: sequence 1 at step 1: 0.1 | 34 programs"), v
    with_server = lane(finding(1), server=[finding(9)])
    assert [v["verdict"] for v in bp.verdicts({"results": [with_server]}, {"results": [passing]}, {})] == \
        ["unchanged"]
    # ... unless llama-server's finding is an abort as it loads (no request made: not timing)
    load = {**finding(9), "message": "schedule 1 (--embeddings --pooling mean, 3 slots): llama-server aborted loading "
                                     "with --embeddings --pooling mean: signal SIGABRT"}
    (v,) = bp.verdicts({"results": [lane(finding(1), server=[load])]}, {"results": [passing]}, {})
    assert v["verdict"] == "fixed" and v["detail"].startswith("fixed: the base's 2 findings of known upstream bugs"), v



def test_a_server_lane_broke_where_the_candidates_llama_server_offers_fewer_speculative_types():
    """server-options records the speculative types the build's --help offers; a candidate that offers fewer has
    lost a capability though every schedule drawn from what it offers passes (a --spec-type list misprinted:
    speculative-2206 ran every schedule without draft-simple)."""
    from fuzz.certify import bump as bp
    from fuzz.certify.bump_known import compared, fewer_offered

    def lane(offered):
        return compared({"row": "qwen3", "lane": "prefix-cache", "status": "pass", "detail": "ok",
                         "reports": [{"oracle": "server-options", "target": "llama-server", "findings": [],
                                      "offered": offered}]})

    full = ["draft-simple", "ngram-simple", "ngram-mod"]
    assert fewer_offered(lane(full), lane(full)) is None and fewer_offered(lane(full[1:]), lane(full)) is None
    assert fewer_offered(lane(full), lane(full[1:])) == ("capability lost: the candidate's llama-server offers no "
                                                         "--spec-type draft-simple, which the base's does")
    (v,) = bp.verdicts({"results": [{**lane(full), "row": "qwen3", "lane": "prefix-cache", "detail": "ok"}]},
                       {"results": [{**lane(full[1:]), "row": "qwen3", "lane": "prefix-cache", "detail": "ok"}]}, {})
    assert v["verdict"] == "broke" and v["detail"].startswith("capability lost"), v


def test_a_memory_lane_broke_where_the_candidates_seeded_programs_refuse_what_the_base_took():
    """A seeded program runs the same on the same build: where the candidate's refuses an operation more often than
    the base's (the same run config, layout and index, as many operations, the same status), a capability is lost —
    DeepSeek-V4's rollbacks all refused with snapshots on (llama-kv-cache-dsv4-1481) changed no check. Programs that
    ran otherwise (another length or status: one ended at a finding) or runs drawn otherwise are not compared."""
    from fuzz.certify import bump as bp
    from fuzz.certify.bump_known import compared, newly_refused

    def program(k, refused, steps=30, status="pass", kvu=False):
        return {"kv_unified": kvu, "program": k, "steps": steps, "status": status, "refused": refused,
                "checks": 9, "ops": {}, "max_abs_dlogit": 0.0}

    def lane(*programs, config=None, status="pass"):
        return {"row": "deepseek4", "lane": "memory", "status": status, "detail": "programs",
                "reports": [{"oracle": "memory", "target": "llama-cpp", "config": config or {"seed": 0},
                             "results": list(programs), "findings": []}]}

    base = lane(program(0, {"rm": 1}), program(1, {}))
    assert newly_refused(base, base) is None
    assert newly_refused(base, lane(program(0, {}), program(1, {}))) is None  # (fewer refused: not lost)
    assert newly_refused(base, lane(program(0, {"rm": 4, "add": 1}), program(1, {"rm": 2}))) == (
        "newly refused: 2 seeded memory programs refuse operations the base took; first: run 0, program 0 "
        "(per-seq-kv, 30 operations): add 1 more, rm 3 more")
    assert newly_refused(base, lane(program(0, {"rm": 4}, steps=12, status="finding"), program(1, {}))) is None
    assert newly_refused(base, lane(program(0, {"rm": 4}), config={"seed": 7})) is None
    (v,) = bp.verdicts({"results": [base]}, {"results": [lane(program(0, {"rm": 1}), program(1, {"rm": 2}))]}, {})
    assert v["verdict"] == "broke" and v["detail"].startswith("newly refused: 1 seeded memory programs"), v
    # mutate's pristine record keeps what the comparison needs of a memory run
    assert newly_refused(compared(base), compared(lane(program(0, {"rm": 2}), program(1, {})))).endswith("rm 1 more")


def test_a_lane_known_on_both_builds_is_fixed_in_part_where_the_candidate_meets_fewer_repros_in_runs_drawn_alike():
    """A known lane whose candidate no longer meets one of the base's repros (in the runs both drew with the same
    config) and meets none the base did not: `fixed`, the gone and the remaining named. A run drawn otherwise on the
    two builds (the rounds past known findings draw as many programs as met one) does not count."""
    from fuzz.certify import bump as bp

    def lane(runs, configs):
        return {"row": "llama", "lane": "memory", "status": "known", "detail": "known",
                "data": {"known_runs": runs},
                "reports": [{"oracle": "memory", "target": "llama-cpp", "config": c, "findings": []} for c in configs]}

    base = lane([["a", "bf16"], ["a"], ["bf16"]], [{"seed": 0}, {"type_k": "bf16"}, {"seed": 1, "programs": 8}])
    fixed = lane([["a"], ["a"], []], [{"seed": 0}, {"type_k": "bf16"}, {"seed": 1, "programs": 7}])
    (v,) = bp.verdicts({"results": [base]}, {"results": [fixed]}, {})
    assert (v["verdict"], v["detail"]) == ("fixed", "fixed: bf16 no longer met; still known: a | known"), v
    # met only in a run drawn otherwise on the candidate: not counted
    only_there = lane([["a"], ["a"], ["bf16"]], [{"seed": 0}, {"type_k": "bf16"}, {"seed": 1, "programs": 8}])
    assert bp.fewer_known(only_there, fixed) is None
    # one gone, another new: not fixed (more_known judges the new one)
    swapped = lane([["a"], ["a", "c"], []], [{"seed": 0}, {"type_k": "bf16"}, {"seed": 1, "programs": 7}])
    assert bp.fewer_known(base, swapped) is None
    assert [v["verdict"] for v in bp.verdicts({"results": [base]}, {"results": [base]}, {})] == ["unchanged"]

def test_a_crossing_moves_no_more_than_the_builds_differ():
    """State or hidden states crossing two builds: bit-exact, or the same greedy choices within 4x what the two
    builds' own runs differ by; builds that agree bit for bit must cross bit for bit."""
    import numpy as np

    from fuzz.certify.bump import crossing

    want = np.array([[1.0, 3.0, 2.0], [0.0, 0.5, 2.0]])
    assert crossing(want.copy(), want, 0.0) == ("crosses", 0.0)
    assert crossing(want + 0.01, want, 0.01)[0] == "crosses (numerics)"
    assert crossing(want + 0.05, want, 0.01)[0] == "wrong"  # the same choices, but 5x the builds' spread
    assert crossing(want + 1e-6, want, 0.0)[0] == "wrong"
    assert crossing(want[:, ::-1].copy(), want, 10.0)[0] == "wrong"  # other choices


@pytest.mark.llama
@pytest.mark.parametrize("row", ["qwen3vlmoe", "jamba", "gemma3"])
def test_mixed_build_chains_cross_on_one_build(tmp_path, row):
    """The mixed-build chain on two workers of the same build is the same-build chain: it must cross both ways,
    bit-exact — M-RoPE rows included (their embeddings are fed with four positions per token)."""
    from fuzz.certify import bump as bp
    from synth.make import write_fixture
    from synth.manifest import load_manifest

    path = tmp_path / f"{row}.gguf"
    write_fixture(load_manifest(ROOT / "family_tiers.toml").row(row).spec(), path)
    env = builds.resolve("pinned").env()
    got = bp.mixed_chains(str(path), {"base": env, "candidate": env})
    assert got["status"] == "ok" and got["cuts"] == [1], got
    assert {k: v["status"] for k, v in got["chains"].items()} == {"base → candidate": "crosses",
                                                                  "candidate → base": "crosses"}


@pytest.mark.llama
def test_the_cross_build_lane_of_a_build_and_itself_does_not_break():
    """What `mutate` asks of a survivor's rows (bump.cross_broke, the bump's cross-build lane): a build against
    itself crosses (None), on a recurrent and a sliding-window row as on a plain one."""
    from fuzz.certify import bump as bp
    from synth.manifest import load_manifest

    rows = [load_manifest(ROOT / "family_tiers.toml").row(k) for k in ("qwen3", "mamba", "gemma3")]
    env = builds.resolve("pinned").env()
    assert bp.cross_broke(rows, env, env) is None


def test_a_recorded_build_ignores_the_environments_patch_series(monkeypatch, tmp_path):
    """Replaying a bundle made on the pinned build, with FAMILY_CERTIFY_PATCHES set (a canary job's environment),
    runs the pinned build: the environment names what a command certifies, not what a bundle recorded."""
    from fuzz.repro.bundle import use_recorded_build

    monkeypatch.setenv(builds.PATCHES_ENV, str(tmp_path / "no-such-series"))
    with pytest.raises(Exception, match="no-such-series"):
        builds.resolve("pinned")  # a command would take it (and refuse a series that is not there)
    try:
        use_recorded_build({"spec": "pinned", "patches": None}, tmp_path)
        assert builds.current_identity()["spec"] == "pinned" and not builds.current_identity().get("patches")
    finally:
        builds.activate(builds.resolve("pinned", from_env=False))


def test_resolve_is_memoized_per_process(monkeypatch):
    calls = []
    monkeypatch.setattr(builds, "_resolve", lambda spec, series, backend, coverage, fresh:
                        calls.append((spec, coverage)) or builds.Build(spec, {}))
    monkeypatch.setattr(builds, "_RESOLVED", {})
    a, b = builds.resolve("pypi:0.0.1"), builds.resolve("pypi:0.0.1")
    c, d = builds.resolve("pypi:0.0.1", coverage=True), builds.resolve("pypi:0.0.1", coverage=True)
    assert a is b and c is d and a is not c  # (its coverage build is another build)
    assert calls == [("pypi:0.0.1", False), ("pypi:0.0.1", True)]


def fake_sdist(cache: Path, version: str, text: str) -> Path:
    """A llama-cpp-python sdist's layout, tiny: the vendored tree (one file and llama.h), the bindings, PKG-INFO."""
    import tarfile

    top = cache / "stage" / f"llama_cpp_python-{version}"
    for rel, body in (("vendor/llama.cpp/a.txt", text), ("vendor/llama.cpp/include/llama.h", "// h\n"),
                      ("llama_cpp/__init__.py", "# py\n"), ("PKG-INFO", "Version: x\n")):
        (top / rel).parent.mkdir(parents=True, exist_ok=True)
        (top / rel).write_text(body)
    (cache / "sdist").mkdir(parents=True, exist_ok=True)
    out = cache / "sdist" / f"llama_cpp_python-{version}.tar.gz"
    with tarfile.open(out, "w:gz") as tar:
        tar.add(top, arcname=top.name)
    shutil.rmtree(cache / "stage")
    return out


def test_an_sdist_is_extracted_once_and_checked_at_every_use(tmp_path, monkeypatch):
    """The cached extraction is used as long as its files are the ones extracted; an edited file (the tree's or the
    bindings') is extracted again, and another archive under the same version is a tree of its own."""
    monkeypatch.setenv("FAMILY_CERTIFY_CACHE", str(tmp_path))
    fake_sdist(tmp_path, "9.9.9", "A")
    src, py, digest = builds.sdist_tree("9.9.9")
    assert (src / "a.txt").read_text() == "A" and (py / "__init__.py").is_file() and digest == builds.tree_hash(src)
    assert src.is_relative_to(tmp_path / "builds") and src.parents[2].name.startswith("work-sdist-9.9.9-")
    record = src.parents[2] / "digests.json"
    stamp = record.stat().st_mtime_ns
    assert builds.sdist_tree("9.9.9") == (src, py, digest) and record.stat().st_mtime_ns == stamp  # not again
    for edited in (src / "a.txt", py / "__init__.py"):
        edited.write_text("edited")
        assert builds.sdist_tree("9.9.9") == (src, py, digest)  # extracted again: the sdist's bytes back
        assert (src / "a.txt").read_text() == "A" and (py / "__init__.py").read_text() == "# py\n"
    record.unlink()  # half there (a process that died extracting): extracted again, not an endless retry
    assert builds.sdist_tree("9.9.9") == (src, py, digest) and record.is_file()
    fake_sdist(tmp_path, "9.9.9", "B")
    other, _, other_digest = builds.sdist_tree("9.9.9")
    assert other != src and (other / "a.txt").read_text() == "B" and other_digest != digest


def test_the_wheel_holds_the_libraries_the_bindings_load_whichever_targets_were_built(tmp_path):
    """make demo compiles llama.cpp's libraries only, llama-server comes later from the same build: the wheel's lib/
    is ggml and libllama either way (the common, mtmd and server libraries the full build adds stay out), and the
    build's command line names its three parts."""
    import sys

    from targets.cmake_build import WHEEL_LIBS, copy_bindings

    out, bindings = tmp_path / "bin", tmp_path / "llama_cpp"
    out.mkdir()
    (bindings / "lib").mkdir(parents=True)
    (bindings / "llama_cpp.py").write_text("")
    for lib in ("libllama.so", "libllama.so.0", "libggml.so", "libggml-cpu.so", "libggml-base.so", "libmtmd.so",
                "libllama-common.so", "libllama-server-impl.so"):
        (out / lib).write_bytes(b"")
    copy_bindings(bindings, out, tmp_path / "pkg", leave=(), libs=WHEEL_LIBS)
    assert sorted(p.name for p in (tmp_path / "pkg" / "lib").iterdir()) == [
        "libggml-base.so", "libggml-cpu.so", "libggml.so", "libllama.so", "libllama.so.0"]
    r = subprocess.run([sys.executable, "-m", "targets.cmake_build", "everything", "x", "y"], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "pinned|library|server SDIST CACHE" in r.stderr


def test_a_truncated_sdist_is_refused_in_one_line(tmp_path, monkeypatch):
    """A cached sdist cut short (a download that died) is bad input, named with its fix, wherever it is read: the
    pinned build (exit 2, one line), a candidate's extraction (UserError) and make bootstrap (before anything is
    installed or built, or the venv made)."""
    import sys

    from synth.errors import UserError

    monkeypatch.setenv("FAMILY_CERTIFY_CACHE", str(tmp_path))
    good = fake_sdist(tmp_path, "9.9.9", "A").read_bytes()
    cut = tmp_path / "sdist" / "llama_cpp_python-9.9.9.tar.gz"
    cut.write_bytes(good[: len(good) // 2])
    fix = "not a readable llama-cpp-python sdist"
    r = subprocess.run([sys.executable, "-m", "targets.cmake_build", "pinned", str(cut), str(tmp_path)], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert fix in one_line_exit_2(r) and "delete it" in r.stderr
    with pytest.raises(UserError, match=fix):
        builds.sdist_tree("9.9.9")
    assert not list((tmp_path / "builds").glob("*.tmp")), "the half extraction is left behind"
    pinned = tmp_path / "sdist" / f"llama_cpp_python-{builds.PINNED}.tar.gz"
    pinned.write_bytes(good[: len(good) // 2])
    repo = tmp_path / "repo"  # a checkout without a venv: bootstrap stops before it makes one
    shutil.copytree(ROOT / "scripts", repo / "scripts")
    shutil.copytree(ROOT / "targets", repo / "targets", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "constraints.txt", repo)
    shutil.copy(ROOT / "pyproject.toml", repo)
    r = subprocess.run(["bash", "scripts/bootstrap.sh"], cwd=repo, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "FAMILY_CERTIFY_CACHE": str(tmp_path), "PYTHON": sys.executable})
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1] == (
        f"bootstrap: error: {pinned} is not a readable sdist (a partial download?): delete it and run make "
        "bootstrap again"), r.stderr
    assert not (repo / ".venv").exists()


def test_a_build_whose_cache_entry_is_gone_is_not_activated_nor_resolved_from_memory(tmp_path, monkeypatch):
    """A mutant's cache entry is removed once it ran: a process that resolved it before (a forked CLI) must build it
    again, and activating the stale build must not leave workers on the venv's libllama."""
    gone = builds.Build("pinned", {"key": "0123456789abcdef"}, tmp_path / "gone" / "py", tmp_path / "gone" / "bin")
    with pytest.raises(builds.UserError, match="is gone from the cache"):
        builds.activate(gone)
    memo = ("pinned", str(tmp_path), "cpu", False)
    monkeypatch.setitem(builds._RESOLVED, memo, gone)
    calls = []
    monkeypatch.setattr(builds, "_resolve", lambda *a: calls.append(a) or "built again")
    assert builds.resolve("pinned", tmp_path, from_env=False) == "built again" and len(calls) == 1
