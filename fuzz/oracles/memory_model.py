"""What the memory oracle knows without a target: its config, the model of what every sequence holds (positions,
and the log a fresh context must be given to hold the same), and how programs of memory operations are drawn
(seeded or by Hypothesis) so that each operation is one the memory accepts or must refuse cleanly."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fuzz.engine.contract import TOL_SPREAD
from synth.errors import UserError

OPS = ("decode", "coupled", "rm", "cp", "keep", "add", "div", "copy_state", "refused_import", "reload")
ROPE_SCALINGS = ("none", "linear", "yarn")  # a context's RoPE scalings (targets/PROTOCOL.md `load`: rope_scaling)
EXPORTS = ("copy_state", "refused_import", "reload")  # the operations that read a sequence's state out


def step_class(op: str) -> str:
    """What an operation is to deferred work it ran before: an export (any of them: the state read out), else
    itself (a second shift, a removal, ... that changes the cells the work is pending on)."""
    return "export" if op in EXPORTS else op


@dataclass
class MemoryConfig:
    programs: int = 8  # programs drawn per KV layout
    steps: int = 16  # operations per drawn program (its last: a decode of every live sequence)
    n_seq: int = 3
    max_len: int = 40  # positions a sequence holds at most (cells well inside every layout's context)
    context: int = 0  # the context's cells (0: 256 per sequence, the control's included); small: memory pressure
    fill: bool = False  # long decodes fill a KV stream and ask it for more than it has left (capacity_config)
    type_k: str = ""  # the KV cache's K type in every context ("": llama.cpp's f16; targets/PROTOCOL.md `load`)
    type_v: str = ""  # and its V type (quantized: only with flash attention, as llama.cpp requires)
    swa_full: bool = False  # a full-size sliding-window cache (llama-server's --swa-full): the window's cells kept
    rope_scaling: str = ""  # the context's RoPE scaling ("": the model's; yarn: YaRN's ext factor on; --rope-scaling)
    rope_freq_scale: float = 0.0  # its RoPE frequency scale (0: the model's; llama-server's --rope-freq-scale)
    aborts: bool = False  # decodes cancelled by the runtime drawn too (llama.cpp's abort callback; `aborted` below)
    n_rs_seq: int = 4  # recurrent-state snapshots per sequence (rollback; llama.cpp clamps it on archs without)
    kv_unified: tuple[bool, ...] = (True, False)
    flash_attn: bool = False  # flash attention in the machine's context and the recompute's (llama-server's default)
    tol: float = 0.0  # an absolute least tolerance of max |Δlogit| against the recompute (0: none)
    tol_spread: float = TOL_SPREAD  # the least tolerance, a fraction of the logits' spread (0.1 on the fixtures)
    noise_factor: float = 4.0  # the tolerance is this many times the model's own batch-shape move (0: the least)
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
        self.faithful_shifts = False  # a shift must equal decoding at the new positions (shifts_faithful): add()

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
            # replayed, which would carry a shift bug into the recompute too. Only on a model whose positions are
            # rotary, or whose own shift measured faithful: absolute position embeddings (gpt2) are not
            # (memory.shifts_faithful)
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

    def tokens(self, s: int) -> list[int]:
        """The ids a sequence's decodes gave it, in order (what a runtime saves beside its state in a file)."""
        return [int(t) for e in self.log[s] if e[0] == "d" for _, t in e[1]]

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
        elif k == "reload" and op.get("via", "sequences") == "sequences":
            self.permute(op["perm"])
        elif k == "reload":  # the whole context's state: every sequence, its cells and what they share, as it was
            self.reported = {}


