"""The oracle registry: every oracle module's `ORACLE` (fuzz/engine/contract.py), by name. The CLI, family-certify's
lanes, repro bundles, `fuzz replay` and the shrinker look oracles up here and nowhere else."""

from __future__ import annotations

from fuzz.engine.contract import Oracle
from fuzz.oracles import (
    determinism,
    handoff,
    isolation,
    memory,
    prefix_cache,
    radix,
    sampling,
    server_options,
    skippy,
    sweep,
    wire,
)
from synth.errors import UserError

ORACLES: dict[str, Oracle] = {m.ORACLE.name: m.ORACLE for m in (sweep, handoff, determinism, isolation, memory,
                                                                prefix_cache, radix, server_options, wire, skippy,
                                                                sampling)}


def get_oracle(name: str) -> Oracle:
    try:
        return ORACLES[name]
    except KeyError:
        raise UserError(f"unknown oracle {name!r}; oracles: {', '.join(ORACLES)}") from None
