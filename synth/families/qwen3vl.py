"""qwen3vl: Qwen3-VL's dense text decoder (qwen3 layout: per-head q/k RMS norms, free head dim) with
interleaved M-RoPE (IMROPE); rope.dimension_sections (4 entries) is required (src/models/qwen3vl.cpp:5).
"""

import gguf

from synth.families import _tier2a, blocks
from synth.families.base import BASE_KNOBS, KA, Family, K, T
from synth.spec import ModelSpec


class Qwen3VL(Family):
    name = "qwen3vl"
    arch = gguf.MODEL_ARCH.QWEN3VL
    kind = "dense"
    summary = "Qwen3-VL text decoder: qwen3 dense GQA (q/k norms) with interleaved M-RoPE"
    knobs = BASE_KNOBS | {"kv_heads", "head_dim"}
    head_dim = 16

    def check(self, spec: ModelSpec) -> None:
        _tier2a.check_mrope(self, spec)

    def build(self, spec: ModelSpec, b) -> None:
        E = spec.n_embd
        _tier2a.attn_heads(b, spec, key_length=True)
        b.u32(K.FEED_FORWARD_LENGTH, spec.n_ff)
        b.f32(KA.LAYERNORM_RMS_EPS, 1e-6)
        b.i32s(gguf.Keys.Rope.DIMENSION_SECTIONS, _tier2a.mrope_sections(spec.head_dim))
        blocks.embeddings(b, spec)
        for i in range(spec.n_layer):
            b.t(T.ATTN_NORM, (E,), blocks.NORM, bid=i)
            blocks.attention(b, spec, i, qk_norm="head")
            b.t(T.FFN_NORM, (E,), blocks.NORM, bid=i)
            blocks.ffn_dense(b, E, spec.n_ff, i)
