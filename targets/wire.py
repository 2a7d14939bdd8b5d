"""What a split runtime does to the hidden states it sends between stages: converts the f32 rows to a wire type
and back on arrival. A worker applies it to `embd` rows when a decode request names a `wire` (the receiving
stage's view of the boundary). ggml's own row conversions: f16 and bf16 round to nearest even; q8_0 is
ggml_quantize_row_q8_0_ref's blocks of 32 (d = max|x| / 127 stored as f16, q = roundf(x / d)).

Imports numpy only when called: workers start without it."""

from __future__ import annotations

from typing import Any

WIRES = ("f32", "f16", "bf16", "q8_0")


def roundtrip(data: bytes, wire: str) -> bytes:
    """f32 rows (little-endian) after a trip through `wire`."""
    import numpy as np

    x = np.frombuffer(data, "<f4")
    return roundtrip_rows(x, wire, np).astype("<f4").tobytes()


def roundtrip_rows(x: Any, wire: str, np: Any) -> Any:
    if wire == "f32":
        return x
    if wire == "f16":
        return x.astype(np.float16).astype(np.float32)
    if wire == "bf16":  # round to nearest even on the top 16 bits (ggml_compute_fp32_to_bf16; no NaNs here)
        u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
        r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint32)
        return (r << 16).view(np.float32)
    if wire == "q8_0":
        if x.size % 32:
            raise ValueError(f"q8_0 wire: {x.size} values are not whole blocks of 32")
        b = x.astype(np.float32).reshape(-1, 32)
        d = np.abs(b).max(axis=1, keepdims=True) / np.float32(127)
        with np.errstate(divide="ignore"):
            inv = np.where(d == 0, np.float32(0), np.float32(1) / d)
        v = b * inv
        q = (np.sign(v) * np.floor(np.abs(v) + np.float32(0.5))).astype(np.int8)  # roundf, stored as int8 (no -0)
        return (q.astype(np.float32) * d.astype(np.float16).astype(np.float32)).reshape(x.shape)
    raise ValueError(f"wire {wire!r}: use one of {', '.join(WIRES)}")
