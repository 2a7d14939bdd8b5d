"""Writing and reading GGUF files: the one place that touches gguf-py's writer and reader."""

from __future__ import annotations

import math
import mmap
import os
import struct
import tempfile
from dataclasses import dataclass, field
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


BIG = 1 << 20  # tensors from this size on are written from their own buffer, not copied into a joined one


def _write_tensors(w: gguf.GGUFWriter) -> None:
    """GGUFWriter.write_tensors_to_file's bytes: small tensors joined into one buffered write (a 12-layer fixture
    has ~100 tensors and the sweep writes dozens of stages), large ones written from their own memory (a real-size
    embedding is 100+ MB: no copies)."""
    w.write_ti_data_to_file()
    (fout,) = w.fout
    (tensors,) = w.tensors
    offset = fout.tell()
    pending = [bytes(w.ggml_pad(offset, w.data_alignment) - offset)]

    def flush() -> None:
        fout.write(b"".join(pending))
        pending.clear()

    for ti in tensors.values():
        pad = bytes(w.ggml_pad(ti.nbytes, w.data_alignment) - ti.nbytes)
        if ti.nbytes >= BIG:
            flush()
            data = memoryview(np.ascontiguousarray(ti.tensor)).cast("B")
            assert data.nbytes == ti.nbytes
            fout.write(data)
            pending.append(pad)
        else:
            data = ti.tensor.tobytes()
            assert len(data) == ti.nbytes
            pending += [data, pad]
        ti.tensor = None
    flush()


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


_SCALAR = {VT.UINT8: "B", VT.INT8: "b", VT.UINT16: "H", VT.INT16: "h", VT.UINT32: "I", VT.INT32: "i",
           VT.FLOAT32: "f", VT.BOOL: "B", VT.UINT64: "Q", VT.INT64: "q", VT.FLOAT64: "d"}  # struct codes
_NUMPY = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I8": np.int8, "I16": np.int16, "I32": np.int32,
          "I64": np.int64}


