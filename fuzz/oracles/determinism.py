"""`fuzz determinism`: repeated runs under many schedules (the B2 class: results that depend on timing).

The same fixture runs R times under every schedule = n_threads × n_ubatch × prefill chunking × flash attention.
Three classes are reported separately, under an explicit policy of what the pinned llama.cpp promises:

- same schedule, repeated: must be bit-exact (anything else is nondeterminism: a finding);
- schedules that differ only in n_threads: must be bit-exact — upstream's CPU kernels compute each output element
  in one thread, and the one thread-dependent reduction (flash attention's split-KV path) needs a KV of >= 512
  cells, which these fixtures never reach (measured on the pinned llama.cpp: docs/oracles.md, "fuzz determinism");
- schedules that differ in n_ubatch, chunking or flash attention: logits are NOT promised bit-exact upstream
  (different kernels; server README on cache_prompt): max |Δ| is reported; a move past the model's own rounding
  (its rounding control) with the same tokens needs a traced MoE routing flip at a near-tie, its scores moved within
  what the same control moves them. Greedy tokens must still agree where the baseline's top-1/top-2 margin is
  clear; a flip at a near-tie is reported as such.

With --cuts, every schedule also runs the K-stage chain for each cut set and compares it with the full model
under the same schedule (parity holds per schedule, bit for bit).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from fuzz.engine.case_oracle import CaseOracle
from fuzz.engine.contract import FAILING, FINDING, NUMERICS, PASS, UNSUPPORTED, Finding, Oracle, Report
from fuzz.engine.fleet import Fleet, failure_status, fixture_header, load_full
from fuzz.engine.parity import (
    Trace,
    compare,
    context_params,
    describe_node,
    first_differing_graph_node,
    max_abs,
    nmse,
    pos_per_token,
    run_chain,
    run_script,
    script_steps,
    script_trace,
    traced_steps,
)
from fuzz.engine.routing import ROUNDING_FACTOR as ROUTING_FACTOR
from fuzz.engine.routing import first_token_flip, own_rounding, routing_near_tie, token_rows
from fuzz.engine.schedule import Step, main_prompt, sequential_steps
from fuzz.engine.stages import FixtureStages, cut_sets
from synth.errors import UserError
from synth.stage import Unsupported
from targets import Failure, open_target
from targets.target import script_request

POLICY = {
    "same-schedule": "must be bit-exact",
    "threads-only": "must be bit-exact (CPU kernels are thread-invariant; flash attention's split-KV path needs "
                    ">= 512 KV cells)",
    "ubatch/chunking/flash-attn": "logits reported, not promised bit-exact upstream; greedy tokens must agree "
                                  "unless the flip is at a near-tie",
}
NEAR_TIE = 1e-2  # a flip where the baseline's top-1/top-2 margin is below this (log-odds: probabilities within 1%)
# How far kernel rounding may move a model's logits is the model's own: measured on it, never a constant. The control
# rounds the residual stream to bf16 once (relative 2^-8: the size of the 8-bit activation quantization quantized
# matmul kernels do), after the first layer a stage can start at, on the trusted build under the baseline schedule,
# and measures the logits' move as NMSE (parity.nmse: scale-free). A kernel pair moving logits more than
# ROUNDING_FACTOR x that with the same tokens is traced for why (numerics only where a routing choice at a near-tie
# explains it); a token flip in a pair that moved no more is a near-tie. Measured (docs/oracles.md): kernel pairs
# move at most 2.1x the control over the 70 rows' fixtures, 1.1x on Gemma 3 270M Q4_K_M.
ROUNDING_FACTOR = 4.0
ROUNDING_WIRE = "bf16"
TRUSTED = "llama-cpp"  # where the control runs, whatever the target: it measures the model, not the target


@dataclass(frozen=True)
class Schedule:
    threads: int
    ubatch: int
    chunk: int
    flash_attn: bool

    @property
    def name(self) -> str:
        return f"t{self.threads}-ub{self.ubatch}-chunk{self.chunk}-fa{int(self.flash_attn)}"


@dataclass
class DeterminismConfig:
    threads: tuple[int, ...] = (1, 2)
    ubatch: tuple[int, ...] = (1, 7, 64)
    chunks: tuple[int, ...] = (64, 7)
    flash_attn: tuple[bool, ...] = (False, True)
    repeats: int = 3
    prompt_len: int = 24
    prompt: tuple[int, ...] = ()  # the prompt's token ids (default: prompt_len tokens drawn from seed)
    tokens: int = 16
    cuts: str = "none"
    stages: int = 2
    period: int | None = None
    target: str = "llama-cpp"
    timeout: float = 120.0
    seed: int = 0
    workdir: Path | None = None


def in_model(name: str, first: int) -> str:
    """A stage's node name (`ffn_moe_probs-1`) as the whole model names it: its layer counted from the stage's first
    layer, `first`."""
    base, _, layer = name.rpartition("-")
    return f"{base}-{int(layer) + first}" if base and layer.isdigit() else name


def by_name(schedules, names: list[str]) -> list[Schedule]:
    return [next(x for x in schedules if x.name == n) for n in names]


def steps_for(prompt: list[int], chunk: int, n_decode: int) -> list[Step]:
    return sequential_steps(prompt, chunk, n_decode)


def outputs(tr: Trace, n_prefill: int) -> tuple[list[int], np.ndarray]:
    """Greedy tokens (one per decode step) and the logits they came from: the prompt's last row, then each step."""
    decode = tr.steps[n_prefill:]
    return [so.tokens[0] for so in decode], np.stack([tr.steps[n_prefill - 1].logits[-1]] +
                                                     [so.logits[-1] for so in decode])


