"""mamba2: Mamba-2, every layer recurrent (SSD with heads and groups)."""

import gguf

from synth.families import blocks
from synth.families.base import KA, Family, T
from synth.spec import ModelSpec

KS = gguf.Keys.SSM


def mamba2_dims(n_embd: int, groups: int = 1) -> dict[str, int]:
    d_inner = 2 * n_embd
    return {"d_inner": d_inner, "d_conv": 4, "d_state": 16, "n_ssm_head": d_inner // 16, "n_group": groups}


def mamba2_keys(b, x: dict[str, int]) -> None:
    b.u32(KS.CONV_KERNEL, x["d_conv"])
    b.u32(KS.INNER_SIZE, x["d_inner"])
    b.u32(KS.STATE_SIZE, x["d_state"])
    b.u32(KS.TIME_STEP_RANK, x["n_ssm_head"])
    b.u32(KS.GROUP_COUNT, x["n_group"])


def mamba2_layer(b, spec: ModelSpec, i: int) -> None:
    x = spec.extra
    blocks.mamba2(b, spec.n_embd, i, d_inner=x["d_inner"], d_conv=x["d_conv"], d_state=x["d_state"],
                  n_heads=x["n_ssm_head"], n_groups=x["n_group"])


class Mamba2(Family):
    name = "mamba2"
    arch = gguf.MODEL_ARCH.MAMBA2
    kind = "recurrent"
    summary = "Mamba-2 (all layers recurrent)"
    knobs = frozenset({"layers", "embd", "vocab"})

    def derive(self, spec: ModelSpec) -> dict[str, int]:
        return mamba2_dims(spec.n_embd, groups=2)

    def build(self, spec: ModelSpec, b) -> None:
        mamba2_keys(b, spec.extra)
        b.f32(KA.LAYERNORM_RMS_EPS, 1e-5)
        blocks.embeddings(b, spec)
        for i in range(spec.n_layer):
            b.t(T.ATTN_NORM, (spec.n_embd,), blocks.NORM, bid=i)
            mamba2_layer(b, spec, i)
