"""skippy, the split-serving runtime our users ship (Mesh-LLM/mesh-llm), as a target: its config file, its identity,
and its users' outcome vocabulary. `--target skippy:CONFIG.toml` runs targets/skippy_worker.py, which drives skippy's
own binaries and HTTP (never its binary stage wire).

The interface followed is the `skippy` CLI of crates/skippy-cli (serve-binary, serve-openai --model-path; the
`skippy-server` binary of older trees takes the same two), StageConfig of crates/skippy-protocol, and the lanes and
report keys of crates/skippy-correctness, as read from the public sources at commits 70889c54 (skippy-cli),
1052756c (skippy-protocol config), 9e9c1198 (skippy-correctness report) and 4427786c (scripts/lib/family-outcome.sh).

A config (TOML; relative paths are relative to the config file):

    [skippy]
    binary = "/opt/skippy/bin/skippy"          # or skippy-server
    correctness = "/opt/skippy/bin/skippy-correctness"
    model_package = ""                         # skippy-model-package: optional, recorded (layer packages come
                                               # from `synth package`, the v1 format)
    load_mode = "runtime-slice"                # runtime-slice | artifact-slice | layer-package
    commit = ""                                # expected skippy commit; checked against `binary --version`
    abi = ""                                   # expected skippy ABI (e.g. "0.1.67"); from --version or the roster
    roster = ""                                # skippy-api's split-certified.json: native_recipe.skippy_abi, pin
    logs = ""                                  # keep every process's log here (default: a temporary directory,
                                               # kept only when something failed; replies name it)
    [timeouts]                                 # seconds
    ready = 60                                 # a process until it listens / its /v1/models answers
    request = 120                              # one HTTP completion
    lane = 600                                 # one skippy-correctness run
    [stage]                                    # StageConfig fields written for every stage
    ctx_size = 512
    lane_count = 4
    n_batch = 64
    n_ubatch = 64
    [env]                                      # environment for every skippy process (e.g. SKIPPY_KV_CACHE)

Ports are free ports on 127.0.0.1 chosen per process; logs are one file per process (`logs` in each reply).
"""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from synth.errors import UserError

LOAD_MODES = ("runtime-slice", "artifact-slice", "layer-package")
SECTIONS = {
    "skippy": {"binary": str, "correctness": str, "model_package": str, "load_mode": str, "commit": str, "abi": str,
               "roster": str, "logs": str},
    "timeouts": {"ready": (int, float), "request": (int, float), "lane": (int, float)},
    "stage": {"ctx_size": int, "lane_count": int, "n_batch": int, "n_ubatch": int, "n_gpu_layers": int,
              "cache_type_k": str, "cache_type_v": str, "flash_attn_type": str},
    "env": None,  # any string values
}
STAGE_DEFAULTS = {"ctx_size": 512, "lane_count": 4, "n_batch": 64, "n_ubatch": 64, "n_gpu_layers": 0,
                  "cache_type_k": "f16", "cache_type_v": "f16", "flash_attn_type": "disabled"}
TIMEOUTS = {"ready": 60.0, "request": 120.0, "lane": 600.0}


@dataclass(frozen=True)
class SkippyConfig:
    path: Path
    binary: Path
    correctness: Path | None
    model_package: Path | None
    load_mode: str
    commit: str
    abi: str
    roster: Path | None
    logs: Path | None
    timeouts: dict[str, float]
    stage: dict[str, Any]
    env: dict[str, str] = field(default_factory=dict)


def _bad(path: Path, what: str) -> UserError:
    return UserError(f"skippy config {path}: {what}")


