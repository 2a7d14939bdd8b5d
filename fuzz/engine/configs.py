"""The oracles' configurations, checked in one place: from the command line or from a repro bundle, a value of
the wrong type or out of range is a UserError naming the option, never a traceback deep in a run or a run that
quietly means something else (a negative tolerance, say)."""

from __future__ import annotations

from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any, TypeVar

from synth.errors import UserError

C = TypeVar("C")

# the least value of each numeric field (any oracle); tol and timeout are floats
LEAST: dict[str, float] = {"stages": 2, "tokens": 1, "prompt_len": 1, "chunk": 1, "n_seq": 1, "n_ubatch": 1,
                           "decode_offsets": 0, "seed": 0, "period": 1, "workers": 0, "slots": 1, "rounds": 1,
                           "n_ctx": 1, "cache_ram": 0, "repeats": 1, "tol": 0.0, "timeout": 1e-3, "clients": 1,
                           "ops": 1, "budget": 0.0, "trunk": 4, "limit": 0, "schedules": 0, "programs": 1, "steps": 1,
                           "max_len": 8, "n_rs_seq": 0}
# the most of a numeric field, and why: every oracle's contexts batch at most n_batch 64 rows
MOST: dict[str, tuple[float, str]] = {"n_ubatch": (64, "n_ubatch cannot exceed n_batch (64)")}


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def check_config(cfg: Any) -> None:
    """Every field of an oracle's config dataclass has its default's type (tuples: a non-empty selection of the
    default's values; numbers: not below their least value)."""
    for f in fields(cfg):
        v, default = getattr(cfg, f.name), f.default if f.default is not MISSING else None
        what = f"{flag(f.name)} {v!r}"
        if f.name == "prompt":  # token ids, the prompt_len of them (empty: prompt_len drawn from the seed)
            if not isinstance(v, tuple) or any(type(x) is not int or x < 0 for x in v):
                raise UserError(f"{what}: must be token ids (integers >= 0)")
            if v and len(v) != cfg.prompt_len:
                raise UserError(f"{what}: has {len(v)} tokens, but --prompt-len is {cfg.prompt_len}")
        elif isinstance(default, tuple) and all(type(x) is int for x in default):  # e.g. thread counts
            if not isinstance(v, tuple) or (not v and default) or any(type(x) is not int or x < 1 for x in v):
                raise UserError(f"{what}: must be one or more integers >= 1")
        elif isinstance(default, tuple):  # a selection: phases, modes, KV layouts, flash attention on/off
            if not isinstance(v, tuple) or not v or any(x not in default for x in v):
                raise UserError(f"{what}: must be one or more of {', '.join(map(str, default))}")
        elif isinstance(default, bool):
            if not isinstance(v, bool):
                raise UserError(f"{what}: must be true or false")
        elif f.name in LEAST:
            if v is None and default is None:  # optional (period: from the file)
                continue
            integer = not isinstance(default, float)
            if isinstance(v, bool) or not isinstance(v, int if integer else (int, float)):
                raise UserError(f"{what}: must be {'an integer' if integer else 'a number'}")
            if not v >= LEAST[f.name]:  # (NaN is not >= anything)
                raise UserError(f"{what}: must be at least {LEAST[f.name]:g}")
            if f.name in MOST and v > MOST[f.name][0]:
                raise UserError(f"{what}: {MOST[f.name][1]}")
        elif isinstance(default, str):
            if not isinstance(v, str):
                raise UserError(f"{what}: must be a string")
        elif f.name == "workdir" and v is not None and not isinstance(v, (str, Path)):
            raise UserError(f"{what}: must be a directory path")


def config_from(cls: type[C], values: Any, where: str, **fixed: Any) -> C:
    """An oracle config from recorded values (a bundle's `config`): known fields only, lists for tuples, checked."""
    if not isinstance(values, dict):
        raise UserError(f"{where}: config is a {type(values).__name__}, not an object; re-create the bundle")
    names = {f.name: f for f in fields(cls)}
    unknown = sorted(set(values) - (set(names) - set(fixed)))
    if unknown:
        raise UserError(f"{where}: config field {unknown[0]!r} is not one of {cls.__name__}'s; re-create the bundle")
    args = {k: tuple(v) if isinstance(names[k].default, tuple) and isinstance(v, list) else v
            for k, v in values.items()}
    cfg = cls(**args, **fixed)
    try:
        check_config(cfg)
    except UserError as e:
        raise UserError(f"{where}: config {e}; re-create the bundle") from None
    return cfg
