"""The memory lanes' fixed configs: the program under memory pressure (upstream 17527's shape), the cache that runs
full (fill) and a whole sequence shifted (the shift lane)."""

from __future__ import annotations

from typing import Any

import numpy as np

from fuzz.oracles.memory_model import MemoryConfig

# Memory pressure (upstream 17527): three sequences decoded in PRESSURE_ROUNDS rounds of PRESSURE_BLOCK tokens each,
# one batch a round, so their cells interleave block by block and fill all but one block of PRESSURE_CTX (one cache
# for every sequence); sequence 1 removed leaves its cells free in blocks; sequence 0's state imported as sequence 1
# needs as many cells as are free in total, more than any run of them holds; then every sequence one token on.
PRESSURE_CTX, PRESSURE_BLOCK, PRESSURE_ROUNDS = 256, 16, 5


def pressure_program(n_vocab: int, seed: int = 0) -> list[dict[str, Any]]:
    """The memory-pressure program (its config: n_seq 3, n_ctx PRESSURE_CTX, one KV cache, max_len its length)."""
    rng = np.random.default_rng([seed, 17527])

    def toks(n: int) -> list[int]:
        return [int(t) for t in rng.integers(0, n_vocab, n)]

    rounds = [{"op": "decode", "parts": [[q, toks(PRESSURE_BLOCK)] for q in range(3)]} for _ in range(PRESSURE_ROUNDS)]
    return [*rounds, {"op": "rm", "seq": 1, "p0": -1, "p1": -1}, {"op": "copy_state", "src": 0, "dst": 1},
            {"op": "decode", "parts": [[q, toks(1)] for q in range(3)]}]


def pressure_config(n_vocab: int, **common: Any) -> MemoryConfig:
    """The config that runs the memory-pressure program."""
    return MemoryConfig(program=pressure_program(n_vocab), n_seq=3, context=PRESSURE_CTX, kv_unified=(True,),
                        max_len=PRESSURE_BLOCK * PRESSURE_ROUNDS + 1, **common)


# A cache that runs full: CAPACITY_CTX cells a KV stream (one for every sequence, or one each), filled by long
# decodes and then asked for more than it has left, between the other operations; positions stay within synth's
# trained context (n_ctx_train 256; a decode refused for room is never computed)
CAPACITY_CTX = 256


def capacity_config(**common: Any) -> MemoryConfig:
    """The config whose drawn programs fill their KV streams (fill), in both layouts."""
    return MemoryConfig(**{"programs": 1, "steps": 32, "n_seq": 2, "context": CAPACITY_CTX, "max_len": CAPACITY_CTX - 8,
                           "fill": True, **common})


# A context shift (llama-server's --context-shift, a runtime sliding a conversation): a whole sequence's positions
# moved by seq_add, then one more token. On a model whose positions are rotary it must equal the same tokens decoded
# at the new positions (memory.shifts_faithful); in a YaRN context too (llama.cpp's shift ropes the stored keys again)
SHIFT_TOKENS, SHIFT_DELTA = 12, 5
# a YaRN context four times the trained one (--rope-scaling yarn --rope-scale 4: Qwen3's documented long-context setup)
YARN = {"rope_scaling": "yarn", "rope_freq_scale": 0.25}


def shift_program(n_vocab: int) -> list[dict[str, Any]]:
    """SHIFT_TOKENS seeded tokens decoded as sequence 1, all of them shifted by +SHIFT_DELTA, one more token. (Not
    sequence 0 from position 0: a memory that passes a shift on with its sequence and start swapped shifts the same
    cells there.)"""
    toks = [int(t) for t in np.random.default_rng(13).integers(0, n_vocab, SHIFT_TOKENS + 1)]
    return [{"op": "decode", "parts": [[1, toks[:-1]]]}, {"op": "add", "seq": 1, "p0": 0, "p1": -1,
                                                           "delta": SHIFT_DELTA},
            {"op": "decode", "parts": [[1, toks[-1:]]]}]


def shift_config(n_vocab: int, **common: Any) -> MemoryConfig:
    """The config that runs the shift program (two sequences: the oracle's least; one KV cache)."""
    return MemoryConfig(program=shift_program(n_vocab), n_seq=2, kv_unified=(True,), **common)
