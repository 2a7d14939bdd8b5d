"""bloom: BLOOM, LayerNorm transformer with ALiBi (max bias hard-coded to 8, no RoPE) and an embedding
LayerNorm (token_embd_norm); fused QKV and every bias required."""

import gguf

from synth.families import _tier3 as t3
from synth.families import blocks
from synth.families.base import KA, Family, K, T
from synth.spec import ModelSpec


class Bloom(Family):
    name = "bloom"
    arch = gguf.MODEL_ARCH.BLOOM
    kind = "dense"
    rope = None
    summary = "BLOOM (tier 3): ALiBi, embedding LayerNorm, fused QKV with biases"
    knobs = t3.GQA_KNOBS

    def build(self, spec: ModelSpec, b) -> None:
        E, F = spec.n_embd, spec.n_ff
        b.f32(KA.LAYERNORM_EPS, 1e-5)
        t3.head_counts(b, spec)
        b.u32(K.FEED_FORWARD_LENGTH, F)
        blocks.embeddings(b, spec)
        b.t(T.OUTPUT_NORM, (E,), blocks.BIAS, suffix="bias")
        t3.layer_norm(b, T.TOKEN_EMBD_NORM, E)
        for i in range(spec.n_layer):
            t3.ln_fused_layer(b, spec, i)
