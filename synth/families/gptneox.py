"""gptneox: GPT-NeoX / Pythia, LayerNorm transformer with partial NEOX RoPE and parallel residual
(use_parallel_residual is a required key); fused QKV and every bias required; output.weight required."""

import gguf

from synth.families import _tier3 as t3
from synth.families import blocks
from synth.families.base import KA, Family, K, T
from synth.spec import ModelSpec


class GptNeoX(Family):
    name = "gptneox"
    arch = gguf.MODEL_ARCH.GPTNEOX
    kind = "dense"
    rope = "partial"
    summary = "GPT-NeoX/Pythia (tier 3): parallel residual, partial RoPE, fused QKV with biases"
    knobs = t3.GQA_KNOBS

    def build(self, spec: ModelSpec, b) -> None:
        E, F = spec.n_embd, spec.n_ff
        b.f32(KA.LAYERNORM_EPS, 1e-5)
        t3.head_counts(b, spec)
        b.u32(K.FEED_FORWARD_LENGTH, F)
        b.flag(K.USE_PARALLEL_RESIDUAL, True)  # Pythia's form: x + attn(ln1(x)) + ffn(ln2(x))
        b.u32(gguf.Keys.Rope.DIMENSION_COUNT, t3.partial_rot(spec.head_dim))  # rotary_pct < 1
        blocks.embeddings(b, spec)
        b.t(T.OUTPUT_NORM, (E,), blocks.BIAS, suffix="bias")
        for i in range(spec.n_layer):
            t3.ln_fused_layer(b, spec, i)
