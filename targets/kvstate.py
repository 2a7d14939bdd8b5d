"""The layout of a sequence state llama.cpp exports (protocol `state_get`), read in one place: the mutants that
re-create export bugs write into it, and the hand-off oracle's cause analysis reads what it holds.

llama_context::state_seq_get_data writes u32 magic, i32 source seq id, then the memory's state: one KV cache, or
an iSWA model's base and sliding-window caches in that order (llama_kv_cache::state_write). A cache: u32 n_stream;
per stream u32 cell count, per cell i32 pos, u32 n_seq_id and the seq ids; u32 v_trans, u32 n_layer; per layer
i32 type, u64 K row size and the K rows; then per layer V: i32 type, u64 row size and the rows, or (transposed)
u32 element size, u32 n_embd_v_gqa and n_embd_v_gqa runs of cell-count elements. A cache without V (MLA, the DSA
indexer) ends after K.
"""

from __future__ import annotations

import struct
from typing import Any

HEADER = 8  # u32 magic, i32 source seq id


def cache_layers(b: bytes, off: int, *, has_v: bool = True) -> tuple[list[dict[str, Any]], int]:
    """Every layer of one cache, stream by stream, and where the cache ends: [{"pos": the stream's cell positions,
    "k": (offset, cells, row bytes), "v": (offset, cells, row bytes) | ("trans", offset, cells, element bytes,
    n_embd_v) | None}]. Raises struct.error on a blob too short for the layout, OverflowError on one of another
    layout whose counts run past any offset."""
    layers, _, end = read_cache(b, off, has_v=has_v)
    return layers, end


def read_cache(b: bytes, off: int, *, has_v: bool = True) -> tuple[list[dict[str, Any]], list[int], int]:
    """cache_layers' layers, every cell's position (also of a cache without layers: a stage of a sliding-window
    model holding none of the base cache's layers still writes its cells), and where the cache ends."""
    (n_stream,) = struct.unpack_from("<I", b, off)
    off += 4
    layers: list[dict[str, Any]] = []
    positions: list[int] = []
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
        positions += pos
        (v_trans, n_layer) = struct.unpack_from("<II", b, off)
        off += 8
        stream = []
        for _ in range(n_layer):
            (row,) = struct.unpack_from("<Q", b, off + 4)
            off += 12
            stream.append({"pos": pos, "k": (off, cells, row), "v": None})
            off += cells * row
        for layer in stream if has_v else ():
            if off >= len(b):  # no V here: the blob ends (or a cache without V was read as one with)
                break
            if v_trans:
                (el, n_embd) = struct.unpack_from("<II", b, off + 4)
                off += 12
                layer["v"] = ("trans", off, cells, el, n_embd)
                off += n_embd * cells * el
            else:
                (row,) = struct.unpack_from("<Q", b, off + 4)
                off += 12
                layer["v"] = (off, cells, row)
                off += cells * row
        layers += stream
    if off > len(b):  # (counts read from a blob of another layout: rows past its end, never to be read)
        raise struct.error(f"the cache's rows run to byte {off}, past the blob's {len(b)}")
    return layers, positions, off


def rows_by_position(b: bytes, layers: list[dict[str, Any]]) -> dict[int, bytes]:
    """What a cache holds, wherever its cells sit: each position's K and V rows of every layer, concatenated."""
    out: dict[int, list[bytes]] = {}
    for layer in layers:
        off, cells, row = layer["k"]
        v = layer["v"]
        for c, p in enumerate(layer["pos"]):
            parts = out.setdefault(p, [])
            parts.append(b[off + c * row:off + (c + 1) * row])
            if v and v[0] == "trans":
                _, voff, _, el, n_embd = v
                parts.append(b"".join(b[voff + (j * cells + c) * el:voff + (j * cells + c + 1) * el]
                                      for j in range(n_embd)))
            elif v:
                voff, _, vrow = v
                parts.append(b[voff + c * vrow:voff + (c + 1) * vrow])
    return {p: b"".join(parts) for p, parts in out.items()}


def kv_caches(blob: bytes, n_caches: int) -> list[dict[int, bytes]] | None:
    """The first n_caches KV caches of a full sequence export, each {position: rows}; None if the blob is not
    that (another memory, another layout)."""
    cells = kv_cells(blob, n_caches)
    return None if cells is None else [rows for _, rows in cells]


