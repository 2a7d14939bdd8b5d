"""hunyuan-dense: Hunyuan dense (0.5B-7B) — llama layout with per-head q/k RMS norms applied after RoPE
(NEOX), free head dim; shares hparams, tensors and graph with hunyuan_vl (src/models/models.h:2107-2114).
expert_count <= 1 is treated as dense (src/llama-model.cpp:1337-1342).
"""

import gguf

from synth.families import _tier2a, blocks
from synth.families.base import BASE_KNOBS, KA, Family, K, T
from synth.spec import ModelSpec


class HunyuanDense(Family):
    name = "hunyuan-dense"
    arch = gguf.MODEL_ARCH.HUNYUAN_DENSE
    kind = "dense"
    summary = "Hunyuan dense: GQA with q/k norms after RoPE"
    knobs = BASE_KNOBS | {"kv_heads", "head_dim"}

    def build(self, spec: ModelSpec, b) -> None:
        build_hunyuan(spec, b, sections=False)


def build_hunyuan(spec: ModelSpec, b, *, sections: bool) -> None:
    """hunyuan-dense and hunyuan_vl (text path): same tensors; VL adds XD-RoPE sections."""
    E = spec.n_embd
    _tier2a.attn_heads(b, spec, key_length=True)
    b.u32(K.FEED_FORWARD_LENGTH, spec.n_ff)
    b.f32(KA.LAYERNORM_RMS_EPS, 1e-5)
    if sections:
        b.i32s(gguf.Keys.Rope.DIMENSION_SECTIONS, _tier2a.mrope_sections(spec.head_dim))
    blocks.embeddings(b, spec)
    for i in range(spec.n_layer):
        b.t(T.ATTN_NORM, (E,), blocks.NORM, bid=i)
        blocks.attention(b, spec, i, qk_norm="head")
        b.t(T.FFN_NORM, (E,), blocks.NORM, bid=i)
        blocks.ffn_dense(b, E, spec.n_ff, i)
