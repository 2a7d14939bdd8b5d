"""qwen3vlmoe: the text decoder of Qwen3-VL MoE. qwen3moe's layers with interleaved M-RoPE (IMROPE): it
requires `rope.dimension_sections` with exactly 4 entries (sum = half the head dim, like Qwen3-VL's
[24,20,20,0] for 128). No deepstack layers, so the input width stays n_embd; fed as embeddings it needs 4
positions per token (section-major)."""

import gguf

from synth.families.base import BASE_KNOBS, MOE_KNOBS, Family
from synth.families.qwen3moe import build_qwen3_moe, check_moe_head
from synth.spec import ModelSpec


def rope_sections(head_dim: int) -> list[int]:
    """[t, h, w, 0] summing to head_dim/2, in Qwen3-VL's proportions (64 -> 24, 20, 20)."""
    half = head_dim // 2
    hw = half * 5 // 16
    return [half - 2 * hw, hw, hw, 0]


class Qwen3VlMoe(Family):
    name = "qwen3vlmoe"
    arch = gguf.MODEL_ARCH.QWEN3VLMOE
    kind = "dense"
    summary = "Qwen3-VL MoE text path: qwen3moe with IMROPE (rope.dimension_sections, 4 entries)"
    knobs = BASE_KNOBS | MOE_KNOBS | {"kv_heads", "head_dim"}
    head_dim = 16
    n_ff = 16
    n_expert = 4
    n_expert_used = 2

    def check(self, spec: ModelSpec) -> None:
        check_moe_head(self, spec)

    def build(self, spec: ModelSpec, b) -> None:
        b.i32s(gguf.Keys.Rope.DIMENSION_SECTIONS, rope_sections(spec.head_dim))
        build_qwen3_moe(spec, b)