def kv_cells(blob: bytes, n_caches: int) -> list[tuple[set[int], dict[int, bytes]]] | None:
    """The first n_caches KV caches of a full sequence export, each (the positions its cells hold, {position:
    rows}); None if the blob is not that (another memory, another layout)."""
    off, out = HEADER, []
    try:
        for _ in range(n_caches):
            layers, positions, off = read_cache(blob, off)
            out.append((set(positions), rows_by_position(blob, layers)))
    except (struct.error, OverflowError):  # (a blob of another layout read as this one: offsets run off)
        return None
    return out if off == len(blob) else None


def other_width(blob: bytes) -> bytes | None:
    """A full sequence export of one or two KV caches (nothing else after them) whose first K layer claims rows two
    bytes wider than it holds: the state of a model of other widths, which llama.cpp must refuse to import
    (llama_kv_cache::state_read_data compares every layer's row size). None if the blob is not that layout, or
    holds no cells."""
    for n in (1, 2):
        if kv_cells(blob, n) is not None:
            layers, _ = cache_layers(blob, HEADER)
            if not layers:
                return None
            field = layers[0]["k"][0] - 8  # (the row size: the u64 before the first row)
            (row,) = struct.unpack_from("<Q", blob, field)
            return blob[:field] + struct.pack("<Q", row + 2) + blob[field + 8:]
    return None


def keep_cells(blob: bytes, cache: int, keep: Any) -> bytes:
    """A full sequence export with cache number `cache` (0: the first; an iSWA model's base cache) rewritten to hold
    only the cells whose position `keep(pos, highest position)` accepts — a self-consistent blob (cell counts, every
    layer's K and V rows, transposed V's runs) that imports without an error. Unchanged if the blob is not that
    layout. (Mutants re-create export bugs with it.)"""
    try:
        off = HEADER
        for _ in range(cache):
            _, _, off = read_cache(blob, off)
        start = off
        _, _, end = read_cache(blob, start)  # (the layout first: counts of another one would run past the blob)
        (n_stream,) = struct.unpack_from("<I", blob, off)
        off += 4
        out = [blob[:start], struct.pack("<I", n_stream)]
        for _ in range(n_stream):
            (cells,) = struct.unpack_from("<I", blob, off)
            off += 4
            meta, pos = [], []
            for _ in range(cells):
                p, n_seq = struct.unpack_from("<iI", blob, off)
                meta.append(blob[off:off + 8 + 4 * n_seq])
                pos.append(p)
                off += 8 + 4 * n_seq
            top = max(pos, default=-1)
            kept = [c for c, p in enumerate(pos) if keep(p, top)]
            out += [struct.pack("<I", len(kept)), *(meta[c] for c in kept)]
            if not cells:
                continue
            (v_trans, n_layer) = struct.unpack_from("<II", blob, off)
            out.append(blob[off:off + 8])
            off += 8
            for _ in range(n_layer):  # K: i32 type, u64 row size, a row per cell
                (row,) = struct.unpack_from("<Q", blob, off + 4)
                out.append(blob[off:off + 12])
                off += 12
                out += [blob[off + c * row:off + (c + 1) * row] for c in kept]
                off += cells * row
            for _ in range(n_layer if off < len(blob) else 0):  # V, where the cache has one
                if v_trans:  # i32 type, u32 element size, u32 n_embd_v, then n_embd_v runs of a value per cell
                    (el, n_embd) = struct.unpack_from("<II", blob, off + 4)
                    out.append(blob[off:off + 12])
                    off += 12
                    for _ in range(n_embd):
                        out += [blob[off + c * el:off + (c + 1) * el] for c in kept]
                        off += cells * el
                else:
                    (row,) = struct.unpack_from("<Q", blob, off + 4)
                    out.append(blob[off:off + 12])
                    off += 12
                    out += [blob[off + c * row:off + (c + 1) * row] for c in kept]
                    off += cells * row
        if end != off:
            return blob
        return b"".join(out) + blob[off:]
    except (struct.error, OverflowError):
        return blob
