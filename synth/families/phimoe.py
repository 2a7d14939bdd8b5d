"""phimoe: Phi-3.5-MoE — phi3's graph with RMS norms that carry biases (attn/ffn/output norm biases and
output.bias are required, src/models/phimoe.cpp:20-36), attn_output bias, softmax top-k experts sized by
feed_forward_length (:38-41), every layer MoE; Q sized n_embd (head dim = E/H).
"""

import gguf

from synth.families import _tier2a, blocks
from synth.families.base import BASE_KNOBS, KA, MOE_KNOBS, Family, K, T
from synth.spec import ModelSpec


class PhiMoE(Family):
    name = "phimoe"
    arch = gguf.MODEL_ARCH.PHIMOE
    kind = "dense"
    summary = "Phi-3.5-MoE: phi3 attention, biased RMS norms, every FFN MoE"
    knobs = BASE_KNOBS | MOE_KNOBS | {"kv_heads"}
    n_ff = 32
    n_expert = 4
    n_expert_used = 2

    def check(self, spec: ModelSpec) -> None:
        if not spec.n_expert:
            raise self.reject("experts", "0: phimoe is MoE-only (every layer routes to experts); use >= 1")

    def build(self, spec: ModelSpec, b) -> None:
        E = spec.n_embd
        _tier2a.attn_heads(b, spec)
        b.u32(K.FEED_FORWARD_LENGTH, spec.n_ff)
        b.f32(KA.LAYERNORM_RMS_EPS, 1e-5)
        b.u32(K.EXPERT_COUNT, spec.n_expert)
        b.u32(K.EXPERT_USED_COUNT, spec.n_expert_used)
        blocks.embeddings(b, spec)
        b.t(T.OUTPUT_NORM, (E,), blocks.BIAS, suffix="bias")
        b.t(T.OUTPUT, (spec.n_vocab,), blocks.BIAS, suffix="bias")
        for i in range(spec.n_layer):
            _tier2a.layernorm(b, T.ATTN_NORM, E, i)
            blocks.attention(b, spec, i)
            b.t(T.ATTN_OUT, (E,), blocks.BIAS, bid=i, suffix="bias")
            _tier2a.layernorm(b, T.FFN_NORM, E, i)
            blocks.ffn_moe(b, E, spec.n_ff, spec.n_expert, i)