class Determinism(CaseOracle[Schedule]):
    """On the skeleton (fuzz.engine.case_oracle): its cases are the schedules, in order (the baseline first, and each
    schedule's first-thread-count sibling before it). A schedule's runs are judged on their own (repeats bit-exact),
    against the runs of the schedule it pairs with, seen before it (its threads-only sibling, or the baseline), and
    its chains against its own full runs. A finding is observed again as the whole schedule before it is explained."""

    name = "determinism"
    unit = "schedules"
    sections = ("policy", "same_schedule", "pairs", "chains", "rounding_control")

    def __init__(self, fixture: Path, cfg: DeterminismConfig):
        super().__init__(fixture, cfg)
        if cfg.repeats < 2:
            raise UserError(f"--repeats {cfg.repeats}: needs at least 2 runs per schedule to compare")
        self.st = FixtureStages(self.fixture, period=cfg.period)
        self.info = self.st.info
        self.routed: dict[Any, Any] = {}  # _routing's and _routing_rounding's traces
        self.runs: dict[Schedule, list[tuple[list[int], np.ndarray]]] = {}  # each schedule's first observation
        self.control: dict[str, Any] | None = None
        self.controlled = False

    def schedules(self) -> list[Schedule]:
        c = self.cfg
        return self.schedules_of({"threads": c.threads, "ubatch": c.ubatch, "chunks": c.chunks,
                                  "flash_attn": c.flash_attn})

    @staticmethod
    def schedules_of(config: dict[str, Any]) -> list[Schedule]:
        return [Schedule(t, u, ch, fa) for t, u, ch, fa in itertools.product(
            config["threads"], config["ubatch"], config["chunks"], config["flash_attn"])]

    @property
    def bound(self) -> float | None:
        """The NMSE kernel pairs may move logits by with the same tokens: ROUNDING_FACTOR x the rounding control's."""
        return ROUNDING_FACTOR * self.control["nmse"] if self.control else None

    # ---- the skeleton's parts ---------------------------------------------------------------------------------
    def open(self, fleet: Fleet) -> None:
        cfg = self.cfg
        self.sets = [] if cfg.cuts == "none" else cut_sets(cfg.cuts, self.info.n_layer, cfg.stages, self.st.period,
                                                           self.fixture)
        # unsplit: logits of the last row, as a server decodes (llama.cpp then prunes the last layer to that row);
        # with chains every row, as the sweep does: a stage's pass-through pad after its last real layer would
        # move that pruning, and FFN kernels over one row and over all rows round differently (gemma3, cut 5)
        self.logits_mode = "all" if self.sets else "last"
        self.prompt = main_prompt(cfg, self.info.n_vocab)
        self.scope.enter_context(self.st.workspace(cfg.workdir))
        self.full = fleet.one()
        self.stage_targets = fleet.open(max((len(s) for s in self.sets), default=0) + 1)
        # a model the target cannot load at all is bad input; one it cannot load under a schedule the toolkit chose
        # (e.g. flash attention on) is a finding: a crash, observed twice
        self.commit = load_full(self.full, self.fixture, **context_params()).data.get("llama_cpp_commit")

    def cases(self) -> list[Schedule]:
        return self.schedules()

    def identity(self, sch: Schedule) -> dict[str, Any]:
        return {"schedule": sch.name}

    def failed(self, sch: Schedule, f: Failure) -> list[dict[str, Any]]:
        return [{"case": "schedule", **super().failed(sch, f)[0], "phase": "crash"}]

    def observe(self, sch: Schedule) -> dict[str, Any] | Failure:
        """The schedule's repeated runs of the full model and, with cut sets, each chain under it; the first
        schedule that runs also measures the model's rounding (the control the pairs are bounded by)."""
        cfg = self.cfg
        params = context_params(n_ubatch=sch.ubatch, n_threads=sch.threads, flash_attn=sch.flash_attn,
                                capture=bool(self.sets))
        steps = steps_for(self.prompt, sch.chunk, cfg.tokens)
        loaded = self.full.load(str(self.fixture), **params)
        if not loaded.ok:
            return replace(loaded.failure, message=f"loading the model under {sch.name}: {loaded.failure.message}")
        self.commit = loaded.data.get("llama_cpp_commit")
        self.n_pos = pos_per_token(loaded.data)
        runs, ref = [], None
        capture = sorted({c - 1 for s in self.sets for c in s})
        for _ in range(cfg.repeats):
            self.full.reset()
            tr = run_script(self.full, script_steps(steps, capture=capture, logits_mode=self.logits_mode))
            if isinstance(tr, Failure):
                return replace(tr, message=f"decoding under {sch.name}: {tr.message}")
            ref = ref or tr
            runs.append(outputs(tr, len(steps) - cfg.tokens))
        self.runs.setdefault(sch, runs)
        if not self.controlled:
            self.control, self.controlled = self._rounding_control(self.prompt, sch), True
        return {"runs": runs, "chains": self._chains(sch, steps, ref, params) if self.sets else []}

    def judge(self, sch: Schedule, seen: dict[str, Any]) -> list[dict[str, Any]]:
        """Repeats and threads-only pairs must be bit-exact; a kernel pair whose greedy tokens part is a finding
        unless the flip is at a near-tie: a margin under NEAR_TIE, or a pair whose logits up to the flip moved no
        more than this model's rounding (`bound`); a kernel pair moving logits past the bound with the same tokens is
        a finding until explained. Chains must be bit-exact with the full model under the same schedule."""
        rs = seen["runs"]
        exact = all(a[0] == rs[0][0] and np.array_equal(a[1], rs[0][1]) for a in rs[1:])
        rows = [{"case": "same-schedule", "schedule": sch.name, "runs": len(rs), "bit_exact": exact,
                 "max_abs": max((max_abs(a[1], rs[0][1]) for a in rs[1:]), default=0.0),
                 "status": PASS if exact else FINDING, **({} if exact else {"phase": "same-schedule"})}]
        pair = self._pair(sch, rs[0])
        if pair is not None:
            rows.append(pair)
        return rows + seen["chains"]

    def _pair(self, sch: Schedule, b: tuple[list[int], np.ndarray]) -> dict[str, Any] | None:
        """The schedule against the one it pairs with: its first-thread-count sibling when only threads differ,
        else the baseline (a schedule on another thread count is covered by its sibling); None for the baseline."""
        base = next(iter(self.runs))
        if sch == base:
            return None
        sibling = Schedule(base.threads, sch.ubatch, sch.chunk, sch.flash_attn)
        threads_only = sch.threads != base.threads and sibling in self.runs
        if not threads_only and sch.threads != base.threads:
            return None
        other = sibling if threads_only else base
        a = self.runs[other][0]
        p = {"case": "pair", "pair": [other.name, sch.name], "class": "threads-only" if threads_only else
             "ubatch/chunking/flash-attn", "bit_exact": a[0] == b[0] and np.array_equal(a[1], b[1]),
             "max_abs": max_abs(a[1], b[1]), "nmse": nmse(a[1], b[1]), "tokens_equal": a[0] == b[0]}
        bound = self.bound
        if a[0] != b[0]:
            k = next(i for i, (x, y) in enumerate(zip(a[0], b[0], strict=True)) if x != y)
            top = np.sort(a[1][k])[-2:]
            margin = float(top[1] - top[0])
            moved = nmse(a[1][:k + 1], b[1][:k + 1])
            p["first_token_diff"] = {"step": k, "baseline_margin": margin, "nmse": moved}
            if not (margin >= NEAR_TIE and (bound is None or moved > bound)):
                p["near_tie"] = True
        p["jump"] = bound is not None and not threads_only and p["tokens_equal"] and p["nmse"] > bound
        p["status"] = pair_status(p)
        if p["status"] == FINDING:
            p["phase"] = "threads-only" if threads_only else "tokens" if not p["tokens_equal"] else "logits"
        return p

    def explain(self, sch: Schedule, seen: dict[str, Any], row: dict[str, Any]) -> dict[str, Any]:
        """Where runs that should be bit-exact first part (the graph node, traced); why greedy tokens part, or
        logits move past the model's rounding, between kernels upstream does not promise bit-exact (a routing
        choice at a near-tie makes it numerics)."""
        phase = row.get("phase")
        if phase == "same-schedule":
            node = self._localize([sch, sch], seen["runs"][0], seen["runs"][-1])
            return {"node": node, "step": node.get("step")}
        if phase not in ("threads-only", "tokens", "logits"):
            return {}
        pair = by_name(self.schedules(), row["pair"])
        a, b = self.runs[pair[0]][0], seen["runs"][0]
        if phase == "threads-only":
            node = self._localize(pair, a, b)
            return {"node": node, "step": node.get("step")}
        if phase == "tokens":
            step = row["first_token_diff"]["step"]
        else:
            step = next((i for i in range(len(a[1])) if nmse(a[1][i], b[1][i]) > self.bound), 0)
        cause = self._token_cause(pair, self.prompt, step)
        return {"cause": cause, "status": pair_status({**row, "cause": cause})}

    def message(self, r: dict[str, Any]) -> str:
        return f"[{r['phase']}] {self._text(r)}"

    def _text(self, r: dict[str, Any]) -> str:
        phase = r["phase"]
        if phase == "crash":
            return r["reason"]
        if phase == "same-schedule":
            return f"{r['runs']} runs of {r['schedule']} are not bit-exact"
        if phase == "chain-parity":
            return f"chain differs from the full model under the same schedule at step {r['step']} (stage " \
                   f"{r['stage']} {r['where']})"
        a, b = r["pair"]
        if phase == "threads-only":
            return f"{a} vs {b} differ (max |Δ| {r['max_abs']:.3g}) though only n_threads changed"
        if phase == "tokens":
            d = r["first_token_diff"]
            return f"greedy tokens differ at decode step {d['step']} where the baseline margin is " \
                   f"{d['baseline_margin']:.3g} (not a near-tie)"
        c = self.control
        return f"{a} vs {b}: the same tokens, but logits move by NMSE {r['nmse']:.2g} (max |Δ| {r['max_abs']:.2g}), " \
               f"more than {ROUNDING_FACTOR:g}× this model's rounding ({c['detail']}), and no routing choice at a " \
               f"near-tie explains it: {(r.get('cause') or {}).get('detail', 'not traced')}"

    def listed(self, row: dict[str, Any]) -> bool:
        """Every finding; of the numerics (kernel pairs are numerics by policy) the token flips a traced routing choice
        at a near-tie excused (a logit move it excused stays on its pair's record)."""
        return row["status"] != NUMERICS or (row.get("phase") == "tokens" and
                                             (row.get("cause") or {}).get("kind") == "routing flip")

    def record(self, results: list[dict[str, Any]]) -> dict[str, Any]:
        cfg = self.cfg
        same = [r for r in results if r["case"] == "same-schedule"]
        pairs = [r for r in results if r["case"] == "pair"]
        findings = [{**r, "class": r["phase"], "message": self._text(r)} for r in results if r["status"] in FAILING]
        return {**fixture_header(self.fixture, self.info, target=cfg.target, commit=self.commit),
                "policy": POLICY, "same_schedule": same, "pairs": pairs,
                "chains": [r for r in results if r["case"] == "chain"], "rounding_control": self.control,
                "findings": findings,
                "numerics": [{**r, "class": r["phase"], "message": self._text(r)} for r in pairs
                             if r["status"] == NUMERICS and self.listed(r)],
                "summary": {"schedules": len(same), "findings": len(findings),
                            "not_bit_exact_pairs": [p["pair"] for p in pairs if not p["bit_exact"]]},
                "config": {"threads": list(cfg.threads), "ubatch": list(cfg.ubatch), "chunks": list(cfg.chunks),
                           "flash_attn": list(cfg.flash_attn), "repeats": cfg.repeats, "cuts": cfg.cuts,
                           "prompt_len": cfg.prompt_len, "prompt": list(cfg.prompt), "tokens": cfg.tokens,
                           "seed": cfg.seed}}

    def _rounding_control(self, prompt: list[int], sch: Schedule) -> dict[str, Any] | None:
        """How far one rounding moves this model's logits: the schedule `sch` on the trusted build, unsplit, and
        split after the first layer a stage can start at, the residual crossing rounded to ROUNDING_WIRE (bf16:
        relative error up to 2^-8, about what a quantized matmul's 8-bit activation quantization does) — the logits'
        NMSE between the two runs. None when no split of this model can be made or run."""
        n_prefill = len(steps_for(prompt, sch.chunk, self.cfg.tokens)) - self.cfg.tokens
        for c in range(1, self.info.n_layer):
            ran = self._split_rounded(sch, prompt, c)
            if ran is None:
                continue
            base, tr = (script_trace(r) for r in ran)
            _, x = outputs(base, n_prefill)
            y = np.stack([tr.steps[n_prefill - 1].logits[-1]] + [so.logits[-1] for so in tr.steps[n_prefill:]])
            moved = nmse(x, y)
            return {"cut": c, "wire": ROUNDING_WIRE, "schedule": sch.name, "nmse": moved, "max_abs": max_abs(x, y),
                    "detail": f"the residual rounded to {ROUNDING_WIRE} once, after layer {c - 1}, moves the logits by "
                              f"NMSE {moved:.2g}"}
        return None

    def _split_rounded(self, sch: Schedule, prompt: list[int], c: int, *,
                       trace: bool = False) -> tuple[Any, Any] | None:
        """The rounding control's two runs of `sch` on the trusted build (their script replies): the model unsplit,
        capturing the residual after layer c-1, and the stage from layer c fed that residual rounded to
        ROUNDING_WIRE; every graph node traced where asked. None where the stage cannot be made or a run fails."""
        stages = self.st.stages([c])
        if isinstance(stages, Unsupported):
            return None
        steps = steps_for(prompt, sch.chunk, self.cfg.tokens)
        params = context_params(n_ubatch=sch.ubatch, n_threads=sch.threads, flash_attn=sch.flash_attn,
                                **({"trace": True} if trace else {}))

        def traced(reqs: list[dict[str, Any]]) -> list[dict[str, Any]]:
            return [{**r, "trace": "all"} for r in reqs] if trace else reqs

        with open_target(TRUSTED, timeout=self.cfg.timeout) as full, \
                open_target(TRUSTED, timeout=self.cfg.timeout) as rest:
            a, b = full.load(str(self.fixture), **params, capture=True), rest.load(str(stages[1][0]), **params)
            if not (a.ok and b.ok):
                return None
            base = full.script(traced(script_steps(steps, capture=[c - 1], logits_mode="last")))
            if not base.ok:
                return None
            moved = rest.script(traced(script_steps(steps, embd=[x["captures"][c - 1] for x in base.data["results"]],
                                                    wire=ROUNDING_WIRE, logits_mode="last",
                                                    n_pos_per_token=pos_per_token(b.data))))
        return (base, moved) if moved.ok else None

    def _localize(self, pair: list[Schedule], a: tuple[list[int], np.ndarray],
                  b: tuple[list[int], np.ndarray]) -> dict[str, Any]:
        """Where two runs that should be bit-exact (`a` under pair[0], `b` under pair[1]) first part: the first
        output row that differs gives the step; both schedules run again to it with every graph node traced (the
        same graph both times), and the first node whose bits differ is named. All nodes equal while the logits
        still differ: the difference comes after the graph; the logits equal too: it did not recur under tracing
        (timing-dependent)."""
        a_sch = pair[0]
        a, b = a[1], b[1]
        row = next((i for i in range(min(len(a), len(b))) if not np.array_equal(a[i], b[i])), 0)
        steps = steps_for(self.prompt, a_sch.chunk, self.cfg.tokens)
        n_prefill = len(steps) - self.cfg.tokens
        k = n_prefill - 1 + row
        runs = []
        for sch in pair:
            reqs = script_steps(steps[:k + 1], logits_mode=self.logits_mode)
            reqs[-1]["trace"] = "all"
            runs.append(({"path": str(self.fixture), **context_params(n_ubatch=sch.ubatch, n_threads=sch.threads,
                                                                      flash_attn=sch.flash_attn, trace=True)}, reqs))
        with open_target(self.cfg.target, timeout=self.cfg.timeout) as t:
            traced = traced_steps(t, runs, k)
        if isinstance(traced, dict):
            return traced
        x, y = traced
        found = first_differing_graph_node(x["nodes"], y["nodes"], unset=("inp_embd",))
        if found is not None:
            return found | {"step": k}
        if not np.array_equal(x["logits"], y["logits"]):
            return {"kind": "after-graph", "step": k, "detail": f"all {len(y['nodes'])} graph nodes are bit-identical "
                    f"at step {k} but the logits differ: the difference comes after llama.cpp's graph"}
        return {"kind": "not-recurring", "step": k, "detail": "the traced runs agree: the difference did not recur "
                "under node-by-node tracing (timing-dependent)"}

    def _token_cause(self, pair: list[Schedule], prompt: list[int], step: int) -> dict[str, Any]:
        """Why greedy tokens part (or logits jump past the rounding bound) at decode `step` between two schedules
        upstream does not promise bit-exact: both runs traced node by node (_routing), and the first token (prompt or
        decoded, up to the one whose logits chose at `step`) whose MoE routing choice differs is named, with the
        router's scores there in both runs. A choice flipped by a score change of rounding size across a near-tie gap
        turns the kernels' rounding into other experts, other logits and maybe another token: numerics. Rounding size
        is the model's own, measured at that token by the rounding control traced (_routing_rounding: the residual
        rounded to bf16 once, the size of a quantized kernel's rounding); the scores may move at most
        ROUTING_FACTOR x that. Anything else — a flip before the control's cut, or a control that could not run —
        is unexplained (a finding)."""
        traced = [self._routing(sch, prompt) for sch in pair]
        if any(x is None for x in traced):
            return {"kind": "unclear", "detail": "a traced run failed"}
        n = len(prompt) + step  # the tokens before the logits that chose at `step`

        def upto(got: tuple[dict[str, np.ndarray], dict[str, int]]) -> tuple[dict[str, np.ndarray], dict[str, int]]:
            return {name: rows[:n] for name, rows in got[0].items()}, got[1]

        traced = [upto(x) for x in traced]
        flip = first_token_flip(*traced)
        if flip is None:
            return {"kind": "unexplained", "detail": f"no MoE routing choice differs before decode step {step}"}
        where = (f"token {flip['token']} ({'prompt' if flip['token'] < len(prompt) else 'decoded'}): "
                 f"{flip['node']} picks experts {flip['a']} under {pair[0].name}, {flip['b']} under {pair[1].name}")
        control = self._routing_rounding(pair[0], prompt)
        rounding = own_rounding(flip, upto(control[0]), [upto(control[1])]) if control is not None else None
        own = f"{rounding:.2g}" if rounding is not None else "not measured (" + (
            "the control could not run" if control is None else f"{flip.get('scores')} lies before its cut") + ")"
        said = f"the residual rounded to {ROUNDING_WIRE} once moves them {own} there"
        if rounding is None or not routing_near_tie(flip, rounding):
            return {"kind": "unexplained", **flip, "own_rounding": rounding,
                    "detail": f"{where}, but not across a near-tie moved by rounding (scores moved "
                              f"{flip.get('scores_max_abs', math.nan):.2g}, gap {flip.get('margin', math.nan):.2g}; "
                              f"{said})"}
        return {"kind": "routing flip", **flip, "own_rounding": rounding,
                "detail": f"{where}: the router's scores ({flip['scores']}) differ by {flip['scores_max_abs']:.2g} "
                          f"(the kernels' rounding, not promised bit-exact: {said}, bound {ROUTING_FACTOR:g}x) across "
                          f"a gap of {flip['margin']:.2g} between the last expert chosen and the first not — other "
                          "experts, then other logits"}

    def _routing_rounding(self, sch: Schedule, prompt: list[int]) -> tuple[Any, Any] | None:
        """The MoE router's rows under the rounding control (_split_rounded at the control's cut, traced): unsplit,
        and from the cut on with the residual rounded to bf16 once, the split's named by their layers in the whole
        model (a stage's layers count from 0); None where the control does not run."""
        key = ("rounding", sch)
        if key not in self.routed:
            c = (self.control or {}).get("cut")
            ran = self._split_rounded(sch, prompt, c, trace=True) if c else None
            self.routed[key] = None
            if ran is not None:
                sizes = [len(st.tokens) for st in steps_for(prompt, sch.chunk, self.cfg.tokens)]
                own, split = (token_rows([x.get("nodes") or [] for x in r.data["results"]], sizes) for r in ran)
                self.routed[key] = own, ({in_model(name, c): rows for name, rows in split[0].items()},
                                         {str(int(layer) + c): k for layer, k in split[1].items()})
        return self.routed[key]

    def _routing(self, sch: Schedule, prompt: list[int]) -> tuple[dict[str, np.ndarray], dict[str, int]] | None:
        """The MoE router's rows of one schedule's whole run, token by token (traced once per schedule); None if
        the traced run failed."""
        if sch not in self.routed:
            steps = steps_for(prompt, sch.chunk, self.cfg.tokens)
            params = context_params(n_ubatch=sch.ubatch, n_threads=sch.threads, flash_attn=sch.flash_attn, trace=True)
            reqs = [{**r, "trace": "all"} for r in script_steps(steps, logits_mode="last")]
            with open_target(self.cfg.target, timeout=self.cfg.timeout) as t:
                out = t.pipeline([("load", {"path": str(self.fixture), **params}), script_request(reqs, reset=True)])
            self.routed[sch] = token_rows([x.get("nodes") or [] for x in out[-1].data["results"]],
                                          [len(st.tokens) for st in steps]) if len(out) == 2 and out[-1].ok else None
        return self.routed[sch]

    def _chains(self, sch: Schedule, steps: list[Step], ref: Trace, params: dict[str, Any]) -> list[dict[str, Any]]:
        """Each cut set's K-stage chain under the schedule, against the full model's first run under it: a row per
        chain (pass, finding where it first differs, unsupported, or crash)."""
        out = []
        tokens = [so.tokens for so in ref.steps]
        for cuts in self.sets:
            at = {"case": "chain", "schedule": sch.name, "cuts": cuts}
            stages = self.st.stages(cuts)
            if isinstance(stages, Unsupported):
                out.append({**at, "status": UNSUPPORTED, "reason": str(stages)})
                continue
            ts = self.stage_targets[:len(stages)]
            failed = next((r.failure for k, ((path, _), t) in enumerate(zip(stages, ts, strict=True))
                           if not (r := t.load(str(path), **{**params, "capture": k < len(stages) - 1})).ok), None)
            chain = None
            if failed is None:
                chain, fail = run_chain(ts, [st.n_layer for _, st in stages], steps, tokens, logits_mode="all",
                                        n_pos_per_token=self.n_pos)
                failed = fail.failure if fail else None
            if failed is not None:
                out.append({**at, "status": failure_status(failed), "phase": "crash", "reason": failed.message})
                continue
            div, worst = compare(ref, chain, steps, cuts)
            out.append({**at, "status": PASS, "max_abs": worst} if div is None else
                       {**at, "status": FINDING, "max_abs": worst, "phase": "chain-parity", "step": div.step,
                        "stage": div.stage, "where": div.where})
        return out


