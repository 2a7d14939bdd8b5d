"""A target as the engine sees it: typed calls over the protocol, blobs decoded to numpy / bytes."""

from __future__ import annotations

import atexit
import base64
import os
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from targets.client import DEFAULT_TIMEOUT, Reply, WorkerClient, as_bytes

# Idle workers kept for the next target of the same command and environment: a worker's start (Python, the bindings,
# llama.cpp's backends) is not free and an oracle run opens several. Only targets opened with reuse (our llama.cpp
# and llama-server workers and their mutants, which keep nothing past an unload: another program may) are kept, each
# after an `unload` (no model, no context, no server left), at most IDLE_MAX of them (the longest idle closed to make
# room: a worker of an environment no longer used must not hold a place); they exit with this process.
IDLE_MAX = 8
_idle: list[tuple[tuple[Any, ...], WorkerClient]] = []  # (key, worker), the longest idle first
_idle_lock = threading.Lock()


def close_idle() -> None:
    """Close every idle worker and wait for it to exit (at this process's exit; a coverage run after each lane, so
    that the lane's counts are written before they are read)."""
    with _idle_lock:
        clients = [c for _, c in _idle]
        _idle.clear()
    for c in clients:
        c.request_close()
    for c in clients:
        c.wait_closed()


atexit.register(close_idle)


def _f32(blob: bytes | str) -> np.ndarray:
    return np.frombuffer(as_bytes(blob), dtype="<f4").copy()


def _b64(a: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(a, dtype="<f4").tobytes()).decode()


def step_args(tokens: Sequence[int | str] | None = None, *, embd: np.ndarray | None = None,
              seq: int | Sequence[int] = 0, pos: Sequence[int] | None = None, logits: str | Sequence[bool] = "last",
              capture: Sequence[int] = (), n_pos_per_token: int = 1, trace: int | str | None = None,
              wire: str | None = None, logits_from: str | None = None) -> dict[str, Any]:
    """A decode request in protocol form (wire: the embd rows arrive through a split runtime's wire of that type;
    logits_from "buffer": the logits read as llama_get_logits gives them, every output row in one buffer)."""
    args: dict[str, Any] = {"seq": seq if isinstance(seq, int) else [int(x) for x in seq],
                            "logits": logits if isinstance(logits, str) else [bool(x) for x in logits]}
    if tokens is not None:
        args["tokens"] = [t if isinstance(t, str) else int(t) for t in tokens]
    if embd is not None:
        args["embd"] = _b64(embd)
    if pos is not None:
        args["pos"] = [int(p) for p in pos]
    if capture:
        args["capture"] = [int(k) for k in capture]
    if n_pos_per_token != 1:
        args["n_pos_per_token"] = n_pos_per_token
    if trace is not None:
        args["trace"] = trace if trace == "all" else int(trace)
    if wire is not None:
        args["wire"] = wire
    if logits_from is not None:
        args["logits_from"] = logits_from
    return args


def script_request(steps: Sequence[dict[str, Any]], *, reset: bool = False) -> tuple[str, dict[str, Any]]:
    """A script request in protocol form (for Target.pipeline)."""
    args: dict[str, Any] = {"steps": [step_args(**st) for st in steps]}
    if reset:
        args["reset"] = True
    return "script", args


def _decoded(r: Reply) -> Reply:
    if r.ok and r.request.get("op") == "script":
        for res in r.data["results"]:
            decode_result(res)
    return r


def decode_result(data: dict[str, Any]) -> None:
    """Turn a decode result's blobs into arrays, in place."""
    n_vocab = data["n_vocab"]
    data["logits"] = _f32(data["logits"]).reshape(-1, n_vocab) if "logits" in data \
        else np.zeros((0, n_vocab), np.float32)
    data["captures"] = {int(k): _f32(v).reshape(data["n_tokens"], -1) for k, v in data.get("captures", {}).items()}
    for node in data.get("nodes", ()):
        node["data"] = as_bytes(node["data"])


