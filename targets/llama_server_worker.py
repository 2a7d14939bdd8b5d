"""The llama-server target: a worker that speaks targets/PROTOCOL.md and drives a real llama-server (built from
the pinned llama.cpp by scripts/build_llama_server.sh) over HTTP, for the prefix-cache and radix lanes.

Run as `python -m targets.llama_server_worker`. `load` starts llama-server on the model (slots, context, prompt
cache size, a slot-save directory) and waits until it is healthy; `complete` sends /completion requests,
concurrently if asked; `submit` starts one operation (a streamed completion, a completion disconnected after k
tokens, a slot save, restore or erase) without waiting, and `await` waits for its progress ("prompt": its first
token streamed, i.e. its prompt processed; "done") — the engine orders operations against each other's progress
with these two (fuzz radix). `slots` and `metrics` read the server's own accounts. A llama-server that dies is
reported as an error of kind `server_crash` with its last stderr lines; it dies with its worker (PDEATHSIG).
"""

from __future__ import annotations

import ctypes
import functools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from targets.client import COVERAGE_ENV
from targets.native import cache_dir
from targets.worker_build import DEVICE_BACKENDS, PINNED_LLAMA_CPP_PYTHON, backend_environment, build_commit
from targets.worker_protocol import RequestError, main_with

NO_SERVER = ("no llama-server binary: run scripts/build_llama_server.sh (make server), or set "
             "FAMILY_CERTIFY_LLAMA_SERVER")
# n_batch, n_ubatch: a slot's whole context (llama.cpp pads a sequence's to a multiple of 256) in one ubatch
DEFAULTS = {"slots": 4, "n_ctx": 1024, "cache_ram": 64, "n_batch": 256, "n_ubatch": 256, "threads": 1}


def server_binary(build: bool = False) -> Path | None:
    """FAMILY_CERTIFY_LLAMA_SERVER, else the cached build of the pinned source; None if neither exists. build: the
    pinned one missing while its sdist is cached (`make demo` compiled the libraries only), compile it now — the rest
    of the same CMake build, scripts/build_llama_server.sh, its progress on stderr — as the engine does before the
    first server lane or llama-server oracle needs it (a worker never builds: its calls have timeouts)."""
    env = os.environ.get("FAMILY_CERTIFY_LLAMA_SERVER")
    if env:
        return Path(env) if Path(env).is_file() else None
    path = cache_dir() / f"llama-server-{PINNED_LLAMA_CPP_PYTHON}" / "bin" / "llama-server"  # (build_llama_server.sh)
    sdist = cache_dir() / "sdist" / f"llama_cpp_python-{PINNED_LLAMA_CPP_PYTHON}.tar.gz"
    if not path.is_file() and build and sdist.is_file():
        script = Path(__file__).resolve().parents[1] / "scripts" / "build_llama_server.sh"
        subprocess.run([str(script)], stdout=subprocess.DEVNULL, check=False)
    return path if path.is_file() else None


try:  # looked up here, not in the forked child (where a lock another thread held could stay held)
    _PRCTL = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # not Linux: the process group still takes the server along with a killed worker
    _PRCTL = None


