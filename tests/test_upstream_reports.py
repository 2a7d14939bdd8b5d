"""`fuzz report BUNDLE --upstream DIR` and the committed upstream-ready reports (corpora/upstream-reports): each a
finding as a llama.cpp maintainer takes it — issue.md, model.gguf and a reproducer on llama-cpp-python's bare
`llama_cpp` bindings that exits 1 while the defect is present — with nothing of this toolkit needed to run it."""

import filecmp
import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from fuzz.repro.upstream import FIXES, fix_of, plain
from fuzz.repro.upstream_python import NO_ROOM, call_line, memory_script

from conftest import ROOT, run_cli

REPORTS = ROOT / "corpora" / "upstream-reports"
BUNDLES = {p.name: json.loads((p / "bundle.json").read_text()) for p in (ROOT / "corpora" / "repros").iterdir()
           if (p / "bundle.json").is_file()}
# the upstream repros a standalone reproducer is written for: memory findings, llama.cpp's aborts found through the
# library (on a stage sliced from the model too: its model is that stage), llama-server's aborts as it starts and its
# wrong answers and its deaths during requests — not yet: a wrong answer streamed to a client that then disconnects
# (laguna-radix-checkpoint-past-window)
NOT_YET = {"laguna-radix-checkpoint-past-window"}
DIED = {"server-spec-draft-batch-overflow", "lfm2-server-embeddings-completion-crash"}  # during requests
STAGED = {"kimi-linear-handoff-busy-ubatch-3"}  # a context on a stage: its model is the stage's split GGUF pair
REPORTED = sorted(n for n, b in BUNDLES.items() if n not in NOT_YET and (
    (b["target"] == "llama-cpp" and (b["oracle"] == "memory" or b["fingerprint"]["status"] == "crash"))
    or b["target"] == "llama-server"))
SERVER = [n for n in REPORTED if BUNDLES[n]["target"] == "llama-server"]
SERVER_CRASH = [n for n in SERVER if BUNDLES[n]["fingerprint"]["status"] == "crash"]


def test_each_call_is_one_line_of_llama_cpps_api():
    assert call_line("ctx", "load", {"n_ctx": 1024, "n_seq_max": 4, "n_rs_seq": 4}, "rows") == (
        "ctx = new_context(model, n_ctx=1024, n_batch=64, n_ubatch=64, n_seq_max=4, n_rs_seq=4, flash_attn=False, "
        "kv_unified=True)")  # (the worker's defaults; several sequences: one unified cache unless asked)
    assert call_line("ctx", "decode", {"tokens": [5, 6], "pos": [0, 0], "seq": [0, [1, 2]], "logits": "last"},
                     "rows") == "rows = decode(ctx, tokens=[5, 6], pos=[0, 0], seqs=[[0], [1, 2]], outputs=[0, 1])"
    assert call_line("ref", "decode", {"tokens": [7], "pos": [3], "seq": 0, "logits": [True]}, "ref_rows") == \
        "ref_rows = decode(ref, tokens=[7], pos=[3], seqs=[[0]], outputs=[1])"
    assert call_line("ctx", "seq_div", {"seq": 0, "p0": 2, "p1": -1, "d": 3}, "rows") == \
        "L.llama_memory_seq_div(L.llama_get_memory(ctx), 0, 2, -1, 3)"
    assert call_line("ctx", "seq_cp", {"src": 0, "dst": 1}, "rows") == \
        "L.llama_memory_seq_cp(L.llama_get_memory(ctx), 0, 1, -1, -1)"
    assert call_line("ctx", "state_get", {"seq": 2}, "rows") == "blob = export_seq(ctx, 2)"
    assert call_line("ctx", "state_set", {"seq": 1, "data": b"x"}, "rows") == "import_seq(ctx, 1, blob)"


