"""mistral3: Mistral-3 (Ministral) text model, llama-like dense GQA with free head dim (Q/attn_output are
H·D wide, models/mistral3.cpp:48-49; n_rot must equal D, mistral3.cpp:97); --experts makes the FFN a
Mixtral-style softmax MoE sized by feed_forward_length (mistral3.cpp:64-77)."""

import gguf

from synth.families import blocks
from synth.families._tier2b import attn_keys, moe_keys
from synth.families.base import BASE_KNOBS, MOE_KNOBS, Family, T
from synth.spec import ModelSpec


class Mistral3(Family):
    name = "mistral3"
    arch = gguf.MODEL_ARCH.MISTRAL3
    kind = "dense"
    summary = "Mistral 3 text dense GQA; --experts makes it MoE"
    knobs = BASE_KNOBS | MOE_KNOBS | {"kv_heads", "head_dim"}

    def build(self, spec: ModelSpec, b) -> None:
        E = spec.n_embd
        attn_keys(b, spec, rope=spec.head_dim, rms_eps=1e-5)
        if spec.n_expert:
            moe_keys(b, spec)
        blocks.embeddings(b, spec)
        for i in range(spec.n_layer):
            b.t(T.ATTN_NORM, (E,), blocks.NORM, bid=i)
            blocks.attention(b, spec, i)
            b.t(T.FFN_NORM, (E,), blocks.NORM, bid=i)
            if spec.n_expert:
                blocks.ffn_moe(b, E, spec.n_ff, spec.n_expert, i)
            else:
                blocks.ffn_dense(b, E, spec.n_ff, i)