@dataclass(frozen=True)
class Memory:
    """What the loaded context's memory is, as far as the checks need it."""

    n_vocab: int
    recurrent: bool  # holds recurrent state (pure or hybrid): one state cell per sequence, pos_min == pos_max
    swa: int  # the sliding window (0: none): cells below it may be gone
    can_shift: bool
    n_rs_seq: int  # the rollback snapshots the context took

    kind: str = "kv"  # kv | recurrent | hybrid
    cells: int = 0  # the cells of one KV stream (llama_n_ctx_seq; 0: the target did not say)
    vias: tuple[str, ...] = ("memory",)  # how the target moves state (hello's state_via; targets/PROTOCOL.md)
    aborts: bool = False  # the target's decodes take abort_after (hello's abort_after)

    def state_vias(self, whole: bool) -> list[str]:
        """The ways a copy (one sequence) or a reload (`whole`: every sequence) may move state: per sequence in memory
        or through a file; a reload also the whole context at once, in memory or through a session file."""
        if whole:
            return ["sequences", *(v for v in ("context", "context-file") if v in self.vias)]
        return [v for v in ("memory", "file") if v in self.vias] or ["memory"]

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
        if k == "coupled" and refuses_coupled(mem, kv_unified) or op.get("abort"):
            continue  # (refused: nothing changes; aborted: what it keeps only the run knows)
        if k == "coupled" and len({m.history(q) for q in op["seqs"]}) > 1:
            return f"step {i} ({format_step(op)}) couples sequences whose histories differ"
        m.apply(op, shared=kv_unified or mem.recurrent)
    return None


def refuses_coupled(mem: Memory, kv_unified: bool) -> bool:
    """Whether llama.cpp must refuse a coupled decode (one token in several sequences) here: a memory split into a
    stream per sequence, or a recurrent one, splits a batch sequence by sequence (llama_batch_allocr::split_equal,
    sequential), which refuses coupled tokens — the whole decode fails and nothing changes."""
    return not kv_unified or mem.kind == "recurrent"


def op_weights(model: Model, mem: Memory, cfg: MemoryConfig, kv_unified: bool = True) -> dict[str, float]:
    """How often each operation is drawn now (0: not valid in this state or for this memory). A coupled decode (one
    token in several sequences) needs one unified cache and a memory with cells to share; elsewhere llama.cpp must
    refuse it, and it is drawn less often, as a refusal (refuses_coupled)."""
    groups = coupled_groups(model, cfg)
    coupled = 0.0 if not groups else 0.3 if refuses_coupled(mem, kv_unified) or cfg.fill else 1.0
    if not model.live():
        return {"decode": 1.0, "coupled": coupled}
    room = any(model.next_pos(s) + 6 <= cfg.max_len for s in model.cells)
    # positions are shifted where the memory says it can, on a sequence that shares no cells and not under a sliding
    # window: a window would un-mask cells a fresh context never pruned, and a cell shared since a fork moves for both
    # sequences (a recurrent state's one position: draw_op)
    shifts = any(not model.shares[s] for s in model.live()) and mem.can_shift and not mem.swa
    fill = 8.0 if cfg.fill and fillable(model, mem, cfg, kv_unified) else 0.0
    # (an import into a stream with too few cells left is refused: the filling programs move no state, remove less,
    # and fork and couple less — cells shared since a fork or a coupled decode cannot be counted)
    moves = 0.0 if cfg.fill else 1.0
    return {"decode": 5.0 if room else 0.0, "coupled": coupled, "rm": 1.5 if cfg.fill else 2.5,
            "cp": 0.5 if cfg.fill else 1.5, "keep": 0.8, "copy_state": moves, "refused_import": 0.5 * moves,
            "reload": 0.6 * moves, "add": 1.0 if shifts else 0.0, "div": 0.5 if shifts else 0.0, "fill": fill,
            "aborted": 2.0 if cfg.aborts and mem.aborts and (room or groups) else 0.0}


# An aborted decode: the runtime's abort callback (llama.cpp calls it after every graph node it computes) says stop
# from its N-th call on, N drawn up to ABORT_NODES: early (within a pending K shift's graph, or the first layers of the
# first ubatch) or anywhere in the decode (a later ubatch; past its last node the decode simply finishes)
ABORT_EARLY, ABORT_NODES = 12, 160


FILL_BATCH = 64  # the most tokens one filling decode gives (the machine's n_batch: context_params)


def free_cells(model: Model, mem: Memory, kv_unified: bool, s: int) -> int | None:
    """The cells left in sequence s's KV stream (one cache for every sequence, or its own), or None where the model
    cannot count them: a memory without a KV cache whose cells tokens take (recurrent state is one cell a sequence),
    a sliding window (llama.cpp reuses cells the window masks), a target that did not say its size, or cells shared
    since a fork or a coupled decode (the model keeps positions, not which cells hold them)."""
    if not mem.cells or mem.swa or mem.kind == "recurrent":
        return None
    stream = list(model.cells) if kv_unified else [s]
    if any(model.shares[q] for q in stream):
        return None
    return mem.cells - sum(len(model.cells[q]) for q in stream)


