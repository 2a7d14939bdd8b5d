"""Running a memory program on a real llama.cpp context: the machine that applies each operation and checks every
sequence against a recompute of its own history in a fresh context (Recompute), a program drawn by seed or by a
Hypothesis state machine."""

from __future__ import annotations

import base64
import functools
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from fuzz.engine.contract import (
    PASS,
)
from fuzz.engine.parity import context_params
from fuzz.oracles.memory_model import (
    OPS,
    HypothesisDraws,
    Memory,
    MemoryConfig,
    Model,
    SeededDraws,
    burst,
    check_positions,
    compare_logits,
    draw_op,
    final_decode,
    op_weights,
    overflows,
    precondition_problem,
    refuses_coupled,
)
from fuzz.oracles.memory_recompute import Recompute
from synth.errors import UserError
from synth.gguf_io import GGUFFile
from synth.inspect import inspect_file
from targets import Reply, Target, as_bytes
from targets.kvstate import other_width

CACHE_PARAMS = ("type_k", "type_v", "swa_full")  # the KV cache's
ROPE_PARAMS = ("rope_scaling", "rope_freq_scale")  # the positions'


def cache_params(cfg: MemoryConfig) -> dict[str, Any]:
    """The load params the config changes from llama.cpp's defaults: its KV cache (types, a full-size window) and
    its RoPE scaling (none where the default is kept)."""
    return {k: getattr(cfg, k) for k in CACHE_PARAMS + ROPE_PARAMS if getattr(cfg, k)}


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
        self.vias: tuple[str, ...] | None = None  # how the target moves state (hello's state_via)
        self.aborts = False  # its decodes take abort_after (hello's)
        self.checks = 0
        self.refused: Counter[str] = Counter()
        self.worst = 0.0
        self.commit: str | None = None
        self.trace_load = False  # the routing control (explain): contexts loaded for tracing ...
        self.trace = False  # ... and the next decode traces every node
        self.traced: tuple[list[dict[str, Any]], list[Any]] | None = None  # that decode's nodes, and its rows' seqs

    def params(self) -> dict[str, Any]:
        n = self.cfg.n_seq + 1
        return context_params(n_seq=n, n_ctx=self.cfg.context or n * 256, kv_unified=self.kv_unified, capture=False,
                              n_rs_seq=self.cfg.n_rs_seq, flash_attn=self.cfg.flash_attn, trace=self.trace_load,
                              **cache_params(self.cfg))

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
        if self.vias is None:  # (the target's: asked once)
            hello = self.t.hello()
            self.vias = tuple(hello.data.get("state_via") or ("memory",)) if hello.ok else ("memory",)
            self.aborts = bool(hello.ok and hello.data.get("abort_after"))
        self.mem = Memory(n_vocab=d["n_vocab"], recurrent=bool(d["is_recurrent"] or d["is_hybrid"]),
                          swa=sliding_window(str(self.fixture)),
                          can_shift=bool(d.get("can_shift")), n_rs_seq=int(d.get("n_rs_seq") or 0),
                          kind="hybrid" if d["is_hybrid"] else "recurrent" if d["is_recurrent"] else "kv",
                          cells=int(d.get("n_ctx_seq") or 0),
                          vias=self.vias, aborts=self.aborts)

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
            if op.get("abort"):
                return self._aborted(op)
            if kind == "decode":
                return self._decode(op["parts"])
            if kind == "coupled" and refuses_coupled(self.mem, self.kv_unified):
                return self._refused_coupled(op)
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
                if op.get("onto") != "live":  # (as a runtime forks: the destination cleared first)
                    self.call("seq_rm", seq=op["dst"], p0=-1, p1=-1)
                self.call("seq_cp", src=op["src"], dst=op["dst"], p0=op["p0"], p1=op["p1"])
                # the source onto itself, as a runtime may ask: every memory takes it as a no-op
                self.call("seq_cp", src=op["src"], dst=op["src"], p0=op["p0"], p1=op["p1"])
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
                via = op.get("via", "memory")
                tokens = m.tokens(op["src"])
                blob = self._export(op["src"], via, tokens)
                r = self._import(op["dst"], blob, via)
                if not r.ok:
                    return self.problem("refusal", f"importing sequence {op['src']}'s state as {op['dst']} "
                                        f"(via {via}) failed: {r.failure.message if r.failure else r.data}")
                if via == "file" and r.data.get("tokens") != tokens:
                    back = len(r.data.get("tokens") or [])
                    return self.problem("tokens", f"sequence {op['src']}'s state file gave back {back} tokens, not "
                                        f"the {len(tokens)} saved with it")
                m.copy(op["src"], op["dst"])
            elif kind == "refused_import":
                raw = self._export(op["src"])
                wider = other_width(raw) if op.get("how") == "width" else None
                spoiled, what = (wider, "claiming rows 2 bytes wider than this model's") if wider is not None \
                    else (raw[:len(raw) // 2], f"cut to {len(raw) // 2} of {len(raw)} bytes")
                r = self._import(op["dst"], spoiled)
                if r.ok:
                    return self.problem("refusal", f"sequence {op['src']}'s state {what} was imported as "
                                        f"{op['dst']} without an error")
                self.refused["import"] += 1
                left = self.call("seq_pos", seqs=[op["dst"]]).data["pos"][str(op["dst"])]
                was = m.span(op["dst"])
                lo, hi = self.mem.expected_min(was)
                if left != [-1, -1] and not (left[1] == was[1] and lo <= left[0] <= hi):
                    # (a refused read leaves the sequence as it was, or empty: llama.cpp clears what a failed read
                    # may have half written, state_clear)
                    return self.problem("pos", f"sequence {op['src']}'s state {what}, refused as {op['dst']}, "
                                        f"left {op['dst']} reporting positions [{left[0]}, {left[1]}]: neither "
                                        f"what it held ([{was[0]}, {was[1]}]) nor empty", seq=op["dst"], got=left,
                                        want=[lo if lo == hi else [lo, hi], was[1]], or_empty=True)
                self.call("seq_rm", seq=op["dst"], p0=-1, p1=-1)  # as a runtime does: the failed id is dropped
                m.clear(op["dst"])
            elif kind == "reload" and op.get("via", "sequences") != "sequences":
                via = op["via"]
                blob = self._export(0, via, [])
                self.start()
                r = self._import(0, blob, via)
                if not r.ok:
                    return self.problem("refusal", f"the whole context's state (via {via}) into a fresh context "
                                        f"failed: {r.failure.message if r.failure else r.data}")
                m.apply(op, shared=self.kv_unified)
            elif kind == "reload":
                blobs = {s: self._export(s) for s in m.live()}
                self.start()
                for s, blob in blobs.items():
                    r = self._import(op["perm"][s], blob)
                    if not r.ok:
                        return self.problem("refusal", f"sequence {s}'s state into a fresh context as "
                                            f"{op['perm'][s]} failed: {r.failure.message if r.failure else r.data}")
                m.permute(op["perm"])
        except Crashed as c:
            return c.problem
        got = self._positions()
        bad = check_positions(m, self.mem, got)
        return self.problem("pos", bad["message"], seq=bad["seq"], got=bad["got"], want=bad["want"]) if bad else None

    def _refused_coupled(self, op: dict[str, Any]) -> dict[str, Any] | None:
        """A coupled decode where llama.cpp's usual split refuses it (refuses_coupled: a sequential split of a batch
        sequence by sequence): refused, nothing may have changed (the checks of every later operation); a memory
        that takes it anyway (DeepSeek-V4's splits coupled sets into ubatches of their own) must then hold the tokens
        in each sequence, as any decode (its own cells in each stream; one state cell shared in a recurrent memory)."""
        m = self.model
        p = m.next_pos(op["seqs"][0])
        if any(m.next_pos(q) != p for q in op["seqs"]):
            self.refused["skipped"] += 1  # (a replayed program whose sequences no longer line up)
            return None
        toks = op["tokens"]
        r = self.call("decode", **self.recompute.feed.args(toks), seq=[list(op["seqs"])] * len(toks),
                      pos=list(range(p, p + len(toks))), logits=[False] * (len(toks) - 1) + [True])
        if r.ok:
            return self._decoded([[list(op["seqs"]), toks]], r, shared=self.kv_unified or self.mem.recurrent)
        self.refused["coupled"] += 1
        return None

    def _aborted(self, op: dict[str, Any]) -> dict[str, Any] | None:
        """A decode the runtime cancels: llama.cpp's abort callback says stop from its op["abort"]-th call (one a graph
        node). llama.h: the ubatches it finished stay in memory, and the positions each sequence reports say what it
        holds — so the model takes each sequence's tokens up to its reported end (none beyond the decode's, none
        below where it began; or none at all where the memory reports it empty, a sequence it could not keep dropped
        whole, which a runtime decodes again), and every later check holds the sequence to that."""
        m = self.model
        if op["op"] == "coupled":
            if refuses_coupled(self.mem, self.kv_unified) or len({m.next_pos(q) for q in op["seqs"]}) > 1:
                self.refused["skipped"] += 1  # (a replayed program whose sequences no longer line up)
                return None
            parts = [[list(op["seqs"]), op["tokens"]]]
        else:
            parts = [[s, toks] for s, toks in op["parts"]
                     if toks and m.next_pos(s) + len(toks) <= self.cfg.max_len + 8]
        if not parts:
            return None
        tokens, seqs, pos, out = batch_of(m, parts)
        r = self.call("decode", **self.recompute.feed.args(tokens), seq=seqs, pos=pos, logits=out,
                      abort_after=op["abort"])
        shared = self.kv_unified or self.mem.recurrent
        if r.ok:  # (the decode ended before the callback's call)
            return self._decoded(parts, r, shared=shared)
        where = f"a decode of {len(tokens)} tokens for sequences {[s for s, _ in parts]} aborted at graph node " \
            f"{op['abort']}"
        if r.failure is None or r.failure.error_kind != "aborted":
            return self.problem("refusal", f"{where} failed otherwise: {r.failure.message if r.failure else r.data}")
        self.refused["aborted"] += 1
        got = self._positions()
        begun = {q: m.next_pos(q) for s, _ in parts for q in ids(s)}
        for s, toks in parts:
            kept = {q: got[str(q)][1] + 1 - begun[q] for q in ids(s)}
            for q, k in kept.items():
                if k < 0 and got[str(q)] == [-1, -1]:
                    m.clear(q)
                    self.refused["dropped"] += 1
                    kept[q] = 0
                elif not 0 <= k <= len(toks):
                    return self.problem("pos", f"after {where}, sequence {q} reports positions {got[str(q)]}: the "
                                        f"decode gave it {begun[q]}..{begun[q] + len(toks) - 1}, and it held up to "
                                        f"{begun[q] - 1} before", seq=q, got=got[str(q)],
                                        want=[begun[q] - 1, begun[q] + len(toks) - 1])
            if isinstance(s, list) and len(set(kept.values())) == 1:
                if kept[s[0]]:
                    m.coupled(s, toks[:kept[s[0]]], shared=shared)
                continue
            for q, k in kept.items():
                if k:
                    m.decode(q, toks[:k])
        bad = check_positions(m, self.mem, got)
        return self.problem("pos", f"after {where}: {bad['message']}", seq=bad["seq"], got=bad["got"],
                            want=bad["want"]) if bad else None

    def _decode(self, parts: list[list[Any]]) -> dict[str, Any] | None:
        """One llama_decode of the parts ([sequence, tokens]; a list of sequences: coupled, the tokens in each),
        positions continuing each sequence; then the positions and every decoded sequence's logits checked."""
        m = self.model
        parts = [[s, toks] for s, toks in parts if toks and len({m.next_pos(q) for q in ids(s)}) == 1]
        over = overflows(m, self.mem, self.kv_unified, parts)
        if not (over and over[0]):  # (a batch refused for room is never computed: its positions do not matter)
            parts = [[s, toks] for s, toks in parts if m.next_pos(ids(s)[0]) + len(toks) <= self.cfg.max_len + 8]
            over = overflows(m, self.mem, self.kv_unified, parts)
        if not parts:
            return None
        tokens, seqs, pos, out = batch_of(m, parts)
        # (the program's mixed decodes read their logits as llama_get_logits gives them, one buffer in the batch's
        # order: sequences of unequal lengths are split out of order by a recurrent memory; the recompute reads each
        # row by llama_get_logits_ith)
        r = self.call("decode", **self.recompute.feed.args(tokens), seq=seqs, pos=pos, logits=out,
                      logits_from="buffer", **({"trace": "all"} if self.trace else {}))
        if r.ok and self.trace:
            self.traced = (r.data["nodes"], seqs)
        where = f"a decode of {len(tokens)} tokens for sequences {[s for s, _ in parts]}"
        if not r.ok and r.failure is not None and r.failure.error_kind == "no_memory_slot" and \
                (over[0] if over else self.cfg.fill):
            # refused for room, as it must be (or where the model cannot count cells, in a program that fills):
            # nothing may have changed (the positions now, every later decode's logits)
            self.refused["no slot"] += 1
            bad = check_positions(m, self.mem, self._positions())
            return self.problem("pos", f"after {where} was refused for room: {bad['message']}", seq=bad["seq"],
                                got=bad["got"], want=bad["want"]) if bad else None
        if not r.ok:
            return self.problem("refusal", f"{where} failed: {r.failure.message if r.failure else r.data}"
                                + (f" ({over[2]} of its KV stream's {self.mem.cells} cells were free)" if over else ""))
        if over and over[0]:
            return self.problem("capacity", f"{where} was decoded, {over[1]} tokens into a KV stream with "
                                f"{over[2]} of its {self.mem.cells} cells free")
        return self._decoded(parts, r, shared=self.kv_unified)

    def _decoded(self, parts: list[list[Any]], r: Reply, *, shared: bool) -> dict[str, Any] | None:
        """A decode of `parts` the memory took (its reply r): the model follows (`shared`: a coupled token's cell is
        one for all its sequences), then the positions and every decoded sequence's logits are checked."""
        m = self.model
        rows = np.frombuffer(as_bytes(r.data["logits"]), "<f4").reshape(-1, r.data["n_vocab"])
        self.rows = {q: row for (s, _), row in zip(parts, rows, strict=True) for q in ids(s)}
        for s, toks in parts:
            if isinstance(s, list):
                m.coupled(s, toks, shared=shared)
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

    def _import(self, s: int, blob: bytes, via: str = "memory") -> Reply:
        return self.call("state_set", seq=s, data=base64.b64encode(blob).decode(),
                         **({"via": via} if via != "memory" else {}))

    def _export(self, s: int, via: str = "memory", tokens: list[int] | None = None) -> bytes:
        r = self.call("state_get", seq=s, **({"via": via, "tokens": tokens or []} if via != "memory" else {}))
        if not r.ok:
            raise Crashed(self.problem("refusal", f"exporting sequence {s} failed: "
                                       f"{r.failure.message if r.failure else r.data}"))
        return as_bytes(r.data["data"])

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


def batch_of(m: Model, parts: list[list[Any]]) -> tuple[list[int], list[Any], list[int], list[bool]]:
    """One batch of the parts ([sequence or coupled sequences, tokens]), positions continuing each sequence, the last
    token of each part an output: its tokens, sequences, positions and outputs."""
    tokens, seqs, pos, out = [], [], [], []
    for s, toks in parts:
        p = m.next_pos(ids(s)[0])
        tokens += toks
        seqs += [s] * len(toks)
        pos += list(range(p, p + len(toks)))
        out += [False] * (len(toks) - 1) + [True]
    return tokens, seqs, pos, out


def ids(s: int | list[int]) -> list[int]:
    """A decode part's sequences: one, or a coupled decode's several."""
    return s if isinstance(s, list) else [s]


def hung(problem: dict[str, Any]) -> bool:
    """A problem (or a memory finding's detail) that is a call timing out: a hang, each try of which waits out the
    timeout."""
    return (problem.get("failure") or {}).get("kind") == "timeout"


class Crashed(Exception):
    def __init__(self, problem: dict[str, Any]):
        super().__init__(problem["message"])
        self.problem = problem


def run_program(t: Target, fixture: Path, cfg: MemoryConfig, kv_unified: bool, recompute: Recompute,
                program: list[dict[str, Any]] | None, rng: np.random.Generator | None, *,
                settle: frozenset[int] = frozenset(), recompute_rollbacks: bool = False, trace: int = -1,
                check: bool = True) -> tuple[list[dict[str, Any]], dict[str, Any] | None, Machine]:
    """A program (given, or drawn from rng as it goes) in a fresh context: the operations run, up to and including
    the first that failed a check, and that problem. The controls (explain): `settle` after these steps, rollbacks
    recomputed, and the decode at step `trace` traced (the machine's `traced`). check: a given program is held to
    the API's preconditions first (precondition_problem walks it as if every operation were accepted); False for a
    program this run drew or already checked, whose refused operations that walk would count as done."""
    mach = Machine(t, fixture, cfg, kv_unified, recompute, recompute_rollbacks=recompute_rollbacks)
    mach.trace_load = trace >= 0
    try:
        mach.start()
    except Crashed as c:
        return [], {**c.problem, "step": -1, "op": "load"}, mach
    why = precondition_problem(program, mach.mem, cfg, kv_unified) if program is not None and check else None
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
        mach.trace = i == trace
        try:
            problem = mach.apply(op)
        except Crashed as c:  # (llama.cpp died in a call after the operation: the checks' own queries)
            problem = c.problem
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

    # (fill: a decode long enough to fill its stream, or to ask for more than is left; aborted: one cancelled, a rule
    # only where the config draws them — any rule more changes which examples Hypothesis draws)
    for kind in (*OPS, "fill", *(("aborted",) if cfg.aborts else ())):
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
