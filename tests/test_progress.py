"""Progress: a rich bar on a terminal, plain ANSI-free lines anywhere else (CI logs), one bar at a time."""

import io
import shutil
import subprocess

import pytest

from fuzz.engine.progress import Progress

from conftest import BIN


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_plain_lines_when_not_a_terminal(monkeypatch):
    monkeypatch.delenv("FAMILY_CERTIFY_PROGRESS", raising=False)
    out = io.StringIO()
    with Progress(2, "lanes", stream=out) as p:
        p.working("jamba handoff")  # nothing for a log: only the result lines
        p.advance()
        p.line("jamba  handoff  PASS")
    assert not p.rich and out.getvalue() == "jamba  handoff  PASS\n"


def test_a_bar_on_a_terminal_and_none_inside_it(monkeypatch):
    monkeypatch.delenv("FAMILY_CERTIFY_PROGRESS", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    out = Tty()
    with Progress(1, "lanes", stream=out) as outer:
        with Progress(5, "cut sets", stream=out) as inner:  # an oracle's, inside the battery: silent
            inner.advance()
        outer.line("jamba  handoff  PASS")
    assert outer.rich and not inner.rich
    assert "jamba  handoff  PASS" in out.getvalue() and "\x1b[" in out.getvalue()
    monkeypatch.setenv("FAMILY_CERTIFY_PROGRESS", "plain")
    assert not Progress(1, "lanes", stream=Tty()).rich


@pytest.mark.llama
def test_the_battery_draws_a_bar_in_a_terminal(monkeypatch):
    if shutil.which("script") is None:
        pytest.skip("skipped: no `script` (util-linux) to run family-certify under a pseudo-terminal")
    monkeypatch.delenv("FAMILY_CERTIFY_PROGRESS", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    r = subprocess.run(["script", "-qc", f"{BIN / 'family-certify'} run jamba --lane load --lane parity", "/dev/null"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "lanes" in r.stdout and "\x1b[" in r.stdout  # the bar: "2/2 lanes" and its escape codes
    assert "jamba            tier 1  parity          PASS" in r.stdout


@pytest.mark.llama
def test_fuzz_inputs_draws_a_bar_in_a_terminal_and_plain_lines_in_a_log(monkeypatch, tmp_path):
    if shutil.which("script") is None:
        pytest.skip("skipped: no `script` (util-linux) to run fuzz inputs under a pseudo-terminal")
    monkeypatch.delenv("FAMILY_CERTIFY_PROGRESS", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    cmd = f"{BIN / 'fuzz'} inputs manifest --runs 2000 --out {tmp_path}"
    r = subprocess.run(["script", "-qc", cmd, "/dev/null"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "inputs" in r.stdout and "\x1b[" in r.stdout and "pass: manifest: Done 2000 runs" in r.stdout
    plain = subprocess.run(cmd.split(), capture_output=True, text=True, timeout=120)
    assert plain.returncode == 0 and "\x1b[" not in plain.stdout
    assert plain.stdout.startswith("pass: manifest: Done 2000 runs")
