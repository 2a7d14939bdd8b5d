"""The fake `skippy` binary: `python -m tests.fake_skippy.skippy {--version | serve-openai | serve-binary} ...`.

A test double of skippy's serving CLI (Mesh-LLM/mesh-llm crates/skippy-cli, as read from the public sources; see
docs/skippy.md): the subcommands, flags, StageConfig fields, OpenAI routes, response and error shapes the
adapter relies on. Unknown `--flags` (and their values) are accepted and ignored, as skippy has many more. Every
stage runs the real llama.cpp in its own worker process (tests/fake_skippy/common.py); SIGTERM / SIGINT stop the
process and its worker and exit 0.

Stage to stage, the fake speaks its OWN wire — JSON lines over TCP (`hello`, `reset`, `restore`, `record`, `decode`
with base64 f32 rows), not skippy's binary stage protocol and its Ready frame. A stage opens its bind_addr only once
it is loaded and connected to its downstream stage, so "bind_addr accepts a TCP connection" means ready; stage 0
answers /v1/models 200 only then. A receiving stage applies the StageConfig's activation_codec to the rows it gets
(common.codec_roundtrip). Every request runs one schedule, cached or not: the prompt but its last token prefilled in
n_batch chunks (a kv_cache hit restores a prefix and skips it), the kv_cache record of that prefix, then one token a
step — serve-openai runs the same schedule on the whole model, so a correct split answers exactly as it does.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import signal
import socket
import socketserver
import sys
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from tests.fake_skippy.common import (
    CODECS,
    LOAD_MODES,
    PAYLOADS,
    FakeError,
    KvCache,
    KvCacheConfig,
    Params,
    StageFile,
    StageWorker,
    bug,
    check_arch,
    close_workers,
    fail,
    hang_forever,
    log,
    stage_file,
    workdir,
)

FAKE_VERSION = "0.0.0-fake"
FAKE_COMMIT = "0000000000000000000000000000000000fa4e01"
FAKE_ABI = "0.1.67"  # the skippy ABI the public sources pin (skippy-ffi ABI_VERSION_*)
OWNED_BY = "skippy-runtime"


def version_line() -> str:
    from targets.llama_cpp_worker import build_commit  # what the worker's `hello` reports, without starting one

    return f"skippy {FAKE_VERSION} (commit {FAKE_COMMIT}, abi {FAKE_ABI}, llama.cpp {build_commit()})"


# ---- addresses --------------------------------------------------------------------------------------------------

def parse_addr(text: str) -> tuple[str, int]:
    """`127.0.0.1:PORT`, `tcp://127.0.0.1:PORT` or `:PORT` (loopback)."""
    s = text.removeprefix("tcp://")
    host, sep, port = s.rpartition(":")
    if not sep or not port.isdigit():
        raise FakeError(f"invalid socket address {text!r}: expected HOST:PORT")
    return host or "127.0.0.1", int(port)


# ---- the stage wire (the fake's own, not skippy's) ---------------------------------------------------------------

class Link:
    """The connection to the downstream stage (fake wire: one JSON request line, one JSON reply line)."""

    def __init__(self, endpoint: str, *, timeout: float):
        self.endpoint = endpoint
        host, port = parse_addr(endpoint)
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.sock = socket.create_connection((host, port), timeout=5)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise FakeError(f"downstream stage at {endpoint} did not become ready within {timeout:g}s") \
                        from None
                time.sleep(0.25)
        self.sock.settimeout(None)
        self.file = self.sock.makefile("rwb")
        self.lock = threading.Lock()

    def call(self, msg: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            try:
                self.file.write(json.dumps(msg).encode() + b"\n")
                self.file.flush()
                line = self.file.readline()
            except OSError as e:
                raise FakeError(f"downstream stage at {self.endpoint}: {e}") from None
        if not line:
            raise FakeError(f"downstream stage at {self.endpoint} disconnected")
        return json.loads(line)


class StageNode:
    """One stage's side of the fake wire: do the op locally, pass it on downstream, return the chain's answer."""

    def __init__(self, who: str, worker: StageWorker, *, layer_start: int, layer_end: int,
                 downstream: Link | None, kv: KvCacheConfig):
        self.who, self.worker, self.downstream = who, worker, downstream
        self.layer_start, self.layer_end = layer_start, layer_end
        self.kv_cfg, self.kv = kv, KvCache(kv)
        self.payload = worker.resolve_payload(kv.payload) if kv.records else None
        if self.payload:
            log(who, f"kv_cache {kv.mode}: payload {kv.payload} resolved to {self.payload}")
        self.lock = threading.Lock()

    def handle(self, msg: dict[str, Any]) -> dict[str, Any]:
        try:
            with self.lock:
                return self._handle(msg)
        except FakeError as e:
            return {"ok": False, "error": str(e)}

    def _handle(self, msg: dict[str, Any]) -> dict[str, Any]:
        op = msg.get("op")
        w = self.worker
        if op == "hello":
            down = self.downstream.call(msg) if self.downstream else {"ok": True, "chain": []}
            if not down.get("ok"):
                return down
            me = {"layer_start": self.layer_start, "layer_end": self.layer_end, "last": w.last}
            return {"ok": True, "chain": [me, *down["chain"]]}
        if op == "reset":
            w.reset()
        elif op == "record":
            if self.kv_cfg.records:
                self.kv.put(msg["key"], w.export_state())
        elif op == "restore":
            blob = self.kv.get(msg["key"]) if self.kv_cfg.records else None
            if blob is None:
                return {"ok": False, "error": f"{self.who} holds no kv_cache entry for that prefix"}
            w.reset()
            assert self.payload is not None
            w.import_state(blob, self.payload)
        elif op == "decode":
            pos = int(msg["pos"])
            if "tokens" in msg:
                out = w.decode(pos, tokens=[int(t) for t in msg["tokens"]])
            else:
                rows = np.frombuffer(base64.b64decode(msg["embd"]), "<f4").reshape(-1, w.info["n_embd_inp"])
                out = w.decode(pos, rows=rows)
            if w.last:
                return {"ok": True, "token": out}
            if self.downstream is None:
                raise FakeError(f"{self.who} is not the last stage and has no downstream")
            msg = {"op": "decode", "pos": pos, "embd": base64.b64encode(out.astype("<f4").tobytes()).decode()}
        else:
            return {"ok": False, "error": f"unknown op {op!r}"}
        return self.downstream.call(msg) if self.downstream else {"ok": True}


class _WireHandler(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        node: StageNode = self.server.node  # type: ignore[attr-defined]
        for line in self.rfile:  # a readiness probe connects and closes: nothing to do
            try:
                reply = node.handle(json.loads(line))
            except (ValueError, KeyError, TypeError) as e:
                reply = {"ok": False, "error": f"bad request: {type(e).__name__}: {e}"}
            self.wfile.write(json.dumps(reply).encode() + b"\n")
            self.wfile.flush()


class _TcpServer(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = True


def listen(addr: str, make: Any, handler: Any) -> Any:
    host, port = parse_addr(addr)
    try:
        server = make((host, port), handler)
    except OSError as e:
        raise FakeError(f"failed to bind {addr}: {e.strerror or e}") from None
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


# ---- the OpenAI frontend (stage 0, serve-openai) -------------------------------------------------------------------

class ApiError(Exception):
    """An OpenAI error reply in skippy's body shape: {"error": {message, type, param, code}}."""

    def __init__(self, status: int, code: str, message: str):
        super().__init__(message)
        self.status, self.code = status, code

    def body(self) -> dict[str, Any]:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": str(self), "type": kind, "param": None, "code": self.code}}


