"""qwen3moe: Qwen3 MoE (30B-A3B, 235B-A22B): qwen3's attention (per-head q/k RMS norms, NEOX RoPE over the
whole head, head dim independent of E/H) and routed experts on every layer, no dense FFN and no shared expert.
--ff is the expert width (expert_feed_forward_length)."""

import gguf

from synth.errors import UserError
from synth.families import blocks
from synth.families.base import BASE_KNOBS, KA, MOE_KNOBS, Family, K, T
from synth.spec import ModelSpec


def check_moe_head(fam: Family, spec: ModelSpec) -> None:
    if not spec.n_expert:
        raise fam.reject("experts", f"0: {fam.arch_name} is MoE on every layer (n_expert must be > 0)")
    if spec.head_dim % 2:
        raise UserError(f"family {fam.name}: --head-dim {spec.head_dim} must be even (RoPE covers the whole head)")


def build_qwen3_moe(spec: ModelSpec, b) -> None:
    E, D = spec.n_embd, spec.head_dim
    b.u32(KA.HEAD_COUNT, spec.n_head)
    b.u32(KA.HEAD_COUNT_KV, spec.n_head_kv[0])
    b.u32(KA.KEY_LENGTH, D)
    b.u32(KA.VALUE_LENGTH, D)
    b.u32(K.FEED_FORWARD_LENGTH, spec.n_ff)
    b.u32(K.EXPERT_FEED_FORWARD_LENGTH, spec.n_ff)
    b.u32(K.EXPERT_COUNT, spec.n_expert)
    b.u32(K.EXPERT_USED_COUNT, spec.n_expert_used)
    b.f32(KA.LAYERNORM_RMS_EPS, 1e-6)
    blocks.embeddings(b, spec)
    for i in range(spec.n_layer):
        b.t(T.ATTN_NORM, (E,), blocks.NORM, bid=i)
        blocks.attention(b, spec, i, qk_norm="head")
        b.t(T.FFN_NORM, (E,), blocks.NORM, bid=i)
        blocks.ffn_moe(b, E, spec.n_ff, spec.n_expert, i)


class Qwen3Moe(Family):
    name = "qwen3moe"
    arch = gguf.MODEL_ARCH.QWEN3MOE
    kind = "dense"
    summary = "Qwen3 MoE: qwen3 attention with q/k norms, routed experts on every layer"
    knobs = BASE_KNOBS | MOE_KNOBS | {"kv_heads", "head_dim"}
    head_dim = 16
    n_ff = 16
    n_expert = 4
    n_expert_used = 2

    def check(self, spec: ModelSpec) -> None:
        check_moe_head(self, spec)

    def build(self, spec: ModelSpec, b) -> None:
        build_qwen3_moe(spec, b)
