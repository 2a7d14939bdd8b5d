"""`fuzz sweep --wire DTYPE` (oracle `wire`): the hidden states crossing each stage boundary travel in a wire type,
as a split runtime sends them (f16, bf16, or q8_0 in ggml's block layout), and the target converts them on
arrival (protocol `decode` field `wire`).

Per cut set, every stage after a boundary runs twice on the same stage file: fed the previous stage's rows through
the target's wire, and — the control — fed the same rows converted by the toolkit's reference (gguf-py's
quantizers, an implementation independent of the target's). A correct wire makes them bit-exact; a wire that
does more than its dtype (truncates, mis-scales a block, drops rows) differs and is localized to the first
stage layer that differs. Against the unsplit model the chain is not bit-exact by design: tokens and logits are
reported under an explicit policy — f32 and f16 are token-exact gates (a flip at a near-tie excused), bf16 and
q8_0 are measured (token agreement, max |Δlogit|, NMSE = Σ(a−b)²/Σa², llama.cpp's own test measure).

An f16 flip with a clear margin is traced before it is a finding: when the split fed f32 rows gives the unsplit
model's tokens and, at a boundary, the wire's rounding reaches a matrix product with quantized weights whose
activations (quantized to an 8-bit grid first, ggml's vec_dot_type) land on other integers, the flip is numerics —
an f16 ulp became a step of 1/127 of the block's largest value, which no wire short of f32 avoids.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fuzz.engine.case_oracle import CaseOracle
from fuzz.engine.contract import (
    CRASH,
    FINDING,
    NUMERICS,
    PASS,
    TIMEOUT,
    UNSUPPORTED,
    Oracle,
    Report,
)
from fuzz.engine.fleet import Fleet, failure_reason, failure_status, fixture_header, load_full
from fuzz.engine.parity import (
    Trace,
    context_params,
    first_requantization_flip,
    first_row_diff,
    max_abs,
    pos_per_token,
    run_script,
    script_steps,
)
from fuzz.engine.routing import (
    TOP_K_NODES,
    first_token_flip,
    first_top_k_flip,
    routing_near_tie,
    token_rows,
    top_k_near_tie,
)
from fuzz.engine.schedule import build_schedule, main_prompt
from fuzz.engine.stages import FixtureStages, cut_sets, stage_ranges
from synth.errors import UserError
from synth.gguf_io import GGUFFile
from targets import Failure, Target
from targets.target import script_request
from targets.wire import WIRES

GATES = ("f32", "f16")  # token-exact across the whole chain; the others are measured
NEAR_TIE = 1e-2  # a flip where the unsplit model's top-1/top-2 margin is below this is not judged
POLICY = {
    "control": "every stage after a boundary bit-exact with the same stage fed the reference conversion",
    "tokens": "f32, f16: greedy tokens equal to the unsplit model's (near-ties below 1e-2 excused; an f16 flip "
              "traced to a quantized matrix product re-quantizing the rounded rows, to a MoE routing or DSA top-k "
              "choice at a near-tie the rounding crossed, or at a margin within twice what the f16 rounding moves the "
              "rows whose choice it keeps, is numerics); bf16, q8_0: measured",
}


@dataclass
class WireConfig:
    wire: str = "f16"
    cuts: str = "all"
    stages: int = 2
    tokens: int = 16
    prompt_len: int = 24
    prompt: tuple[int, ...] = ()  # the prompt's token ids (default: prompt_len tokens drawn from seed)
    chunk: int = 7
    period: int | None = None
    target: str = "llama-cpp"
    timeout: float = 120.0
    seed: int = 0
    workdir: Path | None = None


def reference(rows: np.ndarray, wire: str) -> np.ndarray:
    """The toolkit's own conversion of f32 rows to `wire` and back (gguf-py's quantizers)."""
    if wire == "f32":
        return rows
    from gguf import GGMLQuantizationType as Q
    from gguf.quants import dequantize, quantize

    qt = {"f16": Q.F16, "bf16": Q.BF16, "q8_0": Q.Q8_0}[wire]
    flat = np.ascontiguousarray(rows, dtype=np.float32).reshape(1, -1)
    return dequantize(quantize(flat, qt), qt).astype(np.float32).reshape(rows.shape)


class Wire(CaseOracle[list[int]]):
    name, unit, sections = "wire", "cut sets", ("policy",)

    def __init__(self, fixture: Path, cfg: WireConfig):
        super().__init__(fixture, cfg)
        if cfg.wire not in WIRES:
            raise UserError(f"--wire {cfg.wire!r}: use one of {', '.join(WIRES)}")
        self.st = FixtureStages(self.fixture, period=cfg.period)
        self.info = self.st.info
        if cfg.wire == "q8_0" and self.info.n_embd % 32:
            raise UserError(f"--wire q8_0: n_embd {self.info.n_embd} is not whole blocks of 32; use f16 or bf16")
        self.sets = cut_sets(cfg.cuts, self.info.n_layer, cfg.stages, self.st.period, self.fixture)
        self.steps = build_schedule(n_vocab=self.info.n_vocab, prompt=main_prompt(cfg, self.info.n_vocab),
                                    chunk=cfg.chunk, n_decode=cfg.tokens, seed=cfg.seed,
                                    phases=("prefill", "decode")).sequential

    def open(self, fleet: Fleet) -> None:
        self.scope.enter_context(self.st.workspace(self.cfg.workdir))
        ref, self.workers = fleet.one(), fleet.open(max(len(s) for s in self.sets) + 1)
        loaded = load_full(ref, self.fixture, **context_params())
        self.commit, self.n_pos = loaded.data.get("llama_cpp_commit"), pos_per_token(loaded.data)
        full = run_script(ref, script_steps(self.steps, capture=list(range(self.info.n_layer))), reset=True)
        if isinstance(full, Failure):
            raise UserError(f"{self.fixture}: the full model fails in the target ({full.message})")
        self.full = full
        self.tokens = [so.tokens for so in full.steps]

    def cases(self) -> list[list[int]]:
        return self.sets

    def identity(self, cuts: list[int]) -> dict[str, Any]:
        return {"cuts": cuts, "stages": stage_ranges(cuts, self.info.n_layer)}

    def observe(self, cuts: list[int]) -> dict[str, Any]:
        """The chain over the wire, and at every boundary the next stage fed the same rows converted by the
        reference (the control, fed along its own chain); stops at a stage that fails."""
        stages = self.st.stages(cuts)
        if not isinstance(stages, list):
            return {"unsupported": str(stages)}
        steps, wire, workers = self.steps, self.cfg.wire, self.workers
        chain: Trace | Failure = self._stage(workers[0], stages[0][0], steps, tokens=self.tokens,
                                             last=len(stages) == 1, n_layer=stages[0][1].n_layer)
        seen: dict[str, Any] = {"stages": stages, "hops": [], "first": chain, "chain": None, "failed": None}
        control = chain
        for s in range(1, len(stages)):
            if isinstance(chain, Failure):
                return {**seen, "failed": (s - 1, chain)}
            path, st = stages[s]
            width = stages[s - 1][1].n_layer
            sent = [so.captures[width - 1] for so in chain.steps]
            last = s == len(stages) - 1
            got = self._stage(workers[s], path, steps, embd=sent, wire=wire, last=last, n_layer=st.n_layer)
            want = self._stage(workers[s], path, steps, embd=[reference(x, wire) for x in
                                                              (so.captures[width - 1] for so in control.steps)],
                               last=last, n_layer=st.n_layer)
            for tr in (got, want):
                if isinstance(tr, Failure):
                    return {**seen, "failed": (s, tr)}
            seen["hops"].append({"stage": s, "sent": sent, "control": control, "width": width, "last": last,
                                 "got": got, "want": want})
            chain, control = got, want
        if isinstance(chain, Failure):
            return {**seen, "failed": (len(stages) - 1, chain)}
        return {**seen, "chain": chain}

    def judge(self, cuts: list[int], seen: dict[str, Any]) -> list[dict[str, Any]]:
        """The first boundary where the wire's stage differs from the control's; a stage that failed; else the
        chain against the unsplit model under the policy (f32 and f16 token-exact gates)."""
        res: dict[str, Any] = {**self.identity(cuts), "status": PASS}
        if "unsupported" in seen:
            return [{**res, "status": UNSUPPORTED, "reason": seen["unsupported"]}]
        steps, wire = self.steps, self.cfg.wire
        for hop in seen["hops"]:
            diff = self._first_diff(hop["got"], hop["want"], steps, hop["last"])
            if diff is not None:
                k, row, worst = diff
                return [{**res, "status": FINDING, "stage": hop["stage"], "where": "logits" if hop["last"] else
                         "boundary", "step": k, "position": steps[k].pos[row], "phase": steps[k].phase,
                         "max_abs": worst,
                         "reason": f"stage {hop['stage']} fed its input over the {wire} wire differs from the same "
                                   f"stage fed the reference {wire} conversion at position {steps[k].pos[row]} "
                                   f"(max |Δ| {worst:.3g})"}]
        if seen["failed"]:
            s, f = seen["failed"]
            return [{**res, "status": failure_status(f), "stage": s,
                     "reason": failure_reason(f, "stage rejected")}]
        res["vs_unsplit"] = m = self._measure(seen["chain"], self.full, steps)
        if wire in GATES and m["clear_token_flips"]:
            res.update(status=FINDING, where="tokens", phase="tokens", reason=f"{flips_of(m, wire)} (a gate: "
                                                                              f"{POLICY['tokens']})")
        return [res]

    def explain(self, cuts: list[int], seen: dict[str, Any], row: dict[str, Any]) -> dict[str, Any]:
        """A stage that differs from its control: the first source layer that does. An f16 token flip: numerics
        when traced to the wire's rounding (_explain), or when its margin is within twice what the rounding moves
        the rows whose choice it keeps."""
        if row["where"] != "tokens":
            hop = next(h for h in seen["hops"] if h["stage"] == row["stage"])
            return {"layer": self._localize(self.workers[row["stage"]], seen["stages"][row["stage"]], self.steps,
                                            hop["sent"], hop["control"], hop["width"], row["step"])}
        m = row["vs_unsplit"]
        cause = self._explain(seen["stages"], self.steps, self.full, seen["first"], self.workers) \
            if self.cfg.wire == "f16" else None
        if cause is None and self.cfg.wire == "f16" and m["flip_margin"] <= 2 * m["kept_moved"]:
            # the wire is bit-exact with the reference conversion: what it moves is the dtype's own rounding,
            # and two logits each moved that far close a gap twice as wide
            cause = {"kind": "near-tie", "margin": m["flip_margin"], "moved": m["kept_moved"]}
        if cause is None:
            return {}
        return {"status": NUMERICS, "cause": cause,
                "reason": f"{flips_of(m, self.cfg.wire)}: numerics, {describe_cause(cause)}"}

    def message(self, row: dict[str, Any]) -> str:
        return f"cuts {','.join(map(str, row['cuts']))}: {row.get('reason')}"

    def record(self, results: list[dict[str, Any]]) -> dict[str, Any]:
        cfg = self.cfg
        return {**fixture_header(self.fixture, self.info, target=cfg.target, commit=self.commit),
                "policy": POLICY,
                "config": {"wire": cfg.wire, "cuts": cfg.cuts, "stages": cfg.stages, "period": self.st.period,
                           "tokens": cfg.tokens, "prompt_len": cfg.prompt_len, "prompt": list(cfg.prompt),
                           "chunk": cfg.chunk, "seed": cfg.seed}}

    def _stage(self, t: Target, path: Path, steps, *, tokens=None, embd=None, wire: str | None = None,
               last: bool, n_layer: int, capture_all: bool = False) -> Trace | Failure:
        r = t.load(str(path), **context_params(capture=True))
        if not r.ok:
            return r.failure
        capture = list(range(n_layer)) if capture_all else [] if last else [n_layer - 1]
        reqs = script_steps(steps, tokens=tokens, embd=embd, capture=capture, n_pos_per_token=self.n_pos,
                            logits_mode="all" if last else "none", wire=wire)
        return run_script(t, reqs, reset=True)

    def _explain(self, stages, steps, full: Trace, first: Trace, workers: list[Target]) -> dict[str, Any] | None:
        """Why the f16 wire flips a clear-margin token, or None (a finding): the same split fed f32 rows across every
        boundary gives the unsplit model's tokens (so the wire's rounding alone moves them), and at a boundary that
        rounding reaches a matrix product with quantized weights that quantizes its activations to other integers
        (fuzz.engine.parity.first_requantization_flip): an f16 ulp become a step of the activations' 8-bit grid."""
        prev, fed = first, []
        for s in range(1, len(stages)):
            path, st = stages[s]
            fed.append([so.captures[stages[s - 1][1].n_layer - 1] for so in prev.steps])
            prev = self._stage(workers[s], path, steps, embd=fed[-1], last=s == len(stages) - 1, n_layer=st.n_layer)
            if isinstance(prev, Failure):
                return None
        if not all(np.array_equal(np.argmax(a.logits, axis=1), np.argmax(b.logits, axis=1))
                   for a, b in zip(prev.steps, full.steps, strict=True)):
            return None  # the f32-fed split moves the tokens too: not the wire's rounding
        for s, rows in enumerate(fed, start=1):
            cause = self._requantized(workers[s], stages[s], steps, rows, s)
            if cause:
                return cause
        return None

    def _requantized(self, t: Target, stage, steps, rows, s: int) -> dict[str, Any] | None:
        """The first requantization flip of stage `s` fed `rows` in f32 and over the f16 wire, traced step by step,
        its node and tensor names given with source layer indices; or None."""
        path, st = stage
        weights = {name: info.type for name, info in GGUFFile(path).tensors.items()}
        runs = []
        for wire in (None, "f16"):
            reqs = script_steps(steps, embd=rows, n_pos_per_token=self.n_pos, logits_mode="none", wire=wire)
            r = t.pipeline([("load", {"path": str(path), **context_params(capture=True), "trace": True}),
                            script_request([{**q, "trace": "all"} for q in reqs], reset=True)])
            if len(r) < 2 or not r[-1].ok:
                return None
            runs.append([res.get("nodes") or [] for res in r[-1].data["results"]])
        def source(name: str) -> str:  # the stage file numbers its layers from 0
            name = re.sub(r"^blk\.(\d+)\.", lambda m: f"blk.{st.layers[int(m[1])]}.", name)
            return re.sub(r"-(\d+)( \(view\))?$", lambda m: f"-{st.layers[int(m[1])]}{m[2] or ''}", name)

        for k, (a, b) in enumerate(zip(*runs, strict=True)):
            flip = first_requantization_flip(a, b, weights)
            if flip:
                return flip | {f: source(flip[f]) for f in ("node", "input", "weight")} | {"stage": s, "step": k}
        # or a discrete choice at a near-tie the rounding crossed: a MoE routing choice, a DSA top-k
        counts = [len(x.tokens) for x in steps]
        route = first_token_flip(token_rows(runs[0], counts), token_rows(runs[1], counts))
        if route is not None:
            return {"kind": "routing", **route, "node": source(route["node"]), "stage": s} \
                if routing_near_tie(route) else None
        top = first_top_k_flip(token_rows(runs[0], counts, names=TOP_K_NODES),
                               token_rows(runs[1], counts, names=TOP_K_NODES))
        if top is not None and top_k_near_tie(top):
            return {"kind": "top-k", **top, "node": source(top["node"]), "stage": s}
        return None

    @staticmethod
    def _first_diff(got: Trace, want: Trace, steps, last: bool) -> tuple[int, int, float] | None:
        for k in range(len(steps)):
            a = got.steps[k].logits if last else got.steps[k].captures[max(got.steps[k].captures)]
            b = want.steps[k].logits if last else want.steps[k].captures[max(want.steps[k].captures)]
            row = first_row_diff(a, b)
            if row is not None:
                return k, row, max_abs(a, b)
        return None

    def _localize(self, t: Target, stage, steps, sent, control: Trace, width: int, k: int) -> int | str:
        """The first source layer of the stage whose output differs between the wire run and the control."""
        path, st = stage
        runs = [self._stage(t, path, steps[:k + 1], embd=rows[:k + 1], wire=w, last=False, n_layer=st.n_layer,
                            capture_all=True)
                for rows, w in ((sent, self.cfg.wire),
                                ([reference(so.captures[width - 1], self.cfg.wire) for so in control.steps], None))]
        if any(isinstance(r, Failure) for r in runs):
            return "unlocalized"
        a, b = runs
        for j in range(st.n_layer):
            if j in st.pads:
                continue
            for x, y in zip(a.steps, b.steps, strict=True):
                if first_row_diff(x.captures[j], y.captures[j]) is not None:
                    return st.layers[j]
        return "output"

    def _measure(self, chain: Trace, full: Trace, steps) -> dict[str, Any]:
        """The split over the wire against the unsplit model: token agreement, the flips at a clear margin (NEAR_TIE
        or more) and the largest such margin, how far the wire's rounding moves the rows whose choice it keeps."""
        a = np.concatenate([so.logits for so in full.steps]).astype(np.float64)
        b = np.concatenate([so.logits for so in chain.steps]).astype(np.float64)
        want, got = np.argmax(a, axis=1), np.argmax(b, axis=1)
        top = np.sort(a, axis=1)[:, -2:]
        agree = want == got
        margin = top[:, 1] - top[:, 0]
        flips = ~agree & (margin >= NEAR_TIE)
        return {"token_agreement": round(float(np.mean(agree)), 4), "rows": int(len(want)),
                "clear_token_flips": int(np.sum(flips)), "max_abs_dlogit": float(np.max(np.abs(a - b))),
                "flip_margin": float(np.max(margin[flips])) if flips.any() else None,
                "kept_moved": float(np.max(np.abs(a[agree] - b[agree]))) if agree.any() else 0.0,
                "nmse": float(np.sum((a - b) ** 2) / max(np.sum(a ** 2), 1e-30))}


