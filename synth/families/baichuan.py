"""baichuan: Baichuan, llama-like RMSNorm transformer whose positional scheme is chosen by layer count:
32 layers = 7B (RoPE), 40 = 13B (ALiBi), anything else = no positional encoding at all. output.weight
required; rope dims must equal the head dim (asserted in the graph)."""

import gguf

from synth.families import _tier3 as t3
from synth.families import blocks
from synth.families.base import KA, Family, K, T
from synth.spec import ModelSpec


class Baichuan(Family):
    name = "baichuan"
    arch = gguf.MODEL_ARCH.BAICHUAN
    kind = "dense"
    summary = "Baichuan (tier 3): RoPE at 32 layers, ALiBi at 40, none otherwise"
    knobs = t3.GQA_KNOBS

    def rope_kind(self, spec: ModelSpec) -> str | None:
        return "full" if spec.n_layer == 32 else None  # 32 layers: 7B, RoPE; 40: ALiBi; otherwise none

    def stage_refusal(self, g, a: int, b: int) -> str | None:
        n = int(g.get("block_count", 0))
        if n in (32, 40) and (a, b) != (0, n):
            return (f"baichuan picks positions by layer count (32: RoPE, 40: ALiBi, else none; baichuan.cpp:58,77-95): "
                    f"a {b - a}-layer stage of a {n}-layer model loses them")
        return None

    def build(self, spec: ModelSpec, b) -> None:
        E, F = spec.n_embd, spec.n_ff
        b.f32(KA.LAYERNORM_RMS_EPS, 1e-5)
        t3.head_counts(b, spec)
        b.u32(K.FEED_FORWARD_LENGTH, F)
        blocks.embeddings(b, spec)
        for i in range(spec.n_layer):
            b.t(T.ATTN_NORM, (E,), blocks.NORM, bid=i)
            blocks.attention(b, spec, i)
            b.t(T.FFN_NORM, (E,), blocks.NORM, bid=i)
            blocks.ffn_dense(b, E, F, i)
