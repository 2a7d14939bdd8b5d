"""The worker side of targets/PROTOCOL.md, shared by every worker (llama.cpp, llama-server, skippy's, the mutants):
the loop that answers each request line with the worker's `op_<op>` handler (bytes as base64, or as frames), the
error a handler raises for a request it cannot serve, and the process around the loop — the protocol's own stdout,
an exit with the engine that started it, no llama.cpp in the quick test lane. targets/client.py is the engine side.
"""

from __future__ import annotations

import base64
import ctypes
import json
import os
import signal
import sys
import threading
import time
import traceback
from typing import Any

from targets.client import COVERAGE_ENV, ENGINE_PID, FRAMES

PROTOCOL_VERSION = 1

# the KV cache types a `load` may ask for (llama.cpp's own list: common's kv_cache_types), by their ggml_type (ggml.h's
# enum, stable across builds: the bindings do not name every one, e.g. BF16)
CACHE_TYPES = {"f32": 0, "f16": 1, "bf16": 30, "q8_0": 8, "q4_0": 2, "q4_1": 3, "iq4_nl": 20, "q5_0": 6, "q5_1": 7}
ROPE_SCALINGS = {"none": 0, "linear": 1, "yarn": 2}  # llama_rope_scaling_type: a context's RoPE scaling (`load`)