def describe_cause(x: dict[str, Any]) -> str:
    if x["kind"] == "near-tie":
        return (f"the unsplit margin at the flip ({x['margin']:.2g}) is within twice what the f16 rounding moves the "
                f"logits of the rows whose choice it keeps ({x['moved']:.2g}): a near-tie the rounding crossed")
    if x["kind"] in ("routing", "top-k"):
        what = "experts" if x["kind"] == "routing" else "keys"
        return (f"the f16 rounding at stage {x['stage']}'s boundary moves {x['node']}'s scores by "
                f"{x['scores_max_abs']:.2g} across a gap of {x['margin']:.2g} at token {x['token']}: {what} {x['a']} "
                f"fed f32, {x['b']} over the wire (a near-tie the rounding crossed)")
    return (f"the f16 rounding at stage {x['stage']}'s boundary reaches {x['node']} ({x['ggml_op']} with "
            f"{x['weight_type']} {x['weight']}), whose activations quantize to {x['to']}: at step {x['step']} "
            f"{x['moved']} of {x['of']} values move to another integer (row {x['row']}: {x['a']!r} in f32, "
            f"{x['b']!r} over the wire → {x['ints'][0]} and {x['ints'][1]})")


def format_report(rep: dict[str, Any]) -> str:
    c = rep["config"]
    lines = [f"wire {rep['fixture']}: arch {rep['arch']}, {rep['n_layer']} layers {rep['kinds']}, wire {c['wire']}, "
             f"target {rep['target']}",
             f"{'cuts':<12} {'status':<11} {'tokens':>8} {'max|Δlogit|':>12} {'nmse':>10}  note"]
    for r in rep["results"]:
        m = r.get("vs_unsplit") or {}
        figures = f"{m['token_agreement']:>8} {m['max_abs_dlogit']:>12.3g} {m['nmse']:>10.2e}" if m else \
            f"{'-':>8} {'-':>12} {'-':>10}"
        lines.append(f"{','.join(map(str, r['cuts'])):<12} {r['status']:<11} {figures}  "
                     + (r.get("reason") or "") + (f" (first differing layer {r['layer']})" if "layer" in r else ""))
    n = {s: sum(r["status"] == s for r in rep["results"]) for s in (PASS, NUMERICS, FINDING, UNSUPPORTED, CRASH,
                                                                       TIMEOUT)}
    lines.append(f"{len(rep['results'])} cut sets: " + ", ".join(f"{v} {k}" for k, v in n.items() if v)
                 + f"; policy: {rep['policy']['tokens']}")
    return "\n".join(lines)


def flips_of(m: dict[str, Any], wire: str) -> str:
    return f"greedy tokens differ from the unsplit model's at {m['clear_token_flips']} step(s) with a clear margin " \
           f"over the {wire} wire"


def report(fixture: Path, cfg: WireConfig) -> Report:
    return Wire(fixture, cfg).report()


ORACLE = Oracle(name="wire", config=WireConfig, run=report, format=lambda rep: format_report(rep.native), per_cut=True,
                shrink=(("tokens", 1), ("prompt_len", 2)),
                case_fields=("wire", "tokens", "prompt_len", "prompt", "chunk", "seed"))
