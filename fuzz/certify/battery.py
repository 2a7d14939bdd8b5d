"""The battery: a plan of rows × lanes run against a target, rows side by side in processes of their own, each
lane finished (known findings, pictures, bundles) where it ran; the run's report, outputs and certificate; the plan
itself (which rows, which lanes, which CI jobs)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

from fuzz.certify.certificate import certificate
from fuzz.certify.lane_result import known_of
from fuzz.certify.lanes import NO_OPTIONS, LaneOptions, LaneResult, check_cuts, run_lane
from fuzz.certify.outputs import manifest_identity, run_report, write_outputs
from fuzz.certify.shards import longest_first
from fuzz.engine.contract import CRASH, FAILING, FINDING, KNOWN, MISSING, SKIPPED, UNSUPPORTED
from fuzz.engine.progress import Progress
from fuzz.engine.stages import PLANNER
from fuzz.repro.bundle import bundle_findings
from synth.errors import UserError
from synth.make import write_fixture
from synth.manifest import LANES, SCAN_LANES, Manifest, Row
from targets import open_target, share_cores
from targets.client import ROW_COUNTS_ENV


def run_row(row: Row, lanes: list[str], target_spec: str, workdir: Path,
            working: Callable[[str], None] | None = None, options: LaneOptions = NO_OPTIONS) \
        -> Iterator[LaneResult]:
    """The row's lanes, each as it finishes (`working` told which one runs)."""
    if not row.runnable:
        yield from (LaneResult(row.key, lane, UNSUPPORTED, row.reason or "") for lane in lanes)
        return
    path = workdir / f"{row.key}.gguf"
    write_fixture(row.spec(), path)
    fixture = hashlib.sha256(path.read_bytes()).hexdigest()  # what was certified: the lanes' data names it
    with row_counts(row.key), open_target(target_spec) as target:
        for lane in lanes:
            t0 = time.perf_counter()
            if working:
                working(f"{row.key} {lane}")
            try:
                res = run_lane(row, lane, path, target, target_spec, workdir, options)
            except UserError as e:  # a fixture the toolkit made, refused or failed on by the target: not bad input
                res = LaneResult(row.key, lane, CRASH, f"the lane could not run on the target: {e}")
            if not target_spec.startswith("skippy:"):  # (skippy's lanes split at its own cut specs: lane_skippy)
                res = check_cuts(row, lane, path, res)
            res.data["fixture_sha256"] = fixture
            res.seconds = time.perf_counter() - t0
            # the manifest's known findings are the pinned llama.cpp's: another runtime is judged on its own
            yield res if target_spec.startswith("skippy:") else known(row, res)


@contextmanager
def row_counts(key: str) -> Iterator[None]:
    """Under a coverage run (ROW_COUNTS_ENV set), the row's processes — every worker and server it starts — write
    their counts in a directory of the row's own (GCOV_PREFIX), so a line is known by the rows that ran it."""
    rows = os.environ.get(ROW_COUNTS_ENV)
    if not rows:
        yield
        return
    saved = os.environ.get("GCOV_PREFIX")
    os.environ["GCOV_PREFIX"] = str(Path(rows) / key)
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("GCOV_PREFIX", None)
        else:
            os.environ["GCOV_PREFIX"] = saved


def known(row: Row, r: LaneResult) -> LaneResult:
    """A lane the manifest lists under `known` (an upstream finding with its repro): failing as recorded is
    `known`, not a failure of this run; passing means the finding is gone and the entry must go (a failure) —
    unless it is marked "intermittent: ..." (it depends on timing, e.g. which slots a server batches together)."""
    what = row.known.get(r.lane)
    if what is None or r.status in (SKIPPED, UNSUPPORTED):
        return r
    if r.status in FAILING:
        return replace(r, status=KNOWN, detail=f"{what} — still reproduces: {r.detail}")
    if what.startswith("intermittent:"):
        return replace(r, detail=f"{r.detail} (a known intermittent finding did not show this run: {what})")
    return replace(r, status=FINDING, data={**r.data, "known_gone": what},
                   detail=f"known finding no longer reproduces ({what}); remove known.{r.lane} from the manifest: "
                          f"{r.detail}")


