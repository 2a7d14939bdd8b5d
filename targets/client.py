"""The engine side of the protocol: a worker process that may abort, segfault or hang.

Every call returns a Reply. A crash or a timeout is a Failure inside the Reply (with the request that
caused it and the worker's last stderr lines), never an exception; the next call starts a fresh worker
and replays the last successful `load` first, so the engine keeps going.
"""

from __future__ import annotations

import base64
import json
import os
import select
import signal
import subprocess
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from synth.errors import UserError

DEFAULT_TIMEOUT = 120.0
# The engine's pid, in every worker's environment: a worker whose engine died before the worker looked (still
# starting) knows it is orphaned without having seen its engine as its parent (targets/PROTOCOL.md).
ENGINE_PID = "FAMILY_CERTIFY_ENGINE_PID"
# Set in every worker's environment: the engine reads frames (a reply's bytes raw after its line, not base64 in it);
# a worker that does not know it answers in base64, which reads the same (targets/PROTOCOL.md, Frames).
FRAMES = "FAMILY_CERTIFY_FRAMES"
COVERAGE_ENV = "FAMILY_CERTIFY_COVERAGE"  # set (targets/builds.py) when the workers run a coverage build
# set by a coverage run: each row's processes write their counts under this directory / the row's name (GCOV_PREFIX)
ROW_COUNTS_ENV = "FAMILY_CERTIFY_ROW_COUNTS"
EXIT_WAIT = 5.0  # seconds a closed worker gets to exit before it is killed
# a coverage build's worker writes its counts as it exits (every library's, merged under a lock into files other
# exiting workers write too): killed before it is done, its counts are lost — so it gets as long as it takes
COVERAGE_EXIT_WAIT = 120.0
_INFORMATIVE = ("GGML_ASSERT", "GGML_ABORT", "error", "Error", "terminate", "Assertion", "fault", "abort",
                "double free", "corruption", "unsupported")


@dataclass
class Failure:
    kind: str  # crash | timeout | error (the target refused the request) | protocol
    message: str  # one line
    op: str
    request: dict[str, Any] = field(repr=False)
    returncode: int | None = None
    error_kind: str | None = None  # for kind == "error": load_failed, decode_failed, bad_request, ...
    stderr_tail: list[str] = field(default_factory=list, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "message": self.message, "op": self.op, "returncode": self.returncode,
                "error_kind": self.error_kind, "request": elide(self.request), "stderr_tail": self.stderr_tail}


@dataclass
class Reply:
    ok: bool
    data: dict[str, Any]
    failure: Failure | None = None
    request: dict[str, Any] = field(default_factory=dict, repr=False)  # what was asked (op and arguments)


def elide(req: dict[str, Any], limit: int = 200) -> dict[str, Any]:
    """The request with long strings (base64 blobs) shortened, for reports and messages."""
    out = {}
    for k, v in req.items():
        if isinstance(v, str) and len(v) > limit:
            out[k] = f"<{len(v)} chars>"
        elif isinstance(v, list) and len(v) > 64:
            out[k] = v[:64] + [f"... {len(v) - 64} more"]
        else:
            out[k] = v
    return out


