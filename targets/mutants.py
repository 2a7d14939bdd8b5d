"""Mutant targets: the real llama.cpp worker with a known bug class re-created, so the battery can prove it
catches that class. Run as `python -m targets.mutants NAME`; select with `--target mutant:NAME`.

  b1-first-layer-probe   B1: decides whether a stage needs recurrent state by probing only its FIRST layer's
                         tensor names (`.ssm`, `ssm_`, `time_mix`, `recurrent`, `rwkv` — so also blind to LFM2's
                         `shortconv`). When the probe says "attention", a full-state import restores the KV but the
                         recurrent state never crosses: its data arrives zeroed (positions intact), so decoding goes
                         on silently wrong — the seed's ResidentKv misresolution.
  b4-kidx-not-exported   B4: a stage's exported KV carries the MLA rows but not the DSA indexer's k_idx rows — zeros
                         stand where they belong (the sizes stay right), so the importing stage's indexer scores every
                         restored key from a zero key and keeps other keys than the exporter would: silently wrong.
  b5-uniform-kv-rows     B5: a stage's KV export assumes every attention layer has its first layer's K/V row size: the
                         part of a wider layer's rows past that width is zero-filled (the blob's size intact), so the
                         importing stage attends with keys and values cut to the first layer's width.
  swa-window-filters-base-export  A sliding-window model's sequence export that masks every cache by the model's
                         window, the full-attention (base) cache too: a hand-off keeps only the last n_swa positions
                         of the global layers. The blob is self-consistent and imports without an error; decoding
                         goes on silently wrong once the prompt is past the window (how a build failed the laguna
                         hand-off lane in December 2026, and then passed it as "cell order" numerics).
  batched-rows-swapped   A stage fed hidden states for several sequences in one batch swaps the first rows of
                         the first two sequences: single-sequence prefill and decode stay exact, batched decode
                         breaks (how the public layer-split anchor failed).
  seq-leak               Sequences that share a batch share a cache: in a unified KV cache, after a decode holding
                         several sequences the first one's cells are attached to the others too
                         (llama_memory_seq_cp), so they attend to a stranger's keys from then on — the isolation
                         oracle's bug class (a record left attached to another sequence).
  rollback-zeroed        A rollback that restores the positions but not the values: a partial (recurrent) state
                         imports with its data zeroed, so a stage rolled back to an offset goes on from an empty
                         recurrent state — silently wrong (a KvRecurrent restore whose payload never lands).
  token-ids-16-bit       A split runtime that carries token ids to its first stage in 16 bits (a uint16 field in
                         its wire format): every id past 65535 arrives as another token. Exact on every vocabulary
                         of at most 65536 tokens; only a fixture with a wider one (llama-wide-vocab: Llama-3's 128256)
                         shows it.
  seq-rm-leaves-one-cell A sequence removal whose range starts one position late: seq_rm(seq, p0, p1) with p0 > 0
                         removes [p0 + 1, p1), so a rollback leaves the cell at p0 behind — a runtime's off-by-one
                         between "keep n tokens" and "remove from position n". No oracle's script removes a range
                         that starts past 0 and then reads the positions back; only `fuzz memory` draws one.
  seq-keep-keeps-neighbour  A seq_keep that keeps one cell of a neighbour: in a unified cache, the last cell of the
                         first other live sequence stays, attached to the kept one (a keep that walks the cells and
                         keeps the one it stops on). No oracle's script calls seq_keep; only `fuzz memory` draws it.
  refused-decode-keeps-prefix  A runtime that feeds a batch to llama.cpp in pieces of its own (a pipeline stage
                         decoding micro-batches): when the cache has no room for the whole batch, the pieces before
                         the one refused stay in the cache while the batch is reported refused. Only a full cache
                         shows it: no oracle's script fills one; `fuzz memory`'s filling programs do.
  wire-f16-truncated     A split runtime's f16 wire that truncates (rounds toward zero) instead of rounding to
                         nearest: within f16's precision, yet not what f16 is — every stage after a boundary drifts.
  import-clears-context  A sequence-state import that makes room by clearing the whole context first
                         (llama_memory_clear): into a fresh context it is right, into a busy one it wipes every
                         other live sequence — the stage context of a split runtime serving several.
  rollback-all-sequences A rollback that removes the positions from every sequence of the context (seq_rm with
                         seq -1) instead of the one rolled back: alone in its context it is right, beside a live
                         sequence it cuts that one's cache too.
  stage-q4k-mins-dropped A split runtime that re-packs each stage's weights and gets one block layout wrong: Q4_K
                         super-blocks lose their dmin (the f16 that scales each sub-block's minimum), so every stage
                         of a q4_k model computes with weights shifted by their minimums. The unsplit model (never
                         re-packed) is right, and so is a stage in any other weight type: only the dtype lane's
                         q4_k split shows it.
  stale-output-rows      B2, an asynchronous read racing a clear: on a decode that llama.cpp splits into several
                         ubatches (its batch larger than n_ubatch), about half the time — a race, not a rule — the
                         first output row is still the previous decode's last row. Every repeat of a schedule can
                         answer otherwise; single-ubatch decodes are exact, so only the determinism lane's small
                         ubatches show it, on any backend.
  perturb-2-threads      Nondeterminism that appears only under one schedule: with n_threads == 2 every returned
                         logit row gets +1e-3 on token 0 (the B2 class: results depend on thread scheduling).

llama-server's mutants (H1 at its surface and in schedules; a restore that reuses nothing) are in
targets/server_mutants.py; MUTANTS below names them all.

And one that is not a bug, which the battery must not flag (NOT_BUGS):
  batch-shape-noise      Real weights' numerics, large: every logits row of a batch holding more than one token
                         moves by 0.3 × a fixed ±1 pattern (a kernel path that rounds otherwise for several rows,
                         as quantized matmuls on real models do by up to ~2), and a row's sequence sharing a unified
                         cache with another moves it by 0.2 × the same pattern (summation order over more cells) —
                         whatever the other rows and cells hold: no sequence's data reaches another.
"""

