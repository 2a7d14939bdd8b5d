"""refact: Refact, llama-like RMSNorm transformer with ALiBi (max bias hard-coded to 8, no RoPE) and a
SiLU-gated FFN; Q and attn_output are H·head_dim wide, so the head dim is free."""

import gguf

from synth.families import _tier3 as t3
from synth.families import blocks
from synth.families.base import KA, Family, K, T
from synth.spec import ModelSpec


class Refact(Family):
    name = "refact"
    arch = gguf.MODEL_ARCH.REFACT
    kind = "dense"
    rope = None
    summary = "Refact (tier 3): ALiBi, RMSNorm, gated FFN"
    knobs = t3.GQA_KNOBS | {"head_dim"}

    def build(self, spec: ModelSpec, b) -> None:
        E, F = spec.n_embd, spec.n_ff
        b.f32(KA.LAYERNORM_RMS_EPS, 1e-5)
        t3.head_counts(b, spec)
        t3.head_dim_keys(b, spec)
        b.u32(K.FEED_FORWARD_LENGTH, F)
        blocks.embeddings(b, spec)
        for i in range(spec.n_layer):
            b.t(T.ATTN_NORM, (E,), blocks.NORM, bid=i)
            blocks.attention(b, spec, i)
            b.t(T.FFN_NORM, (E,), blocks.NORM, bid=i)
            blocks.ffn_dense(b, E, F, i)
