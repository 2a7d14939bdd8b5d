"""mamba: Mamba-1, every layer recurrent (selective scan); d_inner must be 2·E."""

import gguf

from synth.families import blocks
from synth.families.base import KA, Family, T
from synth.spec import ModelSpec

KS = gguf.Keys.SSM


class Mamba(Family):
    name = "mamba"
    arch = gguf.MODEL_ARCH.MAMBA
    kind = "recurrent"
    summary = "Mamba-1 (all layers recurrent)"
    knobs = frozenset({"layers", "embd", "vocab"})

    def derive(self, spec: ModelSpec) -> dict[str, int]:
        return {"d_inner": 2 * spec.n_embd, "d_conv": 4, "d_state": 8, "dt_rank": -(-spec.n_embd // 16)}

    def build(self, spec: ModelSpec, b) -> None:
        x = spec.extra
        b.u32(KS.CONV_KERNEL, x["d_conv"])
        b.u32(KS.INNER_SIZE, x["d_inner"])
        b.u32(KS.STATE_SIZE, x["d_state"])
        b.u32(KS.TIME_STEP_RANK, x["dt_rank"])
        b.f32(KA.LAYERNORM_RMS_EPS, 1e-5)
        blocks.embeddings(b, spec)
        for i in range(spec.n_layer):
            b.t(T.ATTN_NORM, (spec.n_embd,), blocks.NORM, bid=i)
            blocks.mamba1(b, spec.n_embd, i, d_inner=x["d_inner"], d_conv=x["d_conv"],
                          d_state=x["d_state"], dt_rank=x["dt_rank"])
