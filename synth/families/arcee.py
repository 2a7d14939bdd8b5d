"""arcee: Arcee (AFM), llama-like RMSNorm transformer with RoPE but a non-gated ReLU² FFN (no ffn_gate);
RoPE dims must equal the head dim."""

import gguf

from synth.families import _tier3 as t3
from synth.families import blocks
from synth.families.base import KA, Family, K, T
from synth.spec import ModelSpec


class Arcee(Family):
    name = "arcee"
    arch = gguf.MODEL_ARCH.ARCEE
    kind = "dense"
    summary = "Arcee AFM (tier 3): llama-like, ReLU² FFN without gate"
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
            t3.ffn_seq(b, E, F, i, bias=False)
