"""The skippy target: a worker that speaks targets/PROTOCOL.md and drives skippy's own binaries and OpenAI HTTP
(targets/skippy.py names the interface and the config). Run as `python -m targets.skippy_worker CONFIG.toml`.

`load` starts `skippy serve-openai --model-path` on a fixture (the unsplit reference); `split` writes one StageConfig
per stage of a cut set and starts the stages with `serve-binary` — downstream first, each listening before the next
starts, stage 0 last with its OpenAI bind address; `complete` sends greedy /v1/completions to either; `correctness`
runs one skippy-correctness lane and reads its JSON report. Every skippy process of a topology is one process group,
logs one file per process (returned in the replies), and dies with this worker (PDEATHSIG); a topology is stopped
before the next starts and on every exit path.

skippy's OpenAI API takes text prompts and answers text (token-id prompts are read as digit text; no token ids or
logprobs come back): the engine sends prompts skippy's tokenizer reads as the same tokens on both sides, and
compares the answers' text and token counts.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from targets.llama_server_worker import PORT_TRIES, die_with_parent, free_port
from targets.skippy import SkippyConfig, child_env, classify, identity, read_config
from targets.worker_protocol import RequestError, main_with

KV_MODES = ("disabled", "auto", "record", "lookup-record")
KV_PAYLOADS = ("auto", "resident-kv", "kv-recurrent", "full-state")
CODECS = ("raw-f32-v1", "f16-rne-v1", "bf16-rne-v1", "s8-row-f32-rne-v1")  # StageConfig activation_codec


class Topology:
    """The skippy processes of one run (the reference, or one cut set's stages): one process group."""

    def __init__(self, logs: Path, cfg: SkippyConfig):
        self.logs, self.cfg = logs, cfg
        self.procs: list[tuple[str, subprocess.Popen[bytes], Path]] = []
        self.pgid = 0

    def start(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        log = self.logs / f"{name}.log"
        with open(log, "wb") as fh:
            fh.write(("+ " + " ".join(argv) + "\n").encode())
            fh.flush()
            p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT,
                                 process_group=self.pgid, preexec_fn=die_with_parent(), env=child_env(self.cfg))
        self.pgid = self.pgid or p.pid
        self.procs.append((name, p, log))
        return p

    def log_of(self, p: subprocess.Popen[bytes]) -> Path:
        return next(log for _, q, log in self.procs if q is p)

    def exited(self) -> tuple[str, subprocess.Popen[bytes]] | None:
        return next(((n, p) for n, p, _ in self.procs if p.poll() is not None), None)

    def why(self, name: str, p: subprocess.Popen[bytes]) -> str:
        rc = p.poll()
        how = f"signal {signal.Signals(-rc).name}" if rc is not None and rc < 0 else f"exit code {rc}"
        return f"skippy {name} exited ({how}): {last_error(self.log_of(p))}"

    def stop(self) -> None:
        """SIGTERM to the group (skippy shuts down gracefully on it), SIGKILL to what is left after 5 s."""
        # the group is signalled only while one of its processes is unreaped: a group id stays reserved while it
        # has members, and once it has none the number may already be another process's group (pids wrap)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if all(p.poll() is not None for _, p, _ in self.procs):
                break
            try:
                os.killpg(self.pgid, sig)
            except ProcessLookupError:
                pass
            deadline = time.monotonic() + 5
            for _, p, _ in self.procs:
                try:
                    p.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
        self.procs = []


def last_error(log: Path) -> str:
    """The log's last line that says what went wrong (else its last line)."""
    try:
        lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()
                 and not ln.startswith("+ ")]
    except OSError:
        return "no log"
    bad = [ln for ln in lines if any(w in ln.lower() for w in ("error", "unsupported", "failed", "panic", "abort"))]
    return (bad or lines or ["no output"])[-1][:300]


