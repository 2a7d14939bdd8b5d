"""minimax-m2: MiniMax-M2 MoE. q/k RMS norms span the full projection width ([H*D] and [Hkv*D], not per
head); NEOX RoPE over half the head dim; sigmoid routing with a required exp_probs_b bias; output.weight is
required (no tied fallback). Trap: the expert tensors are sized by feed_forward_length, not by the (also
required) expert_feed_forward_length, so both are written equal; --ff is that expert width."""

import gguf

from synth.errors import UserError
from synth.families import blocks
from synth.families.base import BASE_KNOBS, KA, MOE_KNOBS, Family, K, T
from synth.spec import ModelSpec


class MiniMaxM2(Family):
    name = "minimax-m2"
    arch = gguf.MODEL_ARCH.MINIMAXM2
    kind = "dense"
    summary = "MiniMax-M2 MoE: full-width q/k norms, sigmoid routing with exp_probs_b, experts sized by --ff"
    knobs = BASE_KNOBS | MOE_KNOBS | {"kv_heads", "head_dim"}
    head_dim = 16
    n_ff = 16
    n_expert = 4
    n_expert_used = 2

    def check(self, spec: ModelSpec) -> None:
        if not spec.n_expert:
            raise self.reject("experts", "0: minimax-m2 is MoE on every layer (expert_count must be > 0)")
        if spec.head_dim % 4:
            raise UserError(f"family {self.name}: --head-dim {spec.head_dim} must be a multiple of 4 "
                            "(RoPE covers an even half of it)")

    def build(self, spec: ModelSpec, b) -> None:
        E, D = spec.n_embd, spec.head_dim
        b.u32(KA.HEAD_COUNT, spec.n_head)
        b.u32(KA.HEAD_COUNT_KV, spec.n_head_kv[0])
        b.u32(KA.KEY_LENGTH, D)
        b.u32(KA.VALUE_LENGTH, D)
        b.u32(gguf.Keys.Rope.DIMENSION_COUNT, D // 2)  # MiniMax-M2: 64 of 128
        b.u32(K.FEED_FORWARD_LENGTH, spec.n_ff)
        b.u32(K.EXPERT_FEED_FORWARD_LENGTH, spec.n_ff)
        b.u32(K.EXPERT_COUNT, spec.n_expert)
        b.u32(K.EXPERT_USED_COUNT, spec.n_expert_used)
        b.u32(K.EXPERT_GATING_FUNC, 2)  # sigmoid, as the real model
        b.f32(KA.LAYERNORM_RMS_EPS, 1e-6)
        blocks.embeddings(b, spec)
        for i in range(spec.n_layer):
            b.t(T.ATTN_NORM, (E,), blocks.NORM, bid=i)
            blocks.attention(b, spec, i, qk_norm="full")
            b.t(T.FFN_NORM, (E,), blocks.NORM, bid=i)
            blocks.ffn_moe(b, E, spec.n_ff, spec.n_expert, i, probs_bias=True)
