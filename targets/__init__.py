"""targets: adapters to the real binaries, each behind one protocol (targets/PROTOCOL.md).

`open_target(spec)` understands:
  llama-cpp            the pinned llama.cpp through llama-cpp-python, in a worker process
  cmd:"<command line>" any external program that speaks the protocol on stdin/stdout
  mutant:NAME          llama-cpp with a known bug class re-created (targets/mutants.py), to prove lanes catch it
  skippy:CONFIG.toml   skippy, the split-serving runtime (targets/skippy.py): its binaries and OpenAI HTTP
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from targets.client import Failure, Reply, WorkerClient, as_bytes
    from targets.target import Target, close_all

# Imported on first use: `python -m targets.llama_cpp_worker` runs this file too, and a worker starts in
# half the time without numpy and the engine-side modules.
_LAZY = {"DEFAULT_TIMEOUT": "targets.client", "Failure": "targets.client", "Reply": "targets.client",
         "WorkerClient": "targets.client", "as_bytes": "targets.client", "Target": "targets.target",
         "close_all": "targets.target"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'targets' has no attribute {name!r}")

TARGETS_HELP = ('llama-cpp, llama-server (prefix-cache lane), cmd:"<command line>" (a program speaking '
                'targets/PROTOCOL.md), mutant:NAME, or skippy:CONFIG.toml (skippy\'s binaries, targets/skippy.py)')


def worker_argv(spec: str) -> list[str]:
    from synth.errors import UserError

    if spec == "llama-cpp":
        return [sys.executable, "-m", "targets.llama_cpp_worker"]
    if spec == "llama-server":
        return [sys.executable, "-m", "targets.llama_server_worker"]
    if spec.startswith("mutant:"):
        from targets.mutants import MUTANTS, NOT_BUGS

        name = spec[len("mutant:"):]
        if name not in MUTANTS and name not in NOT_BUGS:
            raise UserError(f"--target {spec!r}: unknown mutant; mutants: {', '.join([*MUTANTS, *NOT_BUGS])}")
        return [sys.executable, "-m", "targets.mutants", name]
    if spec.startswith("skippy:"):
        from pathlib import Path

        from targets.skippy import identity

        identity(spec[len("skippy:"):])  # the config, its binaries and the build they are: exit 2 if wrong
        return [sys.executable, "-m", "targets.skippy_worker", str(Path(spec[len("skippy:"):]).resolve())]
    if spec.startswith("cmd:"):
        import shlex

        argv = shlex.split(spec[4:])
        if not argv:
            raise UserError(f"--target {spec!r}: empty command line; use cmd:\"<program> <args>\"")
        return argv
    raise UserError(f"unknown --target {spec!r}; use {TARGETS_HELP}")


# Our Python workers use numpy for a few small arrays: one BLAS thread (numpy starts one per core otherwise).
OPENBLAS = {"OPENBLAS_NUM_THREADS": "1"}
# How llama.cpp's OpenMP threads wait (ggml's barrier is OpenMP's: only a context with several threads has one, the
# determinism lane's 2-thread schedules). Where they wait, never what they compute (figures: docs/benchmarks.md):
# - alone on the machine, a short spin (active, GOMP_SPINCOUNT=1000: ~10 us before a futex sleep) is fastest: a
#   sleeping thread's wake costs more than the graph node it waits for;
# - with rows side by side their threads outnumber the cores and a spinner holds the core the thread it waits for
#   needs, so there waiting passively is faster. Passive also stops an idle worker's threads holding a core between
#   requests (libgomp's default spins ~300k loops).
# So workers spin briefly unless the caller said the cores are shared (share_cores(): a process running rows beside
# others, `--jobs N`; the test suite on several cores). A wait policy or spin count set by the user always wins.
ALONE = {"OMP_WAIT_POLICY": "active", "GOMP_SPINCOUNT": "1000"}
SHARED = {"OMP_WAIT_POLICY": "passive"}
_WAIT = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def _wait_said() -> bool:
    """The environment already says how OpenMP threads wait (the user did, or share_cores())."""
    return any(k in os.environ for k in _WAIT)


def share_cores() -> None:
    """This process runs beside others on the same cores: its workers (and their children) wait passively."""
    if not _wait_said():
        os.environ.update(SHARED)


def worker_env() -> dict[str, str]:
    """What our workers add to the environment they inherit: one BLAS thread; a short spin unless the environment
    already says how to wait."""
    return {**OPENBLAS, **({} if _wait_said() else ALONE)}


def open_target(spec: str = "llama-cpp", *, timeout: float | None = None,
                env: dict[str, str] | None = None) -> Target:
    from targets.client import COVERAGE_ENV, DEFAULT_TIMEOUT
    from targets.target import Target

    base = {} if spec.startswith("cmd:") else worker_env()
    # our workers (and their mutants: worker_protocol.FreshAtUnload) keep nothing past an unload, so an idle one
    # serves the next target; another program may keep state, so it gets a worker of its own. So does every target
    # under a coverage build: its worker writes the counts of everything it ran when it exits, and a reused one that
    # a later program crashed would lose every earlier oracle's
    reuse = (spec in ("llama-cpp", "llama-server") or spec.startswith("mutant:")) and not os.environ.get(COVERAGE_ENV)
    return Target(spec, worker_argv(spec), timeout=timeout or DEFAULT_TIMEOUT, env={**base, **(env or {})},
                  reuse=reuse)


__all__ = ["DEFAULT_TIMEOUT", "Failure", "Reply", "Target", "WorkerClient", "as_bytes", "close_all", "open_target",
           "worker_argv"]