@dataclass
class ReaderTensor:
    name: str
    shape: tuple[int, ...]  # ggml ne, innermost first
    tensor_type: gguf.GGMLQuantizationType
    n_bytes: int
    offset: int  # in the file
    _mm: Any = field(repr=False, default=None)

    @property
    def data(self) -> np.ndarray:
        """As gguf-py's reader gives it: numpy order; quantized/BF16 types as uint8 rows of bytes."""
        name = self.tensor_type.name
        dims = tuple(reversed(self.shape))
        if name in _NUMPY:
            return np.frombuffer(self._mm, dtype=_NUMPY[name], count=self.n_bytes // np.dtype(_NUMPY[name]).itemsize,
                                 offset=self.offset).reshape(dims)
        block, size = gguf.GGML_QUANT_SIZES[self.tensor_type]
        return np.frombuffer(self._mm, dtype=np.uint8, count=self.n_bytes, offset=self.offset) \
            .reshape((*dims[:-1], dims[-1] // block * size))


class _Reader:
    """GGUF v2/v3 header, metadata and tensor infos, parsed straight from the bytes (gguf-py's reader builds a numpy
    view per field: 10+ ms per small file, paid by every worker and oracle that opens one). Tensor data stays in
    the memory map until asked for."""

    def __init__(self, path: Path):
        with open(path, "rb") as f:
            self.mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if path.stat().st_size else b""
        buf, self.pos = self.mm, 0
        if bytes(buf[:4]) != b"GGUF":
            raise ValueError("no GGUF magic")
        version, n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
        if version not in (2, 3):
            raise ValueError(f"GGUF version {version}")
        self.pos = 24
        self.fields: list[tuple[str, VT, VT | None, Any]] = []
        for _ in range(n_kv):
            key = self._str()
            vtype = VT(self._u32())
            if vtype == VT.ARRAY:
                sub = VT(self._u32())
                n = self._u64()
                self.fields.append((key, vtype, sub, self._array(sub, n)))
            else:
                self.fields.append((key, vtype, None, self._value(vtype)))
        infos = []
        for _ in range(n_tensors):
            name = self._str()
            n_dims = self._u32()
            if n_dims > 4:  # GGML_MAX_DIMS
                raise ValueError(f"tensor {name} has {n_dims} dimensions (at most 4)")
            ne = struct.unpack_from(f"<{n_dims}Q", buf, self.pos)
            self.pos += 8 * n_dims
            qtype = gguf.GGMLQuantizationType(self._u32())
            offset = self._u64()
            infos.append((name, tuple(int(x) for x in ne), qtype, offset))
        for what, names in (("key", [k for k, *_ in self.fields]), ("tensor name", [i[0] for i in infos])):
            if len(set(names)) < len(names):
                dup = next(n for n in names if names.count(n) > 1)
                raise ValueError(f"duplicate {what} {dup!r}")
        align = next((int(v) for k, _, _, v in self.fields if k == "general.alignment"), gguf.GGUF_DEFAULT_ALIGNMENT)
        if align <= 0 or align & (align - 1):
            raise ValueError(f"alignment {align} is not a power of two")
        start = -(-self.pos // align) * align
        self.tensors = []
        for name, ne, qtype, offset in infos:
            block, size = gguf.GGML_QUANT_SIZES[qtype]
            if (ne[0] if ne else 1) % block:
                raise ValueError(f"tensor {name}: {qtype.name} rows hold multiples of {block} values, ne is {list(ne)}")
            n_bytes = math.prod(ne) // block * size  # exact: a garbage shape must not wrap around
            if start + offset + n_bytes > len(buf):
                raise ValueError(f"tensor {name} runs past the end of the file")
            self.tensors.append(ReaderTensor(name, ne, qtype, n_bytes, start + offset, self.mm))

    def _u32(self) -> int:
        (v,) = struct.unpack_from("<I", self.mm, self.pos)
        self.pos += 4
        return v

    def _u64(self) -> int:
        (v,) = struct.unpack_from("<Q", self.mm, self.pos)
        self.pos += 8
        return v

    def _str(self) -> str:
        n = self._u64()
        if self.pos + n > len(self.mm):
            raise ValueError("string runs past the end of the file")
        s = bytes(self.mm[self.pos:self.pos + n]).decode("utf-8", errors="replace")
        self.pos += n
        return s

    def _value(self, t: VT) -> Any:
        if t == VT.STRING:
            return self._str()
        if t not in _SCALAR:
            raise ValueError(f"value type {t}")
        (v,) = struct.unpack_from("<" + _SCALAR[t], self.mm, self.pos)
        self.pos += struct.calcsize(_SCALAR[t])
        return bool(v) if t == VT.BOOL else float(v) if t in (VT.FLOAT32, VT.FLOAT64) else int(v)

    def _array(self, t: VT, n: int) -> list[Any]:
        if t == VT.STRING:
            return [self._str() for _ in range(n)]
        if t not in _SCALAR:
            raise ValueError(f"array of {t}")
        a = np.frombuffer(self.mm, dtype=np.dtype(_SCALAR[t]).newbyteorder("<"), count=n, offset=self.pos)
        self.pos += a.nbytes
        return [bool(x) for x in a] if t == VT.BOOL else a.astype(float).tolist() \
            if t in (VT.FLOAT32, VT.FLOAT64) else a.astype(int).tolist()


class GGUFFile:
    """A read-only view of a GGUF file: metadata values (decoded) and tensor infos."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        if not self.path.is_file():
            raise UserError(f"{self.path}: no such file; pass the path of a .gguf file")
        try:
            self.reader = _Reader(self.path)
        except (ValueError, struct.error, IndexError, OverflowError, OSError) as e:  # corrupt or truncated input
            raise UserError(f"{self.path}: not a readable GGUF file ({type(e).__name__}: {e}); "
                            "regenerate it or check the download") from None
        self.kv: dict[str, Any] = {}
        self.kv_types: dict[str, tuple[gguf.GGUFValueType, gguf.GGUFValueType | None]] = {}
        for key, vtype, sub, value in self.reader.fields:
            self.kv[key] = value
            self.kv_types[key] = (vtype, sub)
        self.tensors: dict[str, TensorInfo] = {
            t.name: TensorInfo(t.name, t.shape, t.tensor_type.name, t.n_bytes) for t in self.reader.tensors
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
