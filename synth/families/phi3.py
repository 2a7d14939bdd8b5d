"""phi3: Phi-3 / Phi-4-mini — pre-norm RMS, fused attn_qkv with Q sized n_embd (head dim = E/H), fused SwiGLU
ffn_up [E, 2F], NEOX rotary; `attention.sliding_window` is read but SWA is disabled (src/models/phi3.cpp:13-24).
"""

import gguf

from synth.families import _tier2a, blocks
from synth.families.base import BASE_KNOBS, KA, Family, K, T
from synth.spec import ModelSpec


class Phi3(Family):
    name = "phi3"
    arch = gguf.MODEL_ARCH.PHI3
    kind = "dense"
    summary = "Phi-3: fused QKV and gate/up, RMS norms"
    knobs = BASE_KNOBS | {"kv_heads"}

    def build(self, spec: ModelSpec, b) -> None:
        E, F = spec.n_embd, spec.n_ff
        _tier2a.attn_heads(b, spec)
        b.u32(K.FEED_FORWARD_LENGTH, F)
        b.f32(KA.LAYERNORM_RMS_EPS, 1e-5)
        blocks.embeddings(b, spec)
        qkv = E + 2 * spec.n_head_kv[0] * spec.head_dim
        for i in range(spec.n_layer):
            b.t(T.ATTN_NORM, (E,), blocks.NORM, bid=i)
            b.t(T.ATTN_QKV, (E, qkv), bid=i)
            b.t(T.ATTN_OUT, (E, E), bid=i)
            b.t(T.FFN_NORM, (E,), blocks.NORM, bid=i)
            b.t(T.FFN_UP, (E, 2 * F), bid=i)
            b.t(T.FFN_DOWN, (F, E), bid=i)
