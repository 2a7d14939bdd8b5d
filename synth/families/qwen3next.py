"""qwen3next: gated delta-net (linear attention) layers and gated full-attention layers, MoE everywhere.

Which layers are attention: `full_attention_interval` P (layer i is attention iff (i+1) % P == 0) when the
pattern has that shape, else the per-layer `attention.recurrent_layers` array, which expresses any pattern.
"""

import gguf

from synth.families import blocks
from synth.families.base import BASE_KNOBS, KA, MOE_KNOBS, PATTERN_KNOBS, Family, K, T
from synth.spec import REC, ModelSpec, periodic_pattern
from synth.weights import Init

KS = gguf.Keys.SSM


def interval_of(pattern: str) -> int | None:
    """P if pattern == 'R'*(P-1)+'A' repeated (llama.cpp's full_attention_interval rule), else None."""
    for p in range(1, len(pattern) + 1):
        if periodic_pattern(len(pattern), p, p - 1) == pattern:
            return p
    return None


def gated_deltanet_keys(b, spec: ModelSpec) -> None:
    """The delta-net dims and which layers are attention: the interval rule when the pattern has its shape, else
    the per-layer recurrent_layers array (qwen3next, qwen35)."""
    x = spec.extra
    b.u32(KS.CONV_KERNEL, x["d_conv"])
    b.u32(KS.INNER_SIZE, x["d_inner"])
    b.u32(KS.STATE_SIZE, x["d_state"])
    b.u32(KS.TIME_STEP_RANK, x["n_v_heads"])
    b.u32(KS.GROUP_COUNT, x["n_k_heads"])
    interval = interval_of(spec.pattern)
    if interval is not None:
        b.u32(K.FULL_ATTENTION_INTERVAL, interval)
    else:
        b.bools(KA.RECURRENT_LAYERS, [c == REC for c in spec.pattern])


class Qwen3Next(Family):
    name = "qwen3next"
    arch = gguf.MODEL_ARCH.QWEN3NEXT
    kind = "hybrid"
    rope = "partial"
    summary = "Qwen3-Next: gated delta-net + gated attention (3:1 by default), MoE with shared expert"
    knobs = BASE_KNOBS | PATTERN_KNOBS | MOE_KNOBS | {"kv_heads", "head_dim"}
    n_layer = 8
    n_head = 2
    n_head_kv = 1
    head_dim = 16
    n_expert = 4
    n_expert_used = 2

    def derive(self, spec: ModelSpec) -> dict[str, int]:
        # gated delta-net: Hk key heads, Hv value heads, head dim Dk; d_inner = Dk·Hv
        dk, hk, hv = 8, 2, 4
        return {"d_conv": 4, "d_state": dk, "n_k_heads": hk, "n_v_heads": hv, "d_inner": dk * hv,
                "n_ff_exp": max(1, spec.n_ff // 4), "n_ff_shexp": max(1, spec.n_ff // 4), "n_rot": spec.head_dim // 2}

    def check(self, spec: ModelSpec) -> None:
        if not spec.n_expert:
            raise self.reject("experts", "0: qwen3next requires MoE (llama.cpp: n_expert must be > 0)")

    def build(self, spec: ModelSpec, b) -> None:
        E, D, x = spec.n_embd, spec.head_dim, spec.extra
        b.f32(KA.LAYERNORM_RMS_EPS, 1e-6)
        gated_deltanet_keys(b, spec)
        b.u32(KA.HEAD_COUNT, spec.n_head)
        b.u32(KA.HEAD_COUNT_KV, max(spec.n_head_kv))
        b.u32(KA.KEY_LENGTH, D)
        b.u32(KA.VALUE_LENGTH, D)
        b.u32(gguf.Keys.Rope.DIMENSION_COUNT, x["n_rot"])
        b.u32(K.FEED_FORWARD_LENGTH, spec.n_ff)
        b.u32(K.EXPERT_COUNT, spec.n_expert)
        b.u32(K.EXPERT_USED_COUNT, spec.n_expert_used)
        b.u32(K.EXPERT_FEED_FORWARD_LENGTH, x["n_ff_exp"])
        b.u32(K.EXPERT_SHARED_FEED_FORWARD_LENGTH, x["n_ff_shexp"])
        blocks.embeddings(b, spec)
        key_dim, value_dim = x["d_state"] * x["n_k_heads"], x["d_inner"]
        for i in range(spec.n_layer):
            b.t(T.ATTN_NORM, (E,), blocks.NORM, bid=i)
            b.t(T.ATTN_POST_NORM, (E,), blocks.NORM, bid=i)
            if spec.is_rec(i):
                b.t(T.ATTN_QKV, (E, 2 * key_dim + value_dim), bid=i)
                b.t(T.ATTN_GATE, (E, value_dim), bid=i)
                b.t(T.SSM_CONV1D, (x["d_conv"], 2 * key_dim + value_dim), Init.std(0.5), bid=i)
                b.t(T.SSM_DT, (x["n_v_heads"],), blocks.DT_BIAS, bid=i, suffix="bias")
                b.t(T.SSM_A, (x["n_v_heads"],), blocks.SSM_A, bid=i, suffix=None)
                b.t(T.SSM_BETA_ALPHA, (E, 2 * x["n_v_heads"]), bid=i)
                b.t(T.SSM_NORM, (x["d_state"],), blocks.NORM, bid=i)
                b.t(T.SSM_OUT, (value_dim, E), bid=i)
            else:
                blocks.attention(b, spec, i, q_width=2 * spec.n_head * D, qk_norm="head")
            blocks.ffn_moe(b, E, x["n_ff_exp"], spec.n_expert, i)
            b.t(T.FFN_GATE_INP_SHEXP, (E,), bid=i)
            blocks.ffn_shared(b, E, x["n_ff_shexp"], i)
