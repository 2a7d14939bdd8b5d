"""`family-certify`: the family-tier manifest (family_tiers.toml) and the lanes it drives.

  family-certify check [FILE] [--json]        validate the manifest, summarize it
  family-certify matrix [--tier N] [--json]   the CI matrix (one entry per runnable row)
  family-certify run [--tier N] [ROW ...]     run each row's lanes against a target; exit 1 on any failure
                                              (--out DIR: summary.md, junit.xml, report.json, bundles/, pictures/)
  family-certify aggregate DIR ...            merge shards' --out directories; fails closed on a missing lane
  family-certify build [--llama-cpp B]        build a llama.cpp once (cached), check its API; print where it is
  family-certify bump --candidate C [ROW ...]  a llama.cpp bump or patch series: every lane on both builds and a
                                              cross-build lane; a verdict per row × lane; exit 1 if anything broke
  family-certify mutants                      every re-created bug class must be caught by its row's lane
  family-certify coverage [--job J ...]       which of llama.cpp's state code the lanes execute (a coverage build)
  family-certify mutate --coverage DIR        how many mutants of that code the lanes kill
  family-certify admit MODEL --certificate C  may this GGUF be split at these cuts? (a run's certificate.json)
  family-certify roster CERTIFICATE            the certificate as skippy's split-certified.json
  family-certify table                        family, tier, arch, fixture size, loads, decodes (docs/benchmarks.md)
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Annotated, Any

import typer

from fuzz.certify.battery import (
    PER_BUMP,
    _as_is,
    check_jobs,
    finish_run,
    lane_options,
    lane_plan,
    nothing_planned,
    run_battery,
    run_rows,
)
from fuzz.certify.bump import bump_builds, finish_bump, read_bump
from fuzz.certify.certificate import admit, read_certificate, roster
from fuzz.certify.coverage import coverage_command
from fuzz.certify.lanes import LaneOptions, LaneResult, lane_load
from fuzz.certify.mutate import mutate_command
from fuzz.certify.outputs import build_name, manifest_identity, merge, read_run, run_report, write_outputs
from fuzz.certify.shards import DURATIONS, load_durations, measured, plan_shards, refresh_durations
from fuzz.cli import BackendOpt, LlamaCppOpt, PatchesOpt
from fuzz.engine.contract import FAILING, FINDING, MISSING, PASS, UNSUPPORTED
from fuzz.repro.oracle_command import use_build
from synth.cliutil import new_app, run
from synth.errors import UserError
from synth.make import write_fixture
from synth.manifest import LANES, Manifest, load_manifest
from targets import TARGETS_HELP, open_target

app = new_app("Certify model families against the family-tier manifest (family_tiers.toml).")
Opt = typer.Option
FileArg = Annotated[Path | None, typer.Argument(help="manifest (default: ./family_tiers.toml)")]
JobOpt = Annotated[list[str] | None, Opt("--job", help="only the lanes of this CI job ([jobs] in the manifest: "
                                                   "gate, memory, server, nightly; repeatable)")]


@app.command()
def check(file: FileArg = None, as_json: Annotated[bool, Opt("--json", help="machine-readable")] = False,
          tree: Annotated[str | None, Opt(help="also check that every architecture this llama.cpp source tree knows "
                                               "(or `pinned`) has a row or a [not_split_served] line")] = None) -> int:
    """Validate the manifest (unknown keys, unknown families, duplicates, tiers, recipes) and summarize it; with
    --tree, exit 1 on an architecture the manifest does not classify."""
    m = load_manifest(file)
    if tree is not None:
        from targets.builds import resolve, tree_architectures

        names = resolve("pinned", from_env=False).arch_names() if tree == "pinned" else tree_architectures(Path(tree))
        if unclassified_architectures(m, names):
            return 1
        if not as_json:
            print(f"{tree}: all {len(names)} architectures classified ({len(m.row_archs)} by rows, "
                  f"{len(m.not_split_served)} not split-served)")
    if as_json:
        print(json.dumps({"manifest": str(m.path), "rows": [r.to_dict() for r in m.rows.values()]}, indent=2))
        return 0
    by_tier = Counter(r.tier for r in m.rows.values())
    runnable = sum(r.runnable for r in m.rows.values())
    print(f"{m.path}: {len(m.rows)} families valid — " + ", ".join(f"tier {t}: {by_tier[t]}" for t in sorted(by_tier))
          + f"; {runnable} runnable on the pinned llama.cpp")
    for r in m.rows.values():
        if not r.runnable:
            print(f"  not runnable: {r.key} ({r.arch}): {r.reason}")
    return 0


def unclassified_architectures(m: Manifest, names: list[str]) -> bool:
    """Print a line per architecture of `names` the manifest does not classify; whether there was one."""
    missing = m.unclassified(names)
    for a in missing:
        print(f"unclassified architecture {a}: llama.cpp knows it and {m.path.name} neither has a row for it nor "
              f"lists it under [not_split_served]; add one or the other")
    return bool(missing)




@app.command()
def matrix(file: FileArg = None, tier: Annotated[int | None, Opt(help="only this tier")] = None,
           shards: Annotated[int | None, Opt(help="K jobs of about equal length (whole rows, balanced by the "
                                                   "lanes' measured durations)")] = None,
           durations: Annotated[Path | None, Opt(help="lane durations file (default: the committed one)")] = None,
           job: JobOpt = None,
           as_json: Annotated[bool, Opt("--json", help="GitHub Actions matrix JSON")] = True) -> None:
    """The CI matrix: {"include": [{"row", "tier", "arch", "lanes"}]} for runnable rows; with --shards K,
    {"include": [{"shard", "of", "rows", "seconds"}]} (rows space-separated, for `family-certify run $rows`).
    With --job, only that CI job's lanes and the rows that have one; each --job gets its own K shards, and each
    entry names its "job" (for `run --job $job`)."""
    m = load_manifest(file)
    include: list[dict[str, Any]] = []
    for j in job or [None]:
        rows = [(r, ls) for r, ls in lane_plan(m, tier, None, None, jobs=[j] if j else None) if r.runnable]
        named = {"job": j} if j else {}
        if shards is not None:
            plan = plan_shards([(r.key, ls) for r, ls in rows], load_durations(durations or DURATIONS), shards)
            include += [{**named, **p, "rows": " ".join(p["rows"])} for p in plan]
        else:
            include += [{**named, "row": r.key, "tier": r.tier, "arch": r.arch, "lanes": ",".join(ls)}
                        for r, ls in rows]
    key = "rows" if shards is not None else "row"
    print(json.dumps({"include": include}) if as_json else "\n".join(i[key] for i in include))


@app.command()
def durations(runs: Annotated[list[Path], typer.Argument(help="directories written by `family-certify run --out` or "
                                                              "`aggregate --out` (or their report.json)")],
              into: Annotated[Path | None, Opt(help="the durations file to update (default: the committed one)")]
              = None) -> None:
    """Refresh the lane durations `matrix --shards` balances CI's shards by, from real runs: every row × lane the
    runs ran takes the seconds it took (a later run wins; a missing or skipped lane measured nothing and keeps its
    entry); every other entry is kept. Prints what changed."""
    path = into or DURATIONS
    reports = [read_run(p) for p in runs]
    got: dict[str, float] = {}
    for rep in reports:
        got.update(measured(rep["results"]))
    if not got:
        raise UserError("these runs ran no lane (every one missing or skipped): nothing measured; pass the --out "
                        "directory of a run that ran")
    builds = ", ".join(sorted({build_name(r["build"]) for r in reports}))
    how = "; ".join(f"`{r['command']}` ({len(r['results'])} lanes, wall {r['wall_s']:.0f} s)" for r in reports)
    old = refresh_durations(path, got, f"{how}, llama.cpp {builds}")
    changed = sum(k in old and old[k] != v for k, v in got.items())
    print(f"{path}: {len(got)} row/lane durations measured ({changed} changed, {len(set(got) - set(old))} new), "
          f"{len({**old, **got})} in all; the measured ones sum to {sum(got.values()):.0f} s "
          f"(were {sum(old.get(k, 0.0) for k in got):.0f} s)")


OutOpt = Annotated[Path | None, Opt(help="write summary.md, junit.xml, report.json, bundles/ and pictures/ here")]
ReportOpt = Annotated[Path | None, Opt(help="write the run's JSON report here")]
CutsOpt = Annotated[str | None, Opt(help="planner:CMD — the parity lane also splits each row's fixture where this "
                                       "topology planner would (`CMD MODEL.gguf STAGES` prints one cut set per "
                                       "line) and says which cuts it never chooses and which it chose that are "
                                       "refused")]
StagesOpt = Annotated[list[int] | None, Opt("--stages", help="stage counts the planner is asked for (repeatable; "
                                                            "default 2)")]
JobsOpt = Annotated[int, Opt(help="rows run at a time (2 on 2 cores: a row's lanes wait on their workers about "
                                  "half the time)")]


@app.command("run")
def run_cmd(
    rows: Annotated[list[str] | None, typer.Argument(help="row names (default: every row of --tier)")] = None,
    tier: Annotated[int | None, Opt(help="only this tier")] = None,
    lane: Annotated[list[str] | None, Opt(help="only these lanes (repeatable)")] = None,
    job: JobOpt = None,
    manifest: Annotated[Path | None, Opt(help="manifest file")] = None,
    target: Annotated[str, Opt(help=TARGETS_HELP)] = "llama-cpp",
    report: ReportOpt = None,
    out: OutOpt = None,
    llama_cpp: LlamaCppOpt = None,
    patches: PatchesOpt = None,
    backend: BackendOpt = None,
    require_lanes: Annotated[bool, Opt("--require-lanes", help="a skipped lane fails the run (missing)")] = False,
    cuts: CutsOpt = None,
    stages: StagesOpt = None,
    jobs: JobsOpt = 1,
) -> int:
    """Run each selected row's lanes; print one line per lane; exit 1 if any lane fails or is missing."""
    m: Manifest = load_manifest(manifest)
    use_build(llama_cpp, patches, backend)
    plan = lane_plan(m, tier, rows, lane, jobs=job)
    if not plan:
        return nothing_planned(job)
    options = lane_options(cuts, stages)
    if target.startswith("skippy:"):
        from targets.skippy import identity

        identity(target[len("skippy:"):])  # a wrong config, binary or build: exit 2 before anything runs
    check_jobs(jobs)
    run = run_battery(plan, target, out, manifest=m.path, command="family-certify run " + " ".join(sys.argv[2:]),
                      require_lanes=require_lanes, jobs=jobs, options=options)
    return finish_run(run, out, report, m)


