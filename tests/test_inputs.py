"""`fuzz inputs`: atheris drives what the toolkit reads (GGUF files, the manifest, repro bundles, layer packages)
with mutated bytes; every input must be read or refused as a UserError (exit 2, one line). A fixed seed and run
count keep the default suite deterministic; the harness itself is shown to catch a planted bug and to let refusals
pass."""

import pytest

from fuzz.repro.inputs import KINDS, fuzz_inputs

from conftest import run_cli


# A few seconds of each in the quick lane; the nightly inputs job runs each for 10 minutes.
@pytest.mark.parametrize("kind,runs", [("gguf", 3000), ("manifest", 800), ("bundle", 3000), ("package", 2000)])
def test_what_the_toolkit_reads_is_read_or_refused_in_one_line(tmp_path, kind, runs):
    rc, crashes, log = fuzz_inputs(kind, runs=runs, seed=1, out=tmp_path)
    assert rc == 0 and not crashes, log[-3000:]
    assert f"Done {runs} runs" in log


def test_a_planted_bug_is_found_and_its_input_saved(tmp_path):
    rc, crashes, log = fuzz_inputs("tests.helpers:fragile_reader", runs=20000, seed=1, out=tmp_path)
    assert rc != 0 and len(crashes) == 1, log[-2000:]
    assert "KeyError" in log
    data = crashes[0].read_bytes()
    assert data[:4] == b"GGUF" and data[4:8] != (3).to_bytes(4, "little")  # the saved input raises it again


def test_refusals_are_not_findings(tmp_path):
    rc, crashes, _ = fuzz_inputs("tests.helpers:refusing_reader", runs=500, seed=1, out=tmp_path)
    assert rc == 0 and not crashes


def test_cli(tmp_path):
    r = run_cli("fuzz", "inputs", "bundle", "--runs", "300", "--out", str(tmp_path))
    assert r.returncode == 0 and r.stdout.startswith("pass: bundle"), r.stdout + r.stderr
    bad = run_cli("fuzz", "inputs", "elf")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
    assert set(KINDS) == {"gguf", "manifest", "bundle", "package"}
