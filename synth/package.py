"""Layer packages (skippy's "layer-package" v1): a model split into one GGUF per layer plus shared files, and
stages materialized back from them — byte-identical to `synth slice` of the same model and range.

CLI:

    synth package MODEL.gguf PKG/ [--model-id ID] [--json]      # write the package
    synth materialize PKG/ --layers A:B [-o stage.gguf] [--json] # a stage from the package (= synth slice)
    synth slice MODEL.gguf --layers A:B [-o stage.gguf] [--json] # the same stage from the model itself

Layout (paths relative to PKG/; every file is a GGUF written by gguf-py through synth.gguf_io.write_gguf):

    model-package.json        the manifest, written last (its presence marks a complete package)
    shared/metadata.gguf      every metadata key of the model, tokenizer included, verbatim; plus the non-block
                              tensors that are neither embeddings nor output (rope_freqs, position_embd,
                              token_embd_norm, altup_*, ...) — none for most families
    shared/embeddings.gguf    token_embd.weight, per_layer_token_embd.weight
    shared/output.gguf        output_norm.{weight,bias}, output.{weight,bias}
    layers/layer-NNNNN.gguf   the tensors of block NNNNN (5-digit index), in source order

Tensor names: layer files keep the model's own global names (layers/layer-00017.gguf holds blk.17.*), they are not
renumbered to blk.0. That is what skippy does: its v1 `write-package` cut each layer file with the same slice writer
it used for stages (layer range [i, i+1)); its runtime selects a stage's tensors by the index parsed from `blk.N.`;
and its `validate-package` requires every tensor name in a package artifact to exist in the full model and every
layer tensor to be owned exactly once — renumbered files fail both. Global names also make a misplaced file
detectable: materialization checks that layer-NNNNN.gguf holds only blk.NNNNN.* tensors. The stage writer renumbers
(blk.j for the stage's j-th layer), exactly as for `synth slice`.

Tensor roles follow skippy's name classifier (token_embd / per_layer_token_embd: embeddings; output / output_norm:
output; any other non-block tensor: metadata). skippy's v1 writer copied metadata-role tensors into every artifact;
we store each tensor exactly once, metadata-role ones in shared/metadata.gguf.

Manifest (JSON, sorted keys, no timestamps: the same model gives the same bytes in every file, anywhere):
schema_version 1, format "layer-package", model_id (default: the model file's stem), source_model {path (file name
only), sha256, bytes, arch}, layer_count, activation_width (n_embd), shared {metadata, embeddings, output} and
layers[] with path, tensor_count, tensor_bytes (sum of the tensors' stored sizes), artifact_bytes (file size) and
sha256 (plus layer_index for layers). One addition: global_tensors, the non-block tensor names in source order, so a
materialized stage lists them in the order `synth slice` does. skippy's v1 manifest also carried
skippy_abi_version and created_at_unix_secs; we have no skippy ABI and write no timestamps.

Materialization verifies the sha256 of every file it reads — the shared files and every layer file, because the
stage plan classifies every layer by its tensors (hybrid pads copy a donor layer from outside the range) — and
assembles the stage with synth.stage.write_stage, the one implementation `synth slice` uses too.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

from synth.errors import UserError
from synth.gguf_io import KV, GGUFFile, TensorInfo, read_all, write_gguf
from synth.inspect import inspect_gguf
from synth.stage import SourceModel, StageInfo, Tensors, split_tensors, write_stage

MANIFEST = "model-package.json"
SCHEMA_VERSION = 1
FORMAT = "layer-package"
SHARED = ("metadata", "embeddings", "output")
SHARED_PATHS = {role: f"shared/{role}.gguf" for role in SHARED}
EMBEDDING_TENSORS = frozenset({"token_embd.weight", "per_layer_token_embd.weight"})
OUTPUT_TENSORS = frozenset({"output.weight", "output.bias", "output_norm.weight", "output_norm.bias"})
ARTIFACT_FIELDS = ("path", "tensor_count", "tensor_bytes", "artifact_bytes", "sha256")

_LAYER_FILE = re.compile(r"^layer-\d{5}\.gguf$")
_SHA = re.compile(r"^[0-9a-f]{64}$")


def layer_path(i: int) -> str:
    return f"layers/layer-{i:05d}.gguf"


def shared_role(name: str) -> str:
    """Which shared file holds a non-block tensor (skippy's role classifier, by name)."""
    if name in EMBEDDING_TENSORS:
        return "embeddings"
    if name in OUTPUT_TENSORS:
        return "output"
    return "metadata"


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _rebuild(pkg: Path, man: Any = None) -> str:
    src = man.get("source_model") if isinstance(man, dict) else None
    model = src.get("path") if isinstance(src, dict) and isinstance(src.get("path"), str) else "MODEL"
    return f"re-run `synth package {model} {pkg}` to rebuild the package"


# ---- writing --------------------------------------------------------------------------------------------
def write_package(model: str | os.PathLike, out_dir: str | os.PathLike, model_id: str | None = None) -> dict[str, Any]:
    """Split the GGUF `model` into a layer package in out_dir; returns the manifest (also written to out_dir)."""
    model, out = Path(model), Path(out_dir)
    if model_id is not None and not model_id.strip():
        raise UserError("--model-id is empty; pass an identifier such as org/repo:Q4_K_M, or omit it")
    if out.exists() and not out.is_dir():
        raise UserError(f"{out}: exists and is not a directory; pass a directory for the package")
    src = SourceModel(model)
    arch, n = src.g.arch, src.info.n_layer
    if n < 1:
        raise UserError(f"{model}: block_count is {n}; a model without layers has nothing to package")
    stray = sorted(set(src.by_layer) - set(range(n)))
    if stray:
        raise UserError(f"{model}: has tensors of block(s) {stray} beyond block_count {n}; a package of its "
                        f"{n} layers would lose them")
    (out / MANIFEST).unlink(missing_ok=True)  # written last: an interrupted run leaves no manifest behind

    groups: dict[str, Tensors] = {role: [] for role in SHARED}
    for name, arr in src.globals:
        groups[shared_role(name)].append((name, arr))
    shared = {role: _write_artifact(out, SHARED_PATHS[role], arch, src.kv if role == "metadata" else {},
                                    groups[role]) for role in SHARED}
    layers = []
    for i in range(n):
        tensors = [(f"blk.{i}.{rest}", arr) for rest, arr in src.by_layer.get(i, [])]
        layers.append({"layer_index": i, **_write_artifact(out, layer_path(i), arch, {}, tensors)})
    keep = {Path(layer_path(i)).name for i in range(n)}
    for stale in sorted((out / "layers").iterdir()):  # layer files of a bigger model packaged here before
        if _LAYER_FILE.match(stale.name) and stale.name not in keep:
            stale.unlink()

    manifest = {
        "schema_version": SCHEMA_VERSION,
        "format": FORMAT,
        "model_id": model_id or model.stem,
        "source_model": {"path": model.name, "sha256": sha256_file(model), "bytes": model.stat().st_size,
                         "arch": arch},
        "layer_count": n,
        "activation_width": src.info.n_embd,
        "shared": shared,
        "layers": layers,
        "global_tensors": [name for name, _ in src.globals],
    }
    _write_text(out / MANIFEST, json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return manifest


def _write_artifact(out: Path, rel: str, arch: str, kv: dict[str, KV], tensors: Tensors) -> dict[str, Any]:
    path = out / rel
    size = write_gguf(path, arch, kv, tensors)
    written = GGUFFile(path).tensors  # what the file holds, not what we meant to write
    return {"path": rel, "tensor_count": len(written), "tensor_bytes": sum(t.n_bytes for t in written.values()),
            "artifact_bytes": size, "sha256": sha256_file(path)}


def _write_text(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# ---- reading --------------------------------------------------------------------------------------------
def read_manifest(package_dir: str | os.PathLike) -> dict[str, Any]:
    """The package's manifest, checked for shape (not yet against the files: materialize_stage does that)."""
    pkg = Path(package_dir)
    if not pkg.is_dir():
        raise UserError(f"{pkg}: no such package directory; create one with `synth package MODEL {pkg}`")
    path = pkg / MANIFEST
    fix = _rebuild(pkg)
    if not path.is_file():
        raise UserError(f"{path}: missing, so {pkg} is not a complete layer package; {fix}")
    try:
        man = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"{path}: not valid JSON ({e}); {fix}") from None
    if not isinstance(man, dict):
        raise UserError(f"{path}: not a JSON object; {fix}")
    fix = _rebuild(pkg, man)
    if man.get("schema_version") != SCHEMA_VERSION or man.get("format") != FORMAT:
        raise UserError(f"{path}: format {man.get('format')!r} schema_version {man.get('schema_version')!r}, but "
                        f"this tool reads format {FORMAT!r} schema_version {SCHEMA_VERSION}; {fix}")

    def bad(what: str) -> UserError:
        return UserError(f"{path}: {what}; {fix}")

    n = man.get("layer_count")
    if not _is_int(n) or n < 1:
        raise bad(f"layer_count is {n!r}, not a positive integer")
    if not isinstance(man.get("model_id"), str):
        raise bad("model_id is missing")
    shared = man.get("shared")
    if not isinstance(shared, dict):
        raise bad("shared is missing")
    for role in SHARED:
        _check_artifact(shared.get(role), f"shared.{role}", bad)
    layers = man.get("layers")
    if not isinstance(layers, list):
        raise bad("layers is missing")
    seen: set[int] = set()
    for k, entry in enumerate(layers):
        _check_artifact(entry, f"layers[{k}]", bad)
        i = entry.get("layer_index")
        if not _is_int(i) or not 0 <= i < n:
            raise bad(f"layers[{k}].layer_index is {i!r}, not in 0..{n - 1}")
        if i in seen:
            raise bad(f"layer {i} is listed twice in layers[]")
        seen.add(i)
    missing = sorted(set(range(n)) - seen)
    if missing:
        raise bad(f"layer {missing[0]} is missing from layers[] (layer_count {n})")
    names = man.get("global_tensors")
    if not isinstance(names, list) or not all(isinstance(x, str) for x in names) or len(set(names)) != len(names):
        raise bad("global_tensors is not a list of distinct tensor names")
    return man


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _check_artifact(entry: Any, where: str, bad) -> None:
    if not isinstance(entry, dict) or any(f not in entry for f in ARTIFACT_FIELDS):
        raise bad(f"{where} is malformed (needs {', '.join(ARTIFACT_FIELDS)})")
    rel = entry["path"]
    if not isinstance(rel, str) or not rel or Path(rel).is_absolute() or ".." in Path(rel).parts:
        raise bad(f"{where}.path {rel!r} is not a path inside the package")
    if not isinstance(entry["sha256"], str) or not _SHA.match(entry["sha256"]):
        raise bad(f"{where}.sha256 is not a sha256 hex digest")


def _verified(pkg: Path, entry: dict[str, Any], fix: str) -> Path:
    path = pkg / entry["path"]
    if not path.is_file():
        raise UserError(f"{path}: missing (model-package.json lists it); {fix}")
    got = sha256_file(path)
    if got != entry["sha256"]:
        raise UserError(f"{path}: sha256 {got[:16]}... does not match model-package.json ({entry['sha256'][:16]}...), "
                        f"the file changed after packaging; {fix}")
    return path


def materialize_stage(package_dir: str | os.PathLike, a: int, b: int, dst: str | os.PathLike) -> StageInfo:
    """Write the stage [a, b) assembled from a layer package to dst: the same bytes as `synth slice` of the
    packaged model. Raises UserError for a broken package, Unsupported for a stage llama.cpp cannot express."""
    pkg = Path(package_dir)
    man = read_manifest(pkg)
    fix = _rebuild(pkg, man)
    meta, kv, _ = read_all(_verified(pkg, man["shared"]["metadata"], fix))
    n = man["layer_count"]
    if meta.get("block_count") != n:
        raise UserError(f"{meta.path}: block_count {meta.get('block_count')!r}, but model-package.json says "
                        f"layer_count {n}; {fix}")

    found: dict[str, Any] = {}
    infos: dict[str, TensorInfo] = {}
    for role in SHARED:
        path = _verified(pkg, man["shared"][role], fix)
        g, _, tensors = read_all(path)
        for name, arr in tensors:
            if shared_role(name) != role or name.startswith("blk.") or name in found:
                raise UserError(f"{path}: holds {name}, which does not belong in shared/{role}.gguf; {fix}")
            found[name], infos[name] = arr, g.tensors[name]
    order = man["global_tensors"]
    if set(order) != set(found):
        raise UserError(f"{pkg}: the shared files hold {sorted(found)}, but model-package.json lists global_tensors "
                        f"{sorted(order)}; {fix}")
    globals_ = [(name, found[name]) for name in order]

    infos = {name: infos[name] for name in order}  # source order, as in the model
    layer_files: dict[int, Path] = {}
    for entry in sorted(man["layers"], key=lambda e: e["layer_index"]):
        i = entry["layer_index"]
        path = _verified(pkg, entry, fix)
        g = GGUFFile(path)
        stray = [t for t in g.tensors if not t.startswith(f"blk.{i}.")]
        if stray:
            raise UserError(f"{path}: holds {stray[0]}, not a tensor of layer {i}; {fix}")
        layer_files[i] = path
        infos.update(g.tensors)

    def layer_tensors(i: int) -> Tensors:
        return split_tensors(read_all(layer_files[i])[2])[1].get(i, [])

    # the model as stage planning sees it: the packaged metadata, every tensor's name, the package as its path
    model = copy.copy(meta)
    model.path, model.tensors = pkg, infos
    return write_stage(model, inspect_gguf(model), kv, globals_, layer_tensors, dst, a, b)