@app.command()
def scan(
    rows: Annotated[list[str] | None, typer.Argument(help="row names (default: every row of --tier, or all)")] = None,
    tier: Annotated[int | None, Opt(help="only this tier")] = None,
    lane: Annotated[list[str] | None, Opt(help="only these of the scan's lanes (repeatable)")] = None,
    manifest: Annotated[Path | None, Opt(help="manifest file")] = None,
    target: Annotated[str, Opt(help=TARGETS_HELP)] = "llama-cpp",
    report: ReportOpt = None,
    out: OutOpt = None,
    llama_cpp: LlamaCppOpt = None,
    patches: PatchesOpt = None,
    backend: BackendOpt = None,
    jobs: JobsOpt = 1,
) -> int:
    """Every selected row (every tier) through sweep, wire, hand-off, isolation and determinism at every cut — what
    the lanes' period cuts and single splits do not reach; on clean upstream the result must be 0 unexplained
    findings. Same outputs as `run`."""
    m: Manifest = load_manifest(manifest)
    use_build(llama_cpp, patches, backend)
    plan = lane_plan(m, tier, rows, lane, scan=True)
    check_jobs(jobs)
    run = run_battery(plan, target, out, manifest=m.path, command="family-certify scan " + " ".join(sys.argv[2:]),
                      jobs=jobs)
    return finish_run(run, out, report, m)


