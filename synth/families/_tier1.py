"""Shared pieces of the Tier-1 families: MLA attention (deepseek2, deepseek32, glm-dsa), the DSA lightning
indexer (deepseek32, glm-dsa) and the leading-dense / MoE layer split. Not a family (leading underscore).

MLA dims from the spec: `--head-dim` is the q/k head dim Dq (`key_length_mla`), split into RoPE R = Dq/2
and no-RoPE Dq - R; the value head dim is Dq - R. The KV cache holds one latent head of kv_lora + R
(K only: llama.cpp keeps no V cache for MLA, src/llama-kv-cache.cpp:231).
"""

from __future__ import annotations

import gguf

from synth.errors import UserError
from synth.families import blocks
from synth.families.base import BASE_KNOBS, KA, Builder, Family, K, T
from synth.spec import ModelSpec

KI = gguf.Keys.Attention.Indexer
KR = gguf.Keys.Rope

GATING_SIGMOID = 2  # LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID
# DeepSeek-V3.2 / GLM-5 use 64. A key's indexer score is sum_h relu(q_h.k) w_h: exactly 0 whenever every head's
# q.k <= 0, which with 2 heads is a quarter of all keys. llama.cpp's CPU top-k breaks such ties by cell position
# (corpora/repros/deepseek32-isolation-unified-kv), so a tie-prone fixture makes every batch-shape oracle report
# that instead of what it is there to catch; with 12 heads a zero score has odds 1/4096.
INDEXER_HEADS = 12
INDEXER_KEY_LENGTH = 64  # must be a power of two >= 64 (Hadamard rotation size; notes §5)
MLA_KNOBS = frozenset({"head_dim", "experts", "experts_used", "shared_experts", "leading_dense",
                       "q_lora_rank", "kv_lora_rank"})


class MlaFamily(Family):
    """Defaults shared by the MLA families (deepseek2, deepseek32, glm-dsa); not a family itself (no name)."""

    kind = "dense"
    knobs = BASE_KNOBS | MLA_KNOBS
    n_head_kv = 1  # MLA with absorption caches one latent head
    head_dim = 16
    n_expert = 4
    n_expert_used = 2
    n_expert_shared = 1
    n_leading_dense = 1
    q_lora_rank = 16
    kv_lora_rank = 16

    def derive(self, spec: ModelSpec) -> dict[str, int]:
        return mla_derive(spec)


class MlaIndexerFamily(MlaFamily):
    """MLA plus the DSA lightning indexer (deepseek32, glm-dsa)."""

    knobs = MlaFamily.knobs | {"indexer", "indexer_top_k"}
    indexer = True
    indexer_top_k = 4
    q_lora_rank = 8  # the indexer's q_b is q_lora_rank x 12 heads x 64: 8 keeps 12 layers within 1 MB

    def derive(self, spec: ModelSpec) -> dict[str, int]:
        return mla_derive(spec) | {"indexer_heads": INDEXER_HEADS, "indexer_dk": INDEXER_KEY_LENGTH}


