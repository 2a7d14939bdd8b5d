"""minicpm: MiniCPM (1/2), llama-like GQA with free head dim (n_rot must equal D) run through the Granite graph
(models/models.h:1745); --experts makes it MiniCPM-MoE (softmax top-k, experts sized by feed_forward_length).
Stage contract (three scales, all written explicitly here): `embedding_scale` multiplies the input embeddings
inside build_inp_embd, for token AND embedding input alike when n_deepstack_layers == 0 (llama-graph.cpp:
2447-2451), so a later stage fed hidden states through llama_batch.embd scales them again; `residual_scale`
multiplies both branch outputs of every layer (granite.cpp:250-251, 310-311), defaulting to 1.4/sqrt(n_layer)
of the FILE when the key is absent (minicpm.cpp:6), so a stage file needs the full model's value;
`logit_scale` divides the logits (granite.cpp:198; default 256/n_embd, minicpm.cpp:7)."""

import gguf

from synth.families import blocks
from synth.families._tier2b import attn_keys, embeddings, moe_keys
from synth.families.base import BASE_KNOBS, MOE_KNOBS, Family, K, T
from synth.spec import ModelSpec

EMBEDDING_SCALE = 12.0  # MiniCPM's scale_emb
SCALE_DEPTH = 1.4  # MiniCPM's scale_depth: residual_scale = scale_depth / sqrt(n_layer)
DIM_MODEL_BASE = 16  # logit_scale = n_embd / dim_model_base (the converter's rule); 2.0 at n_embd 32


class MiniCPM(Family):
    name = "minicpm"
    arch = gguf.MODEL_ARCH.MINICPM
    kind = "dense"
    summary = "MiniCPM dense GQA with embedding/residual/logit scales; --experts makes it MoE"
    knobs = BASE_KNOBS | MOE_KNOBS | {"kv_heads", "head_dim"}

    def build(self, spec: ModelSpec, b) -> None:
        E = spec.n_embd
        attn_keys(b, spec, rope=spec.head_dim, rms_eps=1e-5)
        b.f32(K.EMBEDDING_SCALE, EMBEDDING_SCALE)
        b.f32(K.RESIDUAL_SCALE, SCALE_DEPTH / spec.n_layer**0.5)
        b.f32(K.LOGIT_SCALE, E / DIM_MODEL_BASE)
        if spec.n_expert:
            moe_keys(b, spec)
        embeddings(b, spec, embd_std=1.0 / EMBEDDING_SCALE)  # the graph multiplies by EMBEDDING_SCALE
        for i in range(spec.n_layer):
            b.t(T.ATTN_NORM, (E,), blocks.NORM, bid=i)
            blocks.attention(b, spec, i)
            b.t(T.FFN_NORM, (E,), blocks.NORM, bid=i)
            if spec.n_expert:
                blocks.ffn_moe(b, E, spec.n_ff, spec.n_expert, i)
            else:
                blocks.ffn_dense(b, E, spec.n_ff, i)
