"""gemma2: Gemma 2 dense GQA with post-attention/post-FFN norms, GELU FFN, logit soft-capping and interleaved
sliding-window attention; the head is always token_embd (output.weight is never loaded), so token_embd stays
small and output_norm carries the logit gain.

Stage contracts (pinned llama.cpp, src/models/gemma2.cpp):
- Embedding scale: the input is multiplied by sqrt(n_embd) unconditionally (:68), token or embedding input
  alike, so a later stage fed the residual stream scales it again.
- Sliding window: always iSWA (swa_type STANDARD, n_swa default 4096, :4-5); which layers slide comes from
  `attention.sliding_window_pattern` via load_swa_pattern(ml, 2) (:6; src/llama-model.cpp:3434): a per-layer
  bool array if present, else a period n (default 2) with layer il sliding iff il % n < n-1
  (src/llama-hparams.cpp:8-17) — index-derived, so a stage starting at an odd layer flips the pattern unless
  the array is written. Like converted Gemma 2 files (conversion/gemma.py:103 writes only sliding_window) we rely
  on the default period, so fixtures carry the real trap. SWA layers use rope.freq_base_swa (:11).
- f_attention_scale is 1/sqrt(n_embd/n_head) instead of 1/sqrt(head_dim) when n_layer == 46 (27B, :25-27).
"""

import gguf

from synth.families import _tier2a, blocks
from synth.families.base import BASE_KNOBS, KA, Family, K, T
from synth.spec import ModelSpec

SLIDING_WINDOW = 8  # tokens; small so an 8-token prompt + 32 decoded tokens exercise the window


class Gemma2(Family):
    name = "gemma2"
    arch = gguf.MODEL_ARCH.GEMMA2
    kind = "dense"
    stage_input = ("gemma2 scales every input, embeddings included, by sqrt(n_embd) (gemma2.cpp:68): a stage fed the "
                   "residual would scale it again")
    summary = "Gemma 2: local/global sliding-window attention, post-norms, soft-capping, tied head"
    knobs = BASE_KNOBS | {"kv_heads", "head_dim"}
    swa_pattern = (2, False)  # load_swa_pattern(ml, 2) (gemma2.cpp:6)
    head_dim = 16

    def build(self, spec: ModelSpec, b) -> None:
        E = spec.n_embd
        _tier2a.attn_heads(b, spec, key_length=True)
        b.u32(K.FEED_FORWARD_LENGTH, spec.n_ff)
        b.f32(KA.LAYERNORM_RMS_EPS, 1e-6)
        b.u32(KA.SLIDING_WINDOW, SLIDING_WINDOW)
        b.f32(K.ATTN_LOGIT_SOFTCAPPING, 50.0)
        b.f32(K.FINAL_LOGIT_SOFTCAPPING, 30.0)
        blocks.tied_embeddings(b, spec)
        for i in range(spec.n_layer):
            b.t(T.ATTN_NORM, (E,), blocks.NORM, bid=i)
            blocks.attention(b, spec, i)
            b.t(T.ATTN_POST_NORM, (E,), blocks.NORM, bid=i)
            b.t(T.FFN_NORM, (E,), blocks.NORM, bid=i)
            blocks.ffn_dense(b, E, spec.n_ff, i)
            b.t(T.FFN_POST_NORM, (E,), blocks.NORM, bid=i)
