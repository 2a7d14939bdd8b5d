"""llama: dense GQA transformer (RoPE norm); optional Mixtral-style MoE."""

import gguf

from synth.families import blocks
from synth.families.base import BASE_KNOBS, KA, MOE_KNOBS, Family, K, T
from synth.spec import ModelSpec

KR = gguf.Keys.Rope


class Llama(Family):
    name = "llama"
    arch = gguf.MODEL_ARCH.LLAMA
    kind = "dense"
    summary = "Llama dense GQA; --experts makes it Mixtral-style MoE"
    knobs = BASE_KNOBS | MOE_KNOBS | {"kv_heads", "head_dim"}

    def build(self, spec: ModelSpec, b) -> None:
        E, D = spec.n_embd, spec.head_dim
        b.u32(KA.HEAD_COUNT, spec.n_head)
        b.u32(KA.HEAD_COUNT_KV, spec.n_head_kv[0])
        b.u32(K.FEED_FORWARD_LENGTH, spec.n_ff)
        b.f32(KA.LAYERNORM_RMS_EPS, 1e-5)
        if D != E // spec.n_head:
            b.u32(KA.KEY_LENGTH, D)
            b.u32(KA.VALUE_LENGTH, D)
        b.u32(KR.DIMENSION_COUNT, D)  # llama asserts n_rot == head dim
        if spec.n_expert:
            b.u32(K.EXPERT_COUNT, spec.n_expert)
            b.u32(K.EXPERT_USED_COUNT, spec.n_expert_used)
        blocks.embeddings(b, spec)
        for i in range(spec.n_layer):
            b.t(T.ATTN_NORM, (E,), blocks.NORM, bid=i)
            blocks.attention(b, spec, i)
            b.t(T.FFN_NORM, (E,), blocks.NORM, bid=i)
            if spec.n_expert:
                blocks.ffn_moe(b, E, spec.n_ff, spec.n_expert, i)
            else:
                blocks.ffn_dense(b, E, spec.n_ff, i)