def overflows(model: Model, mem: Memory, kv_unified: bool, parts: list[list[Any]]) -> tuple[bool, int, int] | None:
    """Whether a decode of `parts` ([sequence, tokens]) asks some KV stream for more cells than it has left, with
    the tokens asked of the stream with the least room and its free cells; None where free_cells cannot count (or a
    part is coupled). llama.cpp places every ubatch of a batch before it computes any (init_batch), so a batch that
    does not fit fails whole: llama_decode returns 1 and nothing changes."""
    if not parts or any(isinstance(s, list) for s, _ in parts):
        return None
    asked: dict[int, int] = {}
    for s, toks in parts:  # (one cache: every part asks the first part's stream)
        asked[parts[0][0] if kv_unified else s] = asked.get(parts[0][0] if kv_unified else s, 0) + len(toks)
    room = [(free_cells(model, mem, kv_unified, s), n) for s, n in asked.items()]
    if any(free is None for free, _ in room):
        return None
    free, n = min(room, key=lambda fn: fn[0] - fn[1])  # type: ignore[operator]
    return n > free, n, free  # type: ignore[operator]


def window_room(model: Model, mem: Memory, kv_unified: bool, s: int) -> int:
    """On a sliding-window model (its window cache reuses the cells the window masks: none counted), the cells a long
    decode may take in sequence s's stream, short of the full cache by a batch (shared cells counted twice)."""
    return mem.cells - FILL_BATCH - sum(len(model.cells[q]) for q in (list(model.cells) if kv_unified else [s]))


def fillable(model: Model, mem: Memory, cfg: MemoryConfig, kv_unified: bool) -> list[int]:
    """The sequences a filling decode may go to: their stream's free cells countable, and either few enough left
    for one decode to ask for more, or room to fill within the positions a sequence holds (a sliding-window model:
    room short of the full cache, window_room; nothing asked past it)."""
    window = bool(mem.swa and mem.cells and mem.kind != "recurrent")
    free = {s: window_room(model, mem, kv_unified, s) if window else free_cells(model, mem, kv_unified, s)
            for s in model.cells}
    return [s for s, n in free.items()
            if n is not None and ((n < FILL_BATCH and not window) or min(n, cfg.max_len - model.next_pos(s)) >= 1)]


