"""gpt2: GPT-2, LayerNorm transformer with learned absolute positions (no RoPE), fused QKV, GELU FFN; every
bias is required. position_embd has exactly context_length rows: never run n_ctx above context_length.
"""

import gguf

from synth.families import _tier3 as t3
from synth.families import blocks
from synth.families.base import KA, Family, K, T
from synth.spec import ModelSpec
from synth.weights import Init


class Gpt2(Family):
    name = "gpt2"
    arch = gguf.MODEL_ARCH.GPT2
    kind = "dense"
    rope = None
    summary = "GPT-2 (tier 3): learned positions, fused QKV with biases, GELU"
    knobs = t3.GQA_KNOBS

    def build(self, spec: ModelSpec, b) -> None:
        E, F = spec.n_embd, spec.n_ff
        b.f32(KA.LAYERNORM_EPS, 1e-5)
        t3.head_counts(b, spec)
        b.u32(K.FEED_FORWARD_LENGTH, F)
        blocks.embeddings(b, spec)
        b.t(T.OUTPUT_NORM, (E,), blocks.BIAS, suffix="bias")
        b.t(T.POS_EMBD, (E, spec.n_ctx_train), Init.std(0.3))  # rows = context_length
        for i in range(spec.n_layer):
            t3.ln_fused_layer(b, spec, i)
