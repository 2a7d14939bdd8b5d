"""Helpers shared by the tier-2b family modules (not a family: the name starts with '_').

- attn_keys / moe_keys: the usual attention and MoE metadata.
- embeddings: blocks.embeddings with a chosen token_embd std (archs that scale input embeddings by a constant).
- check_rope_pairs (a rotary width other than the head dim, which base checks), require_experts,
  check_leading_dense: one-line UserErrors for specs llama.cpp cannot run.
"""

from __future__ import annotations

import gguf

from synth.errors import UserError
from synth.families.base import KA, OUTPUT_GAIN, Builder, K, T
from synth.families.blocks import NORM
from synth.spec import ModelSpec
from synth.weights import Init

KR = gguf.Keys.Rope


def attn_keys(b: Builder, spec: ModelSpec, *, kv: int | None = None, head_dims: bool = True,
              rope: int | None = None, rms_eps: float | None = 1e-6, ln_eps: float | None = None,
              ff: bool = True) -> None:
    """head_count, head_count_kv (scalar: kv or layer 0's), key/value_length = head_dim, rope dims, eps, F."""
    b.u32(KA.HEAD_COUNT, spec.n_head)
    b.u32(KA.HEAD_COUNT_KV, spec.n_head_kv[0] if kv is None else kv)
    if head_dims:
        b.u32(KA.KEY_LENGTH, spec.head_dim)
        b.u32(KA.VALUE_LENGTH, spec.head_dim)
    if rope is not None:
        b.u32(KR.DIMENSION_COUNT, rope)
    if rms_eps is not None:
        b.f32(KA.LAYERNORM_RMS_EPS, rms_eps)
    if ln_eps is not None:
        b.f32(KA.LAYERNORM_EPS, ln_eps)
    if ff:
        b.u32(K.FEED_FORWARD_LENGTH, spec.n_ff)


def moe_keys(b: Builder, spec: ModelSpec, *, n_ff_exp: int | None = None) -> None:
    b.u32(K.EXPERT_COUNT, spec.n_expert)
    b.u32(K.EXPERT_USED_COUNT, spec.n_expert_used)
    if n_ff_exp is not None:
        b.u32(K.EXPERT_FEED_FORWARD_LENGTH, n_ff_exp)


def require_experts(fam, spec: ModelSpec) -> None:
    if not spec.n_expert:
        raise fam.reject("experts", f"0: {fam.name} is MoE-only (llama.cpp throws 'n_expert must be > 0')")


def check_leading_dense(fam, spec: ModelSpec) -> None:
    if spec.n_leading_dense > spec.n_layer:
        raise UserError(f"family {fam.name}: --leading-dense {spec.n_leading_dense} exceeds --layers "
                        f"{spec.n_layer}; use 0..{spec.n_layer}")


def embeddings(b: Builder, spec: ModelSpec, *, embd_std: float = 1.0) -> None:
    """blocks.embeddings with a chosen token_embd std (archs that scale the input embeddings by a constant)."""
    E, V = spec.n_embd, spec.n_vocab
    b.t(T.TOKEN_EMBD, (E, V), Init.std(embd_std))
    b.t(T.OUTPUT_NORM, (E,), NORM)
    b.t(T.OUTPUT, (E, V), Init.std(OUTPUT_GAIN * E**-0.5))


def check_rope_pairs(fam, spec: ModelSpec, dim: int | None = None) -> None:
    """RoPE rotates pairs: ggml's CPU rope aborts on an odd rotary width (ggml-cpu/ops.cpp:6356, n_dims % 2)."""
    d = spec.head_dim if dim is None else dim
    if d < 2 or d % 2:
        how = "--head-dim" if dim is None and d != spec.n_embd // spec.n_head \
            else f"--embd {spec.n_embd} / --heads {spec.n_head}"
        raise UserError(f"family {fam.name}: head dim {d} (from {how}) must be even: RoPE rotates pairs of dims "
                        "and ggml's CPU rope aborts on an odd width")