def unsupported(msg: str) -> ApiError:
    return ApiError(400, "unsupported_model_feature", msg)


def invalid(msg: str) -> ApiError:
    return ApiError(400, "invalid_value", msg)


class Frontend:
    """skippy's /v1 routes over a stage-0 node: greedy completion, one request at a time."""

    def __init__(self, model_id: str, *, n_ctx: int, n_batch: int, default_max_tokens: int):
        self.model_id, self.n_ctx, self.n_batch = model_id, n_ctx, n_batch
        self.default_max_tokens = default_max_tokens
        self.node: StageNode | None = None  # set once loaded (and connected downstream): then ready
        self.lock = threading.Lock()

    def models(self) -> dict[str, Any]:
        return {"object": "list", "data": [{"id": self.model_id, "object": "model", "created": 0,
                                            "owned_by": OWNED_BY}]}

    def completions(self, body: Any) -> dict[str, Any]:
        if bug() == "hangs":
            hang_forever()
        if self.node is None:
            raise ApiError(503, "service_unavailable", "the model is still loading")
        if not isinstance(body, dict):
            raise invalid("request body must be a JSON object")
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise invalid("model is required")
        if model != self.model_id:
            raise ApiError(404, "model_not_found", f"model not found: {model}")
        if body.get("logprobs") is not None:
            raise unsupported("completion logprobs are parsed by openai-frontend but not yet implemented by "
                              "skippy runtime")
        if body.get("stream"):
            raise unsupported("the fake skippy does not stream; send stream false")
        for k in ("n", "best_of"):
            if body.get(k) is not None and int(body[k]) != 1:
                raise unsupported("multiple choices are parsed but not yet implemented")
        if body.get("echo"):
            raise invalid("echo is not supported")
        if body.get("suffix"):
            raise invalid("suffix is not supported")
        if body.get("temperature") is None or float(body["temperature"]) != 0.0:
            raise invalid("the fake skippy decodes greedily only: temperature must be 0")
        prompt = body.get("prompt")
        if isinstance(prompt, list) and all(isinstance(p, str) for p in prompt):
            prompt = "\n".join(prompt)
        if not isinstance(prompt, str):
            raise invalid("the fake skippy takes a text prompt (a string)")
        if not prompt:
            raise invalid("prompt is required")
        max_tokens = body.get("max_tokens", self.default_max_tokens)
        if not isinstance(max_tokens, int) or max_tokens <= 0:
            raise invalid("max_tokens must be a positive integer")
        node = self.node
        with self.lock:
            tokens = node.worker.tokenize(prompt)
            if not tokens:
                raise invalid("prompt has no tokens in the model's vocabulary")
            if len(tokens) + max_tokens > self.n_ctx:
                raise ApiError(400, "context_length_exceeded",
                               f"prompt ({len(tokens)} tokens) plus max_tokens ({max_tokens}) exceeds the context "
                               f"size ({self.n_ctx})")
            out, cached = self._generate(node, tokens, max_tokens)
            text = node.worker.detokenize(out)
        n, k = len(tokens), len(out)
        return {"id": f"cmpl-{int(time.time() * 1000)}", "object": "text_completion", "created": int(time.time()),
                "model": self.model_id,
                "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": "length"}],
                "usage": {"prompt_tokens": n, "completion_tokens": k, "total_tokens": n + k,
                          "prompt_tokens_details": {"cached_tokens": cached}}}

    def _call(self, node: StageNode, msg: dict[str, Any]) -> dict[str, Any]:
        r = node.handle(msg)
        if not r.get("ok"):
            raise ApiError(502, "service_unavailable", str(r.get("error", "stage chain failed")))
        return r

    def _generate(self, node: StageNode, tokens: list[int], max_tokens: int) -> tuple[list[int], int]:
        """Greedy continuation through the chain. One schedule for every request, cached or not: the prompt but its
        last token in n_batch chunks (a restored prefix skipped), a record of that prefix, then one token a step."""
        self._call(node, {"op": "reset"})
        body, cached = tokens[:-1], 0
        if node.kv_cfg.looks_up:
            key = node.kv.longest_prefix(tokens)
            if key is not None:
                r = node.handle({"op": "restore", "key": key})
                if r.get("ok"):
                    cached = len(key)
                    log(node.who, f"kv_cache hit: restored {cached} of {len(tokens)} prompt tokens")
                else:  # some stage evicted it: serve uncached
                    log(node.who, f"kv_cache restore failed ({r.get('error')}); prefilling from scratch")
                    self._call(node, {"op": "reset"})
        for i in range(cached, len(body), self.n_batch):
            self._call(node, {"op": "decode", "pos": i, "tokens": body[i:i + self.n_batch]})
        if node.kv_cfg.records and len(body) >= max(node.kv_cfg.min_tokens, 1) and cached < len(body):
            self._call(node, {"op": "record", "key": body})
        out = [int(self._call(node, {"op": "decode", "pos": len(body), "tokens": tokens[-1:]})["token"])]
        while len(out) < max_tokens:
            out.append(int(self._call(node, {"op": "decode", "pos": len(tokens) + len(out) - 1,
                                             "tokens": out[-1:]})["token"]))
        return out, cached


