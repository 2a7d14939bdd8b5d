"""cohere2: Command-R7B / Command-A: parallel attention + FFN off one LayerNorm (weight only, no bias; eps key
is layer_norm_epsilon), logits scaled by the required `logit_scale` (models/cohere2.cpp:12, 151-153).
The output head is ALWAYS tied to token_embd (cohere2.cpp:29-30): an output.weight tensor would be an unused
extra tensor, so this family has none and its residual branches are scaled up to keep greedy decoding varied.
Stage contract: SWA is always on: `attention.sliding_window` is required (cohere2.cpp:11), the pattern
defaults to 4 (layers i%4 < 3 are SWA with RoPE, every 4th is full attention with NoPE, cohere2.cpp:4-5,
89-101; a per-layer bool `attention.sliding_window_pattern` array overrides it, llama-model.cpp:3435). The
pattern is by layer index inside the file, so a stage must carry an explicit per-layer pattern."""

import gguf

from synth.families import blocks
from synth.families._tier2b import attn_keys
from synth.families.base import BASE_KNOBS, KA, OUTPUT_GAIN, Family, K, T
from synth.spec import ModelSpec
from synth.weights import Init

SLIDING_WINDOW = 16  # < prompt + 32 decoded tokens, so the window is exercised
BRANCH_GAIN = 4.0  # attention/FFN output scale: the branches must outweigh the tied input embedding


class Cohere2(Family):
    name = "cohere2"
    arch = gguf.MODEL_ARCH.COHERE2
    kind = "dense"
    swa_pattern = (4, False)  # load_swa_pattern: SWA iff il % 4 < 3; the per-layer array overrides it
    summary = "Command-R7B: parallel attn+FFN, SWA 3:1 (NoPE full layers), tied head with logit_scale"
    knobs = BASE_KNOBS | {"kv_heads"}

    def derive(self, spec: ModelSpec) -> dict[str, int]:
        return {"sliding_window": SLIDING_WINDOW}

    def build(self, spec: ModelSpec, b) -> None:
        E, V, F = spec.n_embd, spec.n_vocab, spec.n_ff
        attn_keys(b, spec, head_dims=False, rms_eps=None, ln_eps=1e-5)
        b.u32(KA.SLIDING_WINDOW, spec.extra["sliding_window"])
        b.f32(K.LOGIT_SCALE, OUTPUT_GAIN)
        b.t(T.TOKEN_EMBD, (E, V), Init.std(1.0))
        b.t(T.OUTPUT_NORM, (E,), blocks.NORM)
        for i in range(spec.n_layer):
            Hkv, D = spec.n_head_kv[i], spec.head_dim
            b.t(T.ATTN_NORM, (E,), blocks.NORM, bid=i)
            b.t(T.ATTN_Q, (E, E), bid=i)
            b.t(T.ATTN_K, (E, Hkv * D), bid=i)
            b.t(T.ATTN_V, (E, Hkv * D), bid=i)
            b.t(T.ATTN_OUT, (E, E), Init.std(BRANCH_GAIN * E**-0.5), bid=i)
            b.t(T.FFN_GATE, (E, F), bid=i)
            b.t(T.FFN_UP, (E, F), bid=i)
            b.t(T.FFN_DOWN, (F, E), Init.std(BRANCH_GAIN * F**-0.5), bid=i)
