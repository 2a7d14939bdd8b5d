"""glm4moe: GLM-4.5 / 4.6 (GQA, not MLA). There is no ffn_norm: post_attention_norm is the pre-FFN norm.
Dense FFN on the `leading_dense_block_count` first layers, then sigmoid-routed experts with a required
exp_probs_b bias plus the shared expert. NEOX RoPE over half the head dim; like glm4, llama.cpp aborts on
embedding input unless rope.dimension_sections is set (glm4-moe.cpp:305-308), which real text files lack."""

import gguf

from synth.errors import UserError
from synth.families import _tier1 as t1
from synth.families import blocks
from synth.families.base import BASE_KNOBS, KA, MOE_KNOBS, Family, T
from synth.spec import ModelSpec


class Glm4Moe(Family):
    name = "glm4moe"
    arch = gguf.MODEL_ARCH.GLM4_MOE
    kind = "dense"
    summary = "GLM-4.5/4.6 MoE: post_attention_norm is the pre-FFN norm, leading dense layers, shared expert"
    embd_input = ("llama.cpp aborts on embedding input without rope.dimension_sections "
                  "('does not support multimodal', glm4-moe.cpp:305-308)")
    knobs = BASE_KNOBS | MOE_KNOBS | {"kv_heads", "head_dim", "shared_experts", "leading_dense"}
    n_expert = 4
    n_expert_used = 2
    n_expert_shared = 1
    n_leading_dense = 1

    def derive(self, spec: ModelSpec) -> dict[str, int]:
        return {"n_ff_exp": max(1, spec.n_ff // 4)}

    def check(self, spec: ModelSpec) -> None:
        if spec.head_dim % 4:
            raise UserError(f"family {self.name}: --head-dim {spec.head_dim} must be a multiple of 4 "
                            "(RoPE covers an even half of it)")
        # glm4-moe.cpp:42 GGML_ASSERTs n_expert > 0 even when every layer is dense
        t1.check_moe_lead(self, spec, experts_required=True)

    def build(self, spec: ModelSpec, b) -> None:
        E, D = spec.n_embd, spec.head_dim
        fe = spec.extra["n_ff_exp"]
        b.u32(KA.HEAD_COUNT, spec.n_head)
        b.u32(KA.HEAD_COUNT_KV, spec.n_head_kv[0])
        b.u32(KA.KEY_LENGTH, D)
        b.u32(KA.VALUE_LENGTH, D)
        b.u32(gguf.Keys.Rope.DIMENSION_COUNT, D // 2)
        b.f32(KA.LAYERNORM_RMS_EPS, 1e-5)
        t1.moe_keys(b, spec, fe)  # expert_gating_func omitted: glm4moe defaults to sigmoid
        blocks.embeddings(b, spec)
        for i in range(spec.n_layer):
            b.t(T.ATTN_NORM, (E,), blocks.NORM, bid=i)
            blocks.attention(b, spec, i)
            b.t(T.ATTN_POST_NORM, (E,), blocks.NORM, bid=i)
            if i < spec.n_leading_dense:
                blocks.ffn_dense(b, E, spec.n_ff, i)
            else:
                blocks.ffn_moe(b, E, fe, spec.n_expert, i, probs_bias=True)
                blocks.ffn_shared(b, E, fe * spec.n_expert_shared, i)
