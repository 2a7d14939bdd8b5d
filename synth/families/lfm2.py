"""lfm2: short-convolution and attention layers by per-layer head_count_kv (0 = short conv).

The final norm is stored as token_embd_norm (not output_norm); attention has per-head q/k norms.
`--sliding-window N` writes `attention.sliding_window`: then every attention layer slides (lfm2.cpp:26-31) and
create_memory builds llama_memory_hybrid_iswa (llama-model.cpp:2714), as for the one LFM2 that ships a window,
LFM2.5-Audio-1.5B's audio tokenizer (conversion/lfm2.py:255).
Stage contract: the sliding layers are the attention layers, which a stage keeps (per-layer head_count_kv).
"""

import gguf

from synth.errors import UserError
from synth.families import blocks
from synth.families.base import BASE_KNOBS, KA, PATTERN_KNOBS, Family, K, T
from synth.spec import ModelSpec
from synth.weights import Init


class Lfm2(Family):
    name = "lfm2"
    arch = gguf.MODEL_ARCH.LFM2
    kind = "hybrid"
    summary = "LFM2: short conv + attention, per-layer K/V heads"
    knobs = BASE_KNOBS | PATTERN_KNOBS | {"kv_heads", "sliding_window"}
    per_layer_kv = True
    n_layer = 8

    def derive(self, spec: ModelSpec) -> dict[str, int]:
        return {"l_cache": 3}

    def check(self, spec: ModelSpec) -> None:
        if spec.sliding_window < 0:
            raise UserError(f"family {self.name}: --sliding-window {spec.sliding_window} must be >= 0 "
                            "(0: no window; N: attention layers see the last N tokens)")

    def swa_layers(self, g, n: int) -> list[bool]:
        # with a window every attention layer slides: is_swa = !is_recr, and is_recr = head_count_kv == 0
        # (lfm2.cpp:11-13, 26-31)
        kv = g.get("attention.head_count_kv")
        return [bool(h) for h in kv] if isinstance(kv, list) else [bool(kv)] * n

    def build(self, spec: ModelSpec, b) -> None:
        E = spec.n_embd
        b.u32(gguf.Keys.ShortConv.L_CACHE, spec.extra["l_cache"])
        b.f32(KA.LAYERNORM_RMS_EPS, 1e-5)
        b.u32(KA.HEAD_COUNT, spec.n_head)
        b.u32s(KA.HEAD_COUNT_KV, spec.n_head_kv)
        b.u32(K.FEED_FORWARD_LENGTH, spec.n_ff)
        if spec.sliding_window:
            b.u32(KA.SLIDING_WINDOW, spec.sliding_window)
        blocks.embeddings(b, spec, output_norm=False)
        b.t(T.TOKEN_EMBD_NORM, (E,), blocks.NORM)
        for i in range(spec.n_layer):
            b.t(T.ATTN_NORM, (E,), blocks.NORM, bid=i)
            if spec.is_rec(i):
                b.t(T.SHORTCONV_CONV, (spec.extra["l_cache"], E), Init.std(3**-0.5), bid=i)
                b.t(T.SHORTCONV_INPROJ, (E, 3 * E), bid=i)
                b.t(T.SHORTCONV_OUTPROJ, (E, E), bid=i)
            else:
                blocks.attention(b, spec, i, qk_norm="head")
            b.t(T.FFN_NORM, (E,), blocks.NORM, bid=i)
            blocks.ffn_dense(b, E, spec.n_ff, i)
