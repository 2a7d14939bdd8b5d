"""hunyuan-moe: Hunyuan-A13B — q/k norms after RoPE; every FFN = shared SwiGLU expert + softmax top-k experts.
Trap: expert_feed_forward_length is required (src/models/hunyuan-moe.cpp:5) but routed experts are sized by
feed_forward_length (:40-42), the shared one by expert_shared_feed_forward_length (:28); we set all equal.
"""

import gguf

from synth.families import _tier2a, blocks
from synth.families.base import BASE_KNOBS, KA, MOE_KNOBS, Family, K, T
from synth.spec import ModelSpec


class HunyuanMoE(Family):
    name = "hunyuan-moe"
    arch = gguf.MODEL_ARCH.HUNYUAN_MOE
    kind = "dense"
    summary = "Hunyuan-A13B: q/k norms, shared expert + routed experts in every layer"
    knobs = BASE_KNOBS | MOE_KNOBS | {"kv_heads", "head_dim"}
    n_ff = 16  # routed experts, shared expert and the required expert_feed_forward_length all use it
    n_expert = 4
    n_expert_used = 2

    def check(self, spec: ModelSpec) -> None:
        if not spec.n_expert:
            raise self.reject("experts", "0: hunyuan-moe is MoE-only (every layer routes to experts); use >= 1")

    def build(self, spec: ModelSpec, b) -> None:
        E, F = spec.n_embd, spec.n_ff
        _tier2a.attn_heads(b, spec, key_length=True)
        b.u32(K.FEED_FORWARD_LENGTH, F)
        b.f32(KA.LAYERNORM_RMS_EPS, 1e-5)
        b.u32(K.EXPERT_COUNT, spec.n_expert)
        b.u32(K.EXPERT_USED_COUNT, spec.n_expert_used)
        b.u32(K.EXPERT_FEED_FORWARD_LENGTH, F)
        b.u32(K.EXPERT_SHARED_FEED_FORWARD_LENGTH, F)
        blocks.embeddings(b, spec)
        for i in range(spec.n_layer):
            b.t(T.ATTN_NORM, (E,), blocks.NORM, bid=i)
            blocks.attention(b, spec, i, qk_norm="head")
            b.t(T.FFN_NORM, (E,), blocks.NORM, bid=i)
            blocks.ffn_moe(b, E, F, spec.n_expert, i)
            blocks.ffn_shared(b, E, F, i)
