"""`fuzz memory`: llama.cpp's memory operations in any order, each sequence checked against its own history.

A split runtime or a server does not follow a script: it decodes batches holding several sequences, forks a
sequence (seq_cp), rolls one back or cuts out its middle (seq_rm), keeps one (seq_keep), shifts positions
(seq_add / seq_div), moves a sequence's state to another id or another context (state get / set), and goes on
after an import the context refused. This oracle draws such programs — seeded, any operation after any other,
over several live sequences — and runs them on a real context, keeping a model of what every sequence holds:

- its cells' positions, so after every operation each sequence's [seq_pos_min, seq_pos_max] is what the memory
  must report (exact for a plain KV cache; a recurrent or hybrid memory reports its one state cell as both; a
  sliding-window cache may have dropped cells below the window, so there pos_min only has to lie between);
- its log: what a fresh context must be given to hold the same — its tokens decoded at their positions, then any
  removal, shift or division that is not a truncation (a truncation of a log of decodes is the shorter decodes:
  a rolled-back sequence must equal a recompute of the tokens it kept, recurrent state included).

After every decode, each decoded sequence's logits must equal its log replayed alone in a fresh context (one
sequence, the same chunks), within `tol`: the machine's batches hold other sequences' tokens and its cells sit
elsewhere, and upstream promises no bits across batch shapes (the isolation lane measures that numerics at most
~1e-2 on every fixture; a lost or foreign cell moves logits by ~1). A refused operation (seq_rm of a recurrent
sequence it cannot roll back, an import of a truncated blob) must change nothing but what it names: the other
sequences are checked as before, and every program ends with a decode of every live sequence.

Programs come from a seed (`engine` seeded: the lanes, campaigns) or from Hypothesis (`engine` hypothesis: a
RuleBasedStateMachine with one rule per operation, the same drawer choosing the arguments, Hypothesis shrinking).
A finding is run again from a fresh context (it must reproduce), shortened (runs of operations deleted, decodes
joined, sequences and tokens dropped while the same check still fails at the end: a bundle replays the program
exactly) and explained by controls that each change one thing (explain): rollbacks done as recomputes, a decode
elsewhere after one operation, the program without the other sequences and with other tokens for them, the other KV
layout. A difference the other sequences' mere presence explains (their data provably not reaching it) is numerics.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import json
import re
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fuzz.engine.configs import check_config
from fuzz.engine.contract import (
    CRASH,
    FINDING,
    NUMERICS,
    PASS,
    UNSUPPORTED,
    Finding,
    Oracle,
    Report,
    fingerprint,
    make_report,
)
from fuzz.engine.parity import context_params, pos_per_token
from fuzz.engine.stages import FixtureStages
from synth.errors import UserError
from synth.gguf_io import GGUFFile
from synth.inspect import inspect_file
from synth.stage import Unsupported
from targets import Target, open_target

OPS = ("decode", "coupled", "rm", "cp", "keep", "add", "div", "copy_state", "refused_import", "reload")
EXPORTS = ("copy_state", "refused_import", "reload")  # the operations that read a sequence's state out


def step_class(op: str) -> str:
    """What an operation is to deferred work it ran before: an export (any of them: the state read out), else
    itself (a second shift, a removal, ... that changes the cells the work is pending on)."""
    return "export" if op in EXPORTS else op
# what a finding failed, its `where`: logits, pos (the positions a sequence reports), refusal (an operation refused,
# or accepted, against the API), crash (the target aborted or hung)
MINIMIZE_RUNS = 150  # programs tried while shortening one finding (each from a fresh context; recomputes cached)


@dataclass
class MemoryConfig:
    programs: int = 8  # programs drawn per KV layout
    steps: int = 16  # operations per drawn program (its last: a decode of every live sequence)
    n_seq: int = 3
    max_len: int = 40  # positions a sequence holds at most (cells well inside every layout's context)
    n_rs_seq: int = 4  # recurrent-state snapshots per sequence (rollback; llama.cpp clamps it on archs without)
    kv_unified: tuple[bool, ...] = (True, False)
    tol: float = 0.1  # the least tolerance: max |Δlogit| against the recompute (batch shapes move ~1e-2 on fixtures)
    noise_factor: float = 4.0  # the tolerance is this many times the model's own batch-shape move (0: tol only)
    program: list | None = None  # a recorded program: run exactly it (bundles, shrinking) instead of drawing
    engine: str = "seeded"  # seeded: `programs` drawn from the seed; hypothesis: a state machine, `programs` examples
    stage: str = ""  # A:B: the stage of layers [A, B) instead of the model (past the first, fed rows, not ids)
    seed: int = 0
    target: str = "llama-cpp"
    timeout: float = 120.0


# ---- the model: what every sequence holds ----------------------------------------------------------------------
class Model:
    """Each sequence's cell positions (a multiset: a division can put two cells at one position) and its log."""

    def __init__(self, n_seq: int):
        self.cells: dict[int, list[int]] = {s: [] for s in range(n_seq)}
        self.log: dict[int, list[list[Any]]] = {s: [] for s in range(n_seq)}
        # the sequences each one may share cells with since a fork (a unified cache's seq_cp tags the same cells
        # with both ids; a recurrent fork shares the state cell): a shift or division of one moves the other's too
        self.shares: dict[int, set[int]] = {s: set() for s in range(n_seq)}
        self.reported: dict[str, list[int]] = {}  # [pos_min, pos_max] per sequence as the memory last reported
        self.faithful_shifts = False  # the model's own shift measured faithful (Recompute.shift_move): see add()

    def live(self) -> list[int]:
        return [s for s, c in self.cells.items() if c]

    def span(self, s: int) -> tuple[int, int]:
        c = self.cells[s]
        return (min(c), max(c)) if c else (-1, -1)

    def next_pos(self, s: int) -> int:
        return self.span(s)[1] + 1

    def decode(self, s: int, tokens: list[int]) -> list[int]:
        p = self.next_pos(s)
        pos = list(range(p, p + len(tokens)))
        self.cells[s] += pos
        self.log[s].append(["d", [[q, t] for q, t in zip(pos, tokens, strict=True)]])
        return pos

    def coupled(self, seqs: list[int], tokens: list[int], *, shared: bool) -> None:
        """The same tokens decoded once into several sequences at one position (a shared prefix): each holds them."""
        for s in seqs:
            self.decode(s, tokens)
        if shared:
            group = set(seqs).union(*(self.shares[s] for s in seqs))
            for q in group:
                self.shares[q] = group - {q}

    def rm(self, s: int, p0: int, p1: int) -> None:
        for q in (self.live() if s < 0 else [s]):
            lo, hi = max(p0, 0), (p1 if p1 >= 0 else 1 << 62)
            self.cells[q] = [x for x in self.cells[q] if not lo <= x < hi]
            tail = not any(x >= hi for x in self.cells[q])
            if not self.cells[q]:
                self.clear(q)
            elif tail and all(e[0] in ("d", "rm") for e in self.log[q]):
                # a truncation: the kept tokens recomputed (removals between them replayed where they were). With
                # positions never shifted, every dropped token was decoded after the cells kept at lower positions,
                # which never saw it; and a fresh context replaying the dropped tokens could lose a window cell the
                # kept ones need (its sliding-window cache reuses cells masked for the newer positions)
                entries = [["d", [pt for pt in e[1] if pt[0] < lo]] if e[0] == "d" else e for e in self.log[q]]
                self.log[q] = [e for e in entries if e[0] != "d" or e[1]]
            else:
                self.log[q].append(["rm", p0, p1])

    def cp(self, src: int, dst: int, p0: int, p1: int, *, shared: bool) -> None:
        self.clear(dst)
        self.log[dst] = [list(e) for e in self.log[src]]
        self.cells[dst] = list(self.cells[src])
        if shared and self.cells[src]:
            group = self.shares[src] | {src}
            for q in group:
                self.shares[q].add(dst)
            self.shares[dst] = group
        if p0 > 0:
            self.rm(dst, 0, p0)
        if p1 >= 0:
            self.rm(dst, p1, -1)

    def keep(self, s: int) -> None:
        for q in self.cells:
            if q != s:
                self.clear(q)

    def add(self, s: int, p0: int, p1: int, delta: int) -> None:
        lo, hi = max(p0, 0), (p1 if p1 >= 0 else 1 << 62)
        moved = [x + delta if lo <= x < hi else x for x in self.cells[s]]
        if self.faithful_shifts and self.cells[s] and all(lo <= x < hi and x + delta >= 0 for x in self.cells[s]) \
                and all(e[0] == "d" for e in self.log[s]):
            # the whole sequence moved (rotary attention sees positions relative to each other, so nothing it
            # computed changes): its recompute decodes the same tokens at the new positions — not the shift
            # replayed, which would carry a shift bug into the recompute too. Only on a model whose own shift was
            # measured faithful: absolute position embeddings (gpt2) or a position-dependent scaling are not
            self.cells[s] = moved
            self.log[s] = [["d", [[pos + delta, tok] for pos, tok in e[1]]] for e in self.log[s]]
            return
        self.cells[s] = [x for x in moved if x >= 0]  # llama.cpp drops a cell shifted below 0
        self.log[s].append(["add", p0, p1, delta])
        if not self.cells[s]:
            self.clear(s)

    def div(self, s: int, p0: int, p1: int, d: int) -> None:
        lo, hi = max(p0, 0), (p1 if p1 >= 0 else 1 << 62)
        self.cells[s] = [x // d if lo <= x < hi else x for x in self.cells[s]]
        self.log[s].append(["div", p0, p1, d])

    def copy(self, src: int, dst: int) -> None:
        self.clear(dst)
        self.cells[dst], self.log[dst] = list(self.cells[src]), [list(e) for e in self.log[src]]

    def clear(self, s: int) -> None:
        self.cells[s], self.log[s] = [], []
        for q in self.shares[s]:
            self.shares[q].discard(s)
        self.shares[s] = set()

    def permute(self, perm: list[int]) -> None:
        """Every sequence imported under another id into a fresh context (its own cells: nothing shared)."""
        self.cells = {perm[s]: c for s, c in self.cells.items()}
        self.log = {perm[s]: g for s, g in self.log.items()}
        self.shares = {s: set() for s in self.cells}
        self.reported = {}

    def history(self, s: int) -> str:
        """What a sequence holds, as one comparable key: its cells' positions and its log."""
        return json.dumps([sorted(self.cells[s]), self.log[s]])

    def apply(self, op: dict[str, Any], *, shared: bool) -> None:
        """An operation as if the memory accepted it (`shared`: a fork or a coupled decode shares cells)."""
        k = op["op"]
        if k == "decode":
            for q, toks in op["parts"]:
                self.decode(q, toks)
        elif k == "coupled":
            self.coupled(op["seqs"], op["tokens"], shared=shared)
        elif k == "rm":
            self.rm(op["seq"], op["p0"], op["p1"])
        elif k == "cp":
            self.cp(op["src"], op["dst"], op["p0"], op["p1"], shared=shared)
        elif k == "keep":
            self.keep(op["seq"])
        elif k == "add":
            self.add(op["seq"], op["p0"], op["p1"], op["delta"])
        elif k == "div":
            self.div(op["seq"], op["p0"], op["p1"], op["d"])
        elif k == "copy_state":
            self.copy(op["src"], op["dst"])
        elif k == "refused_import":
            self.clear(op["dst"])
        elif k == "reload":
            self.permute(op["perm"])


@dataclass(frozen=True)
class Memory:
    """What the loaded context's memory is, as far as the checks need it."""

    n_vocab: int
    recurrent: bool  # holds recurrent state (pure or hybrid): one state cell per sequence, pos_min == pos_max
    swa: int  # the sliding window (0: none): cells below it may be gone
    can_shift: bool
    n_rs_seq: int  # the rollback snapshots the context took

    kind: str = "kv"  # kv | recurrent | hybrid

    @property
    def name(self) -> str:
        """The memory's kind as llama.cpp builds it for this model and context (what a finding's fingerprint
        records: the same operations fail alike on every model with this memory)."""
        return self.kind + ("-swa" if self.swa else "") + ("+rollback" if self.n_rs_seq else "")

    def expected_min(self, span: tuple[int, int]) -> tuple[int, int]:
        """The range seq_pos_min may report for a sequence whose model holds `span`."""
        lo, hi = span
        if hi < 0:
            return (-1, -1)
        if self.recurrent:
            return (hi, hi)
        return (lo, hi) if self.swa else (lo, lo)


def check_positions(model: Model, mem: Memory, got: dict[str, list[int]]) -> dict[str, Any] | None:
    """The first sequence whose reported [pos_min, pos_max] is not what the model holds (pure: testable alone)."""
    for s in sorted(model.cells):
        want = model.span(s)
        pmin, pmax = got[str(s)]
        lo, hi = mem.expected_min(want)
        if pmax != want[1] or not lo <= pmin <= hi:
            return {"seq": s, "got": [pmin, pmax], "want": [lo if lo == hi else [lo, hi], want[1]],
                    "message": f"sequence {s} reports positions [{pmin}, {pmax}], the model holds "
                               + (f"[{want[0]}, {want[1]}]" if want[1] >= 0 else "none")}
    return None


def compare_logits(got: np.ndarray, want: np.ndarray, tol: float) -> tuple[float, bool]:
    """max |Δlogit| and whether it is within tol (pure)."""
    d = float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64)))) if got.size else float("inf")
    return d, d <= tol