def http(method: str, url: str, body: dict | None = None, timeout: float = 10.0) -> tuple[int, Any]:
    """(status, parsed JSON body) — an HTTP error status is returned, not raised."""
    data = json.dumps(body).encode() if body is not None else None
    rq = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(rq, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            return e.code, json.loads(raw)
        except ValueError:
            return e.code, {"error": {"message": raw.decode(errors="replace")[:300]}}


def listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


class PortLost(Exception):
    """A process of ours could not bind its port: another process took it after free_port() freed it."""


BIND_LOST = ("address already in use", "os error 98", "eaddrinuse")  # skippy's (Rust) and the fake's words


def held_by(port: int, pgid: int) -> bool | None:
    """Whether the TCP socket listening on `port` belongs to a process of group `pgid` (None: no /proc to ask, or
    nothing listens yet). A free port is free only until someone binds it: under parallel rows or tests another
    server can take it between our pick and our process's bind, and then answers on it for ours."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            f = row.split()
            if len(f) > 9 and f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                inodes.add(f"socket:[{f[9]}]")
    if not inodes:
        return None
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if int(proc.joinpath("stat").read_text().rsplit(")", 1)[1].split()[2]) != pgid:  # (pgrp, after comm)
                continue
            if any(os.readlink(fd) in inodes for fd in proc.joinpath("fd").iterdir()):
                return True
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile, or not ours to read
    return False


class SkippyWorker:
    def __init__(self) -> None:
        if len(sys.argv) < 2:
            raise SystemExit("usage: python -m targets.skippy_worker CONFIG.toml")
        self.cfg = read_config(sys.argv[1])
        if self.cfg.logs is not None:
            self.cfg.logs.mkdir(parents=True, exist_ok=True)
        self.logs = Path(tempfile.mkdtemp(prefix="family-certify-skippy-", dir=self.cfg.logs))
        self.keep = self.cfg.logs is not None  # a temporary log directory goes at exit unless something failed
        self.runs = 0
        self.reference: Topology | None = None
        self.split: Topology | None = None
        self.ports: dict[str, int] = {}
        self.model_id = ""
        self._digests: dict[tuple[Path, int], str] = {}  # a fixture's sha256, read once
        self._source: tuple[Path, Any] | None = None  # the fixture artifact-slice stages are cut from, read once
        self.decode_seconds = self.callback_seconds = 0.0

    # ---- ops ---------------------------------------------------------------------------------------
    def op_hello(self, _req: dict) -> dict:
        return {"protocol": 1, "target": "skippy", "config": str(self.cfg.path), "skippy": identity(self.cfg.path),
                "load_mode": self.cfg.load_mode, "logs": str(self.logs)}

    def op_load(self, req: dict) -> dict:
        """The unsplit reference: `serve-openai --model-path` on the fixture, until its /v1/models answers."""
        path = self._model(req)
        self._stop("reference")
        self.model_id = str(req.get("model_id") or "fixture")

        def start() -> dict:
            top = self.reference = self._topology("reference")
            port = self.ports["reference"] = free_port()
            argv = [str(self.cfg.binary), "serve-openai", "--model-path", str(path), "--bind-addr",
                    f"127.0.0.1:{port}", "--model-id", self.model_id, "--ctx-size", str(self.cfg.stage["ctx_size"])]
            top.start("serve-openai", argv)
            self._ready(top, port, "serve-openai")
            return {"target": "skippy", "port": port, "argv": argv[1:], "logs": self._logs(top)}
        return self._on_free_ports(start)

    def op_split(self, req: dict) -> dict:
        """One cut set's stages: a StageConfig per stage, started downstream first; stage 0 last with its OpenAI
        bind address. kv_cache: the StageConfig's kv_cache object (mode, payload, min_tokens, ...)."""
        path = self._model(req)
        cuts = req.get("cuts")
        n_layer = int(req.get("n_layer", 0))
        if not isinstance(cuts, list) or not cuts or not all(0 < int(c) < n_layer for c in cuts):
            raise RequestError("bad_request", f"split: 'cuts' must be cut layers in 1..n_layer-1, got {cuts!r}")
        codec = str(req.get("activation_codec", "raw-f32-v1"))
        if codec not in CODECS:
            raise RequestError("bad_request", f"split: activation_codec {codec!r}: one of {', '.join(CODECS)}")
        kv = dict(req.get("kv_cache") or {"mode": "disabled"})
        if kv.get("mode") not in KV_MODES or kv.get("payload", "auto") not in KV_PAYLOADS:
            raise RequestError("bad_request", f"split: kv_cache {kv!r}: mode {KV_MODES}, payload {KV_PAYLOADS}")
        self._stop("split")
        self.model_id = str(req.get("model_id") or "fixture")

        def start() -> dict:
            top = self.split = self._topology("split")
            bounds = [0, *sorted(int(c) for c in cuts), n_layer]
            ports = [free_port() for _ in range(len(bounds) - 1)]
            configs = []

            def peer(j: int) -> dict[str, Any]:
                return {"stage_id": f"stage-{j}", "stage_index": j, "endpoint": f"tcp://127.0.0.1:{ports[j]}"}

            for i in range(len(bounds) - 1):
                configs.append({
                    "run_id": f"family-certify-{self.runs}", "topology_id": f"cuts-{'-'.join(map(str, cuts))}",
                    "model_id": self.model_id, "model_path": str(self._artifact(path, bounds[i], bounds[i + 1])),
                    "stage_id": f"stage-{i}", "stage_index": i,
                    "layer_start": bounds[i], "layer_end": bounds[i + 1], "load_mode": self.cfg.load_mode,
                    "bind_addr": f"127.0.0.1:{ports[i]}", **self.cfg.stage, "activation_codec": codec,
                    "upstream": peer(i - 1) if i > 0 else None,
                    "downstream": peer(i + 1) if i + 1 < len(ports) else None,
                    "kv_cache": {"max_entries": 64, "max_bytes": 0, "min_tokens": 64, "payload": "auto", **kv}})
            stages = []
            for i in reversed(range(len(configs))):
                cfg_path = top.logs / f"stage-{i}.json"
                cfg_path.write_text(json.dumps(configs[i], indent=2) + "\n")
                argv = [str(self.cfg.binary), "serve-binary", "--config", str(cfg_path)]
                if i == 0:
                    self.ports["split"] = free_port()
                    argv += ["--openai-bind-addr", f"127.0.0.1:{self.ports['split']}", "--openai-model-id",
                             self.model_id]
                p = top.start(f"stage-{i}", argv)
                if i > 0:
                    self._wait(top, ports[i], lambda port=ports[i]: listening(port), f"stage-{i}")
                stages.insert(0, {"stage_index": i, "layer_start": bounds[i], "layer_end": bounds[i + 1],
                                  "config": str(cfg_path), "log": str(top.log_of(p))})
            self._ready(top, self.ports["split"], "stage-0")
            return {"stages": stages, "port": self.ports["split"], "logs": self._logs(top)}
        return self._on_free_ports(start)

    def op_complete(self, req: dict) -> dict:
        """requests: [{prompt (text), max_tokens}]; via: reference | split; concurrent: all at once. Each result:
        text, completion_tokens, prompt_tokens, cached_tokens, finish_reason — or error and its outcome."""
        via = req.get("via", "split")
        top = self.reference if via == "reference" else self.split
        if via not in ("reference", "split") or top is None or not top.procs:
            raise RequestError("bad_request", f"complete: no {via!r} running; send 'load' or 'split' first")
        reqs = req.get("requests")
        if not isinstance(reqs, list) or not reqs:
            raise RequestError("bad_request", "complete: 'requests' must be a non-empty list")
        port = self.ports[via]
        if req.get("concurrent"):
            with ThreadPoolExecutor(max_workers=len(reqs)) as pool:
                results = list(pool.map(lambda r: self._complete_one(port, r), reqs))
        else:
            results = [self._complete_one(port, r) for r in reqs]
        gone = top.exited()
        if gone:
            raise RequestError("server_crash", top.why(*gone))
        return {"results": results, "logs": self._logs(top)}

    def op_correctness(self, req: dict) -> dict:
        """One skippy-correctness lane on the fixture: lane, args (its own flags). Results: outcome (pass |
        mismatch | unsupported | model-invalid | timeout | harness | runtime-error), exit_code, report (the parsed
        JSON, or None), note, log."""
        if self.cfg.correctness is None:
            raise RequestError("bad_request", f"skippy config {self.cfg.path}: no [skippy] correctness binary")
        path = self._model(req)
        lane = str(req.get("lane", ""))
        top = self._topology(lane)
        report_path, log = top.logs / f"{lane}.json", top.logs / f"{lane}.log"
        argv = [str(self.cfg.correctness), lane, "--model", str(path), "--model-id", str(req.get("model_id") or
                "fixture"), "--stage-server-bin", str(self.cfg.binary), "--stage-load-mode", self.cfg.load_mode,
                "--ctx-size", str(self.cfg.stage["ctx_size"]), "--startup-timeout-secs",
                str(int(self.cfg.timeouts["ready"])), "--report-out", str(report_path),
                *[str(a) for a in req.get("args", [])]]
        p = top.start(lane, argv)
        t0 = time.monotonic()
        try:
            p.wait(timeout=self.cfg.timeouts["lane"])
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
        top.stop()
        text = log.read_text(errors="replace")
        res: dict[str, Any] = {"exit_code": p.returncode, "log": str(log), "seconds": round(time.monotonic() - t0, 2),
                               "argv": argv[1:]}
        if timed_out:
            self.keep = True
            return {**res, "outcome": "timeout", "report": None,
                    "note": f"skippy-correctness {lane} timed out after {self.cfg.timeouts['lane']:g} s"}
        report, problem = read_report(report_path, lane)
        if report is None:
            note = problem if p.returncode == 0 else last_error(log)
            outcome = "harness" if p.returncode == 0 else classify(text, note)
        elif problem:
            outcome, note = "harness", problem
        elif report_ok(report) and p.returncode == 0:
            outcome, note = "pass", ""
        elif not report_ok(report):
            outcome, note = "mismatch", last_error(log)
        else:  # the report says it matched, the exit code says it failed: skippy's own words decide
            outcome, note = classify(text, last_error(log)), last_error(log)
        self.keep = self.keep or outcome != "pass"
        return {**res, "outcome": outcome, "report": report, "note": note}

    def op_keep_logs(self, _req: dict) -> dict:
        """The engine found something in the answers: keep this worker's logs (reports name them)."""
        self.keep = True
        return {"logs": str(self.logs)}

    def op_unload(self, _req: dict) -> dict:
        self._stop("reference")
        self._stop("split")
        return {}

    def close(self) -> None:
        self.op_unload({})
        if not self.keep:
            shutil.rmtree(self.logs, ignore_errors=True)

    # ---- helpers ---------------------------------------------------------------------------------
    def _model(self, req: dict) -> Path:
        path = req.get("path")
        if not path or not Path(path).exists():
            raise RequestError("bad_request", f"no such model file: {path!r}")
        return Path(path)

    def _artifact(self, path: Path, a: int, b: int) -> Path:
        """What a stage's model_path names in the config's load mode: the whole GGUF (runtime-slice: skippy slices
        it), a layer package of it (layer-package: `synth package`, the v1 format, made once per fixture) or the
        stage's own GGUF (artifact-slice: synth.stage, the slicer our sweep certifies)."""
        from synth.errors import UserError

        if self.cfg.load_mode == "runtime-slice":
            return path
        d = self.logs / "artifacts" / f"{path.stem}-{self._digest(path)[:12]}"
        try:
            if self.cfg.load_mode == "layer-package":
                pkg = d / "package"
                if not (pkg / "model-package.json").is_file():
                    from synth.package import write_package

                    write_package(path, pkg, model_id=self.model_id)
                return pkg
            from synth.stage import SourceModel, Unsupported

            dst = d / f"stage-{a}-{b}.gguf"
            if not dst.is_file():
                d.mkdir(parents=True, exist_ok=True)
                try:
                    if self._source is None or self._source[0] != d:
                        self._source = (d, SourceModel(path))  # read once for all of a fixture's stages
                    self._source[1].slice(dst, a, b)
                except Unsupported as e:
                    raise RequestError("load_failed", f"Unsupported: stage {a}:{b}: {e} (artifact-slice: the "
                                                      f"stage file cannot be made)") from None
            return dst
        except UserError as e:
            raise RequestError("bad_request", f"{self.cfg.load_mode} artifact of {path}: {e}") from None

    def _digest(self, path: Path) -> str:
        key = (path, path.stat().st_mtime_ns)
        if key not in self._digests:
            self._digests[key] = hashlib.sha256(path.read_bytes()).hexdigest()
        return self._digests[key]

    def _topology(self, kind: str) -> Topology:
        self.runs += 1
        d = self.logs / f"run-{self.runs}-{kind}"
        d.mkdir()
        return Topology(d, self.cfg)

    def _stop(self, kind: str) -> None:
        top = getattr(self, kind)
        if top is not None:
            top.stop()
        setattr(self, kind, None)

    def _on_free_ports(self, start: Callable[[], dict]) -> dict:
        """start() again on other free ports while one of its processes lost its port to another process."""
        for attempt in range(PORT_TRIES):
            try:
                return start()
            except PortLost as e:
                if attempt + 1 == PORT_TRIES:
                    self.keep = True
                    raise RequestError("load_failed", f"{e} (in each of {PORT_TRIES} tries on other ports)") from None
        raise AssertionError("unreachable")

    def _wait(self, top: Topology, port: int, ok: Callable[[], bool], name: str) -> None:
        """Until ok() on `port` held by a process of the topology; a process that exits is a failed load, or a lost
        port (PortLost: the caller starts again elsewhere) when its log says another process had bound it."""
        deadline = time.monotonic() + self.cfg.timeouts["ready"]
        while time.monotonic() < deadline:
            gone = top.exited()
            if gone:
                why = top.why(*gone)
                top.stop()
                if any(w in why.lower() for w in BIND_LOST):
                    raise PortLost(why)
                self.keep = True
                raise RequestError("load_failed", why)
            if ok() and held_by(port, top.pgid) is not False:  # (another's server answering on our port: wait)
                return
            time.sleep(0.05)
        logs = self._logs(top)
        top.stop()
        self.keep = True
        raise RequestError("timeout", f"skippy {name} did not become ready in {self.cfg.timeouts['ready']:g} s "
                                      f"(logs: {logs[-1] if logs else 'none'})")

    def _ready(self, top: Topology, port: int, name: str) -> None:
        def models() -> bool:
            try:
                status, _ = http("GET", f"http://127.0.0.1:{port}/v1/models", timeout=2.0)
                return 200 <= status < 300
            except (OSError, ValueError):
                return False
        self._wait(top, port, models, name)

    def _complete_one(self, port: int, r: dict) -> dict:
        body = {"model": self.model_id, "prompt": str(r["prompt"]), "max_tokens": int(r.get("max_tokens", 8)),
                "temperature": 0.0, "seed": 0, "top_k": 1, "stream": False}
        try:
            status, data = http("POST", f"http://127.0.0.1:{port}/v1/completions", body,
                                timeout=self.cfg.timeouts["request"])
        except TimeoutError:
            return {"error": f"/v1/completions timed out after {self.cfg.timeouts['request']:g} s",
                    "outcome": "timeout"}
        except (OSError, ValueError) as e:
            timed_out = isinstance(getattr(e, "reason", None), TimeoutError)
            return {"error": f"/v1/completions: {type(e).__name__}: {e}" + (" (timed out)" if timed_out else ""),
                    "outcome": "timeout" if timed_out else "runtime-error"}
        if status != 200:
            msg = (data or {}).get("error", {}).get("message", str(data)) if isinstance(data, dict) else str(data)
            return {"error": f"HTTP {status}: {msg}", "outcome": classify("", msg)}
        try:
            choice, usage = data["choices"][0], data.get("usage") or {}
            return {"text": str(choice["text"]), "finish_reason": choice.get("finish_reason"),
                    "completion_tokens": usage.get("completion_tokens"), "prompt_tokens": usage.get("prompt_tokens"),
                    "cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens")}
        except (KeyError, IndexError, TypeError) as e:
            return {"error": f"/v1/completions answer is not an OpenAI completion ({type(e).__name__}: {e})",
                    "outcome": "harness"}

    def _logs(self, top: Topology) -> list[str]:
        return [str(log) for _, _, log in top.procs]


