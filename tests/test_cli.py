"""The console scripts: outputs users read and exit codes (0 ok, 1 finding, 2 bad input — one line)."""

import json

import pytest

from conftest import run_cli


def assert_one_line_error(r, *words):
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    for w in words:
        assert w in lines[0], lines[0]


def test_make_then_inspect_json(tmp_path):
    out = tmp_path / "h.gguf"
    r = run_cli("synth", "make", "hybrid", "--period", "4", "-o", str(out))
    assert r.returncode == 0 and "granitehybrid" in r.stdout
    r = run_cli("synth", "inspect", str(out), "--json")
    info = json.loads(r.stdout)
    assert info["arch"] == "granitehybrid" and info["n_layer"] == 8
    assert [x["kind"][0] for x in info["layers"]] == list("rrrarrra")
    assert [x["n_head_kv"] for x in info["layers"]] == [0, 0, 0, 2, 0, 0, 0, 2]


def test_list_json_names_every_family_and_the_alias():
    data = json.loads(run_cli("synth", "list", "--json").stdout)
    names = {f["family"]: f for f in data["families"]}
    assert {"llama", "qwen2", "qwen3", "mamba", "mamba2", "jamba", "granitehybrid", "lfm2", "falcon-h1",
            "qwen3next", "kimi-linear"} <= set(names)
    assert data["aliases"]["hybrid"] == "granitehybrid"
    assert names["kimi-linear"]["arch"] == "kimi-linear" and "--pattern" in names["jamba"]["knobs"]


@pytest.mark.parametrize("args,words", [
    (["make", "gpt5"], ["unknown family"]),
    (["make", "llama", "--period", "4"], ["llama", "--period"]),
    (["make", "qwen3next", "--pattern", "AXRA"], ["--pattern"]),
    (["make", "llama", "--layers", "many"], ["--layers"]),
    (["make", "jamba", "--kv-heads", "2,x"], ["--kv-heads"]),
    (["inspect", "/nonexistent.gguf"], ["no such file"]),
    (["bogus-command"], ["bogus-command"]),
])
def test_synth_bad_input(tmp_path, args, words):
    assert_one_line_error(run_cli("synth", *args, cwd=tmp_path), *words)


def test_inspect_corrupt_file(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 40)
    assert_one_line_error(run_cli("synth", "inspect", str(bad)), "bad.gguf")


@pytest.mark.llama
def test_fuzz_run_family_name(tmp_path):
    r = run_cli("fuzz", "run", "mamba2", "--tokens", "8", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "arch mamba2" in r.stdout and "greedy 8 tokens" in r.stdout


@pytest.mark.llama
def test_fuzz_run_bad_inputs(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 60)
    assert_one_line_error(run_cli("fuzz", "run", str(bad)), "bad.gguf")
    assert_one_line_error(run_cli("fuzz", "run", "mamba", "--target", "cmd:/no/such/binary"), "cannot start")
    assert_one_line_error(run_cli("fuzz", "run", "mamba", "--prompt", "a,b"), "--prompt")


@pytest.mark.parametrize("prog,args", [
    ("synth", ["list", "--json"]),
    ("synth", ["make", "gpt5"]),
    ("fuzz", ["run", "no-such.gguf"]),
    ("family-certify", ["check", "no-such.toml"]),
    ("family-certify", ["matrix", "--tier", "1", "--json"]),
])
def test_the_forked_cli_the_tests_use_is_the_installed_script(prog, args, tmp_path):
    """run_cli forks our scripts from the test process; the installed executable prints the same and exits the same."""
    forked = run_cli(prog, *args, cwd=tmp_path if "no-such" in " ".join(args) else None)
    fresh = run_cli(prog, *args, cwd=tmp_path if "no-such" in " ".join(args) else None, fresh=True)
    assert (forked.returncode, forked.stdout, forked.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)
    assert forked.stdout or forked.stderr
