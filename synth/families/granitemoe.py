"""granitemoe: Granite MoE, llama-like with Granite's scalars (logit_scale is required and divides the logits)
and softmax-routed MoE on every layer; --experts 0 gives dense Granite, --shared-experts S a shared expert S·ff
wide. K/V heads come from layer 0 for every layer.
"""

import gguf

from synth.families import _tier3 as t3
from synth.families import blocks
from synth.families.base import KA, MOE_KNOBS, OUTPUT_GAIN, Family, K, T
from synth.spec import ModelSpec
from synth.weights import Init

LOGIT_SCALE = 2.0  # logits are divided by this; the head is scaled up by the same factor to keep margins


class GraniteMoe(Family):
    name = "granitemoe"
    arch = gguf.MODEL_ARCH.GRANITE_MOE
    kind = "dense"
    summary = "Granite MoE (tier 3): logit/residual/embedding scales, MoE on every layer"
    knobs = t3.GQA_KNOBS | MOE_KNOBS | {"head_dim", "shared_experts"}
    n_expert = 4
    n_expert_used = 2
    n_ff = 32  # experts are ff wide: 4 × 3 × E × ff per layer keeps 12 layers ≤ 1 MB

    def check(self, spec: ModelSpec) -> None:
        if spec.n_expert_shared and not spec.n_expert:
            raise self.reject("shared_experts", f"{spec.n_expert_shared} needs --experts > 0 (the shared "
                              "expert is part of the MoE branch)")

    def build(self, spec: ModelSpec, b) -> None:
        E, F, X = spec.n_embd, spec.n_ff, spec.n_expert
        b.f32(KA.LAYERNORM_RMS_EPS, 1e-5)
        b.f32(K.LOGIT_SCALE, LOGIT_SCALE)
        b.f32(K.EMBEDDING_SCALE, 2.0)
        b.f32(K.RESIDUAL_SCALE, 0.5)
        t3.head_counts(b, spec)
        t3.head_dim_keys(b, spec)
        b.u32(K.FEED_FORWARD_LENGTH, F)  # expert width too
        if X:
            b.u32(K.EXPERT_COUNT, X)
            b.u32(K.EXPERT_USED_COUNT, spec.n_expert_used)
        if spec.n_expert_shared:
            b.u32(K.EXPERT_SHARED_FEED_FORWARD_LENGTH, spec.n_expert_shared * F)
        b.t(T.TOKEN_EMBD, (E, spec.n_vocab), Init.std(1.0))
        b.t(T.OUTPUT_NORM, (E,), blocks.NORM)
        b.t(T.OUTPUT, (E, spec.n_vocab), Init.std(LOGIT_SCALE * OUTPUT_GAIN * E**-0.5))
        for i in range(spec.n_layer):
            b.t(T.ATTN_NORM, (E,), blocks.NORM, bid=i)
            blocks.attention(b, spec, i)
            b.t(T.FFN_NORM, (E,), blocks.NORM, bid=i)
            if X:
                blocks.ffn_moe(b, E, F, X, i)
                if spec.n_expert_shared:
                    blocks.ffn_shared(b, E, spec.n_expert_shared * F, i)
            else:
                blocks.ffn_dense(b, E, F, i)