class RequestError(Exception):
    """The request cannot be served (bad arguments, load failure, decode error). Reported, not fatal."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


CALL_LOG = "FAMILY_CERTIFY_CALL_LOG"  # a directory: each worker appends its requests there (fuzz report --upstream)


def serve(stdin, stdout, make_worker: Any, frames: bool = False) -> None:
    """Answer requests, one JSON line each, until stdin ends or a shutdown. A handler's bytes values (logits, state)
    go as base64 strings, or with `frames` as raw bytes after the line (targets/PROTOCOL.md, Frames). With CALL_LOG
    set, every request is written to DIR/<pid>.jsonl before it runs and its outcome after: a worker that died in a
    request leaves that request last."""
    worker = make_worker()
    log = open(os.path.join(os.environ[CALL_LOG], f"{os.getpid()}.jsonl"), "a", buffering=1) \
        if os.environ.get(CALL_LOG) else None
    for line in stdin:
        if not line.strip():
            continue
        rid = None
        try:
            req = json.loads(line)
            rid = req.get("id")
            op = req.get("op")
            if log is not None:
                log.write(json.dumps({"request": {k: v for k, v in req.items() if k != "id"}}) + "\n")
            if op == "shutdown":
                stdout.write(json.dumps({"id": rid, "ok": True}) + "\n")
                stdout.flush()
                return
            handler = getattr(worker, f"op_{op}", None)
            if handler is None:
                raise RequestError("bad_request", f"unknown op {op!r}")
            worker.decode_seconds = worker.callback_seconds = 0.0
            resp = {"id": rid, "ok": True, **handler(req), "decode_seconds": worker.decode_seconds,
                    "callback_seconds": worker.callback_seconds}
        except RequestError as e:
            resp = {"id": rid, "ok": False, "error_kind": e.kind, "error": str(e)}
        except (ValueError, KeyError, TypeError) as e:
            resp = {"id": rid, "ok": False, "error_kind": "bad_request", "error": f"{type(e).__name__}: {e}",
                    "trace": traceback.format_exc(limit=3)}
        if log is not None:  # (and the tokens of each answer a server worker gave: which request answered what)
            answers = resp.get("results") if isinstance(resp.get("results"), list) else \
                [resp["result"]] if isinstance(resp.get("result"), dict) else []
            log.write(json.dumps({"ok": resp.get("ok", False), **({"error": resp["error"]} if "error" in resp
                                                                   else {}),
                                  **({"tokens": [a.get("tokens") for a in answers if isinstance(a, dict)]}
                                     if answers else {})}) + "\n")
        blobs: list[bytes] = []
        resp = _blobs_out(resp, blobs if frames else None)
        if blobs:
            resp["$frames"] = [len(b) for b in blobs]
            stdout.flush()
            stdout.buffer.write(json.dumps(resp).encode() + b"\n" + b"".join(blobs))
            stdout.buffer.flush()
        else:
            stdout.write(json.dumps(resp) + "\n")
            stdout.flush()


def _blobs_out(value: Any, frames: list[bytes] | None) -> Any:
    """A reply with its bytes values as base64 strings, or (frames given) as {"$frame": i}, the bytes appended."""
    if isinstance(value, (bytes, bytearray)):
        if frames is None:
            return base64.b64encode(value).decode()
        frames.append(bytes(value))
        return {"$frame": len(frames) - 1}
    if isinstance(value, dict):
        return {k: _blobs_out(v, frames) for k, v in value.items()}
    if isinstance(value, list):
        return [_blobs_out(v, frames) for v in value]
    return value


def _exit_with_engine(engine: int) -> None:
    """The engine that started this worker is gone (killed: the worker's stdin closes, but a request in progress —
    an `await` with a long timeout, a slow load, a load the dead engine left in the pipe — would keep the worker and
    its llama-server alive until it ends): exit now, with the process group the engine started it in (a llama-server
    runs in it; skippy's stages go by their PR_SET_PDEATHSIG). Gone: this worker's parent changed (it was reparented),
    or the engine's pid is not there (it died before this thread first looked; a `cmd:` wrapper is the parent)."""
    parent = os.getppid()
    while os.getppid() == parent and _alive(engine):
        time.sleep(0.2)
    if os.getpgrp() == os.getpid():
        os.killpg(0, signal.SIGKILL)
    os._exit(1)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # (someone else's process: there, at least)
        pass
    return True


NO_LLAMA = "FAMILY_CERTIFY_NO_LLAMA"  # set: a worker exits before it loads llama.cpp or starts llama-server


def main_with(worker_cls: Any, llama: bool = True) -> None:
    """Serve the protocol on stdin/stdout with a worker of this class (also the llama-server worker's entry).
    llama: the worker runs llama.cpp (refused in the quick lane); skippy's runs skippy's binaries."""
    if llama and os.environ.get(NO_LLAMA):  # the quick test lane: no llama.cpp process, whatever a test asks for
        sys.exit(f"llama.cpp refused: {NO_LLAMA} is set (the quick lane, `make test-quick`, starts no llama.cpp "
                 "process: mark a test that needs one `llama`)")
    # ggml attaches gdb for a backtrace on abort: slow, and it buries the abort message the client reports
    os.environ.setdefault("GGML_NO_BACKTRACE", "1")
    # The protocol owns the real stdout; anything native code prints to fd 1 goes to stderr instead.
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    made: list[Any] = []

    def make() -> Any:
        made.append(worker_cls())
        return made[-1]

    engine = int(os.environ.get(ENGINE_PID) or os.getppid())
    threading.Thread(target=_exit_with_engine, args=(engine,), daemon=True).start()
    try:
        serve(sys.stdin, proto, make, frames=bool(os.environ.get(FRAMES)))
    finally:
        for w in made:
            w.close()
    # done: exit now rather than tear down the interpreter, models and contexts (tens of ms per worker) — but a
    # coverage build's counts are written by the C library's exit (libgcov's destructor in each library), which
    # os._exit skips
    proto.flush()
    sys.stderr.flush()
    if os.environ.get(COVERAGE_ENV):
        ctypes.CDLL(None).exit(0)
    os._exit(0)


class FreshAtUnload:
    """A mutant makes what it adds to its worker at a load, and it is gone at an unload: an idle worker of a mutant
    (targets.target keeps them, after an unload, for the next target of the same mutant) is as a fresh one. (The
    workers' own state is theirs to reset: an unload leaves no model, context or server.)"""

    def __init__(self) -> None:
        super().__init__()
        self.worker_attributes = frozenset(vars(self)) | {"worker_attributes"}

    def op_unload(self, req: dict) -> dict:
        out = super().op_unload(req)  # (the worker class it is mixed into)
        for name in set(vars(self)) - self.worker_attributes:
            delattr(self, name)
        return out
