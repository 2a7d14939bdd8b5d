"""gemma4: Gemma 4 text decoder. Default = the E4B row: per-layer token embeddings (PLE), sliding-window and
global layers with different head dims and K/V head counts, and the last layers reading earlier layers' KV
(shared KV). --experts gives the 26B-A4B row instead: every FFN is a dense MLP plus a routed MoE, no PLE,
no KV sharing. The fixture alternates sliding/global layers (real models: 5:1), --head-dim sets the sliding
head dim and global layers use twice it (Gemma 4: 256 / 512).

Stage contracts (pinned llama.cpp, src/models/gemma4.cpp):
- Embedding scale sqrt(n_embd) only for token input (:165); PLE inputs are built from the token ids (:476-485)
  and, for embedding input, from token 0's row (:486-499) — per-layer inputs must travel between stages; they
  are also sized [n_embd_per_layer·n_layer, V] by the stage's own n_layer (:59-60).
- Sliding window: `attention.sliding_window` and the bool array `attention.sliding_window_pattern` are both
  required (:6, :16); SWA layers use key_length_swa/value_length_swa (required, :19-20), rope.dimension_count_swa
  and rope.freq_base_swa (src/llama-hparams.cpp:110-143); global layers need `rope_freqs` (first one required,
  then duplicated, :94-98).
- Shared KV: n_layer_kv_from_start = n_layer - `attention.shared_kv_layers` (:11); layers from there on have
  no K/V (k/k_norm optional, :74) and read the cache of layer kv_from_start-2 (sliding) or -1 (global)
  (src/llama-model.cpp:2780-2787): so layer kv_from_start-1 must be global, kv_from_start-2 sliding, and a
  consumer's K/V head count must equal its producer's (the cache view uses the consumer's hparams,
  src/llama-kv-cache.cpp:1288-1290) — a --kv-heads list that breaks a pairing shrinks the shared tail.
  GGML_ASSERT(n_layer_kv_from_start >= 2) runs for every gemma4 model, shared or not: at least 2 layers.
  A stage holding consumers must hold (or be sent) its producers' KV.
- Per-layer head_count / head_count_kv / feed_forward_length are honoured (:70-73, :101, :189-190).
Upstream's test-llama-archs skips gemma4 (tests/test-llama-archs.cpp:669-671, 740-741: "ISWA KV cache
initialization needs more fixture params" — its saver writes sliding_window_pattern as a scalar, which
gemma4 reads with the required get_arr); with the array written, the pinned llama.cpp runs it on CPU.
"""

from __future__ import annotations

from dataclasses import replace

import gguf

from synth.families import blocks
from synth.families.base import BASE_KNOBS, KA, MOE_KNOBS, Family, K, T
from synth.spec import Knobs, ModelSpec
from synth.weights import Init

KR = gguf.Keys.Rope
SWA_PERIOD = 2  # layer i slides iff i % 2 == 0 (real Gemma 4: 5 sliding, then 1 global)
SLIDING_WINDOW = 8
N_EMBD_PER_LAYER = 8  # PLE width (Gemma 4 E4B: 256)
KV_SWA, KV_FULL = 2, 1  # default K/V heads of sliding / global layers


def is_swa(i: int) -> bool:
    return i % SWA_PERIOD < SWA_PERIOD - 1


