"""Shared pieces of the tier-3 families (RWKV and the dropped LayerNorm/GQA transformers).

Not a family module (the leading underscore keeps the registry from scanning it). Shapes are ggml ne order.
"""

from __future__ import annotations

import gguf

from synth.families import blocks
from synth.families.base import BASE_KNOBS, Builder, T
from synth.spec import ModelSpec
from synth.weights import Init

KA = gguf.Keys.Attention

GQA_KNOBS = BASE_KNOBS | {"kv_heads"}  # one K/V head count for every layer (layer 0 sizes all layers)


def layer_norm(b: Builder, tensor: gguf.MODEL_TENSOR, E: int, i: int | None = None, *, bias: bool = True) -> None:
    """A LayerNorm (weight around 1, small bias) or, with bias=False, an RMSNorm weight."""
    b.t(tensor, (E,), blocks.NORM, bid=i)
    if bias:
        b.t(tensor, (E,), blocks.BIAS, bid=i, suffix="bias")


# Tied head (openelm, plm): the logit of the current input token gets e·e ≈ E·std² from the residual's own
# copy of its embedding, against ≈ std·√E·σ(layers) for the others, so a std-1 embedding makes greedy decoding
# repeat its input forever. A small embedding and layer outputs TIED_RESIDUAL_GAIN× larger than usual (their
# projections into the residual) put the self-advantage well under one logit std; logits stay ≈ std·√E wide.
TIED_EMBD_STD = 0.3
TIED_RESIDUAL_GAIN = 8.0  # swept: over 1–12 layers × 3 seeds no constant continuation (4.0 had some)


def tied_embeddings(b: Builder, spec: ModelSpec) -> None:
    """token_embd + output_norm for archs that load the head as a duplicate of token_embd (openelm, plm):
    an output.weight would be an unconsumed tensor ("wrong number of tensors")."""
    b.t(T.TOKEN_EMBD, (spec.n_embd, spec.n_vocab), Init.std(TIED_EMBD_STD))
    b.t(T.OUTPUT_NORM, (spec.n_embd,), blocks.NORM)


def fused_qkv(b: Builder, spec: ModelSpec, i: int, *, bias: bool) -> None:
    """attn_qkv [E, (H + 2·Hkv)·D] (Q first, then K, then V), as gpt2/bloom/gptneox/mpt/openelm load it."""
    E, H, D, Hkv = spec.n_embd, spec.n_head, spec.head_dim, spec.n_head_kv[i]
    width = (H + 2 * Hkv) * D
    b.t(T.ATTN_QKV, (E, width), bid=i)
    if bias:
        b.t(T.ATTN_QKV, (width,), blocks.BIAS, bid=i, suffix="bias")


def ln_fused_layer(b: Builder, spec: ModelSpec, i: int) -> None:
    """A LayerNorm transformer layer with fused QKV and every bias (gpt2, bloom, gptneox)."""
    E = spec.n_embd
    layer_norm(b, T.ATTN_NORM, E, i)
    fused_qkv(b, spec, i, bias=True)
    b.t(T.ATTN_OUT, (E, E), bid=i)
    b.t(T.ATTN_OUT, (E,), blocks.BIAS, bid=i, suffix="bias")
    layer_norm(b, T.FFN_NORM, E, i)
    ffn_seq(b, E, spec.n_ff, i, bias=True)


def residual_proj(fan_in: int) -> Init:
    """Init of a projection into the residual stream (attn_output, ffn_down) for tied-head archs."""
    return Init.std(TIED_RESIDUAL_GAIN * fan_in**-0.5)


def ffn_seq(b: Builder, E: int, F: int, i: int, *, bias: bool) -> None:
    """Non-gated FFN (ffn_up → act → ffn_down), optionally with biases."""
    b.t(T.FFN_UP, (E, F), bid=i)
    if bias:
        b.t(T.FFN_UP, (F,), blocks.BIAS, bid=i, suffix="bias")
    b.t(T.FFN_DOWN, (F, E), bid=i)
    if bias:
        b.t(T.FFN_DOWN, (E,), blocks.BIAS, bid=i, suffix="bias")


def head_counts(b: Builder, spec: ModelSpec) -> None:
    """attention.head_count and a scalar head_count_kv (these archs read layer 0 only)."""
    b.u32(KA.HEAD_COUNT, spec.n_head)
    b.u32(KA.HEAD_COUNT_KV, spec.n_head_kv[0])


def head_dim_keys(b: Builder, spec: ModelSpec) -> None:
    """key_length/value_length when the head dim is not E/H (archs that size Q as H·D, not E)."""
    if spec.head_dim * spec.n_head != spec.n_embd:
        b.u32(KA.KEY_LENGTH, spec.head_dim)
        b.u32(KA.VALUE_LENGTH, spec.head_dim)


def partial_rot(head_dim: int) -> int:
    """Rotary dims for partial-RoPE archs (GPT-NeoX/StableLM/ChatGLM rotate a fraction of each head): about
    half the head, even, at least 2."""
    return max(2, head_dim // 4 * 2)
