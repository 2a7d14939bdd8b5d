"""Layer packages (skippy layer-package v1): the package holds every tensor of the model exactly once with the right
manifest, a stage materialized from it is byte-identical to `synth slice`, a damaged package is refused in one line,
and the materialized stage computes the full model's layers bit for bit in the real llama.cpp."""

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from synth.gguf_io import GGUFFile, read_all
from synth.inspect import inspect_file
from synth.package import materialize_stage, read_manifest, write_package
from synth.stage import SourceModel, Unsupported

from conftest import run_cli

HYBRIDS = ("jamba", "granitehybrid", "lfm2", "qwen3next", "kimi-linear")
FOUNDATION = [("llama", {"layers": 8}), ("qwen2", {"layers": 8}), ("qwen3", {"layers": 8}),
              ("mamba", {"layers": 8}), ("mamba2", {"layers": 8}), ("falcon-h1", {"layers": 8})] + \
             [(f, k) for f in HYBRIDS for k in ({"layers": 12, "period": 4}, {"layers": 9, "period": 3, "offset": 0})]
IDS = [f"{f}-{'-'.join(map(str, k.values()))}" for f, k in FOUNDATION]


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def ranges(n: int) -> list[tuple[int, int]]:
    """Whole model, prefixes, suffixes and 1-2 layer windows around a few cuts (hybrids: stages needing pads)."""
    out = {(0, n)}
    for c in {1, 2, 3, n // 2, n - 1} & set(range(1, n)):
        out |= {(0, c), (c, n), (c, c + 1), (c - 1, c + 1)} | ({(c, c + 2)} if c + 2 <= n else set())
    return sorted(out)


@pytest.fixture(scope="module")
def packaged(fixtures, tmp_path_factory):
    """package(family, **knobs) -> (model path, package dir), cached."""
    root = tmp_path_factory.mktemp("packages")
    cache: dict = {}

    def package(family: str, **knobs) -> tuple[Path, Path]:
        model = fixtures(family, **knobs)
        if model not in cache:
            out = root / model.stem
            write_package(model, out, None)
            cache[model] = (model, out)
        return cache[model]

    return package


@pytest.mark.parametrize("family,knobs", FOUNDATION, ids=IDS)
def test_materialized_stage_is_byte_identical_to_slice(packaged, tmp_path, family, knobs):
    model, pkg = packaged(family, **knobs)
    src = SourceModel(model)
    padded = 0
    for a, b in ranges(src.info.n_layer):
        sliced, built = tmp_path / f"s{a}-{b}.gguf", tmp_path / f"p{a}-{b}.gguf"
        try:
            want = src.slice(sliced, a, b)
        except Unsupported as e:
            with pytest.raises(Unsupported, match=str(e)):
                materialize_stage(pkg, a, b, built)
            continue
        got = materialize_stage(pkg, a, b, built)
        assert sliced.read_bytes() == built.read_bytes(), f"stage {a}:{b} differs"
        assert (got.layers, got.pads, got.notes) == (want.layers, want.pads, want.notes)
        padded += bool(got.pads)
    if family in HYBRIDS:
        assert padded, "no range of this hybrid needed a pad: the ranges no longer cover padded stages"


def test_manifest_describes_every_file(fixtures, tmp_path):
    model = fixtures("lfm2", layers=12, period=4)  # lfm2 also has a metadata-role tensor (token_embd_norm)
    man = write_package(model, tmp_path / "pkg", "org/lfm2-tiny:F32")
    pkg = tmp_path / "pkg"
    assert json.loads((pkg / "model-package.json").read_text()) == man
    info = inspect_file(str(model))
    assert (man["schema_version"], man["format"], man["model_id"]) == (1, "layer-package", "org/lfm2-tiny:F32")
    assert man["source_model"] == {"path": model.name, "sha256": sha(model), "bytes": model.stat().st_size,
                                   "arch": "lfm2"}
    assert (man["layer_count"], man["activation_width"]) == (12, info.n_embd)
    assert [x["layer_index"] for x in man["layers"]] == list(range(12))
    assert [x["path"] for x in man["layers"]] == [f"layers/layer-{i:05d}.gguf" for i in range(12)]
    assert {k: v["path"] for k, v in man["shared"].items()} == {
        "metadata": "shared/metadata.gguf", "embeddings": "shared/embeddings.gguf", "output": "shared/output.gguf"}

    g, kv, tensors = read_all(model)
    source = dict(tensors)
    held: dict[str, str] = {}
    for entry in [*man["shared"].values(), *man["layers"]]:
        path = pkg / entry["path"]
        f = GGUFFile(path)
        assert entry["sha256"] == sha(path) and entry["artifact_bytes"] == path.stat().st_size
        assert entry["tensor_count"] == len(f.tensors) > 0
        assert entry["tensor_bytes"] == sum(t.n_bytes for t in f.tensors.values())
        for name, arr in read_all(path)[2]:
            assert name not in held, f"{name} in both {held.get(name)} and {entry['path']}"
            held[name] = entry["path"]
            assert np.array_equal(arr, source[name]) and arr.dtype == source[name].dtype
    assert set(held) == set(source)  # every tensor exactly once, under its own (global) name
    assert all(held[f"blk.{i}.attn_norm.weight"] == f"layers/layer-{i:05d}.gguf" for i in range(12))
    assert [held[n] for n in ("token_embd.weight", "output.weight", "token_embd_norm.weight")] == \
        ["shared/embeddings.gguf", "shared/output.gguf", "shared/metadata.gguf"]
    assert man["global_tensors"] == [n for n, _ in tensors if not n.startswith("blk.")]
    meta = read_all(pkg / "shared/metadata.gguf")[1]
    assert meta == kv  # the model's metadata, tokenizer included, verbatim
    assert "tokenizer.ggml.tokens" in meta


def test_package_is_deterministic_and_drops_stale_layers(fixtures, tmp_path):
    model = fixtures("granitehybrid", layers=12, period=4)
    elsewhere = tmp_path / "copy" / model.name
    elsewhere.parent.mkdir()
    shutil.copy(model, elsewhere)
    write_package(model, tmp_path / "a", None)
    write_package(elsewhere, tmp_path / "b", None)

    def tree(root: Path) -> dict[str, bytes]:
        return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}

    assert tree(tmp_path / "a") == tree(tmp_path / "b")
    assert len(tree(tmp_path / "a")) == 1 + 3 + 12
    write_package(fixtures("granitehybrid", layers=8, period=4), tmp_path / "a", None)  # a smaller model, same dir
    assert sorted(p.name for p in (tmp_path / "a" / "layers").iterdir()) == [f"layer-{i:05d}.gguf" for i in range(8)]
    assert read_manifest(tmp_path / "a")["layer_count"] == 8


