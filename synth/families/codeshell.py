"""codeshell: CodeShell, LayerNorm transformer with full NEOX RoPE, GELU FFN; attn_output and FFN biases
are required (Q/K/V biases optional, not emitted); output.weight required."""

import gguf

from synth.families import _tier3 as t3
from synth.families import blocks
from synth.families.base import KA, Family, K, T
from synth.spec import ModelSpec


class CodeShell(Family):
    name = "codeshell"
    arch = gguf.MODEL_ARCH.CODESHELL
    kind = "dense"
    summary = "CodeShell (tier 3): LayerNorm, NEOX RoPE, GELU, required output biases"
    knobs = t3.GQA_KNOBS

    def build(self, spec: ModelSpec, b) -> None:
        E, F = spec.n_embd, spec.n_ff
        b.f32(KA.LAYERNORM_EPS, 1e-5)
        t3.head_counts(b, spec)
        b.u32(K.FEED_FORWARD_LENGTH, F)
        blocks.embeddings(b, spec)
        b.t(T.OUTPUT_NORM, (E,), blocks.BIAS, suffix="bias")
        for i in range(spec.n_layer):
            t3.layer_norm(b, T.ATTN_NORM, E, i)
            blocks.attention(b, spec, i)
            b.t(T.ATTN_OUT, (E,), blocks.BIAS, bid=i, suffix="bias")
            t3.layer_norm(b, T.FFN_NORM, E, i)
            t3.ffn_seq(b, E, F, i, bias=True)