class Target:
    """Anything that speaks targets/PROTOCOL.md, run as a worker process."""

    def __init__(self, name: str, argv: list[str], *, timeout: float = DEFAULT_TIMEOUT,
                 env: dict[str, str] | None = None, reuse: bool = False):
        """reuse: take an idle worker of the same command and environment if there is one, and keep this one idle
        when it is closed (see IDLE_MAX)."""
        self.name = name
        self.key = (tuple(argv), tuple(sorted({**os.environ, **(env or {})}.items()))) if reuse else None
        with _idle_lock:
            i = next((i for i in range(len(_idle) - 1, -1, -1) if _idle[i][0] == self.key), None) if reuse else None
            client = _idle.pop(i)[1] if i is not None else None
        if client is not None:
            client.timeout, client.name, client.restarts = timeout, name, 0
        self.client = client or WorkerClient(argv, timeout=timeout, env=env, name=name)
        self.parked = False  # closed, its worker kept idle (another target's from now on)

    def start(self) -> None:
        """Spawn the worker process now instead of at the first call."""
        self.client.start()

    def close(self) -> None:
        if not self.parked and not self._park():
            self.client.close()

    def _park(self) -> bool:
        """Keep the worker idle for the next target of the same key: True if it was kept (or was already)."""
        c = self.client
        if self.parked:
            return True
        if self.key is None or c.proc is None or c.proc.poll() is not None or c.in_flight:
            return False  # (a call still waiting on another thread: its reply is that thread's, and so is the worker)
        c.load_request = None  # (a worker restarted from now on starts empty)
        if not c.call("unload", timeout=10).ok:
            return False
        with _idle_lock:
            _idle.append((self.key, c))
            evicted = [w for _, w in _idle[:-IDLE_MAX]]
            del _idle[:-IDLE_MAX]
        for w in evicted:
            w.close()
        self.parked = True
        return True

    def __enter__(self) -> Target:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def restarts(self) -> int:
        return self.client.restarts

    def hello(self) -> Reply:
        return self.client.call("hello")

    def call(self, op: str, **args: Any) -> Reply:
        """Any protocol op, arguments and results as they are (for ops without a typed method here)."""
        return self.client.call(op, **args)

    def load(self, path: str, **params: Any) -> Reply:
        return self.client.call("load", path=str(path), **params)

    def info(self) -> Reply:
        return self.client.call("info")

    def decode(self, tokens: Sequence[int] | None = None, *, embd: np.ndarray | None = None,
               seq: int | Sequence[int] = 0, pos: Sequence[int] | None = None,
               logits: str | Sequence[bool] = "last", capture: Sequence[int] = (),
               n_pos_per_token: int = 1, trace: int | str | None = None, logits_from: str | None = None,
               timeout: float | None = None) -> Reply:
        """One llama_decode. Reply.data: logits (rows × n_vocab), argmax, captures {layer: (n × n_embd)}; with
        trace k (a context loaded with trace=True), nodes: every graph node of layer k in execution order (trace
        "all": every node of the graph)."""
        r = self.client.call("decode", timeout=timeout, **step_args(tokens, embd=embd, seq=seq, pos=pos,
                                                                     logits=logits, capture=capture,
                                                                     n_pos_per_token=n_pos_per_token, trace=trace,
                                                                     logits_from=logits_from))
        if r.ok:
            decode_result(r.data)
        return r

    def script(self, steps: Sequence[dict[str, Any]], *, reset: bool = False, timeout: float | None = None) -> Reply:
        """Several decodes in one round trip; each step takes decode()'s keyword arguments (tokens may be
        "argmax@R": the argmax of output row R of the previous step). reset: clear the memory first.
        Reply.data["results"]: decoded steps."""
        op, args = script_request(steps, reset=reset)
        return _decoded(self.client.call(op, timeout=timeout, **args))

    def pipeline(self, requests: Sequence[tuple[str, dict[str, Any]]], *, timeout: float | None = None) -> list[Reply]:
        """Several requests at once (("load", {...}), script_request(...), ...): the worker runs them back to
        back. Replies in order, up to and including the first that failed; script results decoded."""
        return [_decoded(r) for r in self.client.calls(list(requests), timeout=timeout)]

    def generate(self, prompt: Sequence[int], n_predict: int, *, chunk: int | None = None, seq: int = 0,
                 timeout: float | None = None) -> Reply:
        """Chunked prefill then greedy decode. Reply.data: tokens, logits (n_predict × n_vocab)."""
        args: dict[str, Any] = {"prompt": [int(t) for t in prompt], "n_predict": int(n_predict), "seq": seq}
        if chunk:
            args["chunk"] = int(chunk)
        r = self.client.call("generate", timeout=timeout, **args)
        if r.ok:
            r.data["logits"] = _f32(r.data["logits"]).reshape(-1, r.data["n_vocab"]) if "logits" in r.data \
                else np.zeros((0, r.data["n_vocab"]), np.float32)
        return r

    def state_get(self, seq: int = 0, *, partial: bool = False) -> Reply:
        r = self.client.call("state_get", seq=seq, partial=partial)
        if r.ok:
            r.data["blob"] = as_bytes(r.data.pop("data", ""))
        return r

    def state_set(self, blob: bytes, seq: int = 0, *, partial: bool = False) -> Reply:
        return self.client.call("state_set", seq=seq, partial=partial, data=base64.b64encode(blob).decode())

    def seq_rm(self, seq: int = -1, p0: int = -1, p1: int = -1) -> Reply:
        return self.client.call("seq_rm", seq=seq, p0=p0, p1=p1)

    def reset(self) -> Reply:
        return self.client.call("reset")


def close_all(targets: Sequence[Target]) -> None:
    """Close several targets in parallel (each worker exits on its own; then wait for all); reused ones are kept."""
    closing = [t for t in targets if not t._park()]
    for t in closing:
        t.client.request_close()
    for t in closing:
        t.client.wait_closed()