@app.command()
def aggregate(
    dirs: Annotated[list[Path], typer.Argument(help="directories written by `family-certify run --out` or "
                                                    "`family-certify bump --out` (shards)")],
    tier: Annotated[int | None, Opt(help="the tier the shards were planned from")] = None,
    rows: Annotated[list[str] | None, Opt("--row", help="the rows planned (repeatable; default: every row of --tier)")]
    = None,
    lane: Annotated[list[str] | None, Opt(help="only these lanes were planned (repeatable)")] = None,
    job: Annotated[list[str] | None, Opt("--job", help="only these CI jobs' lanes were planned (repeatable)")]
    = None,
    manifest: Annotated[Path | None, Opt(help="manifest file")] = None,
    out: OutOpt = None,
    report: ReportOpt = None,
) -> int:
    """Merge shards' reports (of `run`, or of `bump`: their verdicts) against the plan from the manifest: fails
    closed (exit 1) when a planned row × lane reported nothing; writes the combined summary.md and junit.xml."""
    m = load_manifest(manifest)
    planned = lane_plan(m, tier, rows, lane, jobs=job)  # what run and bump planned, selected and checked the same way
    selected = [r for r, _ in planned]
    plan = [(r.key, ls) for r, ls in planned]
    bumps = [b for b in map(read_bump, dirs) if b is not None]
    if bumps:  # shards of `family-certify bump`
        if len(bumps) != len(dirs):
            raise UserError("aggregate: some directories hold bump reports, others runs; aggregate one kind at a time")
        from fuzz.certify import bump as bp
        rep = bp.merge_bumps(bumps, plan, {r.key for r in selected if r.runnable}, manifest=manifest_identity(m.path))
        return finish_bump(rep, out, report)
    # rows not runnable on the pinned llama.cpp get no shard (matrix plans runnable rows): unsupported, with why
    known_here = [{"row": r.key, "lane": x, "status": UNSUPPORTED, "detail": r.reason or "", "seconds": 0.0}
                  for r, (_, ls) in zip(selected, plan, strict=True) if not r.runnable for x in ls]
    run = merge([read_run(d) for d in dirs], plan, manifest_identity(m.path), also=known_here)
    if out is not None:
        for d in dirs:  # bring the shards' bundles and pictures along, so the combined summary's links work
            for sub in ("bundles", "pictures"):
                if (d / sub).is_dir():
                    shutil.copytree(d / sub, out / sub, dirs_exist_ok=True)
        from fuzz.repro.pictures import battery_picture

        if battery_picture(run["results"], out / "pictures" / "battery.svg", LANES):
            run["picture"] = "pictures/battery.svg"
    missing = [f"{x['row']}/{x['lane']}" for x in run["results"] if x["status"] == MISSING]
    if missing:
        print(f"MISSING (planned, no shard reported them): {', '.join(missing)}")
    return finish_run(run, out, report, m)