class _HttpHandler(BaseHTTPRequestHandler):
    server_version = "fake-skippy"
    GET_ROUTES = ("/health", "/healthz", "/readyz", "/v1/models")
    POST_ROUTES = ("/v1/completions", "/v1/chat/completions", "/v1/responses")

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 — the base class's signature
        log("http", format % args)

    def _send(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _route(self) -> str:
        return urlsplit(self.path).path

    def do_GET(self) -> None:  # noqa: N802 — http.server's naming
        fe: Frontend = self.server.frontend  # type: ignore[attr-defined]
        path = self._route()
        if path in ("/health", "/healthz"):
            self._send(200, {"status": "ok"})
        elif path == "/readyz":
            ready = fe.node is not None
            self._send(200 if ready else 503, {"status": "ready" if ready else "not ready"})
        elif path == "/v1/models":
            if fe.node:
                self._send(200, fe.models())
            else:
                self._send(503, ApiError(503, "service_unavailable", "the model is still loading").body())
        elif path in self.POST_ROUTES:
            self._send(405, invalid(f"method GET not allowed for {path}").body())
        else:
            self._send(404, ApiError(404, "not_found", f"no route {path}").body())

    def do_POST(self) -> None:  # noqa: N802
        fe: Frontend = self.server.frontend  # type: ignore[attr-defined]
        path = self._route()
        if path in self.GET_ROUTES:
            return self._send(405, invalid(f"method POST not allowed for {path}").body())
        if path not in self.POST_ROUTES:
            return self._send(404, ApiError(404, "not_found", f"no route {path}").body())
        try:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            try:
                body = json.loads(raw or b"null")
            except ValueError:
                raise invalid("request body is not valid JSON") from None
            if path != "/v1/completions":
                raise unsupported(f"the fake skippy serves /v1/completions only, not {path}")
            self._send(200, fe.completions(body))
        except ApiError as e:
            self._send(e.status, e.body())
        except (ValueError, TypeError) as e:
            self._send(400, invalid(f"{type(e).__name__}: {e}").body())
        except FakeError as e:
            self._send(502, ApiError(502, "service_unavailable", str(e)).body())


class _HttpServer(ThreadingHTTPServer):
    allow_reuse_address = True
    daemon_threads = True


def serve_http(addr: str, frontend: Frontend) -> Any:
    server = listen(addr, _HttpServer, _HttpHandler)
    server.frontend = frontend
    return server


# ---- StageConfig --------------------------------------------------------------------------------------------------

REQUIRED = ("run_id", "topology_id", "model_id", "stage_id", "stage_index", "layer_start", "layer_end", "load_mode",
            "bind_addr")


@dataclass
class StageConfig:
    """The fields of skippy's StageConfig the fake uses (the rest are accepted and ignored)."""

    model_id: str
    model_path: str
    stage_id: str
    stage_index: int
    layer_start: int
    layer_end: int
    load_mode: str
    bind_addr: str
    ctx_size: int
    n_batch: int
    n_ubatch: int
    flash_attn: bool
    downstream: str | None  # its endpoint
    kv: KvCacheConfig
    codec: str  # activation_codec: how this stage receives its upstream's rows


def read_config(path: str) -> StageConfig:
    try:
        raw = json.loads(Path(path).read_text())
    except OSError as e:
        raise FakeError(f"failed to read stage config {path}: {e.strerror or e}") from None
    except ValueError as e:
        raise FakeError(f"invalid stage config: {e}") from None
    if not isinstance(raw, dict):
        raise FakeError("invalid stage config: expected a JSON object")
    for name in (*REQUIRED, "model_path"):  # model_path is optional in skippy; the fake needs it
        if raw.get(name) is None:
            raise FakeError(f"invalid stage config: missing field {name}")
    if raw["load_mode"] not in LOAD_MODES:
        raise FakeError(f"invalid stage config: unknown load_mode {raw['load_mode']!r}")
    a, b = int(raw["layer_start"]), int(raw["layer_end"])
    if a >= b:
        raise FakeError("layer_start must be less than layer_end")
    if int(raw.get("lane_count", 4)) <= 0:
        raise FakeError("lane_count must be greater than zero")
    kv_raw = raw.get("kv_cache") or {}
    kv = KvCacheConfig(mode=str(kv_raw.get("mode", "auto")), payload=str(kv_raw.get("payload", "auto")),
                       max_entries=int(kv_raw.get("max_entries", 64)), max_bytes=int(kv_raw.get("max_bytes", 0)),
                       min_tokens=int(kv_raw.get("min_tokens", 64)))
    if kv.mode not in ("disabled", "auto", "record", "lookup-record"):
        raise FakeError(f"invalid stage config: unknown kv_cache.mode {kv.mode!r}")
    codec = str(raw.get("activation_codec") or "raw-f32-v1")
    if codec not in CODECS:
        raise FakeError(f"invalid stage config: unknown activation_codec {codec!r}")
    if kv.payload not in PAYLOADS:
        raise FakeError(f"invalid stage config: unknown kv_cache.payload {kv.payload!r}")
    down = raw.get("downstream")
    if down is not None and (not isinstance(down, dict) or not down.get("endpoint")):
        raise FakeError("invalid stage config: missing field endpoint")
    n_batch = int(raw.get("n_batch") or 64)
    return StageConfig(model_id=str(raw["model_id"]), model_path=str(raw["model_path"]), stage_id=str(raw["stage_id"]),
                       stage_index=int(raw["stage_index"]), layer_start=a, layer_end=b, load_mode=raw["load_mode"],
                       bind_addr=str(raw["bind_addr"]), ctx_size=int(raw.get("ctx_size", 512)), n_batch=n_batch,
                       n_ubatch=int(raw.get("n_ubatch") or n_batch),
                       flash_attn=raw.get("flash_attn_type") == "enabled",
                       downstream=str(down["endpoint"]) if down else None, kv=kv, codec=codec)


# ---- commands -----------------------------------------------------------------------------------------------------

class _Stop(BaseException):
    """SIGTERM / SIGINT: stop serving."""


def _on_signal(signum: int, _frame: Any) -> None:
    raise _Stop(signum)


@dataclass
class Process:
    """What a serving process started, to take down on exit."""

    workers: list[StageWorker]
    servers: list[Any]
    dirs: list[Path]

    def close(self) -> None:
        for s in self.servers:
            s.server_close()
        close_workers(self.workers)
        for d in self.dirs:
            shutil.rmtree(d, ignore_errors=True)


def serve_openai(args: argparse.Namespace, proc: Process) -> None:
    who = "serve-openai"
    check_arch(args.model_path)
    model_id = args.model_id or Path(args.model_path).stem
    params = Params(n_ctx=args.ctx_size, n_batch=args.n_batch, n_ubatch=args.n_ubatch or args.n_batch)
    fe = Frontend(model_id, n_ctx=params.n_ctx, n_batch=params.n_batch, default_max_tokens=args.default_max_tokens)
    proc.servers.append(serve_http(args.bind_addr, fe))
    worker = StageWorker("model", params)
    proc.workers.append(worker)
    info = worker.load(args.model_path, last=True)
    fe.node = StageNode(who, worker, layer_start=0, layer_end=int(info["n_layer"]), downstream=None,
                        kv=KvCacheConfig(mode="disabled"))
    log(who, f"fake skippy serving {model_id} ({info['arch']}, {info['n_layer']} layers) on {args.bind_addr}")


def serve_binary(args: argparse.Namespace, proc: Process) -> None:
    cfg = read_config(args.config)
    who = f"stage {cfg.stage_index} ({cfg.stage_id}, layers {cfg.layer_start}..{cfg.layer_end})"
    check_arch(cfg.model_path)
    d = workdir()
    proc.dirs.append(d)
    sf: StageFile = stage_file(cfg.load_mode, cfg.model_path, cfg.layer_start, cfg.layer_end, d)
    params = Params(n_ctx=cfg.ctx_size, n_batch=cfg.n_batch, n_ubatch=cfg.n_ubatch, flash_attn=cfg.flash_attn,
                    codec=cfg.codec)
    fe = None
    if args.openai_bind_addr:
        fe = Frontend(args.openai_model_id or cfg.model_id, n_ctx=params.n_ctx, n_batch=params.n_batch,
                      default_max_tokens=args.openai_default_max_tokens)
        proc.servers.append(serve_http(args.openai_bind_addr, fe))
    worker = StageWorker(f"stage {cfg.stage_index}", params)
    proc.workers.append(worker)
    info = worker.load(sf.path, last=cfg.downstream is None, sf=sf)
    log(who, f"loaded {sf.path.name} ({cfg.load_mode}; {info['n_layer']} stage layers, pads {sf.pads}; "
        f"receives {cfg.codec})")
    link = None
    if cfg.downstream:
        link = Link(cfg.downstream, timeout=args.downstream_connect_timeout_secs)
        hello = link.call({"op": "hello"})
        if not hello.get("ok"):
            raise FakeError(f"downstream stage at {cfg.downstream}: {hello.get('error')}")
        nxt = hello["chain"][0]
        if nxt["layer_start"] != cfg.layer_end:
            raise FakeError(f"downstream stage at {cfg.downstream} starts at layer {nxt['layer_start']}, "
                            f"not at this stage's layer_end {cfg.layer_end}")
        log(who, f"connected downstream {cfg.downstream}: chain {hello['chain']}")
    node = StageNode(who, worker, layer_start=cfg.layer_start, layer_end=cfg.layer_end, downstream=link, kv=cfg.kv)
    server = listen(args.bind_addr or cfg.bind_addr, _TcpServer, _WireHandler)
    server.node = node
    proc.servers.append(server)
    if fe is not None:
        fe.node = node
    log(who, f"fake skippy stage ready on {args.bind_addr or cfg.bind_addr}"
        + (f", OpenAI API on {args.openai_bind_addr}" if fe else ""))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="skippy", description="a FAKE skippy (test double) over the real llama.cpp")
    p.add_argument("--version", action="store_true", help="print the fake's version line")
    sub = p.add_subparsers(dest="command")
    so = sub.add_parser("serve-openai", help="serve the whole model behind the OpenAI routes")
    so.add_argument("--model-path", required=True)
    so.add_argument("--bind-addr", default="127.0.0.1:9337")
    so.add_argument("--model-id")
    so.add_argument("--ctx-size", type=int, default=512)
    so.add_argument("--n-batch", type=int, default=64)
    so.add_argument("--n-ubatch", type=int)
    so.add_argument("--default-max-tokens", type=int, default=16)
    sb = sub.add_parser("serve-binary", help="serve one stage of a split (a StageConfig JSON)")
    sb.add_argument("--config", required=True)
    sb.add_argument("--bind-addr", help="overrides the config's bind_addr")
    sb.add_argument("--openai-bind-addr")
    sb.add_argument("--openai-model-id")
    sb.add_argument("--openai-default-max-tokens", type=int, default=16)
    sb.add_argument("--downstream-connect-timeout-secs", type=float, default=60)
    return p


def main(argv: list[str] | None = None) -> int:
    args, unknown = parser().parse_known_args(argv)
    if args.version:
        print(version_line())
        return 0
    if args.command is None:
        parser().print_usage(sys.stderr)
        sys.stderr.write("skippy: error: a subcommand is required (serve-openai, serve-binary)\n")
        return 2
    if unknown:
        log(args.command, f"ignoring flags the fake does not use: {' '.join(unknown)}")
    proc = Process([], [], [])
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    code = 0
    try:
        bug()  # an unknown bug name is an error before anything starts
        (serve_openai if args.command == "serve-openai" else serve_binary)(args, proc)
        while True:
            time.sleep(3600)
    except _Stop:
        log(args.command, "signalled: shutting down")
    except FakeError as e:
        code = fail(str(e))
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        proc.close()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # daemon threads may be mid-request (or hanging on purpose): do not wait for them


if __name__ == "__main__":
    sys.exit(main())