def die_with_parent() -> Callable[[], None]:
    """A preexec_fn, made in the parent: in the child before exec, SIGKILL when the parent dies, however it dies
    (Linux). A parent that died between the fork and the prctl sent no signal: the child, reparented, goes at once."""
    parent = os.getpid()

    def preexec() -> None:
        if _PRCTL is not None:
            _PRCTL(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
            if os.getppid() != parent:
                os.kill(os.getpid(), signal.SIGKILL)
    return preexec


POINTS = ("prompt", "done")  # the progress an operation reports, in order (a slot action has only "done")
OPS = ("complete", "cancel", "save", "restore", "erase")


class Operation:
    """One submitted operation, run on its own thread; `reached` is set per point as the thread sees it."""

    def __init__(self, req: dict) -> None:
        self.req = req
        self.reached = {p: threading.Event() for p in POINTS}
        self.result: dict[str, Any] = {}
        self.t0 = time.monotonic()
        self.at: dict[str, float] = {}

    def mark(self, point: str) -> None:
        if not self.reached[point].is_set():
            self.at[point] = round(time.monotonic() - self.t0, 4)
            self.reached[point].set()


def completion_body(r: dict, *, stream: bool) -> dict:
    """A /completion request: greedy, ignoring EOS, tokens and top-k logprobs returned; a stream is pinned to the
    request's slot (id_slot), a plain request lets the server choose, and may ask for several completions of its
    prompt (n_cmpl: the server's child slots take the parent's state)."""
    body = {"prompt": [int(t) for t in r["prompt"]], "n_predict": int(r.get("n_predict", 8)),
            "cache_prompt": bool(r.get("cache_prompt", True)), "n_probs": int(r.get("n_probs", 2)),
            "temperature": 0.0, "top_k": 1, "seed": 0, "ignore_eos": True, "return_tokens": True, "stream": stream}
    if stream:
        return {**body, "id_slot": int(r.get("slot", -1))}
    return {**body, "n_cmpl": int(r["n_cmpl"])} if int(r.get("n_cmpl", 1)) > 1 else body


def top_of(data: dict) -> list[list[list[float]]]:
    """Per generated token: [[id, logprob], ...] of the top candidates (a response or one streamed chunk)."""
    return [[[int(c["id"]), float(c["logprob"])] for c in step.get("top_logprobs", [])]
            for step in data.get("completion_probabilities", [])]


def answer_of(data: dict) -> dict:
    """One completion of a /completion response: tokens, top, cache_n, id_slot; under speculative decoding the
    draft tokens it verified and accepted (draft_n, draft_n_accepted)."""
    timings = data.get("timings", {})
    return {"tokens": [int(t) for t in data.get("tokens", [])], "top": top_of(data),
            "cache_n": int(timings.get("cache_n", 0)), "id_slot": int(data.get("id_slot", -1)),
            **{k: int(timings[k]) for k in ("draft_n", "draft_n_accepted") if k in timings}}


def embedding_of(data: Any) -> dict:
    """An /embedding response's pooled vector: {embedding: [float]} (a pooling none response, one vector a token:
    the last token's)."""
    first = data[0] if isinstance(data, list) else data
    vec = first.get("embedding", [])
    while vec and isinstance(vec[0], list):
        vec = vec[-1]
    return {"embedding": [float(x) for x in vec]}


PORT_TRIES = 5  # starts of one load whose port another server took first

# Flags that only save start-up time, passed when the binary's --help lists them (another build may not know them):
# `-fit off` skips fitting unset arguments to the device's memory (it reads the model once more first; every
# argument that matters here is set) and `--no-jinja` the jinja chat template's parse (we send token ids to
# /completion, never a chat). The prefix-cache lane starts one server per radix schedule (docs/benchmarks.md).
FAST_START = (("-fit", "off"), ("--no-jinja",))


@functools.cache
def binary_says(binary: str, flag: str) -> tuple[str, str] | str:
    """What this llama-server binary prints for one informational flag, (stdout, stderr), read once; or why it
    could not be run."""
    try:
        r = subprocess.run([binary, flag], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{flag} failed: {e}"
    return r.stdout, r.stderr


def known_flags(binary: str) -> set[str]:
    """The flags this llama-server binary's --help names."""
    said = binary_says(binary, "--help")
    return set() if isinstance(said, str) else set(re.findall(r"(?:^|[\s,])(--?[A-Za-z][\w-]*)", said[0]))


def spec_types(binary: str) -> list[str]:
    """The speculative decoding types this llama-server binary's --help lists for --spec-type (none: it has none)."""
    said = binary_says(binary, "--help")
    m = None if isinstance(said, str) else re.search(r"--spec-type\s+([\w,-]+)", said[0])
    return [t for t in m.group(1).split(",") if t != "none"] if m else []


def fast_start_args(binary: str) -> tuple[str, ...]:
    """The FAST_START flags this llama-server binary knows, in order (from its --help)."""
    known = known_flags(binary)
    return tuple(a for flag in FAST_START if flag[0] in known for a in flag)


# What llama-server says, at trace level (-lv 4), about each slot's prompts and context checkpoints: the line's slot
# and task, then the event. A checkpoint is the state of the parts of the memory that cannot be rolled back (SWA,
# recurrent), saved after n_tokens prompt tokens; restored, it stands for the first n_past tokens of the new prompt.
SLOT_LINE = re.compile(r"slot\s+[^:|]*: id\s+(\d+) \| task (-?\d+) \| (.*)")
CHECKPOINT_EVENTS = {
    "prompt": re.compile(r"^new prompt, n_ctx_slot = \d+, n_keep = -?\d+, task\.n_tokens = (?P<n_tokens>\d+)"),
    "created": re.compile(r"^created context checkpoint \d+ of \d+ \(pos_min = (?P<pos_min>-?\d+), "
                          r"pos_max = (?P<pos_max>-?\d+), n_tokens = (?P<n_tokens>\d+)"),
    "restored": re.compile(r"^restored context checkpoint \(pos_min = (?P<pos_min>-?\d+), pos_max = "
                           r"(?P<pos_max>-?\d+), n_tokens = (?P<n_tokens>\d+), n_past = (?P<n_past>\d+)"),
}


def checkpoint_event(line: str) -> dict[str, Any] | None:
    """One log line as a checkpoint event ({event, slot, task, n_tokens, ...}), or None."""
    m = SLOT_LINE.search(line)
    if not m:
        return None
    for event, rx in CHECKPOINT_EVENTS.items():
        e = rx.match(m.group(3))
        if e:
            return {"event": event, "slot": int(m.group(1)), "task": int(m.group(2)),
                    **{k: int(v) for k, v in e.groupdict().items()}}
    return None


def listed_devices(binary: str) -> str:
    """What this llama-server binary prints for --list-devices."""
    said = binary_says(binary, "--list-devices")
    return said if isinstance(said, str) else said[0] + said[1]


def offload_args(backend: str, devices: str) -> list[str]:
    """The flags that put every layer (and the output) on the first device of the build's backend, as a runtime
    serving on that device runs: none on cpu and blas. `devices`: the binary's --list-devices output. A backend
    with no device listed is a load failure (the build cannot run here)."""
    want = DEVICE_BACKENDS.get(backend)
    if want is None:
        return []
    names = re.findall(rf"^\s*({re.escape(want)}\d+)\s*:", devices, re.M)
    if not names:
        last = next((ln.strip() for ln in reversed(devices.splitlines()) if ln.strip()), "nothing")
        raise RequestError("load_failed", f"backend {backend}: llama-server lists no {want} device on this machine "
                                          f"(--list-devices said: {last})")
    return ["-ngl", "all", "--device", names[0]]


def offload_problem(backend: str, offloaded: str | None) -> str | None:
    """On a device backend, why the server did not put every layer on the device (its "offloaded N/M layers" log
    line, or none): the run would certify the CPU while it names the device. None when it did, or on cpu/blas."""
    if backend not in DEVICE_BACKENDS:
        return None
    m = re.search(r"offloaded (\d+)/(\d+) layers", offloaded or "")
    if m is not None and m.group(1) == m.group(2):
        return None
    return f"backend {backend}: llama-server did not offload every layer ({m.group(0) if m else 'it said nothing'})"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerWorker:
    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.stderr: deque[str] = deque(maxlen=80)
        self.offloaded: str | None = None  # the server's "offloaded N/M layers" log line (load time: scrolls away)
        self.params: dict[str, Any] = {}
        self.decode_seconds = self.callback_seconds = 0.0  # serve() reports them; the server keeps its own
        self.ops: dict[str, Operation] = {}
        self.save_dir: str | None = None
        self.events: list[dict[str, Any]] = []  # checkpoint events (checkpoint_event) since the server started
        self.logged = threading.Condition()

    # ---- ops ---------------------------------------------------------------------------------------
    def op_hello(self, _req: dict) -> dict:
        binary = server_binary()
        return {"protocol": 1, "target": "llama-server", "binary": str(binary) if binary else None,
                "llama_cpp_python": PINNED_LLAMA_CPP_PYTHON, "llama_cpp_commit": build_commit(),
                **({"flags": sorted(known_flags(str(binary))), "spec_types": spec_types(str(binary))}
                   if binary else {})}

    def op_load(self, req: dict) -> dict:
        self._stop()
        binary = server_binary()
        if binary is None:
            raise RequestError("load_failed", NO_SERVER)
        path = req.get("path")
        if not path or not Path(path).is_file():
            raise RequestError("bad_request", f"load: no such file: {path!r}")
        backend = backend_environment()
        offload = offload_args(backend, listed_devices(str(binary)) if backend in DEVICE_BACKENDS else "")
        p = {**DEFAULTS, **{k: req[k] for k in DEFAULTS if k in req}}
        # log_checkpoints: the server logs at trace level, where it says which checkpoint it restored (`checkpoints`)
        trace = ["-lv", "4"] if req.get("log_checkpoints") and "--log-verbosity" in known_flags(str(binary)) else []
        self.save_dir = tempfile.mkdtemp(prefix="llama-server-slots-")
        deadline = time.monotonic() + float(req.get("start_timeout", 60))
        for attempt in range(PORT_TRIES):
            # a free port is free only until someone binds it: another test's or row's server may take it first.
            # Ours then exits ("couldn't bind") and its port answers for that other server — so every start has an
            # alias of its own, checked before the server counts as ours, and a lost port is tried again.
            self.port = free_port()
            alias = f"family-certify-{os.getpid()}-{self.port}-{attempt}"
            argv = [str(binary), "-m", str(path), "--host", "127.0.0.1", "--port", str(self.port), "--alias", alias,
                    "-np", str(p["slots"]), "-c", str(p["n_ctx"]), "--cache-ram", str(p["cache_ram"]),
                    "-b", str(p["n_batch"]), "-ub", str(p["n_ubatch"]), "-t", str(p["threads"]),
                    "-tb", str(p["threads"]), "--no-webui", "--metrics", "--slots", "--no-warmup",
                    "--slot-save-path", self.save_dir, *fast_start_args(str(binary)), *offload, *trace,
                    *[str(a) for a in req.get("args", [])]]
            self.stderr.clear()
            self.offloaded = None
            with self.logged:
                self.events = []
            # in the worker's process group: a worker the engine kills takes its server with it
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.PIPE, preexec_fn=die_with_parent())
            pump = threading.Thread(target=self._pump, args=(self.proc,), daemon=True)
            pump.start()
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    pump.join(timeout=1.0)  # (its last lines say why)
                    if any("couldn't bind" in ln for ln in self.stderr) and attempt + 1 < PORT_TRIES:
                        break  # the port was taken: another one
                    raise RequestError("load_failed", "llama-server exited while loading: " + self._why())
                try:
                    # (a server too old to report its alias in /props is taken at its word)
                    if self._get("/health", timeout=1.0).get("status") == "ok" and \
                            self._get("/props", timeout=1.0).get("model_alias", alias) == alias:
                        waited = time.monotonic() + 1.0  # (the line is the stderr pump's: it may not be read yet)
                        while backend in DEVICE_BACKENDS and self.offloaded is None and time.monotonic() < waited:
                            time.sleep(0.01)
                        problem = offload_problem(backend, self.offloaded)
                        if problem:
                            self._stop()
                            raise RequestError("load_failed", problem)
                        self.params = p
                        return {"target": "llama-server", "port": self.port, "params": p, "argv": argv[1:],
                                "log_checkpoints": bool(trace)}
                except (OSError, ValueError):
                    pass
                time.sleep(0.003)
            else:
                break
        self._stop()
        raise RequestError("load_failed", "llama-server did not become healthy in time: " + self._why())

    def op_complete(self, req: dict) -> dict:
        """requests: [{prompt: [int], n_predict, cache_prompt (true), n_probs (2)}]; concurrent: send them all at
        once (else one after another). Each result: tokens, top (per step: [[id, logprob], ...]), cache_n
        (prompt tokens taken from the cache), id_slot; or error."""
        self._need_server()
        reqs = req.get("requests")
        if not isinstance(reqs, list) or not reqs:
            raise RequestError("bad_request", "complete: 'requests' must be a non-empty list")
        if req.get("concurrent"):
            with ThreadPoolExecutor(max_workers=len(reqs)) as pool:
                results = list(pool.map(self._complete_one, reqs))
        else:
            results = [self._complete_one(r) for r in reqs]
        if self.proc is not None and self.proc.poll() is not None:
            raise RequestError("server_crash", "llama-server died during the requests: " + self._why())
        return {"results": results}

    def op_submit(self, req: dict) -> dict:
        """Start one operation and return at once. name: what `await` calls it; kind: complete (streamed) | cancel
        (streamed, disconnected after `after` tokens) | save | restore | erase (the slot's state, as file
        `file`); slot: the slot it runs on (id_slot); prompt, n_predict, n_probs as for `complete`."""
        self._need_server()
        name, op = str(req.get("name", "")), req.get("kind")
        if not name or name in self.ops:
            raise RequestError("bad_request", f"submit: 'name' must be a new name, got {name!r}")
        if op not in OPS:
            raise RequestError("bad_request", f"submit: 'kind' must be one of {', '.join(OPS)}, got {op!r}")
        if op in ("complete", "cancel") and not isinstance(req.get("prompt"), list):
            raise RequestError("bad_request", f"submit {op}: 'prompt' must be a list of token ids")
        o = self.ops[name] = Operation(req)
        threading.Thread(target=self._run_op, args=(o,), daemon=True).start()
        return {"name": name}

    def op_await(self, req: dict) -> dict:
        """Wait until operation `name` reaches `point` (prompt | done; a slot action's prompt is its done):
        `reached` (the point asked), `at` (seconds since submit, per point reached so far), and for done its
        `result` (as for `complete`; a cancel's tokens are those streamed before it disconnected; a slot
        action's n_tokens or error)."""
        o = self.ops.get(str(req.get("name")))
        point = req.get("point", "done")
        if o is None or point not in POINTS:
            raise RequestError("bad_request", f"await: unknown operation {req.get('name')!r} or point {point!r}")
        if not o.reached[point].wait(float(req.get("timeout", 60))):
            if self.proc is not None and self.proc.poll() is not None:
                raise RequestError("server_crash", "llama-server died during the operations: " + self._why())
            raise RequestError("op_timeout", f"operation {req['name']} did not reach {point!r} in time")
        # what the engine asked is what it learns: an operation already done when its prompt point is awaited is
        # still only "prompt" to the engine (a schedule's concurrency is its script's, not the model's speed)
        return {"reached": point, "at": dict(o.at), **({"result": o.result} if point == "done" else {})}

    def op_slots(self, _req: dict) -> dict:
        self._need_server()
        return {"slots": [{"id": s.get("id"), "is_processing": bool(s.get("is_processing")), "n_ctx": s.get("n_ctx")}
                          for s in self._get("/slots")]}

    def op_metrics(self, _req: dict) -> dict:
        self._need_server()
        with urllib.request.urlopen(self._url("/metrics"), timeout=10) as r:
            text = r.read().decode()
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                try:
                    out[name] = float(value)
                except ValueError:
                    pass
        return {"metrics": out}

    def op_unload(self, _req: dict) -> dict:
        self._stop()
        return {}

    def close(self) -> None:
        """The worker is done: its server goes too."""
        self._stop()

    # ---- helpers ---------------------------------------------------------------------------------
    def _run_op(self, o: Operation) -> None:
        try:
            if o.req["kind"] in ("complete", "cancel"):
                o.result = self._stream(o)
            else:
                o.result = self._slot_action(o.req["kind"], int(o.req.get("slot", 0)), str(o.req.get("file", "x")))
        except Exception as e:  # noqa: BLE001 - whatever happened is the operation's result, never the thread's end
            o.result = {"error": f"{type(e).__name__}: {e}"}
        finally:
            broken = str(o.result.get("error", "")) and not str(o.result["error"]).startswith("HTTP ")
            if (broken or o.result.get("unfinished")) and self._died():  # (an HTTP error: the server answered)
                o.result = {**o.result, "error": "llama-server died: " + self._why(), "server_crash": True}
            o.mark("prompt")
            o.mark("done")

    def _stream(self, o: Operation) -> dict:
        r = o.req
        body = completion_body(r, stream=True)
        after = int(r["after"]) if r["kind"] == "cancel" else None
        tokens: list[int] = []
        top: list[list[list[float]]] = []
        last: dict[str, Any] = {}
        rq = urllib.request.Request(self._url("/completion"), data=json.dumps(body).encode(),
                                    headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(rq, timeout=float(r.get("timeout", 60))) as resp:
                for raw in resp:
                    line = raw.decode(errors="replace").strip()
                    if not line.startswith("data: "):
                        continue
                    chunk = json.loads(line[6:])
                    if "error" in chunk:
                        return {"error": str(chunk["error"]), "tokens": tokens}
                    tokens += [int(t) for t in chunk.get("tokens", [])]
                    top += top_of(chunk)
                    last = chunk
                    if tokens:
                        o.mark("prompt")
                    if after is not None and len(tokens) >= after:
                        break  # the client goes away mid-stream: the server must cancel the task and free the slot
                    if chunk.get("stop"):
                        break
        except urllib.error.HTTPError as e:
            return {"error": f"HTTP {e.code}: {e.read().decode(errors='replace')[:200]}", "tokens": tokens}
        out = {"tokens": tokens, "top": top, "id_slot": int(last.get("id_slot", r.get("slot", -1)))}
        if after is None and not last.get("stop"):
            out["unfinished"] = True  # the stream ended without its last chunk (a server that went away mid-answer)
        if after is None:
            out["cache_n"] = int(last.get("timings", {}).get("cache_n", 0))
        return out

    def _slot_action(self, action: str, slot: int, file: str) -> dict:
        body = {"filename": f"{file}.bin"} if action in ("save", "restore") else {}
        try:
            data = self._post(f"/slots/{slot}?action={action}", body, timeout=60)
        except urllib.error.HTTPError as e:
            return {"error": f"HTTP {e.code}: {e.read().decode(errors='replace')[:200]}"}
        key = {"save": "n_saved", "restore": "n_restored", "erase": "n_erased"}[action]
        if key not in data:  # (llama-server's answer to each action names its own count)
            return {"error": f"the {action} answer names no {key}: {json.dumps(data)[:200]}"}
        return {"n_tokens": int(data[key]), "id_slot": slot}

    def _complete_one(self, r: dict) -> dict:
        body = completion_body(r, stream=False)
        try:
            if r.get("embed"):  # an /embedding of the prompt beside the completions (a server loaded --embeddings)
                return embedding_of(self._post("/embedding", {"content": body["prompt"]},
                                               timeout=float(r.get("timeout", 60))))
            data = self._post("/completion", body, timeout=float(r.get("timeout", 60)))
        except urllib.error.HTTPError as e:
            return {"error": f"HTTP {e.code}: {e.read().decode(errors='replace')[:200]}"}
        except (OSError, ValueError) as e:
            return {"error": f"{type(e).__name__}: {e}"}
        if isinstance(data, list):  # several completions (n_cmpl): the first, the others beside it
            first, *more = [answer_of(d) for d in data] or [{"tokens": [], "top": [], "cache_n": 0, "id_slot": -1}]
            return {**first, "more": more}
        return answer_of(data)

    def _url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def _get(self, path: str, timeout: float = 10.0) -> Any:
        with urllib.request.urlopen(self._url(path), timeout=timeout) as r:
            return json.loads(r.read())

    def _post(self, path: str, body: dict, timeout: float) -> Any:
        rq = urllib.request.Request(self._url(path), data=json.dumps(body).encode(),
                                    headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(rq, timeout=timeout) as r:
            return json.loads(r.read())

    def _need_server(self) -> None:
        if self.proc is None:
            raise RequestError("bad_request", "no server running; send a 'load' request first")
        if self.proc.poll() is not None:
            raise RequestError("server_crash", "llama-server is not running: " + self._why())

    def _died(self, grace: float = 2.0) -> bool:
        """Whether the server exited: asked after an operation failed or its stream broke off, giving a server in the
        middle of aborting the time to exit (it closes its connections before the process is gone)."""
        if self.proc is None:
            return False
        try:
            self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            return False
        return True

    def _why(self) -> str:
        rc = self.proc.poll() if self.proc is not None else None
        how = f"signal {signal.Signals(-rc).name}" if rc is not None and rc < 0 else f"exit code {rc}"
        lines = [ln for ln in self.stderr if any(w in ln.lower() for w in ("error", "failed", "abort", "assert"))]
        return f"{how}; " + (lines[-1] if lines else (self.stderr[-1] if self.stderr else "no output"))

    def op_checkpoints(self, req: dict) -> dict:
        """The server's checkpoint events so far (a server loaded with log_checkpoints). `prompts`: how many prompts
        the caller knows the server began (its completions that reached the prompt point): the events are returned
        once the log says that many (the log is read as the server writes it), or after `timeout` with `complete`
        false."""
        self._need_server()
        want = int(req.get("prompts", 0))
        with self.logged:
            done = self.logged.wait_for(lambda: sum(e["event"] == "prompt" for e in self.events) >= want,
                                        timeout=float(req.get("timeout", 5.0)))
            return {"events": list(self.events), "complete": bool(done)}

    def _pump(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stderr is not None
        for raw in proc.stderr:
            line = raw.decode(errors="replace").rstrip()
            event = checkpoint_event(line)
            if event is not None:
                with self.logged:
                    if proc is self.proc:  # (not a line a server stopped for the next one left in its pipe)
                        self.events.append(event)
                        self.logged.notify_all()
                continue
            self.stderr.append(line)
            if "offloaded" in line and "layers" in line:
                self.offloaded = line

    def _stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            if os.environ.get(COVERAGE_ENV):  # a coverage build's counts are written when it exits, not when killed
                self.proc.terminate()
                try:
                    self.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    pass
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.proc = None
        self.ops = {}
        if self.save_dir:
            shutil.rmtree(self.save_dir, ignore_errors=True)
            self.save_dir = None


def main() -> None:
    main_with(ServerWorker)


if __name__ == "__main__":
    main()