# ---- the CLI ------------------------------------------------------------------------------------------------
def assert_one_line_error(r, *words):
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    for w in words:
        assert w in lines[0], lines[0]


def test_cli_slice_package_materialize(fixtures, tmp_path):
    model = fixtures("jamba", layers=9, period=3, offset=0)
    r = run_cli("synth", "slice", str(model), "--layers", "1:3", "-o", str(tmp_path / "s.gguf"), "--json")
    assert r.returncode == 0, r.stderr
    sliced = json.loads(r.stdout)
    real = [src for j, src in enumerate(sliced["layers"]) if j not in sliced["pads"]]
    assert (sliced["first"], sliced["last"], real) == (1, 3, [1, 2])
    assert sliced["pads"] and sliced["notes"]  # R R: an attention pad
    assert sliced["sha256"] == sha(tmp_path / "s.gguf") and sliced["bytes"] == (tmp_path / "s.gguf").stat().st_size

    r = run_cli("synth", "package", str(model), str(tmp_path / "pkg"), "--model-id", "t/jamba")
    assert r.returncode == 0 and "model-package.json" in r.stdout and "9 layer files" in r.stdout, r.stderr
    r = run_cli("synth", "materialize", str(tmp_path / "pkg"), "--layers", "1:3", "-o", str(tmp_path / "m.gguf"))
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.strip().splitlines()) == 1 and f"pads at stage layers {sliced['pads']}" in r.stdout
    assert (tmp_path / "m.gguf").read_bytes() == (tmp_path / "s.gguf").read_bytes()

    r = run_cli("synth", "slice", str(model), "--layers", "4:", cwd=tmp_path)  # default output name
    assert r.returncode == 0 and (tmp_path / f"{model.stem}.L004-009.gguf").is_file(), r.stderr


def test_cli_refuses_bad_ranges_and_unsupported_stages(fixtures, tmp_path):
    model = fixtures("qwen3", layers=4)
    for args in (["slice", str(model), "--layers", "3:9"], ["slice", str(model), "--layers", "x"],
                 ["slice", str(model)]):
        assert_one_line_error(run_cli("synth", *args, "-o", str(tmp_path / "s.gguf")), "--layers")
    write_package(model, tmp_path / "pkg", None)
    assert_one_line_error(run_cli("synth", "materialize", str(tmp_path / "pkg"), "--layers", "2:2",
                                  "-o", str(tmp_path / "m.gguf")), "--layers", "4 layers")
    bloom = fixtures("bloom", layers=4)  # an input LayerNorm: a stage not starting at 0 cannot take the residual
    assert_one_line_error(run_cli("synth", "slice", str(bloom), "--layers", "2:4", "-o", str(tmp_path / "b.gguf")),
                          "2:4", "token_embd_norm")
    assert not (tmp_path / "b.gguf").exists()


