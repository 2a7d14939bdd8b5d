"""qwen2: dense GQA transformer (NEOX RoPE); Q and attn_output are sized by n_embd, so head dim = E/H."""

import gguf

from synth.families import blocks
from synth.families.base import BASE_KNOBS, KA, Family, K, T
from synth.spec import ModelSpec


class Qwen2(Family):
    name = "qwen2"
    arch = gguf.MODEL_ARCH.QWEN2
    kind = "dense"
    summary = "Qwen2 / Qwen2.5 dense GQA"
    knobs = BASE_KNOBS | {"kv_heads"}

    def build(self, spec: ModelSpec, b) -> None:
        E = spec.n_embd
        b.u32(KA.HEAD_COUNT, spec.n_head)
        b.u32(KA.HEAD_COUNT_KV, spec.n_head_kv[0])
        b.u32(K.FEED_FORWARD_LENGTH, spec.n_ff)
        b.f32(KA.LAYERNORM_RMS_EPS, 1e-6)
        blocks.embeddings(b, spec)
        for i in range(spec.n_layer):
            b.t(T.ATTN_NORM, (E,), blocks.NORM, bid=i)
            blocks.attention(b, spec, i)
            b.t(T.FFN_NORM, (E,), blocks.NORM, bid=i)
            blocks.ffn_dense(b, E, spec.n_ff, i)