# ---- drawing programs ------------------------------------------------------------------------------------------
class SeededDraws:
    """A drawn program's choices from a seeded generator (the lanes, campaigns, `fuzz memory`)."""

    def __init__(self, rng: np.random.Generator):
        self.rng = rng

    def int(self, lo: int, hi: int) -> int:  # lo <= x < hi
        return int(self.rng.integers(lo, hi))

    def pick(self, xs: Sequence[Any]) -> Any:
        return xs[self.int(0, len(xs))]

    def kind(self, weights: dict[str, float]) -> str:
        kinds = [k for k, w in weights.items() if w > 0]
        w = np.array([weights[k] for k in kinds])
        return kinds[int(self.rng.choice(len(kinds), p=w / w.sum()))]

    def subset(self, xs: list[int]) -> list[int]:  # non-empty
        return sorted(self.rng.choice(xs, size=self.int(1, len(xs) + 1), replace=False).tolist())

    def perm(self, n: int) -> list[int]:
        return self.rng.permutation(n).tolist()


class HypothesisDraws(SeededDraws):
    """The same choices drawn by Hypothesis (`--engine hypothesis`): it shrinks each one toward its simplest value
    (the first kind, the lowest position, one sequence) as well as deleting whole operations."""

    def __init__(self, data: Any):
        from hypothesis import strategies as st

        self.data, self.st = data, st

    def int(self, lo: int, hi: int) -> int:
        return self.data.draw(self.st.integers(lo, hi - 1))

    def kind(self, weights: dict[str, float]) -> str:
        return self.data.draw(self.st.sampled_from([k for k, w in weights.items() if w > 0]))

    def subset(self, xs: list[int]) -> list[int]:
        return sorted(self.data.draw(self.st.lists(self.st.sampled_from(xs), min_size=1, max_size=len(xs),
                                                   unique=True)))

    def perm(self, n: int) -> list[int]:
        return list(self.data.draw(self.st.permutations(range(n))))


def coupled_groups(model: Model, cfg: MemoryConfig) -> list[list[int]]:
    """Sequences that could take one coupled decode now: two or more with the same history (a shared prefix: all
    empty, or forks and copies not yet apart), with room. A coupled token is computed once, so its sequences must
    not have diverged; llama.cpp checks only that their positions agree, and refuses a decode where they do not."""
    by: dict[str, list[int]] = {}
    for s in model.cells:
        if model.next_pos(s) + 6 <= cfg.max_len:
            # (and the positions the memory reports: a window cache may have pruned one of two equal histories
            # more than the other, and llama.cpp's check for divergence compares the reported positions)
            by.setdefault(json.dumps([model.history(s), model.reported.get(str(s))]), []).append(s)
    return [g for g in by.values() if len(g) > 1]


def precondition_problem(program: list[dict[str, Any]], mem: Memory, cfg: MemoryConfig, kv_unified: bool
                         ) -> str | None:
    """Why a given program (a bundle's, a shortened one, a hand-written one) leaves the API's stated preconditions
    the drawer keeps (a shift of cells shared since a fork, a coupled decode of sequences that have diverged), or
    None. Walks the model as if every operation were accepted."""
    m = Model(cfg.n_seq)
    for i, op in enumerate(program):
        k = op["op"]
        if k in ("add", "div") and m.shares[op["seq"]]:
            return f"step {i} ({format_step(op)}) shifts cells sequence {op['seq']} shares since a fork"
        if k == "coupled" and len({m.history(q) for q in op["seqs"]}) > 1:
            return f"step {i} ({format_step(op)}) couples sequences whose histories differ"
        m.apply(op, shared=kv_unified or mem.recurrent)
    return None


