"""qwen4exp: Qwen3.8-Flash-Next: Qwen3.5's gated delta-net and gated attention layers (interval 4 by default) with
hyper-connections in place of every layer norm, QSA sparse attention on the full-attention layers, MoE with a
sigmoid-gated shared expert everywhere (models/qwen4exp.cpp).

- Hyper-connections: the residual is `hyper_connection.count` streams of n_embd (res_hc [n_embd, hc, T],
  qwen4exp.cpp:392-398); before the token mixer and before the MoE a low-rank gate (hc_*_norm/down/up) mixes them
  into one and hc_*_inject scatters the block output back. The final mixer (output_hc_*) is the output norm: there
  is no output_norm. The loader throws on count <= 1 and on a zero low rank (:50-55).
- QSA: the indexer (indexer.q_proj/k_proj/q_norm/k_norm, every attention layer: required, :223-227, as are its
  three keys, :59-64) scores mean-pooled blocks of `attention.compress_ratios[il]` cached keys and attention keeps
  the top `indexer.top_k` tokens in whole blocks plus the tail (:590-700). The converter writes the ratio on
  full-attention layers and 0 elsewhere (conversion/qwen4exp.py:64-68); so do we. The indexer keys live in a cache
  of their own inside llama_memory_hybrid_idx, which create_memory builds for this arch (llama-model.cpp:2687).
- PLE n-gram hash embeddings are optional (no `ple.layers` key: none, as a checkpoint with empty ple_layer_ids
  converts, conversion/qwen4exp.py:70-74); this family writes none.

Stage contract: a stage after the first would need the hc-stream residual, but batch.embd carries n_embd per token
(hparams.n_embd_inp() is n_embd; the graph repeats it into hc identical streams, qwen4exp.cpp:392), and the graph
names the layer output l_last-N, so no residual is captured either: embedding input is refused as hidden-state input
(only the first stage can run; the sweep's control run is unsupported)."""

import gguf

from synth.errors import UserError
from synth.families import blocks
from synth.families._tier1 import indexer_keys
from synth.families._tier2b import attn_keys
from synth.families.base import KA, MOE_KNOBS, K, T
from synth.families.qwen3next import gated_deltanet_keys
from synth.families.qwen35 import Qwen35, gated_deltanet, imrope_sections
from synth.spec import ModelSpec

KH = gguf.Keys.HyperConnection

HC_COUNT = 4  # residual streams; small models of the family (and DeepSeek-V4's mHC) use 4
HC_LOW_RANK = 8  # the mixers' gate rank
# Indexer heads: a block's score is sum_h relu(q_h . k): 0 whenever every head's dot product is <= 0, and tied
# scores make top-k pick by cell position; with 8 heads that happens to one block in 256.
INDEXER_HEADS = 8
INDEXER_KEY_LENGTH = 16
COMPRESS_RATIO = 4  # tokens per indexer block; the top-k budget (8) is then two whole blocks


