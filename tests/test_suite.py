"""The default suite itself: `make test` spreads it over every core, and what a marker keeps out is said at the end
of a run, whether one process ran it or several (pytest-xdist workers collect; the controller reports)."""

import re
import subprocess
import sys

import pytest

from conftest import ROOT


def test_make_test_runs_the_suite_on_every_core():
    make = (ROOT / "Makefile").read_text()
    recipe = make[make.index("\ntest: "):].split("\n\n")[0]
    assert re.search(r"-m pytest -q -n \$\(TEST_JOBS\) --dist worksteal", recipe), recipe
    assert "TEST_JOBS ?= auto" in make


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["one-process", "two-workers"])
def test_what_a_marker_kept_out_is_said_at_the_end(workers):
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *workers,
                        "tests/test_scan.py", "-k", "every_row_every"], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 5, r.stdout + r.stderr  # (nothing selected ran: the one test matching -k is marked scan)
    assert "skipped: 1 test marked scan did not run here: it runs in the nightly scan job" in r.stdout, r.stdout
    assert "(test_every_row_every_oracle_every_cut)" in r.stdout and "marked slow" not in r.stdout, r.stdout
