"""The llama.cpp worker's `state_get` / `state_set` (targets/PROTOCOL.md): a context's state read out and written
back through each way llama.cpp's API offers, named by `via`:

  memory        one sequence, in memory (llama_state_seq_get_data_ext / set_data_ext; `partial` sets
                LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY)
  file          one sequence, through a file with the tokens a runtime keeps beside it
                (llama_state_seq_save_file / llama_state_seq_load_file)
  context       the whole context, in memory (llama_state_get_data / llama_state_set_data): every sequence under
                its own id; `seq` is not used
  context-file  the whole context through a session file with its tokens (llama_state_save_file /
                llama_state_load_file)

A file variant's blob is the file's bytes (the engine moves every blob the same way); its `tokens` come back from
state_set as the file held them. Each path is a different piece of llama_context's code (its own reader and writer
of llama_io, its own header checks), so a memory program draws among those the target says it offers (hello's
`state_via`).
"""

from __future__ import annotations

import base64
import ctypes
import os
import tempfile
from pathlib import Path
from typing import Any

VIAS = ("memory", "file", "context", "context-file")
PARTIAL_ONLY = 1  # LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
MAX_TOKENS = 1 << 16  # tokens a file variant reads back at most


class StateError(Exception):
    """A state call refused (code, message): the worker answers it as a failed request."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


def _via(req: dict) -> str:
    via = req.get("via", "memory")
    if via not in VIAS:
        raise StateError("bad_request", f"state: via {via!r}: use one of {', '.join(VIAS)}")
    return via


def _tokens(req: dict) -> Any:
    toks = [int(t) for t in req.get("tokens", [])]
    return (ctypes.c_int32 * max(len(toks), 1))(*toks), len(toks)


def state_get(L: Any, ctx: Any, req: dict) -> bytes:
    """The state `req` asks for, as bytes (a file variant: the file's)."""
    via, seq = _via(req), int(req.get("seq", 0))
    if via == "memory":
        flags = PARTIAL_ONLY if req.get("partial") else 0
        size = L.llama_state_seq_get_size_ext(ctx, seq, flags)
        buf = (ctypes.c_uint8 * max(size, 1))()
        got = L.llama_state_seq_get_data_ext(ctx, buf, size, seq, flags)
        return bytes(buf)[:got]
    if via == "context":
        size = L.llama_state_get_size(ctx)
        buf = (ctypes.c_uint8 * max(size, 1))()
        got = L.llama_state_get_data(ctx, buf, size)
        return bytes(buf)[:got]
    toks, n = _tokens(req)
    with tempfile.TemporaryDirectory(prefix="family-certify-state-") as d:
        path = os.path.join(d, "state.bin").encode()
        if via == "file":
            ok = L.llama_state_seq_save_file(ctx, path, seq, toks, n) > 0
        else:
            ok = bool(L.llama_state_save_file(ctx, path, toks, n))
        if not ok:
            raise StateError("state_failed", f"state_get via {via}: llama.cpp wrote no file")
        return Path(path.decode()).read_bytes()


def state_set(L: Any, ctx: Any, req: dict, data: bytes) -> dict[str, Any]:
    """`data` written into the context as `req` says: {"read": bytes consumed} (a file variant also "tokens")."""
    via, seq = _via(req), int(req.get("seq", 0))
    if via in ("memory", "context"):
        buf = (ctypes.c_uint8 * max(len(data), 1)).from_buffer_copy(data or b"\0")
        if via == "memory":
            got = L.llama_state_seq_set_data_ext(ctx, buf, len(data), seq, PARTIAL_ONLY if req.get("partial") else 0)
        else:
            got = L.llama_state_set_data(ctx, buf, len(data))
        if got == 0 and data:
            raise StateError("state_failed", f"state_set via {via}: llama.cpp read 0 bytes")
        return {"read": int(got)}
    out = (ctypes.c_int32 * MAX_TOKENS)()
    n_out = ctypes.c_size_t(0)
    with tempfile.TemporaryDirectory(prefix="family-certify-state-") as d:
        path = os.path.join(d, "state.bin")
        Path(path).write_bytes(data)
        if via == "file":
            got = L.llama_state_seq_load_file(ctx, path.encode(), seq, out, MAX_TOKENS, ctypes.byref(n_out))
            ok = got > 0
        else:
            got = len(data) if L.llama_state_load_file(ctx, path.encode(), out, MAX_TOKENS, ctypes.byref(n_out)) else 0
            ok = got > 0
    if not ok:
        raise StateError("state_failed", f"state_set via {via}: llama.cpp refused the file")
    return {"read": int(got), "tokens": list(out[:n_out.value])}


def blob_of(req: dict) -> bytes:
    """The bytes a state_set request carries (inline, or a file the engine wrote)."""
    return Path(req["path"]).read_bytes() if req.get("path") else base64.b64decode(req.get("data", ""))