def test_a_call_no_reproducer_writes_yet_is_refused_by_name():
    from synth.errors import UserError

    with pytest.raises(UserError, match="a state_get call .*via.*context-file.*no standalone reproducer writes it yet"):
        call_line("ctx", "state_get", {"seq": 0, "via": "context-file", "tokens": [1]}, "rows")
    with pytest.raises(UserError, match="fed embeddings"):
        call_line("ctx", "decode", {"embd": "AAAA", "pos": [0]}, "rows")


def test_a_context_on_a_stage_takes_the_stage_as_the_reports_model(fixtures):
    """A worker that died creating a context on a stage the run sliced (its temporary file named by its layers) has
    that stage sliced again as the report's model — a split pair where the stage shares the globals; any other file
    is refused by name."""
    from fuzz.repro.upstream import stage_of_file
    from synth.errors import UserError

    path = fixtures("llama", layers=4)
    got = stage_of_file(path, "/tmp/fuzz-stages-x/fixture.L001-004.gguf")
    assert got["stage"] == [1, 4] and list(got["files"]) == ["model.gguf"]
    assert got["files"]["model.gguf"][:4] == b"GGUF"
    assert got == stage_of_file(path, "/tmp/elsewhere/fixture.L001-004.gguf")  # (sliced again: the same bytes)
    with pytest.raises(UserError, match="a context on another file than the model"):
        stage_of_file(path, "/tmp/a/other.gguf")


def test_a_state_file_and_a_refused_import_are_calls_of_their_own():
    """A sequence's state through a file (llama_state_seq_save_file / load_file), and an import the program meant
    llama.cpp to refuse (a state cut short: the first bytes of the last export, its length as the call logged it)."""
    from fuzz.repro.upstream_python import REFUSED, helpers

    steps = [("state_get", {"seq": 0, "via": "file", "tokens": [5, 6]}), ("state_set", {"seq": 2, "via": "file"}),
             ("state_get", {"seq": 0}), ("state_set", {"seq": 1, "data": "AAAAAA==", REFUSED: True}),
             ("state_set", {"seq": 1, "data": "AAAAAA=="})]
    assert [call_line("ctx", op, req, "rows") for op, req in steps] == [
        "state_file = save_seq_file(ctx, 0, tokens=[5, 6])", "load_seq_file(ctx, 2, state_file)",
        "blob = export_seq(ctx, 0)", "refused_import(ctx, 1, blob, size=4)", "import_seq(ctx, 1, blob)"]
    text = "\n".join(helpers(steps))
    assert "def save_seq_file(" in text and "def load_seq_file(" in text and "def refused_import(" in text
    assert helpers(steps[2:3]) == []  # (a script without them is unchanged)
    from synth.errors import UserError

    with pytest.raises(UserError, match="no standalone reproducer writes it yet"):  # (a refused blob not logged inline)
        call_line("ctx", "state_set", {"seq": 1, "path": "/tmp/blob", REFUSED: True}, "rows")


def test_the_script_checks_what_the_finding_failed_and_compiles():
    steps = [("load", {"n_seq_max": 2, "kv_unified": False}), ("decode", {"tokens": [1], "pos": [0], "seq": 0}),
             ("seq_keep", {"seq": 1})]
    pos = memory_script({"steps": steps, "problem": {"check": "pos", "seq": 0, "got": [0, 0], "want": [-1, -1]},
                         "reference": [], "tol": 0.1, "commit": "abc"}, {"fingerprint": {"ops": ["keep"]}})
    compile(pos, "repro.py", "exec")
    assert "if got[1] != -1 or not -1 <= got[0] <= -1:" in pos and "sys.exit(1)" in pos
    assert "import fuzz" not in pos and "from fuzz" not in pos and "synth" not in pos and "targets" not in pos
    logits = memory_script({"steps": steps, "problem": {"check": "logits", "seq": 0, "max_abs_dlogit": 0.5},
                            "reference": steps[:2], "tol": 0.25, "commit": "abc"}, {"fingerprint": {}})
    compile(logits, "repro.py", "exec")
    assert "ref = new_context(model, " in logits and "if d > 0.25:" in logits
    assert "def refused_for_room" not in logits  # (a helper only where a decode was refused for room)


