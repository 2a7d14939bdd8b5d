"""openelm: OpenELM, RMSNorm transformer whose head_count_kv is per layer and honoured by tensors (fused
attn_qkv [E, (H + 2·Hkv_i)·D]) and graph alike: uneven K/V widths. Per-head Q/K norms, NEOX RoPE, gated FFN;
the head is token_embd itself (an output.weight would be an unconsumed tensor).
"""

import gguf

from synth.families import _tier3 as t3
from synth.families import blocks
from synth.families.base import KA, Family, K, T
from synth.spec import ModelSpec


class OpenELM(Family):
    name = "openelm"
    arch = gguf.MODEL_ARCH.OPENELM
    kind = "dense"
    summary = "OpenELM (tier 3): per-layer K/V heads, fused QKV, tied head"
    knobs = t3.GQA_KNOBS | {"head_dim"}
    per_layer_kv = True

    def build(self, spec: ModelSpec, b) -> None:
        E, F, H, D = spec.n_embd, spec.n_ff, spec.n_head, spec.head_dim
        b.f32(KA.LAYERNORM_RMS_EPS, 1e-6)
        b.u32(KA.HEAD_COUNT, H)
        b.u32s(KA.HEAD_COUNT_KV, spec.n_head_kv)
        b.u32(KA.KEY_LENGTH, D)  # OpenELM's converter always writes the head dim
        b.u32(KA.VALUE_LENGTH, D)
        b.u32(K.FEED_FORWARD_LENGTH, F)
        t3.tied_embeddings(b, spec)
        for i in range(spec.n_layer):
            b.t(T.ATTN_NORM, (E,), blocks.NORM, bid=i)
            t3.fused_qkv(b, spec, i, bias=False)  # this layer's K/V head count
            b.t(T.ATTN_Q_NORM, (D,), blocks.NORM, bid=i)
            b.t(T.ATTN_K_NORM, (D,), blocks.NORM, bid=i)
            b.t(T.ATTN_OUT, (H * D, E), t3.residual_proj(H * D), bid=i)
            b.t(T.FFN_NORM, (E,), blocks.NORM, bid=i)
            b.t(T.FFN_GATE, (E, F), bid=i)
            b.t(T.FFN_UP, (E, F), bid=i)
            b.t(T.FFN_DOWN, (F, E), t3.residual_proj(F), bid=i)
