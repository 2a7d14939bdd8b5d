"""jamba: Mamba-1 and attention layers interleaved by a per-layer head_count_kv (0 = Mamba).

FFN is per layer: MoE where blk.N.ffn_gate_inp exists (odd layers, as Jamba's expert period 2 / offset 1),
dense elsewhere. Jamba's own phase puts attention at offset period/2 (attn_layer_period 8, offset 4).
"""

import gguf

from synth.families import blocks
from synth.families.base import BASE_KNOBS, KA, MOE_KNOBS, PATTERN_KNOBS, Family, K, T
from synth.spec import ModelSpec

KS = gguf.Keys.SSM


class Jamba(Family):
    name = "jamba"
    arch = gguf.MODEL_ARCH.JAMBA
    kind = "hybrid"
    rope = None
    summary = "Jamba: Mamba-1 + attention, per-layer K/V heads, MoE on odd layers with --experts"
    knobs = BASE_KNOBS | PATTERN_KNOBS | MOE_KNOBS | {"kv_heads"}
    per_layer_kv = True
    n_layer = 8

    def natural_offset(self, period: int) -> int:
        return period // 2

    def derive(self, spec: ModelSpec) -> dict[str, int]:
        return {"d_inner": 2 * spec.n_embd, "d_conv": 4, "d_state": 8, "dt_rank": -(-spec.n_embd // 16)}

    def build(self, spec: ModelSpec, b) -> None:
        E, x = spec.n_embd, spec.extra
        b.u32(KS.CONV_KERNEL, x["d_conv"])
        b.u32(KS.INNER_SIZE, x["d_inner"])
        b.u32(KS.STATE_SIZE, x["d_state"])
        b.u32(KS.TIME_STEP_RANK, x["dt_rank"])
        b.f32(KA.LAYERNORM_RMS_EPS, 1e-6)
        b.u32(KA.HEAD_COUNT, spec.n_head)
        b.u32s(KA.HEAD_COUNT_KV, spec.n_head_kv)
        b.u32(K.FEED_FORWARD_LENGTH, spec.n_ff)
        if spec.n_expert:
            b.u32(K.EXPERT_COUNT, spec.n_expert)
            b.u32(K.EXPERT_USED_COUNT, spec.n_expert_used)
        blocks.embeddings(b, spec)
        for i in range(spec.n_layer):
            b.t(T.ATTN_NORM, (E,), blocks.NORM, bid=i)
            if spec.is_rec(i):
                blocks.mamba1(b, E, i, d_inner=x["d_inner"], d_conv=x["d_conv"], d_state=x["d_state"],
                              dt_rank=x["dt_rank"], dt_bc_norms=True)
            else:
                blocks.attention(b, spec, i)
            b.t(T.FFN_NORM, (E,), blocks.NORM, bid=i)
            if spec.n_expert and i % 2 == 1:
                blocks.ffn_moe(b, E, spec.n_ff, spec.n_expert, i)
            else:
                blocks.ffn_dense(b, E, spec.n_ff, i)
