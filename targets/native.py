"""The llama.cpp worker's hot paths: capturing residuals (tensors "l_out-N") during llama_decode, keeping
llama.cpp's log, and argmax.

Two implementations of one interface: Native (targets/native.c, compiled on first use into the cache; the
eval callback never enters Python) and Python (the same through ctypes callbacks; used when no C compiler
is found, or with FAMILY_CERTIFY_NO_NATIVE=1). Both give the same bytes; tests hold them to it.
No numpy here: the worker starts in half the time without it.

Run `python -m targets.native` to build the native one ahead of time (scripts/bootstrap.sh does).
"""

from __future__ import annotations

import ctypes
import os
import sys
import time
import zlib
from array import array
from collections import deque
from pathlib import Path
from typing import Any

SOURCE = Path(__file__).with_name("native.c")
MAX_LAYERS = 4096  # FC_MAX_LAYERS in native.c
OUTPUT_SLOT = MAX_LAYERS - 1  # FC_OUTPUT_SLOT: the logits node "result_output", rows in ubatch order
LOG_LINES = 200  # FC_LOG_LINES
LOG_LEVEL_DEBUG = 1  # GGML_LOG_LEVEL_DEBUG (NONE is 0)
F32 = 0  # GGML_TYPE_F32


def cache_dir() -> Path:
    return Path(os.environ.get("FAMILY_CERTIFY_CACHE") or Path.home() / ".cache" / "family-certify")


def native_library() -> Path | None:
    """native.c compiled for its current text, built now if needed; None without a working C compiler."""
    digest = f"{zlib.crc32(SOURCE.read_bytes()):08x}"  # (hashlib's OpenSSL import costs every worker 8 ms)
    out = cache_dir() / "native" / f"native-{digest}.so"
    if out.is_file():
        return out
    import shutil
    import subprocess

    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        return None
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")
    r = subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(tmp), str(SOURCE)], capture_output=True, text=True)
    if r.returncode != 0:
        tmp.unlink(missing_ok=True)
        sys.stderr.write(f"native: cannot compile {SOURCE.name} with {cc}: {r.stderr.strip()[:300]}\n")
        return None
    os.replace(tmp, out)  # atomic: concurrent workers may build it at the same time
    return out


class _Tensor(ctypes.Structure):  # struct ggml_tensor up to its sources (ggml.h, pinned build)
    _fields_ = [("type", ctypes.c_int), ("buffer", ctypes.c_void_p), ("ne", ctypes.c_int64 * 4),
                ("nb", ctypes.c_size_t * 4), ("op", ctypes.c_int), ("op_params", ctypes.c_int32 * 16),
                ("flags", ctypes.c_int32), ("src", ctypes.c_void_p * 10)]


def _address(fn: Any) -> int:
    return ctypes.cast(fn, ctypes.c_void_p).value


class Native:
    kind = "native"

    def __init__(self, lib_path: Path, ggml: ctypes.CDLL, L: Any, *, echo: bool = False):
        lib = ctypes.CDLL(str(lib_path))
        lib.fc_log_line.restype = ctypes.c_char_p
        lib.fc_log_line.argtypes = [ctypes.c_int]
        lib.fc_log_echo.argtypes = [ctypes.c_int]
        lib.fc_log_echo(int(echo))
        lib.fc_init.argtypes = [ctypes.c_void_p] * 3
        lib.fc_want.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int]
        lib.fc_count.restype = lib.fc_width.restype = ctypes.c_int64
        lib.fc_count.argtypes = lib.fc_width.argtypes = lib.fc_data.argtypes = [ctypes.c_int]
        lib.fc_data.restype = ctypes.c_void_p
        lib.fc_argmax.restype = ctypes.c_int64
        lib.fc_argmax.argtypes = [ctypes.c_void_p, ctypes.c_int64]
        lib.fc_init(_address(ggml.ggml_get_name), _address(ggml.ggml_nbytes), _address(ggml.ggml_backend_tensor_get))
        self.lib = lib
        self.callback = L.ggml_backend_sched_eval_callback(_address(lib.fc_eval))
        self.log_callback = L.llama_log_callback(_address(lib.fc_log))
        self.seconds = 0.0  # time spent in a Python callback (none here: it is part of llama_decode's own)
        self.layers: list[int] = []

    def begin(self, layers: list[int]) -> None:
        """Capture these layers' residuals during the next decode."""
        if any(not 0 <= k < MAX_LAYERS for k in layers):
            raise ValueError(f"capture: layer indices must be in 0..{MAX_LAYERS - 1}")
        self.layers = list(layers)
        self.lib.fc_want((ctypes.c_int * max(1, len(layers)))(*layers), len(layers))

    def end(self) -> dict[int, tuple[bytes, int]]:
        """What the decode captured: layer → (float32 bytes, row width)."""
        out = {}
        for k in self.layers:
            n = self.lib.fc_count(k)
            if n:
                out[k] = (ctypes.string_at(self.lib.fc_data(k), n * 4), int(self.lib.fc_width(k)))
        self.lib.fc_want(None, 0)
        self.layers = []
        return out

    def argmax(self, ptr: int, n: int) -> int:
        """numpy.argmax of n float32 at address ptr."""
        return int(self.lib.fc_argmax(ptr, n))

    def log_lines(self) -> list[str]:
        """The last lines llama.cpp logged above debug level, oldest first."""
        return [self.lib.fc_log_line(i).decode("utf-8", errors="replace") for i in range(self.lib.fc_log_count())]

    def log_clear(self) -> None:
        self.lib.fc_log_clear()


