"""Hypothesis strategies over fixture specs, exported so users can write their own properties.

    from synth.strategies import specs
    @given(specs(families=["jamba", "qwen3next"]))
    def test_mine(spec): ...

Every drawn spec is legal for its family (it came through Family.resolve), so shrinking stays valid.
"""

from __future__ import annotations

from hypothesis import assume
from hypothesis import strategies as st

from synth.dtype import DTYPES
from synth.errors import UserError
from synth.families import FAMILIES, Family
from synth.spec import ATTN, REC, Knobs, ModelSpec


@st.composite
def knobs_for(draw: st.DrawFn, family: Family, max_layers: int = 10) -> Knobs:
    """Random legal knobs for one family: layer count, interleaving, per-layer K/V heads, weight dtype, seed."""
    seed = draw(st.integers(0, 2**16))
    dtype = draw(st.sampled_from(list(DTYPES)))
    choices = [h for h in range(1, family.n_head + 1) if family.n_head % h == 0]
    if family.kind != "hybrid" or family.parallel_hybrid:
        n = draw(st.integers(1, max_layers))
        kv = None
        if family.per_layer_kv and "kv_heads" in family.knobs and n > 1:
            kv = tuple(draw(st.lists(st.sampled_from(choices), min_size=n, max_size=n)))
        return Knobs(layers=n, kv_heads=kv, dtype=dtype, seed=seed)
    n = draw(st.integers(2, max_layers))
    if draw(st.booleans()):
        period = draw(st.integers(2, n))
        offset = draw(st.integers(0, period - 1))
        pattern = "".join(ATTN if i % period == offset else REC for i in range(n))
    else:
        pattern = draw(st.text(alphabet=[ATTN, REC], min_size=n, max_size=n)
                       .filter(lambda s: ATTN in s and REC in s))
    kv_heads = None
    if family.per_layer_kv:
        kv_heads = tuple(draw(st.sampled_from(choices)) if c == ATTN else 0 for c in pattern)
    return Knobs(pattern=pattern, kv_heads=kv_heads, dtype=dtype, seed=seed)


@st.composite
def specs(draw: st.DrawFn, families: list[str] | None = None, max_layers: int = 10) -> ModelSpec:
    fam = FAMILIES[draw(st.sampled_from(sorted(families or FAMILIES)))]
    try:
        return fam.resolve(draw(knobs_for(fam, max_layers)))
    except UserError:  # a family-specific limit the generic draw does not know (e.g. a minimum layer count)
        assume(False)
        raise