# what each lane's report must hold (report keys of crates/skippy-correctness src/report.rs @ 9e9c1198)
REPORT_KEYS = {"split-scan": ("status", "results", "mismatch_count"), "state-handoff": ("status", "matches",
               "predicted_token_matches", "cache_hit_matches", "payload_digest")}


def read_report(path: Path, lane: str) -> tuple[dict | None, str]:
    """The lane's JSON report and what is wrong with its shape ("" if nothing): a report without the keys its lane
    promises is a harness outcome, never a pass."""
    if not path.is_file():
        return None, f"skippy-correctness wrote no report ({path.name})"
    try:
        rep = json.loads(path.read_text())
    except ValueError as e:
        return None, f"report {path.name} is not JSON ({e})"
    if not isinstance(rep, dict):
        return None, f"report {path.name} is not a JSON object"
    missing = [k for k in REPORT_KEYS.get(lane, ("status", "matches")) if k not in rep]
    if lane == "split-scan" and not missing and (not isinstance(rep["results"], list) or not rep["results"]
                                                 or any("matches" not in r for r in rep["results"])):
        missing = ["results[].matches"]
    if missing:
        return rep, f"report {path.name} lacks {', '.join(missing)}: not a skippy-correctness {lane} report"
    if rep.get("status") not in ("pass", "fail"):
        return rep, f"report {path.name}: status {rep.get('status')!r} is neither pass nor fail"
    return rep, ""


def report_ok(rep: dict) -> bool:
    if "results" in rep and "matches" not in rep:
        return rep["status"] == "pass" and all(r.get("matches") is True for r in rep["results"])
    return rep["status"] == "pass" and rep.get("matches") is True


def main() -> None:
    main_with(SkippyWorker, llama=False)


if __name__ == "__main__":
    main()
