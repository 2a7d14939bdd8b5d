import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from synth.make import resolve, write_fixture
from synth.spec import Knobs
from targets import open_target

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


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


def run_cli(prog: str, *args: str, cwd=None) -> subprocess.CompletedProcess:
    exe = BIN / prog
    assert exe.exists() or shutil.which(prog), f"console script {prog} not installed"
    return subprocess.run([str(exe), *args], capture_output=True, text=True, cwd=cwd, timeout=300)
