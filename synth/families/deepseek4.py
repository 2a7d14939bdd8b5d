"""deepseek4: DeepSeek-V4. Every layer attends through a sliding window of raw K (one MQA head, K = V) and, per
`attention.compress_ratios`, also through compressed blocks of past tokens: ratio 4 (CSA: overlapping blocks of 4,
picked by a lightning indexer with its own compressed keys), ratio 128 (HCA: blocks of 128, all visible) or 0 (the
window only). The compressors keep a ring of not-yet-complete rows per sequence, so llama.cpp serves the arch from
its own memory, llama_kv_cache_dsv4 (raw SWA cache + CSA/HCA/indexer caches + three compressor states). The
residual is hyper_connection.count (4) streams of n_embd mixed by Sinkhorn-normalized matrices; the attention output
goes through grouped low-rank projections (attn_output_a/b); the first `hash_layer_count` layers route experts by
token id (ffn_gate_tid2eid), the rest by sqrt(softplus) scores with a bias; every layer has a shared expert.

Fixture layout (4 layers): ratios 0, 4, 128, 4, …: layer 0 is window-only and the one hash-routed layer, then CSA
and HCA alternate. The window is 8 tokens, so a test prompt outgrows it and the compressed rows carry the rest;
the indexer's top-k (4) is below the CSA rows of a 40-token prompt, so the sparse selection really runs."""

from __future__ import annotations

import gguf
import numpy as np

from synth.errors import UserError
from synth.families import _tier1 as t1
from synth.families import blocks
from synth.families.base import BASE_KNOBS, KA, MOE_KNOBS, Family, K, T
from synth.spec import ModelSpec
from synth.weights import Init, raw_stream

KH = gguf.Keys.HyperConnection

CSA, HCA = 4, 128  # the compression ratios llama.cpp accepts besides 0 (deepseek4.cpp load_arch_tensors)
HC_STREAMS = 4  # build_hc_pre asserts hc == 4 (deepseek4.cpp)
HC_MIX = (2 + HC_STREAMS) * HC_STREAMS  # pre (4) + post (4) + the 4x4 combination matrix, per token
O_GROUPS = 2  # attention output groups; heads must divide into them
O_LORA_RANK = 8
WINDOW = 8  # attention.sliding_window: the raw cache's window
HASH_LAYERS = 1  # layers routed by token id (DeepSeek-V4 has 3 of 43)
GATING_SQRT_SOFTPLUS = 4  # LLAMA_EXPERT_GATING_FUNC_TYPE_SQRT_SOFTPLUS: the only scoring the loader accepts
SINKHORN_ITERS = 20
SWIGLU_CLAMP = 10.0
HC_SCALE = Init.around(1.0, 0.1)  # the pre/post/comb gains (hc_*_scale)
HC_BASE = Init.std(0.5)


def compress_ratios(n_layer: int) -> list[int]:
    """0 on layer 0 (the window alone), then CSA and HCA layers alternating."""
    return [0 if i == 0 else CSA if i % 2 else HCA for i in range(n_layer)]


def hash_routes(seed: int, name: str, n_used: int, n_expert: int, n_vocab: int) -> np.ndarray:
    """ffn_gate_tid2eid as the converter writes it (I32, ne [n_used, n_vocab]): each token's experts, distinct,
    drawn from (seed, name) like every other tensor."""
    first = (raw_stream(seed, name, n_vocab) % np.uint64(n_expert)).astype(np.int64)
    return ((first[:, None] + np.arange(n_used)[None, :]) % n_expert).astype(np.int32)