def format_report(rep: dict[str, Any]) -> str:
    lines = [f"determinism {rep['fixture']}: arch {rep['arch']}, {rep['n_layer']} layers {rep['kinds']}, "
             f"target {rep['target']}, {rep['summary']['schedules']} schedules x {rep['config']['repeats']} runs"]
    same_ok = sum(s["bit_exact"] for s in rep["same_schedule"])
    lines.append(f"same schedule, repeated: {same_ok}/{len(rep['same_schedule'])} bit-exact  (policy: "
                 f"{rep['policy']['same-schedule']})")
    for cls in ("threads-only", "ubatch/chunking/flash-attn"):
        ps = [p for p in rep["pairs"] if p["class"] == cls]
        exact = sum(p["bit_exact"] for p in ps)
        worst = max((p["max_abs"] for p in ps), default=0.0)
        tok = sum(p["tokens_equal"] for p in ps)
        lines.append(f"{cls} pairs: {exact}/{len(ps)} bit-exact, tokens equal {tok}/{len(ps)}, "
                     f"max |Δlogit| {worst:.3g}  (policy: {rep['policy'][cls]})")
    c = rep.get("rounding_control")
    lines.append(f"rounding control: {c['detail']} (schedule {c['schedule']}): kernel pairs within "
                 f"{ROUNDING_FACTOR:g}× that (NMSE {ROUNDING_FACTOR * c['nmse']:.2g}) are rounding" if c else
                 "rounding control: none (no stage of this model can be fed the residual): logit moves with the same "
                 f"tokens are reported, not judged; flips only at a margin below {NEAR_TIE:g}")
    for p in rep["pairs"]:
        if p.get("cause") and p["tokens_equal"]:
            lines.append(f"  |Δlogit| {p['max_abs']:.3g} ({p['pair'][0]} vs {p['pair'][1]}), past kernel rounding: "
                         f"{p['cause']['kind']}: {p['cause']['detail']}")
    not_exact = [f"{a} vs {b}" for a, b in rep["summary"]["not_bit_exact_pairs"]]
    if not_exact:
        lines.append("not bit-exact upstream: " + "; ".join(not_exact[:8]) + (" ..." if len(not_exact) > 8 else ""))
    for c in rep["chains"]:
        if c["status"] != "pass":
            lines.append(f"chain {c['cuts']} under {c['schedule']}: {c['status']} {c.get('reason', '')}")
    for f in rep["findings"]:
        lines.append(f"FINDING [{f['class']}] {f['message']}")
        node = f.get("node") or {}
        if describe_node(node):
            lines.append(f"  first differing graph node at step {node['step']}: {describe_node(node)}")
        elif node:
            lines.append(f"  {node['kind']}: {node['detail']}")
    for f in rep.get("numerics", ()):
        lines.append(f"NUMERICS (not a finding) [{f['class']}] {f['message']}; cause: {f['cause']['detail']}")
    lines.append(f"{len(rep['findings'])} findings" + (f", {len(rep['numerics'])} numerics" if rep.get("numerics")
                                                      else "") + f"; wall {rep['timing']['wall_s']:.2f}s")
    return "\n".join(lines)