@app.command("build")
def build_cmd(
    llama_cpp: LlamaCppOpt = None,
    patches: PatchesOpt = None,
    backend: BackendOpt = None,
    as_json: Annotated[bool, Opt("--json", help="print the build's identity as JSON")] = False,
) -> int:
    """Build a llama.cpp (or take it from the cache) and check its API, without running anything: what a workflow's
    builder job runs once, so test jobs only download it. Prints where it is ($FAMILY_CERTIFY_CACHE/builds/KEY)."""
    from targets.builds import resolve

    b = resolve(llama_cpp, patches, backend=backend)
    where = b.bindings.parent if b.bindings else "the pinned install (.venv) and scripts/build_llama_server.sh"
    if as_json:
        print(json.dumps({**b.identity, "path": str(where), "seconds": round(b.seconds, 1)}, indent=1))
    else:
        print(f"{b.spec}{'' if b.backend == 'cpu' else ' (' + b.backend + ')'}: "
              f"{'built in ' + format(b.seconds, '.0f') + ' s' if b.seconds else 'ready'}: {where}")
    return 0


@app.command()
def bump(
    rows: Annotated[list[str] | None, typer.Argument(help="row names (default: every row of --tier)")] = None,
    base: Annotated[str, Opt(help="the build in use: pinned, pypi:VERSION or a source tree's path")] = "pinned",
    candidate: Annotated[str | None, Opt(help="the build to move to (same forms; default: the base, with "
                                              "--patches)")] = None,
    patches: Annotated[Path | None, Opt(help="a patch series applied onto the candidate's tree")] = None,
    base_patches: Annotated[Path | None, Opt(help="a patch series applied onto the base's tree")] = None,
    candidate_backend: Annotated[str | None, Opt(help="the ggml backend the candidate is built with (cpu, blas, "
                                                      "vulkan, cuda, metal; default: the base's tree on it when "
                                                      "--candidate is not given): a backend build certified "
                                                      "against the base, chains mixing the two both ways")] = None,
    base_backend: Annotated[str | None, Opt(help="the ggml backend the base is built with (default cpu)")] = None,
    tier: Annotated[int | None, Opt(help="only this tier")] = None,
    lane: Annotated[list[str] | None, Opt(help="only these lanes (repeatable)")] = None,
    job: JobOpt = None,
    manifest: Annotated[Path | None, Opt(help="manifest file")] = None,
    out: Annotated[Path | None, Opt(help="write summary.md, junit.xml, report.json (and base/, candidate/: each "
                                         "build's run and certificate.json) here")] = None,
    report: ReportOpt = None,
    cuts: CutsOpt = None,
    stages: StagesOpt = None,
    jobs: JobsOpt = 1,
    mutate_diff: Annotated[float, Opt(help="then seconds of mutants of the state-code lines the candidate changes "
                                           "(a coverage run of its lanes first; out/mutate-diff): what the battery "
                                           "sees of the bump itself (0: not run)")] = 0.0,
) -> int:
    """Certify a llama.cpp bump: the selected rows' lanes on the base and the candidate build, and a cross-build lane
    per row (the same prompt through both, unsplit); a verdict per row × lane — unchanged, broke, fixed, drifted,
    newly unsupported. Both builds are built (or taken from the cache) before any lane. Exit 1 if anything broke."""
    from targets.builds import resolve

    if candidate is None and patches is None and candidate_backend is None:
        raise UserError("--candidate: name the build to move to (pinned, pypi:VERSION or a tree), or give --patches "
                        "to certify a patch series on the base, or --candidate-backend to certify a backend build")
    if mutate_diff:
        from fuzz.certify.mutate import check_mutate_diff
        check_mutate_diff(candidate or base, patches, candidate_backend)
    m: Manifest = load_manifest(manifest)
    plan = lane_plan(m, tier, rows, lane, jobs=job)
    if not plan:
        return nothing_planned(job)
    options = lane_options(cuts, stages)
    check_jobs(jobs)
    # the environment's build and patch series name what is certified: the candidate, never the base
    builds = {"base": resolve(base, base_patches, from_env=False, backend=base_backend),
              "candidate": resolve(candidate or base, patches, backend=candidate_backend)}
    if unclassified_architectures(m, builds["candidate"].arch_names()):
        return 1  # (before any lane: the roster would have no answer for a model of that architecture)
    command = "family-certify bump " + " ".join(sys.argv[2:])
    code = finish_bump(bump_builds(plan, builds, manifest=m, command=command, out=out, jobs=jobs, options=options),
                       out, report)
    if mutate_diff:
        from fuzz.certify.mutate import mutate_diff as run_mutate_diff
        run_mutate_diff(plan, base, candidate or base, (out or Path("bump-out")) / "mutate-diff", budget=mutate_diff,
                        manifest=m.path, jobs=jobs, command=command)
    return code