def draw_op(draw: SeededDraws, model: Model, mem: Memory, cfg: MemoryConfig, kv_unified: bool,
            kind: str | None = None, seq: int | None = None) -> dict[str, Any]:
    """One operation a runtime could issue now (of `kind`, or one drawn by op_weights): valid for the model's state
    and within the API's stated preconditions (a fork across the streams of a per-sequence cache copies whole
    sequences only: llama.cpp asserts `seq_cp() is only supported for full KV buffers` otherwise), not necessarily
    accepted."""
    kind = kind or draw.kind(op_weights(model, mem, cfg, kv_unified))
    n = len(model.cells)
    if kind == "aborted":  # a decode (or a coupled one, where llama.cpp takes it) the runtime cancels part way
        can = coupled_groups(model, cfg) and not refuses_coupled(mem, kv_unified)
        room = any(model.next_pos(s) + 6 <= cfg.max_len for s in model.cells)
        op = draw_op(draw, model, mem, cfg, kv_unified, "coupled" if can and (not room or draw.pick((0, 1))) else
                     "decode")
        return {**op, "abort": draw.int(1, draw.pick((ABORT_EARLY, ABORT_NODES)) + 1)}
    if kind == "coupled":  # a shared prefix: the same tokens into two or more sequences at one position
        group = draw.pick(coupled_groups(model, cfg))
        seqs = draw.subset(group)
        seqs = seqs if len(seqs) > 1 else sorted({*seqs, *[q for q in group if q not in seqs][:1]})
        return {"op": "coupled", "seqs": seqs, "tokens": [draw.int(0, mem.n_vocab) for _ in range(draw.int(1, 7))]}
    if kind == "fill":  # a long decode into one sequence: its stream filled, and then asked for more than is left
        can = fillable(model, mem, cfg, kv_unified)
        fullest = min(can, key=lambda q: free_cells(model, mem, kv_unified, q) or 0)
        s = fullest if draw.pick((True, True, False)) else draw.pick(can)  # (mostly the one nearest full)
        free = window_room(model, mem, kv_unified, s) if mem.swa else free_cells(model, mem, kv_unified, s) or 0
        fits = min(free, cfg.max_len - model.next_pos(s), FILL_BATCH)
        if free < FILL_BATCH and not mem.swa and (fits < 1 or draw.pick((True, True, False))):  # more than is left
            n = draw.int(free + 1, min(free + 4, FILL_BATCH) + 1)  # (refused whole)
        elif free < FILL_BATCH and fits == free and not mem.swa:  # to the brim: the stream full, later ones refused
            n = free
        else:
            n = draw.int(max(1, 3 * fits // 4), fits + 1)
        return {"op": "decode", "parts": [[s, [draw.int(0, mem.n_vocab) for _ in range(n)]]]}
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
        op = {"op": "cp", "src": s, "dst": draw.pick(other), "p0": p0, "p1": p1}
        if mem.kind == "recurrent" and model.cells[op["dst"]] and draw.pick((False, True)):
            op["onto"] = "live"  # a recurrent state is replaced by a copy: no runtime needs to clear it first
        return op
    if kind == "keep":
        return {"op": "keep", "seq": s}
    # a recurrent state holds one position, its last token's: llama.cpp moves that one. A shift of part of a sequence
    # that puts it below positions left behind (down, or divided) leaves the memory's parts disagreeing on where the
    # sequence ends, so with a recurrent part the whole sequence moves, or its tail moves up
    if kind == "add":
        p0 = draw.int(lo, hi + 1)
        if mem.recurrent and draw.pick((False, True)):
            p0 = lo
        return {"op": "add", "seq": s, "p0": p0, "p1": -1,
                "delta": draw.int(0 if mem.recurrent and p0 > lo else -min(p0, 8), 9)}
    if kind == "div":
        return {"op": "div", "seq": s, "p0": lo if mem.recurrent else draw.int(lo, hi + 1), "p1": -1,
                "d": draw.int(2, 4)}
    if kind == "reload":  # every sequence under a drawn id, or the whole context at once (ids kept)
        perm, vias = draw.perm(n), mem.state_vias(whole=True)
        via = draw.pick(vias) if len(vias) > 1 else "sequences"
        return {"op": "reload", "perm": perm} if via == "sequences" else \
            {"op": "reload", "perm": list(range(n)), "via": via}
    op = {"op": kind, "src": s, "dst": draw.pick(other)}
    vias = mem.state_vias(whole=False)
    if kind == "copy_state" and len(vias) > 1:
        op["via"] = draw.pick(vias)
    if kind == "refused_import":  # a state cut short, or one of a model of other widths (a KV cache's only)
        op["how"] = draw.pick(("cut", "width"))
    return op


BURST, MOVE = 0.3, 0.15  # how often an operation that leaves work for the next decode is followed by another of
# its kind, and (else, after a removal) by the state moved into a fresh context


def burst(rng: np.random.Generator, done: list[dict[str, Any]], mach: Any, cfg: MemoryConfig, kv_unified: bool
          ) -> tuple[str | None, int | None]:
    """(kind, seq) for the next seeded operation: after a shift or a removal, now and then the same one on the same
    sequence again before any decode (deferred work piles up: two shifts, two rollbacks), or after a removal the
    state reloaded before it (an export must carry a rollback's index); (None, None): drawn as usual."""
    last = done[-1] if done else None
    if last is None or last["op"] not in ("add", "div", "rm") or last.get("seq", -1) < 0:
        return None, None
    r, weights = rng.random(), op_weights(mach.model, mach.mem, cfg, kv_unified)
    if r < BURST:
        return (last["op"], last["seq"]) if weights.get(last["op"], 0.0) > 0.0 else (None, None)
    return ("reload", None) if r < BURST + MOVE and last["op"] == "rm" and weights.get("reload", 0.0) > 0.0 else \
        (None, None)


def final_decode(draw: SeededDraws, model: Model, mem: Memory) -> dict[str, Any]:
    """Every live sequence one token further, in one batch (sequence 0 alone when none is live)."""
    return {"op": "decode", "parts": [[s, [draw.int(0, mem.n_vocab)]] for s in model.live() or [0]]}


def check_program(program: Any, n_seq: int) -> list[dict[str, Any]]:
    """A recorded program, validated (a bundle's, or one given by hand): bad input is a UserError."""
    if not isinstance(program, list):  # (empty: the contexts alone, as a finding made creating one records it)
        raise UserError("--program: must be a list of operations")
    for i, op in enumerate(program):
        if not isinstance(op, dict) or op.get("op") not in OPS:
            raise UserError(f"program step {i}: {op!r} is not one of the operations {', '.join(OPS)}")
        ids = [op[k] for k in ("seq", "src", "dst") if k in op] + [p[0] for p in op.get("parts", ())] + \
            list(op.get("seqs", ()))
        if any(not isinstance(x, int) or not -1 <= x < n_seq for x in ids):
            raise UserError(f"program step {i}: a sequence id outside 0..{n_seq - 1}")
        vias = {"copy_state": ("memory", "file"), "reload": ("sequences", "context", "context-file")}.get(op["op"], ())
        if "via" in op and op["via"] not in vias:
            raise UserError(f"program step {i}: via {op['via']!r}: {op['op']} moves state via "
                            + (", ".join(vias) if vias else "nothing (no via)"))
        if op.get("how", "cut") not in ("cut", "width") or ("how" in op and op["op"] != "refused_import"):
            raise UserError(f"program step {i}: how {op.get('how')!r}: only refused_import spoils a state, by cut or "
                            "width")
        if "abort" in op and (op["op"] not in ("decode", "coupled") or not isinstance(op["abort"], int)
                              or op["abort"] < 1):
            raise UserError(f"program step {i}: abort {op['abort']!r}: only a decode is aborted, after a number of "
                            "graph nodes >= 1")
        if op["op"] == "reload" and op.get("via", "sequences") != "sequences" and op["perm"] != sorted(op["perm"]):
            raise UserError(f"program step {i}: a whole-context reload keeps every id (perm {op['perm']} is not "
                            "the identity)")
    return program


def op_name(op: dict[str, Any]) -> str:
    """An operation's kind as counted and fingerprinted: a state move through another way than the default names it
    (copy_state via file, reload via context), and a decode the runtime aborted says so."""
    via = op.get("via")
    return op["op"] + (f" via {via}" if via and via not in ("memory", "sequences") else "") + \
        (" aborted" if op.get("abort") else "")


def format_step(op: dict[str, Any]) -> str:
    """One operation as a reader writes it."""
    k = op["op"]
    stop = f", aborted at graph node {op['abort']}" if op.get("abort") else ""
    if k == "decode":
        return "decode " + " + ".join(f"s{s}×{len(t)}" for s, t in op["parts"]) + stop
    if k == "coupled":
        return "decode " + "+".join(f"s{s}" for s in op["seqs"]) + f"×{len(op['tokens'])} (one token in each{stop})"
    if k in ("rm", "add", "div"):
        extra = {"add": f" {op.get('delta', 0):+d}", "div": f" /{op.get('d')}"}.get(k, "")
        return f"seq_{k} s{op['seq']} [{op['p0']}, {op['p1']}){extra}"
    if k == "cp":
        return f"seq_cp s{op['src']}→s{op['dst']} [{op['p0']}, {op['p1']})" + \
            (" onto its live state" if op.get("onto") == "live" else "")
    if k == "keep":
        return f"seq_keep s{op['seq']}"
    if k == "reload":
        via = op.get("via", "sequences")
        return f"reload into a fresh context as {op['perm']}" if via == "sequences" else \
            f"reload the whole context into a fresh one (via {via})"
    return f"{k} s{op['src']}→s{op['dst']}" + (f" (via {op['via']})" if op.get("via", "memory") != "memory" else "") \
        + (" (rows claimed wider)" if op.get("how") == "width" else "")
