"""plamo3: PLaMo 3, dense attention with per-layer head_count / head_count_kv honoured in both tensor shapes and
graph (fused attn_qkv [E, (H + 2·Hkv_i)·D] per layer, models/plamo3.cpp:37-46, 108-120), per-head q/k norms,
pre- and post-norms (post norms carry no `.weight` suffix, plamo3.cpp:50, 53) and a fused SwiGLU ffn_up [E, 2F].
Stage contract: a positive `attention.sliding_window` switches on SWA with pattern 8 (7 SWA : 1 full, by layer
index in the file, plamo3.cpp:5-9); we write no window, so every layer is full attention with RoPE."""

import gguf

from synth.families import blocks
from synth.families._tier2b import attn_keys
from synth.families.base import BASE_KNOBS, KA, Family, T
from synth.spec import ModelSpec


class Plamo3(Family):
    name = "plamo3"
    arch = gguf.MODEL_ARCH.PLAMO3
    kind = "dense"
    summary = "PLaMo 3 dense attention, per-layer K/V heads, fused QKV and SwiGLU"
    knobs = BASE_KNOBS | {"kv_heads", "head_dim"}
    per_layer_kv = True

    def build(self, spec: ModelSpec, b) -> None:
        E, H, D, F = spec.n_embd, spec.n_head, spec.head_dim, spec.n_ff
        attn_keys(b, spec)
        if len(set(spec.n_head_kv)) > 1:
            b.u32s(KA.HEAD_COUNT_KV, spec.n_head_kv)
        blocks.embeddings(b, spec)
        for i in range(spec.n_layer):
            b.t(T.ATTN_NORM, (E,), blocks.NORM, bid=i)
            b.t(T.ATTN_QKV, (E, (H + 2 * spec.n_head_kv[i]) * D), bid=i)
            b.t(T.ATTN_Q_NORM, (D,), blocks.NORM, bid=i)
            b.t(T.ATTN_K_NORM, (D,), blocks.NORM, bid=i)
            b.t(T.ATTN_OUT, (H * D, E), bid=i)
            b.t(T.ATTN_POST_NORM, (E,), blocks.NORM, bid=i, suffix=None)
            b.t(T.FFN_NORM, (E,), blocks.NORM, bid=i)
            b.t(T.FFN_POST_NORM, (E,), blocks.NORM, bid=i, suffix=None)
            b.t(T.FFN_UP, (E, 2 * F), bid=i)
            b.t(T.FFN_DOWN, (F, E), bid=i)
