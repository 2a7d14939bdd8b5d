"""The memory oracle's controls (fuzz memory, explain): what a shortest failing program needs, each control the same
program with one thing changed that must make it pass — rollbacks recomputed, a decode elsewhere after one
operation, the other sequences left out or given other tokens, the other KV layout, llama.cpp's default cache type —
and the numerics controls that excuse a move only under a bound measured on the model and program at hand (a MoE
routing near-tie, flash attention's cell order, a shifted key's second rounding)."""

from __future__ import annotations

import dataclasses
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from fuzz.engine.routing import (
    ROUNDING_FACTOR,
    first_token_flip,
    own_rounding,
    rounding_controls,
    routing_near_tie,
    token_rows,
)
from fuzz.oracles.memory_machine import ROPE_PARAMS, cache_params, ids, run_program
from fuzz.oracles.memory_model import Memory, MemoryConfig, format_step, refuses_coupled, step_class
from fuzz.oracles.memory_recompute import Recompute
from synth.errors import UserError
from synth.inspect import inspect_file
from targets import Target


def cache_name(cfg: MemoryConfig) -> str:
    """The config's KV cache in words: "a q8_0 K / f16 V cache", ", full-size window" where swa_full; its RoPE
    scaling where it sets one ("a yarn RoPE scaling, frequency scale 0.5")."""
    if cfg.rope_scaling or cfg.rope_freq_scale:
        return f"a {cfg.rope_scaling or 'model'} RoPE scaling" + \
            (f", frequency scale {cfg.rope_freq_scale:g}" if cfg.rope_freq_scale else "")
    return f"a {cfg.type_k or 'f16'} K / {cfg.type_v or 'f16'} V cache" + (", full-size window" if cfg.swa_full else "")


def quantized(cache_type: str) -> bool:
    """A KV cache type of blocks with a scale (q8_0, q4_0, ...): not llama.cpp's f16 default, f32 or bf16."""
    return cache_type not in ("", "f32", "f16", "bf16")


def layout(kv_unified: bool) -> str:
    return "unified-kv" if kv_unified else "per-seq-kv"


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
            rows: dict[int, np.ndarray], logs: dict[int, list[list[Any]]] | None = None) -> dict[str, Any] | None:
    """What the shortest program's failure needs, by controls that each change one thing and must make it pass:
    rollback — every partial seq_rm of a recurrent state done as a recompute instead (the rolled-back state is not
    the state of the tokens kept); deferred — a settle (a decode elsewhere) after one operation (llama.cpp defers that
    operation's data work, a shift's key rotation or a copy between streams, to the next decode, and the operation
    after it saw the cache without it); abort — the same decodes not aborted (what an aborted decode leaves is not
    what the positions each sequence then reports say it holds); layout — the other KV layout (the operation means
    something else with one stream per sequence). None when no control explains it."""
    def passes(**control: Any) -> bool:
        """The program with one thing changed runs through, every operation as asked (one the other layout cannot do,
        skipped or refused there — a partial fork, a coupled decode — is not a pass)."""
        layout_ = control.pop("kv_unified", kv_unified)
        prog = control.pop("program", program)
        if refuses_coupled(mem, layout_) != refuses_coupled(mem, kv_unified) and \
                any(op["op"] == "coupled" for op in prog):
            return False  # (a coupled decode taken in one layout, refused in the other: not the same program)
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
    route = routing(t, fixture, cfg, kv_unified, recompute, program, problem) if problem["check"] == "logits" \
        else None
    if route is not None:
        return route
    order = cell_order(t, fixture, cfg, kv_unified, recompute, program, problem, logs.get(seq), rows.get(seq)) \
        if logs is not None and seq is not None else None
    if order is not None:
        return order
    rounding = shift_rounding(t, fixture, cfg, kv_unified, recompute, program, problem, logs.get(seq)) \
        if logs is not None and seq is not None else None
    if rounding is not None:
        return rounding
    if gaps and passes(settle=frozenset(gaps)):
        # the latest operation whose settle is enough: the work still pending when a later step read the cache (an
        # earlier one's settle may pass too, where what it leaves pending moves the logits less)
        i = next((i for i in reversed(gaps) if passes(settle=frozenset([i]))), gaps[0])
        then = step_class(program[i + 1]["op"]) + (" aborted" if program[i + 1].get("abort") else "")
        return {"kind": "deferred", "op": program[i]["op"], "step": i, "then": then,
                "detail": f"the same program passes with a decode elsewhere right after step {i} "
                          f"({format_step(program[i])}): the work llama.cpp defers to the next decode was not done "
                          f"when step {i + 1} ({format_step(program[i + 1])}) ran"}
    aborted = [i for i, op in enumerate(program) if op.get("abort")]
    if aborted and passes(program=[{k: v for k, v in op.items() if k != "abort"} for op in program]):
        i = aborted[-1]
        return {"kind": "abort", "op": program[i]["op"], "step": i, "then": "recurrent" if mem.recurrent else "kv",
                "detail": f"the same program passes with its decodes not aborted: after step {i} "
                          f"({format_step(program[i])}) a sequence does not hold what its reported positions say "
                          f"(llama.h: an aborted decode keeps the ubatches it finished, and the positions tell which)"}
    if passes(kv_unified=not kv_unified):
        return {"kind": "layout", "detail": f"the same program passes with {layout(not kv_unified)}: the operation "
                f"behaves otherwise with {'one stream per sequence' if not kv_unified else 'one unified cache'}"}
    return cache_type(t, fixture, cfg, kv_unified, recompute, program)