class Qwen4Exp(Qwen35):
    name = "qwen4exp"
    arch = gguf.MODEL_ARCH.QWEN4EXP
    summary = "Qwen3.8-Flash-Next: gated delta-net + QSA sparse attention (3:1), hyper-connections, MoE"
    knobs = Qwen35.knobs | MOE_KNOBS | {"indexer_top_k"}
    n_layer = 4
    n_expert = 4
    n_expert_used = 2
    indexer = True  # always: the loader requires the indexer tensors and keys (qwen4exp.cpp:59-64, 223-227)
    indexer_top_k = 2 * COMPRESS_RATIO
    embd_input = ("the residual between qwen4exp layers is hyper_connection.count streams of n_embd "
                  "(qwen4exp.cpp:392-398, named l_last-N, not l_out-N: :445), but batch.embd carries n_embd per "
                  "token (hparams.n_embd_inp()): no stage after the first can take it")

    def derive(self, spec: ModelSpec) -> dict[str, int]:
        return super().derive(spec) | {
            "hc": HC_COUNT, "hc_rank": HC_LOW_RANK, "indexer_heads": INDEXER_HEADS, "indexer_dk": INDEXER_KEY_LENGTH,
            "compress_ratio": COMPRESS_RATIO, "n_ff_exp": max(1, spec.n_ff // 4), "n_ff_shexp": max(1, spec.n_ff // 4)}

    def check(self, spec: ModelSpec) -> None:
        super().check(spec)
        if not spec.n_expert:
            raise self.reject("experts", "0: qwen4exp is MoE on every layer (ffn_gate_inp is required, "
                              "qwen4exp.cpp:253)")
        if spec.indexer_top_k < 1:
            raise UserError(f"family {self.name}: --indexer-top-k {spec.indexer_top_k} must be at least 1 "
                            "(llama.cpp throws on a zero indexer.top_k)")
        if spec.extra["n_rot"] > INDEXER_KEY_LENGTH:
            raise UserError(f"family {self.name}: --head-dim {spec.head_dim} rotates {spec.extra['n_rot']} dims, "
                            f"more than the {INDEXER_KEY_LENGTH}-wide indexer key the same RoPE runs over; "
                            f"use --head-dim <= {2 * INDEXER_KEY_LENGTH}")

    def build(self, spec: ModelSpec, b) -> None:
        E, D, x = spec.n_embd, spec.head_dim, spec.extra
        hc, hc_dim, rank = x["hc"], x["hc"] * E, x["hc_rank"]
        attn_keys(b, spec, kv=max(spec.n_head_kv), rope=x["n_rot"])
        imrope_sections(b, x["n_rot"])
        gated_deltanet_keys(b, spec)
        b.u32(K.EXPERT_COUNT, spec.n_expert)
        b.u32(K.EXPERT_USED_COUNT, spec.n_expert_used)
        b.u32(K.EXPERT_FEED_FORWARD_LENGTH, x["n_ff_exp"])
        b.u32(K.EXPERT_SHARED_FEED_FORWARD_LENGTH, x["n_ff_shexp"])
        b.u32(KH.COUNT, hc)
        b.u32(KH.LOW_RANK, rank)
        indexer_keys(b, spec)
        b.u32s(KA.COMPRESS_RATIOS, [x["compress_ratio"] if spec.is_attn(i) else 0 for i in range(spec.n_layer)])
        blocks.embeddings(b, spec, output_norm=False)
        hc_mixer(b, hc_dim, hc, rank, T.HC_HEAD_NORM, T.HC_HEAD_DOWN, T.HC_HEAD_UP)
        for i in range(spec.n_layer):
            hc_mixer(b, hc_dim, hc, rank, T.HC_ATTN_NORM, T.HC_ATTN_DOWN, T.HC_ATTN_UP, T.HC_ATTN_INJECT, bid=i)
            hc_mixer(b, hc_dim, hc, rank, T.HC_FFN_NORM, T.HC_FFN_DOWN, T.HC_FFN_UP, T.HC_FFN_INJECT, bid=i)
            if spec.is_rec(i):
                gated_deltanet(b, spec, i)
            else:
                blocks.attention(b, spec, i, q_width=2 * spec.n_head * D, qk_norm="head")
                qsa_indexer(b, spec, i)
            blocks.ffn_moe(b, E, x["n_ff_exp"], spec.n_expert, i)
            b.t(T.FFN_GATE_INP_SHEXP, (E,), bid=i)
            blocks.ffn_shared(b, E, x["n_ff_shexp"], i)


def hc_mixer(b, hc_dim: int, hc: int, rank: int, norm, down, up, inject=None, *, bid: int | None = None) -> None:
    """One hyper-connection mixer: a grouped-norm gamma [n_embd, hc] (the converter stores 1 + w), the low-rank
    gate, and (per layer) the [hc_dim, hc] scatter weights."""
    b.t(norm, (hc_dim // hc, hc), blocks.NORM, bid=bid)
    b.t(down, (hc_dim, rank), bid=bid)
    b.t(up, (rank, hc_dim), bid=bid)
    if inject is not None:
        b.t(inject, (hc_dim, hc), bid=bid)


def qsa_indexer(b, spec: ModelSpec, i: int) -> None:
    """The QSA indexer of attention layer i: n heads of queries, one key head, each with an RMS norm."""
    E, dk, heads = spec.n_embd, spec.extra["indexer_dk"], spec.extra["indexer_heads"]
    b.t(T.INDEXER_Q_PROJ, (E, heads * dk), bid=i)
    b.t(T.INDEXER_K_PROJ, (E, dk), bid=i)
    b.t(T.INDEXER_Q_NORM, (dk,), blocks.NORM, bid=i)
    b.t(T.INDEXER_K_NORM, (dk,), blocks.NORM, bid=i)