def read_config(path: str | Path) -> SkippyConfig:
    """The config, checked: known sections and keys of the right types, binaries that exist. Exit 2 otherwise."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"--target skippy:{path}: no such config file; write one as targets/skippy.py describes "
                        f"(tests/fake-skippy.toml is an example)")
    try:
        raw = tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise _bad(path, f"not valid TOML ({e})") from None
    for sec, body in raw.items():
        if sec not in SECTIONS or not isinstance(body, dict):
            raise _bad(path, f"unknown section [{sec}]; sections are {', '.join(f'[{s}]' for s in SECTIONS)}")
        for key, value in body.items():
            want = SECTIONS[sec]
            if want is None:
                if not isinstance(value, str):
                    raise _bad(path, f"[{sec}] {key}: must be a string")
                continue
            if key not in want:
                raise _bad(path, f"unknown key [{sec}] {key}; keys are {', '.join(want)}")
            if isinstance(value, bool) or not isinstance(value, want[key]):
                raise _bad(path, f"[{sec}] {key} = {value!r}: wrong type")
    sk = raw.get("skippy", {})

    def where(key: str, required: bool) -> Path | None:
        value = sk.get(key, "")
        if not value:
            if required:
                raise _bad(path, f"[skippy] {key} is required (the path of skippy's `skippy` or `skippy-server`)")
            return None
        p = Path(value) if Path(value).is_absolute() else (path.parent / value)
        if not p.is_file():
            raise _bad(path, f"[skippy] {key}: no such file: {p} (build skippy, or fix the path)")
        return p

    load_mode = sk.get("load_mode", "runtime-slice")
    if load_mode not in LOAD_MODES:
        raise _bad(path, f"[skippy] load_mode {load_mode!r}: one of {', '.join(LOAD_MODES)}")
    package = where("model_package", False)
    roster = where("roster", False)
    timeouts = {**TIMEOUTS, **{k: float(v) for k, v in raw.get("timeouts", {}).items()}}
    if any(v <= 0 for v in timeouts.values()):
        raise _bad(path, "[timeouts] must be positive")
    return SkippyConfig(path=path.resolve(), binary=where("binary", True), correctness=where("correctness", False),
                        model_package=package, load_mode=load_mode, commit=sk.get("commit", ""), abi=sk.get("abi", ""),
                        roster=roster, logs=(path.parent / sk["logs"]) if sk.get("logs") else None,
                        timeouts=timeouts, stage={**STAGE_DEFAULTS, **raw.get("stage", {})},
                        env=dict(raw.get("env", {})))


def parse_version(text: str) -> dict[str, str | None]:
    """What a `--version` line tells: its version, skippy commit, ABI and llama.cpp pin (each None if absent)."""
    def find(pattern: str) -> str | None:
        m = re.search(pattern, text, re.IGNORECASE)
        return m.group(1) if m else None

    return {"version": find(r"skippy(?:-server)?\s+([0-9][\w.+-]*)"), "commit": find(r"commit[ =:]+([0-9a-f]{7,40})"),
            "abi": find(r"abi[ =:]+([0-9]+\.[0-9]+\.[0-9]+)"),
            "llama_cpp": find(r"llama\.cpp[ =:]+([0-9a-f]{7,40})")}


@functools.cache
def identity(config: str | Path) -> dict[str, Any]:
    """skippy's identity, from `binary --version` and the roster, checked against the config's expectations:
    {binary, version_line, version, commit, abi, llama_cpp}. A wrong or unverifiable commit or ABI: exit 2."""
    cfg = read_config(config)
    try:
        out = subprocess.run([str(cfg.binary), "--version"], capture_output=True, text=True, timeout=30,
                             env=child_env(cfg))
        line = (out.stdout.strip() or out.stderr.strip()).splitlines()[0] if out.returncode == 0 else ""
    except (OSError, subprocess.TimeoutExpired, IndexError) as e:
        raise _bad(cfg.path, f"{cfg.binary} --version failed ({e}); is it skippy's binary?") from None
    ident: dict[str, Any] = {"binary": str(cfg.binary), "version_line": line or None, **parse_version(line),
                             "load_mode": cfg.load_mode}
    if cfg.model_package is not None:
        ident["model_package"] = str(cfg.model_package)
    if cfg.roster is not None:
        try:
            recipe = json.loads(cfg.roster.read_text()).get("native_recipe", {})
        except (ValueError, AttributeError) as e:
            raise _bad(cfg.path, f"[skippy] roster {cfg.roster}: not skippy's split-certified.json ({e})") from None
        ident["abi"] = ident["abi"] or recipe.get("skippy_abi")
        ident["llama_cpp"] = ident["llama_cpp"] or recipe.get("llama_upstream_sha")
    for key in ("commit", "abi"):
        want = getattr(cfg, key)
        if not want:
            continue
        got = ident[key]
        if got is None:
            raise _bad(cfg.path, f"[skippy] {key} = {want!r} but {cfg.binary} does not say its {key} "
                                 f"(--version: {line!r}); set [skippy] roster, or drop the expectation")
        if not (got.startswith(want) or want.startswith(got)):
            raise _bad(cfg.path, f"[skippy] {key} = {want!r} but {cfg.binary} is {key} {got}: a different skippy "
                                 f"build; rebuild skippy or update the config")
    return ident


def child_env(cfg: SkippyConfig) -> dict[str, str]:
    return {**os.environ, **cfg.env}


# The users' own outcome words (scripts/lib/family-outcome.sh): the first pattern that matches the note and the
# log's last 240 lines (command echo lines dropped) names the outcome; the exit code plays no part.
OUTCOMES = (
    ("timeout", r"timed out|did not become ready|deadline exceeded"),
    ("unsupported", r"unsupported:|not supported for this model architecture|unsupported model architecture"),
    ("model-invalid", r"missing tensor|tensor .* not found|failed to load model|model artifact.*invalid|"
                      r"invalid model artifact"),
    ("mismatch", r"mismatch|did not match|matches[=:]\s*false|token.*different"),
    ("harness", r"no such file or directory|does not exist|requires --|corpus.*(missing|not found)|"
                r"failed to resolve|command not found|required command not found"),
)


def classify(log: str, note: str = "") -> str:
    """A failed run's outcome: timeout, unsupported, model-invalid, mismatch, harness or runtime-error."""
    lines = [ln for ln in log.splitlines() if not ln.startswith("+ ")][-240:]
    text = "\n".join([note, *lines])
    return next((name for name, pattern in OUTCOMES if re.search(pattern, text, re.IGNORECASE)), "runtime-error")
