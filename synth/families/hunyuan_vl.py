"""hunyuan_vl: HunyuanOCR / Hunyuan-VL text decoder — hunyuan-dense's layers plus XD-RoPE: 4
rope.dimension_sections (optional, src/models/hunyuan-vl.cpp:5, but converted files write them) switch RoPE to
M-RoPE (src/llama-model.cpp:3203-3204); embedding input then needs 4 positions per token.
"""

import gguf

from synth.families import _tier2a
from synth.families.base import BASE_KNOBS, Family
from synth.families.hunyuan_dense import build_hunyuan
from synth.spec import ModelSpec


class HunyuanVL(Family):
    name = "hunyuan_vl"
    arch = gguf.MODEL_ARCH.HUNYUAN_VL
    kind = "dense"
    summary = "Hunyuan-VL text decoder: hunyuan-dense with XD-RoPE (M-RoPE sections)"
    knobs = BASE_KNOBS | {"kv_heads", "head_dim"}
    head_dim = 16

    def check(self, spec: ModelSpec) -> None:
        _tier2a.check_mrope(self, spec)

    def build(self, spec: ModelSpec, b) -> None:
        build_hunyuan(spec, b, sections=True)
