"""Deterministic tensor values from (seed, tensor name).

The stream is PCG64's raw output seeded through SeedSequence from a SHA-256 of the seed and name, mapped
to floats with integer arithmetic only, so the same spec gives the same bytes on any numpy version.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Init:
    """How to fill a tensor: uniform values in [lo, hi], then a sign rule."""

    lo: float
    hi: float
    negative: bool = False  # force values < 0 (e.g. SSM A)

    @staticmethod
    def std(s: float) -> Init:
        """Zero-mean uniform with standard deviation s."""
        a = s * 3.0**0.5
        return Init(-a, a)

    @staticmethod
    def around(center: float, spread: float) -> Init:
        return Init(center - spread, center + spread)

    @staticmethod
    def span(lo: float, hi: float) -> Init:
        return Init(lo, hi)

    @staticmethod
    def const(v: float) -> Init:
        return Init(v, v)


def raw_stream(seed: int, name: str, n: int) -> np.ndarray:
    """n uint64 values, a pure function of (seed, name)."""
    digest = hashlib.sha256(f"{seed}\0{name}".encode()).digest()
    return np.random.PCG64(int.from_bytes(digest[:16], "little")).random_raw(n)


def unit_stream(seed: int, name: str, n: int) -> np.ndarray:
    """n float64 values in [0, 1), a pure function of (seed, name)."""
    return (raw_stream(seed, name, n) >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def byte_stream(seed: int, name: str, n: int) -> np.ndarray:
    """n bytes, a pure function of (seed, name) (a stream of its own: 'bytes:' + name)."""
    words = raw_stream(seed, "bytes:" + name, (n + 7) // 8)
    return words.astype("<u8").view(np.uint8)[:n].copy()


def make_tensor(seed: int, name: str, ne: tuple[int, ...], init: Init) -> np.ndarray:
    """A float32 array for a tensor with ggml shape ne (innermost first); numpy shape is reversed(ne)."""
    n = int(np.prod(ne))
    if init.lo == init.hi:
        vals = np.full(n, init.lo, dtype=np.float64)
    else:
        vals = init.lo + (init.hi - init.lo) * unit_stream(seed, name, n)
    if init.negative:
        vals = -np.abs(vals) - 1e-3
    return vals.astype(np.float32).reshape(tuple(reversed(ne)))
