"""mpt: MPT, LayerNorm transformer with ALiBi (attention.max_alibi_bias; 0 would leave it position-blind),
fused QKV, GELU FFN; every bias is optional, so none are emitted."""

import gguf

from synth.families import _tier3 as t3
from synth.families import blocks
from synth.families.base import KA, Family, K, T
from synth.spec import ModelSpec


class Mpt(Family):
    name = "mpt"
    arch = gguf.MODEL_ARCH.MPT
    kind = "dense"
    rope = None
    summary = "MPT (tier 3): ALiBi, fused QKV, bias-free LayerNorms"
    knobs = t3.GQA_KNOBS

    def build(self, spec: ModelSpec, b) -> None:
        E, F = spec.n_embd, spec.n_ff
        b.f32(KA.LAYERNORM_EPS, 1e-5)
        b.f32(KA.MAX_ALIBI_BIAS, 8.0)
        t3.head_counts(b, spec)
        b.u32(K.FEED_FORWARD_LENGTH, F)
        blocks.embeddings(b, spec)
        for i in range(spec.n_layer):
            b.t(T.ATTN_NORM, (E,), blocks.NORM, bid=i)
            t3.fused_qkv(b, spec, i, bias=False)
            b.t(T.ATTN_OUT, (E, E), bid=i)
            b.t(T.FFN_NORM, (E,), blocks.NORM, bid=i)
            t3.ffn_seq(b, E, F, i, bias=False)
