"""falcon-h1: every layer runs attention and Mamba-2 in parallel; no interleave knob."""

import gguf

from synth.families import blocks
from synth.families.base import BASE_KNOBS, KA, Family, K, T
from synth.families.mamba2 import mamba2_dims, mamba2_keys, mamba2_layer
from synth.spec import ModelSpec


class FalconH1(Family):
    name = "falcon-h1"
    arch = gguf.MODEL_ARCH.FALCON_H1
    kind = "hybrid"
    summary = "Falcon-H1: attention and Mamba-2 in parallel in every layer"
    knobs = BASE_KNOBS | {"kv_heads"}
    parallel_hybrid = True

    def derive(self, spec: ModelSpec) -> dict[str, int]:
        return mamba2_dims(spec.n_embd)

    def build(self, spec: ModelSpec, b) -> None:
        E = spec.n_embd
        mamba2_keys(b, spec.extra)
        b.f32(KA.LAYERNORM_RMS_EPS, 1e-5)
        b.u32(KA.HEAD_COUNT, spec.n_head)
        b.u32(KA.HEAD_COUNT_KV, spec.n_head_kv[0])
        b.u32(K.FEED_FORWARD_LENGTH, spec.n_ff)
        blocks.embeddings(b, spec)
        for i in range(spec.n_layer):
            b.t(T.ATTN_NORM, (E,), blocks.NORM, bid=i)
            mamba2_layer(b, spec, i)
            blocks.attention(b, spec, i)
            b.t(T.FFN_NORM, (E,), blocks.NORM, bid=i, suffix=None)  # falcon-h1: no ".weight"
            blocks.ffn_dense(b, E, spec.n_ff, i)
