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
  family-certify admit MODEL --certificate C  may this GGUF be split at these cuts? (a run's certificate.json)
  family-certify roster CERTIFICATE            the certificate as skippy's split-certified.json
  family-certify table                        family, tier, arch, fixture size, loads, decodes (docs/benchmarks.md)
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer

from fuzz.certify.certificate import admit, certificate, read_certificate, roster
from fuzz.certify.outputs import build_name, manifest_identity, merge, read_run, run_report, write_outputs
from fuzz.certify.shards import load_durations, measured, plan_shards, refresh_durations
from fuzz.cli import BackendOpt, LlamaCppOpt, PatchesOpt, use_build
from fuzz.engine.contract import CRASH, FAILING, FINDING, KNOWN, MISSING, NUMERICS, PASS, SKIPPED, UNSUPPORTED, Report
from fuzz.engine.progress import Progress
from fuzz.engine.stages import PLANNER, FixtureStages, cut_sets
from fuzz.oracles.determinism import DeterminismConfig
from fuzz.oracles.handoff import HandoffConfig
from fuzz.oracles.isolation import IsolationConfig
from fuzz.oracles.memory import MemoryConfig
from fuzz.oracles.prefix_cache import PrefixCacheConfig
from fuzz.oracles.radix import LANE_PLANS, RadixConfig
from fuzz.oracles.registry import ORACLES
from fuzz.oracles.sweep import SweepConfig
from fuzz.repro.bundle import bundle_findings
from synth.cliutil import new_app, run
from synth.dtype import DTYPES, MADE_SCALES
from synth.errors import UserError
from synth.families import get_family
from synth.make import write_fixture
from synth.manifest import LANES, SCAN_LANES, Manifest, Row, load_manifest
from targets import TARGETS_HELP, Target, open_target, share_cores
from targets.llama_server_worker import NO_SERVER, server_binary

app = new_app("Certify model families against the family-tier manifest (family_tiers.toml).")
Opt = typer.Option
FileArg = Annotated[Path | None, typer.Argument(help="manifest (default: ./family_tiers.toml)")]
JobOpt = Annotated[list[str] | None, Opt("--job", help="only the lanes of this CI job ([jobs] in the manifest: "
                                                   "gate, server, nightly; repeatable)")]
PROMPT = [1, 7, 3, 12, 5, 9, 2, 30]
WIDE_BLOCKS = {name for name, q in DTYPES.items() if q in MADE_SCALES}  # 256-wide blocks


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


def write_certificate(out: Path, run: dict[str, Any], manifest: Manifest) -> bool:
    """out/certificate.json, when every planned lane of the run ran; whether it was written."""
    cert = certificate(run, manifest)
    if cert is not None:
        (out / "certificate.json").write_text(json.dumps(cert, indent=2) + "\n")
    return cert is not None


def unclassified_architectures(m: Manifest, names: list[str]) -> bool:
    """Print a line per architecture of `names` the manifest does not classify; whether there was one."""
    missing = m.unclassified(names)
    for a in missing:
        print(f"unclassified architecture {a}: llama.cpp knows it and {m.path.name} neither has a row for it nor "
              f"lists it under [not_split_served]; add one or the other")
    return bool(missing)


DURATIONS = Path(__file__).resolve().parents[2] / ".github" / "family-certify-durations.json"


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


@dataclass
class LaneResult:
    row: str
    lane: str
    status: str  # one of fuzz.engine.contract.STATUSES
    detail: str = ""
    data: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    reports: list[Report] = field(default_factory=list)  # every oracle run of the lane
    cases: list[dict[str, Any]] = field(default_factory=list)  # each report's case config (for bundling)
    bundles: list[str] = field(default_factory=list)  # relative to the run's --out directory
    pictures: list[str] = field(default_factory=list)

    def add(self, rep: Report, case: dict[str, Any]) -> Report:
        """One more oracle run of the lane: the lane's status is then the worst of its runs."""
        self.reports.append(rep)
        self.cases.append(case)
        self.status = worst([r.status for r in self.reports])
        return rep

    def to_dict(self) -> dict[str, Any]:
        return {"row": self.row, "lane": self.lane, "status": self.status, "detail": self.detail,
                "seconds": round(self.seconds, 2), "data": self.data, "bundles": self.bundles,
                "pictures": self.pictures, "reports": [r.to_dict() for r in self.reports]}


def oracle_run(name: str, path: Path, cfg: Any) -> tuple[Report, dict[str, Any]]:
    o = ORACLES[name]
    return o.run(path, cfg), o.case_config(cfg)


def lane_load(row: Row, path: Path, target: Target) -> LaneResult:
    loaded = target.load(str(path))
    if not loaded.ok:
        return LaneResult(row.key, "load", FINDING, loaded.failure.message, {"loaded": False})
    out = target.generate(PROMPT, 32, chunk=5)
    if not out.ok:
        return LaneResult(row.key, "load", FINDING, out.failure.message, {"loaded": True})
    toks, logits = out.data["tokens"], out.data["logits"]
    ok = bool(np.isfinite(logits).all()) and len(set(toks)) >= 2
    finite = bool(np.isfinite(logits).all())
    return LaneResult(row.key, "load", PASS if ok else FINDING,
                      f"{loaded.data['arch']}, 32 tokens, {len(set(toks))} distinct, finite={finite}",
                      {"loaded": True, "distinct": len(set(toks)), "bytes": path.stat().st_size,
                       "llama_cpp_commit": loaded.data.get("llama_cpp_commit")})


@dataclass(frozen=True)
class LaneOptions:
    """What a run adds to its rows' lanes: the cut sets a runtime's topology planner chooses (`--cuts planner:CMD`,
    for each of `stages`), split beside the parity lane's every-cut sweep."""
    planner: str | None = None
    stages: tuple[int, ...] = (2,)


def lane_cuts(row: Row, lane: str) -> str | None:
    """The cut sets a lane splits the row's fixture at (a cut spec of stages.cut_sets, 2 stages), or None for a
    lane that does not split at cut sets: what the lanes run and what a run plans (check_cuts)."""
    if lane in ("parity", "dtype-all", "wire-all", "handoff-all", "determinism-chains"):
        return "all"
    if lane in ("boundary-sweep", "determinism"):
        return "period"
    if lane == "fixed-split":
        return str(max(1, row.spec().n_layer // 2))
    if lane in ("dtype", "wire", "handoff"):  # as the parity lane cuts, or by the period where the row sweeps it
        return "period" if "boundary-sweep" in row.lanes else "all"
    return None


CUT_ORACLES = ("sweep", "wire", "handoff", "determinism")  # the oracles whose results name their cut sets


def check_cuts(row: Row, lane: str, path: Path, res: LaneResult) -> LaneResult:
    """Planned = executed, per cut set: every run of a splitting oracle at the lane's own cut spec must have run
    every cut set the spec gives the fixture (a result each, unsupported included), and a lane that splits must
    have run one (or recorded that every split was refused); else the lane is missing. The planned sets go into
    the lane's data."""
    spec = lane_cuts(row, lane)
    if spec is None or res.status == SKIPPED or res.status in FAILING:
        return res
    st = FixtureStages(path, period=row.sweep_period)
    planned = cut_sets(spec, len(st.kinds), 2, st.period)
    res.data["cuts"] = {"spec": spec, "planned": planned}
    runs = [r for r in res.reports if r.oracle in CUT_ORACLES and r.config.get("cuts") == spec]
    want = {tuple(c) for c in planned}
    for r in runs:
        short = sorted(want - {tuple(x["cuts"]) for x in r.results if x.get("cuts") is not None})
        if short:
            return replace(res, status=MISSING, detail=f"planned cut sets not executed by {r.oracle}: "
                           f"{'; '.join(','.join(map(str, c)) for c in short)} — {res.detail}")
    refused = {tuple(c) for c in res.data.get("every_split_refused", [])}
    if not runs and refused != want:
        return replace(res, status=MISSING, detail=f"no run at the planned cut sets ({spec}) — {res.detail}")
    return res


def lane_sweep(row: Row, path: Path, lane: str, target_spec: str, options: LaneOptions = LaneOptions()) \
        -> LaneResult:
    cuts = lane_cuts(row, lane) or "all"
    cfg = SweepConfig(cuts=cuts, tokens=16, period=row.sweep_period if cuts == "period" else None,
                      target=target_spec)
    rep, case = oracle_run("sweep", path, cfg)
    res = LaneResult(row.key, lane, rep.status, sweep_detail(rep), {"summary": rep.summary,
                     "control": rep.extra["control"]}, reports=[rep], cases=[case])
    if lane == "fixed-split":
        return res
    # again with the batches real stages see: a prefill chunk of 37 rows (hidden states, past the first stage)
    # split by llama.cpp into ubatches of 16, 16 and 5 — larger than n_ubatch and not a multiple of it
    shaped = res.add(*oracle_run("sweep", path, replace(cfg, prompt_len=40, chunk=37, n_ubatch=SPLIT_UBATCH)))
    res.detail = f"ubatch 64, chunk 7: {res.detail} | ubatch {SPLIT_UBATCH}, chunk 37: " + (
        sweep_detail(shaped) if shaped.findings else f"{shaped.summary[PASS]}/{len(shaped.results)} pass")
    if lane == "parity" and options.planner:
        planned = [planner_sweep(res, path, replace(cfg, cuts=options.planner, stages=k), rep)
                   for k in options.stages if k <= row.spec().n_layer]
        res.data["planner"] = planned
        res.detail += "".join(f" | planner, {p['stages']} stages: {p['summary']}" for p in planned)
    return res


def planner_sweep(res: LaneResult, path: Path, cfg: SweepConfig, every: Report) -> dict[str, Any]:
    """The planner's cut sets swept like the lane's (added to the lane: a chosen cut that diverges fails it), and
    how they compare with the every-cut sweep: the cuts the planner never chooses (certified or not by the sweep),
    and the sets it chose that the toolkit refuses (a stage contract's reason) or that fail."""
    rep = res.add(*oracle_run("sweep", path, cfg))
    chose = [r["cuts"] for r in rep.results]
    used = {c for cs in chose for c in cs}
    never = [r["cuts"][0] for r in every.results if r["cuts"][0] not in used]
    refused = [{"cuts": r["cuts"], "reason": r.get("reason") or ""} for r in rep.results if r["status"] == UNSUPPORTED]
    failing = [{"cuts": r["cuts"], "status": r["status"]} for r in rep.results if r["status"] in FAILING]
    certified = sum(r["status"] == PASS for r in every.results if r["cuts"][0] in never)
    summary = (f"chose {'; '.join(','.join(map(str, cs)) for cs in chose)}: {counts(rep)}; never chooses "
               f"{len(never)} of the {len(every.results)} single cuts the sweep ran ({certified} of them certified)"
               + (f"; chose and refused: {', '.join(','.join(map(str, x['cuts'])) for x in refused)} "
                  f"({refused[0]['reason']})" if refused else ""))
    return {"stages": cfg.stages, "command": cfg.cuts.removeprefix(PLANNER), "chose": chose, "never_chose": never,
            "refused": refused, "failing": failing, "summary": summary}


SPLIT_UBATCH = 16  # the lanes' second batch shape: chunks of 37 rows split into ubatches of 16, 16, 5


def counts(rep: Report) -> str:
    return ", ".join(f"{v} {k}" for k, v in rep.summary.items() if v)


def sweep_detail(rep: Report) -> str:
    reasons = sorted({r["reason"] for r in rep.results if r["status"] == UNSUPPORTED and r.get("reason")})
    return (f"{len(rep.results)} cut sets: {counts(rep)}; control {rep.extra['control'].get('status')}"
            + (f"; unsupported: {reasons[0]}" if reasons else "")
            + (f"; first: {rep.findings[0].message}" if rep.findings else ""))


def worst(statuses: list[str]) -> str:
    """A lane of several runs: its first failing status; else pass if any run passed; else unsupported."""
    return next((s for s in statuses if s in FAILING), PASS if PASS in statuses else UNSUPPORTED)


def lane_dtype(row: Row, workdir: Path, target_spec: str, *, cuts: str | None = None, lane: str = "dtype",
               dtypes: list[str] | None = None) -> LaneResult:
    """The row's fixture with its matmul weights in each of the row's dtypes (or `dtypes`; gguf-py's quantizers),
    split as the parity lane splits it (or at `cuts`): every cut set bit-exact with the unsplit model of the same
    dtype."""
    dtypes = dtypes or row.dtypes
    if not dtypes:
        return LaneResult(row.key, lane, SKIPPED, "no dtypes for this row; set dtypes in [tiers.N] or the row")
    cuts = cuts or lane_cuts(row, lane)
    res = LaneResult(row.key, lane, UNSUPPORTED)
    parts, why = [], ""
    for dtype in dtypes:
        path, knobs = dtype_fixture(row, dtype, workdir)
        rep = res.add(*oracle_run("sweep", path, SweepConfig(cuts=cuts, period=row.sweep_period, tokens=8,
                                                             target=target_spec)))
        why = why or next((r["reason"] for r in rep.results if r["status"] == UNSUPPORTED and r.get("reason")), "")
        label = f"{dtype}@{knobs.embd}" if knobs.embd else dtype
        parts.append(f"{label}: {sweep_detail(rep)}" if rep.status in FAILING else
                     f"{label} {rep.summary[PASS]}/{len(rep.results)}")
    res.detail = f"cut sets passing per dtype ({cuts}): " + ", ".join(parts) + \
        (f"; unsupported: {why}" if res.status == UNSUPPORTED and why else "")
    return res


def dtype_fixture(row: Row, dtype: str, workdir: Path) -> tuple[Path, Any]:
    """The row's fixture with its matmul weights in this dtype (and its knobs)."""
    path = workdir / f"{row.key}.{dtype}.gguf"
    knobs = replace(row.knobs(), dtype=dtype)
    if dtype in WIDE_BLOCKS and knobs.embd is None:  # their blocks hold 256 values: rows of 256
        knobs = replace(knobs, embd=256)
    write_fixture(get_family(str(row.recipe["family"])).resolve(knobs), path)
    return path, knobs


def lane_wire(row: Row, path: Path, target_spec: str, *, cuts: str | None = None, lane: str = "wire",
              wires: list[str] | None = None) -> LaneResult:
    """The row's split (as the parity lane cuts it) with the hidden states crossing each boundary in each of the
    row's wire types (or `wires`): every stage after a boundary bit-exact with the reference conversion; tokens vs
    the unsplit model gated (f16) or measured (bf16, q8_0)."""
    from fuzz.oracles.wire import WireConfig

    wires = wires or row.wires
    if not wires:
        return LaneResult(row.key, lane, SKIPPED, "no wires for this row; set wires in [tiers.N] or the row")
    cuts = cuts or lane_cuts(row, lane)
    res = LaneResult(row.key, lane, UNSUPPORTED)
    parts = []
    for w in wires:
        try:
            rep = res.add(*oracle_run("wire", path, WireConfig(wire=w, cuts=cuts, period=row.sweep_period,
                                                               tokens=8, target=target_spec)))
        except UserError as e:  # a wire the model's width cannot carry (q8_0 blocks of 32)
            parts.append(f"{w}: unsupported ({e})")
            continue
        m = [r["vs_unsplit"] for r in rep.results if r.get("vs_unsplit")]
        agree = min((x["token_agreement"] for x in m), default=None)
        parts.append(f"{w}: {rep.findings[0].message}" if rep.findings else
                     f"{w} {rep.summary[PASS]}/{len(rep.results)}" + (
                         f" (tokens ≥ {agree:.0%}, max |Δlogit| {max(x['max_abs_dlogit'] for x in m):.2g})" if m
                         else ""))
    why = next((r["reason"] for rep in res.reports for r in rep.results if r["status"] == UNSUPPORTED), "")
    res.detail = f"cut sets passing per wire ({cuts}): " + ", ".join(parts) + \
        (f"; unsupported: {why}" if res.status == UNSUPPORTED and why else "")
    return res


def lane_isolation(row: Row, path: Path, target_spec: str) -> LaneResult:
    rep, case = oracle_run("isolation", path, IsolationConfig(target=target_spec))
    if not rep.findings:
        worst_d = max((r["max_abs_dlogit"] for r in rep.results if r["status"] == PASS), default=0.0)
        numerics = f"; {len(rep.numerics)} moved by numerics, not leaks ({rep.numerics[0].cause['kind']})" \
            if rep.numerics else ""
        detail = (f"{rep.config['n_seq']} sequences per batch, KV unified and per sequence, flash attention "
                  f"{'/'.join('on' if x else 'off' for x in rep.config['flash_attn'])}: max |Δlogit| vs alone "
                  f"{worst_d:.1e} (tolerance {rep.config['tol']:g}){numerics}")
    else:
        f = rep.findings[0]
        detail = f"{len(rep.findings)} findings; first: {f.message}; reproduced={f.reproduced}"
    return LaneResult(row.key, "isolation", rep.status, detail, reports=[rep], cases=[case])


def lane_memory(row: Row, path: Path, target_spec: str) -> LaneResult:
    """Drawn programs of memory operations (fuzz memory's defaults, both KV layouts) on the model, and on its second
    half as a stage (fed rows: a stage's own context, a hybrid's perhaps starting on attention). A finding that is a
    committed upstream repro (corpora/repros, matched by its check, operation and cause whatever the family) is
    known; any other fails the lane."""
    n = row.spec().n_layer
    runs_of = [oracle_run("memory", path, MemoryConfig(target=target_spec))]
    if n > 1:
        runs_of.append(oracle_run("memory", path, MemoryConfig(target=target_spec, programs=4,
                                                               stage=f"{n // 2}:{n}")))
    reps, cases = [r for r, _ in runs_of], [c for _, c in runs_of]
    repros = known_findings(row, reps)
    new = [f for rep in reps for f in rep.findings if repros[id(f)] is None]
    runs = [r for rep in reps for r in rep.results]
    did = (f"{len(runs)} programs (model and stage {n // 2}:{n}), {sum(r['steps'] for r in runs)} operations, "
           f"{sum(r['checks'] for r in runs)} logits checks")
    if new:
        f = new[0]
        cause = f"; cause: {f.cause['kind']}" if f.cause else ""
        return LaneResult(row.key, "memory", f.status, f"{len(new)} findings; first: {f.message} after "
                          f"{len(f.detail['program'])} operations{cause}; reproduced={f.reproduced}",
                          reports=reps, cases=cases)
    names = sorted({r for r in repros.values() if r})
    if names:
        return LaneResult(row.key, "memory", KNOWN, f"{did}; only upstream's known memory bugs: {', '.join(names)}",
                          data={"known": [f"corpora/repros/{n}" for n in names]}, reports=reps, cases=cases)
    return LaneResult(row.key, "memory", worst([r.status for r in reps]), did, reports=reps, cases=cases)


def lane_prefix_cache(row: Row, path: Path, target_spec: str) -> LaneResult:
    """Rounds of concurrent duplicate inserts and one client's rewind conversations (prefix_cache.py), then the
    radix engine on the lane's plans (a seeded sample of each plan's interleavings) and on 48 schedules of prompt
    trees drawn per schedule — counted, no time limit — in both KV layouts llama-server has: one cache per slot (-np
    given) and one for all slots (its default without -np)."""
    if server_binary() is None:
        return LaneResult(row.key, "prefix-cache", SKIPPED,
                          NO_SERVER)
    server = target_spec if target_spec.startswith(("mutant:server-", "mutant:radix-")) else "llama-server"
    reps, cases = [], []
    for unified in (False, True):
        for oracle, cfg in (("prefix-cache", PrefixCacheConfig(rounds=3, tokens=6, target=server, kv_unified=unified)),
                            ("radix", RadixConfig(plan=LANE_PLANS, limit=6, budget=0.0, tokens=6, target=server,
                                                  kv_unified=unified)),
                            # prompt trees drawn per schedule: divergence points anywhere, at and just before a
                            # prompt's end, around the sliding window; random clients, PCT interleavings
                            ("radix", RadixConfig(tree="drawn", mode="pct", clients=2, ops=3, limit=2, schedules=48,
                                                  budget=0.0, tokens=6, target=server, kv_unified=unified))):
            rep, case = oracle_run(oracle, path, cfg)
            reps.append(rep)
            cases.append(case)
    rounds = [r for r in reps if r.oracle == "prefix-cache"]
    scheds = [r for r in reps if r.oracle == "radix"]
    repros = known_findings(row, reps)
    bad = next((r for r in reps if any(repros[id(f)] is None for f in r.findings)), None)
    if bad is None:
        reused = sum(c for r in rounds for x in r.results for c in x["cache_n"])
        rewinds = [c for r in rounds for c in r.extra.get("rewinds") or []]
        noise = next((r.extra["noise"] for r in scheds if r.extra.get("noise")), None)
        moved = sum(len(r.numerics) + len(r.extra.get("numerics", [])) for r in reps)
        detail = (f"llama-server, one KV cache per slot and one for all: {len(rounds[0].results)} rounds of concurrent "
                  f"duplicate inserts each: answers as uncached, slots freed; {reused} prompt tokens from the cache; "
                  f"{len(rewinds)} rewind conversations (one client, the slot erased between them): answers as "
                  f"uncached, {sum(sum(c['cache_n']) for c in rewinds)} prompt tokens from the cache; "
                  f"{sum(r.extra['explored'] for r in scheds)} radix schedules (save, restore, disconnect, second "
                  f"turns, host cache; {sum(r.extra['explored'] for r in scheds if r.config.get('tree') == 'drawn')} "
                  f"on drawn prompt trees): clean, {sum(x['reused'] for r in scheds for x in r.results)} prompt tokens "
                  f"reused (promised {sum(x['promised'] for r in scheds for x in r.results)})"
                  + (f"; one KV cache: placement moves answers by {noise['placement']:.1g}, picks below "
                     f"{noise['near_tie']:.1g} not judged" if noise and noise["placement"] is not None else "")
                  + (f"; {moved} answers moved by the shared KV cache, not the prompt cache" if moved else ""))
        names = sorted({n for n in repros.values() if n})
        if names:  # every finding is a committed upstream repro: known, named
            return LaneResult(row.key, "prefix-cache", KNOWN, f"{detail}; only upstream's known findings: "
                              f"{', '.join(names)}", data={"known": [f"corpora/repros/{n}" for n in names]},
                              reports=reps, cases=cases)
    else:
        f = next(f for f in bad.findings if repros[id(f)] is None)
        layout = "one KV cache for all slots" if bad.config.get("kv_unified") else "one KV cache per slot"
        detail = f"{bad.oracle} ({layout}): {len(bad.findings)} findings; first: {f.message}; reproduced={f.reproduced}"
    return LaneResult(row.key, "prefix-cache", worst([r.status for r in reps]), detail, reports=reps, cases=cases)


def known_findings(row: Row, reps: list[Report]) -> dict[int, str | None]:
    """Each finding of the reports (by id) → the committed upstream repro it is (corpora/repros, matched by what
    it is: fuzz.repro.campaign.known_repro), or None."""
    from fuzz.repro.campaign import known_repro, known_upstream

    known = known_upstream()
    family = str(row.recipe.get("family", row.key))
    return {id(f): known_repro(known, family, f) for rep in reps for f in rep.findings}


def lane_handoff(row: Row, path: Path, target_spec: str, *, cuts: str | None = None, lane: str = "handoff") \
        -> LaneResult:
    cuts = cuts or lane_cuts(row, lane)
    cfg = HandoffConfig(cuts=cuts, period=row.sweep_period, prompt_len=8, tokens=3, target=target_spec)
    rep, case = oracle_run("handoff", path, cfg)
    refused = None
    if rep.summary[UNSUPPORTED] == len(rep.results):  # no split expressible: hand off the unsplit model's state
        why = rep.results[0].get("reason")
        refused = [r["cuts"] for r in rep.results]
        cfg = replace(cfg, cuts="none", period=None)
        rep, case = oracle_run("handoff", path, cfg)
        cuts = f"none; every split unsupported: {why}"
    detail = f"{len(rep.results)} cut sets ({cuts}): {counts(rep)}"
    if rep.findings:
        detail += f"; first: {rep.findings[0].message}"
    elif rep.status == UNSUPPORTED:
        detail += f"; {rep.results[0].get('reason')}"
    res = LaneResult(row.key, lane, rep.status, detail, {"summary": rep.summary}, reports=[rep], cases=[case])
    if refused is not None:
        res.data["every_split_refused"] = refused
    # again with prefill chunks of 5 rows split into ubatches of 3 and 2 (larger than n_ubatch, not a multiple);
    # the busy mode (a live neighbour in the importing context) ran above: it is about the neighbour, not the shape
    plain = tuple(m for m in cfg.modes if m != "busy")
    shaped = res.add(*oracle_run("handoff", path, replace(cfg, n_ubatch=3, modes=plain)))
    res.detail += " | ubatch 3, chunk 5: " + (f"first: {shaped.findings[0].message}" if shaped.findings
                                             else counts(shaped))
    if lane == "handoff" and row.tier == 1:
        # and at the prompt offsets one either side of each constant a prefill crosses (the ubatch, the sliding
        # window, a delta-net chunk), the prompt prefilled in chunks of 64 so a chunk really reaches them
        from fuzz.oracles.handoff import structural_offsets

        offs = structural_offsets(path, SPLIT_UBATCH)
        edges = res.add(*oracle_run("handoff", path, replace(cfg, n_ubatch=SPLIT_UBATCH, chunk=64, modes=plain,
                                                             offsets=tuple(offs), prompt_len=max(offs) + 2)))
        res.detail += f" | offsets {','.join(map(str, offs))} (ubatch {SPLIT_UBATCH}, chunk 64): " + (
            f"first: {edges.findings[0].message}" if edges.findings else counts(edges))
    return res


def lane_determinism(row: Row, path: Path, target_spec: str, *, cfg: DeterminismConfig | None = None,
                     lane: str = "determinism") -> LaneResult:
    # the lane's chains too: every cut offset modulo the interleave, under every schedule (ubatch, chunking,
    # flash attention), bit-exact with the full model under the same schedule
    cfg = cfg or DeterminismConfig(repeats=2, tokens=8, cuts="period", period=row.sweep_period)
    rep, case = oracle_run("determinism", path, replace(cfg, target=target_spec))
    if rep.findings:
        return LaneResult(row.key, lane, rep.status, f"{len(rep.findings)} findings; first: {rep.findings[0].message}",
                          reports=[rep], cases=[case])
    n_pairs = sum(r["case"] == "pair" and r["status"] == NUMERICS for r in rep.results)
    schedules = sum(r["case"] == "same-schedule" for r in rep.results)
    chains = sum(r["case"] == "chain" and r["status"] == PASS for r in rep.results)
    return LaneResult(row.key, lane, PASS,
                      f"{schedules} schedules: same-schedule and threads-only bit-exact"
                      + (f", {chains} chains bit-exact with the full model" if chains else "")
                      + f"; {n_pairs} ubatch/chunking/flash-attn pairs not bit-exact (not promised upstream)"
                      + "".join(f" — |Δlogit| {p['max_abs']:.2g} in {p['pair'][1]}: {p['cause']['kind']}"
                                + (f" ({p['cause']['node']}, token {p['cause']['token']})" if "node" in p["cause"]
                                   else "")
                                for p in rep.extra.get("pairs", []) if p.get("cause") and p["tokens_equal"])
                      + (f"; {len(rep.numerics)} token flips explained as numerics ({rep.numerics[0].cause['kind']})"
                         if rep.numerics else ""),
                      reports=[rep], cases=[case])





def lane_reject(row: Row, path: Path, target: Target, target_spec: str) -> LaneResult:
    """A dropped family against the target's expectation: a clean 'unsupported family' refusal, or (for upstream
    llama.cpp, which keeps every arch) a normal load."""
    want = row.expect.get(target_spec) or row.expect.get(target_spec.split(":")[0], "")
    loaded = target.load(str(path))
    if want.startswith("rejects"):
        def refused(r: Any) -> bool:
            return not r.ok and r.failure.kind == "error" and "unsupported" in r.failure.message.lower()

        ok = refused(loaded)
        detail = loaded.failure.message if not loaded.ok else "loaded; expected a clean 'unsupported family' error"
        if ok and target_spec.startswith("skippy:"):  # and its stages too: no split may fall through to a config
            n = row.spec().n_layer
            split = target.call("split", path=str(path), cuts=[max(1, n // 2)], n_layer=n, model_id="fixture")
            ok = refused(split)
            detail = f"serve-openai: {detail}; serve-binary at cut {max(1, n // 2)}: " + (
                split.failure.message if not split.ok else "its stages started; expected a clean 'unsupported "
                                                           "family' error")
        return LaneResult(row.key, "reject", PASS if ok else FINDING, detail)
    if want == "loads":
        return LaneResult(row.key, "reject", PASS if loaded.ok else FINDING,
                          f"expected for {target_spec}: loads" + ("" if loaded.ok else f"; {loaded.failure.message}"))
    return LaneResult(row.key, "reject", SKIPPED, f"no expectation for target {target_spec} in the manifest")


def lane_skippy(row: Row, lane: str, path: Path, target: Target, target_spec: str, workdir: Path) -> LaneResult:
    """A lane against skippy (oracles/skippy.py): the lane's cut sets through skippy's stages and its own correctness
    lanes; the dtype lane on the row's fixture made in each dtype."""
    from fuzz.oracles.skippy import lane_config, lane_detail

    expect = row.expect.get("skippy", "")
    if expect.startswith("unsupported:"):  # the row's fixture cannot reach skippy's surface (the manifest says why)
        return LaneResult(row.key, lane, UNSUPPORTED, expect.removeprefix("unsupported:").strip())
    if lane == "load" and row.expect.get("skippy", "").startswith("rejects"):
        return LaneResult(row.key, lane, UNSUPPORTED, "skippy refuses this family by design; the reject lane checks "
                                                      "that it does so cleanly")
    if lane == "memory":
        return LaneResult(row.key, lane, UNSUPPORTED, "the memory lane drives llama.cpp's memory API (seq_rm, seq_cp, "
                                                      "state get/set per sequence); skippy's OpenAI API exposes none")
    cfg = lane_config(row, lane, target_spec)
    if cfg is None:
        return LaneResult(row.key, lane, SKIPPED, f"lane {lane} is not driven through skippy yet")
    paths = [path]
    if lane == "dtype":
        if not row.dtypes:
            return LaneResult(row.key, lane, SKIPPED, "no dtypes for this row; set dtypes in [tiers.N] or the row")
        paths = [dtype_fixture(row, dtype, workdir)[0] for dtype in row.dtypes]
    res = LaneResult(row.key, lane, UNSUPPORTED)
    parts = []
    for p in paths:
        rep = res.add(*oracle_run("skippy", p, cfg))
        if lane != "dtype":
            parts.append(lane_detail(rep))
        else:  # one word per dtype unless it failed
            dtype = p.stem.split(".")[-1]
            parts.append(f"{dtype}: {lane_detail(rep)}" if rep.status in FAILING else
                         f"{dtype} {rep.summary[PASS]}/{len(rep.results)}")
    res.detail = ("skippy serve at L/2, cases passing per dtype: " if lane == "dtype" else "") + \
        (", " if lane == "dtype" else " | ").join(parts)
    res.data["skippy"] = res.reports[0].extra.get("skippy", {}) if res.reports else {}
    return res


def run_lane(row: Row, lane: str, path: Path, target: Target, target_spec: str, workdir: Path,
             options: LaneOptions = LaneOptions()) -> LaneResult:
    if target_spec.startswith("skippy:") and lane != "reject":
        return lane_skippy(row, lane, path, target, target_spec, workdir)
    if lane == "load":
        return lane_load(row, path, target)
    if lane in ("parity", "boundary-sweep", "fixed-split"):
        return lane_sweep(row, path, lane, target_spec, options)
    if lane == "dtype":
        return lane_dtype(row, workdir, target_spec)
    if lane == "wire":
        return lane_wire(row, path, target_spec)
    if lane == "isolation":
        return lane_isolation(row, path, target_spec)
    if lane == "memory":
        return lane_memory(row, path, target_spec)
    if lane == "prefix-cache":
        return lane_prefix_cache(row, path, target_spec)
    if lane == "handoff":
        return lane_handoff(row, path, target_spec)
    if lane == "determinism":
        return lane_determinism(row, path, target_spec)
    if lane == "reject":
        return lane_reject(row, path, target, target_spec)
    if lane == "handoff-all":
        return lane_handoff(row, path, target_spec, cuts="all", lane=lane)
    if lane == "dtype-all":  # the row's dtypes, else its artifact's (q8_0 when the artifact names none)
        return lane_dtype(row, workdir, target_spec, cuts="all", lane=lane,
                          dtypes=row.dtypes or row.artifact_dtypes() or ["q8_0"])
    if lane == "wire-all":
        return lane_wire(row, path, target_spec, cuts="all", lane=lane, wires=row.wires or ["f16"])  # f16: the gate
    if lane == "determinism-full":  # the fuzz determinism defaults, unsplit
        return lane_determinism(row, path, target_spec, cfg=DeterminismConfig(), lane=lane)
    if lane == "determinism-chains":
        return lane_determinism(row, path, target_spec, cfg=DeterminismConfig(cuts="all", repeats=2, tokens=8),
                                lane=lane)
    return LaneResult(row.key, lane, SKIPPED, f"lane {lane} is not implemented yet")


def run_row(row: Row, lanes: list[str], target_spec: str, workdir: Path,
            working: Callable[[str], None] | None = None, options: LaneOptions = LaneOptions()) \
        -> Iterator[LaneResult]:
    """The row's lanes, each as it finishes (`working` told which one runs)."""
    if not row.runnable:
        yield from (LaneResult(row.key, lane, UNSUPPORTED, row.reason or "") for lane in lanes)
        return
    path = workdir / f"{row.key}.gguf"
    write_fixture(row.spec(), path)
    fixture = hashlib.sha256(path.read_bytes()).hexdigest()  # what was certified: the lanes' data names it
    with open_target(target_spec) as target:
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
    seen: list[dict[str, Any]] = []  # a finding both batch shapes show is bundled once
    for rep, case in zip(res.reports, res.cases, strict=True):
        if rep.findings:
            made = bundle_findings(rep, case, out / "bundles" / res.row, seen=seen)
            res.bundles += [str(p.relative_to(out)) for p in made]


def run_rows(tasks: list[tuple[Row, list[str], str, Path, LaneOptions]], jobs: int,
             finish: Callable[[LaneResult], LaneResult], each: Callable[[int, LaneResult], None],
             working: Callable[[str], None] | None = None) -> list[list[LaneResult]]:
    """Each task's row (its lanes on its target, its fixture written in its directory), `jobs` rows at a time; each
    lane through `finish` in the process that ran it (a function that process can import), then `each(task index,
    lane)` here as lanes finish; every row's lanes in the tasks' order. The first error a row raises is raised here
    once the rows running finished; no row starts after it.
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
    todo = list(enumerate(tasks))
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
                command: str, require_lanes: bool = False, jobs: int = 1, options: LaneOptions = LaneOptions()) \
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


OutOpt = Annotated[Path | None, Opt(help="write summary.md, junit.xml, report.json, bundles/ and pictures/ here")]
ReportOpt = Annotated[Path | None, Opt(help="write the run's JSON report here")]
CutsOpt = Annotated[str | None, Opt(help="planner:CMD — the parity lane also splits each row's fixture where this "
                                       "topology planner would (`CMD MODEL.gguf STAGES` prints one cut set per "
                                       "line) and says which cuts it never chooses and which it chose that are "
                                       "refused")]
StagesOpt = Annotated[list[int] | None, Opt("--stages", help="stage counts the planner is asked for (repeatable; "
                                                            "default 2)")]
PER_BUMP = ("gate", "server")  # the CI jobs that run on every bump (the canary's required jobs)
JobsOpt = Annotated[int, Opt(help="rows run at a time (2 on 2 cores: a row's lanes wait on their workers about "
                                  "half the time)")]


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
) -> int:
    """Certify a llama.cpp bump: the selected rows' lanes on the base and the candidate build, and a cross-build lane
    per row (the same prompt through both, unsplit); a verdict per row × lane — unchanged, broke, fixed, drifted,
    newly unsupported. Both builds are built (or taken from the cache) before any lane. Exit 1 if anything broke."""
    from targets.builds import resolve

    if candidate is None and patches is None:
        raise UserError("--candidate: name the build to move to (pinned, pypi:VERSION or a tree), or give --patches "
                        "to certify a patch series on the base")
    m: Manifest = load_manifest(manifest)
    plan = lane_plan(m, tier, rows, lane, jobs=job)
    if not plan:
        return nothing_planned(job)
    options = lane_options(cuts, stages)
    check_jobs(jobs)
    # the environment's build and patch series name what is certified: the candidate, never the base
    builds = {"base": resolve(base, base_patches, from_env=False), "candidate": resolve(candidate or base, patches)}
    if unclassified_architectures(m, builds["candidate"].arch_names()):
        return 1  # (before any lane: the roster would have no answer for a model of that architecture)
    rep = bump_builds(plan, builds, manifest=m, command="family-certify bump " + " ".join(sys.argv[2:]), out=out,
                      jobs=jobs, options=options)
    return finish_bump(rep, out, report)


def bump_builds(plan: list[tuple[Row, list[str]]], builds: dict[str, Any], *, manifest: Manifest, command: str,
                out: Path | None, jobs: int, base_run: dict[str, Any] | None = None,
                options: LaneOptions = LaneOptions()) -> dict[str, Any]:
    """The per-bump gate on two resolved builds (base, candidate): the plan's lanes on each (the base's run taken
    as given when base_run is), a cross-build lane per row, a verdict per row x lane; the bump report."""
    from fuzz.certify import bump as bp
    from targets.builds import activate, resolve

    t0 = time.perf_counter()
    runs = {"base": base_run} if base_run is not None else {}
    for which, b in builds.items():
        if which in runs:
            continue
        activate(b)
        print(f"== {which}: {b.spec}" + (f" + {b.identity['patches']['files']}" if b.identity.get("patches") else ""),
              flush=True)
        runs[which] = run_battery(plan, "llama-cpp", out / which if out else None, manifest=manifest.path,
                                  command=f"{command} ({which})", jobs=jobs, options=options)
        if out is not None:
            write_outputs(out / which, runs[which])
            write_certificate(out / which, runs[which], manifest)
    activate(resolve("pinned", from_env=False))
    cross = {}
    with tempfile.TemporaryDirectory(prefix="family-certify-") as d, \
            open_target("llama-cpp", env=builds["base"].env()) as ta, \
            open_target("llama-cpp", env=builds["candidate"].env()) as tb:
        for row, _ in plan:
            if not row.runnable:
                continue
            path = Path(d) / f"{row.key}.gguf"
            write_fixture(row.spec(), path)
            cross[row.key] = bp.with_chains(bp.cross_build(str(path), row.spec().n_vocab, ta, tb),
                                            bp.mixed_chains(str(path), {k: b.env() for k, b in builds.items()}))
            print(f"{row.key:<16} {bp.CROSS_LANE:<15} {cross[row.key]['verdict'].upper():<12} "
                  f"{cross[row.key]['detail']}", flush=True)
    return bp.bump_report(runs["base"]["build"], runs["candidate"]["build"],
                          bp.verdicts(runs["base"], runs["candidate"], cross), wall_s=time.perf_counter() - t0,
                          build_s={k: round(b.seconds, 1) for k, b in builds.items()}, command=command,
                          manifest=manifest_identity(manifest.path))


def read_bump(d: Path) -> dict[str, Any] | None:
    """The bump report a shard directory holds, or None when it holds something else (a run's report, nothing)."""
    f = d / "report.json" if d.is_dir() else d
    try:
        data = json.loads(f.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("kind") == "family-certify-bump" else None


def finish_bump(rep: dict[str, Any], out: Path | None, report: Path | None) -> int:
    """A bump's verdict: one line of totals, a line per lane that changed; summary.md, junit.xml, report.json."""
    from fuzz.certify import bump as bp
    print(", ".join(f"{v} {k}" for k, v in rep["totals"].items()) + f"; wall {rep['wall_s']:.0f} s")
    for x in rep["results"]:
        if x["verdict"] != bp.UNCHANGED:
            print(f"  {x['verdict'].upper()}: {x['row']} / {x['lane']}: {x['detail']}")
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "report.json").write_text(json.dumps(rep, indent=2) + "\n")
        (out / "summary.md").write_text(bp.bump_md(rep))
        (out / "junit.xml").write_bytes(bp.bump_junit(rep))
        print(f"wrote {out}/summary.md, junit.xml, report.json")
    if report is not None:
        report.parent.mkdir(parents=True, exist_ok=True)
        report.write_text(json.dumps(rep, indent=2) + "\n")
    return rep["exit_code"]


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
}


@app.command()
def mutants(manifest: Annotated[Path | None, Opt(help="manifest file")] = None,
            only: Annotated[list[str] | None, Opt("--mutant", help="only these mutants (repeatable)")] = None,
            out: Annotated[Path | None, Opt(help="write summary.md, junit.xml and report.json here (a lane is "
                                                  "'pass' when its mutant is caught)")] = None,
            llama_cpp: LlamaCppOpt = None, patches: PatchesOpt = None, jobs: JobsOpt = 1) -> int:
    """The battery against every mutant: each known bug class, re-created, must make its row's lane fail (caught);
    exit 1 if any escapes. With --llama-cpp, the mutants wrap that build; --jobs runs that many mutants at a time
    (lines in the mutants' order)."""
    from targets.mutants import MUTANTS

    m = load_manifest(manifest)
    use_build(llama_cpp, patches)
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
            tasks.append((m.row(row_key), [lane], f"mutant:{name}", workdir, LaneOptions()))
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
    job: Annotated[list[str] | None, Opt("--job", help="the CI jobs whose lanes make the gate (default: gate and "
                                                       "server, what runs per bump; repeatable)")] = None,
    manifest: Annotated[Path | None, Opt(help="manifest file")] = None,
    out: Annotated[Path | None, Opt(help="write summary.md, junit.xml, report.json here (and pinned/, ENTRY/: "
                                         "each build's run)")] = None,
    report: ReportOpt = None,
    jobs: JobsOpt = 1,
) -> int:
    """The battery measured on llama.cpp's own fixed bugs: every entry of the upstream corpus (a patch series that
    puts one back into the pinned tree) through the per-bump jobs as a user's CI runs them (`bump --job gate --job
    server --patches ENTRY`: every row of the tier and those jobs' lanes, nothing per bug) and through its direct
    check; the pinned build through the same once. Prints caught/escaped per entry. Exit 1 if the pinned build
    fails the gate or a check, a check does not show its bug, or the gate catches fewer than 90 %."""
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
    out: Annotated[Path | None, Opt(help="write it here (default: print it)")] = None,
) -> int:
    """The certificate as skippy's split-certified.json roster: the architectures certified at every boundary."""
    text = json.dumps(roster(read_certificate(certificate_path), skippy_abi, patch_queue_sha256), indent=2) + "\n"
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


def main(argv: list[str] | None = None) -> None:
    sys.exit(run(app, "family-certify", argv))
