"""exaone-moe: K-EXAONE MoE: GQA with per-head q/k norms, sigmoid-routed experts (exp_probs_b bias) plus an
always-present shared expert after `leading_dense_block_count` dense layers (models/exaone-moe.cpp:66-89).
Stage contract: SWA is always on: `attention.sliding_window` is required (exaone-moe.cpp:11), the pattern
defaults to 4 (layers i%4 < 3 are SWA with RoPE, every 4th is full attention with NoPE, exaone-moe.cpp:6,
131-156; a per-layer bool `attention.sliding_window_pattern` array overrides it, llama-model.cpp:3435). The
pattern is by layer index inside the file, so a stage must carry an explicit per-layer pattern."""

import gguf

from synth.families import blocks
from synth.families._tier2b import attn_keys, check_leading_dense, moe_keys, require_experts
from synth.families.base import BASE_KNOBS, KA, MOE_KNOBS, Family, K, T
from synth.spec import ModelSpec

SLIDING_WINDOW = 16  # < prompt + 32 decoded tokens, so the window is exercised


class ExaoneMoe(Family):
    name = "exaone-moe"
    arch = gguf.MODEL_ARCH.EXAONE_MOE
    kind = "dense"
    swa_pattern = (4, False)  # load_swa_pattern: SWA iff il % 4 < 3; the per-layer array overrides it
    summary = "K-EXAONE MoE: SWA 3:1 (NoPE full layers), sigmoid MoE + shared expert after leading dense"
    knobs = BASE_KNOBS | MOE_KNOBS | {"kv_heads", "head_dim", "leading_dense"}
    n_expert = 4
    n_expert_used = 2
    n_leading_dense = 1

    def derive(self, spec: ModelSpec) -> dict[str, int]:
        return {"n_ff_exp": max(1, spec.n_ff // 4), "n_ff_shexp": max(1, spec.n_ff // 4),
                "sliding_window": SLIDING_WINDOW}

    def check(self, spec: ModelSpec) -> None:
        require_experts(self, spec)
        check_leading_dense(self, spec)

    def build(self, spec: ModelSpec, b) -> None:
        E, x = spec.n_embd, spec.extra
        attn_keys(b, spec, rope=spec.head_dim, rms_eps=1e-5)
        b.u32(KA.SLIDING_WINDOW, x["sliding_window"])
        moe_keys(b, spec, n_ff_exp=x["n_ff_exp"])
        b.u32(K.EXPERT_SHARED_FEED_FORWARD_LENGTH, x["n_ff_shexp"])
        b.u32(K.EXPERT_SHARED_COUNT, 1)
        b.u32(K.EXPERT_GATING_FUNC, 2)  # sigmoid
        b.flag(K.EXPERT_WEIGHTS_NORM, True)
        b.u32(K.LEADING_DENSE_BLOCK_COUNT, spec.n_leading_dense)
        blocks.embeddings(b, spec)
        for i in range(spec.n_layer):
            b.t(T.ATTN_NORM, (E,), blocks.NORM, bid=i)
            blocks.attention(b, spec, i, qk_norm="head")
            b.t(T.FFN_NORM, (E,), blocks.NORM, bid=i)
            if i < spec.n_leading_dense:
                blocks.ffn_dense(b, E, spec.n_ff, i)
            else:
                blocks.ffn_moe(b, E, x["n_ff_exp"], spec.n_expert, i, probs_bias=True)
                blocks.ffn_shared(b, E, x["n_ff_shexp"], i)