def test_a_decode_refused_for_room_is_expected_refused_by_the_reproducer():
    """A decode the memory refused for room, as it must, is recorded so: the reproducer asks llama_decode for it and
    requires 1 (nothing decoded), with its helper beside the prelude."""
    refused = {"tokens": [1, 2, 3], "pos": [250, 251, 252], "seq": 0, "logits": "last", NO_ROOM: True}
    assert call_line("ctx", "decode", refused, "rows") == \
        "refused_for_room(ctx, tokens=[1, 2, 3], pos=[250, 251, 252], seqs=[[0], [0], [0]])"
    steps = [("load", {"n_seq_max": 3}), ("decode", {"tokens": [1], "pos": [0], "seq": 0}), ("decode", refused)]
    script = memory_script({"steps": steps, "problem": {"check": "pos", "seq": 0, "got": [0, 2], "want": [0, 0]},
                            "reference": [], "tol": 0.1, "commit": "abc"}, {"fingerprint": {"ops": ["decode"]}})
    compile(script, "repro.py", "exec")
    assert "def refused_for_room(ctx, tokens, pos, seqs):" in script and "if rc != 1:" in script


def test_an_abort_is_named_by_the_check_llama_cpp_printed_from_the_trees_root():
    from fuzz.repro.upstream import aborted

    check = "ggml/src/ggml.c:2072: GGML_ASSERT(ggml_can_repeat(b, a)) failed"
    assert aborted(f"crash during 'load': /root/.cache/family-certify/builds/work-pypi-0.3.36/src/{check}") == check
    assert aborted("/tmp/pip-req-build-x/vendor/llama.cpp/src/llama-context.cpp:9: GGML_ASSERT(x) failed") == \
        "src/llama-context.cpp:9: GGML_ASSERT(x) failed"


def test_the_explanation_loses_the_toolkits_own_words():
    assert plain("Decode first and it passes (the settle control). Found by `fuzz memory` on its own; no upstream "
                 "report found.") == "Decode first and it passes."
    # (to the sentence's end, not to the period of "llama.cpp" inside it)
    assert plain("It aborts.\n\nFound by the memory lane; no upstream report found (ggml-org/llama.cpp#5652 is the "
                 "same shape). Then more.") == "It aborts. Then more."


def test_a_finding_of_another_oracle_is_refused_before_anything_runs(tmp_path):
    bundle = ROOT / "corpora/repros/qwen4exp-isolation-qsa-cell-position"  # (llama.cpp through the library)
    r = run_cli("fuzz", "report", str(bundle), "--upstream", str(tmp_path / "o"))
    assert r.returncode == 2, r.stdout + r.stderr
    assert "an isolation finding" in r.stderr and "memory findings, llama.cpp's aborts and llama-server's" in r.stderr
    assert len(r.stderr.splitlines()) == 1
    assert not (tmp_path / "o").exists()


def test_every_reportable_upstream_repro_has_its_committed_report_with_its_fix():
    assert (len(REPORTED), len(SERVER), len(SERVER_CRASH)) == (47, 8, 6)
    assert sorted(p.name for p in REPORTS.iterdir()) == REPORTED
    for name in REPORTED:
        fix = fix_of(name)
        want = {"issue.md", *models(name), "repro.sh" if name in SERVER else "repro.py"} | ({"fix"} if fix else set())
        assert {p.name for p in (REPORTS / name).iterdir()} == want, name
        for f in ("issue.md", "repro.sh" if name in SERVER else "repro.py"):  # nothing of the machine it was made on
            text = (REPORTS / name / f).read_text()
            assert not any(x in text for x in ("/root/", "/tmp/", "/home/", "family-certify/builds")), (name, f)
        if fix:
            assert sorted(p.name for p in (REPORTS / name / "fix").iterdir()) == \
                sorted(p.name for p in fix.glob("*.patch"))
            assert "## A fix" in (REPORTS / name / "issue.md").read_text()


