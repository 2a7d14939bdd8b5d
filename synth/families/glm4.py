"""glm4: dense GLM-4 (0414). Sandwich norms: post_attention_norm after attention and post_ffw_norm after the
FFN (besides attn_norm/ffn_norm); the FFN is SwiGLU with gate and up fused in one ffn_up [E, 2F]; NORM RoPE
over half the head dim. Without rope.dimension_sections (real GLM-4 text files have none) llama.cpp aborts on
embedding input (glm4.cpp:82-85), so a stage fed hidden states cannot run this arch."""

import gguf

from synth.errors import UserError
from synth.families import blocks
from synth.families.base import BASE_KNOBS, KA, Family, K, T
from synth.spec import ModelSpec


class Glm4(Family):
    name = "glm4"
    arch = gguf.MODEL_ARCH.GLM4
    kind = "dense"
    summary = "GLM-4 dense: post-attention and post-FFN norms, fused ffn_up [E,2F], partial NORM RoPE"
    embd_input = ("llama.cpp aborts on embedding input without rope.dimension_sections "
                  "('does not support multimodal', glm4.cpp:82-85)")
    knobs = BASE_KNOBS | {"kv_heads", "head_dim"}

    def check(self, spec: ModelSpec) -> None:
        if spec.head_dim % 4:
            raise UserError(f"family {self.name}: --head-dim {spec.head_dim} must be a multiple of 4 "
                            "(RoPE covers an even half of it)")

    def build(self, spec: ModelSpec, b) -> None:
        E, D = spec.n_embd, spec.head_dim
        b.u32(KA.HEAD_COUNT, spec.n_head)
        b.u32(KA.HEAD_COUNT_KV, spec.n_head_kv[0])
        b.u32(KA.KEY_LENGTH, D)
        b.u32(KA.VALUE_LENGTH, D)
        b.u32(gguf.Keys.Rope.DIMENSION_COUNT, D // 2)  # GLM: partial_rotary_factor 0.5
        b.u32(K.FEED_FORWARD_LENGTH, spec.n_ff)
        b.f32(KA.LAYERNORM_RMS_EPS, 1e-5)
        blocks.embeddings(b, spec)
        for i in range(spec.n_layer):
            b.t(T.ATTN_NORM, (E,), blocks.NORM, bid=i)
            blocks.attention(b, spec, i)
            b.t(T.ATTN_POST_NORM, (E,), blocks.NORM, bid=i)
            b.t(T.FFN_NORM, (E,), blocks.NORM, bid=i)
            b.t(T.FFN_UP, (E, 2 * spec.n_ff), bid=i)
            b.t(T.FFN_DOWN, (spec.n_ff, E), bid=i)
            b.t(T.FFN_POST_NORM, (E,), blocks.NORM, bid=i)
