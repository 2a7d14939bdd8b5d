"""qwen2vl: Qwen2-VL's text decoder (qwen2 layout, Q/attn_output sized by n_embd so head dim = E/H) with M-RoPE.

rope.dimension_sections (4 entries, required: src/models/qwen2vl.cpp:4) split each head's rotary pairs into
t/h/w sections; token input broadcasts one position to all sections, embedding input needs 4 positions a token.
"""

import gguf

from synth.families import _tier2a, blocks
from synth.families.base import BASE_KNOBS, KA, Family, K, T
from synth.spec import ModelSpec


class Qwen2VL(Family):
    name = "qwen2vl"
    arch = gguf.MODEL_ARCH.QWEN2VL
    kind = "dense"
    summary = "Qwen2-VL text decoder: qwen2 dense GQA with M-RoPE sections"
    knobs = BASE_KNOBS | {"kv_heads"}
    n_head = 2
    n_head_kv = 1

    def check(self, spec: ModelSpec) -> None:
        _tier2a.check_mrope(self, spec)

    def build(self, spec: ModelSpec, b) -> None:
        E = spec.n_embd
        _tier2a.attn_heads(b, spec)
        b.u32(K.FEED_FORWARD_LENGTH, spec.n_ff)
        b.f32(KA.LAYERNORM_RMS_EPS, 1e-6)
        b.i32s(gguf.Keys.Rope.DIMENSION_SECTIONS, _tier2a.mrope_sections(spec.head_dim))
        blocks.embeddings(b, spec)
        for i in range(spec.n_layer):
            b.t(T.ATTN_NORM, (E,), blocks.NORM, bid=i)
            blocks.attention(b, spec, i)
            b.t(T.FFN_NORM, (E,), blocks.NORM, bid=i)
            blocks.ffn_dense(b, E, spec.n_ff, i)
