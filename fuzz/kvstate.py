"""Reading a sequence state llama.cpp exported (protocol `state_get`) as what it holds: for each KV cache in it (a
model's cache, or an iSWA model's base and sliding-window caches, in that order), every cell's position and its
K and V rows. Two exports hold the same cache contents when they map the same positions to the same row bits —
wherever the cells sit (a restore places a window's cells elsewhere in the ring than the run that made them).

Layout (llama_context::state_seq_get_data, llama_kv_cache::state_write): u32 magic, i32 source seq id; per cache
u32 n_stream; per stream u32 cell count, per cell i32 pos, u32 n_seq_id and the seq ids; u32 v_trans, u32 n_layer;
per layer i32 type, u64 K row size and the rows; then per layer V: i32 type, u64 row size and the rows, or
(transposed) u32 element size, u32 n_embd_v_gqa and that many runs of cell-count elements.
"""

from __future__ import annotations

import struct


def _cache(b: bytes, off: int) -> tuple[dict[int, bytes], int]:
    """One cache's {position: its K and V rows of every layer, concatenated} and where it ends."""
    (n_stream,) = struct.unpack_from("<I", b, off)
    off += 4
    out: dict[int, bytes] = {}
    for _ in range(n_stream):
        (cells,) = struct.unpack_from("<I", b, off)
        off += 4
        if not cells:
            continue
        pos = []
        for _ in range(cells):
            p, n_seq = struct.unpack_from("<iI", b, off)
            pos.append(p)
            off += 8 + 4 * n_seq
        v_trans, n_layer = struct.unpack_from("<II", b, off)
        off += 8
        rows: list[list[bytes]] = [[] for _ in range(cells)]
        for _ in range(n_layer):  # K
            (row,) = struct.unpack_from("<Q", b, off + 4)
            off += 12
            for c in range(cells):
                rows[c].append(b[off + c * row:off + (c + 1) * row])
            off += cells * row
        for _ in range(n_layer):  # V (a cache without V ends here: the blob does, or the next cache's n_stream)
            if off >= len(b):
                break
            if v_trans:
                el, n_embd = struct.unpack_from("<II", b, off + 4)
                off += 12
                for c in range(cells):
                    rows[c].append(b"".join(b[off + (j * cells + c) * el:off + (j * cells + c + 1) * el]
                                            for j in range(n_embd)))
                off += n_embd * cells * el
            else:
                (row,) = struct.unpack_from("<Q", b, off + 4)
                off += 12
                for c in range(cells):
                    rows[c].append(b[off + c * row:off + (c + 1) * row])
                off += cells * row
        for p, r in zip(pos, rows, strict=True):
            out[p] = b"".join(r)
    return out, off


def kv_caches(blob: bytes, n_caches: int) -> list[dict[int, bytes]] | None:
    """The first n_caches KV caches of a full sequence export, each {position: rows}; None if the blob is not
    that (another memory, another layout)."""
    off, out = 8, []
    try:
        for _ in range(n_caches):
            cache, off = _cache(blob, off)
            out.append(cache)
    except struct.error:
        return None
    return out if off == len(blob) else None
