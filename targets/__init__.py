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
    from targets.client import Failure, Reply, WorkerClient
    from targets.target import Target, close_all

# Imported on first use: `python -m targets.llama_cpp_worker` runs this file too, and a worker starts in
# half the time without numpy and the engine-side modules.
_LAZY = {"DEFAULT_TIMEOUT": "targets.client", "Failure": "targets.client", "Reply": "targets.client",
         "WorkerClient": "targets.client", "Target": "targets.target", "close_all": "targets.target"}


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
# llama.cpp's OpenMP threads sleep when idle instead of spinning (libgomp spins ~300k loops first): a worker of a
# context with several threads otherwise holds its cores between requests: two rows at a time on 2 cores took 2.3×
# longer than one after the other (now --jobs 2 takes two thirds). (Where they wait, never what they compute.)
# Passive costs a context with 2 threads a futex sleep and wake at every node's barrier (ggml's barrier is OpenMP's):
# alone, its decodes ran 20-40x slower than with GOMP_SPINCOUNT=1000; but with two rows at a time the tier-1
# determinism lane took 63 s summed passive, 175 s at 1000 spins and 1324 s at 10000 (a spinner holds the core the
# thread it waits for needs): passive it stays.
PY_WORKER_ENV = {"OPENBLAS_NUM_THREADS": "1", "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "passive")}


def open_target(spec: str = "llama-cpp", *, timeout: float | None = None,
                env: dict[str, str] | None = None) -> Target:
    from targets.client import DEFAULT_TIMEOUT
    from targets.target import Target

    base = {} if spec.startswith("cmd:") else PY_WORKER_ENV
    # our workers (and their mutants: targets.mutants.FreshAtUnload) keep nothing past an unload; another program may
    reuse = spec in ("llama-cpp", "llama-server") or spec.startswith("mutant:")
    return Target(spec, worker_argv(spec), timeout=timeout or DEFAULT_TIMEOUT, env={**base, **(env or {})},
                  reuse=reuse)


__all__ = ["DEFAULT_TIMEOUT", "Failure", "Reply", "Target", "WorkerClient", "close_all", "open_target",
           "worker_argv"]