from __future__ import annotations

import base64
import os
import struct
import sys
from pathlib import Path
from typing import Any

import numpy as np

from targets.client import as_bytes
from targets.kvstate import HEADER, cache_layers, keep_cells, kv_cells
from targets.llama_cpp_worker import LlamaWorker, main_with
from targets.server_mutants import (
    RadixDuplicateLeak,
    RadixReplaceLiveBorrower,
    RadixRestoreReusesNothing,
    ServerDuplicateLeak,
)
from targets.worker_protocol import FreshAtUnload, RequestError


def f32_of(blob: bytes | str) -> np.ndarray:
    """float32 rows from a reply's bytes or a request's base64."""
    return np.frombuffer(as_bytes(blob), dtype="<f4")


def f32_bytes(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a, dtype="<f4").tobytes()


def f32_b64(a: np.ndarray) -> str:
    return base64.b64encode(f32_bytes(a)).decode()


RECURRENT_NAME_PROBE = (".ssm", "ssm_", "time_mix", "recurrent", "rwkv")


def first_layer_looks_recurrent(path: str) -> bool:
    """skippy's old probe: only the first layer's tensor names decide."""
    from synth.gguf_io import GGUFFile

    names = [n for n in GGUFFile(path).tensors if n.startswith("blk.0.")]
    return any(p in n for n in names for p in RECURRENT_NAME_PROBE)


def zero_recurrent_data(partial: bytes, n_recurrent_layers: int) -> bytes:
    """A partial (recurrent-only) sequence state with every state tensor's data zeroed and its metadata (cells,
    positions, types, row sizes) kept. Layout: llama_context::state_seq_get_data's magic and source seq id, then
    llama_memory_recurrent::state_write (cell count, per-cell pos and seq ids, then r and s tensors)."""
    b = bytearray(partial)
    off = 8  # u32 magic, i32 source seq id
    (cells,) = struct.unpack_from("<I", b, off)
    off += 4
    for _ in range(cells):
        off += 4  # pos
        (n_seq,) = struct.unpack_from("<I", b, off)
        off += 4 + 4 * n_seq
    off += 8  # s_trans, n_layer
    for _ in range(2 * n_recurrent_layers):  # r (conv) states, then s (ssm) states
        off += 4  # type
        (row,) = struct.unpack_from("<Q", b, off)
        off += 8
        b[off:off + cells * row] = bytes(cells * row)
        off += cells * row
    return bytes(b)