# mutant → the manifest row and lane that must catch it (every mutant has one: tests/test_manifest.py)
CATCHERS: dict[str, tuple[str, str]] = {
    "b1-first-layer-probe": ("jamba", "handoff"),
    "b4-kidx-not-exported": ("deepseek3", "handoff"),
    "b5-uniform-kv-rows": ("laguna", "handoff"),
    "swa-window-filters-base-export": ("laguna", "handoff"),  # (its prompt of 8 passes the window of 4)
    "batched-rows-swapped": ("qwen3next", "parity"),
    "import-clears-context": ("llama", "handoff"),  # only a busy hand-off shows it
    "rollback-all-sequences": ("llama", "handoff"),  # only a busy rollback shows it
    "perturb-2-threads": ("llama", "determinism"),
    "stale-output-rows": ("llama", "determinism"),  # repeats under small ubatches; any backend
    "stage-q4k-mins-dropped": ("llama", "dtype"),  # only its q4_k split shows it
    "rollback-zeroed": ("jamba", "handoff"),
    "seq-leak": ("llama", "isolation"),
    "server-dup-leak": ("llama", "prefix-cache"),
    "radix-dup-leak": ("llama", "prefix-cache"),
    "radix-replace-live-borrower": ("llama", "prefix-cache"),
    "radix-restore-reuses-nothing": ("llama", "prefix-cache"),
    "wire-f16-truncated": ("qwen3next", "wire"),
    "token-ids-16-bit": ("llama-wide-vocab", "parity"),  # ids past 16 bits only there
    "seq-rm-leaves-one-cell": ("llama", "memory"),  # no other lane removes a range that starts past 0
    "seq-keep-keeps-neighbour": ("llama", "memory"),  # no other lane calls seq_keep
    "refused-decode-keeps-prefix": ("llama", "memory"),  # no other lane fills a cache
}