def test_every_fix_is_in_the_series_of_all_fixes_and_names_real_repros():
    """corpora/fixes/all is every fix's patches, byte for byte, in the order fixes.toml lists them (a queue a user
    carries), a patch once: a fix written on top of another carries a copy of that one's patches first; each fix has a
    README and fixes repros that exist."""
    table = tomllib.loads((FIXES / "fixes.toml").read_text())
    queue: list[Path] = []
    for p in (p for name in table for p in sorted((FIXES / name).glob("*.patch"))):
        if all(p.read_bytes() != q.read_bytes() for q in queue):
            queue.append(p)
    assert len(queue) == 16  # (two fixes carry a copy of another's patch: 18 patches in their series)
    everything = sorted((FIXES / "all").glob("*.patch"))
    assert [p.read_bytes() for p in everything] == [p.read_bytes() for p in queue]
    assert [p.name[5:] for p in everything] == [p.name[5:] for p in queue]  # (renumbered in the queue)
    for name, entry in table.items():
        assert (FIXES / name / "README.md").is_file(), name
        assert entry["repros"] and all((ROOT / "corpora/repros" / r / "bundle.json").is_file() for r in entry["repros"])


def bare_path(tmp_path: Path) -> Path:
    """A directory holding llama-cpp-python and only the packages it requires (its METADATA): what
    `pip install llama-cpp-python` gives a fresh environment. This toolkit's packages are not there."""
    import sysconfig

    # (the environment's site-packages, where pip put it: not wherever `llama_cpp` was imported from in this process,
    # which a test loading a build's own bindings moves)
    site = Path(sysconfig.get_paths()["purelib"])
    out = tmp_path / "bare"
    out.mkdir(parents=True, exist_ok=True)
    for name in ("llama_cpp", "numpy", "numpy.libs", "typing_extensions.py", "diskcache", "jinja2", "markupsafe"):
        if (site / name).exists() and not (out / name).exists():
            (out / name).symlink_to(site / name)
    return out


@pytest.mark.llama
@pytest.mark.server
@pytest.mark.parametrize("name", SERVER)
def test_each_server_reproducer_shows_the_defect_with_the_pinned_llama_server(name, tmp_path):
    """repro.sh as a maintainer runs it: sh, curl and the llama-server built from the pinned tree, nothing else —
    an abort as it starts, or the last request answered otherwise than the same prompt with nothing cached."""
    from targets.llama_server_worker import server_binary

    r = run_server_reproducer(name, tmp_path, server_binary())
    if name in DIED:  # (the requests of the round it died in, side by side)
        assert r.returncode == 1 and r.stdout.startswith("DEFECT: llama-server was killed by signal ") and \
            r.stdout.rstrip().endswith("during the requests"), (r.returncode, r.stdout, r.stderr)
    elif name in SERVER_CRASH:
        assert r.returncode == 1 and r.stdout.startswith("DEFECT: llama-server was killed by signal 6"), \
            (r.returncode, r.stdout, r.stderr)
        assert "GGML_ASSERT" in r.stdout
    else:
        assert r.returncode == 1 and r.stdout.startswith("DEFECT: the last request is answered ["), \
            (r.returncode, r.stdout, r.stderr)


@pytest.mark.llama
@pytest.mark.parametrize("name", [n for n in REPORTED if n not in SERVER])
def test_each_reproducer_shows_the_defect_on_the_pinned_build_without_this_toolkit(name, tmp_path):
    """Run as a maintainer runs it: `python3 repro.py` beside its model, with nothing but llama-cpp-python built from
    the pinned tree (python -S: no site-packages, no editable install of this project)."""
    r = run_reproducer(name, tmp_path)
    assert r.returncode == 1 and r.stdout.startswith("DEFECT: "), (r.returncode, r.stdout, r.stderr[-2000:])


