"""Weight dtypes for fixtures (`synth make --dtype q8_0`): which tensors a quantized model file holds in that
type, and converting them (gguf-py's own quantizers, from the pinned llama.cpp tree).

The rule mirrors llama-quantize's (llama.cpp src/llama-quant.cpp, tensor_allows_quantization): tensors named
*.weight with two or more dimensions, except norms, router and small recurrent/conv/indexer tensors that
llama.cpp keeps in float. A tensor whose rows are not a whole number of blocks stays F32 (llama-quantize falls
back to another type there).

K-quants (q2_k … q6_k) and the i-quants (iq1_s … iq4_xs; iq2_xxs and iq2_xs are the Kimi-Linear and
Qwen3-Coder-Next artifacts' types) have no quantizer in gguf-py; their blocks are made directly — seeded random
bytes (every grid index and sign code is valid) with each block's f16 super-scale(s) set small, so every weight is
finite and O(0.1). All but iq4_nl (32-wide) need rows of 256: `--embd 256` (and `--ff` a multiple of 256).
"""

from __future__ import annotations

import gguf
import numpy as np

from synth.errors import UserError
from synth.gguf_io import Raw, Tensor
from synth.weights import byte_stream

Q = gguf.GGMLQuantizationType
DTYPES: dict[str, Q | None] = {"f32": None, "f16": Q.F16, "bf16": Q.BF16, "q8_0": Q.Q8_0, "q4_0": Q.Q4_0,
                               "q4_1": Q.Q4_1, "q5_0": Q.Q5_0, "q5_1": Q.Q5_1, "mxfp4": Q.MXFP4, "q2_k": Q.Q2_K,
                               "q3_k": Q.Q3_K, "q4_k": Q.Q4_K, "q5_k": Q.Q5_K, "q6_k": Q.Q6_K,
                               "iq1_s": Q.IQ1_S, "iq1_m": Q.IQ1_M, "iq2_xxs": Q.IQ2_XXS, "iq2_xs": Q.IQ2_XS,
                               "iq2_s": Q.IQ2_S, "iq3_xxs": Q.IQ3_XXS, "iq3_s": Q.IQ3_S, "iq4_nl": Q.IQ4_NL,
                               "iq4_xs": Q.IQ4_XS}
NIBBLES = -1  # iq1_m has no d field: its f16 scale is the top nibbles of the four u16 words of scales[8] (at 48)
# Blocks made directly (ggml-common.h layouts): byte offset of each f16 super-scale in a block, and its value:
# d sets the weights' spread (std ≈ 0.05–0.08, like the F32 fixtures' E^-1/2), dmin cancels the mean the unsigned
# codes and mins give (d × mean code; else every weight leans one way and the model emits one token)
MADE_SCALES: dict[Q, tuple[tuple[int, float], ...]] = {
    Q.Q2_K: ((80, 5e-3), (82, 7.5e-3)),  # scales[16] (4-bit scale, 4-bit min), qs[64] (codes 0..3), d, dmin
    Q.Q3_K: ((108, 1.5e-3),),  # hmask[32], qs[64], scales[12], d (signed codes)
    Q.Q4_K: ((0, 3e-4), (2, 2.25e-3)),  # d, dmin, scales[12], qs[128] (codes 0..15)
    Q.Q5_K: ((0, 1.2e-4), (2, 1.86e-3)),  # d, dmin, scales[12], qh[32], qs[128] (codes 0..31)
    Q.Q6_K: ((208, 5e-5),),  # ql[128], qh[64], scales[16] (int8), d (signed codes)
    Q.IQ2_XXS: ((0, 1e-3),),  # d, qs[32] (u16: grid indices, sign indices and 4-bit scales; all values valid)
    Q.IQ2_XS: ((0, 1e-3),),  # d, qs[32] (u16: 9-bit grid index, 7-bit sign index), scales[8]
    Q.IQ2_S: ((0, 1e-3),),  # d, qs[64] (grid indices, then signs), qh[8], scales[8]
    Q.IQ1_S: ((0, 8.3e-3),),  # d, qs[32], qh[8] (u16: grid bits, 3-bit scale, delta sign)
    Q.IQ1_M: ((NIBBLES, 8.4e-3),),  # qs[32], qh[16], scales[8] (3-bit scales; the f16 scale in the top nibbles)
    Q.IQ3_XXS: ((0, 4.2e-4),),  # d, qs[96] (grid indices, then u32 sign indices and 4-bit scales)
    Q.IQ3_S: ((0, 4.2e-4),),  # d, qs[64], qh[8], signs[32], scales[4]
    Q.IQ4_NL: ((0, 8.9e-4),),  # d, qs[16] (4-bit indices into the non-linear table kvalues_iq4nl)
    Q.IQ4_XS: ((0, 4.9e-5),),  # d, scales_h, scales_l[4] (6-bit scales - 32), qs[128]
}

