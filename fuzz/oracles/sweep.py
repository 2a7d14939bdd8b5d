"""`fuzz sweep`: for every cut set, the full model vs the K-stage chain, bit for bit, localized.

Per fixture: one reference run (every layer's residual captured) and one control run (the full model fed its
own token-embedding rows through batch.embd, which separates "input path broken" from "slicing broken").
Per cut set: each stage is its own llama.cpp context in its own worker; prefill passes the hidden states of
the whole chunk across each boundary, decode one token's state per step, batched decode several sequences
per step. A divergence is re-run with every stage layer captured: it must reproduce, and it is localized to
the first layer whose output differs.
"""

from __future__ import annotations

import heapq
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from fuzz.engine.case_oracle import CaseOracle, finding_of
from fuzz.engine.contract import (
    FAILING,
    FINDING,
    Finding,
    Oracle,
    Report,
    select,
)
from fuzz.engine.fleet import Fleet, failure_reason, failure_status, fixture_header
from fuzz.engine.parity import (
    Divergence,
    RunFailure,
    Trace,
    compare,
    context_params,
    describe_node,
    first_differing_node,
    first_row_diff,
    localize,
    pos_per_token,
    run_script,
    script_steps,
    script_trace,
    tokens_equal,
    traced_steps,
)
from fuzz.engine.progress import Progress
from fuzz.engine.schedule import Schedule, batch_width, build_schedule, main_prompt
from fuzz.engine.stages import FixtureStages, Slicer, cut_sets, stage_ranges
from fuzz.oracles.sweep_report import CutResult, SweepConfig, SweepReport, format_report
from synth.errors import UserError
from synth.families import family_for_arch
from synth.gguf_io import token_embeddings
from synth.stage import StageInfo, Unsupported
from targets import Failure, Reply, Target
from targets.target import script_request


@dataclass
class _Job:
    """One cut set on its way through the stage workers."""

    index: int
    res: CutResult
    stages: list[tuple[Path, StageInfo]] | None  # None: unsupported (res says why)
    traces: dict[str, list[Trace]] = field(default_factory=dict)  # run name → one trace per stage done
    failures: dict[str, tuple[str, RunFailure]] = field(default_factory=dict)  # run name → (phase, failure)
    rows: list[dict[str, Any]] = field(default_factory=list)  # its result (Sweep.judge), once its last stage is done
    # a divergence, its run's name and that run again with every stage layer captured (Sweep.again, for explain)
    again: tuple[Divergence, str, list[Trace]] | None = None
    error: BaseException | None = None  # a bug in the engine, re-raised on the main thread


class _Tasks:
    """(cut set, stage) tasks whose input is ready, for any free worker: the task with the most work left
    in its chain first (list scheduling by bottom level: long chains start early, the smallest tasks come
    last and the workers finish together), then cut-set order. Ends when every cut set is finished or on
    abort."""

    def __init__(self, n_jobs: int, progress: Progress):
        self.progress = progress
        self.cond = threading.Condition()
        self.ready: list[tuple[int, int, int, int, _Job]] = []
        self.unfinished = n_jobs
        self.finished: dict[int, _Job] = {}
        self.aborted = False
        self._n = 0

    def put(self, job: _Job, stage: int) -> None:
        # work left ≈ layers to run, plus a load per stage (about two tiny layers' worth of decode time)
        left = sum(st.n_layer + 2 for _, st in job.stages[stage:])
        with self.cond:
            self._n += 1
            heapq.heappush(self.ready, (-left, job.index, self._n, stage, job))
            self.cond.notify()

    def get(self) -> tuple[_Job, int] | None:
        with self.cond:
            while not self.ready and self.unfinished and not self.aborted:
                self.cond.wait()
            if not self.ready or self.aborted:
                return None
            *_, stage, job = heapq.heappop(self.ready)
            return job, stage

    def finish(self, job: _Job) -> None:
        self.progress.advance()
        with self.cond:
            self.finished[job.index] = job
            self.unfinished -= 1
            if not self.unfinished:
                self.cond.notify_all()

    def abort(self) -> None:
        with self.cond:
            self.aborted = True
            self.cond.notify_all()


class _Thread(threading.Thread):
    """A daemon thread running fn(*args), started at once; keeps what it returned (.result) or raised (.error)."""

    def __init__(self, fn: Any, *args: Any):
        self.result: Any = None
        self.error: BaseException | None = None
        super().__init__(daemon=True)
        self._call = (fn, args)
        self.start()

    def run(self) -> None:
        try:
            fn, args = self._call
            self.result = fn(*args)
        except BaseException as e:  # noqa: BLE001 — re-raised by the thread that joins this one
            self.error = e


