"""deepseek32: DeepSeek-V3.2 = deepseek2's MLA + MoE plus the DSA lightning indexer on every layer (its own
per-layer indexer-key cache); attention keeps only the indexer's top-k keys. The indexer queries come from the
compressed q, so q_lora_rank > 0; expert_gating_func is read without a default. The default top-k (4) is
smaller than a typical test prompt, so the sparse selection really runs."""

import gguf

from synth.errors import UserError
from synth.families import _tier1 as t1
from synth.families import blocks
from synth.families.base import K, T
from synth.spec import ModelSpec


class DeepSeek32(t1.MlaIndexerFamily):
    name = "deepseek32"
    arch = gguf.MODEL_ARCH.DEEPSEEK32
    summary = "DeepSeek-V3.2: MLA + DSA indexer on every layer (top-k sparse attention), MoE after leading dense"

    def check(self, spec: ModelSpec) -> None:
        if not spec.indexer:
            raise UserError(f"family {self.name}: --no-indexer is not expressible: deepseek32 requires the indexer "
                            "tensors on every layer (deepseek32.cpp:110-114); use deepseek2 for MLA without one")
        t1.check_mla(self, spec, q_lora_required=True)
        t1.check_indexer(self, spec)
        t1.check_moe_lead(self, spec)

    def build(self, spec: ModelSpec, b) -> None:
        E = spec.n_embd
        fe = spec.extra["n_ff_exp"]
        t1.mla_keys(b, spec)
        t1.moe_keys(b, spec, fe)
        b.u32(K.EXPERT_GATING_FUNC, t1.GATING_SIGMOID)  # deepseek32.cpp:32 reads it with no default
        t1.indexer_keys(b, spec)
        blocks.embeddings(b, spec)
        for i in range(spec.n_layer):
            b.t(T.ATTN_NORM, (E,), blocks.NORM, bid=i)
            t1.mla_attention(b, spec, i)
            b.t(T.FFN_NORM, (E,), blocks.NORM, bid=i)
            t1.indexer(b, spec, i)
            t1.ffn_lead_or_moe(b, spec, i, fe)