@app.command()
def mutants(manifest: Annotated[Path | None, Opt(help="manifest file")] = None,
            only: Annotated[list[str] | None, Opt("--mutant", help="only these mutants (repeatable)")] = None,
            out: Annotated[Path | None, Opt(help="write summary.md, junit.xml and report.json here (a lane is "
                                                  "'pass' when its mutant is caught)")] = None,
            llama_cpp: LlamaCppOpt = None, patches: PatchesOpt = None, backend: BackendOpt = None,
            jobs: JobsOpt = 1,
            through_cmd: Annotated[bool, Opt("--through-cmd", help="run each mutant as a program behind cmd: (as a "
                                                                   "user's own runtime runs), not as mutant:NAME")]
            = False) -> int:
    """The battery against every mutant: each known bug class, re-created, must make its row's lane fail (caught);
    exit 1 if any escapes. With --llama-cpp (and --backend), the mutants wrap that build; --jobs runs that many
    mutants at a time (lines in the mutants' order); --through-cmd runs each as `cmd:"python -m targets.mutants
    NAME"`: no verdict may trust a target for its kind."""
    from targets.mutants import MUTANTS

    m = load_manifest(manifest)
    use_build(llama_cpp, patches, backend)
    check_jobs(jobs)
    names = [n for n in MUTANTS if not only or n in only]
    unknown = sorted(set(only or ()) - set(MUTANTS))
    if unknown:
        raise UserError(f"--mutant {unknown[0]!r}: mutants are {', '.join(MUTANTS)}")
    escaped = 0
    width = max(map(len, names), default=0)
    t0 = time.perf_counter()
    lanes = []
    with tempfile.TemporaryDirectory(prefix="family-certify-") as d:
        tasks = []
        for name in names:
            row_key, lane = CATCHERS[name]
            workdir = Path(d) / name  # (two mutants of one row write its fixture at once: a directory each)
            workdir.mkdir()
            spec = f'cmd:"{sys.executable}" -m targets.mutants {name}' if through_cmd else f"mutant:{name}"
            tasks.append((m.row(row_key), [lane], spec, workdir, LaneOptions()))
        ready: dict[int, LaneResult] = {}

        def line(i: int, res: LaneResult) -> None:  # in the mutants' order, each as soon as those before it are
            nonlocal escaped
            ready[i] = res
            while len(lanes) in ready:
                name, res = names[len(lanes)], ready.pop(len(lanes))
                row_key, lane = CATCHERS[name]
                caught = res.status in FAILING
                escaped += not caught
                print(f"{name:<{width}} {row_key + '/' + lane:<24} "
                      f"{'caught' if caught else 'ESCAPED (' + res.status + ')'}  {res.detail}", flush=True)
                lanes.append({"row": f"mutant:{name}", "lane": f"{row_key}/{lane}",
                              "status": PASS if caught else FINDING, "seconds": round(res.seconds, 2),
                              "detail": ("caught: " if caught else f"ESCAPED ({res.status}): ") + res.detail})

        run_rows(tasks, jobs, _as_is, line)
    print(f"{len(names)} mutants: {len(names) - escaped} caught, {escaped} escaped")
    if out is not None:
        run = run_report(lanes, plan=[(x["row"], [x["lane"]]) for x in lanes], manifest=manifest_identity(m.path),
                         target="mutants", llama_cpp_commit=None, wall_s=time.perf_counter() - t0,
                         command="family-certify mutants")
        write_outputs(out, run)
    return 1 if escaped else 0


