"""kimi-linear: Kimi Delta Attention (KDA, recurrent) and MLA layers by per-layer head_count_kv
(0 = KDA, 1 = MLA); MoE after `leading_dense_block_count` dense layers. Kimi-Linear is 3 KDA : 1 MLA."""

import gguf

from synth.errors import UserError
from synth.families import blocks
from synth.families.base import BASE_KNOBS, KA, MOE_KNOBS, PATTERN_KNOBS, Family, K, T
from synth.spec import ModelSpec
from synth.weights import Init

KS = gguf.Keys.SSM


class KimiLinear(Family):
    name = "kimi-linear"
    arch = gguf.MODEL_ARCH.KIMI_LINEAR
    kind = "hybrid"
    rope = "partial"
    summary = "Kimi-Linear: KDA + MLA (3:1 by default), MoE after leading dense layers"
    knobs = BASE_KNOBS | PATTERN_KNOBS | MOE_KNOBS | {"shared_experts", "leading_dense", "kv_lora_rank"}
    n_layer = 8
    n_head = 2
    n_head_kv = 1  # MLA layers hold one latent KV head
    n_expert = 4
    n_expert_used = 2
    n_expert_shared = 1
    n_leading_dense = 1
    kv_lora_rank = 16

    def derive(self, spec: ModelSpec) -> dict[str, int]:
        rope = 8
        return {"d_conv": 4, "kda_head_dim": 16, "n_rot": rope, "k_mla": 16 + rope, "v_mla": 16,
                "n_ff_exp": max(1, spec.n_ff // 4)}

    def check(self, spec: ModelSpec) -> None:
        if not spec.n_expert:
            raise self.reject("experts", "0: kimi-linear is MoE (expert_count must be > 0)")
        if spec.kv_lora_rank < 1:
            raise UserError(f"family {self.name}: --kv-lora-rank {spec.kv_lora_rank} must be at least 1 "
                            "(the MLA layers' latent KV width)")
        if spec.n_leading_dense >= spec.n_layer:
            raise UserError(f"family {self.name}: --leading-dense {spec.n_leading_dense} must be below "
                            f"--layers {spec.n_layer} (the remaining layers are MoE)")

    def build(self, spec: ModelSpec, b) -> None:
        E, H, x = spec.n_embd, spec.n_head, spec.extra
        dk, kvl, rope, dq, dv = x["kda_head_dim"], spec.kv_lora_rank, x["n_rot"], x["k_mla"], x["v_mla"]
        b.f32(KA.LAYERNORM_RMS_EPS, 1e-5)
        b.u32(K.FEED_FORWARD_LENGTH, spec.n_ff)
        b.u32(K.EXPERT_COUNT, spec.n_expert)
        b.u32(K.EXPERT_USED_COUNT, spec.n_expert_used)
        b.u32(K.EXPERT_FEED_FORWARD_LENGTH, x["n_ff_exp"])
        b.u32(K.EXPERT_SHARED_COUNT, spec.n_expert_shared)
        b.u32(K.EXPERT_GATING_FUNC, 2)  # sigmoid
        b.u32(K.LEADING_DENSE_BLOCK_COUNT, spec.n_leading_dense)
        b.u32(KA.HEAD_COUNT, H)
        b.u32s(KA.HEAD_COUNT_KV, [1 if spec.is_attn(i) else 0 for i in range(spec.n_layer)])
        b.u32(KA.KV_LORA_RANK, kvl)
        b.u32(gguf.Keys.Rope.DIMENSION_COUNT, rope)
        b.u32(KA.KEY_LENGTH, kvl + rope)
        b.u32(KA.VALUE_LENGTH, kvl)
        b.u32(KA.KEY_LENGTH_MLA, dq)
        b.u32(KA.VALUE_LENGTH_MLA, dv)
        b.u32(KS.CONV_KERNEL, x["d_conv"])
        b.u32(gguf.Keys.KDA.HEAD_DIM, dk)
        blocks.embeddings(b, spec)
        for i in range(spec.n_layer):
            b.t(T.ATTN_NORM, (E,), blocks.NORM, bid=i)
            if spec.is_rec(i):
                for conv in (T.SSM_CONV1D_Q, T.SSM_CONV1D_K, T.SSM_CONV1D_V):
                    b.t(conv, (x["d_conv"], 1, dk * H), Init.std(0.5), bid=i)
                b.t(T.ATTN_Q, (E, dk * H), bid=i)
                b.t(T.ATTN_K, (E, dk * H), bid=i)
                b.t(T.ATTN_V, (E, dk * H), bid=i)
                b.t(T.SSM_F_A, (E, dk), bid=i)
                b.t(T.SSM_F_B, (dk, dk * H), bid=i)
                b.t(T.SSM_BETA, (E, H), bid=i)
                b.t(T.SSM_A, (1, H), blocks.SSM_A, bid=i, suffix=None)
                b.t(T.SSM_DT, (dk * H,), blocks.DT_BIAS, bid=i, suffix="bias")
                b.t(T.SSM_G_A, (E, dk), bid=i)
                b.t(T.SSM_G_B, (dk, dk * H), bid=i)
                b.t(T.SSM_NORM, (dk,), blocks.NORM, bid=i)
                b.t(T.ATTN_OUT, (dk * H, E), bid=i)
            else:
                b.t(T.ATTN_KV_A_NORM, (kvl,), blocks.NORM, bid=i)
                b.t(T.ATTN_Q, (E, H * dq), bid=i)
                b.t(T.ATTN_KV_A_MQA, (E, kvl + rope), bid=i)
                b.t(T.ATTN_K_B, (dq - rope, kvl, H), bid=i)
                b.t(T.ATTN_V_B, (kvl, dv, H), bid=i)
                b.t(T.ATTN_OUT, (H * dv, E), bid=i)
            b.t(T.FFN_NORM, (E,), blocks.NORM, bid=i)
            if i < spec.n_leading_dense:
                blocks.ffn_dense(b, E, spec.n_ff, i)
            else:
                blocks.ffn_moe(b, E, x["n_ff_exp"], spec.n_expert, i, probs_bias=True)
                if spec.n_expert_shared:
                    blocks.ffn_shared(b, E, x["n_ff_exp"] * spec.n_expert_shared, i)