@pytest.mark.llama
def test_the_committed_reports_are_what_the_bundles_give_now(tmp_path):
    """Each report written again from its bundle is byte for byte the committed one (seeded, deterministic)."""
    for name in REPORTED:
        r = run_cli("fuzz", "report", str(ROOT / "corpora/repros" / name), "--upstream", str(tmp_path / name))
        assert r.returncode == 0, r.stdout + r.stderr
        files = sorted(str(p.relative_to(REPORTS / name)) for p in (REPORTS / name).rglob("*") if p.is_file())
        assert files == sorted(str(p.relative_to(tmp_path / name)) for p in (tmp_path / name).rglob("*")
                               if p.is_file()), name
        for f in files:
            assert filecmp.cmp(tmp_path / name / f, REPORTS / name / f, shallow=False), (name, f)


def models(name: str) -> tuple[str, ...]:
    """A report's model files: model.gguf, or a stage's split pair."""
    return ("model-00001-of-00002.gguf", "model-00002-of-00002.gguf") if name in STAGED else ("model.gguf",)


def placed(name: str, reproducer: str, tmp_path: Path) -> Path:
    """A copy of a report's reproducer and model alone in a directory, as a maintainer downloads them."""
    work = tmp_path / name
    work.mkdir(parents=True)
    for f in (reproducer, *models(name)):
        (work / f).write_bytes((REPORTS / name / f).read_bytes())
    return work


def run_server_reproducer(name: str, tmp_path: Path, server: Path | None) -> subprocess.CompletedProcess:
    """`sh repro.sh` beside its model, with sh, curl and this llama-server, nothing else."""
    from targets.llama_server_worker import free_port

    work = placed(name, "repro.sh", tmp_path)
    return subprocess.run(["sh", str(work / "repro.sh")], capture_output=True, text=True, cwd=work, timeout=120,
                          env={"LLAMA_SERVER": str(server), "PATH": "/usr/bin:/bin", "PORT": str(free_port())})


def run_reproducer(name: str, tmp_path: Path, bindings: Path | None = None) -> subprocess.CompletedProcess:
    """`python3 repro.py` beside its model, with nothing but llama-cpp-python (the venv's, or a build's bindings
    first on the path) and what it requires: python -S, no site-packages, no editable install of this project."""
    work = placed(name, "repro.py", tmp_path)
    path = [str(bindings)] if bindings else []
    return subprocess.run([sys.executable, "-S", str(work / "repro.py")], capture_output=True, text=True, cwd=work,
                          env={"PYTHONPATH": ":".join([*path, str(bare_path(tmp_path))]), "PATH": "/usr/bin:/bin"},
                          timeout=120)


@pytest.mark.slow
@pytest.mark.llama
def test_with_every_fix_the_fixed_reproducers_exit_0_and_the_rest_1(tmp_path):
    """The pinned build with corpora/fixes/all (an incremental build on the pinned tree, cached): each report whose
    repro a fix names exits 0 — the defect gone — and every other still exits 1; a server reproducer with a fix runs
    against that build's llama-server."""
    from targets.builds import resolve

    build = resolve("pinned", str(FIXES / "all"), from_env=False)
    library = [n for n in REPORTED if n not in SERVER]
    got = {name: run_reproducer(name, tmp_path / "runs", build.bindings) for name in library}
    fixed = {r for entry in tomllib.loads((FIXES / "fixes.toml").read_text()).values() for r in entry["repros"]}
    assert {n: r.returncode for n, r in got.items()} == {n: 0 if n in fixed else 1 for n in library}, \
        {n: (r.stdout, r.stderr[-500:]) for n, r in got.items() if r.returncode not in (0, 1)}
    assert all(r.stdout.startswith("fixed: ") for n, r in got.items() if n in fixed)
    served = [n for n in SERVER if n in fixed]
    assert served == ["server-embeddings-mean-pooling-parallel"]
    for name in served:
        r = run_server_reproducer(name, tmp_path / "served", build.server)
        assert r.returncode == 0 and r.stdout.startswith("fixed: "), (r.returncode, r.stdout, r.stderr)
