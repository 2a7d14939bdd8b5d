"""What every oracle run does around its own comparison: the worker processes it holds (a fleet, closed together
however the run ends), the full model loaded into its reference worker (a model the target cannot load at all is
bad input), a server that must be there, a failed call in the status vocabulary, and the header every fixture
report starts with."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from fuzz.engine.contract import CRASH, TIMEOUT
from fuzz.engine.stages import KIND_LETTER
from synth.errors import UserError
from synth.inspect import ModelInfo
from targets import Failure, Reply, Target, close_all, open_target
from targets.llama_server_worker import NO_SERVER, server_binary

CALL_TIMEOUT = "FAMILY_CERTIFY_CALL_TIMEOUT"  # seconds: a cap on every worker call's timeout (unset: the oracle's own)


class Fleet:
    """The workers of one oracle run, on its target (or another spec: a mutant's reference is the real one).
    `open(n)` starts them at once when asked (they come up side by side); leaving the `with` closes them all."""

    def __init__(self, target: str, timeout: float):
        # (at most CALL_TIMEOUT where it is set: `mutate` bounds what a mutant that hangs costs each call)
        cap = os.environ.get(CALL_TIMEOUT)
        self.target, self.timeout = target, min(timeout, float(cap)) if cap else timeout
        self.workers: list[Target] = []

    def open(self, n: int = 1, *, spec: str | None = None, start: bool = False) -> list[Target]:
        ts = [open_target(spec or self.target, timeout=self.timeout) for _ in range(n)]
        self.workers += ts
        if start:
            for t in ts:
                t.start()
        return ts

    def one(self, *, spec: str | None = None, start: bool = False) -> Target:
        return self.open(1, spec=spec, start=start)[0]

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc: object) -> None:
        close_all(self.workers)


def load_full(t: Target, fixture: Path, **params: Any) -> Reply:
    """The full model into the reference worker; a model the target cannot load at all is bad input."""
    loaded = t.load(str(fixture), **params)
    if not loaded.ok:
        raise UserError(f"{fixture}: the target cannot load the full model: {loaded.failure.message}")
    return loaded


_SPEAKS: dict[str, bool] = {}


def server_spec(spec: str) -> str:
    """The target a llama-server oracle runs for the run's target `spec`: that target itself when it speaks
    llama-server's protocol (its hello says `target: llama-server`: the server worker, a server mutant, a program
    behind cmd:), else the build's own llama-server (a library target — the llama.cpp worker, its mutants, a split
    runtime — has no server of its own to certify). Decided by what the target says it is, not by its spec's kind;
    asked once per spec."""
    if spec == "llama-server":
        return spec
    if spec not in _SPEAKS:
        with open_target(spec, timeout=60) as t:
            hello = t.hello()
        _SPEAKS[spec] = hello.ok and hello.data.get("target") == "llama-server"
    return spec if _SPEAKS[spec] else "llama-server"


def need_server(srv: Target, who: str) -> Reply:
    """A llama-server target's hello; no llama-server binary is bad input (how to build it is in NO_SERVER). The
    pinned build's llama-server is compiled first if only its libraries are (server_binary)."""
    server_binary(build=True)
    hello = srv.hello()
    if not hello.ok or not hello.data.get("binary"):
        raise UserError(f"{NO_SERVER} (the {who} lane needs it)")
    return hello


def failure_status(f: Failure) -> str:
    """A target call that failed, as a result's status: it hung (timeout) or died (crash)."""
    return TIMEOUT if f.kind == "timeout" else CRASH


def failure_reason(f: Failure, refused: str = "target refused") -> str:
    """A target call that failed, as a result's reason: its message, after `refused` when the target refused the
    request (an error, not a death or a hang)."""
    return (f"{refused}: " if f.kind == "error" else "") + f.message


def fixture_header(fixture: Path, info: ModelInfo, *, target: str, commit: str | None) -> dict[str, Any]:
    """The first fields of a report about one fixture: which file (and its bytes' sha256), what model (its arch,
    layers and their kinds, one letter each), which target and llama.cpp commit ran it."""
    return {"fixture": str(fixture), "sha256": hashlib.sha256(Path(fixture).read_bytes()).hexdigest(),
            "arch": info.arch, "n_layer": info.n_layer, "kinds": "".join(KIND_LETTER[x.kind] for x in info.layers),
            "target": target, "llama_cpp_commit": commit}
