"""olmoe: OLMo MoE (softmax top-k, no shared expert) on every layer, q/k RMS norms sized n_embd.
Both q_norm and k_norm are [E] (models/olmoe.cpp:28-29), so K/V heads must equal --heads; experts are sized
by feed_forward_length (olmoe.cpp:43-45)."""

import gguf

from synth.families import blocks
from synth.families._tier2b import attn_keys, moe_keys, require_experts
from synth.families.base import BASE_KNOBS, MOE_KNOBS, Family, T
from synth.spec import ModelSpec


class Olmoe(Family):
    name = "olmoe"
    arch = gguf.MODEL_ARCH.OLMOE
    kind = "dense"
    summary = "OLMoE: MoE every layer, MHA with full-width q/k norms"
    knobs = BASE_KNOBS | MOE_KNOBS
    mha_only = "attn_k_norm is sized n_embd (models/olmoe.cpp:29), so K/V heads always equal --heads"
    n_ff = 32
    n_expert = 4
    n_expert_used = 2

    def check(self, spec: ModelSpec) -> None:
        require_experts(self, spec)

    def build(self, spec: ModelSpec, b) -> None:
        E = spec.n_embd
        attn_keys(b, spec, head_dims=False, rms_eps=1e-5)
        moe_keys(b, spec)
        blocks.embeddings(b, spec)
        for i in range(spec.n_layer):
            b.t(T.ATTN_NORM, (E,), blocks.NORM, bid=i)
            blocks.attention(b, spec, i, qk_norm="full")
            b.t(T.FFN_NORM, (E,), blocks.NORM, bid=i)
            blocks.ffn_moe(b, E, spec.n_ff, spec.n_expert, i)