@app.command()
def corpus(
    entries: Annotated[list[str] | None, typer.Argument(help="entries: directory names or upstream numbers "
                                                             "(default: every entry)")] = None,
    corpus_dir: Annotated[Path | None, Opt("--corpus", help="the corpus (default: corpora/upstream)")] = None,
    tier: Annotated[int, Opt(help="the gate's tier (the per-bump gate is tier 1)")] = 1,
    row: Annotated[list[str] | None, Opt("--row", help="only these rows in the gate (a partial gate: the report "
                                                       "says so; repeatable)")] = None,
    job: Annotated[list[str] | None, Opt("--job", help="the CI jobs whose lanes make the gate (default: gate, "
                                                       "memory and server, what runs per bump; repeatable)")] = None,
    manifest: Annotated[Path | None, Opt(help="manifest file")] = None,
    out: Annotated[Path | None, Opt(help="write summary.md, junit.xml, report.json here (and pinned/, ENTRY/: "
                                         "each build's run)")] = None,
    report: ReportOpt = None,
    jobs: JobsOpt = 1,
) -> int:
    """The battery measured on llama.cpp's own fixed bugs: every entry of the upstream corpus (a patch series that
    puts one back into the pinned tree) through the per-bump jobs as a user's CI runs them (`bump --job gate --job
    memory --job server --patches ENTRY`: every row of the tier and those jobs' lanes, nothing per bug) and through
    its direct check; the pinned build through the same once. Prints caught/escaped per entry. Exit 1 if the pinned
    build fails the gate or a check, a check does not show its bug, or the gate catches fewer than 90 %."""
    from fuzz.certify import corpus as cp
    from targets.builds import activate, resolve

    m = load_manifest(manifest)
    chosen = cp.load_entries(set(m.rows), entries, corpus_dir or cp.DIR)
    jobs_run = job or [j for j in PER_BUMP if j in m.jobs]
    plan = lane_plan(m, tier, row, None, jobs=jobs_run)
    check_jobs(jobs)
    t0 = time.perf_counter()
    command = "family-certify corpus " + " ".join(sys.argv[2:])
    builds = {}
    for e in chosen:  # every build first: a series that does not apply is bad input before any lane runs
        builds[e.name] = b = resolve("pinned", e.path, from_env=False)
        print(f"{e.name}: {'built in ' + format(b.seconds, '.0f') + ' s' if b.seconds else 'built (cached)'}",
              flush=True)
    pinned = activate(resolve("pinned", from_env=False))
    print("== the pinned build", flush=True)
    base = run_battery(plan, "llama-cpp", out / "pinned" if out else None, manifest=m.path,
                       command=f"{command} (pinned)", jobs=jobs)
    if out is not None:
        write_outputs(out / "pinned", base)
    failing = [f"{x['row']}/{x['lane']} {x['status']}" for x in base["results"] if x["status"] in FAILING]
    width = max(len(e.name) for e in chosen)
    results = []
    with tempfile.TemporaryDirectory(prefix="family-certify-corpus-") as d:
        on_pinned = {e.name: cp.run_check(e, cp.fixture_for(m.row(e.row), Path(d))) for e in chosen}
        for e in chosen:
            t1 = time.perf_counter()
            print(f"== {e.name}: {e.title}", flush=True)
            rep = bump_builds(plan, {"base": pinned, "candidate": builds[e.name]}, manifest=m,
                              command=f"{command} ({e.name})", out=out / e.name if out else None, jobs=jobs,
                              base_run=base)
            finish_bump(rep, out / e.name if out else None, None)
            activate(builds[e.name])
            check = cp.run_check(e, cp.fixture_for(m.row(e.row), Path(d)))
            activate(pinned)
            results.append(res := cp.entry_result(e, rep, check, on_pinned[e.name], time.perf_counter() - t1))
            verdict = "caught by " + ", ".join(res["by"]) if res["caught"] else "ESCAPED"
            print(f"{e.name:<{width}} {e.klass:<9} {verdict}; direct check: {cp.check_cell(res['check'])}",
                  flush=True)
    lanes = sum(len(ls) for _, ls in plan)
    gate = {"tier": tier, "rows": [r.key for r, _ in plan], "partial": bool(row), "jobs": jobs_run,
            "description": f"`family-certify bump --tier {tier}" + "".join(f" --job {j}" for j in jobs_run)
            + " --patches ENTRY`" + (" (partial: --row)" if row else "")
            + f" — {len(plan)} rows, {lanes} lanes and a cross-build lane per row"}
    rep = cp.corpus_report(results, {"passes": not failing, "failing": failing, "totals": base["totals"]},
                           command=command, gate=gate, wall_s=time.perf_counter() - t0)
    print("\n" + cp.corpus_md(rep).split("\n", 1)[0].removeprefix("## "))
    if out is not None:
        cp.write_corpus(out, rep)
        print(f"wrote {out}/summary.md, junit.xml, report.json")
    if report is not None:
        report.parent.mkdir(parents=True, exist_ok=True)
        report.write_text(json.dumps(rep, indent=2) + "\n")
    return rep["exit_code"]


