"""internlm2: dense GQA transformer (RoPE NORM), RMS norms, untied output head (required by the loader,
models/internlm2.cpp:20). Q and attn_output are sized by n_embd, so head dim = E/H (internlm2.cpp:27-29)."""

import gguf

from synth.families import blocks
from synth.families._tier2b import attn_keys
from synth.families.base import BASE_KNOBS, Family, T
from synth.spec import ModelSpec


class InternLM2(Family):
    name = "internlm2"
    arch = gguf.MODEL_ARCH.INTERNLM2
    kind = "dense"
    summary = "InternLM2 dense GQA"
    knobs = BASE_KNOBS | {"kv_heads"}

    def build(self, spec: ModelSpec, b) -> None:
        E = spec.n_embd
        attn_keys(b, spec, head_dims=False, rms_eps=1e-5)
        blocks.embeddings(b, spec)
        for i in range(spec.n_layer):
            b.t(T.ATTN_NORM, (E,), blocks.NORM, bid=i)
            blocks.attention(b, spec, i)
            b.t(T.FFN_NORM, (E,), blocks.NORM, bid=i)
            blocks.ffn_dense(b, E, spec.n_ff, i)
