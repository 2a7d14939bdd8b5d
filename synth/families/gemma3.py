"""gemma3: Gemma 3 text decoder — gemma2's layout plus per-head q/k RMS norms, an optional untied head, no
attention soft-capping; 5 local (sliding-window) layers to 1 global by default, hence 6 layers by default.

Stage contracts (pinned llama.cpp, src/models/gemma3.cpp):
- Embedding scale: sqrt(n_embd) is applied only to token input (`ubatch.token ? sqrtf(n_embd) : 1.0f`, :91),
  so a stage fed the residual stream as embeddings does not rescale it.
- Sliding window only if `attention.sliding_window` > 0 (:4-12); then load_swa_pattern(ml, 6) (:7): the
  per-layer bool array `attention.sliding_window_pattern` if present, else period 6 with layer il sliding iff
  il % 6 < 5 (src/llama-hparams.cpp:8-17) — index-derived, so a stage must carry the array to keep its layers'
  kinds. Converted Gemma 3 files write only sliding_window (conversion/gemma.py:156-157); so do we.
- SWA layers use rope.freq_base_swa (:9, src/llama-model.cpp:2329); f_attention_scale switches to
  1/sqrt(n_embd/n_head) when n_layer == 62 (27B, :29-31).
"""

import gguf

from synth.families import _tier2a, blocks
from synth.families.base import BASE_KNOBS, KA, Family, K, T
from synth.spec import ModelSpec

SLIDING_WINDOW = 8  # tokens; small so an 8-token prompt + 32 decoded tokens exercise the window


class Gemma3(Family):
    name = "gemma3"
    arch = gguf.MODEL_ARCH.GEMMA3
    kind = "dense"
    token_scale = True  # sqrt(n_embd) on token input only (ubatch.token ? sqrtf(n_embd) : 1)
    summary = "Gemma 3: 5 local : 1 global sliding-window attention, q/k norms, post-norms"
    knobs = BASE_KNOBS | {"kv_heads", "head_dim"}
    swa_pattern = (6, False)  # load_swa_pattern(ml, 6) when sliding_window > 0 (gemma3.cpp:7)
    n_layer = 6
    head_dim = 16

    def build(self, spec: ModelSpec, b) -> None:
        E = spec.n_embd
        _tier2a.attn_heads(b, spec, key_length=True)
        b.u32(K.FEED_FORWARD_LENGTH, spec.n_ff)
        b.f32(KA.LAYERNORM_RMS_EPS, 1e-6)
        b.u32(KA.SLIDING_WINDOW, SLIDING_WINDOW)
        blocks.embeddings(b, spec)
        for i in range(spec.n_layer):
            b.t(T.ATTN_NORM, (E,), blocks.NORM, bid=i)
            blocks.attention(b, spec, i, qk_norm="head")
            b.t(T.ATTN_POST_NORM, (E,), blocks.NORM, bid=i)
            b.t(T.FFN_NORM, (E,), blocks.NORM, bid=i)
            blocks.ffn_dense(b, E, spec.n_ff, i)
            b.t(T.FFN_POST_NORM, (E,), blocks.NORM, bid=i)
