"""deepseek2-ocr: DeepSeek-OCR's text decoder (a DeepSeek-V2 without MLA): plain MHA with q/k/v/o all [E, E]
and NEOX RoPE over the whole head (models/deepseek2.cpp:473-490; freq_base must be 10000, line 484), a dense
FFN on the first `leading_dense_block_count` layers, then softmax MoE + shared experts sized
expert_feed_forward_length × expert_shared_count (deepseek2ocr.cpp:50-72). K/V heads must equal --heads (the
graph uses n_head for K/V, deepseek2.cpp:478-479). Upstream's test-llama-archs skips this arch with no comment
(tests/test-llama-archs.cpp:688-690); it is not in moe_mandatory() there, so the test would only build a dense
variant (expert_count 0), which throws 'n_expert must be > 0' (deepseek2ocr.cpp:58-60). As MoE it runs on CPU."""

import gguf

from synth.errors import UserError
from synth.families import blocks
from synth.families._tier2b import attn_keys, check_leading_dense, moe_keys, require_experts
from synth.families.base import BASE_KNOBS, MOE_KNOBS, Family, K, T
from synth.spec import ModelSpec


class Deepseek2Ocr(Family):
    name = "deepseek2-ocr"
    arch = gguf.MODEL_ARCH.DEEPSEEK2OCR
    kind = "dense"
    summary = "DeepSeek-OCR text decoder: MHA (no MLA), MoE + shared experts after leading dense layers"
    knobs = BASE_KNOBS | MOE_KNOBS | {"shared_experts", "leading_dense"}
    mha_only = "the graph runs K/V with n_head heads of n_embd/n_head (models/deepseek2.cpp:474-479)"
    n_expert = 4
    n_expert_used = 2
    n_expert_shared = 1
    n_leading_dense = 1

    def derive(self, spec: ModelSpec) -> dict[str, int]:
        return {"n_ff_exp": max(1, spec.n_ff // 4)}

    def check(self, spec: ModelSpec) -> None:
        require_experts(self, spec)
        check_leading_dense(self, spec)
        if spec.n_expert_shared < 1:
            raise UserError(f"family {self.name}: --shared-experts {spec.n_expert_shared} must be at least 1 "
                            "(the shared-expert tensors are required, sized expert_ff × shared_experts)")

    def build(self, spec: ModelSpec, b) -> None:
        E, x = spec.n_embd, spec.extra
        Fs = x["n_ff_exp"] * spec.n_expert_shared
        attn_keys(b, spec, head_dims=False)
        moe_keys(b, spec, n_ff_exp=x["n_ff_exp"])
        b.u32(K.EXPERT_SHARED_COUNT, spec.n_expert_shared)
        b.u32(K.LEADING_DENSE_BLOCK_COUNT, spec.n_leading_dense)
        blocks.embeddings(b, spec)
        for i in range(spec.n_layer):
            b.t(T.ATTN_NORM, (E,), blocks.NORM, bid=i)
            blocks.attention(b, spec, i)
            b.t(T.FFN_NORM, (E,), blocks.NORM, bid=i)
            if i < spec.n_leading_dense:
                blocks.ffn_dense(b, E, spec.n_ff, i)
            else:
                blocks.ffn_moe(b, E, x["n_ff_exp"], spec.n_expert, i)
                blocks.ffn_shared(b, E, Fs, i)