# name fragments llama-quantize never quantizes (llama-quant.cpp); matched anywhere in the tensor name
KEEP_FLOAT = ("_norm.weight", "ffn_gate_inp.weight", "ffn_gate_tid2eid.weight", "altup", "laurel",
              "per_layer_model_proj", "position_embd.weight", "token_types.weight", "ssm_conv1d",
              "shortconv.conv.weight", "indexer.k_proj.weight", "indexer.q_proj.weight", "time_mix_first.weight",
              "time_mix_w0.weight", "time_mix_w1.weight", "time_mix_w2.weight", "time_mix_v0.weight",
              "time_mix_v1.weight", "time_mix_v2.weight", "time_mix_a0.weight", "time_mix_a1.weight",
              "time_mix_a2.weight", "time_mix_g1.weight", "time_mix_g2.weight", "time_mix_decay_w1.weight",
              "time_mix_decay_w2.weight", "time_mix_lerp_fused.weight", "attn_rel_b.weight")


def check_dtype(dtype: str) -> str:
    if dtype not in DTYPES:
        raise UserError(f"--dtype {dtype!r}: use one of {', '.join(DTYPES)}")
    return dtype


def check_rows(dtype: str, n_embd: int) -> None:
    """Made 256-wide blocks on rows that are not whole blocks would quantize (almost) nothing: refuse them. (Other
    types keep llama-quantize's rule: a tensor whose rows do not fit stays F32, the rest is quantized.)"""
    qtype = DTYPES[dtype]
    if qtype not in MADE_SCALES:
        return
    block, _ = gguf.GGML_QUANT_SIZES[qtype]
    if block < 256:  # iq4_nl: 32-wide, like q4_0 — a tensor whose rows do not fit stays F32
        return
    if n_embd % block:
        raise UserError(f"--dtype {dtype}: its blocks hold {block} values, but rows of --embd {n_embd} are not a whole "
                        f"number of blocks; give --embd {block} (or a multiple)")


def ggml_n_dims(arr: np.ndarray) -> int:
    """ggml_n_dims: dimensions up to the last one larger than 1 (a (1, 1, n) lerp vector has one)."""
    ne = arr.shape[::-1]
    return max([i + 1 for i, n in enumerate(ne) if n > 1], default=1)


def quantized(name: str, arr: np.ndarray, qtype: Q) -> bool:
    """Whether a quantized model holds this tensor (numpy shape: rows last) in qtype."""
    if ggml_n_dims(arr) < 2 or not name.endswith(".weight") or any(k in name for k in KEEP_FLOAT):
        return False
    block, _ = gguf.GGML_QUANT_SIZES[qtype]
    return arr.shape[-1] % block == 0


def convert(name: str, arr: np.ndarray, dtype: str, seed: int = 0) -> Tensor:
    """The tensor as a `dtype` model file holds it."""
    qtype = DTYPES[dtype]
    if qtype is None or not quantized(name, arr, qtype):
        return arr
    if qtype == Q.F16:
        return arr.astype(np.float16)
    if qtype in MADE_SCALES:
        return Raw(made_blocks(name, arr.shape, qtype, seed), qtype)
    return Raw(gguf.quants.quantize(arr, qtype), qtype)


def made_blocks(name: str, shape: tuple[int, ...], qtype: Q, seed: int) -> np.ndarray:
    """Seeded blocks of a made type for a tensor of this (numpy) shape: random bytes, small f16 super-scales."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    n_blocks = int(np.prod(shape)) // block
    data = byte_stream(seed, name, n_blocks * size).reshape(n_blocks, size)
    for offset, value in MADE_SCALES[qtype]:
        if offset == NIBBLES:
            bits = int(np.float16(value).view(np.uint16))
            for i in range(4):  # the high nibble of byte 49, 51, 53, 55
                hi = 48 + 2 * i + 1
                data[:, hi] = (data[:, hi] & 0x0F) | (((bits >> (4 * i)) & 0xF) << 4)
            continue
        data[:, offset:offset + 2] = np.frombuffer(np.float16(value).tobytes(), dtype=np.uint8)
    return data.reshape(*shape[:-1], shape[-1] // block * size)
