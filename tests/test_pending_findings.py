"""corpora/pending: upstream defects localized and fixed here that no lane finds yet as an oracle's bundle. Each has
its README, a standalone reproducer beside its model, and a fix series; the reproducer shows the defect on the pinned
build (exit 1) and its absence with the fix (exit 0), run as a maintainer runs it."""

import subprocess
import sys
from pathlib import Path

import pytest
from test_upstream_reports import bare_path

from conftest import ROOT

PENDING = ROOT / "corpora" / "pending"
NAMES = sorted(p.name for p in PENDING.iterdir() if p.is_dir())


def run(name: str, tmp_path: Path, bindings: Path | None = None) -> subprocess.CompletedProcess:
    """`python3 -S repro.py` in its directory with nothing but llama-cpp-python (a build's bindings first)."""
    path = [str(bindings)] if bindings else []
    return subprocess.run([sys.executable, "-S", str(PENDING / name / "repro.py")], capture_output=True, text=True,
                          cwd=PENDING / name, timeout=120,
                          env={"PYTHONPATH": ":".join([*path, str(bare_path(tmp_path))]), "PATH": "/usr/bin:/bin"})


def test_each_pending_finding_has_its_account_reproducer_model_and_fix():
    assert NAMES == ["backend-sampling-stale-allocation"]
    for name in NAMES:
        assert {p.name for p in (PENDING / name).iterdir()} == {"README.md", "repro.py", "model.gguf", "fix"}, name
        assert [p.suffix for p in (PENDING / name / "fix").iterdir()] == [".patch"], name
        text = (PENDING / name / "repro.py").read_text()
        assert not any(x in text for x in ("/root/", "/tmp/", "family-certify/builds")), name


@pytest.mark.llama
@pytest.mark.parametrize("name", NAMES)
def test_each_pending_reproducer_shows_the_defect_on_the_pinned_build(name, tmp_path):
    r = run(name, tmp_path)
    assert r.returncode == 1 and r.stdout.startswith("DEFECT: llama_decode died of signal 6: ") and \
        "GGML_ASSERT(i1 >= 0 && i1 < ne1)" in r.stdout, (r.returncode, r.stdout, r.stderr[-2000:])


@pytest.mark.slow
@pytest.mark.llama
@pytest.mark.parametrize("name", NAMES)
def test_each_pending_reproducer_passes_with_its_fix(name, tmp_path):
    """The pinned build with the finding's fix series (an incremental build, cached): the reproducer exits 0."""
    from targets.builds import resolve

    build = resolve("pinned", str(PENDING / name / "fix"), from_env=False)
    r = run(name, tmp_path, build.bindings)
    assert r.returncode == 0 and r.stdout.startswith("fixed: "), (r.returncode, r.stdout, r.stderr[-2000:])
