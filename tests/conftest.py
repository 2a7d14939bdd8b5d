import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import settings

from synth.make import resolve, write_fixture
from synth.spec import Knobs
from targets import open_target, share_cores

# the suite on several cores at once (pytest-xdist): llama.cpp's threads in our workers wait passively, as when the
# battery runs rows side by side (targets.worker_env says why)
if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
    share_cores()

# pytest keeps each test module's (and each pytest plugin's) assertion-rewritten bytecode unless bytecode writing is
# off (PYTHONDONTWRITEBYTECODE): then every pytest process, each xdist worker of each lane, rewrites every one of
# them again, and the programs the tests start recompile what they import that is not compiled yet. The suite and
# every process it starts write bytecode whatever the environment says (xdist's workers start after this).
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent

# Property tests draw the same examples on every run (`ci`, the default), so a clean clone passes or fails
# the same way each time. `HYPOTHESIS_PROFILE=explore` draws fresh random examples on each run, to hunt for
# new failures; put a case it finds into the test as an @example before fixing it.
settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("explore", derandomize=False, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# what a marker keeps out of the default suite, and where it runs instead (said at the end of every run)
ELSEWHERE = {"slow": "`make test-slow`; the nightly fuzz-lane job", "scan": "the nightly scan job (`pytest -m scan`)"}
_deselected: dict[str, list[str]] = {}  # node id → the ELSEWHERE markers it carries


def pytest_collection_modifyitems(items):
    """Tests marked `early` first (each part in collection order). pytest-xdist's worksteal gives each worker a
    contiguous share of the list and an idle worker steals from the end of another's, so in the whole suite the early
    tests run one after another in one worker: the workflow jobs' tests make their module's clone and its venv once,
    not once per worker (loadgroup would say this with xdist_group, but does not group under pytest 9)."""
    items[:] = [i for i in items if i.get_closest_marker("early")] + \
        [i for i in items if not i.get_closest_marker("early")]


def pytest_deselected(items):
    _deselected.update({i.nodeid: [m for m in ELSEWHERE if i.get_closest_marker(m)] for i in items})


def pytest_sessionfinish(session):
    if hasattr(session.config, "workeroutput"):  # a pytest-xdist worker: it collected, the controller reports
        session.config.workeroutput["deselected"] = _deselected


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):  # (pytest-xdist, in the controller: every worker deselects the same items)
    _deselected.update(getattr(node, "workeroutput", {}).get("deselected", {}))


def pytest_terminal_summary(terminalreporter):
    markexpr = terminalreporter.config.getoption("markexpr") or ""
    for mark, where in ELSEWHERE.items():
        if f"not {mark}" not in markexpr:  # (this run selected them: any left out were left out by -k)
            continue
        names = [n for n, marks in _deselected.items() if mark in marks]
        if names:
            shown = ", ".join(n.split("::")[-1] for n in names[:3]) + (", ..." if len(names) > 3 else "")
            many = len(names) > 1
            terminalreporter.write_line(f"skipped: {len(names)} test{'s' * many} marked {mark} did not run here: "
                                        f"{'they run' if many else 'it runs'} in {where} ({shown})",
                                        yellow=True, bold=True)


@pytest.fixture(scope="session", autouse=True)
def worker_temporary_files(tmp_path_factory):
    """Workers the tests start make their temporary directories under pytest's own temporary tree (which pytest
    prunes), not in /tmp: a skippy case that fails on purpose keeps its logs by design, and a worker a test kills
    leaves its llama-server slot directory — run after run they piled up in /tmp (about 20 per suite)."""
    d = tmp_path_factory.mktemp("worker-tmp")
    old = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = str(d)
    yield d
    if old is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = old


@pytest.fixture(scope="session")
def llama():
    """One llama.cpp worker shared by the session (the client restarts it after any crash)."""
    with open_target("llama-cpp", timeout=120) as t:
        hello = t.hello()
        assert hello.ok, hello.failure
        assert hello.data["pinned"], f"llama-cpp-python is {hello.data['llama_cpp_python']}, not the pin"
        yield t


@pytest.fixture(scope="session")
def fixtures(tmp_path_factory):
    """make(family, **knobs) -> path of a fixture file, cached per (family, knobs)."""
    root = tmp_path_factory.mktemp("fixtures")
    cache: dict = {}

    def make(family: str, **knobs) -> Path:
        key = (family, tuple(sorted(knobs.items())))
        if key not in cache:
            spec = resolve(family, Knobs(**knobs))
            path = root / f"{family}-{len(cache)}.gguf"
            write_fixture(spec, path)
            cache[key] = path
        return cache[key]

    return make


# our console scripts → their entry points (pyproject.toml [project.scripts])
ENTRY_POINTS = {"synth": "synth.cli:main", "fuzz": "fuzz.cli:main", "family-certify": "fuzz.certify.commands:main"}


def run_cli(prog: str, *args: str, cwd=None, timeout: float = 300, fresh: bool = False) -> subprocess.CompletedProcess:
    """Run a console script as a user would and return what it printed and its exit code.

    Our own scripts run in a child forked from this test process (their modules already imported: a CLI's start is
    most of a bad-input test's time); the child has its own cwd, argv, stdin (/dev/null), stdout and stderr, and
    ends with the code the script returns, so what is asserted is what the installed script does.
    `fresh=True` (or any other program) starts the installed executable instead; tests/test_cli.py holds both to
    the same output."""
    exe = BIN / prog
    assert exe.exists() or shutil.which(prog), f"console script {prog} not installed"
    if fresh or prog not in ENTRY_POINTS:
        return subprocess.run([str(exe), *args], capture_output=True, text=True, cwd=cwd, timeout=timeout)
    return _forked(prog, list(args), cwd, timeout)


def _forked(prog: str, args: list[str], cwd, timeout: float) -> subprocess.CompletedProcess:
    import importlib
    import signal
    import tempfile
    import time

    module, name = ENTRY_POINTS[prog].split(":")
    main = getattr(importlib.import_module(module), name)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        pid = os.fork()
        if pid == 0:  # the child: never returns into pytest
            code = 1
            try:
                null = os.open(os.devnull, os.O_RDONLY)
                os.dup2(null, 0)
                os.dup2(out.fileno(), 1)
                os.dup2(err.fileno(), 2)
                sys.stdin = open(0, closefd=False)
                sys.stdout = open(1, "w", closefd=False)
                sys.stderr = open(2, "w", closefd=False)
                sys.argv = [str(BIN / prog), *args]
                if cwd is not None:
                    os.chdir(cwd)
                import targets.target as target
                target._idle.clear()  # the parent's idle workers are the parent's
                try:
                    code = main()
                except SystemExit as e:
                    code = e.code
                except BaseException:
                    import traceback
                    traceback.print_exc()
                    code = 1
                if isinstance(code, str):
                    print(code, file=sys.stderr)
                    code = 1
                code = int(code or 0)
                target.close_idle()  # what the script's atexit does
            finally:
                for f in (sys.stdout, sys.stderr):
                    try:
                        f.flush()
                    except BaseException:
                        pass
                os._exit(code)
        deadline = time.monotonic() + timeout
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                raise subprocess.TimeoutExpired([prog, *args], timeout)
            time.sleep(0.005)
        code = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess([str(BIN / prog), *args], code, out.read().decode(errors="replace"),
                                           err.read().decode(errors="replace"))
