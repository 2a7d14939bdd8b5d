"""minimax-m3: MiniMax-M3 = MiniMax-M2-style GQA (per-head q/k RMS norms, NEOX RoPE over half the head) with
DeepSeek-V3's leading dense layers + sigmoid-routed experts and a shared expert (swigluoai FFNs), and MiniMax Sparse
Attention (MSA) on every MoE layer: an indexer (q/k projections + norms, one key head per K/V head) scores blocks of
`indexer.block_size` positions, and each query attends its `indexer.top_k` best blocks, its own `local_blocks`
forced in. The memory is llama_kv_cache_msa (llama-model.cpp create_memory): the K/V cache plus an indexer-key
cache holding only the MoE layers (leading dense layers attend densely and own no indexer).

Traps (src/models/minimax-m3.cpp): MSA runs only with flash attention (and n_seq_max 1 or per-sequence streams);
otherwise every layer falls back to dense attention, so only the flash-attention runs reach the sparse path and
the MSA context's position maps. The graph asserts indexer.head_count == head_count_kv (one indexer head per GQA
group). Every key is read without a default except the leading dense count, the weights scale and norm.
Block selection is over positions padded to 256 (get_n_pos), so a tiny block makes a short prompt span many
blocks: with the defaults (block 4, top-2 with 1 local) a 40-token run keeps about 8 of its 40 keys per query."""

import gguf

from synth.errors import UserError
from synth.families import _tier1 as t1
from synth.families import blocks
from synth.families.base import BASE_KNOBS, KA, MOE_KNOBS, Family, K, T
from synth.spec import ModelSpec

KI = gguf.Keys.Attention.Indexer
INDEXER_KEY_LENGTH = 32  # MiniMax-M3: 128; a width of its own so an indexer row never passes for a K row
BLOCK_SIZE = 4  # positions per MSA block (MiniMax-M3: 128)
LOCAL_BLOCKS = 1  # blocks forced in (the query's own); more would tie at the 1e30 bias


class MiniMaxM3(Family):
    name = "minimax-m3"
    arch = gguf.MODEL_ARCH.MINIMAXM3
    kind = "dense"
    summary = "MiniMax-M3: GQA + MSA block-sparse attention (indexer on MoE layers), leading dense, shared expert"
    knobs = BASE_KNOBS | MOE_KNOBS | {"kv_heads", "head_dim", "shared_experts", "leading_dense", "indexer_top_k"}
    head_dim = 16
    n_expert = 4
    n_expert_used = 2
    n_expert_shared = 1
    n_leading_dense = 1
    indexer = True
    indexer_top_k = 2  # blocks each query keeps, its local block included

    def derive(self, spec: ModelSpec) -> dict[str, int]:
        return {"n_ff_exp": max(1, spec.n_ff // 4), "n_rot": spec.head_dim // 2}

    def check(self, spec: ModelSpec) -> None:
        if spec.head_dim % 4:
            raise self.reject("head_dim", f"{spec.head_dim} must be a multiple of 4 (RoPE covers an even half of it)")
        if spec.extra["n_rot"] > INDEXER_KEY_LENGTH:
            raise self.reject("head_dim", f"{spec.head_dim} ropes {spec.extra['n_rot']} dims of the "
                              f"{INDEXER_KEY_LENGTH}-wide indexer key; use --head-dim <= {2 * INDEXER_KEY_LENGTH}")
        if spec.indexer_top_k < 1:
            raise UserError(f"family {self.name}: --indexer-top-k {spec.indexer_top_k} must be at least 1 (blocks "
                            "each query keeps)")
        t1.check_moe_lead(self, spec)
        if spec.n_leading_dense >= spec.n_layer:
            raise UserError(f"family {self.name}: --leading-dense {spec.n_leading_dense} leaves no MSA layer in "
                            f"{spec.n_layer} layers, and llama.cpp aborts on that with flash attention (an indexer "
                            f"input no layer uses); use --leading-dense 0..{spec.n_layer - 1} or more --layers")

    def stage_missing(self, g, layers: list[int]) -> tuple[list[int], str] | None:
        """A stage of leading dense layers only gets an MSA layer: with flash attention the graph builds the indexer
        cache's k_idxs input (build_attn_inp_kv_msa) that no dense layer uses, so it is never allocated and
        set_input_k_idxs aborts on GGML_ASSERT(buffer) at the first decode."""
        lead, n = int(g.get("leading_dense_block_count", 0) or 0), int(g.get("block_count"))
        if any(i >= lead for i in layers):
            return None
        return list(range(lead, n)), "no MSA layer (with flash attention: an unallocated k_idxs input, abort)"

    def build(self, spec: ModelSpec, b) -> None:
        E, D, Hkv = spec.n_embd, spec.head_dim, spec.n_head_kv[0]
        fe = spec.extra["n_ff_exp"]
        b.f32(KA.LAYERNORM_RMS_EPS, 1e-6)
        b.u32(KA.HEAD_COUNT, spec.n_head)
        b.u32(KA.HEAD_COUNT_KV, Hkv)
        b.u32(KA.KEY_LENGTH, D)
        b.u32(KA.VALUE_LENGTH, D)
        b.u32(gguf.Keys.Rope.DIMENSION_COUNT, spec.extra["n_rot"])  # partial: half the head, as MiniMax-M2/M3
        t1.moe_keys(b, spec, fe)
        b.u32(K.EXPERT_GATING_FUNC, t1.GATING_SIGMOID)  # read without a default
        b.flag(K.EXPERT_WEIGHTS_NORM, True)  # as the converter writes it
        b.u32(KI.HEAD_COUNT, Hkv)  # the graph asserts one indexer head per K/V head
        b.u32(KI.KEY_LENGTH, INDEXER_KEY_LENGTH)
        b.u32(KI.TOP_K, spec.indexer_top_k)
        b.u32(KI.BLOCK_SIZE, BLOCK_SIZE)
        b.u32(KI.LOCAL_BLOCKS, LOCAL_BLOCKS)
        blocks.embeddings(b, spec)
        for i in range(spec.n_layer):
            b.t(T.ATTN_NORM, (E,), blocks.NORM, bid=i)
            blocks.attention(b, spec, i, qk_norm="head")
            b.t(T.FFN_NORM, (E,), blocks.NORM, bid=i)
            t1.ffn_lead_or_moe(b, spec, i, fe, probs_bias=True)
            if i >= spec.n_leading_dense:  # MSA layers: the indexer's query (a head per K/V head) and key
                b.t(T.INDEXER_Q_PROJ, (E, Hkv * INDEXER_KEY_LENGTH), bid=i)
                b.t(T.INDEXER_K_PROJ, (E, INDEXER_KEY_LENGTH), bid=i)
                b.t(T.INDEXER_Q_NORM, (INDEXER_KEY_LENGTH,), blocks.NORM, bid=i)
                b.t(T.INDEXER_K_NORM, (INDEXER_KEY_LENGTH,), blocks.NORM, bid=i)
