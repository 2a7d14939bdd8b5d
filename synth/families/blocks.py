"""Tensor groups several families share (attention, FFNs, SSM blocks). Shapes are ggml ne order."""

from __future__ import annotations

from synth.families.base import OUTPUT_GAIN, Builder, T
from synth.spec import ModelSpec
from synth.tokenizer import WIDE_VOCAB
from synth.weights import Init

NORM = Init.around(1.0, 0.1)
BIAS = Init.std(0.05)


# A tied head (output = token_embd) makes a random model echo its input token. Keep token_embd small so the
# residual stream is dominated by the layers, and put the logit gain into output_norm instead.
TIED_EMBD_STD = 0.05


def tied_embeddings(b: Builder, spec: ModelSpec) -> None:
    """token_embd + output_norm only, for archs whose head is always token_embd (gemma2) and for a vocabulary past
    16 bits (one table of n_vocab rows, not two).

    The output_norm gain makes the logits' std ≈ OUTPUT_GAIN although token_embd is small.
    """
    E, V = spec.n_embd, spec.n_vocab
    b.t(T.TOKEN_EMBD, (E, V), Init.std(TIED_EMBD_STD))
    gain = OUTPUT_GAIN / (TIED_EMBD_STD * E**0.5)
    b.t(T.OUTPUT_NORM, (E,), Init.around(gain, 0.1 * gain))


def embeddings(b: Builder, spec: ModelSpec, *, output_norm: bool = True) -> None:
    """token_embd, output_norm and an untied output head (tied for a vocabulary past 16 bits: tokenizer.WIDE_VOCAB).

    output.weight is optional for most archs (tied to token_embd), but a tied head makes random models
    repeat their input token; an untied one gives varied greedy continuations with clear margins.
    """
    E, V = spec.n_embd, spec.n_vocab
    if V > WIDE_VOCAB and output_norm:
        tied_embeddings(b, spec)
        return
    b.t(T.TOKEN_EMBD, (E, V), Init.std(1.0))
    if output_norm:
        b.t(T.OUTPUT_NORM, (E,), NORM)
    b.t(T.OUTPUT, (E, V), Init.std(OUTPUT_GAIN * E**-0.5))


def attention(b: Builder, spec: ModelSpec, i: int, *, q_width: int | None = None, qk_norm: str | None = None,
              out_width: int | None = None) -> None:
    """attn_q/k/v/output for layer i with its own n_head_kv; qk_norm: None, 'head' ([D]) or 'full'."""
    E, H, D, Hkv = spec.n_embd, spec.n_head, spec.head_dim, spec.n_head_kv[i]
    qw = q_width if q_width is not None else H * D
    b.t(T.ATTN_Q, (E, qw), bid=i)
    b.t(T.ATTN_K, (E, Hkv * D), bid=i)
    b.t(T.ATTN_V, (E, Hkv * D), bid=i)
    b.t(T.ATTN_OUT, (out_width if out_width is not None else H * D, E), bid=i)
    if qk_norm == "head":
        b.t(T.ATTN_Q_NORM, (D,), NORM, bid=i)
        b.t(T.ATTN_K_NORM, (D,), NORM, bid=i)
    elif qk_norm == "full":
        b.t(T.ATTN_Q_NORM, (H * D,), NORM, bid=i)
        b.t(T.ATTN_K_NORM, (Hkv * D,), NORM, bid=i)


def ffn_dense(b: Builder, E: int, F: int, i: int) -> None:
    b.t(T.FFN_GATE, (E, F), bid=i)
    b.t(T.FFN_UP, (E, F), bid=i)
    b.t(T.FFN_DOWN, (F, E), bid=i)


def ffn_moe(b: Builder, E: int, Fe: int, X: int, i: int, *, probs_bias: bool = False) -> None:
    b.t(T.FFN_GATE_INP, (E, X), bid=i)
    if probs_bias:
        b.t(T.FFN_EXP_PROBS_B, (X,), BIAS, bid=i, suffix="bias")
    b.t(T.FFN_GATE_EXP, (E, Fe, X), bid=i)
    b.t(T.FFN_UP_EXP, (E, Fe, X), bid=i)
    b.t(T.FFN_DOWN_EXP, (Fe, E, X), bid=i)


def ffn_shared(b: Builder, E: int, Fs: int, i: int) -> None:
    b.t(T.FFN_GATE_SHEXP, (E, Fs), bid=i)
    b.t(T.FFN_UP_SHEXP, (E, Fs), bid=i)
    b.t(T.FFN_DOWN_SHEXP, (Fs, E), bid=i)


# SSM parameter ranges: dt = softplus(bias) ≈ 0.02–0.1; A < 0; D ≈ 1.
DT_BIAS = Init.span(-4.0, -2.0)
SSM_A = Init(0.2, 1.5, negative=True)
SSM_D = Init.around(1.0, 0.2)


def mamba1(b: Builder, E: int, i: int, *, d_inner: int, d_conv: int, d_state: int, dt_rank: int,
           dt_bc_norms: bool = False) -> None:
    """Mamba-1 mixer (mamba, jamba). jamba adds RMS norms on dt, B and C."""
    b.t(T.SSM_IN, (E, 2 * d_inner), bid=i)
    b.t(T.SSM_CONV1D, (d_conv, d_inner), Init.std(d_conv**-0.5), bid=i)
    b.t(T.SSM_CONV1D, (d_inner,), BIAS, bid=i, suffix="bias")
    b.t(T.SSM_X, (d_inner, dt_rank + 2 * d_state), bid=i)
    if dt_bc_norms:
        b.t(T.SSM_DT_NORM, (dt_rank,), NORM, bid=i)
    b.t(T.SSM_DT, (dt_rank, d_inner), bid=i)
    b.t(T.SSM_DT, (d_inner,), DT_BIAS, bid=i, suffix="bias")
    if dt_bc_norms:
        b.t(T.SSM_B_NORM, (d_state,), NORM, bid=i)
        b.t(T.SSM_C_NORM, (d_state,), NORM, bid=i)
    b.t(T.SSM_A, (d_state, d_inner), SSM_A, bid=i, suffix=None)
    b.t(T.SSM_D, (d_inner,), SSM_D, bid=i, suffix=None)
    b.t(T.SSM_OUT, (d_inner, E), bid=i)


def mamba2(b: Builder, E: int, i: int, *, d_inner: int, d_conv: int, d_state: int, n_heads: int,
           n_groups: int) -> None:
    """Mamba-2 mixer (mamba2, falcon-h1, granitehybrid). conv bias is graph-required (notes §7.1)."""
    conv = d_inner + 2 * n_groups * d_state
    b.t(T.SSM_IN, (E, d_inner + conv + n_heads), bid=i)
    b.t(T.SSM_CONV1D, (d_conv, conv), Init.std(d_conv**-0.5), bid=i)
    b.t(T.SSM_CONV1D, (conv,), BIAS, bid=i, suffix="bias")
    b.t(T.SSM_DT, (n_heads,), DT_BIAS, bid=i, suffix="bias")
    b.t(T.SSM_A, (1, n_heads), SSM_A, bid=i, suffix=None)
    b.t(T.SSM_D, (1, n_heads), SSM_D, bid=i, suffix=None)
    b.t(T.SSM_NORM, (d_inner // n_groups, n_groups), NORM, bid=i)
    b.t(T.SSM_OUT, (d_inner, E), bid=i)