def kv_from_start(n_layer: int, moe: bool, kv_heads: tuple[int, ...] | None = None) -> int:
    """First layer without its own KV: about half the layers share (E2B 15/35, E4B 24/42 own KV); the last
    producer must be global and the one before it sliding, so the boundary is a multiple of the period. A
    --kv-heads list where a would-be consumer differs from its producer moves the boundary up (sharing needs
    equal K/V heads), down to no sharing at all."""
    if moe or n_layer < 2:
        return n_layer
    half = -(-n_layer // 2)
    start = max(SWA_PERIOD, -(-half // SWA_PERIOD) * SWA_PERIOD)
    while kv_heads is not None and start < n_layer and \
            any(kv_heads[i] != kv_heads[producer(i, start)] for i in range(start, n_layer)):
        start += SWA_PERIOD
    return min(start, n_layer)


def producer(i: int, start: int) -> int:
    """The layer whose KV cache layer i reads (itself if it has its own KV)."""
    if i < start:
        return i
    return start - (2 if is_swa(i) else 1)


class Gemma4(Family):
    name = "gemma4"
    arch = gguf.MODEL_ARCH.GEMMA4
    kind = "dense"
    token_scale = True  # sqrt(n_embd) on token input only (ubatch.token ? sqrtf(n_embd) : 1)
    summary = "Gemma 4 E4B (PLE, shared KV, sliding/global head dims); --experts: 26B-A4B MoE"
    knobs = BASE_KNOBS | MOE_KNOBS | {"kv_heads", "head_dim"}
    per_layer_kv = True
    n_head = 4
    n_head_kv = KV_SWA
    head_dim = 8
    min_layers = 2  # GGML_ASSERT(n_layer_kv_from_start >= 2), src/llama-model.cpp:2782
    embd_input = ("per-layer embeddings (PLE) come from the token ids; for embedding input llama.cpp uses token "
                  "0's row instead (gemma4.cpp:486-499), so hidden states cannot stand in for tokens")

    def stage_refusal(self, g, a: int, b: int) -> str | None:
        if b - a < 2:
            return "llama.cpp asserts n_layer_kv_from_start >= 2 for every gemma4 model (llama-model.cpp:2782)"
        swa = g.get("attention.sliding_window_pattern")
        if isinstance(swa, list) and all(swa[a:b]):
            return ("a stage with no global layer leaves rope_freqs unconsumed (it is loaded with the first global "
                    "layer)")
        return None

    def embd_refusal(self, g) -> str | None:
        # only the E-layouts have per-layer embeddings; the MoE (A4B) layout takes embedding input
        return self.embd_input if "per_layer_token_embd.weight" in g.tensors else None

    def _kv_heads(self, knobs: Knobs, pattern: str, n_head: int) -> tuple[int, ...]:
        if knobs.kv_heads is None:  # Gemma 4 writes one value for sliding and one for global layers
            fit = [kv if kv <= n_head and n_head % kv == 0 else 1 for kv in (KV_SWA, KV_FULL)]  # e.g. --heads 1
            knobs = replace(knobs, kv_heads=tuple(fit[0] if is_swa(i) else fit[1] for i in range(len(pattern))))
        return super()._kv_heads(knobs, pattern, n_head)

    def derive(self, spec: ModelSpec) -> dict[str, int]:
        moe = spec.n_expert > 0
        return {"head_dim_full": 2 * spec.head_dim, "kv_from_start": kv_from_start(spec.n_layer, moe, spec.n_head_kv),
                "n_embd_per_layer": 0 if moe else N_EMBD_PER_LAYER, "n_ff_exp": max(1, spec.n_ff // 2)}

    def check(self, spec: ModelSpec) -> None:
        if spec.n_layer < self.min_layers:
            raise self.reject("layers", f"{spec.n_layer}: gemma4 needs at least 2 layers (llama.cpp asserts "
                              "n_layer_kv_from_start >= 2 for every gemma4 model)")

    def build(self, spec: ModelSpec, b) -> None:
        E, V, L, H, x = spec.n_embd, spec.n_vocab, spec.n_layer, spec.n_head, spec.extra
        d_swa, d_full, start, P = spec.head_dim, x["head_dim_full"], x["kv_from_start"], x["n_embd_per_layer"]
        b.u32(KA.HEAD_COUNT, H)
        b.u32s(KA.HEAD_COUNT_KV, spec.n_head_kv)
        b.u32(KA.KEY_LENGTH, d_full)
        b.u32(KA.VALUE_LENGTH, d_full)
        b.u32(KA.KEY_LENGTH_SWA, d_swa)
        b.u32(KA.VALUE_LENGTH_SWA, d_swa)
        b.u32(KR.DIMENSION_COUNT, d_full)
        b.u32(KR.DIMENSION_COUNT_SWA, d_swa)
        b.u32(KA.SLIDING_WINDOW, SLIDING_WINDOW)
        b.bools(KA.SLIDING_WINDOW_PATTERN, [is_swa(i) for i in range(L)])
        b.u32(KA.SHARED_KV_LAYERS, L - start)
        b.u32(K.EMBD_LENGTH_PER_LAYER_INP, P)
        b.f32(KA.LAYERNORM_RMS_EPS, 1e-6)
        b.f32(K.FINAL_LOGIT_SOFTCAPPING, 30.0)
        b.u32(K.FEED_FORWARD_LENGTH, spec.n_ff)
        if spec.n_expert:
            b.u32(K.EXPERT_COUNT, spec.n_expert)
            b.u32(K.EXPERT_USED_COUNT, spec.n_expert_used)
            b.u32(K.EXPERT_FEED_FORWARD_LENGTH, x["n_ff_exp"])
        blocks.embeddings(b, spec)
        if P:
            b.t(T.PER_LAYER_TOKEN_EMBD, (P * L, V), Init.std(P**-0.5))  # the graph scales it by sqrt(P)
            b.t(T.PER_LAYER_MODEL_PROJ, (E, P * L))
            b.t(T.PER_LAYER_PROJ_NORM, (P,), blocks.NORM)
        if not all(is_swa(i) for i in range(L)):
            b.t(T.ROPE_FREQS, (d_full // 2,), Init.const(1.0))  # global layers' rope factors: plain RoPE
        for i in range(L):
            D, Hkv = (d_swa if is_swa(i) else d_full), spec.n_head_kv[i]
            b.t(T.ATTN_NORM, (E,), blocks.NORM, bid=i)
            b.t(T.ATTN_Q, (E, H * D), bid=i)
            b.t(T.ATTN_Q_NORM, (D,), blocks.NORM, bid=i)
            if i < start:  # producers only (attn_v is optional: without it V = K)
                b.t(T.ATTN_K, (E, Hkv * D), bid=i)
                b.t(T.ATTN_V, (E, Hkv * D), bid=i)
                b.t(T.ATTN_K_NORM, (D,), blocks.NORM, bid=i)
            b.t(T.ATTN_OUT, (H * D, E), bid=i)
            b.t(T.ATTN_POST_NORM, (E,), blocks.NORM, bid=i)
            b.t(T.FFN_NORM, (E,), blocks.NORM, bid=i)
            blocks.ffn_dense(b, E, spec.n_ff, i)
            b.t(T.FFN_POST_NORM, (E,), blocks.NORM, bid=i)
            if spec.n_expert:
                b.t(T.FFN_GATE_INP, (E, spec.n_expert), bid=i)
                b.t(T.FFN_GATE_INP, (E,), blocks.NORM, bid=i, suffix="scale")
                b.t(T.FFN_PRE_NORM_2, (E,), blocks.NORM, bid=i)
                b.t(T.FFN_POST_NORM_1, (E,), blocks.NORM, bid=i)
                b.t(T.FFN_POST_NORM_2, (E,), blocks.NORM, bid=i)
                b.t(T.FFN_GATE_EXP, (E, x["n_ff_exp"], spec.n_expert), bid=i)
                b.t(T.FFN_UP_EXP, (E, x["n_ff_exp"], spec.n_expert), bid=i)
                b.t(T.FFN_DOWN_EXP, (x["n_ff_exp"], E, spec.n_expert), bid=i)
            if P:
                b.t(T.PER_LAYER_INP_GATE, (E, P), bid=i)
                b.t(T.PER_LAYER_PROJ, (P, E), bid=i)
                b.t(T.PER_LAYER_POST_NORM, (E,), blocks.NORM, bid=i)