def kv_cache_k_rows(b: bytes, off: int) -> tuple[list[tuple[int, int]], int]:
    """(offset, length) of every K row block of one cache without V (MLA, the DSA indexer), and where it ends."""
    layers, end = cache_layers(b, off, has_v=False)
    return [(k[0], k[1] * k[2]) for k in (x["k"] for x in layers)], end


def zero_indexer_rows(full: bytes) -> bytes:
    """A DSA sequence state (state_seq_get_data's magic and seq id, then the MLA cache, then the indexer cache)
    with the indexer cache's k_idx rows zeroed; unchanged if the layout is not that."""
    try:
        _, mla_end = kv_cache_k_rows(full, HEADER)
        lid_rows, end = kv_cache_k_rows(full, mla_end)
    except struct.error:
        return full
    if end != len(full):
        return full
    b = bytearray(full)
    for off, n in lid_rows:
        b[off:off + n] = bytes(n)
    return bytes(b)


def uniform_kv_rows(full: bytes) -> bytes:
    """A sequence state whose first KV cache was written as if every layer had its first layer's K/V row size:
    the part of each wider row past that width zero-filled (sizes intact); unchanged if the layout is not that."""
    try:
        layers, end = cache_layers(full, HEADER)
    except struct.error:
        return full
    if not layers or end > len(full):
        return full
    b = bytearray(full)
    k0 = layers[0]["k"][2]
    v0 = layers[0]["v"]
    for layer in layers[1:]:
        off, cells, row = layer["k"]
        for c in range(cells if row > k0 else 0):
            b[off + c * row + k0:off + (c + 1) * row] = bytes(row - k0)
        v = layer["v"]
        if v and v0 and v[0] == "trans" and v0[0] == "trans" and v[4] > v0[4]:
            _, off, cells, el, n_embd = v
            b[off + v0[4] * cells * el:off + n_embd * cells * el] = bytes((n_embd - v0[4]) * cells * el)
        elif v and v0 and v[0] != "trans" and v0[0] != "trans" and v[2] > v0[2]:
            off, cells, row = v
            for c in range(cells):
                b[off + c * row + v0[2]:off + (c + 1) * row] = bytes(row - v0[2])
    return bytes(b)


class Mutant(FreshAtUnload, LlamaWorker):
    """The llama.cpp worker with a bug re-created."""


def sequence_blob(req: dict) -> bool:
    """A state request moving one sequence's whole state in llama.cpp's in-memory layout (targets/kvstate.py): what
    the export and import mutants rewrite (a file or whole-context state has another layout)."""
    return req.get("via", "memory") == "memory" and not req.get("partial")


class B5UniformKvRows(Mutant):
    def op_state_get(self, req: dict) -> dict:
        out = super().op_state_get(req)
        if sequence_blob(req) and "data" in out:
            out["data"] = uniform_kv_rows(out["data"])
        return out


class SwaWindowFiltersBaseExport(Mutant):
    def op_load(self, req: dict) -> dict:
        info = super().op_load(req)
        from synth.gguf_io import GGUFFile
        from synth.inspect import inspect_file

        meta = inspect_file(req["path"])
        window = GGUFFile(req["path"]).kv.get(f"{meta.arch}.attention.sliding_window")
        self.window = int(window) if isinstance(window, int) and any(x.swa for x in meta.layers) else 0
        return info

    def op_state_get(self, req: dict) -> dict:
        out = super().op_state_get(req)
        if self.window and sequence_blob(req) and "data" in out:
            blob = out["data"]
            if kv_cells(blob, 2) is not None:  # (an iSWA export: the base cache, then the window's)
                out["data"] = keep_cells(blob, 0, lambda p, top: top - p < self.window)
        return out


