"""granite: dense Granite 3.x — llama layout plus embedding_scale, residual_scale, attention_scale (replaces
1/sqrt(head dim)) and the required logit_scale (logits are divided by it); --experts gives the GraniteMoE layout.
Stage contract: embedding_scale multiplies token *and* embedding input when there are no deepstack layers
(src/llama-graph.cpp:2447-2452), so a stage fed the residual stream rescales it.
"""

import gguf

from synth.families import _tier2a, blocks
from synth.families.base import BASE_KNOBS, KA, MOE_KNOBS, OUTPUT_GAIN, Family, K, T
from synth.spec import ModelSpec
from synth.weights import Init

# Granite-3.1-8B: embedding_multiplier 12, residual_multiplier 0.22, attention_multiplier 1/head_dim,
# logits_scaling 16.
EMBEDDING_SCALE = 12.0
RESIDUAL_SCALE = 0.22
LOGIT_SCALE = 16.0


class Granite(Family):
    name = "granite"
    arch = gguf.MODEL_ARCH.GRANITE
    kind = "dense"
    summary = "Granite 3.x dense (embedding/residual/attention/logit scales); --experts: GraniteMoE"
    knobs = BASE_KNOBS | MOE_KNOBS | {"kv_heads", "head_dim"}

    def build(self, spec: ModelSpec, b) -> None:
        E, V = spec.n_embd, spec.n_vocab
        _tier2a.attn_heads(b, spec, key_length=True)
        b.u32(K.FEED_FORWARD_LENGTH, spec.n_ff)
        b.f32(KA.LAYERNORM_RMS_EPS, 1e-5)
        b.f32(K.EMBEDDING_SCALE, EMBEDDING_SCALE)
        b.f32(K.RESIDUAL_SCALE, RESIDUAL_SCALE)
        b.f32(KA.SCALE, 1.0 / spec.head_dim)
        b.f32(K.LOGIT_SCALE, LOGIT_SCALE)
        if spec.n_expert:
            b.u32(K.EXPERT_COUNT, spec.n_expert)
            b.u32(K.EXPERT_USED_COUNT, spec.n_expert_used)
        # the graph divides logits by LOGIT_SCALE: scale the head up to keep clear top-1 margins
        b.t(T.TOKEN_EMBD, (E, V), Init.std(1.0 / EMBEDDING_SCALE))
        b.t(T.OUTPUT_NORM, (E,), blocks.NORM)
        b.t(T.OUTPUT, (E, V), Init.std(LOGIT_SCALE * OUTPUT_GAIN * E**-0.5))
        for i in range(spec.n_layer):
            b.t(T.ATTN_NORM, (E,), blocks.NORM, bid=i)
            blocks.attention(b, spec, i)
            b.t(T.FFN_NORM, (E,), blocks.NORM, bid=i)
            if spec.n_expert:
                blocks.ffn_moe(b, E, spec.n_ff, spec.n_expert, i)
            else:
                blocks.ffn_dense(b, E, spec.n_ff, i)
