"""A loaded model's own tokenizer for the llama.cpp worker's tokenize and detokenize ops (llama_tokenize,
llama_detokenize)."""

from __future__ import annotations

import ctypes
from typing import Any

from targets.worker_protocol import RequestError


def tokenize(L: Any, model: Any, text: str) -> list[int]:
    """No BOS/EOS added, special-token text not parsed."""
    vocab, raw = L.llama_model_get_vocab(model), text.encode()
    n = L.llama_tokenize(vocab, raw, len(raw), None, 0, False, False)  # -(tokens needed), or 0
    buf = (ctypes.c_int32 * max(-n, 1))()
    got = L.llama_tokenize(vocab, raw, len(raw), buf, len(buf), False, False) if n < 0 else 0
    return list(buf[:got])


def detokenize(L: Any, model: Any, ids: list[int]) -> str:
    """Special tokens neither removed nor rendered."""
    vocab = L.llama_model_get_vocab(model)
    if any(not 0 <= t < L.llama_vocab_n_tokens(vocab) for t in ids):
        raise RequestError("bad_request", "detokenize: token id out of range")
    arr = (ctypes.c_int32 * max(len(ids), 1))(*ids)
    size = 16 * len(ids) + 16
    for _ in range(2):  # a negative result is the size needed
        out = ctypes.create_string_buffer(size)
        n = L.llama_detokenize(vocab, arr, len(ids), out, size, False, False)
        if n >= 0:
            return out.raw[:n].decode("utf-8", errors="replace")
        size = -n
    raise RequestError("bad_request", "detokenize: llama_detokenize did not fit its own size")
