"""laguna: Poolside Laguna (XS.2). GQA with per-head q/k norms and a softplus attention-output gate
(attn_gate [E, H], one scalar per head); honours per-layer head_count and head_count_kv in tensors and graph
(laguna.cpp:85-94, 174-204), so --kv-heads may differ per layer. Sliding window on 3 of every 4 layers (layer
i is full iff i % 4 == 0, derived from the index); SWA layers rope the whole head (rope.dimension_count_swa),
full layers half of it. Dense FFN on the leading layers, then sigmoid-routed experts (exp_probs_b required)
plus one always-on shared expert. A 1-layer fixture has no SWA layer, and llama.cpp asserts is_swa_any() when
sliding_window is set (llama-model.cpp:2807), so it is written without one (Laguna-M.1 style, all full)."""

import gguf

from synth.families import _tier1 as t1
from synth.families import blocks
from synth.families.base import BASE_KNOBS, KA, MOE_KNOBS, Family, K, T
from synth.spec import ModelSpec

KR = gguf.Keys.Rope
SLIDING_WINDOW = 4  # smaller than a typical test prompt, so SWA layers really mask


class Laguna(Family):
    name = "laguna"
    arch = gguf.MODEL_ARCH.LAGUNA
    kind = "dense"
    summary = "Laguna: gated GQA with per-layer K/V heads, SWA 3 of 4 layers, MoE + shared expert"
    knobs = BASE_KNOBS | MOE_KNOBS | {"kv_heads", "head_dim", "shared_experts", "leading_dense"}
    per_layer_kv = True
    stage_starts_full = True  # LLAMA_LOAD_LOCALS n_rot = n_rot(0): full layers in an SWA-first stage get n_rot_swa
    swa_pattern = (4, True)  # load_swa_pattern(ml, 4, dense_first=true): full at il % 4 == 0 (laguna.cpp:39)
    head_dim = 16
    n_expert = 4
    n_expert_used = 2
    n_expert_shared = 1
    n_leading_dense = 1

    def derive(self, spec: ModelSpec) -> dict[str, int]:
        return {"n_ff_exp": max(1, spec.n_ff // 4)}

    def check(self, spec: ModelSpec) -> None:
        if spec.head_dim % 4:
            raise self.reject("head_dim", f"{spec.head_dim} must be a multiple of 4 (full layers rope half of it)")
        t1.check_moe_lead(self, spec)

    def build(self, spec: ModelSpec, b) -> None:
        E, D, H = spec.n_embd, spec.head_dim, spec.n_head
        fe = spec.extra["n_ff_exp"]
        b.f32(KA.LAYERNORM_RMS_EPS, 1e-6)
        b.u32s(KA.HEAD_COUNT, [H] * spec.n_layer)  # the converter always writes the per-layer array
        if len(set(spec.n_head_kv)) == 1:
            b.u32(KA.HEAD_COUNT_KV, spec.n_head_kv[0])
        else:
            b.u32s(KA.HEAD_COUNT_KV, spec.n_head_kv)
        b.u32(KA.KEY_LENGTH, D)  # needed: the E/H default comes from layer 0's head count
        b.u32(KA.VALUE_LENGTH, D)
        b.u32(KR.DIMENSION_COUNT, D // 2)
        b.u32(KR.DIMENSION_COUNT_SWA, D)
        if spec.n_layer > 1:  # a lone layer 0 is full; sliding_window without any SWA layer aborts (below)
            b.u32(KA.SLIDING_WINDOW, SLIDING_WINDOW)
        b.u32(K.FEED_FORWARD_LENGTH, spec.n_ff)
        b.u32(K.EXPERT_FEED_FORWARD_LENGTH, fe)
        b.u32(K.EXPERT_SHARED_FEED_FORWARD_LENGTH, fe * spec.n_expert_shared)
        b.u32(K.LEADING_DENSE_BLOCK_COUNT, spec.n_leading_dense)  # required (laguna.cpp:11)
        if spec.n_expert:
            b.u32(K.EXPERT_COUNT, spec.n_expert)
            b.u32(K.EXPERT_USED_COUNT, spec.n_expert_used)
        blocks.embeddings(b, spec)
        for i in range(spec.n_layer):
            b.t(T.ATTN_NORM, (E,), blocks.NORM, bid=i)
            blocks.attention(b, spec, i, qk_norm="head")
            b.t(T.ATTN_GATE, (E, H), bid=i)
            b.t(T.FFN_NORM, (E,), blocks.NORM, bid=i)
            if i < spec.n_leading_dense:
                blocks.ffn_dense(b, E, spec.n_ff, i)
            else:
                blocks.ffn_moe(b, E, fe, spec.n_expert, i, probs_bias=True)
                blocks.ffn_shared(b, E, fe * spec.n_expert_shared, i)