class DeepSeek4(Family):
    name = "deepseek4"
    arch = gguf.MODEL_ARCH.DEEPSEEK4
    kind = "dense"  # every layer attends; llama.cpp counts the arch hybrid for its compressor state
    rope = "partial"  # RoPE on the last n_rot = head_dim/2 dims of each head (check() checks the halves)
    summary = ("DeepSeek-V4: SWA raw K + CSA (indexer top-k) / HCA compressed K per layer (llama_kv_cache_dsv4), "
               "4 hyper-connection streams, grouped low-rank output, hash-routed first layer, MoE + shared expert")
    knobs = BASE_KNOBS | MOE_KNOBS | {"head_dim", "shared_experts", "q_lora_rank", "indexer_top_k"}
    mha_only = "one raw K head serves all query heads (attn_kv is [n_embd, head_dim])"
    n_embd = 16  # (the 4 hyper-connection streams and their mixers scale with it: 12 layers stay within 1 MB)
    n_head_kv = 1
    head_dim = 16
    n_expert = 4
    n_expert_used = 2
    n_expert_shared = 1
    q_lora_rank = 8
    indexer = True
    indexer_top_k = 4
    swa_pattern = (0, False)  # every layer is SWA (deepseek4.cpp: set_swa_pattern(0)); a stage keeps that
    stage_input = (f"the deepseek4 residual is {HC_STREAMS} hyper-connection streams of n_embd (deepseek4.cpp: "
                   "hc_init repeats the input into them; build_hc_pre asserts hc == 4), but a stage's output is "
                   "read as their mean (build_hc_mean) and embedding input is n_embd wide (build_inp_embd): no cut "
                   "can hand the streams on")

    def embd_refusal(self, g) -> str | None:
        if int(g.get("hash_layer_count", 0) or 0) > 0:
            return ("deepseek4's hash layers route experts by token id (ffn_gate_tid2eid); for embedding input "
                    "the graph routes them by score instead (deepseek4.cpp: is_media = ubatch.embd != nullptr), "
                    "so hidden states cannot stand in for tokens")
        return None

    def stage_refusal(self, g, a: int, b: int) -> str | None:
        return None if (a, b) == (0, int(g.get("block_count", 0))) else self.stage_input

    def derive(self, spec: ModelSpec) -> dict[str, int]:
        return t1.mla_derive(spec) | {"indexer_heads": t1.INDEXER_HEADS, "indexer_dk": t1.INDEXER_KEY_LENGTH}

    def check(self, spec: ModelSpec) -> None:
        D = spec.head_dim
        if D < 4 or D % 4:
            raise UserError(f"family {self.name}: --head-dim {D} must be a multiple of 4 (at least 4): each head "
                            "splits into RoPE and no-RoPE halves of even size")
        if spec.q_lora_rank < 1:
            raise UserError(f"family {self.name}: --q-lora-rank {spec.q_lora_rank} is not supported: deepseek4 "
                            "always reads the compressed q (the indexer queries come from it); use >= 1")
        t1.check_indexer(self, spec)
        if CSA not in compress_ratios(spec.n_layer):
            raise UserError(f"family {self.name}: --layers {spec.n_layer} has no CSA (ratio 4) layer, and llama.cpp "
                            "divides by zero creating a context without one (the empty indexer cache's Hadamard "
                            "size, llama-kv-cache.cpp build_input_k_rot); use --layers >= 2")
        t1.check_moe_lead(self, spec, experts_required=True)
        if spec.n_head % O_GROUPS:
            raise UserError(f"family {self.name}: --heads {spec.n_head} must be a multiple of {O_GROUPS} (the "
                            "attention output groups; llama.cpp asserts n_head % output_group_count == 0)")

    def build(self, spec: ModelSpec, b) -> None:
        E, H, D, V, x = spec.n_embd, spec.n_head, spec.head_dim, spec.n_vocab, spec.extra
        ql, fe, dk, hi = spec.q_lora_rank, x["n_ff_exp"], x["indexer_dk"], x["indexer_heads"]
        ratios = compress_ratios(spec.n_layer)
        b.f32(KA.LAYERNORM_RMS_EPS, 1e-6)
        b.u32(KA.HEAD_COUNT, H)
        b.u32(KA.HEAD_COUNT_KV, 1)
        b.u32(KA.KEY_LENGTH, D)
        b.u32(KA.VALUE_LENGTH, D)  # llama.cpp asserts K and V head dims are equal: the cache holds K only
        b.u32(t1.KR.DIMENSION_COUNT, x["n_rot"])
        b.u32(KA.Q_LORA_RANK, ql)
        b.u32(KA.SLIDING_WINDOW, WINDOW)
        b.u32(KA.OUTPUT_GROUP_COUNT, O_GROUPS)
        b.u32(KA.OUTPUT_LORA_RANK, O_LORA_RANK)
        b.u32s(KA.COMPRESS_RATIOS, ratios)
        b.f32(KA.COMPRESS_ROPE_FREQ_BASE, 160000.0)
        t1.indexer_keys(b, spec)
        b.u32(KH.COUNT, HC_STREAMS)
        b.u32(KH.SINKHORN_ITERATIONS, SINKHORN_ITERS)
        b.f32(KH.EPSILON, 1e-6)
        b.u32(K.HASH_LAYER_COUNT, min(HASH_LAYERS, spec.n_layer))
        b.u32(K.FEED_FORWARD_LENGTH, spec.n_ff)
        b.u32(K.EXPERT_COUNT, spec.n_expert)
        b.u32(K.EXPERT_USED_COUNT, spec.n_expert_used)
        b.u32(K.EXPERT_FEED_FORWARD_LENGTH, fe)
        b.u32(K.EXPERT_SHARED_COUNT, spec.n_expert_shared)
        b.f32(K.EXPERT_WEIGHTS_SCALE, 1.5)
        b.flag(K.EXPERT_WEIGHTS_NORM, True)
        b.u32(K.EXPERT_GATING_FUNC, GATING_SQRT_SOFTPLUS)
        b.f32(K.SWIGLU_CLAMP_EXP, SWIGLU_CLAMP)
        blocks.embeddings(b, spec)
        b.t(T.HC_HEAD_FN, (HC_STREAMS * E, HC_STREAMS))
        b.t(T.HC_HEAD_BASE, (HC_STREAMS,), HC_BASE)
        b.t(T.HC_HEAD_SCALE, (1,), HC_SCALE)
        for i, ratio in enumerate(ratios):
            b.t(T.ATTN_NORM, (E,), blocks.NORM, bid=i)
            b.t(T.ATTN_SINKS, (H,), blocks.BIAS, bid=i)
            b.t(T.ATTN_Q_A, (E, ql), bid=i)
            b.t(T.ATTN_Q_A_NORM, (ql,), blocks.NORM, bid=i)
            b.t(T.ATTN_Q_B, (ql, H * D), bid=i)
            b.t(T.ATTN_KV, (E, D), bid=i)
            b.t(T.ATTN_KV_NORM, (D,), blocks.NORM, bid=i)
            # the file holds wo_a 2-D; llama.cpp reshapes it to [H·D/groups, rank, groups]
            b.t(T.ATTN_OUT_A, (H * D // O_GROUPS, O_LORA_RANK * O_GROUPS), bid=i)
            b.t(T.ATTN_OUT_B, (O_GROUPS * O_LORA_RANK, E), bid=i)
            for fn, base, scale in ((T.HC_ATTN_FN, T.HC_ATTN_BASE, T.HC_ATTN_SCALE),
                                    (T.HC_FFN_FN, T.HC_FFN_BASE, T.HC_FFN_SCALE)):
                b.t(fn, (HC_STREAMS * E, HC_MIX), bid=i)
                b.t(base, (HC_MIX,), HC_BASE, bid=i)
                b.t(scale, (3,), HC_SCALE, bid=i)
            if ratio:
                w = 2 * D if ratio == CSA else D  # CSA blocks overlap: two halves per compressed row
                b.t(T.ATTN_COMPRESSOR_WKV, (E, w), bid=i)
                b.t(T.ATTN_COMPRESSOR_WGATE, (E, w), bid=i)
                b.t(T.ATTN_COMPRESSOR_APE, (w, ratio), blocks.BIAS, bid=i)
                b.t(T.ATTN_COMPRESSOR_NORM, (D,), blocks.NORM, bid=i)
            if ratio == CSA:  # the lightning indexer and its own compressor
                b.t(T.INDEXER_PROJ, (E, hi), bid=i)
                b.t(T.INDEXER_ATTN_Q_B, (ql, hi * dk), bid=i)
                b.t(T.INDEXER_COMPRESSOR_WKV, (E, 2 * dk), bid=i)
                b.t(T.INDEXER_COMPRESSOR_WGATE, (E, 2 * dk), bid=i)
                b.t(T.INDEXER_COMPRESSOR_APE, (2 * dk, ratio), blocks.BIAS, bid=i)
                b.t(T.INDEXER_COMPRESSOR_NORM, (dk,), blocks.NORM, bid=i)
            b.t(T.FFN_NORM, (E,), blocks.NORM, bid=i)
            hashed = i < HASH_LAYERS
            blocks.ffn_moe(b, E, fe, spec.n_expert, i, probs_bias=not hashed)
            if hashed:  # a placeholder here: to_gguf writes the I32 routing table
                b.t(T.FFN_GATE_TID2EID, (spec.n_expert_used, V), bid=i)
            blocks.ffn_shared(b, E, fe * spec.n_expert_shared, i)

    def to_gguf(self, spec: ModelSpec):
        kv, tensors = super().to_gguf(spec)
        routed = {f"{gguf.TENSOR_NAMES[T.FFN_GATE_TID2EID].format(bid=i)}.weight" for i in range(HASH_LAYERS)}
        return kv, [(n, hash_routes(spec.seed, n, spec.n_expert_used, spec.n_expert, spec.n_vocab)
                     if n in routed else arr) for n, arr in tensors]