def op_weights(model: Model, mem: Memory, cfg: MemoryConfig, kv_unified: bool = True) -> dict[str, float]:
    """How often each operation is drawn now (0: not valid in this state or for this memory). A coupled decode (one
    token in several sequences) needs one unified cache and a memory with cells to share: llama.cpp refuses it
    otherwise (no memory slot), as it documents."""
    coupled = 1.0 if kv_unified and mem.kind != "recurrent" and coupled_groups(model, cfg) else 0.0
    if not model.live():
        return {"decode": 1.0, "coupled": coupled}
    room = any(model.next_pos(s) + 6 <= cfg.max_len for s in model.cells)
    # positions are shifted in an attention cache, on a sequence that shares no cells: a recurrent state holds one
    # position (its last token's), a sliding window would un-mask cells a fresh context never pruned, and a cell
    # shared since a fork moves for both sequences
    shifts = any(not model.shares[s] for s in model.live()) and mem.can_shift and not mem.swa and not mem.recurrent
    return {"decode": 5.0 if room else 0.0, "coupled": coupled, "rm": 2.5, "cp": 1.5, "keep": 0.8, "copy_state": 1.0,
            "refused_import": 0.5, "reload": 0.6, "add": 1.0 if shifts else 0.0, "div": 0.5 if shifts else 0.0}


def draw_op(draw: SeededDraws, model: Model, mem: Memory, cfg: MemoryConfig, kv_unified: bool,
            kind: str | None = None, seq: int | None = None) -> dict[str, Any]:
    """One operation a runtime could issue now (of `kind`, or one drawn by op_weights): valid for the model's state
    and within the API's stated preconditions (a fork across the streams of a per-sequence cache copies whole
    sequences only: llama.cpp asserts `seq_cp() is only supported for full KV buffers` otherwise), not necessarily
    accepted."""
    kind = kind or draw.kind(op_weights(model, mem, cfg, kv_unified))
    n = len(model.cells)
    if kind == "coupled":  # a shared prefix: the same tokens into two or more sequences at one position
        group = draw.pick(coupled_groups(model, cfg))
        seqs = draw.subset(group)
        seqs = seqs if len(seqs) > 1 else sorted({*seqs, *[q for q in group if q not in seqs][:1]})
        return {"op": "coupled", "seqs": seqs, "tokens": [draw.int(0, mem.n_vocab) for _ in range(draw.int(1, 7))]}
    if kind == "decode":
        room = [s for s in model.cells if model.next_pos(s) + 6 <= cfg.max_len]
        return {"op": "decode", "parts": [[s, [draw.int(0, mem.n_vocab) for _ in range(draw.int(1, 7))]]
                                          for s in draw.subset(room)]}
    live = model.live()
    can = [q for q in live if not model.shares[q]] if kind in ("add", "div") else live
    s = seq if seq in can else draw.pick(can)
    lo, hi = model.span(s)
    other = [q for q in range(n) if q != s]
    if kind == "rm":
        form = draw.pick(("tail", "rollback", "middle", "head", "whole", "all-seqs"))
        if form == "tail":
            return {"op": "rm", "seq": s, "p0": draw.int(lo, hi + 2), "p1": -1}
        if form == "rollback":  # the last few tokens, as a speculative decode or a split runtime rolls back
            return {"op": "rm", "seq": s, "p0": max(lo, hi + 1 - draw.int(1, max(2, mem.n_rs_seq + 2))), "p1": -1}
        if form in ("middle", "head"):
            a = lo if form == "head" else draw.int(lo, hi + 1)
            return {"op": "rm", "seq": s, "p0": a, "p1": draw.int(a + 1, hi + 2)}
        if form == "whole":
            return {"op": "rm", "seq": s, "p0": -1, "p1": -1}
        return {"op": "rm", "seq": -1, "p0": draw.int(0, hi + 1), "p1": -1}
    if kind == "cp":  # a fork; a recurrent state is copied whole whatever the range, so only whole forks there
        p0 = p1 = -1
        if not mem.recurrent and kv_unified and draw.pick((False, True)):
            p0 = draw.int(lo, hi + 1)
            p1 = draw.pick((-1, draw.int(p0 + 1, hi + 2)))
        return {"op": "cp", "src": s, "dst": draw.pick(other), "p0": p0, "p1": p1}
    if kind == "keep":
        return {"op": "keep", "seq": s}
    if kind == "add":
        p0 = draw.int(lo, hi + 1)
        return {"op": "add", "seq": s, "p0": p0, "p1": -1, "delta": draw.int(-min(p0, 8), 9)}
    if kind == "div":
        return {"op": "div", "seq": s, "p0": draw.int(lo, hi + 1), "p1": -1, "d": draw.int(2, 4)}
    if kind == "reload":
        return {"op": "reload", "perm": draw.perm(n)}
    return {"op": kind, "src": s, "dst": draw.pick(other)}


BURST = 0.3  # how often an operation that leaves work for the next decode is followed by another of its kind


def burst(rng: np.random.Generator, done: list[dict[str, Any]], mach: Any, cfg: MemoryConfig, kv_unified: bool
          ) -> tuple[str | None, int | None]:
    """(kind, seq) for the next seeded operation: after a shift or a removal, now and then the same operation on
    the same sequence again before any decode (work llama.cpp defers to the next decode piles up: two shifts, two
    rollbacks); (None, None) otherwise: drawn as usual."""
    last = done[-1] if done else None
    if last is None or last["op"] not in ("add", "div", "rm") or last.get("seq", -1) < 0 or rng.random() >= BURST:
        return None, None
    if op_weights(mach.model, mach.mem, cfg, kv_unified).get(last["op"], 0.0) <= 0.0:
        return None, None
    return last["op"], last["seq"]


def final_decode(draw: SeededDraws, model: Model, mem: Memory) -> dict[str, Any]:
    """Every live sequence one token further, in one batch (sequence 0 alone when none is live)."""
    return {"op": "decode", "parts": [[s, [draw.int(0, mem.n_vocab)]] for s in model.live() or [0]]}


def check_program(program: Any, n_seq: int) -> list[dict[str, Any]]:
    """A recorded program, validated (a bundle's, or one given by hand): bad input is a UserError."""
    if not isinstance(program, list) or not program:
        raise UserError("--program: must be a non-empty list of operations")
    for i, op in enumerate(program):
        if not isinstance(op, dict) or op.get("op") not in OPS:
            raise UserError(f"program step {i}: {op!r} is not one of the operations {', '.join(OPS)}")
        ids = [op[k] for k in ("seq", "src", "dst") if k in op] + [p[0] for p in op.get("parts", ())] + \
            list(op.get("seqs", ()))
        if any(not isinstance(x, int) or not -1 <= x < n_seq for x in ids):
            raise UserError(f"program step {i}: a sequence id outside 0..{n_seq - 1}")
    return program


# ---- running a program ---------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=4096)
def row_of(token: int, width: int) -> bytes:
    """The residual-stream row a stage past the first receives for a drawn id: seeded by the id, so the machine and
    its recompute give a context the same rows."""
    return np.random.default_rng([token, width]).standard_normal(width).astype("<f4").tobytes()


@dataclass(frozen=True)
class Feed:
    """What a decode gives the context: token ids (a model, a first stage), or rows (a stage past the first)."""

    width: int = 0  # n_embd_inp of a stage fed rows; 0: token ids
    n_pos: int = 1  # positions per token (4 for M-RoPE archs fed rows)

    def args(self, tokens: list[int]) -> dict[str, Any]:
        if not self.width:
            return {"tokens": tokens}
        rows = b"".join(row_of(int(t), self.width) for t in tokens)
        return {"embd": base64.b64encode(rows).decode(), "n_pos_per_token": self.n_pos}