def cache_type(t: Target, fixture: Path, cfg: MemoryConfig, kv_unified: bool, recompute: Recompute,
               program: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The cache-type control (a config with KV cache types or a full-size window; crashes too): the same program on
    llama.cpp's default cache (f16, windowed), its recompute alike, must pass; a config with a RoPE scaling (kind
    rope-scaling): the same program with the model's own. None without such a config, or when it fails there too."""
    changed = cache_params(cfg)
    if not changed:
        return None
    rope = any(k in ROPE_PARAMS for k in changed)
    plain = dataclasses.replace(cfg, **{k: MemoryConfig.__dataclass_fields__[k].default for k in changed})
    control = recompute.without(*changed)
    # held to the same promise: a rotary model's shift equals decoding at the new positions there too (a quantized
    # cache's shift, replayed where it ran, is an f16 one's no longer), else its shift replayed would carry the bug
    control.faithful_shifts = recompute.faithful_shifts or (control.rope_type is not None and control.rope_type >= 0)
    try:
        _, again, mach = run_program(t, fixture, plain, kv_unified, control, program, None)
    except UserError:
        return None
    if again is not None or any(mach.refused.get(k) for k in ("skipped", "add", "div")):
        return None  # (a shift refused there, as a window's cache refuses it unless full-size, is no pass)
    if rope:
        return {"kind": "rope-scaling", "detail": f"the same program passes with the model's own RoPE scaling: it "
                f"fails with {cache_name(cfg)} only"}
    return {"kind": "cache-type", "detail": f"the same program passes with llama.cpp's default f16 KV cache: it "
            f"fails with {cache_name(cfg)} only"}


def routing(t: Target, fixture: Path, cfg: MemoryConfig, kv_unified: bool, recompute: Recompute,
            program: list[dict[str, Any]], problem: dict[str, Any]) -> dict[str, Any] | None:
    """The routing control, for a MoE model: the failing decode traced in the machine and in the recompute of the
    sequence alone. A token whose chosen experts differ where the router's scores moved by rounding only, across a
    gap at most twice that (routing_near_tie), and by no more than ROUNDING_FACTOR × what the model's own rounding
    moves them on this history (measured alone: with an f32 cache, and with flash attention the other way), is
    numerics: where the sequence's cells sit changes the order flash attention sums them in, and a near-tie turns that
    rounding into another expert — a whole-logit move (the near-tie rule is the isolation oracle's). None when no
    expert choice differs, the scores moved more, a replay failed, or the layout is one stream per sequence."""
    seq, step = problem.get("seq"), problem.get("step", -1)
    if seq is None or step < 0 or not kv_unified:  # (one stream per sequence splits a batch by sequence: its rows'
        return None                                # order is not the batch's, so they cannot be paired here)
    if not any(x.ffn == "moe" for x in inspect_file(str(fixture)).layers):
        return None  # (no router: no traced re-run)
    try:
        _, again, mach = run_program(t, fixture, cfg, kv_unified, recompute, program[:step + 1], None, trace=step)
    except UserError:
        return None
    if again is None or mach.traced is None:
        return None
    alone = recompute.traced(mach.model.log[seq])
    if alone is None:
        return None
    nodes, seqs = mach.traced
    mine = [i for i, s in enumerate(seqs) if seq in ids(s)]
    # (a node of the last layer holds output rows only: left out by its row count)
    alone_rows = token_rows([alone], [len(mine)])
    flip = first_token_flip(alone_rows, token_rows([nodes], [len(mine)], lambda _i, n: mine if n == len(seqs) else []))
    if flip is None:
        return None
    # no more than the model's own rounding moves those scores: the same history alone with one rounding changed
    # (rounding_controls), each traced; a move past ROUNDING_FACTOR × the larger is not rounding
    traces = [recompute.with_params(**x).traced(mach.model.log[seq]) for x in rounding_controls(recompute.params)]
    rounding = own_rounding(flip, alone_rows, [token_rows([x], [len(mine)]) if x is not None else None
                                               for x in traces])
    if rounding is None or not routing_near_tie(flip, rounding):
        return None
    layer = flip["node"].rsplit("-", 1)[-1]
    return {"kind": "routing-numerics", "numerics": True, "flip": {**flip, "rounding": rounding},
            "detail": f"a MoE routing near-tie: at token {flip['token']} of the failing decode, layer {layer} chooses "
                      f"experts {flip['b']} here and {flip['a']} alone; the router's scores ({flip['scores']}) moved "
                      f"by {flip['scores_max_abs']:.2g} across a gap of {flip['margin']:.2g}, within "
                      f"{ROUNDING_FACTOR:g} × what the model's own rounding moves them ({rounding:.2g}: an f32 "
                      f"cache, flash attention the other way) — rounding (where the cells sit orders flash "
                      f"attention's sums) chose another expert, which moves the logits whole"}