# ---- the sweep ------------------------------------------------------------------------------------------
class Sweep(CaseOracle[list[int]]):
    """On the skeleton (fuzz.engine.case_oracle), its cut sets run side by side (`checked`: every worker takes
    (cut set, stage) tasks as their inputs become ready); a divergence is reproduced and localized once all are
    done."""

    name, unit, sections = "sweep", "cut sets", ("control",)

    def __init__(self, fixture: Path, cfg: SweepConfig, *, slicer: Slicer | None = None):
        """slicer materializes a stage file (default: synth.stage, reading the source once); tests inject
        broken ones to prove the oracle catches them."""
        super().__init__(fixture, cfg)
        self.slicer = slicer
        self.decode_seconds = 0.0
        self.load_seconds = 0.0  # llama.cpp's model loads and context creations, summed over every worker
        self.write_seconds = 0.0  # writing stage files
        self._lock = threading.Lock()
        self._preload: dict[int, _Thread] = {}

    def _read_fixture(self) -> None:
        self.st = FixtureStages(self.fixture, slicer=self.slicer, period=self.cfg.period)
        self.info, self.period = self.st.info, self.st.period
        self.embd_refused = self.st.embd_refused

    def _add_time(self, seconds: float) -> None:
        with self._lock:
            self.decode_seconds += seconds

    def _loaded(self, r: Reply) -> Reply:
        if r.ok:
            with self._lock:
                self.load_seconds += float(r.data.get("load_seconds", 0.0))
        return r

    def open(self, fleet: Fleet) -> None:
        """Two workers (reference and control) start while the full model is sent to them and the fixture is read;
        more once the cut sets are known."""
        cfg = self.cfg
        most = cfg.workers or min(8, max(2, os.cpu_count() or 1))
        self.scope.callback(self._join_preloads)  # (bad input found while they load: let them end)
        workers = fleet.open(min(2, most), start=True)
        self._params = self._load_params(batch_width(cfg.n_seq, cfg.phases))
        self._preload = {id(t): _Thread(lambda t=t: t.load(str(self.fixture), **self._params)) for t in workers}
        self._read_fixture()
        self.sets = cut_sets(cfg.cuts, self.info.n_layer, cfg.stages, self.period, self.fixture)
        self.workers = workers + fleet.open(min(most, sum(len(s) + 1 for s in self.sets)) - len(workers), start=True)
        self.scope.enter_context(self.st.workspace(cfg.workdir))

    def _join_preloads(self) -> None:
        for th in self._preload.values():
            th.join()

    def cases(self) -> list[list[int]]:
        return self.sets

    def identity(self, cuts: list[int]) -> dict[str, Any]:
        return {"cuts": cuts, "stages": stage_ranges(cuts, self.info.n_layer)}

    def observe(self, cuts: list[int]) -> _Job:
        raise NotImplementedError("the sweep's cut sets are observed side by side (checked)")

    def checked(self, cases: list[list[int]], progress: Progress) -> Iterator[tuple[list[int], _Job,
                                                                                     list[dict[str, Any]]]]:
        progress.working(f"sweep {self.fixture.name}")
        for job in self._run(cases, self.workers, progress):
            yield job.res.cuts, job, job.rows

    def record(self, results: list[dict[str, Any]]) -> dict[str, Any]:
        cfg = self.cfg
        return {**fixture_header(self.fixture, self.info, target=cfg.target, commit=self.commit),
                "config": {"cuts": cfg.cuts, "stages": cfg.stages, "period": self.period, "tokens": cfg.tokens,
                           "prompt_len": cfg.prompt_len, "prompt": list(cfg.prompt), "chunk": cfg.chunk,
                           "n_seq": cfg.n_seq, "phases": list(cfg.phases), "seed": cfg.seed,
                           "workers": len(self.workers), "n_batch": self._params["n_batch"],
                           "n_ubatch": self._params["n_ubatch"]},
                "control": self.control}

    def timing(self, wall: float) -> dict[str, float]:
        return {"llama_decode_s": round(self.decode_seconds, 4),
                "ratio": round(wall / self.decode_seconds, 2) if self.decode_seconds else 0.0,
                "load_s": round(self.load_seconds, 4), "stage_write_s": round(self.write_seconds, 4),
                "stage_bytes": self.st.bytes_written}

    def native(self, data: dict[str, Any]) -> SweepReport:
        return SweepReport(**{k: data[k] for k in ("fixture", "sha256", "arch", "n_layer", "kinds", "target",
                                                   "llama_cpp_commit", "config", "control", "timing")},
                           results=[CutResult(**r) for r in data["results"]])

    def message(self, r: dict[str, Any]) -> str:
        what = f"cuts {','.join(map(str, r['cuts']))}: {r['status']}"
        if r["status"] == FINDING:
            what += f" in {r.get('phase')} at position {r.get('position')}, stage {r.get('stage')} {r.get('where')}"
            what += f", first differing layer {r['layer']}" if r.get("layer") is not None else ""
            what += f" (first node {describe_node(r['node'])})" if describe_node(r.get("node")) else ""
        if r.get("reason"):
            what += f": {r['reason']}"
        return what

    def finding(self, r: dict[str, Any]) -> Finding:
        """The batched phase's sequence stays in the detail, out of the fingerprint: fewer sequences may move it,
        the bug stays."""
        return finding_of(self.name, r, self.message(r), seq=None)

    def more_findings(self, data: dict[str, Any]) -> list[Finding]:
        ctl = data["control"]
        if ctl.get("status") not in FAILING:
            return []
        # the input path itself is broken: not one cut set's finding
        return [Finding(oracle="sweep", status=ctl["status"], phase="control", position=ctl.get("position"),
                        layer=ctl.get("layer"), message=f"control (full model, embedding input): "
                        f"{ctl['status']}: {ctl.get('reason')}", detail=ctl)]

    def _load_params(self, n_seq: int) -> dict[str, Any]:
        return context_params(n_seq=n_seq, n_ubatch=self.cfg.n_ubatch)

    def _load_full(self, t: Target) -> Reply:
        """Load the full model on t, or take the load started for it at the beginning."""
        th = self._preload.pop(id(t), None)
        if th is None:
            return self._loaded(t.load(str(self.fixture), **self._params))
        th.join()
        if th.error is not None:
            raise th.error
        return self._loaded(th.result)

    def _run(self, sets: list[list[int]], workers: list[Target], progress: Progress) -> list[_Job]:
        """The reference runs on the first worker while a thread materializes the stages, and the control run
        on the last; then every worker takes (cut set, stage) tasks as their inputs become ready, each stage
        loaded into a fresh context and each cut set judged as its last stage is done. The cut sets' jobs, in
        order."""
        cfg = self.cfg
        sched = build_schedule(n_vocab=self.info.n_vocab, prompt=main_prompt(cfg, self.info.n_vocab),
                               chunk=cfg.chunk, n_decode=cfg.tokens, n_seq=cfg.n_seq, seed=cfg.seed,
                               phases=cfg.phases)
        self._sched = sched
        tasks = _Tasks(len(sets), progress)
        feeder = _Thread(self._materialize, sets, tasks)
        try:
            ref, ctl = workers[0], workers[-1]
            self._refs, commit, control = self._reference(ref, sched, None if ctl is ref else ctl)
            if not isinstance(control, _Thread):
                control = _Thread(lambda c=control: c)
            for th in self._preload.values():  # a load nobody took: done before its worker takes tasks
                th.join()
            # the control run's worker takes tasks once the control run is done
            threads = [_Thread(self._work, t, tasks, control if t is ctl else None) for t in workers]
            for th in [feeder, control, *threads]:
                th.join()
                if th.error is not None:
                    raise th.error
        finally:
            tasks.abort()  # stops the feeder and the workers early if anything above failed
            feeder.join()
        for job in tasks.finished.values():
            if job.error is not None:
                raise job.error
        assert sorted(tasks.finished) == list(range(len(sets))), "a cut set went missing"
        self.ref, self.commit, self.control = ref, commit, control.result
        return [tasks.finished[i] for i in range(len(sets))]

    def _reference(self, ref: Target, sched: Schedule, ctl: Target | None):
        """The full model's runs, every layer captured: on `ref`, and with a second worker `ctl` the batched run
        there at the same time. The control run follows on `ctl` in a thread (or on `ref`, without one).
        Returns (traces by run name, llama.cpp commit, control result or the thread computing it)."""
        names = list(sched.runs())
        aside = [n for n in names if n == "batched" and len(names) > 1] if ctl is not None else []
        side = _Thread(self._reference_runs, ctl, sched, aside) if aside else None
        try:
            commit, refs = self._reference_runs(ref, sched, [n for n in names if n not in aside])
        finally:
            if side is not None:
                side.join()
        if side is not None:
            if side.error is not None:
                raise side.error
            refs.update(side.result[1])
        refs = {n: refs[n] for n in names}
        if "sequential" not in refs:
            control: Any = {"status": "unsupported", "reason": "no sequential phase"}
        elif ctl is None:
            control = self._control(ref, sched, refs["sequential"])
        else:
            control = _Thread(self._control_on, ctl, sched, refs["sequential"], bool(aside))
        return refs, commit, control

    def _reference_runs(self, t: Target, sched: Schedule, names: list[str]) -> tuple[str | None, dict[str, Trace]]:
        loaded = self._load_full(t)
        if not loaded.ok:
            if loaded.failure.kind == "error":
                raise UserError(f"{self.fixture}: the target cannot load the full model: {loaded.failure.message}")
            raise UserError(f"{self.fixture}: the full model {loaded.failure.kind}es the target: "
                            f"{loaded.failure.message}")
        self.n_pos = pos_per_token(loaded.data)
        refs: dict[str, Trace] = {}
        # a model that refuses embedding input cannot be split after layer 0: nothing to capture
        capture = [] if self.embd_refused else list(range(self.info.n_layer))
        for name in names:
            tr = run_script(t, script_steps(sched.runs()[name], capture=capture), reset=True)
            if isinstance(tr, Failure):
                raise UserError(f"{self.fixture}: the full model fails in the target ({tr.message}); "
                                "fix the fixture before sweeping it")
            self._add_time(tr.decode_seconds)
            refs[name] = tr
        return loaded.data.get("llama_cpp_commit"), refs

    def _control_on(self, ctl: Target, sched: Schedule, tr: Trace, loaded: bool) -> dict[str, Any]:
        if not loaded:
            r = self._load_full(ctl)
            if not r.ok:
                return {"status": failure_status(r.failure),
                        "reason": f"the control worker cannot load the full model: {r.failure.message}"}
        return self._control(ctl, sched, tr)

    def _materialize(self, sets: list[list[int]], tasks: _Tasks) -> None:
        """Write every stage file, in cut-set order, handing each cut set on as soon as its stages exist."""
        try:
            for i, cuts in enumerate(sets):
                if tasks.aborted:
                    return
                res = CutResult(cuts=cuts, stages=stage_ranges(cuts, self.info.n_layer), status="pass")
                t0 = time.perf_counter()
                stages = self.st.stages(cuts)
                self.write_seconds += time.perf_counter() - t0
                if isinstance(stages, Unsupported):
                    res.status, res.reason = "unsupported", str(stages)
                    tasks.finish(_Job(i, res, None, rows=[res.to_dict()]))
                else:
                    res.pads = {f"{st.first}:{st.last}": st.pads for _, st in stages if st.pads}
                    tasks.put(_Job(i, res, stages), 0)
        except BaseException:
            tasks.abort()  # the workers stop; the main thread re-raises this
            raise

    def _work(self, t: Target, tasks: _Tasks, after: threading.Thread | None) -> None:
        if after is not None:  # t is busy until then
            after.join()
        while (task := tasks.get()) is not None:
            job, s = task
            try:
                self._run_stage(job, s, t)
                if s + 1 < len(job.stages) and any(len(tr) == s + 1 for tr in job.traces.values()):
                    tasks.put(job, s + 1)
                    continue
                job.rows = self.judge(job.res.cuts, job)
            except BaseException as e:  # noqa: BLE001 — the main thread re-raises it
                job.error = e
            tasks.finish(job)

    def _run_stage(self, job: _Job, s: int, t: Target, *, capture_all: bool = False) -> None:
        """Stage s of one cut set in a fresh context on t: every run whose earlier stages completed, in run
        order, to the first failure. A non-final stage captures its last layer (capture_all: every layer).
        The load and the runs go to the worker at once (it runs them back to back)."""
        path, st = job.stages[s]
        last = s == len(job.stages) - 1
        names = [n for n in self._sched.runs() if len(job.traces.get(n, ())) == s]
        if not names:
            return
        capture = list(range(st.n_layer)) if capture_all else [] if last else [st.n_layer - 1]
        requests = [("load", {"path": str(path), **self._params, "capture": capture_all or not last})]
        for name in names:
            steps = self._sched.runs()[name]
            # a non-final stage's logits are never compared: not sent back (it computes every row regardless,
            # since its last layer is captured)
            mode = "all" if last else "none"
            if s == 0:
                reqs = script_steps(steps, tokens=self._tokens(name), capture=capture, logits_mode=mode)
            else:
                width = job.stages[s - 1][1].n_layer
                reqs = script_steps(steps, embd=[so.captures[width - 1] for so in job.traces[name][s - 1].steps],
                                    capture=capture, n_pos_per_token=self.n_pos, logits_mode=mode)
            requests.append(script_request(reqs, reset=True))
        replies = t.pipeline(requests)
        self._loaded(replies[0])
        if not replies[0].ok:
            job.failures.setdefault(names[0], ("load", RunFailure(replies[0].failure, s)))
            return
        for name, reply in zip(names, replies[1:], strict=False):
            tr = script_trace(reply)
            if isinstance(tr, Failure):
                job.failures[name] = (name, RunFailure(tr, s))
                return
            self._add_time(tr.decode_seconds)
            job.traces.setdefault(name, []).append(tr)

    def _tokens(self, name: str) -> list[list[int]]:
        return [so.tokens for so in self._refs[name].steps]

    def _divergence(self, job: _Job, res: CutResult) -> tuple[Divergence, str] | tuple[str, RunFailure] | None:
        """Each run (in run order) against the reference, its figures added to res: the first divergence and its
        run, or the first run that failed (its phase and failure)."""
        for name, steps in self._sched.runs().items():
            if name in job.failures:
                return job.failures[name]
            ref_tr, chain = self._refs[name], job.traces[name]
            div, worst = compare(ref_tr, chain, steps, res.cuts)
            res.max_abs_dlogit = max(res.max_abs_dlogit, worst)
            teq = tokens_equal(ref_tr, chain)
            res.tokens_equal = teq if res.tokens_equal is None else res.tokens_equal and teq
            if div is not None:
                return div, name
        return None

    def judge(self, cuts: list[int], job: _Job) -> list[dict[str, Any]]:
        """Pure (on the traces): the cut set's result — the first divergence from the reference, or the first run
        that failed, or a pass."""
        res = replace(job.res)
        got = self._divergence(job, res)
        if got is not None and isinstance(got[1], RunFailure):
            return [{**res.to_dict(), **self._failed(got[1], got[0])}]
        if got is not None:
            div = got[0]
            res.status = FINDING
            res.phase, res.step, res.position, res.seq = div.phase, div.step, div.position, div.seq
            res.stage, res.where = div.stage, div.where
        return [res.to_dict()]

    def again(self, cuts: list[int], job: _Job, bad: list[dict[str, Any]]) -> None:
        """A divergence: the run that diverged again, stage by stage on the reference's worker with every stage
        layer captured (what explain localizes with). It must diverge at the same step and stage; a stage that
        fails this time makes it that failure. (A stage that failed the first time is not run again.)"""
        row = bad[0]
        if row["status"] != FINDING:
            return
        div, name = self._divergence(job, replace(job.res))
        again = _Job(job.index, job.res, job.stages)
        for s in range(len(job.stages)):
            self._run_stage(again, s, self.ref, capture_all=True)
        if name in again.failures:
            phase, fail = again.failures[name]
            for k in ("step", "position", "seq", "where"):
                row.pop(k, None)
            row.update(self._failed(fail, phase))
            return
        job.again = div, name, again.traces[name]
        div2 = compare(self._refs[name], job.again[2], self._sched.runs()[name], cuts)[0]
        row["reproduced"] = div2 is not None and (div2.step, div2.stage) == (div.step, div.stage)
        if not row["reproduced"]:
            row["reason"] = "did not reproduce on a second run (nondeterministic)"

    def explain(self, cuts: list[int], job: _Job, row: dict[str, Any]) -> dict[str, Any]:
        """A reproduced divergence: the first source layer whose output differs (against the ranges the cut set
        asked for, not what the slicer says it produced), and in it the first graph node."""
        if not row.get("reproduced"):
            return {}
        div, name, chain = job.again
        layer = localize(self._refs[name], chain, [(a, b, st.layers, st.pads) for (a, b), (_, st)
                                                  in zip(job.res.stages, job.stages, strict=True)], div.step)
        if not isinstance(layer, int):
            return {"layer": layer}
        return {"layer": layer, "node": self._localize_node(job, self.ref, name, chain, layer, div.step)}

    def _control(self, ref: Target, sched: Schedule, tr: Trace) -> dict[str, Any]:
        """The full model fed its own token embeddings through batch.embd must equal token input, bit for bit."""
        if self.embd_refused:
            return {"status": "unsupported", "reason": self.embd_refused}
        try:
            table = token_embeddings(self.st.g)
        except UserError as e:
            return {"status": "unsupported", "reason": str(e)}
        steps = sched.sequential
        embd = [table[np.array(so.tokens)] for so in tr.steps]
        fam = family_for_arch(self.info.arch)
        if fam is not None and fam.token_scale:  # the model scales token input only: do what token input gets
            scale = np.sqrt(np.float32(self.info.n_embd))
            embd = [e * scale for e in embd]
        ctl = run_script(ref, script_steps(steps, embd=embd, capture=list(range(self.info.n_layer)),
                                           n_pos_per_token=self.n_pos), reset=True)
        if isinstance(ctl, Failure):
            return {"status": failure_status(ctl), "reason": ctl.message}
        self._add_time(ctl.decode_seconds)
        div, worst = compare(tr, [ctl], steps, [])
        if div is None:
            return {"status": "pass", "max_abs_dlogit": worst}
        n = self.info.n_layer
        layer = localize(tr, [ctl], [(0, n, list(range(n)), [])], div.step)
        return {"status": FINDING, "phase": div.phase, "position": div.position, "layer": layer,
                "max_abs_dlogit": worst,
                "reason": "embedding-input path differs from token input (not a slicing problem)"}

    def _localize_node(self, job: _Job, t: Target, name: str, chain: list[Trace], layer: int,
                     upto: int) -> dict[str, Any]:
        """Inside the first differing layer: run the full model and the stage holding that layer once more with
        every graph node of the layer traced, at the first step where the layer's output differs, and name the
        first node (in execution order) whose bits differ from the full model's."""
        held = [(s, j) for s, (_, st) in enumerate(job.stages) for j, src in enumerate(st.layers)
                if src == layer and j not in st.pads]
        if not held:
            return {"kind": "missing", "detail": f"no stage holds layer {layer}"}
        s, j = held[0]
        path, st = job.stages[s]
        ref_tr = self._refs[name]
        k = next((k for k in range(upto + 1)
                  if first_row_diff(chain[s].steps[k].captures[j], ref_tr.steps[k].captures[layer]) is not None),
                 upto)
        steps = self._sched.runs()[name][:k + 1]
        tokens = self._tokens(name)[:k + 1]
        full = script_steps(steps, tokens=tokens, capture=list(range(self.info.n_layer)))
        if s == 0:
            stage = script_steps(steps, tokens=tokens, capture=list(range(st.n_layer)))
        else:
            width = job.stages[s - 1][1].n_layer
            stage = script_steps(steps, embd=[so.captures[width - 1] for so in chain[s - 1].steps[:k + 1]],
                                 capture=list(range(st.n_layer)), n_pos_per_token=self.n_pos)
        full[k]["trace"], stage[k]["trace"] = layer, j
        traced = traced_steps(t, [({"path": str(self.fixture), **self._params}, full),
                                  ({"path": str(path), **self._params}, stage)], k)
        if isinstance(traced, dict):
            return traced
        want, got = (x["nodes"] for x in traced)
        found = first_differing_node(want, got)
        if found is None:
            return {"kind": "none", "detail": f"all {len(got)} traced nodes of the layer are bit-identical"}
        return found | {"step": k, "stage_layer": j}

    @staticmethod
    def _failed(fail: RunFailure, phase: str) -> dict[str, Any]:
        f = fail.failure
        return {"status": failure_status(f), "stage": fail.stage, "phase": phase,
                "reason": failure_reason(f, "stage rejected")}


# ---- the oracle contract ---------------------------------------------------------------------------------
def report(fixture: Path, cfg: SweepConfig, *, slicer: Slicer | None = None) -> Report:
    return Sweep(fixture, cfg, slicer=slicer).report()


ORACLE = Oracle(name="sweep", config=SweepConfig, run=report, format=lambda rep: format_report(rep.native),
                per_cut=True, narrow=select("phases", lambda f: f.phase),
                shrink=(("tokens", 1), ("prompt_len", 2), ("n_seq", 2)),
                case_fields=("tokens", "prompt_len", "prompt", "chunk", "n_seq", "n_ubatch", "phases", "seed"))