def mla_derive(spec: ModelSpec) -> dict[str, int]:
    dq = spec.head_dim
    rope = dq // 2
    return {"k_mla": dq, "n_rot": rope, "v_mla": dq - rope, "n_ff_exp": max(1, spec.n_ff // 4)}


def check_mla(fam: Family, spec: ModelSpec, *, q_lora_required: bool) -> None:
    dq = spec.head_dim
    if dq < 4 or dq % 4:
        raise UserError(f"family {fam.name}: --head-dim {dq} must be a multiple of 4 (at least 4): MLA splits "
                        "it into RoPE and no-RoPE halves of even size")
    if spec.kv_lora_rank < 1:
        raise UserError(f"family {fam.name}: --kv-lora-rank {spec.kv_lora_rank} must be at least 1 "
                        "(the MLA latent KV width)")
    if q_lora_required and spec.q_lora_rank < 1:
        raise UserError(f"family {fam.name}: --q-lora-rank {spec.q_lora_rank} is not supported: this arch always "
                        "reads the compressed q (the DSA indexer queries come from it); use --q-lora-rank >= 1")
    if spec.q_lora_rank < 0:
        raise UserError(f"family {fam.name}: --q-lora-rank {spec.q_lora_rank} must be >= 0")


def check_moe_lead(fam: Family, spec: ModelSpec, *, shared_required: bool = True,
                   experts_required: bool = False) -> None:
    """Layers i >= leading_dense are MoE; they need experts (and, for these archs, a shared expert)."""
    lead, n = spec.n_leading_dense, spec.n_layer
    if lead > n:
        raise UserError(f"family {fam.name}: --leading-dense {lead} exceeds --layers {n}; use 0..{n} "
                        "(layers at or after it are MoE)")
    if experts_required and not spec.n_expert:
        raise fam.reject("experts", f"0: {fam.arch_name} always needs expert_count > 0")
    if lead < n and not spec.n_expert:
        raise UserError(f"family {fam.name}: --experts 0 leaves MoE layers {lead}..{n - 1} without experts; "
                        f"give --experts >= 1 or --leading-dense {n} (all layers dense)")
    if lead < n and shared_required and spec.n_expert_shared < 1:
        raise UserError(f"family {fam.name}: --shared-experts {spec.n_expert_shared} is not supported: "
                        f"{fam.arch_name} MoE layers always add the shared expert; use --shared-experts >= 1")


def moe_keys(b: Builder, spec: ModelSpec, n_ff_exp: int) -> None:
    b.u32(K.FEED_FORWARD_LENGTH, spec.n_ff)
    b.u32(K.EXPERT_FEED_FORWARD_LENGTH, n_ff_exp)
    b.u32(K.EXPERT_SHARED_COUNT, spec.n_expert_shared)
    b.u32(K.LEADING_DENSE_BLOCK_COUNT, spec.n_leading_dense)
    if spec.n_expert:
        b.u32(K.EXPERT_COUNT, spec.n_expert)
        b.u32(K.EXPERT_USED_COUNT, spec.n_expert_used)


def mla_keys(b: Builder, spec: ModelSpec) -> None:
    x = spec.extra
    kvl = spec.kv_lora_rank
    b.f32(KA.LAYERNORM_RMS_EPS, 1e-6)
    b.u32(KA.HEAD_COUNT, spec.n_head)
    b.u32(KA.HEAD_COUNT_KV, 1)  # MLA with absorption is MQA over one latent head (notes §7.5)
    b.u32(KA.Q_LORA_RANK, spec.q_lora_rank)
    b.u32(KA.KV_LORA_RANK, kvl)
    b.u32(KR.DIMENSION_COUNT, x["n_rot"])
    b.u32(KA.KEY_LENGTH, kvl + x["n_rot"])
    b.u32(KA.VALUE_LENGTH, kvl)
    b.u32(KA.KEY_LENGTH_MLA, x["k_mla"])
    b.u32(KA.VALUE_LENGTH_MLA, x["v_mla"])


def mla_attention(b: Builder, spec: ModelSpec, i: int) -> None:
    E, H, x = spec.n_embd, spec.n_head, spec.extra
    ql, kvl, rope, dq, dv = spec.q_lora_rank, spec.kv_lora_rank, x["n_rot"], x["k_mla"], x["v_mla"]
    if ql:
        b.t(T.ATTN_Q_A_NORM, (ql,), blocks.NORM, bid=i)
        b.t(T.ATTN_Q_A, (E, ql), bid=i)
        b.t(T.ATTN_Q_B, (ql, H * dq), bid=i)
    else:
        b.t(T.ATTN_Q, (E, H * dq), bid=i)
    b.t(T.ATTN_KV_A_NORM, (kvl,), blocks.NORM, bid=i)
    b.t(T.ATTN_KV_A_MQA, (E, kvl + rope), bid=i)
    b.t(T.ATTN_K_B, (dq - rope, kvl, H), bid=i)
    b.t(T.ATTN_V_B, (kvl, dv, H), bid=i)
    b.t(T.ATTN_OUT, (H * dv, E), bid=i)


def ffn_lead_or_moe(b: Builder, spec: ModelSpec, i: int, n_ff_exp: int, *, probs_bias: bool = False) -> None:
    """Dense FFN on the leading layers, routed experts + shared expert (Fe * shared) after them; probs_bias: the
    router's exp_probs_b bias (required by dots3note and minimax-m3)."""
    E = spec.n_embd
    if i < spec.n_leading_dense:
        blocks.ffn_dense(b, E, spec.n_ff, i)
    else:
        blocks.ffn_moe(b, E, n_ff_exp, spec.n_expert, i, probs_bias=probs_bias)
        blocks.ffn_shared(b, E, n_ff_exp * spec.n_expert_shared, i)


def check_indexer(fam: Family, spec: ModelSpec) -> None:
    dk = spec.extra["indexer_dk"]
    if dk < 64 or dk & (dk - 1):
        raise UserError(f"family {fam.name}: indexer key length {dk} is not supported: llama.cpp's Hadamard "
                        "rotation needs a power of two >= 64 (64, 128, ...)")
    if spec.extra["n_rot"] > dk:
        raise UserError(f"family {fam.name}: --head-dim {spec.head_dim} puts {spec.extra['n_rot']} RoPE dims into "
                        f"the {dk}-wide indexer key (llama.cpp asserts n_rot <= indexer key length); "
                        f"use --head-dim <= {2 * dk}")
    if spec.indexer_top_k < 1:
        raise UserError(f"family {fam.name}: --indexer-top-k {spec.indexer_top_k} must be at least 1")


def indexer_keys(b: Builder, spec: ModelSpec) -> None:
    b.u32(KI.HEAD_COUNT, spec.extra["indexer_heads"])
    b.u32(KI.KEY_LENGTH, spec.extra["indexer_dk"])
    b.u32(KI.TOP_K, spec.indexer_top_k)


def indexer(b: Builder, spec: ModelSpec, i: int) -> None:
    E, dk, hi = spec.n_embd, spec.extra["indexer_dk"], spec.extra["indexer_heads"]
    b.t(T.INDEXER_K_NORM, (dk,), blocks.NORM, bid=i)
    b.t(T.INDEXER_K_NORM, (dk,), blocks.BIAS, bid=i, suffix="bias")
    b.t(T.INDEXER_PROJ, (E, hi), bid=i)
    b.t(T.INDEXER_ATTN_K, (E, dk), bid=i)
    b.t(T.INDEXER_ATTN_Q_B, (spec.q_lora_rank, hi * dk), bid=i)