class WireF16Truncated(Mutant):
    def wire_roundtrip(self, embd: bytes, wire: str) -> bytes:
        if wire != "f16":
            return super().wire_roundtrip(embd, wire)
        x = np.frombuffer(embd, "<u4") & np.uint32(0xFFFFE000)  # f32 → f16 by dropping 13 mantissa bits
        return x.view("<f4").astype(np.float16).astype("<f4").tobytes()


class B4KidxNotExported(Mutant):
    def op_load(self, req: dict) -> dict:
        info = super().op_load(req)
        from synth.inspect import inspect_file

        self.has_indexer = any(x.indexer for x in inspect_file(req["path"]).layers)
        return info

    def op_state_get(self, req: dict) -> dict:
        out = super().op_state_get(req)
        if self.has_indexer and sequence_blob(req) and "data" in out:
            out["data"] = zero_indexer_rows(out["data"])
        return out


class B1FirstLayerProbe(Mutant):
    def op_load(self, req: dict) -> dict:
        info = super().op_load(req)
        from synth.inspect import inspect_file

        self.probe_recurrent = first_layer_looks_recurrent(req["path"])
        self.n_recurrent = sum(x.kind in ("recurrent", "both") for x in inspect_file(req["path"]).layers)
        return info

    def op_state_set(self, req: dict) -> dict:
        out = super().op_state_set(req)
        if sequence_blob(req) and not self.probe_recurrent and self.n_recurrent:
            seq = int(req.get("seq", 0))
            part = self.op_state_get({"seq": seq, "partial": True})
            zeroed = zero_recurrent_data(part["data"], self.n_recurrent)
            super().op_state_set({"seq": seq, "partial": True, "data": base64.b64encode(zeroed).decode()})
        return out


Q4_K_BLOCK = 144  # bytes per 256 values: f16 d, f16 dmin, 12 bytes of 6-bit scales and mins, 128 of 4-bit quants


def drop_q4k_mins(path: str) -> str | None:
    """A copy of a stage file (it carries synth's stage keys) with every Q4_K block's dmin zeroed, written under
    `repacked/` beside it (the split's shared second file linked as it is); None for a full model or a stage
    without Q4_K tensors."""
    from synth.errors import UserError
    from synth.gguf_io import GGUFFile
    from synth.spec import STAGE_KEYS
    from synth.stage import SPLIT_FIRST, SPLIT_SECOND

    src = Path(path)
    try:
        g = GGUFFile(src)
    except UserError:  # not a readable GGUF: the real load reports it
        return None
    q4k = [t for t in g.reader.tensors if t.tensor_type.name == "Q4_K"]
    if not q4k or not any(k.startswith(STAGE_KEYS) for k in g.kv):
        return None
    b = bytearray(g.reader.mm)  # (the file as mapped to read it)
    for t in q4k:
        for blk in range(t.offset, t.offset + t.n_bytes, Q4_K_BLOCK):
            b[blk + 2:blk + 4] = bytes(2)
    out = src.parent / "repacked" / src.name  # (the same name: a split's files are found by theirs)
    out.parent.mkdir(exist_ok=True)
    out.write_bytes(b)
    second = src.with_name(src.name[:-len(SPLIT_FIRST)] + SPLIT_SECOND)
    if src.name.endswith(SPLIT_FIRST) and second.exists():  # the shared globals, as they are
        link = out.with_name(second.name)
        link.unlink(missing_ok=True)
        link.symlink_to(second.resolve())
    return str(out)


class StageQ4kMinsDropped(Mutant):
    def op_load(self, req: dict) -> dict:
        repacked = drop_q4k_mins(req["path"]) if req.get("path") else None
        return super().op_load({**req, "path": repacked} if repacked else req)


class TokenIds16Bit(Mutant):
    def op_load(self, req: dict) -> dict:
        out = super().op_load(req)
        from synth.gguf_io import GGUFFile
        from synth.spec import STAGE_KEYS

        self.stage = any(k.startswith(STAGE_KEYS) for k in GGUFFile(req["path"]).kv)
        return out

    def op_decode(self, req: dict) -> dict:
        if getattr(self, "stage", False) and "tokens" in req:  # what crosses to a stage: ids in 16 bits
            req = {**req, "tokens": [int(t) & 0xFFFF for t in req["tokens"]]}
        return super().op_decode(req)