def finish_lane(res: LaneResult, out: Path | None) -> None:
    """With --out: a picture of each sweep or hand-off the lane ran (a dtype lane: its failing ones), and each
    distinct finding of a failing lane reproduced, shrunk and bundled under bundles/."""
    if out is None:
        return
    from fuzz.repro.pictures import report_picture

    for i, rep in enumerate(res.reports):
        if res.lane == "dtype" and rep.status not in FAILING:
            continue
        name = f"pictures/{res.row}-{res.lane}" + (f"-{i}" if len(res.reports) > 1 else "") + ".svg"
        (out / "pictures").mkdir(parents=True, exist_ok=True)
        if report_picture(rep.to_dict(), out / name):
            res.pictures.append(name)
    if res.status not in FAILING:
        return
    from synth.make import spec_of

    seen: list[dict[str, Any]] = []  # a finding both batch shapes show is bundled once
    for rep, case in zip(res.reports, res.cases, strict=True):
        if rep.findings:
            spec = spec_of(rep.fixture) if Path(rep.fixture).is_file() else None
            known = known_of(spec.family if spec is not None else res.row, [rep])
            # (a finding that is a committed upstream repro has its bundle: the lane's go to the new ones)
            made = bundle_findings(rep, case, out / "bundles" / res.row, seen=seen,
                                   skip=lambda f, known=known: known[id(f)] is not None)
            res.bundles += [str(p.relative_to(out)) for p in made]


def run_rows(tasks: list[tuple[Row, list[str], str, Path, LaneOptions]], jobs: int,
             finish: Callable[[LaneResult], LaneResult], each: Callable[[int, LaneResult], None],
             working: Callable[[str], None] | None = None) -> list[list[LaneResult]]:
    """Each task's row (its lanes on its target, its fixture written in its directory), `jobs` rows at a time; each
    lane through `finish` in the process that ran it (a function that process can import), then `each(task index,
    lane)` here as lanes finish; every row's lanes in the tasks' order. The first error a row raises is raised here
    once the rows running finished; no row starts after it. Rows start longest first (the committed durations).
    Rows at a time run in processes of their own, not threads of this one: the engine's Python side of a row (traces
    compared, blobs decoded, schedules judged) then runs beside another row's instead of waiting for the same
    interpreter lock (measured: docs/benchmarks.md, the tier-1 battery)."""
    if jobs <= 1 or len(tasks) <= 1:
        out = []
        for i, (row, lanes, target, workdir, options) in enumerate(tasks):
            out.append([])
            for res in run_row(row, lanes, target, workdir, working, options):
                res = finish(res)
                out[-1].append(res)
                each(i, res)
        return out
    import multiprocessing
    import queue as queues
    from concurrent.futures import ProcessPoolExecutor

    ctx = multiprocessing.get_context("spawn")  # (a fresh interpreter: this one's threads and idle workers stay here)
    events = ctx.Queue()
    got: list[list[LaneResult]] = [[] for _ in tasks]
    told = 0
    pool = ProcessPoolExecutor(min(jobs, len(tasks)), mp_context=ctx, initializer=_row_process, initargs=(events,))
    todo = [(i, tasks[i]) for i in longest_first([(row.key, lanes) for row, lanes, *_ in tasks])]
    running: dict[Any, int] = {}
    error: BaseException | None = None

    def start() -> None:  # a row goes to a process only when one is free: after an error, no other starts
        i, task = todo.pop(0)
        running[pool.submit(_row_in_process, i, *task, finish)] = i

    def tell(block: float) -> bool:
        nonlocal told
        try:
            kind, i, what = events.get(timeout=block)
        except queues.Empty:
            return False
        if kind == "working":
            if working is not None:
                working(what)
        else:
            told += 1
            each(i, what)
        return True

    try:
        while todo and len(running) < jobs:
            start()
        while running:
            tell(0.1)
            for f in sorted((f for f in running if f.done()), key=lambda f: f.exception() is None):
                i = running.pop(f)
                if f.exception() is not None:
                    error = error or f.exception()
                    todo.clear()
                    continue
                got[i] = f.result()
                if todo:
                    start()
        if error is not None:
            raise error
        lanes = sum(len(x) for x in got)
        while told < lanes and tell(5.0):  # the last lines may come after their row's result
            pass
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    return got


