"""Weight dtypes for fixtures (`synth make --dtype q8_0`): which tensors a quantized model file holds in that
type, and converting them (gguf-py's own quantizers, from the pinned llama.cpp tree).

The rule mirrors llama-quantize's (llama.cpp src/llama-quant.cpp, tensor_allows_quantization): tensors named
*.weight with two or more dimensions, except norms, router and small recurrent/conv/indexer tensors that
llama.cpp keeps in float. A tensor whose rows are not a whole number of blocks stays F32 (llama-quantize falls
back to another type there; these fixtures are too narrow for K-quants' 256-wide blocks, so only 32-wide block
types are offered).
"""

from __future__ import annotations

import gguf
import numpy as np

from synth.errors import UserError
from synth.gguf_io import Raw, Tensor

Q = gguf.GGMLQuantizationType
DTYPES: dict[str, Q | None] = {"f32": None, "f16": Q.F16, "bf16": Q.BF16, "q8_0": Q.Q8_0, "q4_0": Q.Q4_0,
                               "q4_1": Q.Q4_1, "q5_0": Q.Q5_0, "q5_1": Q.Q5_1, "mxfp4": Q.MXFP4}

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
        raise UserError(f"--dtype {dtype!r}: use one of {', '.join(DTYPES)} (K-quants need 256-wide rows, wider "
                        "than these fixtures)")
    return dtype


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


def convert(name: str, arr: np.ndarray, dtype: str) -> Tensor:
    """The tensor as a `dtype` model file holds it."""
    qtype = DTYPES[dtype]
    if qtype is None or not quantized(name, arr, qtype):
        return arr
    if qtype == Q.F16:
        return arr.astype(np.float16)
    return Raw(gguf.quants.quantize(arr, qtype), qtype)
