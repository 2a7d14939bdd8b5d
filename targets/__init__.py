"""targets: adapters to the real binaries, each behind one protocol (targets/PROTOCOL.md).

`open_target(spec)` understands:
  llama-cpp            the pinned llama.cpp through llama-cpp-python, in a worker process
  cmd:"<command line>" any external program that speaks the protocol on stdin/stdout
  mutant:NAME          llama-cpp with a known bug class re-created (targets/mutants.py), to prove lanes catch it
"""

from __future__ import annotations

import shlex
import sys

from synth.errors import UserError
from targets.client import DEFAULT_TIMEOUT, Failure, Reply, WorkerClient
from targets.target import Target, close_all

TARGETS_HELP = 'llama-cpp, cmd:"<command line>" (a program speaking targets/PROTOCOL.md), or mutant:NAME'


def worker_argv(spec: str) -> list[str]:
    if spec == "llama-cpp":
        return [sys.executable, "-m", "targets.llama_cpp_worker"]
    if spec.startswith("mutant:"):
        from targets.mutants import MUTANTS

        name = spec[len("mutant:"):]
        if name not in MUTANTS:
            raise UserError(f"--target {spec!r}: unknown mutant; mutants: {', '.join(MUTANTS)}")
        return [sys.executable, "-m", "targets.mutants", name]
    if spec.startswith("cmd:"):
        argv = shlex.split(spec[4:])
        if not argv:
            raise UserError(f"--target {spec!r}: empty command line; use cmd:\"<program> <args>\"")
        return argv
    raise UserError(f"unknown --target {spec!r}; use {TARGETS_HELP}")


def open_target(spec: str = "llama-cpp", *, timeout: float = DEFAULT_TIMEOUT,
                env: dict[str, str] | None = None) -> Target:
    return Target(spec, worker_argv(spec), timeout=timeout, env=env)


__all__ = ["DEFAULT_TIMEOUT", "Failure", "Reply", "Target", "WorkerClient", "close_all", "open_target",
           "worker_argv"]