# ---- the oracle contract ---------------------------------------------------------------------------------
def pair_status(p: dict[str, Any]) -> str:
    """A schedule pair in the status vocabulary: bit-exact passes; a threads-only pair that is not is a finding, as
    is a greedy token flip at a clear margin or logits moving past the model's rounding with the same tokens, unless
    a traced routing choice at a near-tie explains it (its `cause`); any other kernel difference is numerics (not
    promised upstream)."""
    if p["bit_exact"]:
        return PASS
    excused = (p.get("cause") or {}).get("kind") == "routing flip"
    clear_flip = not p["tokens_equal"] and not p.get("near_tie") and not excused
    jump = p.get("jump") and not excused
    return FINDING if p["class"] == "threads-only" or clear_flip or jump else NUMERICS


def report(fixture: Path, cfg: DeterminismConfig) -> Report:
    return Determinism(fixture, cfg).report()


def only_schedule(config: dict[str, Any], f: Finding) -> dict[str, Any]:
    """A finding about one schedule (a crash, repeated runs that differ) narrowed to that schedule."""
    name = f.detail.get("schedule")
    sch = next((s for s in Determinism.schedules_of(config) if s.name == name), None)
    if sch is None:
        return config
    return {**config, "threads": [sch.threads], "ubatch": [sch.ubatch], "chunks": [sch.chunk],
            "flash_attn": [sch.flash_attn]}


ORACLE = Oracle(name="determinism", config=DeterminismConfig, run=report, narrow=only_schedule,
                format=lambda rep: format_report(rep.native), shrink=(("tokens", 1), ("repeats", 2)),
                case_fields=("threads", "ubatch", "chunks", "flash_attn", "repeats", "tokens", "cuts", "stages",
                             "prompt_len", "prompt", "seed"))
