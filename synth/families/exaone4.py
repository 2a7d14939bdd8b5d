"""exaone4: EXAONE 4.0, dense GQA with per-head q/k RMS norms and post-norms only (no pre-norms,
models/exaone4.cpp:55-62); attn_output is [E, E] (exaone4.cpp:49), so head dim = E/H.
Stage contract: the 3 SWA (RoPE) : 1 full (NoPE) layer pattern exists only when block_count == 64
(exaone4.cpp:4-12, graph exaone4.cpp:111); at any other layer count swa_type is NONE and every layer is full
attention with RoPE, and `attention.sliding_window` is read but unused (exaone4.cpp:14). Default fixtures are
plain RoPE models (`--layers 64` gets the split, window 4096); a stage file with fewer blocks than the full
64-layer model silently loses the SWA/NoPE split."""

import gguf

from synth.families import blocks
from synth.families._tier2b import attn_keys
from synth.families.base import BASE_KNOBS, Family, T
from synth.spec import ModelSpec


class Exaone4(Family):
    name = "exaone4"
    arch = gguf.MODEL_ARCH.EXAONE4
    kind = "dense"
    summary = "EXAONE 4 dense GQA, post-norms, q/k norms"
    knobs = BASE_KNOBS | {"kv_heads"}

    def stage_refusal(self, g, a: int, b: int) -> str | None:
        n = int(g.get("block_count", 0))
        if n == 64 and (a, b) != (0, n):
            return ("exaone4 has SWA and NoPE layers only when block_count == 64 (exaone4.cpp:4-12): a stage "
                    "with fewer layers silently loses the split")
        return None

    def build(self, spec: ModelSpec, b) -> None:
        E = spec.n_embd
        attn_keys(b, spec, head_dims=False, rms_eps=1e-5)
        blocks.embeddings(b, spec)
        for i in range(spec.n_layer):
            blocks.attention(b, spec, i, qk_norm="head")
            b.t(T.ATTN_POST_NORM, (E,), blocks.NORM, bid=i)
            blocks.ffn_dense(b, E, spec.n_ff, i)
            b.t(T.FFN_POST_NORM, (E,), blocks.NORM, bid=i)