@app.command("admit")
def admit_cmd(
    model: Annotated[Path, typer.Argument(help="the GGUF to split (the real model)")],
    certificate_path: Annotated[Path, Opt("--certificate", help="certificate.json (or the --out directory of a "
                                                                 "run that wrote one)")],
    cuts: Annotated[str | None, Opt(help="where the stages are cut, e.g. 5,12")] = None,
    stages: Annotated[int | None, Opt(help="as many stages of as equal a size as can be (default 2, when --cuts "
                                           "is not given)")] = None,
    build: Annotated[str | None, Opt(help="the llama.cpp build the runtime runs: a commit (7+ characters) or a "
                                          "build key; refused when the certificate is another build's")] = None,
) -> int:
    """May MODEL be split at these cuts? One line: admitted (exit 0: the certificate row and boundaries) or refused
    (exit 1: no row for the architecture, a layer pattern no certified fixture has, a boundary the certificate
    refused or never certified, another build); exit 2 for bad input."""
    if cuts is not None and stages is not None:
        raise UserError("give --cuts or --stages, not both")
    cert = read_certificate(certificate_path)
    if not model.is_file():
        raise UserError(f"{model}: no such GGUF file")
    at = None
    if cuts is not None:
        try:
            at = [int(x) for x in cuts.replace(" ", "").split(",") if x]
        except ValueError:
            raise UserError(f"--cuts {cuts!r}: expected layer indices, e.g. 5,12") from None
    elif (stages or 2) < 2:
        raise UserError(f"--stages {stages}: at least 2")
    ok, line = admit(model, cert, at, build, stages=stages or 2)
    print(line)
    return 0 if ok else 1


@app.command("roster")
def roster_cmd(
    certificate_path: Annotated[Path, typer.Argument(help="certificate.json (or the --out directory holding it)")],
    skippy_abi: Annotated[str | None, Opt(help="skippy's ABI (default: the one a run on skippy recorded)")] = None,
    patch_queue_sha256: Annotated[str | None, Opt(help="the sha256 of skippy's patch queue (default: the patch "
                                                       "series the certificate's build applied)")] = None,
    llama_upstream_sha: Annotated[str | None, Opt(help="the llama.cpp commit skippy's recipe pins (default: the "
                                                       "certificate's build's)")] = None,
    out: Annotated[Path | None, Opt(help="write it here (default: print it)")] = None,
) -> int:
    """The certificate as skippy's split-certified.json roster: the architectures certified at every boundary."""
    recipe = {"skippy_abi": skippy_abi, "patch_queue_sha256": patch_queue_sha256,
              "llama_upstream_sha": llama_upstream_sha}
    text = json.dumps(roster(read_certificate(certificate_path), **recipe), indent=2) + "\n"
    if out is None:
        print(text, end="")
    else:
        out.write_text(text)
    return 0


@app.command()
def table(file: FileArg = None,
          target: Annotated[str, Opt(help=TARGETS_HELP)] = "llama-cpp") -> None:
    """Markdown table for docs/benchmarks.md: family, tier, arch, fixture size, loads, decodes (measured now)."""
    m = load_manifest(file)
    print("| row | family | tier | arch | fixture bytes | loads | decodes (distinct of 32) |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as d, open_target(target) as t:
        for r in m.rows.values():
            if not r.runnable:
                print(f"| {r.key} | {r.name} | {r.tier} | {r.arch} | — | no: {r.reason} | — |")
                continue
            path = Path(d) / f"{r.key}.gguf"
            size = write_fixture(r.spec(), path)
            res = lane_load(r, path, t)
            loads = "yes" if res.data.get("loaded") else f"no: {res.detail[:60]}"
            dec = f"yes ({res.data.get('distinct')})" if res.status == "pass" else f"no: {res.detail[:60]}"
            print(f"| {r.key} | {r.name} | {r.tier} | {r.arch} | {size} | {loads} | {dec} |")


app.command("coverage")(coverage_command)
app.command("mutate")(mutate_command)


def main(argv: list[str] | None = None) -> None:
    sys.exit(run(app, "family-certify", argv))
