"""granitehybrid: Granite-4.0-H / Bamba. Mamba-2 and attention layers by per-layer head_count_kv
(0 = Mamba-2); per-layer K/V heads honoured; --experts makes every layer's FFN MoE."""

import gguf

from synth.families import blocks
from synth.families.base import BASE_KNOBS, KA, MOE_KNOBS, PATTERN_KNOBS, Family, K, T
from synth.families.mamba2 import mamba2_dims, mamba2_keys, mamba2_layer
from synth.spec import ModelSpec


class GraniteHybrid(Family):
    name = "granitehybrid"
    arch = gguf.MODEL_ARCH.GRANITE_HYBRID
    kind = "hybrid"
    summary = "Granite-4.0-H: Mamba-2 + attention, per-layer K/V heads, optional MoE (most flexible hybrid)"
    knobs = BASE_KNOBS | PATTERN_KNOBS | MOE_KNOBS | {"kv_heads"}
    per_layer_kv = True
    n_layer = 8

    def derive(self, spec: ModelSpec) -> dict[str, int]:
        return mamba2_dims(spec.n_embd)  # granite asserts d_inner == 2·E

    def build(self, spec: ModelSpec, b) -> None:
        E = spec.n_embd
        mamba2_keys(b, spec.extra)
        b.f32(KA.LAYERNORM_RMS_EPS, 1e-5)
        b.u32(KA.HEAD_COUNT, spec.n_head)
        b.u32s(KA.HEAD_COUNT_KV, spec.n_head_kv)
        b.u32(K.FEED_FORWARD_LENGTH, spec.n_ff)
        if spec.n_expert:
            b.u32(K.EXPERT_COUNT, spec.n_expert)
            b.u32(K.EXPERT_USED_COUNT, spec.n_expert_used)
        blocks.embeddings(b, spec)
        for i in range(spec.n_layer):
            b.t(T.ATTN_NORM, (E,), blocks.NORM, bid=i)
            if spec.is_rec(i):
                mamba2_layer(b, spec, i)
            else:
                blocks.attention(b, spec, i)
            b.t(T.FFN_NORM, (E,), blocks.NORM, bid=i)
            if spec.n_expert:
                blocks.ffn_moe(b, E, spec.n_ff, spec.n_expert, i)
            else:
                blocks.ffn_dense(b, E, spec.n_ff, i)