class Perturb2Threads(Mutant):
    def op_decode(self, req: dict) -> dict:
        out = super().op_decode(req)
        if self.params.get("n_threads") == 2 and "logits" in out:
            rows = f32_of(out["logits"]).reshape(len(out["rows"]), -1).copy()
            rows[:, 0] += np.float32(1e-3)
            out["logits"] = f32_bytes(rows)
            out["argmax"] = [int(np.argmax(r)) for r in rows]
        return out


class StaleOutputRows(Mutant):
    last: np.ndarray | None = None  # the previous decode's last output row (the buffer the racing read sees)

    def op_decode(self, req: dict) -> dict:
        out = super().op_decode(req)
        if "logits" not in out or not out["rows"]:
            return out
        rows = f32_of(out["logits"]).reshape(len(out["rows"]), -1).copy()
        stale, self.last = self.last, rows[-1].copy()
        split = out["n_tokens"] > self.params["n_ubatch"]
        if split and stale is not None and stale.shape == rows[0].shape and os.urandom(1)[0] & 1:
            rows[0] = stale
            out["logits"] = f32_bytes(rows)
            out["argmax"] = [int(np.argmax(r)) for r in rows]
        return out


class BatchShapeNoise(Mutant):
    SHAPE, CELLS = np.float32(0.3), np.float32(0.2)

    def op_decode(self, req: dict) -> dict:
        out = super().op_decode(req)
        if "logits" not in out:
            return out
        n = out["n_tokens"]
        seqs = req.get("seq", 0)
        seqs = seqs if isinstance(seqs, list) else [seqs] * n
        mem = self.L.llama_get_memory(self.ctx)
        held = {s for s in range(self.params["n_seq_max"]) if self.L.llama_memory_seq_pos_max(mem, s) >= 0}
        rows = f32_of(out["logits"]).reshape(len(out["rows"]), -1).copy()
        pattern = np.where(np.arange(rows.shape[1]) % 3 == 0, 1, -1).astype(np.float32)
        for k, row in enumerate(out["rows"]):
            rows[k] += (self.SHAPE if n > 1 else 0) * pattern
            own = {int(x) for x in seqs[row]} if isinstance(seqs[row], list) else {int(seqs[row])}  # (coupled)
            rows[k] += (self.CELLS if self.kv_unified and held - own else 0) * pattern
        out["logits"] = f32_bytes(rows)
        out["argmax"] = [int(np.argmax(r)) for r in rows]
        return out


class BatchedRowsSwapped(Mutant):
    def op_decode(self, req: dict) -> dict:
        seqs = req.get("seq", 0)
        if "embd" in req and isinstance(seqs, list) and len(set(seqs)) > 1:
            width = self.info["n_embd_inp"]
            rows = f32_of(req["embd"]).reshape(-1, width).copy()
            first = {}
            for i, sq in enumerate(seqs):
                first.setdefault(sq, i)
            a, b = list(first.values())[:2]
            rows[[a, b]] = rows[[b, a]]
            req = {**req, "embd": f32_b64(rows)}
        return super().op_decode(req)


class RollbackZeroed(Mutant):
    def op_load(self, req: dict) -> dict:
        info = super().op_load(req)
        from synth.inspect import inspect_file

        self.n_recurrent = sum(x.kind in ("recurrent", "both") for x in inspect_file(req["path"]).layers)
        return info

    def op_state_set(self, req: dict) -> dict:
        if req.get("partial") and self.n_recurrent:
            data = zero_recurrent_data(base64.b64decode(req.get("data", "")), self.n_recurrent)
            req = {**req, "data": base64.b64encode(data).decode()}
        return super().op_state_set(req)


class ImportClearsContext(Mutant):
    def op_state_set(self, req: dict) -> dict:
        if sequence_blob(req):
            self.L.llama_memory_clear(self.L.llama_get_memory(self.ctx), True)
        return super().op_state_set(req)


