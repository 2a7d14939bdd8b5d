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
from synth.stage import StageInfo, Unsupported
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
    jobs: int = 0  # pipelines of stage workers run side by side (0: cores ÷ stages, at least 1, at most 4)


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


@dataclass
class _Job:
    """One cut set on its way through a pipeline of stage workers."""

    index: int
    res: CutResult
    stages: list[tuple[Path, StageInfo]] | None  # None: unsupported (res says why)
    traces: dict[str, list[Trace]] = field(default_factory=dict)  # run name → one trace per stage done
    failures: dict[str, tuple[str, RunFailure]] = field(default_factory=dict)  # run name → (phase, failure)
    error: BaseException | None = None  # a bug in the engine, re-raised on the main thread


class _Thread(threading.Thread):
    """A daemon thread running fn(stop_event, *args), started at once; keeps what it returned (.result) or
    raised (.error)."""

    def __init__(self, fn: Any, *args: Any):
        self.stop = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None
        super().__init__(daemon=True)
        self._call = (fn, args)
        self.start()

    def run(self) -> None:
        try:
            fn, args = self._call
            self.result = fn(self.stop, *args)
        except BaseException as e:  # noqa: BLE001 — re-raised by the thread that joins this one
            self.error = e


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
        n_pipes = max(1, min(cfg.jobs or min(4, (os.cpu_count() or 1) // n_stages), len(sets)))
        ref = open_target(cfg.target, timeout=cfg.timeout)
        # the reference worker becomes pipeline 0's first stage once the reference runs are done
        pipes = [[ref if p == s == 0 else open_target(cfg.target, timeout=cfg.timeout) for s in range(n_stages)]
                 for p in range(n_pipes)]
        everyone = [t for pipe in pipes for t in pipe]
        with self.st.workspace(cfg.workdir):
            try:
                for t in everyone:  # spawn all workers at once; their start-up overlaps
                    t.start()
                results, control, commit = self._run(sets, ref, pipes)
            finally:
                close_all(everyone)
        wall = time.perf_counter() - t_start
        return SweepReport(
            fixture=str(self.fixture), sha256=hashlib.sha256(self.fixture.read_bytes()).hexdigest(),
            arch=self.info.arch, n_layer=self.info.n_layer, kinds=self.kinds, target=cfg.target,
            llama_cpp_commit=commit,
            config={"cuts": cfg.cuts, "stages": cfg.stages, "period": self.period, "tokens": cfg.tokens,
                    "prompt_len": cfg.prompt_len, "chunk": cfg.chunk, "n_seq": cfg.n_seq,
                    "phases": list(cfg.phases), "seed": cfg.seed, "jobs": n_pipes},
            control=control, results=results,
            timing={"wall_s": round(wall, 4), "llama_decode_s": round(self.decode_seconds, 4),
                    "ratio": round(wall / self.decode_seconds, 2) if self.decode_seconds else 0.0})

    def _load_params(self, sched: Schedule) -> dict[str, Any]:
        return {"n_ctx": 256, "n_batch": 64, "n_ubatch": 64, "n_seq_max": sched.n_seq}

    def _run(self, sets: list[list[int]], ref: Target, pipes: list[list[Target]]):
        """Reference runs on `ref` while another thread materializes the stages, and the control run on pipeline
        0's last worker; then the cut sets flow through pipelines of stage workers (worker s runs stage s of one
        cut set while worker s+1 runs stage s+1 of the previous one); divergences are reproduced and localized
        last."""
        cfg = self.cfg
        sched = build_schedule(n_vocab=self.info.n_vocab, prompt_len=cfg.prompt_len, chunk=cfg.chunk,
                               n_decode=cfg.tokens, n_seq=cfg.n_seq, seed=cfg.seed, phases=cfg.phases)
        self._sched, self._params = sched, self._load_params(sched)
        jobs: queue.Queue[_Job | None] = queue.Queue()
        feeder = _Thread(self._materialize, sets, jobs, len(pipes))
        try:
            ctl = pipes[0][-1]
            refs, commit, control = self._reference(ref, sched, None if ctl is ref else ctl)
            self._refs = refs
            if not isinstance(control, _Thread):
                control = _Thread(lambda _stop, c=control: c)
            done: queue.Queue[_Job | None] = queue.Queue()
            threads = []
            for pipe in pipes:
                inbox = jobs
                for s, t in enumerate(pipe):
                    outbox = done if s == len(pipe) - 1 else queue.Queue()
                    # the control run's worker starts on stages once the control run is done
                    threads.append(_Thread(self._stage_loop, s, t, inbox, outbox, control if t is ctl else None))
                    inbox = outbox
            finished: dict[int, _Job] = {}
            ends = 0
            while ends < len(pipes):
                job = done.get()
                if job is None:
                    ends += 1
                else:
                    finished[job.index] = job
            for th in [feeder, control, *threads]:
                th.join()
                if th.error is not None:
                    raise th.error
        finally:
            feeder.stop.set()  # a failed reference (or anything else) stops the materializing early
            feeder.join()
        for job in finished.values():
            if job.error is not None:
                raise job.error
        assert sorted(finished) == list(range(len(sets))), "a cut set went missing in the pipeline"
        return [self._verdict(finished[i], pipes[0]) for i in range(len(sets))], control.result, commit

    def _reference(self, ref: Target, sched: Schedule, ctl: Target | None):
        """The full model's runs on `ref`, every layer captured. The control run goes to `ctl` (a thread,
        started once the sequential run's tokens are known) or, without one, runs on `ref` afterwards.
        Returns (traces by run name, llama.cpp commit, control result or the thread computing it)."""
        loaded = ref.load(str(self.fixture), **self._params)
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
            if name == "sequential" and ctl is not None:
                control = _Thread(self._control_on, ctl, sched, tr)
        if "sequential" not in refs:
            control = {"status": "unsupported", "reason": "no sequential phase"}
        elif ctl is None:
            control = self._control(ref, sched, refs["sequential"])
        return refs, commit, control

    def _control_on(self, _stop: threading.Event, ctl: Target, sched: Schedule, tr: Trace) -> dict[str, Any]:
        loaded = ctl.load(str(self.fixture), **self._params)
        if not loaded.ok:
            return {"status": loaded.failure.kind, "reason": f"the control worker cannot load the full model: "
                    f"{loaded.failure.message}"}
        return self._control(ctl, sched, tr)

    def _materialize(self, stop: threading.Event, sets: list[list[int]], jobs: queue.Queue, n_pipes: int) -> None:
        """Write every stage file, in cut-set order, handing each cut set on as soon as its stages exist."""
        try:
            for i, cuts in enumerate(sets):
                if stop.is_set():
                    return
                res = CutResult(cuts=cuts, stages=stage_ranges(cuts, self.info.n_layer), status="pass")
                stages = self.st.stages(cuts)
                if isinstance(stages, Unsupported):
                    res.status, res.reason = "unsupported", str(stages)
                    jobs.put(_Job(i, res, None))
                else:
                    res.pads = {f"{st.first}:{st.last}": st.pads for _, st in stages if st.pads}
                    jobs.put(_Job(i, res, stages))
        finally:
            for _ in range(n_pipes):
                jobs.put(None)

    def _stage_loop(self, _stop: threading.Event, s: int, t: Target, inbox: queue.Queue, outbox: queue.Queue,
                    after: threading.Thread | None) -> None:
        try:
            if after is not None:  # t is busy until then
                after.join()
            while (job := inbox.get()) is not None:
                if job.error is None:
                    try:
                        self._run_stage(job, s, t)
                    except BaseException as e:  # noqa: BLE001 — handed to the main thread, which re-raises it
                        job.error = e
                outbox.put(job)
        finally:
            outbox.put(None)  # the end of this pipeline, even if this loop broke

    def _run_stage(self, job: _Job, s: int, t: Target) -> None:
        """Stage s of one cut set, every run whose earlier stages completed (in run order, to the first failure)."""
        if job.stages is None or s >= len(job.stages):
            return
        path, st = job.stages[s]
        last = s == len(job.stages) - 1
        names = [n for n in self._sched.runs() if len(job.traces.get(n, ())) == s]
        if not names:
            return
        r = t.load(str(path), **self._params, capture=not last)  # the final stage captures nothing
        if not r.ok:
            job.failures.setdefault(names[0], ("load", RunFailure(r.failure, s)))
            return
        for name in names:
            steps = self._sched.runs()[name]
            t.reset()
            if s == 0:
                reqs = script_steps(steps, tokens=self._tokens(name), capture=[] if last else [st.n_layer - 1])
            else:
                prev = job.traces[name][s - 1]
                width = job.stages[s - 1][1].n_layer
                reqs = script_steps(steps, embd=[so.captures[width - 1] for so in prev.steps],
                                    capture=[] if last else [st.n_layer - 1], n_pos_per_token=self.n_pos)
            tr = run_script(t, reqs)
            if isinstance(tr, Failure):
                job.failures[name] = (name, RunFailure(tr, s))
                return
            self._add_time(tr.decode_seconds)
            job.traces.setdefault(name, []).append(tr)

    def _tokens(self, name: str) -> list[list[int]]:
        return [so.tokens for so in self._refs[name].steps]

    def _verdict(self, job: _Job, targets: list[Target]) -> CutResult:
        """Compare each run (in run order) with the reference; reproduce and localize the first divergence."""
        res = job.res
        if job.stages is None:
            return res
        cuts = res.cuts
        for name, steps in self._sched.runs().items():
            if name in job.failures:
                phase, fail = job.failures[name]
                return self._failed(res, fail, phase)
            ref_tr, chain = self._refs[name], job.traces[name]
            div, worst = compare(ref_tr, chain, steps, cuts)
            res.max_abs_dlogit = max(res.max_abs_dlogit, worst)
            teq = tokens_equal(ref_tr, chain)
            res.tokens_equal = teq if res.tokens_equal is None else res.tokens_equal and teq
            if div is not None:
                return self._diverged(res, div, targets[:len(job.stages)], job.stages, steps, self._tokens(name),
                                      ref_tr, cuts)
        return res

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

    def _diverged(self, res: CutResult, div: Divergence, targets, stages, steps, tokens, ref_tr: Trace,
                  cuts: list[int]) -> CutResult:
        """Reproduce with every stage layer captured, and localize the first differing layer."""
        for (path, _), t in zip(stages, targets, strict=True):
            r = t.load(str(path), **self._params, capture=True)
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
