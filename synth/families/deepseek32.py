"""deepseek32: DeepSeek-V3.2 = deepseek2's MLA + MoE plus the DSA lightning indexer on every layer (its own
per-layer indexer-key cache); attention keeps only the indexer's top-k keys. The indexer queries come from the
compressed q, so q_lora_rank > 0; expert_gating_func is read without a default. The default top-k (4) is
smaller than a typical test prompt, so the sparse selection really runs."""

import gguf

from synth.errors import UserError
from synth.families import _tier1 as t1
from synth.families import blocks
from synth.families.base import BASE_KNOBS, Family, K, T
from synth.spec import ModelSpec


class DeepSeek32(Family):
    name = "deepseek32"
    arch = gguf.MODEL_ARCH.DEEPSEEK32
    kind = "dense"
    summary = "DeepSeek-V3.2: MLA + DSA indexer on every layer (top-k sparse attention), MoE after leading dense"
    knobs = BASE_KNOBS | t1.MLA_KNOBS | {"indexer", "indexer_top_k"}
    n_head_kv = 1
    head_dim = 16
    n_expert = 4
    n_expert_used = 2
    n_expert_shared = 1
    n_leading_dense = 1
    q_lora_rank = 16
    kv_lora_rank = 16
    indexer = True
    indexer_top_k = 4

    def derive(self, spec: ModelSpec) -> dict[str, int]:
        return t1.mla_derive(spec) | {"indexer_heads": t1.INDEXER_HEADS, "indexer_dk": t1.INDEXER_KEY_LENGTH}

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
