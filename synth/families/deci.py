"""deci: DeciLM / Llama-3.1-Nemotron-NAS, llama-like but K/V heads per layer (head_count_kv array, honoured by
tensors and graph: uneven K/V widths). Its other per-layer forms (0 K/V heads = "linear attention", no-attention
or no-FFN layers) are not expressible with these knobs; rope dims must equal the head dim (load check).
"""

import gguf

from synth.families import _tier3 as t3
from synth.families import blocks
from synth.families.base import KA, Family, K, T
from synth.spec import ModelSpec


class Deci(Family):
    name = "deci"
    arch = gguf.MODEL_ARCH.DECI
    kind = "dense"
    summary = "DeciLM/Nemotron-NAS (tier 3): per-layer K/V heads"
    knobs = t3.GQA_KNOBS | {"head_dim"}
    per_layer_kv = True

    def build(self, spec: ModelSpec, b) -> None:
        E, F = spec.n_embd, spec.n_ff
        b.f32(KA.LAYERNORM_RMS_EPS, 1e-5)
        b.u32(KA.HEAD_COUNT, spec.n_head)
        b.u32s(KA.HEAD_COUNT_KV, spec.n_head_kv)
        t3.head_dim_keys(b, spec)
        b.u32(K.FEED_FORWARD_LENGTH, F)
        blocks.embeddings(b, spec)
        for i in range(spec.n_layer):
            b.t(T.ATTN_NORM, (E,), blocks.NORM, bid=i)
            blocks.attention(b, spec, i)  # K/V sized by this layer's head_count_kv
            b.t(T.FFN_NORM, (E,), blocks.NORM, bid=i)
            blocks.ffn_dense(b, E, F, i)
