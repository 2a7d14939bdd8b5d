"""A tiny BPE vocabulary the pinned llama.cpp accepts for any arch (notes §2.4: gpt2 with ≥ 1 merge)."""

from __future__ import annotations

import gguf

from synth.gguf_io import KV, VT

KT = gguf.Keys.Tokenizer


def vocab_tokens(n_vocab: int) -> list[str]:
    base = ["a", "b", "ab"]
    return (base + [f"t{i}" for i in range(len(base), n_vocab)])[:n_vocab]


# Token ids past 16 bits (Llama-3's 128256, Qwen's 151936 vocabularies): a split runtime that carries ids in 16 bits
# is wrong only there. Such a fixture keeps its file tiny: llama.cpp's placeholder vocabulary (tokenizer model `none`,
# `{arch}.vocab_size` tokens; the strings alone would be ~1 MB, and a decode reads only ids), one f16 embedding table
# and a tied head (blocks.embeddings).
WIDE_VOCAB = 1 << 16


def tokenizer_kv(n_vocab: int) -> dict[str, KV]:
    if n_vocab > WIDE_VOCAB:
        return {KT.MODEL: KV("none", VT.STRING)}
    return {
        KT.MODEL: KV("gpt2", VT.STRING),
        KT.PRE: KV("default", VT.STRING),
        KT.LIST: KV(vocab_tokens(n_vocab), VT.ARRAY, VT.STRING),
        KT.MERGES: KV(["a b"], VT.ARRAY, VT.STRING),  # gguf-py drops empty arrays; llama.cpp needs ≥ 1
        KT.ADD_BOS: KV(False, VT.BOOL),
    }
