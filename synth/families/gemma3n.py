"""gemma3n: Gemma 3n (E2B/E4B) text decoder — AltUp (4 parallel residual streams), LAuReL low-rank branches,
per-layer token embeddings, activation sparsity, 4 local : 1 global sliding-window attention and KV sharing.
Most of its shape is hard-coded in llama.cpp, so the fixture keeps n_embd 8 and vocab 32 to stay under 1 MB.

Stage contracts (pinned llama.cpp):
- Hard-coded dims (src/llama-hparams.h:264-267): n_altup 4, i_altup_act 0, laurel_rank 64, n_embd_altup 256;
  the `altup.*` / `embedding_length_per_layer_input` keys are never read (we write them with those values).
  per_layer_token_embd is [256·n_layer, V] and per_layer_model_proj [E, 256·n_layer] (src/models/gemma3n.cpp:39-40):
  a stage's own n_layer sizes them, and they are a global input consumed by every layer.
- Embedding scale sqrt(n_embd) only for token input (:102). Per-layer inputs come from the token ids
  (:328-336); for embedding input llama.cpp substitutes token 0's row (:337-350), so a later stage cannot
  rebuild them from the residual stream: the per-layer inputs must travel between stages.
- AltUp: the residual between layers is [n_embd, n_tokens, 4] (:117-128, l_out at :263); only stream 0 is
  the usual hidden state, the 4 streams are merged after the last layer (:268-290). A stage boundary must
  carry all 4 streams (l_out-N is 4·n_embd per token).
- KV sharing: n_layer_kv_from_start = 20 is hard-coded (:7): layers >= 20 compute no K/V and read layer 18
  (sliding) or 19 (global) (src/llama-model.cpp:2780-2787); `attention.shared_kv_layers` is ignored.
- Activation sparsity (gaussian top-k on the FFN gate) for layers il < 10 (src/models/models.h:843,
  gemma3n.cpp:217) — index-derived.
- Sliding window: `attention.sliding_window` is required (:11); load_swa_pattern(ml, 5) (:5) takes the
  per-layer bool array if present (the converter writes it, conversion/gemma.py:547-550; so do we), else
  period 5. Attention scale is 1.0 (:8); V is RMS-normed without weight (:157); final logits soft-capped at 30.
"""

import gguf

from synth.families import _tier2a, blocks
from synth.families.base import BASE_KNOBS, KA, Family, K, T
from synth.spec import ModelSpec
from synth.weights import Init

N_ALTUP = 4  # llama_hparams::n_altup
LAUREL_RANK = 64  # llama_hparams::laurel_rank
N_EMBD_ALTUP = 256  # llama_hparams::n_embd_altup (per-layer embedding width)
KV_FROM_START = 20  # gemma3n.cpp:7
SWA_PERIOD = 5  # 4 sliding layers, then 1 global
SLIDING_WINDOW = 8


class Gemma3n(Family):
    name = "gemma3n"
    arch = gguf.MODEL_ARCH.GEMMA3N
    kind = "dense"
    token_scale = True  # sqrt(n_embd) on token input only (ubatch.token ? sqrtf(n_embd) : 1)
    summary = "Gemma 3n: AltUp streams, LAuReL, per-layer embeddings, 4 local : 1 global attention"
    knobs = BASE_KNOBS | {"kv_heads", "head_dim"}
    swa_pattern = (5, False)  # load_swa_pattern(ml, 5) (gemma3n.cpp:5); our files also carry the array
    embd_input = ("per-layer inputs come from the token ids; for embedding input llama.cpp uses token 0's row "
                  "instead (gemma3n.cpp:337-350), and the 4 AltUp streams cannot enter through batch.embd")
    n_layer = 5
    n_embd = 8
    n_head = 2
    n_head_kv = 1
    n_ff = 16
    n_vocab = 32

    def check(self, spec: ModelSpec) -> None:
        if spec.n_ff < 2:
            raise self.reject("ff", f"{spec.n_ff}: activation sparsity takes the std over n_ff - 1 gate values "
                              "(NaN for 1); use >= 2")

    def build(self, spec: ModelSpec, b) -> None:
        E, V, L = spec.n_embd, spec.n_vocab, spec.n_layer
        _tier2a.attn_heads(b, spec, key_length=True)
        b.u32(K.FEED_FORWARD_LENGTH, spec.n_ff)
        b.f32(KA.LAYERNORM_RMS_EPS, 1e-6)
        b.u32(KA.SLIDING_WINDOW, SLIDING_WINDOW)
        b.bools(KA.SLIDING_WINDOW_PATTERN, [i % SWA_PERIOD < SWA_PERIOD - 1 for i in range(L)])
        # informational: llama.cpp hard-codes these values
        b.u32(K.ALTUP_NUM_INPUTS, N_ALTUP)
        b.u32(K.ALTUP_ACTIVE_IDX, 0)
        b.u32(K.EMBD_LENGTH_PER_LAYER_INP, N_EMBD_ALTUP)
        b.u32(KA.SHARED_KV_LAYERS, max(0, L - KV_FROM_START))
        blocks.embeddings(b, spec)
        b.t(T.ALTUP_PROJ, (E, E, N_ALTUP - 1))
        b.t(T.ALTUP_UNEMBD_PROJ, (E, E, N_ALTUP - 1))
        # scaled by sqrt(256) in the graph: std 1/16 gives unit-scale per-layer inputs
        b.t(T.PER_LAYER_TOKEN_EMBD, (N_EMBD_ALTUP * L, V), Init.std(N_EMBD_ALTUP**-0.5))
        b.t(T.PER_LAYER_MODEL_PROJ, (E, N_EMBD_ALTUP * L))
        b.t(T.PER_LAYER_PROJ_NORM, (N_EMBD_ALTUP,), blocks.NORM)
        for i in range(L):
            b.t(T.ATTN_NORM, (E,), blocks.NORM, bid=i)
            blocks.attention(b, spec, i, qk_norm="head")
            b.t(T.ATTN_POST_NORM, (E,), blocks.NORM, bid=i)
            b.t(T.FFN_NORM, (E,), blocks.NORM, bid=i)
            blocks.ffn_dense(b, E, spec.n_ff, i)
            b.t(T.FFN_POST_NORM, (E,), blocks.NORM, bid=i)
            b.t(T.PER_LAYER_INP_GATE, (E, N_EMBD_ALTUP), bid=i)
            b.t(T.PER_LAYER_PROJ, (N_EMBD_ALTUP, E), bid=i)
            b.t(T.PER_LAYER_POST_NORM, (E,), blocks.NORM, bid=i)
            b.t(T.ALTUP_CORRECT_COEF, (N_ALTUP, N_ALTUP), bid=i)
            b.t(T.ALTUP_CORRECT_SCALE, (E,), blocks.NORM, bid=i)
            b.t(T.ALTUP_PREDICT_COEF, (N_ALTUP, N_ALTUP * N_ALTUP), bid=i)
            b.t(T.ALTUP_ROUTER, (E, N_ALTUP), bid=i)
            b.t(T.ALTUP_ROUTER_NORM, (E,), blocks.NORM, bid=i)
            b.t(T.LAUREL_L, (E, LAUREL_RANK), bid=i)
            b.t(T.LAUREL_R, (LAUREL_RANK, E), bid=i)
            b.t(T.LAUREL_POST_NORM, (E,), blocks.NORM, bid=i)
