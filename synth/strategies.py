"""Hypothesis strategies over fixture specs, exported so users can write their own properties.

    from synth.strategies import specs
    @given(specs(families=["jamba", "qwen3next"]))
    def test_mine(spec): ...

Every drawn spec is legal for its family (it came through Family.resolve), so shrinking stays valid.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from hypothesis import assume
from hypothesis import strategies as st

from synth.dtype import DTYPES
from synth.errors import UserError
from synth.families import FAMILIES, Family
from synth.spec import ATTN, REC, Knobs, ModelSpec


class Choices:
    """Where a draw's choices come from: Hypothesis (`knobs_for`, `specs`: shrinkable) or a seeded numpy generator
    (`random_spec`: campaigns, where case i must be the same case whenever it is drawn). One drawing logic, two
    sources."""

    def integer(self, lo: int, hi: int) -> int:
        raise NotImplementedError

    def pick(self, seq: Sequence[Any]) -> Any:
        return seq[self.integer(0, len(seq) - 1)]

    def coin(self) -> bool:
        return self.integer(0, 1) == 1


class _Drawn(Choices):
    def __init__(self, draw: st.DrawFn):
        self.draw = draw

    def integer(self, lo: int, hi: int) -> int:
        return self.draw(st.integers(lo, hi))

    def pick(self, seq: Sequence[Any]) -> Any:
        return self.draw(st.sampled_from(list(seq)))

    def coin(self) -> bool:
        return self.draw(st.booleans())


class Seeded(Choices):
    def __init__(self, rng: np.random.Generator):
        self.rng = rng

    def integer(self, lo: int, hi: int) -> int:
        return int(self.rng.integers(lo, hi + 1))


def draw_knobs(c: Choices, family: Family, max_layers: int = 10) -> Knobs:
    """Random legal knobs for one family: layer count, interleaving, per-layer K/V heads, weight dtype, seed."""
    seed = c.integer(0, 2**16)
    dtype = c.pick(list(DTYPES))
    choices = [h for h in range(1, family.n_head + 1) if family.n_head % h == 0]
    if family.kind != "hybrid" or family.parallel_hybrid:
        n = c.integer(1, max_layers)
        kv = None
        if family.per_layer_kv and "kv_heads" in family.knobs and n > 1:
            kv = tuple(c.pick(choices) for _ in range(n))
        return Knobs(layers=n, kv_heads=kv, dtype=dtype, seed=seed)
    n = c.integer(2, max_layers)
    if c.coin():
        period = c.integer(2, n)
        offset = c.integer(0, period - 1)
        pattern = "".join(ATTN if i % period == offset else REC for i in range(n))
    else:  # any mix holding both kinds
        kinds = [c.pick([ATTN, REC]) for _ in range(n)]
        for need in (ATTN, REC):
            if need not in kinds:
                kinds[c.integer(0, n - 1)] = need
        if ATTN not in kinds:  # (n == 2 and the second fix overwrote the first)
            kinds[0] = ATTN
        pattern = "".join(kinds)
    kv_heads = None
    if family.per_layer_kv:
        kv_heads = tuple(c.pick(choices) if k == ATTN else 0 for k in pattern)
    return Knobs(pattern=pattern, kv_heads=kv_heads, dtype=dtype, seed=seed)


@st.composite
def knobs_for(draw: st.DrawFn, family: Family, max_layers: int = 10) -> Knobs:
    return draw_knobs(_Drawn(draw), family, max_layers)


def random_spec(rng: np.random.Generator, families: Sequence[str] | None = None, max_layers: int = 10) \
        -> ModelSpec | None:
    """One seeded spec of one family, the knobs drawn again (from the same generator) while the family refuses
    them — e.g. a 256-wide quant type on a narrow model; None after 8 refusals."""
    c = Seeded(rng)
    fam = FAMILIES[c.pick(sorted(families or FAMILIES))]
    for _ in range(8):
        try:
            return fam.resolve(draw_knobs(c, fam, max_layers))
        except UserError:
            continue
    return None


@st.composite
def specs(draw: st.DrawFn, families: list[str] | None = None, max_layers: int = 10) -> ModelSpec:
    fam = FAMILIES[draw(st.sampled_from(sorted(families or FAMILIES)))]
    try:
        return fam.resolve(draw(knobs_for(fam, max_layers)))
    except UserError:  # a family-specific limit the generic draw does not know (e.g. a minimum layer count)
        assume(False)
        raise
