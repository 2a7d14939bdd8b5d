"""qwen2moe: Qwen1.5/2-MoE: GQA (head dim = E/H, attn_output [E, E]) and on every layer a softmax top-k MoE
plus a sigmoid-gated shared expert (ffn_gate_inp_shexp [E], models/qwen2moe.cpp:54). Experts are sized by
expert_feed_forward_length (default F/Xu when absent, qwen2moe.cpp:45), the shared expert by
expert_shared_feed_forward_length (default F, qwen2moe.cpp:52); we write both."""

import gguf

from synth.families import blocks
from synth.families._tier2b import attn_keys, moe_keys, require_experts
from synth.families.base import BASE_KNOBS, MOE_KNOBS, Family, K, T
from synth.spec import ModelSpec


class Qwen2Moe(Family):
    name = "qwen2moe"
    arch = gguf.MODEL_ARCH.QWEN2MOE
    kind = "dense"
    summary = "Qwen2-MoE: MoE + gated shared expert every layer"
    knobs = BASE_KNOBS | MOE_KNOBS | {"kv_heads"}
    n_expert = 4
    n_expert_used = 2

    def derive(self, spec: ModelSpec) -> dict[str, int]:
        return {"n_ff_exp": max(1, spec.n_ff // 4), "n_ff_shexp": spec.n_ff}

    def check(self, spec: ModelSpec) -> None:
        require_experts(self, spec)

    def build(self, spec: ModelSpec, b) -> None:
        E, x = spec.n_embd, spec.extra
        attn_keys(b, spec, head_dims=False)
        moe_keys(b, spec, n_ff_exp=x["n_ff_exp"])
        b.u32(K.EXPERT_SHARED_FEED_FORWARD_LENGTH, x["n_ff_shexp"])
        blocks.embeddings(b, spec)
        for i in range(spec.n_layer):
            b.t(T.ATTN_NORM, (E,), blocks.NORM, bid=i)
            blocks.attention(b, spec, i)
            b.t(T.FFN_NORM, (E,), blocks.NORM, bid=i)
            blocks.ffn_moe(b, E, x["n_ff_exp"], spec.n_expert, i)
            b.t(T.FFN_GATE_INP_SHEXP, (E,), bid=i)
            blocks.ffn_shared(b, E, x["n_ff_shexp"], i)
