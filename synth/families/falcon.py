"""falcon: Falcon-7B style — one LayerNorm (weight + bias) feeding attention and a GELU MLP in parallel,
fused attn_qkv [E, E + 2·Hkv·D] (multi-query: 1 K/V head by default), NEOX rotary over the whole head
(llama.cpp rejects rope.dimension_count != head dim, src/llama-model.cpp:1450-1453); no ffn_norm.
"""

import gguf

from synth.families import _tier2a, blocks
from synth.families.base import BASE_KNOBS, KA, Family, K, T
from synth.spec import ModelSpec


class Falcon(Family):
    name = "falcon"
    arch = gguf.MODEL_ARCH.FALCON
    kind = "dense"
    summary = "Falcon-7B: parallel attention/MLP, LayerNorm, fused QKV, multi-query"
    knobs = BASE_KNOBS | {"kv_heads"}
    n_head_kv = 1

    def build(self, spec: ModelSpec, b) -> None:
        E = spec.n_embd
        _tier2a.attn_heads(b, spec)
        b.u32(K.FEED_FORWARD_LENGTH, spec.n_ff)
        b.f32(KA.LAYERNORM_EPS, 1e-5)
        blocks.embeddings(b, spec)
        b.t(T.OUTPUT_NORM, (E,), blocks.BIAS, suffix="bias")
        qkv = E + 2 * spec.n_head_kv[0] * spec.head_dim
        for i in range(spec.n_layer):
            _tier2a.layernorm(b, T.ATTN_NORM, E, i)
            b.t(T.ATTN_QKV, (E, qkv), bid=i)
            b.t(T.ATTN_OUT, (E, E), bid=i)
            b.t(T.FFN_UP, (E, spec.n_ff), bid=i)
            b.t(T.FFN_DOWN, (spec.n_ff, E), bid=i)