# a few f16 roundings, relative to a layer's largest output: CPU flash attention accumulates V in f16, in cell order
ORDER_ROUNDING = 4 * 2.0 ** -10


def cell_order(t: Target, fixture: Path, cfg: MemoryConfig, kv_unified: bool, recompute: Recompute,
               program: list[dict[str, Any]], problem: dict[str, Any], log: list[list[Any]] | None,
               got: np.ndarray | None) -> dict[str, Any] | None:
    """The cell-order control, with flash attention: it sums a sequence's cells in cell order, and the recompute
    refills the cells its own removals freed, so later positions can sit below earlier ones where the machine (other
    sequences holding those cells) keeps them in position order. Numerics when all three hold: the program passes
    without flash attention; the recompute with the freed cells held by a filler sequence (the sequence's cells in
    position order) agrees with the machine; and where that recompute and the plain one first part, the layer's
    outputs moved by at most a few f16 roundings (ORDER_ROUNDING) — a kernel that mis-summed or mis-masked
    out-of-order cells would move them whole. None otherwise."""
    if not cfg.flash_attn or problem["check"] != "logits" or log is None or got is None \
            or not any(e[0] == "rm" for e in log):
        return None
    no_fa = recompute.with_params(flash_attn=False)
    try:
        if run_program(t, fixture, replace(cfg, flash_attn=False), kv_unified, no_fa, program, None)[1]:
            return None
    except UserError:
        return None
    n_layer = inspect_file(str(recompute.fixture)).n_layer
    plain, held = recompute.layers(log, n_layer), recompute.layers(log, n_layer, hold=True)
    if plain is None or held is None or float(np.max(np.abs(held[0].astype(np.float64) - got))) > recompute.tol:
        return None
    first = next((k for k in sorted(plain[1]) if not np.array_equal(plain[1][k], held[1][k])), None)
    if first is None:
        return None
    a, b = plain[1][first].astype(np.float64), held[1][first].astype(np.float64)
    moved = float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(a))), 1e-30))
    if moved > ORDER_ROUNDING:
        return None
    return {"kind": "cell-order-numerics", "numerics": True, "layer": first, "moved": moved,
            "detail": f"flash attention sums the sequence's cells in cell order: the recompute refilled cells its "
                      f"removal freed (later positions below earlier ones); with them held by a filler sequence it "
                      f"agrees with this context, the layer where the two recomputes first part (layer {first}) moved "
                      f"by {moved:.2g} of its largest output (f16 rounding), and without flash attention the program "
                      f"passes"}


def shift_rounding(t: Target, fixture: Path, cfg: MemoryConfig, kv_unified: bool, recompute: Recompute,
                   program: list[dict[str, Any]], problem: dict[str, Any], log: list[list[Any]] | None) \
        -> dict[str, Any] | None:
    """The shift-rounding control, for a program that shifts a whole sequence on an f16 (llama.cpp's default) or bf16
    K cache: the shift rotates keys already rounded to that type and rounds them again, where the recompute (the same
    tokens decoded at their new positions) rounds them once. Numerics when both hold: the same program on an f32 K
    cache passes, its recompute alike (a rotation by the wrong amount, of the wrong cells or dimensions moves it there
    too); and the move is at most `noise_factor` times what one rounding of the keys moves the failing sequence's own
    history (its recompute on the cache's K type against f32). None otherwise (a history that replays its shift
    rounds twice in the recompute too)."""
    if problem["check"] != "logits" or log is None or cfg.type_k not in ("", "f16", "bf16") or \
            not any(op["op"] in ("add", "div") for op in program) or any(e[0] in ("add", "div") for e in log):
        return None
    exact = recompute.with_params(type_k="f32")
    try:
        _, again, mach = run_program(t, fixture, replace(cfg, type_k="f32"), kv_unified, exact, program, None)
    except UserError:
        return None
    if again is not None or mach.refused.get("skipped"):
        return None
    ours, theirs = recompute.logits(log), exact.logits(log)
    if isinstance(ours, str) or isinstance(theirs, str):
        return None
    once = float(np.max(np.abs(ours.astype(np.float64) - theirs.astype(np.float64))))
    moved = float(problem.get("max_abs_dlogit", np.inf))
    if moved > cfg.noise_factor * once:
        return None
    kind = cfg.type_k or "f16"
    return {"kind": "shift-rounding", "numerics": True, "once": once,
            "detail": f"a shift rounds the rotated keys to {kind} a second time: the same program passes on an f32 K "
                      f"cache, and the move ({moved:.3g}) is within {cfg.noise_factor:g}× what one rounding of the "
                      f"keys moves this sequence's history ({once:.3g}: its recompute on {kind} keys against f32)"}