_EVENTS: Any = None  # in a row's process: where its lanes and what it is working on go


def _row_process(events: Any) -> None:
    global _EVENTS
    _EVENTS = events
    events.cancel_join_thread()  # at exit: lines the parent stopped reading (it raised) must not keep this process
    os.environ["FAMILY_CERTIFY_PROGRESS"] = "plain"  # the bar is the parent's: an oracle's stays silent
    share_cores()  # rows side by side: llama.cpp's threads wait passively (targets.worker_env)


def _row_in_process(i: int, row: Row, lanes: list[str], target: str, workdir: Path, options: LaneOptions,
                    finish: Any) -> list[LaneResult]:
    out = []
    for res in run_row(row, lanes, target, workdir, lambda what: _EVENTS.put(("working", i, what)), options):
        res = finish(res)
        out.append(res)
        _EVENTS.put(("lane", i, res))
    return out


def _as_is(res: LaneResult) -> LaneResult:
    return res


def finished(res: LaneResult, out: Path | None, require_lanes: bool) -> LaneResult:
    """A battery's lane once it ran: a skipped one missing under --require-lanes; pictures and bundles (finish_lane)."""
    if require_lanes and res.status == SKIPPED:
        res = replace(res, status=MISSING, detail=f"skipped, and --require-lanes: {res.detail}")
    finish_lane(res, out)
    return res


def run_battery(plan: list[tuple[Row, list[str]]], target: str, out: Path | None, *, manifest: Path,
                command: str, require_lanes: bool = False, jobs: int = 1, options: LaneOptions = NO_OPTIONS) \
        -> dict[str, Any]:
    """Every planned row × lane, one plain line each (rich progress on a terminal); the run's report.
    require_lanes: a skipped lane fails closed (missing), as the users' own runner's --require-lanes.
    jobs: rows run this many at a time (run_rows: a process each; each lane's targets are worker processes of its
    own), lines in the order lanes finish, the report in the plan's order."""
    t0 = time.perf_counter()
    total = sum(len(ls) for _, ls in plan)
    with tempfile.TemporaryDirectory(prefix="family-certify-") as d, Progress(total, "lanes") as progress:
        def line(i: int, res: LaneResult) -> None:
            loud = "skipped: " if res.status == SKIPPED else ""
            progress.line(f"{res.row:<16} tier {plan[i][0].tier}  {res.lane:<15} {res.status.upper():<12} "
                          f"{loud}{res.detail}")

        done = run_rows([(row, lanes, target, Path(d), options) for row, lanes in plan], jobs,
                        partial(finished, out=out, require_lanes=require_lanes), line, progress.working)
    lanes = [res for row in done for res in row]
    commit = next((r.llama_cpp_commit for x in lanes for r in x.reports if r.llama_cpp_commit), None) or \
        next((x.data.get("llama_cpp_commit") for x in lanes if x.data.get("llama_cpp_commit")), None)
    build = None
    if target.startswith("skippy:"):  # the receipt names the skippy build: an aggregate refuses to mix two
        from fuzz.engine.contract import build_identity
        from targets.skippy import identity

        sk = identity(target[len("skippy:"):])
        build = {**build_identity(sk.get("llama_cpp")), "skippy": sk,
                 "key": f"skippy-{sk.get('commit') or sk.get('version') or 'unknown'}-abi-{sk.get('abi')}"}
    run = run_report([x.to_dict() for x in lanes], plan=[(r.key, ls) for r, ls in plan],
                     manifest=manifest_identity(manifest), target=target, llama_cpp_commit=commit,
                     wall_s=time.perf_counter() - t0, command=command, build=build)
    if out is not None:
        from fuzz.repro.pictures import battery_picture

        if battery_picture(run["results"], out / "pictures" / "battery.svg", LANES):
            run["picture"] = "pictures/battery.svg"
    return run


