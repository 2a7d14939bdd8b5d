"""Helpers shared by the tier-2a family modules (Qwen-VL, Gemma, Phi, Granite, Hunyuan, Falcon).

Not a family (the leading underscore keeps the registry from treating it as one).
"""

from __future__ import annotations

from synth.errors import UserError
from synth.families import blocks
from synth.families.base import KA, Builder, Family
from synth.spec import ModelSpec


def mrope_sections(head_dim: int) -> list[int]:
    """Qwen2-VL-style M-RoPE sections [t, h, w, 0] summing to head_dim/2 (Qwen2-VL: [16, 24, 24, 0] for 128)."""
    half = head_dim // 2
    hw = (3 * half) // 8
    return [half - 2 * hw, hw, hw, 0]


def check_mrope(fam: Family, spec: ModelSpec) -> None:
    """M-RoPE needs an even head dim with room for non-empty t/h/w sections (>= 1 rotary pair each)."""
    D = spec.head_dim
    if D % 2 or D < 6:
        how = "--head-dim" if "head_dim" in fam.knobs else "--embd/--heads"
        raise UserError(f"family {fam.name}: head dim {D} cannot hold M-RoPE sections; "
                        f"choose {how} giving an even head dim >= 6")


def attn_heads(b: Builder, spec: ModelSpec, *, key_length: bool = False) -> None:
    b.u32(KA.HEAD_COUNT, spec.n_head)
    b.u32(KA.HEAD_COUNT_KV, spec.n_head_kv[0])
    if key_length:
        b.u32(KA.KEY_LENGTH, spec.head_dim)
        b.u32(KA.VALUE_LENGTH, spec.head_dim)


def layernorm(b: Builder, tensor, E: int, i: int | None = None) -> None:
    """A LayerNorm's weight and bias (phi2, phimoe, falcon)."""
    b.t(tensor, (E,), blocks.NORM, bid=i)
    b.t(tensor, (E,), blocks.BIAS, bid=i, suffix="bias")