class Recompute:
    """A sequence's log replayed alone in a fresh context: the logits its last decode gives (cached by log)."""

    def __init__(self, t: Target, fixture: Path, params: dict[str, Any], feed: Feed = Feed(), tol: float = 0.1):
        self.t, self.fixture, self.params, self.feed = t, fixture, params, feed
        self.memo: dict[str, np.ndarray | str] = {}
        self.runs = 0
        self.tol = tol  # the run's tolerance (tolerance())
        self.faithful_shifts = False  # the model's own shift moves it within the tolerance (shift_move)

    def batch_shape_move(self, n_vocab: int) -> float:
        """The model's own batch-shape numerics: one seeded sequence of 12 tokens, decoded as one batch and one token
        at a time, alone in fresh contexts: how far its last logits move (0 on every fixture's f32 weights; a real
        model's quantized matmuls move them more, and so does everything a batch holds)."""
        toks = [int(x) for x in np.random.default_rng(12).integers(0, n_vocab, 12)]
        one = self.logits([["d", [[p, t] for p, t in enumerate(toks)]]])
        each = self.logits([["d", [[p, t]]] for p, t in enumerate(toks)])
        if isinstance(one, str) or isinstance(each, str):
            return 0.0
        return float(np.max(np.abs(one.astype(np.float64) - each.astype(np.float64))))

    def shift_move(self, n_vocab: int) -> float | None:
        """The model's own shift against a recompute: one seeded sequence of 12 tokens shifted whole by +5, then one
        more token, against the 12 decoded at the shifted positions in a fresh context: how far its logits move
        (2-6e-3 on the rotary fixtures; None where the memory cannot shift)."""
        toks = [int(x) for x in np.random.default_rng(13).integers(0, n_vocab, 13)]
        shifted = self.logits([["d", [[p, t] for p, t in enumerate(toks[:12])]], ["add", 0, -1, 5],
                               ["d", [[17, toks[12]]]]])
        direct = self.logits([["d", [[p + 5, t] for p, t in enumerate(toks[:12])]], ["d", [[17, toks[12]]]]])
        if isinstance(shifted, str) or isinstance(direct, str):
            return None
        return float(np.max(np.abs(shifted.astype(np.float64) - direct.astype(np.float64))))

    def logits(self, log: list[list[Any]]) -> np.ndarray | str:
        key = json.dumps(log)
        if key not in self.memo:
            self.runs += 1
            reqs: list[tuple[str, dict[str, Any]]] = [("load", {"path": str(self.fixture), **self.params})]
            for e in log:
                if e[0] == "d":
                    reqs.append(("decode", {**self.feed.args([t for _, t in e[1]]), "pos": [p for p, _ in e[1]],
                                            "seq": 0, "logits": "last"}))
                elif e[0] == "rm":
                    reqs.append(("seq_rm", {"seq": 0, "p0": e[1], "p1": e[2]}))
                elif e[0] == "add":
                    reqs.append(("seq_add", {"seq": 0, "p0": e[1], "p1": e[2], "delta": e[3]}))
                else:
                    reqs.append(("seq_div", {"seq": 0, "p0": e[1], "p1": e[2], "d": e[3]}))
            replies = self.t.pipeline(reqs)
            bad = next((r for r in replies if not r.ok), None)
            if bad is not None or len(replies) < len(reqs):
                why = bad.failure.message if bad is not None and bad.failure else "no reply"
                self.memo[key] = f"the recompute in a fresh context failed: {why}"
            else:
                last = next(r for r in reversed(replies) if r.request.get("op") == "decode")
                self.memo[key] = np.frombuffer(base64.b64decode(last.data["logits"]), "<f4")
        return self.memo[key]


def sliding_window(path: str) -> int:
    """The model's sliding window (0: no sliding-window layer), read from the file once per version of it (a machine
    starts per program, per control run and per candidate while shortening)."""
    st = Path(path).stat()
    return _sliding_window(path, st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=64)
def _sliding_window(path: str, _mtime_ns: int, _size: int) -> int:
    if not any(x.swa for x in inspect_file(path).layers):
        return 0
    return int(GGUFFile(path).get("attention.sliding_window", 0) or 0)