def finish_run(run: dict[str, Any], out: Path | None, report: Path | None, manifest: Manifest) -> int:
    """Print the totals; with --out write the outputs and, when every planned lane ran, certificate.json."""
    print(f"{len({x['row'] for x in run['results']})} rows, {len(run['results'])} lanes: "
          + ", ".join(f"{v} {k}" for k, v in sorted(run["totals"].items())) + f"; wall {run['wall_s']:.0f} s")
    if out is not None:
        write_outputs(out, run)
        cert = write_certificate(out, run, manifest)
        print(f"wrote {out}/summary.md, junit.xml, report.json" + (", bundles/" if (out / "bundles").is_dir() else "")
              + (", pictures/" if (out / "pictures").is_dir() else "")
              + (", certificate.json" if cert else "; no certificate.json: a planned lane did not run"))
    if report is not None:
        report.parent.mkdir(parents=True, exist_ok=True)
        report.write_text(json.dumps(run, indent=2) + "\n")
    return run["exit_code"]


def write_certificate(out: Path, run: dict[str, Any], manifest: Manifest) -> bool:
    """out/certificate.json, when every planned lane of the run ran; whether it was written."""
    cert = certificate(run, manifest)
    if cert is not None:
        (out / "certificate.json").write_text(json.dumps(cert, indent=2) + "\n")
    return cert is not None


PER_BUMP = ("gate", "memory", "server")  # the CI jobs that run on every bump (the canary's required jobs)


def check_jobs(jobs: int) -> None:
    if not 1 <= jobs <= 64:
        raise UserError(f"--jobs {jobs}: must be 1..64")


def lane_plan(m: Manifest, tier: int | None, rows: list[str] | None, lanes: list[str] | None, *,
              jobs: list[str] | None = None, scan: bool = False) -> list[tuple[Row, list[str]]]:
    """The selected rows, each with its lanes (only `lanes`, only the lanes of the CI `jobs`, when given): what run
    and bump execute, or with `scan` every row through the scan's lanes. A row left with no lane is not planned."""
    selected = m.select(tier, rows)
    if not selected:
        raise UserError("no rows selected; check --tier and the row names (`family-certify check`)")
    known = SCAN_LANES if scan else LANES
    unknown = sorted(set(lanes or ()) - set(known))
    if unknown:
        whose = "the scan's lanes" if scan else "lanes"
        raise UserError(f"--lane {unknown[0]!r}: {whose} are {', '.join(known)}")
    of_jobs = m.job_lanes(jobs)
    plan = [(row, [x for x in (SCAN_LANES if scan else row.lanes)
                   if (not lanes or x in lanes) and (of_jobs is None or x in of_jobs)]) for row in selected]
    return [(row, ls) for row, ls in plan if ls] if jobs else plan


def lane_options(cuts: str | None, stages: list[int] | None) -> LaneOptions:
    """--cuts planner:CMD and --stages as the lanes' options; a planner that cannot be started is bad input."""
    if cuts is None:
        if stages:
            raise UserError("--stages: give the planner too (--cuts planner:CMD)")
        return LaneOptions()
    if not cuts.startswith(PLANNER):
        raise UserError(f"--cuts {cuts!r}: a run takes planner:CMD (the lanes' own cuts come from the manifest)")
    import shlex

    argv = shlex.split(cuts[len(PLANNER):])
    if not argv or not (shutil.which(argv[0]) or Path(argv[0]).is_file()):
        raise UserError(f"--cuts {cuts}: no such program {argv[0] if argv else '(none)'!r}; give its path or put it "
                        "on PATH")
    bad = [k for k in stages or () if k < 2]
    if bad:
        raise UserError(f"--stages {bad[0]}: a split has at least 2 stages")
    return LaneOptions(cuts, tuple(stages or (2,)))


def nothing_planned(jobs: list[str] | None) -> int:
    """A CI job with no lane in the selection (the server job of a tier without llama-server lanes): says so, passes."""
    print(f"skipped: no selected row has a lane of --job {' --job '.join(jobs or [])}: nothing to run")
    return 0
