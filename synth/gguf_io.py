"""Writing and reading GGUF files: the one place that touches gguf-py's writer and reader."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from synth.errors import UserError

VT = gguf.GGUFValueType


@dataclass(frozen=True)
class Raw:
    """A tensor kept as the bytes of its GGML type (quantized or BF16): rows × bytes per row, as gguf-py
    reads and writes them. Slices, packages and pads pass it through without decoding it."""

    data: np.ndarray  # uint8, shape (..., bytes per row)
    qtype: gguf.GGMLQuantizationType

    def zeros(self) -> Raw:
        """The same tensor with every byte 0: every block's scale is 0 (MXFP4: 2^-127 times code 0), so every
        weight is exactly 0, as np.zeros_like gives for float tensors."""
        return Raw(np.zeros_like(self.data), self.qtype)


Tensor = np.ndarray | Raw


def zeros_like(t: Tensor) -> Tensor:
    return t.zeros() if isinstance(t, Raw) else np.zeros_like(t)


@dataclass(frozen=True)
class KV:
    value: Any
    type: gguf.GGUFValueType
    sub_type: gguf.GGUFValueType | None = None


def write_gguf(path: str | os.PathLike, arch: str, kv: dict[str, KV], tensors: list[tuple[str, Tensor]]) -> int:
    """Write a GGUF atomically (temp file + rename, so a failure never leaves a partial file).

    kv must not contain general.architecture (the writer adds it first). Returns the file size.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        w = gguf.GGUFWriter(tmp, arch)
        for key, v in kv.items():
            w.add_key_value(key, v.value, v.type, v.sub_type)
        for name, arr in tensors:
            if isinstance(arr, Raw):
                w.add_tensor(name, arr.data, raw_dtype=arr.qtype)
            else:
                w.add_tensor(name, arr, raw_dtype=_raw_dtype(arr))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        _write_tensors(w)
        w.close()
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path.stat().st_size


def _write_tensors(w: gguf.GGUFWriter) -> None:
    """GGUFWriter.write_tensors_to_file's bytes, with one buffered write per tensor instead of a flush, a
    tofile and two tell()s (a 12-layer fixture has ~100 tensors and the sweep writes dozens of stages)."""
    w.write_ti_data_to_file()
    (fout,) = w.fout
    (tensors,) = w.tensors
    offset = fout.tell()
    pad = w.ggml_pad(offset, w.data_alignment) - offset
    chunks = [bytes(pad)]
    for ti in tensors.values():
        data = ti.tensor.tobytes()
        assert len(data) == ti.nbytes
        chunks += [data, bytes(w.ggml_pad(ti.nbytes, w.data_alignment) - ti.nbytes)]
        ti.tensor = None
    fout.write(b"".join(chunks))


def _raw_dtype(arr: np.ndarray) -> gguf.GGMLQuantizationType | None:
    if arr.dtype == np.float32:
        return gguf.GGMLQuantizationType.F32
    if arr.dtype == np.float16:
        return gguf.GGMLQuantizationType.F16
    return None


@dataclass(frozen=True)
class TensorInfo:
    name: str
    ne: tuple[int, ...]  # ggml order, innermost first
    type: str  # e.g. "F32", "Q4_K"
    n_bytes: int


