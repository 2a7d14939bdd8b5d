"""A tiny BPE vocabulary the pinned llama.cpp accepts for any arch (notes §2.4: gpt2 with ≥ 1 merge)."""

from __future__ import annotations

import gguf

from synth.gguf_io import KV, VT

KT = gguf.Keys.Tokenizer


def vocab_tokens(n_vocab: int) -> list[str]:
    base = ["a", "b", "ab"]
    return (base + [f"t{i}" for i in range(len(base), n_vocab)])[:n_vocab]


def tokenizer_kv(n_vocab: int) -> dict[str, KV]:
    return {
        KT.MODEL: KV("gpt2", VT.STRING),
        KT.PRE: KV("default", VT.STRING),
        KT.LIST: KV(vocab_tokens(n_vocab), VT.ARRAY, VT.STRING),
        KT.MERGES: KV(["a b"], VT.ARRAY, VT.STRING),  # gguf-py drops empty arrays; llama.cpp needs ≥ 1
        KT.ADD_BOS: KV(False, VT.BOOL),
    }
