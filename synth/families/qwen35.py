"""qwen35: Qwen3.5 (dense): gated delta-net layers and gated full-attention layers (Q+gate in one attn_q,
IMROPE with the required `rope.dimension_sections`), dense SwiGLU FFN on every layer (MoE is qwen35moe).
Which layers are attention: `full_attention_interval` P (layer i is attention iff (i+1) % P == 0, default 4)
when the pattern has that shape, else the per-layer `attention.recurrent_layers` array (models/qwen35.cpp:17-23).
The delta-net input projections attn_qkv/attn_gate are loader-optional but the graph uses them
(qwen35.cpp:77-78, 233-237); ssm_beta and ssm_alpha are separate tensors (qwen3next fuses them as ssm_ba)."""

import gguf

from synth.errors import UserError
from synth.families import blocks
from synth.families._tier2b import attn_keys
from synth.families.base import BASE_KNOBS, PATTERN_KNOBS, Family, T
from synth.families.qwen3next import gated_deltanet_keys
from synth.spec import ModelSpec
from synth.weights import Init

KS = gguf.Keys.SSM
KR = gguf.Keys.Rope


def imrope_sections(b, n_rot: int) -> None:
    """The required IMROPE `rope.dimension_sections`: they cover n_rot/2 pairs as [t, h, w, 0] (qwen35, qwen4exp)."""
    half = n_rot // 2
    b.i32s(KR.DIMENSION_SECTIONS, [half - 2 * (half // 3), half // 3, half // 3, 0])


def gated_deltanet(b, spec: ModelSpec, i: int) -> None:
    """A Qwen3.5-style delta-net layer's tensors: fused qkv + output gate, conv, dt/A, separate beta and alpha
    (qwen3next fuses them as ssm_ba), gated norm, out projection (qwen35, qwen4exp)."""
    E, x = spec.n_embd, spec.extra
    hv, key_dim, value_dim = x["n_v_heads"], x["d_state"] * x["n_k_heads"], x["d_inner"]
    b.t(T.ATTN_QKV, (E, 2 * key_dim + value_dim), bid=i)
    b.t(T.ATTN_GATE, (E, value_dim), bid=i)
    b.t(T.SSM_CONV1D, (x["d_conv"], 2 * key_dim + value_dim), Init.std(0.5), bid=i)
    b.t(T.SSM_DT, (hv,), blocks.DT_BIAS, bid=i, suffix="bias")
    b.t(T.SSM_A, (hv,), blocks.SSM_A, bid=i, suffix=None)
    b.t(T.SSM_BETA, (E, hv), bid=i)
    b.t(T.SSM_ALPHA, (E, hv), bid=i)
    b.t(T.SSM_NORM, (x["d_state"],), blocks.NORM, bid=i)
    b.t(T.SSM_OUT, (value_dim, E), bid=i)


class Qwen35(Family):
    name = "qwen35"
    arch = gguf.MODEL_ARCH.QWEN35
    kind = "hybrid"
    summary = "Qwen3.5: gated delta-net + gated attention (3:1 by default), dense FFN"
    knobs = BASE_KNOBS | PATTERN_KNOBS | {"kv_heads", "head_dim"}
    n_layer = 8
    n_head = 2
    n_head_kv = 1
    head_dim = 16

    def derive(self, spec: ModelSpec) -> dict[str, int]:
        # gated delta-net: Hk key heads, Hv value heads, head dim Dk; d_inner = Dk·Hv (qwen35.cpp:55-61, 346)
        dk, hk, hv = 8, 2, 4
        n_rot = spec.head_dim // 2 if spec.head_dim % 4 == 0 else spec.head_dim  # partial rope, as Qwen3.5
        return {"d_conv": 4, "d_state": dk, "n_k_heads": hk, "n_v_heads": hv, "d_inner": dk * hv, "n_rot": n_rot}

    def check(self, spec: ModelSpec) -> None:
        if spec.head_dim % 2 or spec.head_dim < 4:
            raise UserError(f"family {self.name}: --head-dim {spec.head_dim} must be even and at least 4 "
                            "(RoPE rotates pairs of dims)")

    def build(self, spec: ModelSpec, b) -> None:
        E, D, x = spec.n_embd, spec.head_dim, spec.extra
        attn_keys(b, spec, kv=max(spec.n_head_kv), rope=x["n_rot"])
        imrope_sections(b, x["n_rot"])
        gated_deltanet_keys(b, spec)
        blocks.embeddings(b, spec)
        for i in range(spec.n_layer):
            b.t(T.ATTN_NORM, (E,), blocks.NORM, bid=i)
            b.t(T.ATTN_POST_NORM, (E,), blocks.NORM, bid=i)
            if spec.is_rec(i):
                gated_deltanet(b, spec, i)
            else:
                blocks.attention(b, spec, i, q_width=2 * spec.n_head * D, qk_norm="head")
            blocks.ffn_dense(b, E, spec.n_ff, i)
