"""deepseek2: DeepSeek-V2/V3/R1, Kimi-K2 and GLM-4.7-Flash. MLA attention (one latent K head of
kv_lora + RoPE dims, no V cache), compressed q when q_lora_rank > 0 (plain attn_q when 0), dense FFN on the
`leading_dense_block_count` first layers and routed + shared experts after them; sigmoid gating (V3/GLM)."""

import gguf

from synth.errors import UserError
from synth.families import _tier1 as t1
from synth.families import blocks
from synth.families.base import K, T
from synth.spec import ModelSpec


class DeepSeek2(t1.MlaFamily):
    name = "deepseek2"
    arch = gguf.MODEL_ARCH.DEEPSEEK2
    summary = "DeepSeek-V2/V3 / GLM-4.7-Flash: MLA, --q-lora-rank 0 = plain attn_q, MoE after leading dense"

    def check(self, spec: ModelSpec) -> None:
        t1.check_mla(self, spec, q_lora_required=False)
        t1.check_moe_lead(self, spec)
        # deepseek2.cpp:8-13: 26/27-layer files (and 48 layers with vocab 128256) are "lite": q_lora_rank is
        # not read, so the loader wants attn_q whatever the file says.
        lite = spec.n_layer in (26, 27) or (spec.n_layer == 48 and spec.n_vocab == 128256)
        if lite and spec.q_lora_rank:
            raise UserError(f"family {self.name}: --q-lora-rank {spec.q_lora_rank} with --layers {spec.n_layer}: "
                            "llama.cpp treats this layer count as DeepSeek-V2-Lite and ignores q_lora_rank; "
                            "use --q-lora-rank 0 or another --layers")

    def build(self, spec: ModelSpec, b) -> None:
        E = spec.n_embd
        fe = spec.extra["n_ff_exp"]
        t1.mla_keys(b, spec)
        t1.moe_keys(b, spec, fe)
        if spec.n_expert:
            b.u32(K.EXPERT_GATING_FUNC, t1.GATING_SIGMOID)
        blocks.embeddings(b, spec)
        for i in range(spec.n_layer):
            b.t(T.ATTN_NORM, (E,), blocks.NORM, bid=i)
            t1.mla_attention(b, spec, i)
            b.t(T.FFN_NORM, (E,), blocks.NORM, bid=i)
            t1.ffn_lead_or_moe(b, spec, i, fe)
