"""`fuzz isolation`: a sequence must not notice the other sequences in its batch.

Each of N prompts runs alone (greedy), then all N run together — one batch for every prompt, then one token per
sequence per step, teacher-forced with the tokens each chose alone — with the KV cache unified and per sequence, and
flash attention off and on (llama-server's default is on). Every sequence's logits must stay within a tolerance of
its solo run at every step. Batch composition moves low bits (upstream does not promise bit-exactness across batch
shapes: the determinism lane's policy), and how much depends on the model: at most 9e-3 over all 70 families'
fixtures on the pinned llama.cpp, up to ~2 on a real quantized model. So the tolerance is measured, per model and
layout: each sequence runs alone a second time in other batches (its prompt in three chunks, its decode tokens two at
a time, cells 0.. as before) — no other sequence, so whatever moves is the batch shape's numerics — and the tolerance
is `noise_factor` times the largest move, never below `tol_spread` times the logits' own spread (0.03: 0.1 on the
fixtures, far below what a leak or a different attention choice does, 1.3–7 in the cases found). A context that
cannot be created or run for N sequences is a finding too (a crash). A finding is run again before it is reported
(reproduced or not), and given a cause: with a unified cache the sequence runs alone once more but in the cells
batching gave it, which tells "where it sits in the cache changes it" (cell position) from "the batch changes it";
the batch runs once more with other neighbours (other tokens, same lengths), which tells "its shape changes the
numerics" (batch shape: the same bits again) from "its neighbours' data reaches it" (batch: a leak). Where neither
the cells nor the batch alone explain it (both moved more than the tolerance, as on real weights), the neighbour run
decides too: the same bits with other neighbours is both numerics at once (cells and batch shape), other bits is a
leak.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fuzz.engine.case_oracle import CaseOracle
from fuzz.engine.contract import (
    CRASH,
    FAILING,
    FINDING,
    NUMERICS,
    PASS,
    TOL_SPREAD,
    Finding,
    Oracle,
    Report,
    logits_spread,
    select,
)
from fuzz.engine.fleet import Fleet, fixture_header
from fuzz.engine.parity import context_params, first_rounding_flip, script_steps, token_slice
from fuzz.engine.routing import (
    ROUNDING_FACTOR,
    TOP_K_NODES,
    first_token_flip,
    first_top_k_flip,
    own_rounding,
    rounding_controls,
    routing_near_tie,
    token_rows,
    top_k_near_tie,
)
from fuzz.engine.schedule import prompt_tokens, sequential_steps
from synth.errors import UserError
from synth.inspect import inspect_file
from targets import Target
from targets.target import script_request

NOISE_FACTOR = 4.0  # a batch-shape difference is numerics up to this × the batch-shape control (or a near-tie named)
# a batch-shape move this large, as a fraction of the logits' spread, is never rounding: numerics only with its
# near-tie named (1.0 logit on the fixtures)
WHOLE_SPREAD = 0.3


@dataclass
class IsolationConfig:
    n_seq: int = 4
    prompt_len: int = 12  # sequence i's prompt has prompt_len + 3 i tokens (different lengths and positions)
    tokens: int = 6
    kv_unified: tuple[bool, ...] = (True, False)
    # off, and on as llama-server runs it by default (CPU flash attention sums V in f16 over the cells in order: a
    # unified cache's placement moves it more than the per-stream one, ~1e-2 vs 1e-3 on the tier-1 rows)
    flash_attn: tuple[bool, ...] = (False, True)
    tol: float = 0.0  # an absolute least tolerance (0: none); the measured one is noise_factor × the batch-shape move
    tol_spread: float = TOL_SPREAD  # the least tolerance as a fraction of the logits' spread (logits_spread)
    noise_factor: float = 4.0  # 0: the least tolerance only
    seed: int = 0
    target: str = "llama-cpp"
    timeout: float = 120.0


class Isolation(CaseOracle[tuple[bool, bool]]):
    name, unit, sections = "isolation", "layouts", ("noise",)

    def __init__(self, fixture: Path, cfg: IsolationConfig):
        super().__init__(fixture, cfg)
        self.info = inspect_file(str(self.fixture))
        if cfg.n_seq < 2 or cfg.prompt_len < 1 or cfg.tokens < 1:
            raise UserError("--n-seq must be at least 2, --prompt-len and --tokens at least 1")
        self.tol = cfg.tol
        self.whole = math.inf  # the layout's whole-logit move (WHOLE_SPREAD × the logits' spread)
        self.fa = False  # the layout being run: flash attention on or off
        self.noise_measured = 0.0  # the layout's batch-shape control (_noise): what bounds a batch-shape excuse
        self.noise: dict[str, dict[str, float]] = {}
        self.prompts = [prompt_tokens(cfg.seed + 7 + i, cfg.prompt_len + 3 * i, self.info.n_vocab)
                        for i in range(cfg.n_seq)]

    def open(self, fleet: Fleet) -> None:
        self.t = fleet.one()

    def cases(self) -> list[tuple[bool, bool]]:
        return list(itertools.product(self.cfg.flash_attn, self.cfg.kv_unified))

    def identity(self, case: tuple[bool, bool]) -> dict[str, Any]:
        fa, kvu = case
        return {"kv_unified": kvu, "flash_attn": fa, "phase": kv_layout(kvu, fa)}

    def observe(self, case: tuple[bool, bool]) -> dict[str, Any]:
        """Every sequence alone, the batch-shape control (the layout's tolerance), every sequence together; or why
        a context for n_seq sequences cannot be made."""
        self.fa, kvu = case
        why = self._load(self.t, kvu)
        if why:  # the model runs with one sequence (checked in _load) but not with n_seq
            return {"refused": why}
        alone = [self._alone(self.t, i) for i in range(self.cfg.n_seq)]
        measured = self.noise_measured = self._noise(self.t, alone)
        spread = logits_spread([row for _, rows in alone for row in rows])
        self.whole = WHOLE_SPREAD * spread
        self.tol = max(self.cfg.tol, self.cfg.tol_spread * spread, self.cfg.noise_factor * measured)
        self.noise[kv_layout(kvu, self.fa)] = {"batch_shape": measured, "spread": spread, "tolerance": self.tol}
        return {"alone": alone, "tol": self.tol, "together": self._together(self.t, alone)}

    def judge(self, case: tuple[bool, bool], seen: dict[str, Any]) -> list[dict[str, Any]]:
        """Each sequence batched against alone, within the layout's tolerance at every step."""
        at = self.identity(case)
        if "refused" in seen:
            return [{**at, "seq": None, "status": CRASH, "step": None, "max_abs_dlogit": None,
                     "reason": seen["refused"]}]
        alone, together, rows = seen["alone"], seen["together"], []
        for i in range(len(self.prompts)):
            if isinstance(together, str):
                rows.append({**at, "seq": i, "status": CRASH, "step": 0, "max_abs_dlogit": None, "reason": together})
                continue
            d = [float(np.max(np.abs(a.astype(np.float64) - b))) for a, b in zip(alone[i][1], together[i], strict=True)]
            step = next((k for k, x in enumerate(d) if x > seen["tol"]), None)
            rows.append({**at, "seq": i, "status": FINDING if step is not None else PASS, "step": step,
                         "max_abs_dlogit": max(d), "tokens_alone": alone[i][0],
                         "argmax_together": [int(np.argmax(x)) for x in together[i]]})
        return rows

    def explain(self, case: tuple[bool, bool], seen: dict[str, Any], row: dict[str, Any]) -> dict[str, Any]:
        """Cell position, batch shape or a leak (_cause); numerics when the cause shows it (is_numerics)."""
        cause = self._cause(self.t, row["seq"], row["step"], seen["alone"], seen["together"], case[1],
                            row["max_abs_dlogit"])
        return {"cause": cause, "status": NUMERICS if is_numerics(cause) else FINDING}

    def message(self, f: dict[str, Any]) -> str:
        if f["seq"] is None:
            return f"{layout_of(f)}: {f['reason']}"
        if f["max_abs_dlogit"] is None:  # (the batched run crashed: nothing to compare)
            return f"{layout_of(f)}: sequence {f['seq']} batched with the others: {f['reason']}"
        return (f"{layout_of(f)}: sequence {f['seq']} changes when batched (step {f['step']}, max "
                f"|Δlogit| {f['max_abs_dlogit']:.3g})" + (f"; cause: {f['cause']['kind']}" if f.get("cause") else ""))

    def record(self, results: list[dict[str, Any]]) -> dict[str, Any]:
        findings = [r for r in results if r["status"] in FAILING]
        return {**fixture_header(self.fixture, self.info, target=self.cfg.target, commit=self.commit),
                "config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.cfg.__dict__.items()},
                "noise": self.noise, "findings": findings,
                "numerics": [r for r in results if r["status"] == NUMERICS],
                "status": FINDING if findings else PASS}

    def _params(self, kv_unified: bool) -> dict[str, Any]:
        n = max(64, sum(len(p) for p in self.prompts))
        return context_params(n_seq=self.cfg.n_seq, n_ctx=512, n_batch=n, kv_unified=kv_unified, flash_attn=self.fa)

    def _load(self, t: Target, kv_unified: bool) -> str | None:
        """None, or why a context for n_seq sequences cannot be made (after checking one sequence can: a model
        that does not load at all is bad input — but one that loads only with flash attention off, which the toolkit
        turned on, fails here, a finding)."""
        r = t.load(str(self.fixture), **self._params(kv_unified))
        if r.ok:
            self.commit = r.data.get("llama_cpp_commit")
            return None
        one = {**self._params(False), "n_seq_max": 1}
        single = t.load(str(self.fixture), **one)
        if single.ok:
            return f"{r.failure.kind} creating a context for {self.cfg.n_seq} sequences " \
                   f"(n_ctx 512, kv_unified={kv_unified}, flash_attn={self.fa}): {r.failure.message}"
        if self.fa and t.load(str(self.fixture), **{**one, "flash_attn": False}).ok:
            return f"{r.failure.kind} creating a context with flash attention on, for any number of sequences " \
                   f"(it loads with it off; kv_unified={kv_unified}): {r.failure.message}"
        raise UserError(f"{self.fixture}: the target cannot load it at all: {single.failure.message}")

    def _alone(self, t: Target, i: int) -> tuple[list[int], list[np.ndarray]]:
        """Sequence i by itself (as sequence i): its greedy tokens and last-row logits per step."""
        p = self.prompts[i]
        steps = [{"tokens": p, "seq": i, "pos": list(range(len(p))), "logits": "last"}]
        steps += [{"tokens": [f"argmax@{len(p) - 1 if k == 0 else 0}"], "seq": i, "pos": [len(p) + k],
                   "logits": "last"} for k in range(self.cfg.tokens)]
        r = t.script(steps, reset=True)
        if not r.ok:
            raise UserError(f"{self.fixture}: a single sequence fails in the target: {r.failure.message}")
        res = r.data["results"]
        return [int(x["argmax"][-1]) for x in res], [x["logits"][-1] for x in res]

    def _noise(self, t: Target, alone) -> float:
        """The batch-shape control: every sequence alone again, in cells 0.. as alone, but its prompt in three
        chunks and its decode tokens fed two at a time (teacher-forced with the tokens it chose): the largest move
        of any logits row from the solo run. No other sequence is there, so it is the model's own numerics."""
        worst = 0.0
        for i, p in enumerate(self.prompts):
            toks, rows = alone[i]
            size = max(1, -(-len(p) // 3))
            prefill = script_steps(sequential_steps(p, size, 0, seq=i), logits_mode="last")
            fed = toks[:self.cfg.tokens]
            pairs = [{"tokens": fed[k:k + 2], "seq": i, "pos": [len(p) + j for j in range(k, min(k + 2, len(fed)))],
                      "logits": "all"} for k in range(0, len(fed), 2)]
            r = t.script(prefill + pairs, reset=True)
            if not r.ok:
                raise UserError(f"{self.fixture}: a single sequence fails in the target: {r.failure.message}")
            res = r.data["results"]
            got = [res[len(prefill) - 1]["logits"][-1]] + [row for x in res[len(prefill):] for row in x["logits"]]
            worst = max(worst, *(float(np.max(np.abs(a.astype(np.float64) - b)))
                                 for a, b in zip(rows, got, strict=True)))
        return worst

    def _together(self, t: Target, alone, keep: int | None = None) -> list[list[np.ndarray]] | str:
        """Every sequence in the same batches, fed the tokens it chose alone; per sequence, logits per step.
        keep: only that sequence keeps its tokens; the others get other tokens of the same lengths (the same
        batches, other neighbours)."""
        toks, seqs, pos, out = [], [], [], []
        n_vocab = self.info.n_vocab
        for i, p in enumerate(self.prompts):
            if keep is not None and i != keep:
                p = prompt_tokens(self.cfg.seed + 1000 + i, len(p), n_vocab)
            toks += p
            seqs += [i] * len(p)
            pos += list(range(len(p)))
            out.append(len(toks) - 1)
        # (the batched run reads its logits as llama_get_logits gives them, one buffer of every output row in the
        # batch's order, where the solo runs read each row by llama_get_logits_ith: a runtime may read either, and
        # llama.cpp puts outputs its ubatches computed out of order back in order only in the buffer)
        steps = [{"tokens": toks, "seq": seqs, "pos": pos, "logits": [j in out for j in range(len(toks))],
                  "logits_from": "buffer"}]
        n = len(self.prompts)
        for k in range(self.cfg.tokens):
            steps.append({"tokens": [alone[i][0][k] if keep is None or i == keep else (alone[i][0][k] + 1) % n_vocab
                                     for i in range(n)], "seq": list(range(n)),
                          "pos": [len(self.prompts[i]) + k for i in range(n)], "logits": "all",
                          "logits_from": "buffer"})
        r = t.script(steps, reset=True)
        if not r.ok:
            return f"{r.failure.kind}: {r.failure.message}"
        return [[res["logits"][i] for res in r.data["results"]] for i in range(n)]

    def _cells(self, i: int) -> tuple[list[int], list[int]]:
        """Where sequence i's tokens sit in a unified cache when batched: how many cells other sequences take
        before and after it, in the prompt batch and in each decode step (every batch fills cells in order)."""
        lens = [len(p) for p in self.prompts]
        n = len(lens)
        return [sum(lens[:i]), sum(lens[i + 1:])], [i, n - 1 - i]

    def _placed_steps(self, i: int, alone) -> tuple[list[dict[str, Any]], list[int]]:
        """Sequence i alone in every batch, teacher-forced, in the cells batching gives it (a filler sequence takes
        the others' cells in batches of its own); and which steps are sequence i's."""
        (pre, post), (pre_k, post_k) = self._cells(i)
        filler = 0 if i else 1
        fill = iter(prompt_tokens(self.cfg.seed + 99, pre + post + self.cfg.tokens * (pre_k + post_k) + 1,
                                  self.info.n_vocab))
        pos = [0]
        steps, mine = [], []

        def filled(count: int) -> None:
            if count:
                steps.append({"tokens": [next(fill) for _ in range(count)], "seq": filler,
                              "pos": list(range(pos[0], pos[0] + count)), "logits": "none"})
                pos[0] += count

        p = self.prompts[i]
        filled(pre)
        mine.append(len(steps))
        steps.append({"tokens": p, "seq": i, "pos": list(range(len(p))), "logits": "last"})
        filled(post)
        for k in range(self.cfg.tokens):
            filled(pre_k)
            mine.append(len(steps))
            steps.append({"tokens": [alone[i][0][k]], "seq": i, "pos": [len(p) + k], "logits": "last"})
            filled(post_k)
        return steps, mine

    def _cause(self, t: Target, i: int, step: int, alone, together, unified: bool,
               moved: float) -> dict[str, Any]:
        """Tell "depends on where it sits" from "depends on its batch" (a unified cache: sequence i alone in every
        batch again, but in the cells it has when batched — equal to the batched logits, the cell position decides,
        and a near-tie choice that differs from the solo run is named: a MoE route, a 16-bit rounding); then, for
        the batch, its shape from its neighbours' data (the batch again with other tokens for the others: the same
        bits, the shape) — a shape's move (`moved`: the finding's max |Δlogit|) within its bound or with its near-tie
        named."""
        out: dict[str, Any] = {}
        tol = self.tol
        both = False
        if unified:
            steps, mine = self._placed_steps(i, alone)
            r = t.script(steps, reset=True)
            if not r.ok:
                return {"kind": "unknown", "detail": f"the placed run failed: {r.failure.message}"}
            placed = [r.data["results"][j]["logits"][-1] for j in mine]

            def dist(other) -> float:
                return max(float(np.max(np.abs(a.astype(np.float64) - b)))
                           for a, b in zip(placed, other, strict=True))

            vs_batched, vs_alone = dist(together[i]), dist(alone[i][1])
            pre = self._cells(i)[0][0]
            out = {"placed_vs_batched": vs_batched, "placed_vs_alone": vs_alone, "cells_before": pre}
            if vs_batched <= tol < vs_alone:
                out |= {"kind": "cell position", "detail": f"alone in its batches but in cells {pre}.. as when "
                        f"batched, it gives the batched logits (max |Δ| {vs_batched:.2g}): where the sequence sits "
                        "in the cache changes its result, not what it shares a batch with"}
                flip = self._first_flip(t, i, step, alone, steps, mine)
                return out | ({"flip": flip} if flip else {})
            both = not vs_alone <= tol < vs_batched
            where = (f"neither its cells (alone in them it moves {vs_alone:.2g} from its solo run) nor its batch "
                     f"alone (it moves {vs_batched:.2g} from there when batched) explain it, and " if both else
                     "in the same cells but alone in its batches it gives its solo logits, and ")
        else:
            where = "each sequence has its own cache stream (its cells start at 0, as alone), and "
        # which part of the batch: its shape (the kernels' path) or its other sequences' data (a leak)?
        other = self._together(t, alone, keep=i)
        if isinstance(other, str):
            return out | {"kind": "unclear", "detail": f"the run with other neighbours failed: {other}"}
        if all(np.array_equal(a, b) for a, b in zip(other[i], together[i], strict=True)):
            out |= {"kind": "cells and batch shape" if both else "batch shape",
                    "detail": where + "batched with other neighbours (other tokens, same lengths) it gets the same "
                    "bits as before: the batch's shape changes its numerics (kernel paths), its neighbours' data does "
                    "not reach it"}
            # as far as the shape's rounding goes: within NOISE_FACTOR × the batch-shape control, or turned into
            # another result at a near-tie choice rounding moved (named) — never by its size alone
            control = self.noise_measured
            out |= {"moved": moved, "control": control, "bound": NOISE_FACTOR * control, "whole": self.whole}
            if moved > NOISE_FACTOR * control:
                flip = self._batch_flip(t, i, step, alone, unified)
                if flip:
                    out["flip"] = flip
            return out
        return out | {"kind": "batch", "detail": where + "other neighbours change it again: the other sequences' "
                      "data reaches it"}

    def _first_flip(self, t: Target, i: int, step: int, alone, placed: list[dict[str, Any]],
                    mine: list[int]) -> dict[str, Any] | None:
        """The near-tie choice that turns the cells' summation order into another result (_flip_at), at the step
        whose logits differ, else at the earliest step before it that has one (a value rounded otherwise there
        reaches later steps through the cache: the step that differs reads it from there, computing nothing new
        to compare); with the step it is at."""
        for s in (step, *range(step)):
            flip = self._flip_at(t, i, s, alone, placed[:mine[s] + 1])
            if flip:
                return flip | {"step": s}
        return None

    def _flip_at(self, t: Target, i: int, step: int, alone, placed: list[dict[str, Any]]) -> dict[str, Any] | None:
        """Solo at cells 0.. and placed, traced node by node at `step`: the first near-tie discrete choice that
        turns the cells' summation order into a different result — a MoE routing choice (llama.cpp's integer
        `ffn_moe_*` nodes: expert argsort / top-k) whose values differ, or a value a matrix product rounds to f16 /
        bf16 (the softmax probabilities times an f16 V cache, a K row stored in an f16 cache) that rounds otherwise
        (fuzz.engine.parity). A routing choice is named first: a 16-bit rounding moves a value by that type's step, a
        route choice moves it by another expert's whole output. (Integer nodes over KV cells, like DSA's top-k,
        hold cell indices that differ between the two placements anyway: not compared.) None if the target cannot
        trace or no such choice differs."""
        p = self.prompts[i]
        solo = [{"tokens": p, "seq": i, "pos": list(range(len(p))), "logits": "last"}]
        solo += [{"tokens": [alone[i][0][k]], "seq": i, "pos": [len(p) + k], "logits": "last"} for k in range(step)]
        runs = []
        for steps in (solo, placed):
            steps = [dict(x) for x in steps]
            steps[-1]["trace"] = "all"
            r = t.pipeline([("load", {"path": str(self.fixture), **self._params(True), "trace": True}),
                            script_request(steps, reset=True)])
            if len(r) < 2 or not r[-1].ok:
                return None
            runs.append(r[-1].data["results"][-1].get("nodes") or [])
        # the same graph both times, up to where it parts (nothing to pair after that)
        same = next((k for k, (x, y) in enumerate(zip(*runs, strict=False))
                     if (x["name"], x["op"], x["ne"], x["type"]) != (y["name"], y["op"], y["ne"], y["type"])),
                    min(len(r) for r in runs))
        a, b = runs[0][:same], runs[1][:same]
        route = first_token_flip(token_rows([a]), token_rows([b]))
        if route is not None:  # a routing choice parted first: numerics only across a near-tie rounding moved
            rounding = self._rounding(t, [*solo[:-1], {**solo[-1], "trace": "all"}], True, route, token_rows([a]),
                                      last=True)
            return routing_flip(route, "placed", rounding) \
                if rounding is not None and routing_near_tie(route, rounding) else None
        flip = first_rounding_flip(a, b)
        if not flip:
            return None
        return {k: v for k, v in flip.items() if k not in ("a", "b")} | {"alone": flip["a"], "placed": flip["b"]}

    def _rounding(self, t: Target, steps: list[dict[str, Any]], kvu: bool, route: dict[str, Any],
                  own: tuple[dict[str, np.ndarray], dict[str, int]], counts: list[int] | None = None,
                  last: bool = False) -> float | None:
        """What the model's own rounding moves the router's scores at a routing flip's token (own_rounding): the
        sequence's steps alone (`own`: their traced rows; `last`: only the last step traced) again with one rounding
        changed each (rounding_controls); None where a run failed (the flip is then not excused)."""
        others = []
        for params in rounding_controls(self._params(kvu)):
            r = t.pipeline([("load", {"path": str(self.fixture), **params, "trace": True}),
                            script_request(steps, reset=True)])
            nodes = [x.get("nodes") or [] for x in r[-1].data["results"]] if len(r) >= 2 and r[-1].ok else None
            others.append(None if nodes is None else token_rows(nodes[-1:] if last else nodes, counts))
        return own_rounding(route, own, others)

    def _batch_flip(self, t: Target, i: int, step: int, alone, kvu: bool) -> dict[str, Any] | None:
        """The near-tie choice that turns the batch's shape into another result for sequence i, up to the step whose
        logits differ: its first MoE routing choice (its tokens' rows, alone vs batched) or DSA top-k (in the same
        cells: its own stream, or a unified cache's cells the batch gave it — the placed run) that differs, if the
        rounding moved the scores across a near-tie there (the measured score move is the bound); None otherwise
        (or the target cannot trace)."""
        p = self.prompts[i]
        lens = [len(q) for q in self.prompts]
        mine = [{"tokens": p, "seq": i, "pos": list(range(len(p))), "logits": "last"}]
        mine += [{"tokens": [alone[i][0][k]], "seq": i, "pos": [len(p) + k], "logits": "last"} for k in range(step)]
        toks, seqs, pos = [], [], []
        for j, q in enumerate(self.prompts):
            toks, seqs, pos = toks + q, seqs + [j] * len(q), pos + list(range(len(q)))
        batch = [{"tokens": toks, "seq": seqs, "pos": pos, "logits": "last"}]
        batch += [{"tokens": [alone[j][0][k] for j in range(len(lens))], "seq": list(range(len(lens))),
                   "pos": [lens[j] + k for j in range(len(lens))], "logits": "last"} for k in range(step)]
        runs = [mine, batch]
        if kvu:  # the same cells as batched: sequence i alone in every batch, fillers taking the others' cells
            placed, ours = self._placed_steps(i, alone)
            runs.append(placed[:ours[step] + 1])
        traced = []
        for steps in runs:
            r = t.pipeline([("load", {"path": str(self.fixture), **self._params(kvu), "trace": True}),
                            script_request([{**x, "trace": "all"} for x in steps], reset=True)])
            if len(r) < 2 or not r[-1].ok:
                return None
            traced.append([x.get("nodes") or [] for x in r[-1].data["results"]])
        counts = [len(p)] + [1] * step
        start = sum(lens[:i])

        def in_batch(k: int, n: int) -> slice:
            return slice(start, start + len(p)) if k == 0 else slice(i, i + 1)

        route = first_token_flip(token_rows(traced[0], counts), token_rows(traced[1], counts, in_batch))
        if route is not None:
            rounding = self._rounding(t, [{**x, "trace": "all"} for x in mine], kvu, route,
                                      token_rows(traced[0], counts), counts)
            return routing_flip(route, "batched", rounding) \
                if rounding is not None and routing_near_tie(route, rounding) else None
        if kvu:
            ours_steps = set(ours[:step + 1])
            placed_counts = [len(x["tokens"]) if k in ours_steps else 0 for k, x in enumerate(runs[2])]
            ref = token_rows(traced[2], placed_counts, lambda k, n: slice(0, n) if k in ours_steps else slice(0, 0),
                             TOP_K_NODES)
        else:
            ref = token_rows(traced[0], counts, names=TOP_K_NODES)
        top = first_top_k_flip(ref, token_rows(traced[1], counts, in_batch, TOP_K_NODES))
        if top is not None:
            if not top_k_near_tie(top):
                return None
            return {"kind": "top-k", "node": top["node"], "token": top["token"], "alone": top["a"],
                    "batched": top["b"], "scores": top.get("scores"), "scores_max_abs": top["scores_max_abs"],
                    "margin": top["margin"]}
        # a value the batch's kernels round an ulp otherwise, rounded to another 16-bit number (each step: sequence
        # i's rows of the batch against its own run in the same cells)
        mine_nodes = [traced[2][k] for k in ours[:step + 1]] if kvu else traced[0]
        for k in range(step + 1):
            n_batch = sum(lens) if k == 0 else len(lens)
            flip = first_rounding_flip(mine_nodes[k], token_slice(traced[1][k], n_batch, in_batch(k, n_batch)))
            if flip:
                return {k2: v for k2, v in flip.items() if k2 not in ("a", "b")} | {"alone": flip["a"],
                                                                                   "batched": flip["b"], "step": k}
        return None


def describe_flip(x: dict[str, Any]) -> str:
    if x["kind"] == "rounding":
        other = "placed" if "placed" in x else "batched"
        return (f"first value rounded otherwise (step {x['step']}): {x['node']} ({x['ggml_op']}) rounds its input "
                f"{x['input']} to {x['to']}, and in row {x['row']} {x['alone']!r} alone but {x[other]!r} {other} "
                f"(the {'summation order' if other == 'placed' else 'batch kernels'}' ulp) round to different "
                f"{x['to']} numbers")
    other = "placed" if "placed" in x else "batched"
    step = f" (step {x['step']})" if "step" in x else ""
    what = ("first DSA top-k that differs", "keys") if x["kind"] == "top-k" else \
        ("first MoE routing choice that differs", "experts")
    own = f", within {ROUNDING_FACTOR:g} × the model's own rounding of them ({x['rounding']:.2g}: an f32 cache, " \
        "flash attention the other way)" if x.get("rounding") is not None else ""
    return (f"{what[0]}{step}: {x['node']} token {x['token']}: {what[1]} {x['alone']} alone, {x[other]} {other} — "
            f"the scores moved {x['scores_max_abs']:.2g} across a gap of {x['margin']:.2g}{own} (a near-tie the "
            "rounding crossed)")


def is_numerics(cause: dict[str, Any] | None) -> bool:
    """A difference the cause shows to be numerics, not a leak, each within a bound: the batch's shape, or its cells
    and its batch's shape together (the same bits with other neighbours: their data does not reach it) — moving it
    less than a whole logit (WHOLE_SPREAD × the logits' spread), or no more than NOISE_FACTOR × the batch-shape
    control, or turned into another result at a near-tie the measured rounding crossed (named: a MoE routing choice, a
    DSA top-k, a value rounded to a 16-bit type); or the cells' summation order turned into a different result at such
    a near-tie. Reported, not a finding.
    (A cell-position difference with no such flip — DSA's exact-tie top-k — stays a finding, and so does a batch-shape
    move of a whole logit or more with none: that is never rounding.)"""
    if not cause:
        return False
    if cause["kind"] in ("batch shape", "cells and batch shape"):
        moved = cause.get("moved", math.inf)
        return moved <= cause.get("bound", 0.0) or moved < cause.get("whole", 0.0) or bool(cause.get("flip"))
    return cause["kind"] == "cell position" and bool(cause.get("flip"))


def routing_flip(route: dict[str, Any], other: str, rounding: float | None) -> dict[str, Any]:
    """A near-tie routing flip (first_token_flip) as a cause's flip: which experts alone and `other`, the router's
    scores' move, the gap it crossed and what the model's own rounding moves them (the bound's measure)."""
    return {"kind": "routing", "node": route["node"], "token": route["token"], "alone": route["a"],
            other: route["b"], "scores": route.get("scores"), "scores_max_abs": route.get("scores_max_abs"),
            "margin": route.get("margin"), "rounding": rounding}


def format_report(rep: dict[str, Any]) -> str:
    tols = ", ".join(f"{k}: batch-shape control {v['batch_shape']:.2g} → tolerance {v['tolerance']:.2g}"
                     for k, v in rep.get("noise", {}).items())
    lines = [f"isolation {rep['fixture']}: arch {rep['arch']}, {rep['config']['n_seq']} sequences per batch, "
             f"tolerance max({rep['config'].get('tol_spread', 0):g} × the logits' spread, "
             f"{rep['config']['noise_factor']:g} × measured)"
             + (f" — {tols}" if tols else "")]
    for r in rep["results"]:
        d = "—" if r["max_abs_dlogit"] is None else f"{r['max_abs_dlogit']:.2e}"
        where = f"kv_unified={str(r['kv_unified']):<5} flash_attn={str(r.get('flash_attn', False)):<5}"
        if r["seq"] is None:
            lines.append(f"  {where} {r['status']}: {r['reason']}")
            continue
        lines.append(f"  {where} seq {r['seq']}: {r['status']:<5} max|Δlogit| {d}"
                     + (f", first at step {r['step']}" if r["status"] != "pass" else ""))
    for f in rep["findings"]:
        if f["seq"] is None:
            lines.append(f"  FINDING: {f['reason']}; reproduced={f['reproduced']}")
            continue
        lines.append(f"  FINDING: sequence {f['seq']} ({layout_of(f)}) changes when batched with others "
                     f"(step {f['step']}, max|Δlogit| {f['max_abs_dlogit']:.3g}); reproduced={f['reproduced']}")
        if f.get("cause"):
            lines.append(f"    cause: {f['cause']['kind']}: {f['cause']['detail']}")
    for f in rep.get("numerics", ()):
        lines.append(f"  NUMERICS (not a leak): sequence {f['seq']} ({layout_of(f)}) moves "
                     f"{f['max_abs_dlogit']:.3g} when batched (step {f['step']}): {f['cause']['kind']}: "
                     f"{f['cause']['detail']}")
        if f["cause"].get("flip"):
            lines.append(f"    {describe_flip(f['cause']['flip'])}")
    lines.append(f"{rep['status']}: {len(rep['findings'])} findings"
                 + (f", {len(rep['numerics'])} numerics" if rep.get("numerics") else ""))
    return "\n".join(lines)


# ---- the oracle contract ---------------------------------------------------------------------------------
def kv_layout(kv_unified: bool, flash_attn: bool = False) -> str:
    """The layout's name, a finding's phase: unified-kv / per-seq-kv, with "-fa" when flash attention is on."""
    return ("unified-kv" if kv_unified else "per-seq-kv") + ("-fa" if flash_attn else "")


def layout_of(f: dict[str, Any]) -> str:
    return kv_layout(f["kv_unified"], f.get("flash_attn", False))


def only_layout(config: dict[str, Any], f: Finding) -> dict[str, Any]:
    """A finding narrowed to its layout: its KV layout and its flash attention setting."""
    config = select("kv_unified", lambda g: g.phase.startswith("unified-kv"))(config, f)
    return select("flash_attn", lambda g: g.phase.endswith("-fa"))(config, f)


def report(fixture: Path, cfg: IsolationConfig) -> Report:
    return Isolation(fixture, cfg).report()


ORACLE = Oracle(name="isolation", config=IsolationConfig, run=report, format=lambda rep: format_report(rep.native),
                narrow=only_layout, shrink=(("tokens", 1), ("prompt_len", 1), ("n_seq", 2)),
                case_fields=("n_seq", "prompt_len", "tokens", "kv_unified", "flash_attn", "tol", "tol_spread",
                             "noise_factor", "seed"))
