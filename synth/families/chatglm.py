"""chatglm: ChatGLM2/3 and GLM-4 (pre-glm4 arch), RMSNorm transformer with partial NORM RoPE and a fused
SwiGLU FFN (ffn_up is [E, 2·F]); attn_output is [E, E], so the head dim is E/H."""

import gguf

from synth.families import _tier3 as t3
from synth.families import blocks
from synth.families.base import KA, Family, K, T
from synth.spec import ModelSpec


class ChatGLM(Family):
    name = "chatglm"
    arch = gguf.MODEL_ARCH.CHATGLM
    kind = "dense"
    rope = "partial"
    summary = "ChatGLM (tier 3): partial RoPE, fused SwiGLU up projection"
    knobs = t3.GQA_KNOBS

    def build(self, spec: ModelSpec, b) -> None:
        E, F = spec.n_embd, spec.n_ff
        b.f32(KA.LAYERNORM_RMS_EPS, 1e-5)
        t3.head_counts(b, spec)
        b.u32(K.FEED_FORWARD_LENGTH, F)
        b.u32(gguf.Keys.Rope.DIMENSION_COUNT, t3.partial_rot(spec.head_dim))  # GLM rotates half of each head
        blocks.embeddings(b, spec)
        for i in range(spec.n_layer):
            b.t(T.ATTN_NORM, (E,), blocks.NORM, bid=i)
            blocks.attention(b, spec, i)
            b.t(T.FFN_NORM, (E,), blocks.NORM, bid=i)
            b.t(T.FFN_UP, (E, 2 * F), bid=i)  # gate and up, fused
            b.t(T.FFN_DOWN, (F, E), bid=i)
