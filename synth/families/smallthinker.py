"""smallthinker: SmallThinker, RMSNorm transformer with NEOX RoPE and a ReLU MoE FFN on every layer whose
router reads the un-normed residual. MoE is mandatory (the loader aborts with n_expert 0) and
expert_gating_func must be set (the MoE graph aborts on "none"); experts are expert_feed_forward_length wide.
"""

import gguf

from synth.families import _tier3 as t3
from synth.families import blocks
from synth.families.base import KA, MOE_KNOBS, Family, K, T
from synth.spec import ModelSpec

GATING_SOFTMAX = 1  # LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX


class SmallThinker(Family):
    name = "smallthinker"
    arch = gguf.MODEL_ARCH.SMALLTHINKER
    kind = "dense"
    summary = "SmallThinker (tier 3): MoE on every layer, router on the residual"
    knobs = t3.GQA_KNOBS | MOE_KNOBS | {"head_dim"}
    n_expert = 4
    n_expert_used = 2
    n_ff = 32  # experts are ff wide: 4 × 3 × E × ff per layer keeps 12 layers ≤ 1 MB

    def check(self, spec: ModelSpec) -> None:
        if not spec.n_expert:
            raise self.reject("experts", "0: smallthinker is MoE only (llama.cpp asserts n_expert > 0 at load)")

    def build(self, spec: ModelSpec, b) -> None:
        E, F, X = spec.n_embd, spec.n_ff, spec.n_expert
        b.f32(KA.LAYERNORM_RMS_EPS, 1e-5)
        t3.head_counts(b, spec)
        t3.head_dim_keys(b, spec)
        b.u32(K.FEED_FORWARD_LENGTH, F)
        b.u32(K.EXPERT_COUNT, X)
        b.u32(K.EXPERT_USED_COUNT, spec.n_expert_used)
        b.u32(K.EXPERT_FEED_FORWARD_LENGTH, F)
        b.u32(K.EXPERT_GATING_FUNC, GATING_SOFTMAX)
        blocks.embeddings(b, spec)
        for i in range(spec.n_layer):
            b.t(T.ATTN_NORM, (E,), blocks.NORM, bid=i)
            blocks.attention(b, spec, i)
            b.t(T.FFN_NORM, (E,), blocks.NORM, bid=i)
            blocks.ffn_moe(b, E, F, X, i)
