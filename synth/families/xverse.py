"""xverse: XVERSE, llama-like RMSNorm transformer (NORM RoPE over the whole head, SiLU-gated FFN) whose Q and
attn_output are [E, E], so the head dim is E/H; output.weight required."""

import gguf

from synth.families import _tier3 as t3
from synth.families import blocks
from synth.families.base import KA, Family, K, T
from synth.spec import ModelSpec


class Xverse(Family):
    name = "xverse"
    arch = gguf.MODEL_ARCH.XVERSE
    kind = "dense"
    summary = "XVERSE (tier 3): llama-like, head dim E/H"
    knobs = t3.GQA_KNOBS

    def build(self, spec: ModelSpec, b) -> None:
        E, F = spec.n_embd, spec.n_ff
        b.f32(KA.LAYERNORM_RMS_EPS, 1e-5)
        t3.head_counts(b, spec)
        b.u32(K.FEED_FORWARD_LENGTH, F)
        blocks.embeddings(b, spec)
        for i in range(spec.n_layer):
            b.t(T.ATTN_NORM, (E,), blocks.NORM, bid=i)
            blocks.attention(b, spec, i)
            b.t(T.FFN_NORM, (E,), blocks.NORM, bid=i)
            blocks.ffn_dense(b, E, F, i)