def broken(pkg: Path, how: str) -> str:
    """Damage a package; returns a word the error must name."""
    man_path = pkg / "model-package.json"
    man = json.loads(man_path.read_text())
    if how == "corrupt-layer":
        p = pkg / "layers/layer-00002.gguf"
        data = bytearray(p.read_bytes())
        data[-5] ^= 0xFF  # a weight, not the header: still a valid GGUF
        p.write_bytes(bytes(data))
        return "layer-00002.gguf"
    if how == "corrupt-shared":
        p = pkg / "shared/output.gguf"
        data = bytearray(p.read_bytes())
        data[len(data) // 2] ^= 0x01
        p.write_bytes(bytes(data))
        return "output.gguf"
    if how == "missing-file":
        (pkg / "layers/layer-00001.gguf").unlink()
        return "layer-00001.gguf"
    if how == "missing-manifest":
        man_path.unlink()
        return "model-package.json"
    if how == "bad-json":
        man_path.write_text(man_path.read_text()[:-20])
        return "not valid JSON"
    if how == "schema-version":
        man["schema_version"], word = 2, "schema_version"
    elif how == "layer-missing":
        del man["layers"][3]
        word = "layer 3"
    elif how == "bad-path":
        man["layers"][0]["path"] = word = "../../etc/passwd"
    else:  # swapped-layer: valid files, hashes and all, under the wrong indices
        man["layers"][0], man["layers"][1] = ({**man["layers"][1], "layer_index": 0},
                                              {**man["layers"][0], "layer_index": 1})
        word = "layer 0"
    man_path.write_text(json.dumps(man))
    return word


DAMAGE = ["corrupt-layer", "corrupt-shared", "missing-file", "missing-manifest", "bad-json", "schema-version",
          "layer-missing", "bad-path", "swapped-layer"]


@pytest.mark.parametrize("how", DAMAGE)
def test_damaged_package_exits_2_in_one_line(fixtures, tmp_path, how):
    pkg = tmp_path / "pkg"
    write_package(fixtures("granitehybrid", layers=8, period=4), pkg, None)
    word = broken(pkg, how)
    out = tmp_path / "stage.gguf"
    r = run_cli("synth", "materialize", str(pkg), "--layers", "0:4", "-o", str(out))
    assert_one_line_error(r, word, "synth package")
    assert not out.exists()


def test_damage_is_caught_in_process_too(fixtures, tmp_path):
    """The same checks without the CLI: materialize_stage raises UserError, never writes a stage."""
    from synth.errors import UserError

    pkg = tmp_path / "pkg"
    write_package(fixtures("qwen3next", layers=8, period=4), pkg, None)
    materialize_stage(pkg, 4, 8, tmp_path / "ok.gguf")
    broken(pkg, "corrupt-layer")  # layer 2: outside 4:8, but the plan reads every layer's tensor names
    with pytest.raises(UserError, match="layer-00002.gguf.*sha256"):
        materialize_stage(pkg, 4, 8, tmp_path / "bad.gguf")
    assert not (tmp_path / "bad.gguf").exists()


# ---- the real llama.cpp -------------------------------------------------------------------------------------
TOKENS = [3, 9, 27, 5, 1, 40, 7, 12]


@pytest.mark.llama
@pytest.mark.parametrize("family,knobs,a,b", [
    ("jamba", {"layers": 9, "period": 3, "offset": 0}, 7, 9),  # final stage R R: needs an attention pad
    ("jamba", {"layers": 9, "period": 3, "offset": 0}, 1, 3),  # middle stage R R: pad, boundary residual
    ("lfm2", {"layers": 12, "period": 4}, 5, 12),
    ("qwen3", {"layers": 8}, 3, 8),
], ids=["jamba-final-padded", "jamba-middle-padded", "lfm2-final", "qwen3-final"])
def test_materialized_stage_computes_the_full_models_layers(llama, packaged, tmp_path, family, knobs, a, b):
    model, pkg = packaged(family, **knobs)
    n = inspect_file(str(model)).n_layer
    stage = tmp_path / "stage.gguf"
    st = materialize_stage(pkg, a, b, stage)
    final = b == n

    assert llama.load(str(model)).ok
    full = llama.decode(TOKENS, logits="all", capture=[a - 1, a, b - 1])
    assert full.ok, full.failure
    residual, wrong = full.data["captures"][a - 1], full.data["captures"][a]  # wrong: one layer further

    def run(rows: np.ndarray):
        assert llama.load(str(stage)).ok
        llama.reset()
        r = llama.decode(embd=rows, logits="all", capture=[] if final else [st.n_layer - 1])
        assert r.ok, r.failure
        return r.data["logits"] if final else r.data["captures"][st.n_layer - 1]

    want = full.data["logits"] if final else full.data["captures"][b - 1]
    got = run(residual)
    assert got.shape == want.shape and np.array_equal(got, want), f"max |Δ| {np.max(np.abs(got - want))}"
    assert not np.array_equal(run(wrong), want)  # the comparison is sensitive: one layer off shows