class RollbackAllSequences(Mutant):
    def op_seq_rm(self, req: dict) -> dict:
        return super().op_seq_rm({**req, "seq": -1})


class SeqLeak(Mutant):
    def op_decode(self, req: dict) -> dict:
        out = super().op_decode(req)
        seqs = req.get("seq", 0)
        ids = [int(y) for x in seqs for y in (x if isinstance(x, list) else [x])] if isinstance(seqs, list) else []
        if self.kv_unified and len(set(ids)) > 1:
            first, *others = dict.fromkeys(ids)
            mem = self.L.llama_get_memory(self.ctx)
            for s in others:
                self.L.llama_memory_seq_cp(mem, first, s, -1, -1)
        return out


class SeqRmLeavesOneCell(Mutant):
    def op_seq_rm(self, req: dict) -> dict:
        p0 = int(req.get("p0", -1))
        return super().op_seq_rm({**req, "p0": p0 + 1} if p0 > 0 else req)


class RefusedDecodeKeepsPrefix(Mutant):
    def op_decode(self, req: dict) -> dict:
        try:
            return super().op_decode(req)
        except RequestError as e:
            n = len(req.get("tokens") or [])
            if e.kind != "no_memory_slot" or n < 2 or not isinstance(req.get("pos"), list):
                raise
            piece = {k: (v[:n // 2] if isinstance(v, list) and len(v) == n else v) for k, v in req.items()}
            try:  # the first half as its own piece; what it leaves in the cache stays there
                super().op_decode({**piece, "logits": "none"})
            except RequestError:
                pass
            raise


class SeqKeepKeepsNeighbour(Mutant):
    def op_seq_keep(self, req: dict) -> dict:
        s = int(req["seq"])
        mem = self.L.llama_get_memory(self._need_ctx())
        if self.kv_unified:  # one cache: the neighbour's last cell is a cell the keep walks past
            for other in range(self.params["n_seq_max"]):
                last = self.L.llama_memory_seq_pos_max(mem, other) if other != s else -1
                if last >= 0:
                    self.L.llama_memory_seq_cp(mem, other, s, last, last + 1)
                    break
        return super().op_seq_keep(req)


MUTANTS: dict[str, Any] = {"b1-first-layer-probe": B1FirstLayerProbe, "b4-kidx-not-exported": B4KidxNotExported,
                           "b5-uniform-kv-rows": B5UniformKvRows,
                           "swa-window-filters-base-export": SwaWindowFiltersBaseExport,
                           "batched-rows-swapped": BatchedRowsSwapped, "import-clears-context": ImportClearsContext,
                           "rollback-all-sequences": RollbackAllSequences,
                           "stage-q4k-mins-dropped": StageQ4kMinsDropped,
                           "perturb-2-threads": Perturb2Threads, "stale-output-rows": StaleOutputRows,
                           "rollback-zeroed": RollbackZeroed,
                           "seq-leak": SeqLeak, "wire-f16-truncated": WireF16Truncated,
                           "token-ids-16-bit": TokenIds16Bit,
                           "seq-rm-leaves-one-cell": SeqRmLeavesOneCell,
                           "seq-keep-keeps-neighbour": SeqKeepKeepsNeighbour,
                           "refused-decode-keeps-prefix": RefusedDecodeKeepsPrefix,
                           "server-dup-leak": ServerDuplicateLeak, "radix-dup-leak": RadixDuplicateLeak,
                           "radix-replace-live-borrower": RadixReplaceLiveBorrower,
                           "radix-restore-reuses-nothing": RadixRestoreReusesNothing}


NOT_BUGS: dict[str, Any] = {"batch-shape-noise": BatchShapeNoise}


def main() -> None:
    name = sys.argv[1] if len(sys.argv) > 1 else ""
    every = {**MUTANTS, **NOT_BUGS}
    if name not in every:
        sys.stderr.write(f"unknown mutant {name!r}; mutants: {', '.join(every)}\n")
        sys.exit(2)
    main_with(every[name])


if __name__ == "__main__":
    main()