class GGUFFile:
    """A read-only view of a GGUF file: metadata values (decoded) and tensor infos."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        if not self.path.is_file():
            raise UserError(f"{self.path}: no such file; pass the path of a .gguf file")
        try:
            self.reader = gguf.GGUFReader(self.path, "r")
        except Exception as e:  # gguf-py raises ValueError/struct.error/IndexError on corrupt input
            raise UserError(f"{self.path}: not a readable GGUF file ({type(e).__name__}: {e}); "
                            "regenerate it or check the download") from None
        self.kv: dict[str, Any] = {}
        self.kv_types: dict[str, tuple[gguf.GGUFValueType, gguf.GGUFValueType | None]] = {}
        for f in self.reader.fields.values():
            if f.name.startswith("GGUF."):
                continue
            self.kv[f.name] = _field_value(f)
            sub = f.types[-1] if f.types and f.types[0] == VT.ARRAY and len(f.types) > 1 else None
            self.kv_types[f.name] = (f.types[0], sub) if f.types else (VT.UINT32, None)
        self.tensors: dict[str, TensorInfo] = {
            t.name: TensorInfo(t.name, tuple(int(x) for x in t.shape), t.tensor_type.name, int(t.n_bytes))
            for t in self.reader.tensors
        }
        self.arch: str = str(self.kv.get("general.architecture", ""))
        if not self.arch:
            raise UserError(f"{self.path}: GGUF has no general.architecture; not a model file")

    def get(self, key: str, default: Any = None) -> Any:
        """Value of '{arch}.<key>' (or of a full key containing a dot prefix like 'tokenizer.')."""
        full = key if key.startswith(("general.", "tokenizer.")) or key.startswith(self.arch + ".") \
            else f"{self.arch}.{key}"
        return self.kv.get(full, default)

    def tensor_data(self, name: str) -> np.ndarray:
        for t in self.reader.tensors:
            if t.name == name:
                return np.array(t.data)
        raise KeyError(name)

    def kv_entry(self, key: str) -> KV:
        vtype, sub = self.kv_types[key]
        return KV(self.kv[key], vtype, sub)


def _field_value(f: Any) -> Any:
    if not f.types:
        return None
    t0 = f.types[0]
    if t0 == VT.STRING:
        return bytes(f.parts[f.data[0]]).decode("utf-8", errors="replace")
    if t0 == VT.ARRAY:
        sub = f.types[-1]
        if sub == VT.STRING:
            return [bytes(f.parts[i]).decode("utf-8", errors="replace") for i in f.data]
        return [_scalar(f.parts[i], sub) for i in f.data]
    return _scalar(f.parts[f.data[0]], t0)


def _scalar(part: Any, t: gguf.GGUFValueType) -> Any:
    v = part[0]
    if t == VT.BOOL:
        return bool(v)
    if t in (VT.FLOAT32, VT.FLOAT64):
        return float(v)
    return int(v)


def read_all(src: str | os.PathLike | GGUFFile) -> tuple[GGUFFile, dict[str, KV], list[tuple[str, Tensor]]]:
    """Everything in a GGUF (a path, or a file already opened) as writable pieces: metadata (minus
    general.architecture) and tensors.

    F32/F16 tensors come back as numpy arrays in numpy order (reversed ggml ne); any other type as Raw (its
    bytes, rows × bytes per row), written back unchanged.
    """
    g = src if isinstance(src, GGUFFile) else GGUFFile(src)
    kv = {k: g.kv_entry(k) for k in g.kv if k != "general.architecture"}
    tensors = []
    for t in g.reader.tensors:
        data = np.array(t.data)
        tensors.append((t.name, data.reshape(tuple(reversed([int(x) for x in t.shape])))
                        if t.tensor_type.name in ("F32", "F16") else Raw(data, t.tensor_type)))
    return g, kv, tensors


def token_embeddings(src: str | os.PathLike | GGUFFile) -> np.ndarray:
    """The token embedding table as float32 (n_vocab × n_embd), dequantized if needed."""
    g = src if isinstance(src, GGUFFile) else GGUFFile(src)
    for t in g.reader.tensors:
        if t.name == "token_embd.weight":
            if t.tensor_type.name in ("F32", "F16", "BF16"):
                data = np.array(t.data, dtype=np.float32) if t.tensor_type.name != "BF16" else \
                    gguf.quants.dequantize(t.data, t.tensor_type)
            else:
                data = gguf.quants.dequantize(t.data, t.tensor_type)
            return np.asarray(data, dtype=np.float32).reshape(int(t.shape[1]), int(t.shape[0]))
    raise UserError(f"{g.path}: no token_embd.weight tensor; cannot build embedding input")
