"""glm-dsa: GLM-5.x = DeepSeek-V3.2-style MLA + MoE + DSA indexer, where `attention.indexer.types` marks each
layer "full" (owns indexer tensors and an indexer-key cache row) or "shared" (reuses the top-k of the previous
full layer, so it depends on an earlier layer). Layer 0 must be full (glm-dsa.cpp asserts prev_top_k).

Which layers are full: --indexer (default) = GLM-5.2's layout, layers 0 and 1 then every 4th from layer 2
(0,1,2,6,10,...; 4 layers -> full,full,full,shared); --no-indexer = only layer 0 owns an indexer and every later
layer reuses its top-k (the fewest indexers llama.cpp accepts). The types array is always written, so the
context_length-based fallback (all full below 1M context) never applies. --indexer-top-k as in deepseek32."""

import gguf

from synth.families import _tier1 as t1
from synth.families import blocks
from synth.families.base import T
from synth.spec import ModelSpec


def full_layers(n_layer: int, indexer: bool) -> list[bool]:
    """GLM-5.2 pattern (glm-dsa.cpp:6-27) with the indexer on; layer 0 alone without it."""
    return [i == 0 or (indexer and (i < 2 or (i - 2) % 4 == 0)) for i in range(n_layer)]


class GlmDsa(t1.MlaIndexerFamily):
    name = "glm-dsa"
    arch = gguf.MODEL_ARCH.GLM_DSA
    summary = "GLM-5.x: MLA + DSA indexer on 'full' layers (GLM-5.2 layout), shared layers reuse top-k; MoE"

    def check(self, spec: ModelSpec) -> None:
        t1.check_mla(self, spec, q_lora_required=True)
        t1.check_indexer(self, spec)
        t1.check_moe_lead(self, spec)

    def build(self, spec: ModelSpec, b) -> None:
        E = spec.n_embd
        fe = spec.extra["n_ff_exp"]
        full = full_layers(spec.n_layer, spec.indexer)
        t1.mla_keys(b, spec)
        t1.moe_keys(b, spec, fe)  # expert_gating_func omitted: glm-dsa defaults to sigmoid
        t1.indexer_keys(b, spec)
        b.u32s(t1.KI.TYPES, [int(f) for f in full])
        blocks.embeddings(b, spec)
        for i in range(spec.n_layer):
            b.t(T.ATTN_NORM, (E,), blocks.NORM, bid=i)
            t1.mla_attention(b, spec, i)
            b.t(T.FFN_NORM, (E,), blocks.NORM, bid=i)
            if full[i]:
                t1.indexer(b, spec, i)
            t1.ffn_lead_or_moe(b, spec, i, fe)
