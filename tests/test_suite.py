"""The default suite itself: `make test` spreads it over every core, and what a marker keeps out is said at the end
of a run, whether one process ran it or several (pytest-xdist workers collect; the controller reports)."""

import itertools
import re
import subprocess
import sys

import pytest

from targets import open_target
from targets.worker_protocol import NO_LLAMA

from conftest import ROOT


def recipe(make: str, target: str) -> str:
    return make[make.index(f"\n{target}: "):].split("\n\n")[0]


def test_make_test_runs_the_quick_lane_then_the_rest_on_every_core():
    """`make test` is `make test-quick` (no llama.cpp process) and then every other default test: the two marker
    expressions split the default suite, each test in exactly one of them, both on every core."""
    make = (ROOT / "Makefile").read_text()
    assert re.search(r"PYTEST := \$\(PY\) -m pytest -q -n \$\(TEST_JOBS\) --dist worksteal", make)
    assert "TEST_JOBS ?= auto" in make
    quick, test = recipe(make, "test-quick"), recipe(make, "test")
    assert test.startswith("\ntest: test-quick") and quick.startswith("\ntest-quick: bootstrap")
    assert 'FAMILY_CERTIFY_NO_LLAMA=1 $(PYTEST) -m "$(QUICK)"' in quick
    quick_expr = re.search(r"^QUICK := (.+)$", make, re.M).group(1)
    rest_expr = re.search(r'\$\(PYTEST\)(?: --durations=\d+)? -m "(.+)"', test).group(1)
    for marks in itertools.product((False, True), repeat=4):
        names = dict(zip(("llama", "server", "slow", "scan"), marks, strict=True))
        default = not names["slow"] and not names["scan"]
        assert eval(quick_expr, {}, names) + eval(rest_expr, {}, names) == default, names


def test_the_suite_keeps_its_rewritten_test_modules():
    """Bytecode writing is on in the test process and the programs it starts whatever PYTHONDONTWRITEBYTECODE says
    (tests/conftest.py), so pytest keeps each test module's and plugin's rewritten bytecode for the next worker and
    lane instead of rewriting every one of them."""
    assert sys.dont_write_bytecode is False
    r = subprocess.run([sys.executable, "-c", "import sys; print(sys.dont_write_bytecode)"], capture_output=True,
                       text=True, timeout=60)
    assert r.stdout.strip() == "False", r.stdout + r.stderr


def test_the_quick_lane_refuses_to_start_llama_cpp(monkeypatch):
    """With FAMILY_CERTIFY_NO_LLAMA set (make test-quick) a llama.cpp or llama-server worker exits before it loads
    anything, naming the lane and the marker: a test that needs llama.cpp fails there instead of running."""
    monkeypatch.setenv(NO_LLAMA, "1")
    for spec in ("llama-cpp", "llama-server"):
        with open_target(spec, timeout=30) as t:
            r = t.hello()
        assert not r.ok and "llama.cpp refused: FAMILY_CERTIFY_NO_LLAMA is set" in r.failure.message, (spec, r)


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["one-process", "two-workers"])
def test_what_a_marker_kept_out_is_said_at_the_end(workers):
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *workers,
                        "tests/test_scan.py", "-k", "every_row_every"], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 5, r.stdout + r.stderr  # (nothing selected ran: the one test matching -k is marked scan)
    assert "skipped: 1 test marked scan did not run here: it runs in the nightly scan job" in r.stdout, r.stdout
    assert "(test_every_row_every_oracle_every_cut)" in r.stdout and "marked slow" not in r.stdout, r.stdout


def test_the_workflow_jobs_tests_are_ordered_first():
    """The tests that execute workflow jobs (marked `early` by `executes`) come first, the rest after them in their
    order, so one worker runs them one after another with one clone and one venv (tests/conftest.py)."""
    import test_dtype
    import test_workflows

    from conftest import pytest_collection_modifyitems

    class Item:  # what the hook reads of a collected test: its marks
        def __init__(self, fn):
            self.fn = fn

        def get_closest_marker(self, name):
            return next((m for m in getattr(self.fn, "pytestmark", []) if m.name == name), None)

    def tests(module):
        return [Item(f) for name, f in vars(module).items() if name.startswith("test_")]

    jobs = [i for i in tests(test_workflows) if i.get_closest_marker("server")]
    checks = [i for i in tests(test_workflows) if not i.get_closest_marker("server")]
    dtype = tests(test_dtype)
    assert len(jobs) >= 10 and len(checks) >= 5 and dtype
    items = dtype + checks + jobs
    pytest_collection_modifyitems(items)
    assert items == jobs + dtype + checks