class Machine:
    """One context with several sequences, the model of what each holds, and the checks after every operation."""

    def __init__(self, t: Target, fixture: Path, cfg: MemoryConfig, kv_unified: bool, recompute: Recompute,
                 *, recompute_rollbacks: bool = False):
        self.t, self.fixture, self.cfg, self.kv_unified, self.recompute = t, fixture, cfg, kv_unified, recompute
        self.recompute_rollbacks = recompute_rollbacks  # the rollback control (explain): see apply
        self.rows: dict[int, np.ndarray] = {}  # the last decode's logits, per sequence
        self.scratch = cfg.n_seq  # one more sequence id, never in a program: the settle control decodes there
        self.model = Model(cfg.n_seq)
        self.model.faithful_shifts = recompute.faithful_shifts
        self.mem: Memory | None = None
        self.checks = 0
        self.refused: Counter[str] = Counter()
        self.worst = 0.0
        self.commit: str | None = None

    def params(self) -> dict[str, Any]:
        n = self.cfg.n_seq + 1
        return context_params(n_seq=n, n_ctx=n * 256, kv_unified=self.kv_unified, capture=False,
                              n_rs_seq=self.cfg.n_rs_seq)

    def start(self) -> None:
        r = self.t.load(str(self.fixture), **self.params())
        if r.failure is not None and r.failure.kind in ("crash", "timeout"):  # (a single sequence loads: below)
            raise Crashed(self.problem("crash", f"creating a context for {self.cfg.n_seq} sequences "
                                       f"(kv_unified={self.kv_unified}): {r.failure.kind}: {r.failure.message}",
                                       failure=r.failure.to_dict()))
        if not r.ok:
            raise UserError(f"{self.fixture}: a context for {self.cfg.n_seq} sequences cannot be made: "
                            f"{r.failure.message if r.failure else r.data}")
        d = r.data
        self.commit = d.get("llama_cpp_commit")
        self.mem = Memory(n_vocab=d["n_vocab"], recurrent=bool(d["is_recurrent"] or d["is_hybrid"]),
                          swa=sliding_window(str(self.fixture)),
                          can_shift=bool(d.get("can_shift")), n_rs_seq=int(d.get("n_rs_seq") or 0),
                          kind="hybrid" if d["is_hybrid"] else "recurrent" if d["is_recurrent"] else "kv")

    def problem(self, check: str, message: str, **extra: Any) -> dict[str, Any]:
        return {"check": check, "message": message, **extra}

    def call(self, op: str, **args: Any) -> Any:
        r = self.t.call(op, **args)
        if r.failure is not None and r.failure.kind in ("crash", "timeout"):
            raise Crashed(self.problem("crash", f"{op}: {r.failure.kind}: {r.failure.message}",
                                       failure=r.failure.to_dict()))
        return r

    def apply(self, op: dict[str, Any]) -> dict[str, Any] | None:
        """Run one operation, update the model, check; a problem (the first check that failed) or None."""
        m, kind = self.model, op["op"]
        try:
            if kind == "decode":
                return self._decode(op["parts"])
            if kind == "coupled" and (not self.kv_unified or self.mem.kind == "recurrent"):
                self.refused["skipped"] += 1  # (drawn for one unified cache with cells to share: llama.cpp refuses)
                return None
            if kind == "coupled":
                return self._decode([[op["seqs"], op["tokens"]]])
            if kind == "rm" and self.recompute_rollbacks and self.mem.recurrent and op["seq"] >= 0 \
                    and 0 < op["p0"] <= m.span(op["seq"])[1]:
                return self._recompute_instead(op)
            if kind == "rm":
                r = self.call("seq_rm", seq=op["seq"], p0=op["p0"], p1=op["p1"])
                if not r.ok:
                    return self.problem("refusal", f"seq_rm: {r.failure.message if r.failure else r.data}")
                if r.data["removed"]:
                    m.rm(op["seq"], op["p0"], op["p1"])
                    self._window_lost()
                else:  # refused: nothing may have changed (the checks below and every later decode)
                    self.refused["rm"] += 1
            elif kind == "cp" and not self.kv_unified and (op["p0"] > 0 or op["p1"] >= 0):
                self.refused["skipped"] += 1  # (a program drawn for one cache: across streams llama.cpp asserts)
            elif kind == "cp":
                self.call("seq_rm", seq=op["dst"], p0=-1, p1=-1)
                self.call("seq_cp", src=op["src"], dst=op["dst"], p0=op["p0"], p1=op["p1"])
                m.cp(op["src"], op["dst"], op["p0"], op["p1"], shared=self.kv_unified or self.mem.recurrent)
                self._window_lost()
            elif kind == "keep":
                self.call("seq_keep", seq=op["seq"])
                m.keep(op["seq"])
            elif kind in ("add", "div"):
                args = {"delta": op["delta"]} if kind == "add" else {"d": op["d"]}
                r = self.call(f"seq_{kind}", seq=op["seq"], p0=op["p0"], p1=op["p1"], **args)
                if not r.ok:  # a memory that cannot shift (a replayed program on another build)
                    self.refused[kind] += 1
                else:
                    (m.add if kind == "add" else m.div)(op["seq"], op["p0"], op["p1"], *args.values())
            elif kind == "copy_state":
                blob = self._export(op["src"])
                r = self.call("state_set", seq=op["dst"], data=blob)
                if not r.ok:
                    return self.problem("refusal", f"importing sequence {op['src']}'s state as {op['dst']} "
                                        f"failed: {r.failure.message if r.failure else r.data}")
                m.copy(op["src"], op["dst"])
            elif kind == "refused_import":
                raw = base64.b64decode(self._export(op["src"]))
                r = self.call("state_set", seq=op["dst"], data=base64.b64encode(raw[:len(raw) // 2]).decode())
                if r.ok:
                    return self.problem("refusal", f"sequence {op['src']}'s state cut to {len(raw) // 2} of "
                                        f"{len(raw)} bytes was imported as {op['dst']} without an error")
                self.refused["import"] += 1
                self.call("seq_rm", seq=op["dst"], p0=-1, p1=-1)  # as a runtime does: the failed id is dropped
                m.clear(op["dst"])
            elif kind == "reload":
                blobs = {s: self._export(s) for s in m.live()}
                self.start()
                for s, blob in blobs.items():
                    r = self.call("state_set", seq=op["perm"][s], data=blob)
                    if not r.ok:
                        return self.problem("refusal", f"sequence {s}'s state into a fresh context as "
                                            f"{op['perm'][s]} failed: {r.failure.message if r.failure else r.data}")
                m.permute(op["perm"])
        except Crashed as c:
            return c.problem
        got = self._positions()
        bad = check_positions(m, self.mem, got)
        return self.problem("pos", bad["message"], seq=bad["seq"], got=bad["got"], want=bad["want"]) if bad else None

    def _decode(self, parts: list[list[Any]]) -> dict[str, Any] | None:
        """One llama_decode of the parts ([sequence, tokens]; a list of sequences: coupled, the tokens in each),
        positions continuing each sequence; then the positions and every decoded sequence's logits checked."""
        m = self.model
        parts = [[s, toks] for s, toks in parts if toks and len({m.next_pos(q) for q in ids(s)}) == 1
                 and m.next_pos(ids(s)[0]) + len(toks) <= self.cfg.max_len + 8]
        if not parts:
            return None
        tokens, seqs, pos, out = [], [], [], []
        for s, toks in parts:
            p = m.next_pos(ids(s)[0])
            tokens += toks
            seqs += [s] * len(toks)
            pos += list(range(p, p + len(toks)))
            out += [False] * (len(toks) - 1) + [True]
        r = self.call("decode", **self.recompute.feed.args(tokens), seq=seqs, pos=pos, logits=out)
        if not r.ok:
            return self.problem("refusal", f"a decode of {len(tokens)} tokens for sequences "
                                f"{[s for s, _ in parts]} failed: {r.failure.message if r.failure else r.data}")
        rows = np.frombuffer(base64.b64decode(r.data["logits"]), "<f4").reshape(-1, r.data["n_vocab"])
        self.rows = {q: row for (s, _), row in zip(parts, rows, strict=True) for q in ids(s)}
        for s, toks in parts:
            if isinstance(s, list):
                m.coupled(s, toks, shared=self.kv_unified)
            else:
                m.decode(s, toks)
        got_pos = self._positions()
        bad = check_positions(m, self.mem, got_pos)
        if bad:
            return self.problem("pos", bad["message"], seq=bad["seq"], got=bad["got"], want=bad["want"])
        for q, row in self.rows.items():
            want = self.recompute.logits(m.log[q])
            if isinstance(want, str):
                return self.problem("crash", f"sequence {q}: {want}", seq=q)
            d, ok = compare_logits(row, want, self.recompute.tol)
            self.checks += 1
            self.worst = max(self.worst, d)
            if not ok:
                return self.problem("logits", f"sequence {q}'s logits differ from its history recomputed alone "
                                    f"(max|Δlogit| {d:.3g} > {self.recompute.tol:.3g})", seq=q, max_abs_dlogit=d)
        return None

    def settle(self) -> None:
        """One token decoded on the scratch sequence, then dropped: llama.cpp does the work it defers to the next
        decode (a shift's key rotation, a copy between streams) without touching any sequence of the program."""
        self.call("decode", **self.recompute.feed.args([0]), seq=self.scratch, pos=[0], logits="none")
        self.call("seq_rm", seq=self.scratch, p0=-1, p1=-1)

    def _recompute_instead(self, op: dict[str, Any]) -> dict[str, Any] | None:
        """A rollback done as a runtime without rollback snapshots does it: the sequence dropped and the tokens it
        keeps decoded again (where its log is decodes only; otherwise the rollback itself)."""
        m, s = self.model, op["seq"]
        log = [list(e) for e in m.log[s]]
        m.rm(s, op["p0"], op["p1"])
        if any(e[0] != "d" for e in m.log[s]):
            m.log[s] = log  # (not a truncation of decodes: undo, and roll back as asked)
            m.cells[s] = sorted(p for e in log if e[0] == "d" for p, _ in e[1])
            r = self.call("seq_rm", seq=s, p0=op["p0"], p1=op["p1"])
            if r.ok and r.data["removed"]:
                m.rm(s, op["p0"], op["p1"])
            return None
        self.call("seq_rm", seq=s, p0=-1, p1=-1)
        for e in m.log[s]:
            r = self.call("decode", **self.recompute.feed.args([t for _, t in e[1]]), seq=s,
                          pos=[p for p, _ in e[1]], logits="none")
            if not r.ok:
                return self.problem("refusal", f"re-decoding sequence {s}'s kept tokens failed: "
                                    f"{r.failure.message if r.failure else r.data}")
        return None

    def _positions(self) -> dict[str, list[int]]:
        r = self.call("seq_pos", seqs=list(self.model.cells))
        self.model.reported = r.data["pos"]
        return r.data["pos"]

    def _export(self, s: int) -> str:
        r = self.call("state_get", seq=s)
        if not r.ok:
            raise Crashed(self.problem("refusal", f"exporting sequence {s} failed: "
                                       f"{r.failure.message if r.failure else r.data}"))
        return r.data["data"]

    def _window_lost(self) -> None:
        """After a removal or a partial fork under a sliding window: a sequence whose window below its next position
        is gone from the cache (pos_min above it, as llama-server checks before reusing a slot) cannot go on; it is
        dropped, as a runtime re-processes it."""
        if not self.mem.swa:
            return
        got = self._positions()
        for s in self.model.live():
            lo, hi = self.model.span(s)
            if got[str(s)][0] < 0 or got[str(s)][0] > max(lo, hi + 1 - self.mem.swa):
                self.call("seq_rm", seq=s, p0=-1, p1=-1)
                self.model.clear(s)
                self.refused["window"] += 1


def ids(s: int | list[int]) -> list[int]:
    """A decode part's sequences: one, or a coupled decode's several."""
    return s if isinstance(s, list) else [s]


class Crashed(Exception):
    def __init__(self, problem: dict[str, Any]):
        super().__init__(problem["message"])
        self.problem = problem


def run_program(t: Target, fixture: Path, cfg: MemoryConfig, kv_unified: bool, recompute: Recompute,
                program: list[dict[str, Any]] | None, rng: np.random.Generator | None, *,
                settle: frozenset[int] = frozenset(), recompute_rollbacks: bool = False
                ) -> tuple[list[dict[str, Any]], dict[str, Any] | None, Machine]:
    """A program (given, or drawn from rng as it goes) in a fresh context: the operations run, up to and including
    the first that failed a check, and that problem. The controls (explain): `settle` after these steps, and
    rollbacks recomputed."""
    mach = Machine(t, fixture, cfg, kv_unified, recompute, recompute_rollbacks=recompute_rollbacks)
    try:
        mach.start()
    except Crashed as c:
        return [], {**c.problem, "step": -1, "op": "load"}, mach
    why = precondition_problem(program, mach.mem, cfg, kv_unified) if program is not None else None
    if why:
        raise UserError(f"program: {why}; llama.cpp does not promise what it does then")
    done: list[dict[str, Any]] = []
    n = len(program) if program is not None else cfg.steps
    for i in range(n):
        if program is not None:
            op = program[i]
        elif i == n - 1:
            op = final_decode(SeededDraws(rng), mach.model, mach.mem)
        else:
            op = draw_op(SeededDraws(rng), mach.model, mach.mem, cfg, kv_unified, *burst(rng, done, mach, cfg,
                                                                                       kv_unified))
        done.append(op)
        problem = mach.apply(op)
        if problem:
            return done, {**problem, "step": i, "op": op["op"]}, mach
        if i in settle:
            try:
                mach.settle()
            except Crashed as c:
                return done, {**c.problem, "step": i, "op": "settle"}, mach
    return done, None, mach


def hypothesis_program(t: Target, fixture: Path, cfg: MemoryConfig, kv_unified: bool, recompute: Recompute
                       ) -> tuple[list[dict[str, Any]] | None, dict[str, Any]]:
    """Hypothesis' RuleBasedStateMachine over the same machine: one rule per operation (its precondition: the
    operation is valid now), the same drawer choosing its arguments through Hypothesis, the checks as the
    invariant. At most `cfg.programs` examples of up to `cfg.steps` rules, derandomized (the same programs every
    run); Hypothesis shrinks a failure to its shortest sequence of rules. Returns that program (None: every example
    passed) and what the examples did (a results row)."""
    from hypothesis import HealthCheck, Phase, settings
    from hypothesis import strategies as st
    from hypothesis.stateful import RuleBasedStateMachine, precondition, rule, run_state_machine_as_test

    runs: list[Machine] = []
    programs: list[list[dict[str, Any]]] = []

    class MemoryMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.mach = Machine(t, fixture, cfg, kv_unified, recompute)
            self.mach.start()
            self.done: list[dict[str, Any]] = []
            runs.append(self.mach)
            programs.append(self.done)

        def run(self, data: Any, kind: str) -> None:
            op = draw_op(HypothesisDraws(data), self.mach.model, self.mach.mem, cfg, kv_unified, kind)
            self.done.append(op)
            problem = self.mach.apply(op)
            assert problem is None, problem["message"]

    def make(kind: str) -> Any:
        @precondition(lambda self: op_weights(self.mach.model, self.mach.mem, cfg, kv_unified).get(kind, 0) > 0)
        @rule(data=st.data())
        def op(self: Any, data: Any) -> None:
            self.run(data, kind)
        op.__name__ = kind
        return op

    for kind in OPS:
        setattr(MemoryMachine, kind, make(kind))
    try:
        run_state_machine_as_test(MemoryMachine, settings=settings(
            max_examples=cfg.programs, stateful_step_count=cfg.steps, deadline=None, database=None,
            derandomize=True, suppress_health_check=list(HealthCheck), phases=[Phase.generate, Phase.shrink],
            print_blob=False))
    except (AssertionError, Crashed):
        return programs[-1], {}  # Hypothesis ends by running the shortest failing example once more
    return None, {"kv_unified": kv_unified, "program": None, "examples": len(runs), "status": PASS,
                  "steps": sum(map(len, programs)), "checks": sum(m.checks for m in runs),
                  "max_abs_dlogit": max((m.worst for m in runs), default=0.0),
                  "ops": dict(Counter(op["op"] for p in programs for op in p)),
                  "refused": dict(sum((m.refused for m in runs), Counter()))}


def lineage(program: list[dict[str, Any]], seq: int, n_seq: int) -> set[tuple[int, int]]:
    """The (step, part) decodes whose tokens may be in `seq`'s history at the program's end (pure; forks, state
    copies and reloads carry them from sequence to sequence; an over-approximation where removals are partial)."""
    own: dict[int, set[tuple[int, int]]] = {s: set() for s in range(n_seq)}
    for i, op in enumerate(program):
        k = op["op"]
        if k == "decode":
            for j, (s, _) in enumerate(op["parts"]):
                own[s].add((i, j))
        elif k == "coupled":
            for s in op["seqs"]:
                own[s].add((i, 0))
        elif k in ("cp", "copy_state"):
            own[op["dst"]] = set(own[op["src"]])
        elif k == "reload":
            own = {op["perm"][s]: v for s, v in own.items()}
        elif k == "keep":
            own = {s: (v if s == op["seq"] else set()) for s, v in own.items()}
        elif k == "rm" and op["p0"] <= 0 and op["p1"] < 0:
            for s in (own if op["seq"] < 0 else [op["seq"]]):
                own[s] = set()
    return own[seq]


def other_neighbours(program: list[dict[str, Any]], keep: set[tuple[int, int]], n_vocab: int
                     ) -> list[dict[str, Any]]:
    """The program with every decoded token outside `keep` replaced by another (same lengths, same batches)."""
    out = []
    for i, op in enumerate(program):
        if op["op"] == "decode":
            op = {**op, "parts": [[s, t if (i, j) in keep else [(x + 1 + n_vocab // 2) % n_vocab for x in t]]
                                  for j, (s, t) in enumerate(op["parts"])]}
        elif op["op"] == "coupled" and (i, 0) not in keep:
            op = {**op, "tokens": [(x + 1 + n_vocab // 2) % n_vocab for x in op["tokens"]]}
        out.append(op)
    return out


def without_neighbours(program: list[dict[str, Any]], keep: set[tuple[int, int]]) -> list[dict[str, Any]]:
    """The program with every decode outside `keep` left out (a decode left empty: dropped)."""
    out = []
    for i, op in enumerate(program):
        if op["op"] == "decode":
            parts = [p for j, p in enumerate(op["parts"]) if (i, j) in keep]
            if not parts:
                continue
            op = {**op, "parts": parts}
        elif op["op"] == "coupled" and (i, 0) not in keep:
            continue
        out.append(op)
    return out


def explain(t: Target, fixture: Path, cfg: MemoryConfig, kv_unified: bool, recompute: Recompute,
            program: list[dict[str, Any]], problem: dict[str, Any], mem: Memory,
            rows: dict[int, np.ndarray]) -> dict[str, Any] | None:
    """What the shortest program's failure needs, by controls that each change one thing and must make it pass:
    rollback — every partial seq_rm of a recurrent state done as a recompute instead (the rolled-back state is not
    the state of the tokens kept); deferred — a settle (a decode elsewhere) after one operation (llama.cpp defers that
    operation's data work, a shift's key rotation or a copy between streams, to the next decode, and the operation
    after it saw the cache without it); layout — the other KV layout (the operation means something else with one
    stream per sequence). None when no control explains it."""
    def passes(**control: Any) -> bool:
        """The program with one thing changed runs through, every operation as asked (one the other layout cannot do,
        skipped there — a partial fork, a coupled decode — is not a pass)."""
        layout_ = control.pop("kv_unified", kv_unified)
        prog = control.pop("program", program)
        try:
            _, problem, mach = run_program(t, fixture, cfg, layout_, recompute, prog, None, **control)
        except UserError:  # the control left the preconditions (a coupled decode without its neighbours)
            return False
        return problem is None and not mach.refused.get("skipped")

    if mem.recurrent and any(op["op"] == "rm" for op in program) and passes(recompute_rollbacks=True):
        return {"kind": "rollback", "detail": "the same program passes with each partial seq_rm of the recurrent "
                "state done as a recompute of the tokens kept: the rolled-back state is not theirs"}
    gaps = [i for i, op in enumerate(program[:-1]) if op["op"] != "decode"]
    seq = problem.get("seq")
    own = lineage(program, seq, cfg.n_seq) if seq is not None else set()
    others = any((i, j) not in own for i, op in enumerate(program) if op["op"] in ("decode", "coupled")
                 for j in range(len(op.get("parts", [None]))))
    if problem["check"] == "logits" and others and passes(program=without_neighbours(program, own)):
        # without the other sequences' tokens it passes: do their data reach it, or only where they put it (the
        # batches' shape, its cells' placement)? Other tokens for them, same lengths, must leave it bit for bit
        got = rows.get(seq)  # (the program's own run: its last decode's logits)
        try:
            moved = run_program(t, fixture, cfg, kv_unified, recompute, other_neighbours(program, own, mem.n_vocab),
                                None)[2].rows.get(seq)
        except UserError:  # other tokens for them would leave the preconditions: this control cannot tell
            moved = got = None
        if got is None:
            pass
        elif moved is not None and np.array_equal(got, moved):
            return {"kind": "neighbour-numerics", "numerics": True,
                    "detail": f"without the other sequences' tokens it passes, and other tokens for them leave "
                              f"sequence {seq}'s logits bit for bit: where they put it (the batches' shape, its "
                              f"cells' placement) moves its numerics (max|Δlogit| "
                              f"{problem.get('max_abs_dlogit', 0):.3g}"
                              ": a MoE routing or top-k near-tie makes a rounding a whole-logit move); none of their "
                              "data reaches it"}
        else:
            return {"kind": "neighbours", "detail": "without the other sequences' tokens it passes, and other tokens "
                    f"for them change sequence {seq}'s logits: their data reaches it"}
    if gaps and passes(settle=frozenset(gaps)):
        i = next((i for i in gaps if passes(settle=frozenset([i]))), gaps[0])
        return {"kind": "deferred", "op": program[i]["op"], "step": i, "then": step_class(program[i + 1]["op"]),
                "detail": f"the same program passes with a decode elsewhere right after step {i} "
                          f"({format_step(program[i])}): the work llama.cpp defers to the next decode was not done "
                          f"when step {i + 1} ({format_step(program[i + 1])}) ran"}
    if passes(kv_unified=not kv_unified):
        return {"kind": "layout", "detail": f"the same program passes with {layout(not kv_unified)}: the operation "
                f"behaves otherwise with {'one stream per sequence' if not kv_unified else 'one unified cache'}"}
    return None


def same_problem(a: dict[str, Any] | None, b: dict[str, Any] | None) -> bool:
    return a is not None and b is not None and a["check"] == b["check"] and a["op"] == b["op"]


def minimize(t: Target, fixture: Path, cfg: MemoryConfig, kv_unified: bool, recompute: Recompute,
             program: list[dict[str, Any]], problem: dict[str, Any]) -> list[dict[str, Any]]:
    """The program with whole runs of operations deleted (halves, then quarters, ... single ones), decodes in a row
    joined, then each decode's sequences dropped and their tokens cut to one, while the same check still fails at
    its last operation."""
    runs = 0

    def keeps(cand: list[dict[str, Any]]) -> bool:
        nonlocal runs, program, problem
        if runs >= MINIMIZE_RUNS:
            return False
        runs += 1
        try:
            done, got, _ = run_program(t, fixture, cfg, kv_unified, recompute, cand, None)
        except UserError:  # a shorter program outside the preconditions is no reproduction
            return False
        if same_problem(got, problem) and (len(done) < len(program) or done == cand):
            program, problem = done, got
            return True
        return False

    size = max(1, len(program) // 2)
    while size >= 1 and runs < MINIMIZE_RUNS:
        i, shrunk = 0, False
        while i + size < len(program):  # the failing (last) operation stays
            if keeps(program[:i] + program[i + size:]):
                shrunk = True
            else:
                i += size
        if not shrunk:
            size //= 2
    i = 0
    while i + 1 < len(program):  # two decodes in a row as one batch (a sequence's tokens joined)
        a, b = program[i], program[i + 1]
        if a["op"] == b["op"] == "decode" and i + 1 < len(program) - 1:
            toks: dict[int, list[int]] = {}
            for seq, tokens in a["parts"] + b["parts"]:
                toks.setdefault(seq, []).extend(tokens)
            if keeps(program[:i] + [{"op": "decode", "parts": [[q, x] for q, x in toks.items()]}] + program[i + 2:]):
                continue
        i += 1
    for i in range(len(program)):  # each decode: fewer sequences, then one token each
        j = 0
        while i < len(program) and program[i]["op"] == "decode" and j < len(program[i]["parts"]):
            parts = program[i]["parts"]
            fewer = [{"op": "decode", "parts": parts[:j] + parts[j + 1:]}] if len(parts) > 1 else []
            if fewer and keeps(program[:i] + fewer + program[i + 1:]):
                continue
            if len(parts[j][1]) > 1 and keeps(program[:i] + [{"op": "decode", "parts": [
                    *parts[:j], [parts[j][0], parts[j][1][:1]], *parts[j + 1:]]}] + program[i + 1:]):
                continue
            j += 1
    return program


# ---- the oracle ----------------------------------------------------------------------------------------------
def layout(kv_unified: bool) -> str:
    return "unified-kv" if kv_unified else "per-seq-kv"


def stage_of(stack: contextlib.ExitStack, fixture: Path, stage: str, n_layer: int, t: Target,
             params: dict[str, Any]) -> tuple[Path, Feed, str | None]:
    """The file the machine runs (the model, or the stage A:B sliced from it for the run), what its decodes feed it,
    and why a stage cannot be expressed (None when it can)."""
    if not stage:
        return fixture, Feed(), None
    m = re.fullmatch(r"\s*(\d+)\s*:\s*(\d+)\s*", stage)
    if not m or not 0 <= int(m.group(1)) < int(m.group(2)) <= n_layer:
        raise UserError(f"--stage {stage!r}: write it as A:B with 0 <= A < B <= {n_layer} (layers [A, B))")
    a, b = int(m.group(1)), int(m.group(2))
    fs = FixtureStages(fixture)
    stack.enter_context(fs.workspace(None))
    st = fs.stage(a, b)
    if isinstance(st, Unsupported):
        return fixture, Feed(), f"stage {a}:{b}: {st}"
    path = st[0]
    if a == 0:
        return path, Feed(), None
    r = t.load(str(path), **params)
    if not r.ok:
        raise UserError(f"{fixture}: stage {a}:{b} does not load: {r.failure.message if r.failure else r.data}")
    return path, Feed(width=int(r.data["n_embd_inp"]), n_pos=pos_per_token(r.data)), None


def run(fixture: Path, cfg: MemoryConfig) -> dict[str, Any]:
    check_config(cfg)
    if cfg.n_seq < 2:
        raise UserError("--n-seq must be at least 2 (the operations move cells between sequences)")
    if cfg.engine not in ("seeded", "hypothesis"):
        raise UserError(f"--engine {cfg.engine!r}: seeded or hypothesis")
    program = check_program(cfg.program, cfg.n_seq) if cfg.program is not None else None
    info = inspect_file(str(fixture))
    t0 = time.perf_counter()
    results, findings, numerics = [], [], []
    commit = None
    ref_params = context_params(n_seq=1, capture=False, n_rs_seq=cfg.n_rs_seq)
    source = Path(fixture)
    with contextlib.ExitStack() as stack:
        t = stack.enter_context(open_target(cfg.target, timeout=cfg.timeout))
        tr = stack.enter_context(open_target(cfg.target, timeout=cfg.timeout))
        fixture, feed, why = stage_of(stack, Path(fixture), cfg.stage, info.n_layer, tr, ref_params)
        if why:
            results.append({"status": UNSUPPORTED, "reason": why, "kv_unified": None, "program": None, "steps": 0,
                            "checks": 0, "max_abs_dlogit": 0.0, "ops": {}, "refused": {}})
        tolerance: dict[str, float] = {}
        for kvu in cfg.kv_unified if not why else ():
            recompute = Recompute(tr, fixture, ref_params, feed)
            if not tolerance:  # measured once per run, on the recompute's own fresh contexts
                move = recompute.batch_shape_move(info.n_vocab)
                tolerance = {"batch_shape": move, "tolerance": max(cfg.tol, cfg.noise_factor * move)}
                shift = recompute.shift_move(info.n_vocab)
                if shift is not None:
                    tolerance["shift"] = shift
            recompute.tol = tolerance["tolerance"]
            recompute.faithful_shifts = cfg.noise_factor * tolerance.get("shift", np.inf) <= tolerance["tolerance"]
            given = program
            if program is None and cfg.engine == "hypothesis":
                given, row = hypothesis_program(t, fixture, cfg, kvu, recompute)
                if given is None:
                    results.append(row)
                    continue
            for k in range(1 if given is not None else cfg.programs):
                rng = np.random.default_rng([cfg.seed, k, int(kvu)])
                done, problem, mach = run_program(t, fixture, cfg, kvu, recompute, given, rng)
                commit = mach.commit
                row = {"kv_unified": kvu, "program": k, "steps": len(done), "checks": mach.checks,
                       "max_abs_dlogit": mach.worst, "ops": dict(Counter(op["op"] for op in done)),
                       "refused": dict(mach.refused), "status": PASS}
                if problem:
                    again = run_program(t, fixture, cfg, kvu, recompute, done, None)[1]
                    # a drawn program is shortened here; a given one (a bundle's) runs exactly as given
                    short = minimize(t, fixture, cfg, kvu, recompute, done, problem) if same_problem(
                        again, problem) and program is None else done
                    _, last, ran = run_program(t, fixture, cfg, kvu, recompute, short, None)
                    final = last or problem
                    row["status"] = CRASH if problem["check"] == "crash" else FINDING
                    cause = explain(t, fixture, cfg, kvu, recompute, short, final, mach.mem, ran.rows) \
                        if mach.mem and problem["check"] != "crash" else None
                    if cause and cause.get("numerics"):  # explained as numerics: listed, not a finding
                        row["status"] = NUMERICS
                    (numerics if row["status"] == NUMERICS else findings).append({
                        **final, "kv_unified": kvu, "program": k, "status": row["status"],
                        "memory": mach.mem.name if mach.mem else None, "cause": cause,
                        "reproduced": same_problem(again, problem), "steps": short, "drawn_steps": len(done)})
                results.append(row)
                if problem and problem["op"] == "load":  # no context in this layout: nothing more to run
                    break
    return {"fixture": str(source), "arch": info.arch, "n_layer": info.n_layer, "llama_cpp_commit": commit,
            "target": cfg.target,
            "config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in cfg.__dict__.items()},
            "results": results, "findings": findings, "numerics": numerics, "noise": tolerance if not why else {},
            "timing": {"seconds": round(time.perf_counter() - t0, 3)}}


def finding_of(f: dict[str, Any]) -> Finding:
    """The contract's Finding; its fingerprint adds the operation that failed and the kinds of operation its shortest
    program needs — what tells one memory bug from another (a seq_keep that keeps a stream, a shift lost by an
    export) where the check and the layout alone would not."""
    out = Finding(oracle="memory", status=f["status"], message=f["message"], phase=layout(f["kv_unified"]),
                  where=f["check"], step=len(f["steps"]) - 1, reproduced=f["reproduced"], cause=f.get("cause"),
                  detail={"program": f["steps"], "seq": f.get("seq"), "op": f["op"], "drawn_steps": f["drawn_steps"],
                          **{k: f[k] for k in ("got", "want", "max_abs_dlogit", "failure") if k in f}})
    # (a coupled decode is a decode: the check that failed is the same, one token in several sequences or not)
    out.fingerprint = {**fingerprint(out, ""), "op": "decode" if f["op"] == "coupled" else f["op"],
                       "ops": sorted({op["op"] for op in f["steps"]}), "memory": f.get("memory")}
    if f.get("cause") and f["cause"].get("op"):
        out.fingerprint["cause_op"] = f["cause"]["op"]
    if f.get("cause") and f["cause"].get("then"):
        out.fingerprint["cause_then"] = f["cause"]["then"]
    return out


def report(fixture: Path, cfg: MemoryConfig) -> Report:
    data = run(Path(fixture), cfg)
    return make_report("memory", fixture, data, results=data["results"], extra=("noise",),
                       findings=[finding_of(f) for f in data["findings"]],
                       numerics=[finding_of(f) for f in data["numerics"]])


def format_step(op: dict[str, Any]) -> str:
    """One operation as a reader writes it."""
    k = op["op"]
    if k == "decode":
        return "decode " + " + ".join(f"s{s}×{len(t)}" for s, t in op["parts"])
    if k == "coupled":
        return "decode " + "+".join(f"s{s}" for s in op["seqs"]) + f"×{len(op['tokens'])} (one token in each)"
    if k in ("rm", "add", "div"):
        extra = {"add": f" {op.get('delta', 0):+d}", "div": f" /{op.get('d')}"}.get(k, "")
        return f"seq_{k} s{op['seq']} [{op['p0']}, {op['p1']}){extra}"
    if k == "cp":
        return f"seq_cp s{op['src']}→s{op['dst']} [{op['p0']}, {op['p1']})"
    if k == "keep":
        return f"seq_keep s{op['seq']}"
    if k == "reload":
        return f"reload into a fresh context as {op['perm']}"
    return f"{k} s{op['src']}→s{op['dst']}"


def format_report(rep: dict[str, Any]) -> str:
    cfg = rep["config"]
    lines = [f"memory {rep['fixture']}: arch {rep['arch']}, {cfg['n_seq']} sequences, "
             + (f"the given program of {len(cfg['program'])} operations" if cfg["program"] else
                f"a Hypothesis state machine, up to {cfg['programs']} examples of {cfg['steps']} operations per KV "
                "layout" if cfg.get("engine") == "hypothesis" else
                f"{cfg['programs']} programs × {cfg['steps']} operations per KV layout")
             + (f", stage {cfg['stage']}" if cfg.get("stage") else "") + f", tolerance max({cfg['tol']:g}, "
             f"{cfg.get('noise_factor', 0):g} × the batch-shape move {rep.get('noise', {}).get('batch_shape', 0):.2g})"]
    noise = rep.get("noise") or {}
    if "shift" in noise:
        faithful = cfg.get("noise_factor", 0) * noise["shift"] <= noise.get("tolerance", 0)
        lines.append(f"  a whole-sequence shift moves the model by {noise['shift']:.2g} against its tokens decoded at "
                     "the new positions: " + ("shifted sequences are recomputed there" if faithful else
                                              "not faithful, so shifts are replayed in the recompute (checked for "
                                              "consistency only)"))
    lines += [f"  unsupported: {r['reason']}" for r in rep["results"] if r["status"] == UNSUPPORTED]
    for kvu in cfg["kv_unified"]:
        rows = [r for r in rep["results"] if r["kv_unified"] == kvu]
        if not rows:
            continue
        ops = sum((Counter(r["ops"]) for r in rows), Counter())
        refused = sum((Counter(r["refused"]) for r in rows), Counter())
        bad = [r for r in rows if r["status"] != PASS]
        lines.append(f"  {layout(kvu):<10} {sum(r.get('examples', 1) for r in rows)} programs, "
                     f"{sum(r['steps'] for r in rows)} operations "
                     f"({', '.join(f'{k} {v}' for k, v in sorted(ops.items()))}), "
                     f"{sum(r['checks'] for r in rows)} logits checks, worst max|Δlogit| "
                     f"{max(r['max_abs_dlogit'] for r in rows):.2e}"
                     + (f"; refused: {', '.join(f'{k} {v}' for k, v in sorted(refused.items()))}" if refused else "")
                     + (f" — {len(bad)} failing" if bad else ": pass"))
    for f in rep.get("numerics", ()):
        lines.append(f"  NUMERICS ({layout(f['kv_unified'])}): {f['message']} after {len(f['steps'])} operations: "
                     f"{f['cause']['kind']}: {f['cause']['detail']}")
    for f in rep["findings"]:
        lines.append(f"  FINDING ({layout(f['kv_unified'])}, {f['check']}): {f['message']}; "
                     f"reproduced={f['reproduced']}; {len(f['steps'])} operations (drawn: {f['drawn_steps']}):")
        lines += [f"    {i}. {format_step(op)}" for i, op in enumerate(f["steps"])]
        lines.append(f"    cause: {f['cause']['kind']}: {f['cause']['detail']}" if f.get("cause") else
                     "    cause: none of the controls (rollback recomputed, deferred work settled, the other layout) "
                     "makes it pass")
    return "\n".join(lines)


def replay_of(config: dict[str, Any], f: Finding) -> dict[str, Any]:
    """The config that runs exactly the finding's (shortened) program, in its KV layout."""
    return {**config, "program": f.detail["program"], "kv_unified": [f.phase == "unified-kv"], "programs": 1}


def reduce_config(config: dict[str, Any]) -> list[dict[str, Any]]:
    """The program with one operation fewer (any but the last, which fails)."""
    p = config.get("program") or []
    return [{**config, "program": p[:i] + p[i + 1:]} for i in range(len(p) - 1)]


ORACLE = Oracle(name="memory", config=MemoryConfig, run=report, format=lambda rep: format_report(rep.native),
                replay_of=replay_of, reduce=reduce_config,
                case_fields=("programs", "steps", "n_seq", "max_len", "n_rs_seq", "kv_unified", "tol", "noise_factor",
                             "program", "engine", "stage", "seed"),
                # llama.cpp's memory classes serve every family: a bug is the check, the operation and its cause
                known_key=("status", "where", "op", "cause", "cause_op", "cause_then"))
