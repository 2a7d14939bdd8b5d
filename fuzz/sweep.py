"""`fuzz sweep`: for every cut set, the full model vs the K-stage chain, bit for bit, localized.

Per fixture: one reference run (every layer's residual captured) and one control run (the full model fed its
own token-embedding rows through batch.embd, which separates "input path broken" from "slicing broken").
Per cut set: each stage is its own llama.cpp context in its own worker; prefill passes the hidden states of
the whole chunk across each boundary, decode one token's state per step, batched decode several sequences
per step. A divergence is re-run with every stage layer captured: it must reproduce, and it is localized to
the first layer whose output differs.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fuzz.parity import (
    Divergence,
    RunFailure,
    Trace,
    compare,
    localize,
    pos_per_token,
    run_chain,
    run_script,
    script_steps,
    tokens_equal,
)
from fuzz.schedule import PHASES, Schedule, build_schedule
from fuzz.stages import FixtureStages, Slicer, stage_ranges
from synth.errors import UserError
from synth.families import family_for_arch
from synth.gguf_io import token_embeddings
from synth.stage import Unsupported
from targets import Failure, Target, close_all, open_target

STATUSES = ("pass", "diverged", "unsupported", "crash", "timeout")


@dataclass
class SweepConfig:
    cuts: str = "all"  # all | period | "3;5;2,6" (cut sets separated by ';', cuts by ',')
    stages: int = 2
    tokens: int = 32
    prompt_len: int = 24
    chunk: int = 7
    n_seq: int = 3
    phases: tuple[str, ...] = PHASES
    period: int | None = None
    target: str = "llama-cpp"
    timeout: float = 120.0
    seed: int = 0
    workdir: Path | None = None  # where stage files go (default: a temporary directory)
    jobs: int = 0  # cut sets run concurrently, each lane with its own stage workers (0: one per core, ≤ 2)


@dataclass
class CutResult:
    cuts: list[int]
    stages: list[list[int]]
    status: str
    phase: str | None = None
    step: int | None = None
    position: int | None = None
    seq: int | None = None
    stage: int | None = None
    where: str | None = None
    layer: int | str | None = None
    max_abs_dlogit: float = 0.0
    tokens_equal: bool | None = None
    reproduced: bool | None = None
    reason: str | None = None
    pads: dict[str, list[int]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None and v != {}}


@dataclass
class SweepReport:
    fixture: str
    sha256: str
    arch: str
    n_layer: int
    kinds: str
    target: str
    llama_cpp_commit: str | None
    config: dict[str, Any]
    control: dict[str, Any]
    results: list[CutResult]
    timing: dict[str, float]

    @property
    def summary(self) -> dict[str, int]:
        return {s: sum(r.status == s for r in self.results) for s in STATUSES}

    @property
    def exit_code(self) -> int:
        bad = any(r.status in ("diverged", "crash", "timeout") for r in self.results)
        return 1 if bad or self.control.get("status") not in ("pass", "unsupported", None) else 0

    def to_dict(self) -> dict[str, Any]:
        return {"fixture": self.fixture, "sha256": self.sha256, "arch": self.arch, "n_layer": self.n_layer,
                "kinds": self.kinds, "target": self.target, "llama_cpp_commit": self.llama_cpp_commit,
                "config": self.config, "control": self.control, "summary": self.summary,
                "results": [r.to_dict() for r in self.results], "timing": self.timing}


# ---- cut sets -------------------------------------------------------------------------------------------
def cut_sets(spec: str, n_layer: int, stages: int, period: int) -> list[list[int]]:
    if n_layer < 2:
        raise UserError(f"the model has {n_layer} layer; a split needs at least 2")
    if stages < 2 or stages > n_layer:
        raise UserError(f"--stages {stages}: must be in 2..{n_layer} (the model has {n_layer} layers)")
    singles = list(range(1, n_layer))
    if spec == "none":
        return [[]]  # one stage: the whole model (state hand-off and determinism of the unsplit model)
    if spec == "all":
        pool = singles
    elif spec == "period":
        # every cut offset modulo the interleave period: the first cut with each residue
        seen: dict[int, int] = {}
        for c in singles:
            seen.setdefault(c % period, c)
        pool = sorted(seen.values())
    else:
        sets = []
        for part in spec.split(";"):
            try:
                cs = sorted(int(x) for x in part.replace(" ", "").split(",") if x)
            except ValueError:
                raise UserError(f"--cuts {spec!r}: expected all, period, or cut lists like '3;5;2,6'") from None
            if not cs or any(not 0 < c < n_layer for c in cs) or len(set(cs)) != len(cs):
                raise UserError(f"--cuts {spec!r}: each cut must be in 1..{n_layer - 1}, distinct within a set")
            sets.append(cs)
        return sets
    sets = [[c] for c in pool] if stages == 2 else \
        [list(cs) for cs in itertools.combinations(pool if spec == "period" else singles, stages - 1)]
    if not sets:
        raise UserError(f"--cuts {spec} --stages {stages}: no cut sets (only {len(pool)} cut offset(s) with period "
                        f"{period}); use fewer --stages or --cuts all")
    return sets


# ---- the sweep ------------------------------------------------------------------------------------------
class Sweep:
    def __init__(self, fixture: Path, cfg: SweepConfig, *, slicer: Slicer | None = None):
        """slicer materializes a stage file (default: synth.stage, reading the source once); tests inject
        broken ones to prove the oracle catches them."""
        self.fixture = Path(fixture)
        self.cfg = cfg
        self.st = FixtureStages(self.fixture, slicer=slicer, period=cfg.period)
        self.info, self.kinds, self.period = self.st.info, self.st.kinds, self.st.period
        self.embd_refused = self.st.embd_refused
        self.decode_seconds = 0.0
        self._lock = threading.Lock()

    def _add_time(self, seconds: float) -> None:
        with self._lock:
            self.decode_seconds += seconds

    def run(self) -> SweepReport:
        cfg = self.cfg
        t_start = time.perf_counter()
        sets = cut_sets(cfg.cuts, self.info.n_layer, cfg.stages, self.period)
        n_stages = max(len(s) for s in sets) + 1
        jobs = max(1, min(cfg.jobs or min(2, os.cpu_count() or 1), len(sets)))
        ref = open_target(cfg.target, timeout=cfg.timeout)
        lanes = [[open_target(cfg.target, timeout=cfg.timeout) for _ in range(n_stages)] for _ in range(jobs)]
        everyone = [ref, *(t for lane in lanes for t in lane)]
        with self.st.workspace(cfg.workdir):
            try:
                for t in everyone:  # spawn all workers at once; their start-up overlaps
                    t.start()
                results, control, commit = self._run(sets, ref, lanes)
            finally:
                close_all(everyone)
        wall = time.perf_counter() - t_start
        return SweepReport(
            fixture=str(self.fixture), sha256=hashlib.sha256(self.fixture.read_bytes()).hexdigest(),
            arch=self.info.arch, n_layer=self.info.n_layer, kinds=self.kinds, target=cfg.target,
            llama_cpp_commit=commit,
            config={"cuts": cfg.cuts, "stages": cfg.stages, "period": self.period, "tokens": cfg.tokens,
                    "prompt_len": cfg.prompt_len, "chunk": cfg.chunk, "n_seq": cfg.n_seq,
                    "phases": list(cfg.phases), "seed": cfg.seed, "jobs": jobs},
            control=control, results=results,
            timing={"wall_s": round(wall, 4), "llama_decode_s": round(self.decode_seconds, 4),
                    "ratio": round(wall / self.decode_seconds, 2) if self.decode_seconds else 0.0})

    def _load_params(self, sched: Schedule) -> dict[str, Any]:
        return {"n_ctx": 256, "n_batch": 64, "n_ubatch": 64, "n_seq_max": sched.n_seq}

    def _run(self, sets: list[list[int]], ref: Target, lanes: list[list[Target]]):
        cfg = self.cfg
        sched = build_schedule(n_vocab=self.info.n_vocab, prompt_len=cfg.prompt_len, chunk=cfg.chunk,
                               n_decode=cfg.tokens, n_seq=cfg.n_seq, seed=cfg.seed, phases=cfg.phases)
        params = self._load_params_cache = self._load_params(sched)
        loaded = ref.load(str(self.fixture), **params)
        if not loaded.ok:
            if loaded.failure.kind == "error":
                raise UserError(f"{self.fixture}: the target cannot load the full model: {loaded.failure.message}")
            raise UserError(f"{self.fixture}: the full model {loaded.failure.kind}es the target: "
                            f"{loaded.failure.message}")
        commit = loaded.data.get("llama_cpp_commit")
        self.n_pos = pos_per_token(loaded.data)

        refs: dict[str, Trace] = {}
        for name, steps in sched.runs().items():
            ref.reset()
            # a model that refuses embedding input cannot be split after layer 0: nothing to capture
            capture = [] if self.embd_refused else list(range(self.info.n_layer))
            tr = run_script(ref, script_steps(steps, capture=capture))
            if isinstance(tr, Failure):
                raise UserError(f"{self.fixture}: the full model fails in the target ({tr.message}); "
                                "fix the fixture before sweeping it")
            self._add_time(tr.decode_seconds)
            refs[name] = tr
        control = self._control(ref, sched, refs["sequential"]) if "sequential" in refs else \
            {"status": "unsupported", "reason": "no sequential phase"}
        for cuts in sets:  # materialize every stage up front (lanes then only read files)
            self.st.stages(cuts)

        free: queue.Queue[list[Target]] = queue.Queue()
        for lane in lanes:
            free.put(lane)

        def one(cuts: list[int]) -> CutResult:
            lane = free.get()
            try:
                return self._cut(cuts, sched, refs, lane, params)
            finally:
                free.put(lane)

        with ThreadPoolExecutor(max_workers=len(lanes)) as pool:
            results = list(pool.map(one, sets))
        return results, control, commit

    def _control(self, ref: Target, sched: Schedule, tr: Trace) -> dict[str, Any]:
        """The full model fed its own token embeddings through batch.embd must equal token input, bit for bit."""
        if self.embd_refused:
            return {"status": "unsupported", "reason": self.embd_refused}
        try:
            table = token_embeddings(self.fixture)
        except UserError as e:
            return {"status": "unsupported", "reason": str(e)}
        steps = sched.sequential
        embd = [table[np.array(so.tokens)] for so in tr.steps]
        fam = family_for_arch(self.info.arch)
        if fam is not None and fam.token_scale:  # the model scales token input only: do what token input gets
            scale = np.sqrt(np.float32(self.info.n_embd))
            embd = [e * scale for e in embd]
        ref.reset()
        ctl = run_script(ref, script_steps(steps, embd=embd, capture=list(range(self.info.n_layer)),
                                           n_pos_per_token=self.n_pos))
        if isinstance(ctl, Failure):
            return {"status": ctl.kind, "reason": ctl.message}
        self._add_time(ctl.decode_seconds)
        div, worst = compare(tr, [ctl], steps, [])
        if div is None:
            return {"status": "pass", "max_abs_dlogit": worst}
        n = self.info.n_layer
        layer = localize(tr, [ctl], [(0, n, list(range(n)), [])], div.step)
        return {"status": "diverged", "phase": div.phase, "position": div.position, "layer": layer,
                "max_abs_dlogit": worst,
                "reason": "embedding-input path differs from token input (not a slicing problem)"}

    def _cut(self, cuts: list[int], sched: Schedule, refs: dict[str, Trace], stage_targets: list[Target],
             params: dict[str, Any]) -> CutResult:
        ranges = stage_ranges(cuts, self.info.n_layer)
        res = CutResult(cuts=cuts, stages=ranges, status="pass")
        stages = self.st.stages(cuts)
        if isinstance(stages, Unsupported):
            res.status, res.reason = "unsupported", str(stages)
            return res
        res.pads = {f"{st.first}:{st.last}": st.pads for _, st in stages if st.pads}
        targets = stage_targets[:len(stages)]
        for k, ((path, st), t) in enumerate(zip(stages, targets, strict=True)):
            r = t.load(str(path), **params, capture=k < len(stages) - 1)  # the final stage captures nothing
            if not r.ok:
                return self._failed(res, RunFailure(r.failure, ranges.index([st.first, st.last])), "load")
        sizes = [st.n_layer for _, st in stages]
        for name, steps in sched.runs().items():
            ref_tr = refs[name]
            tokens = [so.tokens for so in ref_tr.steps]
            for t in targets:
                t.reset()
            chain, fail = run_chain(targets, sizes, steps, tokens, n_pos_per_token=self.n_pos)
            self._add_time(sum(tr.decode_seconds for tr in chain))
            if fail is not None:
                return self._failed(res, fail, name)
            div, worst = compare(ref_tr, chain, steps, cuts)
            res.max_abs_dlogit = max(res.max_abs_dlogit, worst)
            teq = tokens_equal(ref_tr, chain)
            res.tokens_equal = teq if res.tokens_equal is None else res.tokens_equal and teq
            if div is not None:
                return self._diverged(res, div, targets, stages, steps, tokens, ref_tr, cuts)
        return res

    def _diverged(self, res: CutResult, div: Divergence, targets, stages, steps, tokens, ref_tr: Trace,
                  cuts: list[int]) -> CutResult:
        """Reproduce with every stage layer captured, and localize the first differing layer."""
        for (path, _), t in zip(stages, targets, strict=True):
            r = t.load(str(path), **self._load_params_cache, capture=True)
            if not r.ok:
                return self._failed(res, RunFailure(r.failure, targets.index(t)), div.phase)
        chain, fail = run_chain(targets, [st.n_layer for _, st in stages], steps, tokens, capture_all=True,
                                n_pos_per_token=self.n_pos)
        again = None if fail is not None else compare(ref_tr, chain, steps, cuts)[0]
        res.status = "diverged"
        res.reproduced = again is not None and (again.step, again.stage) == (div.step, div.stage)
        res.phase, res.step, res.position, res.seq = div.phase, div.step, div.position, div.seq
        res.stage, res.where = div.stage, div.where
        if res.reproduced:
            # against the ranges the cut set asked for, not what the slicer says it produced
            res.layer = localize(ref_tr, chain, [(a, b, st.layers, st.pads)
                                                 for (a, b), (_, st) in zip(res.stages, stages, strict=True)], div.step)
        else:
            res.reason = "did not reproduce on a second run (nondeterministic)"
        return res

    def _failed(self, res: CutResult, fail: RunFailure, phase: str) -> CutResult:
        f = fail.failure
        res.status = "timeout" if f.kind == "timeout" else "crash"
        res.stage = fail.stage
        res.phase = phase
        res.reason = ("stage rejected: " if f.kind == "error" else "") + f.message
        return res


def format_report(rep: SweepReport) -> str:
    lines = [f"sweep {rep.fixture}: arch {rep.arch}, {rep.n_layer} layers {rep.kinds}, target {rep.target}, "
             f"llama.cpp {str(rep.llama_cpp_commit)[:9]}",
             f"control (full model, embedding input): {rep.control.get('status')}"
             + (f" — {rep.control['reason']}" if rep.control.get("reason") else ""),
             f"{'cuts':<12} {'status':<11} {'phase':<9} {'pos':>4} {'stage':>5} {'layer':>6} {'max|Δ|':>9}  note"]
    for r in rep.results:
        note = r.reason or (f"pad {r.pads}" if r.pads else "")
        if r.status == "diverged":
            note = f"{r.where} differs; reproduced={r.reproduced}" + (f"; {r.reason}" if r.reason else "")
        lines.append(f"{','.join(map(str, r.cuts)):<12} {r.status:<11} {r.phase or '':<9} "
                     f"{'' if r.position is None else r.position:>4} {'' if r.stage is None else r.stage:>5} "
                     f"{'' if r.layer is None else r.layer:>6} {r.max_abs_dlogit:>9.2e}  {note}")
    s = rep.summary
    lines.append(f"{len(rep.results)} cut sets: " + ", ".join(f"{v} {k}" for k, v in s.items() if v)
                 + f"; wall {rep.timing['wall_s']:.2f}s, llama_decode {rep.timing['llama_decode_s']:.2f}s")
    return "\n".join(lines)
