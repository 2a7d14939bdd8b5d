"""smollm3: SmolLM3, llama-like dense GQA (free head dim, n_rot must equal D: models/smollm3.cpp:32-33, 50).
Stage contract: NoPE layers are hard-wired, not in the GGUF: n_no_rope_layer_step = 4 (smollm3.cpp:5) and layer
il skips RoPE iff (il + 1) % 4 == 0 (smollm3.cpp:69), with il the layer index inside the file. A stage that
starts at a layer not divisible by 4 shifts which layers are NoPE, so it computes a different function."""

import gguf

from synth.families import blocks
from synth.families._tier2b import attn_keys
from synth.families.base import BASE_KNOBS, Family, T
from synth.spec import ModelSpec


class SmolLM3(Family):
    name = "smollm3"
    arch = gguf.MODEL_ARCH.SMOLLM3
    kind = "dense"
    layer_phase = 4  # NoPE iff (il + 1) % 4 == 0 inside the file (smollm3.cpp:5,69)
    summary = "SmolLM3 dense GQA, every 4th layer NoPE"
    knobs = BASE_KNOBS | {"kv_heads", "head_dim"}

    def build(self, spec: ModelSpec, b) -> None:
        E = spec.n_embd
        attn_keys(b, spec, rope=spec.head_dim)
        blocks.embeddings(b, spec)
        for i in range(spec.n_layer):
            b.t(T.ATTN_NORM, (E,), blocks.NORM, bid=i)
            blocks.attention(b, spec, i)
            b.t(T.FFN_NORM, (E,), blocks.NORM, bid=i)
            blocks.ffn_dense(b, E, spec.n_ff, i)