class Python:
    kind = "python"

    def __init__(self, ggml: ctypes.CDLL, L: Any, *, echo: bool = False):
        self.ggml = ggml
        self.callback = L.ggml_backend_sched_eval_callback(self._on_eval)
        self.log_callback = L.llama_log_callback(self._on_log)
        self.echo = echo
        self.log: deque[str] = deque(maxlen=LOG_LINES)
        self.seconds = 0.0  # time spent in this callback (subtract it from llama_decode's)
        self.want: dict[bytes, int] = {}
        self.trace_layer: bytes | None = None  # "-k": trace every node of layer k; b"": every node of the graph
        self.nodes: list[dict[str, Any]] = []
        self.got: dict[int, list[bytes]] = {}
        self.width: dict[int, int] = {}

    def begin(self, layers: list[int], trace: int | str | None = None) -> None:
        """Capture these layers' residuals during the next decode; trace: also every node of that layer (named
        `<name>-k`), or with "all" every node of the graph."""
        self.want = {(b"result_output" if k == OUTPUT_SLOT else f"l_out-{k}".encode()): k for k in layers}
        self.got, self.width = {}, {}
        self.trace_layer = None if trace is None else b"" if trace == "all" else f"-{trace}".encode()
        self.nodes = []

    def end(self) -> dict[int, tuple[bytes, int]]:
        out = {k: (b"".join(parts), self.width[k]) for k, parts in self.got.items() if parts}
        self.want, self.got, self.trace_layer = {}, {}, None
        return out

    def argmax(self, ptr: int, n: int) -> int:
        x = array("f")
        x.frombytes(ctypes.string_at(ptr, n * 4))
        best = 0
        for i, v in enumerate(x):
            if v != v:  # NaN: numpy reports the first one
                return i
            if v > x[best]:
                best = i
        return best

    def log_lines(self) -> list[str]:
        return list(self.log)

    def log_clear(self) -> None:
        self.log.clear()

    def _on_log(self, level: int, text: bytes, _ud: Any) -> None:
        if self.echo:
            sys.stderr.write(text.decode("utf-8", errors="replace"))
        if level <= LOG_LEVEL_DEBUG:  # hundreds of lines per load; errors are never debug level
            return
        line = text.decode("utf-8", errors="replace").rstrip("\n")
        if line:
            self.log.append(line)

    def _on_eval(self, t: int, ask: bool, _ud: Any) -> bool:
        t0 = time.perf_counter()
        try:
            name = self.ggml.ggml_get_name(t)
            if self.trace_layer is not None and name.split(b" (", 1)[0].endswith(self.trace_layer):
                if not ask:
                    self._trace(t, name)
                if name not in self.want:
                    return True
            k = self.want.get(name)
            if k is None:
                return False
            if ask:
                return True
            head = ctypes.cast(t, ctypes.POINTER(_Tensor)).contents
            if head.type == F32:  # l_out-N is F32 [n_embd, n_tokens]
                n = self.ggml.ggml_nbytes(t)
                buf = ctypes.create_string_buffer(n)
                self.ggml.ggml_backend_tensor_get(t, buf, 0, n)
                self.got.setdefault(k, []).append(buf.raw)
                self.width[k] = int(head.ne[0])
            return True
        finally:
            self.seconds += time.perf_counter() - t0


    def _trace(self, t: int, name: bytes) -> None:
        head = ctypes.cast(t, ctypes.POINTER(_Tensor)).contents
        n = self.ggml.ggml_nbytes(t)
        buf = ctypes.create_string_buffer(n)
        self.ggml.ggml_backend_tensor_get(t, buf, 0, n)
        srcs = [self.ggml.ggml_get_name(p).decode(errors="replace") for p in head.src if p]
        self.nodes.append({"name": name.decode(errors="replace"), "op": self.ggml.ggml_op_desc(t).decode(),
                           "srcs": srcs, "type": int(head.type), "ne": list(head.ne), "data": buf.raw})


def load(ggml: ctypes.CDLL, L: Any, *, echo: bool = False) -> Native | Python:
    """The helpers for llama-cpp-python's bindings L and libggml-base ggml (echo: copy llama.cpp's log to
    stderr)."""
    if not os.environ.get("FAMILY_CERTIFY_NO_NATIVE"):
        lib = native_library()
        if lib is not None:
            return Native(lib, ggml, L, echo=echo)
    return Python(ggml, L, echo=echo)


if __name__ == "__main__":
    path = native_library()
    print(f"native helpers: {path}" if path else "native helpers: no C compiler; the worker uses Python callbacks")
