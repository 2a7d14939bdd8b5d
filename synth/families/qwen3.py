"""qwen3: dense GQA with per-head q/k RMS norms (NEOX RoPE); head dim independent of E/H."""

import gguf

from synth.families import blocks
from synth.families.base import BASE_KNOBS, KA, Family, K, T
from synth.spec import ModelSpec


class Qwen3(Family):
    name = "qwen3"
    arch = gguf.MODEL_ARCH.QWEN3
    kind = "dense"
    summary = "Qwen3 dense GQA with q/k norms"
    knobs = BASE_KNOBS | {"kv_heads", "head_dim"}
    head_dim = 16

    def build(self, spec: ModelSpec, b) -> None:
        E, D = spec.n_embd, spec.head_dim
        b.u32(KA.HEAD_COUNT, spec.n_head)
        b.u32(KA.HEAD_COUNT_KV, spec.n_head_kv[0])
        b.u32(KA.KEY_LENGTH, D)
        b.u32(KA.VALUE_LENGTH, D)
        b.u32(K.FEED_FORWARD_LENGTH, spec.n_ff)
        b.f32(KA.LAYERNORM_RMS_EPS, 1e-6)
        blocks.embeddings(b, spec)
        for i in range(spec.n_layer):
            b.t(T.ATTN_NORM, (E,), blocks.NORM, bid=i)
            blocks.attention(b, spec, i, qk_norm="head")
            b.t(T.FFN_NORM, (E,), blocks.NORM, bid=i)
            blocks.ffn_dense(b, E, spec.n_ff, i)
