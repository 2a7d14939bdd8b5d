"""olmo: dense GQA transformer with non-parametric LayerNorm: no attn/ffn/output norm tensors at all
(models/olmo.cpp:65-67, 104-106, 128-130), so the eps key is layer_norm_epsilon (olmo.cpp:4); head dim = E/H
(attn_output is [E, E], olmo.cpp:31). The output head is optional; we emit an untied one."""

import gguf

from synth.families import blocks
from synth.families._tier2b import attn_keys
from synth.families.base import BASE_KNOBS, Family
from synth.spec import ModelSpec


class Olmo(Family):
    name = "olmo"
    arch = gguf.MODEL_ARCH.OLMO
    kind = "dense"
    summary = "OLMo (v1) dense GQA, parameter-free LayerNorm"
    knobs = BASE_KNOBS | {"kv_heads"}

    def build(self, spec: ModelSpec, b) -> None:
        E = spec.n_embd
        attn_keys(b, spec, head_dims=False, rms_eps=None, ln_eps=1e-5)
        blocks.embeddings(b, spec, output_norm=False)
        for i in range(spec.n_layer):
            blocks.attention(b, spec, i)
            blocks.ffn_dense(b, E, spec.n_ff, i)
