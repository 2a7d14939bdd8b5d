"""phi2: Phi-2 — parallel attention + GELU MLP off one LayerNorm (no ffn_norm), biases everywhere
(norms, attn_output, ffn_up/down, output are required, src/models/phi2.cpp:19-39), fused attn_qkv,
partial NEOX rotary (rope.dimension_count = half the head dim here; Phi-2: 32 of 80); Q sized n_embd.
"""

import gguf

from synth.errors import UserError
from synth.families import _tier2a, blocks
from synth.families.base import BASE_KNOBS, KA, Family, K, T
from synth.spec import ModelSpec


def n_rot(head_dim: int) -> int:
    return max(2, (head_dim // 2) & ~1)


class Phi2(Family):
    name = "phi2"
    arch = gguf.MODEL_ARCH.PHI2
    kind = "dense"
    summary = "Phi-2: parallel attention/MLP, LayerNorm + biases, partial rotary"
    knobs = BASE_KNOBS | {"kv_heads"}
    rope = "partial"  # rope.dimension_count = an even part of the head; check() bounds it
    n_head_kv = 4  # Phi-2 is multi-head (K/V heads = heads)

    def check(self, spec: ModelSpec) -> None:
        if spec.head_dim < 4:
            raise UserError(f"family {self.name}: head dim {spec.head_dim} (--embd/--heads) is too small for "
                            "partial rotary; use --embd/--heads giving a head dim >= 4")

    def build(self, spec: ModelSpec, b) -> None:
        E, D = spec.n_embd, spec.head_dim
        _tier2a.attn_heads(b, spec)
        b.u32(K.FEED_FORWARD_LENGTH, spec.n_ff)
        b.f32(KA.LAYERNORM_EPS, 1e-5)
        b.u32(gguf.Keys.Rope.DIMENSION_COUNT, n_rot(D))
        blocks.embeddings(b, spec)
        b.t(T.OUTPUT_NORM, (E,), blocks.BIAS, suffix="bias")
        b.t(T.OUTPUT, (spec.n_vocab,), blocks.BIAS, suffix="bias")
        qkv = E + 2 * spec.n_head_kv[0] * D
        for i in range(spec.n_layer):
            _tier2a.layernorm(b, T.ATTN_NORM, E, i)
            b.t(T.ATTN_QKV, (E, qkv), bid=i)
            b.t(T.ATTN_OUT, (E, E), bid=i)
            b.t(T.ATTN_OUT, (E,), blocks.BIAS, bid=i, suffix="bias")
            b.t(T.FFN_UP, (E, spec.n_ff), bid=i)
            b.t(T.FFN_UP, (spec.n_ff,), blocks.BIAS, bid=i, suffix="bias")
            b.t(T.FFN_DOWN, (spec.n_ff, E), bid=i)
            b.t(T.FFN_DOWN, (E,), blocks.BIAS, bid=i, suffix="bias")
