"""olmo2: dense GQA with post-norms only (attn_post_norm and ffn_post_norm, no pre-norms) and q/k RMS norms
over the whole projection (q_norm [E], k_norm [Hkv·D]; models/olmo2.cpp:43-50); head dim = E/H.
Stage contract: a positive `attention.sliding_window` switches on OLMo-3 SWA with pattern 4 (3 SWA : 1 full,
olmo2.cpp:6-9); we write no window, so every layer is full attention."""

import gguf

from synth.families import blocks
from synth.families._tier2b import attn_keys
from synth.families.base import BASE_KNOBS, Family, T
from synth.spec import ModelSpec


class Olmo2(Family):
    name = "olmo2"
    arch = gguf.MODEL_ARCH.OLMO2
    kind = "dense"
    summary = "OLMo 2 dense GQA, post-norms and full-width q/k norms"
    knobs = BASE_KNOBS | {"kv_heads"}

    def build(self, spec: ModelSpec, b) -> None:
        E = spec.n_embd
        attn_keys(b, spec, head_dims=False)
        blocks.embeddings(b, spec)
        for i in range(spec.n_layer):
            blocks.attention(b, spec, i, qk_norm="full")
            b.t(T.ATTN_POST_NORM, (E,), blocks.NORM, bid=i)
            blocks.ffn_dense(b, E, spec.n_ff, i)
            b.t(T.FFN_POST_NORM, (E,), blocks.NORM, bid=i)
