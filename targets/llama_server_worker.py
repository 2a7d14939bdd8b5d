"""The llama-server target: a worker that speaks targets/PROTOCOL.md and drives a real llama-server (built from
the pinned llama.cpp by scripts/build_llama_server.sh) over HTTP, for the prefix-cache lane.

Run as `python -m targets.llama_server_worker`. `load` starts llama-server on the model (slots, context, prompt
cache size) and waits until it is healthy; `complete` sends /completion requests, concurrently if asked (several
slots busy at once: the schedule the prefix cache must survive); `slots` and `metrics` read the server's own
accounts. A llama-server that dies is reported as an error of kind `server_crash` with its last stderr lines.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from targets.llama_cpp_worker import PINNED_LLAMA_CPP_PYTHON, RequestError, build_commit, main_with
from targets.native import cache_dir

DEFAULTS = {"slots": 4, "n_ctx": 1024, "cache_ram": 64, "n_batch": 64, "n_ubatch": 64, "threads": 1}


def server_binary() -> Path | None:
    """FAMILY_CERTIFY_LLAMA_SERVER, else the cached build of the pinned source; None if neither exists."""
    env = os.environ.get("FAMILY_CERTIFY_LLAMA_SERVER")
    if env:
        return Path(env) if Path(env).is_file() else None
    path = cache_dir() / f"llama-server-{PINNED_LLAMA_CPP_PYTHON}" / "bin" / "llama-server"  # (build_llama_server.sh)
    return path if path.is_file() else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerWorker:
    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.stderr: deque[str] = deque(maxlen=80)
        self.params: dict[str, Any] = {}
        self.decode_seconds = self.callback_seconds = 0.0  # serve() reports them; the server keeps its own

    # ---- ops ---------------------------------------------------------------------------------------
    def op_hello(self, _req: dict) -> dict:
        binary = server_binary()
        return {"protocol": 1, "target": "llama-server", "binary": str(binary) if binary else None,
                "llama_cpp_python": PINNED_LLAMA_CPP_PYTHON, "llama_cpp_commit": build_commit()}

    def op_load(self, req: dict) -> dict:
        self._stop()
        binary = server_binary()
        if binary is None:
            raise RequestError("load_failed", "no llama-server binary: run scripts/build_llama_server.sh (or set "
                               "FAMILY_CERTIFY_LLAMA_SERVER)")
        path = req.get("path")
        if not path or not Path(path).is_file():
            raise RequestError("bad_request", f"load: no such file: {path!r}")
        p = {**DEFAULTS, **{k: req[k] for k in DEFAULTS if k in req}}
        self.port = free_port()
        argv = [str(binary), "-m", str(path), "--host", "127.0.0.1", "--port", str(self.port),
                "-np", str(p["slots"]), "-c", str(p["n_ctx"]), "--cache-ram", str(p["cache_ram"]),
                "-b", str(p["n_batch"]), "-ub", str(p["n_ubatch"]), "-t", str(p["threads"]),
                "-tb", str(p["threads"]), "--no-webui", "--metrics", "--slots", "--no-warmup",
                *[str(a) for a in req.get("args", [])]]
        self.stderr.clear()
        # in the worker's process group: a worker the engine kills takes its server with it
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE)
        threading.Thread(target=self._pump, args=(self.proc,), daemon=True).start()
        deadline = time.monotonic() + float(req.get("start_timeout", 60))
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RequestError("load_failed", "llama-server exited while loading: " + self._why())
            try:
                if self._get("/health", timeout=1.0).get("status") == "ok":
                    self.params = p
                    return {"target": "llama-server", "port": self.port, "params": p, "argv": argv[1:]}
            except (OSError, ValueError):
                pass
            time.sleep(0.02)
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

    def op_slots(self, _req: dict) -> dict:
        self._need_server()
        return {"slots": [{"id": s.get("id"), "is_processing": bool(s.get("is_processing"))}
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
    def _complete_one(self, r: dict) -> dict:
        body = {"prompt": [int(t) for t in r["prompt"]], "n_predict": int(r.get("n_predict", 8)),
                "cache_prompt": bool(r.get("cache_prompt", True)), "n_probs": int(r.get("n_probs", 2)),
                "temperature": 0.0, "top_k": 1, "seed": 0, "ignore_eos": True, "return_tokens": True,
                "stream": False}
        try:
            data = self._post("/completion", body, timeout=float(r.get("timeout", 60)))
        except urllib.error.HTTPError as e:
            return {"error": f"HTTP {e.code}: {e.read().decode(errors='replace')[:200]}"}
        except (OSError, ValueError) as e:
            return {"error": f"{type(e).__name__}: {e}"}
        top = [[[int(c["id"]), float(c["logprob"])] for c in step.get("top_logprobs", [])]
               for step in data.get("completion_probabilities", [])]
        return {"tokens": [int(t) for t in data.get("tokens", [])], "top": top,
                "cache_n": int(data.get("timings", {}).get("cache_n", 0)), "id_slot": int(data.get("id_slot", -1))}

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

    def _why(self) -> str:
        rc = self.proc.poll() if self.proc is not None else None
        how = f"signal {signal.Signals(-rc).name}" if rc is not None and rc < 0 else f"exit code {rc}"
        lines = [ln for ln in self.stderr if any(w in ln.lower() for w in ("error", "failed", "abort", "assert"))]
        return f"{how}; " + (lines[-1] if lines else (self.stderr[-1] if self.stderr else "no output"))

    def _pump(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stderr is not None
        for raw in proc.stderr:
            self.stderr.append(raw.decode(errors="replace").rstrip())

    def _stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None


def main() -> None:
    main_with(ServerWorker)


if __name__ == "__main__":
    main()
