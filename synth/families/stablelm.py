"""stablelm: StableLM, LayerNorm transformer with partial NEOX RoPE and a SiLU-gated FFN; output.weight
required. Without ffn_norm llama.cpp switches to StableLM-2-12B's parallel residual, so it is emitted."""

import gguf

from synth.families import _tier3 as t3
from synth.families import blocks
from synth.families.base import KA, Family, K, T
from synth.spec import ModelSpec


class StableLM(Family):
    name = "stablelm"
    arch = gguf.MODEL_ARCH.STABLELM
    kind = "dense"
    rope = "partial"
    summary = "StableLM (tier 3): LayerNorm, partial NEOX RoPE, gated FFN"
    knobs = t3.GQA_KNOBS

    def build(self, spec: ModelSpec, b) -> None:
        E, F = spec.n_embd, spec.n_ff
        b.f32(KA.LAYERNORM_EPS, 1e-5)
        t3.head_counts(b, spec)
        b.u32(K.FEED_FORWARD_LENGTH, F)
        b.u32(gguf.Keys.Rope.DIMENSION_COUNT, t3.partial_rot(spec.head_dim))  # partial_rotary_factor < 1
        blocks.embeddings(b, spec)
        b.t(T.OUTPUT_NORM, (E,), blocks.BIAS, suffix="bias")
        for i in range(spec.n_layer):
            t3.layer_norm(b, T.ATTN_NORM, E, i)
            blocks.attention(b, spec, i)
            t3.layer_norm(b, T.FFN_NORM, E, i)
            blocks.ffn_dense(b, E, F, i)
