"""exaone: EXAONE 3.x, llama-like dense GQA (NEOX RoPE) with free head dim: Q/attn_output are H·D wide
(models/exaone.cpp:31-32) and n_rot must equal D (exaone.cpp:51)."""

import gguf

from synth.families import blocks
from synth.families._tier2b import attn_keys
from synth.families.base import BASE_KNOBS, Family, T
from synth.spec import ModelSpec


class Exaone(Family):
    name = "exaone"
    arch = gguf.MODEL_ARCH.EXAONE
    kind = "dense"
    summary = "EXAONE 3 dense GQA"
    knobs = BASE_KNOBS | {"kv_heads", "head_dim"}

    def build(self, spec: ModelSpec, b) -> None:
        E = spec.n_embd
        attn_keys(b, spec, rope=spec.head_dim, rms_eps=1e-5)
        blocks.embeddings(b, spec)
        for i in range(spec.n_layer):
            b.t(T.ATTN_NORM, (E,), blocks.NORM, bid=i)
            blocks.attention(b, spec, i)
            b.t(T.FFN_NORM, (E,), blocks.NORM, bid=i)
            blocks.ffn_dense(b, E, spec.n_ff, i)