class WorkerClient:
    def __init__(self, argv: list[str], *, timeout: float = DEFAULT_TIMEOUT, env: dict[str, str] | None = None,
                 name: str = "target"):
        self.argv = argv
        self.timeout = timeout
        self.env = env
        self.name = name
        self.proc: subprocess.Popen[str] | None = None
        self._out = bytearray()  # bytes read from the worker's stdout, not yet a whole line
        self.stderr: deque[str] = deque(maxlen=60)
        self.next_id = 0
        self.restarts = 0
        self.starts = 0
        self.load_request: dict[str, Any] | None = None  # replayed into a restarted worker
        self.in_flight = 0  # calls waiting for their replies (another thread's, e.g. a load started early)
        self._flight_lock = threading.Lock()

    # ---- lifecycle -------------------------------------------------------------------------------
    def _start(self) -> None:
        try:
            self.proc = subprocess.Popen(
                self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                bufsize=1, env={**os.environ, **(self.env or {}), ENGINE_PID: str(os.getpid()), FRAMES: "1"},
                start_new_session=True)
        except OSError as e:
            raise UserError(f"target {self.name}: cannot start {self.argv[0]!r} ({e.strerror or e}); "
                            "install it or fix --target") from None
        self.starts += 1
        self._out = bytearray()
        self.stderr = deque(maxlen=60)
        self._stderr_pump = threading.Thread(target=_pump, args=(self.proc.stderr, self._stderr_line), daemon=True)
        self._stderr_pump.start()

    def _stderr_line(self, line: str | None) -> None:
        if line is not None:
            self.stderr.append(line.rstrip("\n"))

    def _ensure(self) -> Reply | None:
        if self.proc is not None and self.proc.poll() is None:
            return None
        if self.proc is not None:
            self.restarts += 1
        self._start()
        if self.load_request is not None:  # put the restarted worker back where it was
            reply = self._roundtrip(dict(self.load_request), self.timeout)
            if not reply.ok:
                return reply
        return None

    def start(self) -> Reply | None:
        """Spawn the worker now (calls otherwise spawn it lazily); returns a failed replayed load, if any."""
        return self._ensure()

    def close(self) -> None:
        self.request_close()
        self.wait_closed()

    def request_close(self) -> None:
        """Ask the worker to exit without waiting for it (close many workers in parallel)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            self.proc.stdin.write(json.dumps({"id": -1, "op": "shutdown"}) + "\n")
            self.proc.stdin.flush()
            self.proc.stdin.close()
        except (OSError, ValueError):
            self._kill()

    def wait_closed(self, timeout: float | None = None) -> None:
        if self.proc is None:
            return
        if timeout is None:
            timeout = COVERAGE_EXIT_WAIT if os.environ.get(COVERAGE_ENV) else EXIT_WAIT
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self._kill()
        self.proc = None

    def _kill(self) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass

    def __enter__(self) -> WorkerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- calls -----------------------------------------------------------------------------------
    def _flying(self, n: int) -> None:
        with self._flight_lock:
            self.in_flight += n

    def call(self, op: str, *, timeout: float | None = None, **args: Any) -> Reply:
        self._flying(1)
        try:
            failed = self._ensure()
            if failed is not None:
                return failed
            reply = self._roundtrip({"op": op, **args}, timeout or self.timeout)
            self._note(reply)
            return reply
        finally:
            self._flying(-1)

    def calls(self, requests: list[tuple[str, dict[str, Any]]], *, timeout: float | None = None) -> list[Reply]:
        """Several requests sent at once: the worker runs them back to back while their replies are read (no
        idle worker between them). The replies in order, up to and including the first that failed; each
        request has the per-call timeout from the previous reply on."""
        self._flying(1)
        try:
            return self._calls(requests, timeout)
        finally:
            self._flying(-1)

    def _calls(self, requests: list[tuple[str, dict[str, Any]]], timeout: float | None) -> list[Reply]:
        failed = self._ensure()
        if failed is not None:
            return [failed]
        assert self.proc is not None and self.proc.stdin is not None
        msgs = []
        for op, args in requests:
            self.next_id += 1
            msgs.append({"id": self.next_id, "op": op, **args})
        payload = "".join(json.dumps(m) + "\n" for m in msgs)
        stdin = self.proc.stdin

        def write() -> None:  # on its own thread: a full pipe must not stop us reading replies
            try:
                stdin.write(payload)
                stdin.flush()
            except (OSError, ValueError):
                pass  # the worker is gone; reading its replies reports how

        threading.Thread(target=write, daemon=True).start()
        replies: list[Reply] = []
        for m in msgs:
            reply = self._receive(m["id"], {k: v for k, v in m.items() if k != "id"}, timeout or self.timeout)
            self._note(reply)
            replies.append(reply)
            if not reply.ok:
                break
        if not replies[-1].ok and replies[-1].failure is not None and replies[-1].failure.kind == "error":
            for m in msgs[len(replies):]:  # the worker still answers the rest: read them, keep the stream clean
                self._receive(m["id"], m, timeout or self.timeout)
        return replies

    def _note(self, reply: Reply) -> None:
        """Remember the last successful load, to replay into a restarted worker."""
        req = reply.request
        if req.get("op") == "load":
            self.load_request = dict(req) if reply.ok else None
        elif req.get("op") == "unload" and reply.ok:
            self.load_request = None

    def _roundtrip(self, req: dict[str, Any], timeout: float) -> Reply:
        self.next_id += 1
        rid = self.next_id
        msg = {"id": rid, **req}
        assert self.proc is not None and self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(msg) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            return self._crashed(str(req.get("op")), req)
        return self._receive(rid, req, timeout)

    def _receive(self, rid: int, req: dict[str, Any], timeout: float) -> Reply:
        """The reply to request rid (req: the request, for failures)."""
        op = str(req.get("op"))
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self._kill()
                why = f"{self.name} did not answer '{op}' within {timeout:g}s (killed)"
                return Reply(False, {}, Failure("timeout", why, op, req, stderr_tail=list(self.stderr)), request=req)
            line = self._readline(remaining)
            if line is _WAIT:
                continue
            if line is None:
                return self._crashed(op, req)
            try:
                resp = json.loads(line)
            except json.JSONDecodeError:
                self._kill()
                why = f"{self.name} wrote a non-JSON line: {line[:120]!r}"
                return Reply(False, {}, Failure("protocol", why, op, req, stderr_tail=list(self.stderr)), request=req)
            if "$frames" in resp:
                blobs = self._read_frames([int(n) for n in resp.pop("$frames")], deadline)
                if blobs is None:
                    return self._crashed(op, req)
                if blobs is _WAIT:
                    self._kill()
                    why = f"{self.name} did not finish its answer to '{op}' within {timeout:g}s (killed)"
                    return Reply(False, {}, Failure("timeout", why, op, req, stderr_tail=list(self.stderr)),
                                 request=req)
                resp = _frames_in(resp, blobs)
            if resp.get("id") != rid:
                continue  # a stale answer from before a timeout
            if resp.get("ok"):
                return Reply(True, resp, request=req)
            return Reply(False, resp, Failure("error", str(resp.get("error", "request failed")), op, req,
                                              error_kind=resp.get("error_kind")), request=req)

    def _readline(self, timeout: float) -> str | None | object:
        """The next line of the worker's stdout; None at end of file; _WAIT if none came within timeout.
        Read here, on the calling thread (a reader thread would add a thread hand-off to every reply)."""
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        start = 0
        while (nl := self._out.find(b"\n", start)) < 0:
            start = len(self._out)
            ready, _, _ = select.select([fd], [], [], timeout)
            if not ready:
                return _WAIT
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return None
            self._out += chunk
        line = self._out[:nl].decode("utf-8", errors="replace")
        del self._out[:nl + 1]
        return line

    def _read_frames(self, sizes: list[int], deadline: float) -> list[bytes] | None | object:
        """The frames after a reply's line, in order; None if the worker's stdout ended first, _WAIT if they had not
        all come by the deadline."""
        assert self.proc is not None and self.proc.stdout is not None
        fd, need = self.proc.stdout.fileno(), sum(sizes)
        while len(self._out) < need:
            ready, _, _ = select.select([fd], [], [], max(deadline - time.monotonic(), 0.0))
            if not ready:
                return _WAIT
            chunk = os.read(fd, max(need - len(self._out), 1 << 20))
            if not chunk:
                return None
            self._out += chunk
        data, at, blobs = memoryview(self._out), 0, []
        for n in sizes:
            blobs.append(bytes(data[at:at + n]))
            at += n
        data.release()
        del self._out[:need]
        return blobs

    def _crashed(self, op: str, req: dict[str, Any]) -> Reply:
        rc = None
        if self.proc is not None:
            try:
                rc = self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._kill()
                rc = self.proc.returncode
            self._stderr_pump.join(timeout=1.0)  # its last lines: the pump ends where the dead worker's stderr does
        tail = list(self.stderr)
        lines = [ln.strip() for ln in tail if ln.strip()]
        why = next((ln for ln in reversed(lines) if any(m in ln for m in _INFORMATIVE)), lines[-1] if lines else "")
        sig = f"signal {signal.Signals(-rc).name}" if rc is not None and rc < 0 else f"exit code {rc}"
        msg = f"{self.name} crashed ({sig}) during '{op}'" + (f": {why[:300]}" if why else "")
        return Reply(False, {}, Failure("crash", msg, op, req, returncode=rc, stderr_tail=tail), request=req)


_WAIT = object()


def _pump(stream: Any, put: Any) -> None:
    try:
        for line in stream:
            put(line)
    except (OSError, ValueError):
        pass
    finally:
        put(None)


def _frames_in(value: Any, blobs: list[bytes]) -> Any:
    """A reply with each {"$frame": i} replaced by the i-th frame's bytes."""
    if isinstance(value, dict):
        if len(value) == 1 and "$frame" in value:
            return blobs[int(value["$frame"])]
        return {k: _frames_in(v, blobs) for k, v in value.items()}
    if isinstance(value, list):
        return [_frames_in(v, blobs) for v in value]
    return value


def as_bytes(blob: bytes | str) -> bytes:
    """A reply's blob as bytes: a frame already is; a base64 string (a worker without frames) is decoded."""
    return blob if isinstance(blob, bytes) else base64.b64decode(blob)
