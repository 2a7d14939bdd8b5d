"""`family-certify`: the family-tier manifest (family_tiers.toml) and the lanes it drives.

  family-certify check [FILE] [--json]        validate the manifest, summarize it
  family-certify matrix [--tier N] [--json]   the CI matrix (one entry per runnable row)
  family-certify run [--tier N] [ROW ...]     run each row's lanes against a target; exit 1 on any failure
  family-certify table                        the README table: family, tier, arch, fixture size, loads, decodes
"""

from __future__ import annotations

import json
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer

from fuzz.determinism import Determinism, DeterminismConfig
from fuzz.handoff import Handoff, HandoffConfig
from fuzz.isolation import Isolation, IsolationConfig
from fuzz.parity import describe_node
from fuzz.prefix_cache import PrefixCache, PrefixCacheConfig
from fuzz.sweep import Sweep, SweepConfig, SweepReport
from synth.cliutil import new_app, run
from synth.dtype import DTYPES, MADE_SCALES
from synth.errors import UserError
from synth.families import get_family
from synth.make import write_fixture
from synth.manifest import Manifest, Row, load_manifest
from targets import TARGETS_HELP, Target, open_target
from targets.llama_server_worker import server_binary

app = new_app("Certify model families against the family-tier manifest (family_tiers.toml).")
Opt = typer.Option
FileArg = Annotated[Path | None, typer.Argument(help="manifest (default: ./family_tiers.toml)")]
PROMPT = [1, 7, 3, 12, 5, 9, 2, 30]
WIDE_BLOCKS = {name for name, q in DTYPES.items() if q in MADE_SCALES}  # 256-wide blocks


@app.command()
def check(file: FileArg = None, as_json: Annotated[bool, Opt("--json", help="machine-readable")] = False) -> None:
    """Validate the manifest (unknown keys, unknown families, duplicates, tiers, recipes) and summarize it."""
    m = load_manifest(file)
    if as_json:
        print(json.dumps({"manifest": str(m.path), "rows": [r.to_dict() for r in m.rows.values()]}, indent=2))
        return
    by_tier = Counter(r.tier for r in m.rows.values())
    runnable = sum(r.runnable for r in m.rows.values())
    print(f"{m.path}: {len(m.rows)} families valid — " + ", ".join(f"tier {t}: {by_tier[t]}" for t in sorted(by_tier))
          + f"; {runnable} runnable on the pinned llama.cpp")
    for r in m.rows.values():
        if not r.runnable:
            print(f"  not runnable: {r.key} ({r.arch}): {r.reason}")


@app.command()
def matrix(file: FileArg = None, tier: Annotated[int | None, Opt(help="only this tier")] = None,
           as_json: Annotated[bool, Opt("--json", help="GitHub Actions matrix JSON")] = True) -> None:
    """The CI matrix: {"include": [{"row", "tier", "arch", "lanes"}]} for runnable rows."""
    m = load_manifest(file)
    include = [{"row": r.key, "tier": r.tier, "arch": r.arch, "lanes": ",".join(r.lanes)}
               for r in m.select(tier) if r.runnable]
    print(json.dumps({"include": include}) if as_json else "\n".join(i["row"] for i in include))


@dataclass
class LaneResult:
    row: str
    lane: str
    status: str  # pass | fail | unsupported | skipped
    detail: str = ""
    data: dict[str, Any] = field(default_factory=dict)


def lane_load(row: Row, path: Path, target: Target) -> LaneResult:
    loaded = target.load(str(path))
    if not loaded.ok:
        return LaneResult(row.key, "load", "fail", loaded.failure.message, {"loaded": False})
    out = target.generate(PROMPT, 32, chunk=5)
    if not out.ok:
        return LaneResult(row.key, "load", "fail", out.failure.message, {"loaded": True})
    toks, logits = out.data["tokens"], out.data["logits"]
    ok = bool(np.isfinite(logits).all()) and len(set(toks)) >= 2
    finite = bool(np.isfinite(logits).all())
    return LaneResult(row.key, "load", "pass" if ok else "fail",
                      f"{loaded.data['arch']}, 32 tokens, {len(set(toks))} distinct, finite={finite}",
                      {"loaded": True, "distinct": len(set(toks)), "bytes": path.stat().st_size})


def lane_sweep(row: Row, path: Path, lane: str, target_spec: str) -> LaneResult:
    if lane == "boundary-sweep":
        cfg = SweepConfig(cuts="period", tokens=16, period=row.sweep_period, target=target_spec)
    elif lane == "fixed-split":
        n = row.spec().n_layer
        cfg = SweepConfig(cuts=str(max(1, n // 2)), tokens=16, target=target_spec)
    else:
        cfg = SweepConfig(cuts="all", tokens=16, target=target_spec)
    rep = Sweep(path, cfg).run()
    status, detail = sweep_verdict(rep)
    return LaneResult(row.key, lane, status, detail, {"summary": rep.summary, "control": rep.control})


def sweep_verdict(rep: SweepReport) -> tuple[str, str]:
    """fail on any divergence, crash or timeout (control included); pass if a cut set passed; else unsupported."""
    s = rep.summary
    bad = s["diverged"] + s["crash"] + s["timeout"] + (rep.control.get("status") not in ("pass", "unsupported"))
    status = "fail" if bad else "pass" if s["pass"] else "unsupported"
    reasons = sorted({r.reason for r in rep.results if r.status == "unsupported" and r.reason})
    first = next((r for r in rep.results if r.status in ("diverged", "crash", "timeout")), None)
    detail = f"{len(rep.results)} cut sets: " + ", ".join(f"{v} {k}" for k, v in s.items() if v) + \
        f"; control {rep.control.get('status')}" + (f"; unsupported: {reasons[0]}" if reasons else "") + \
        (f"; first: cuts {first.cuts} {first.status} at layer {first.layer} ({first.reason or first.where})"
         + (f", first node {describe_node(first.node)}" if describe_node(first.node) else "") if first else "")
    return status, detail


def lane_dtype(row: Row, workdir: Path, target_spec: str) -> LaneResult:
    """The row's fixture with its matmul weights in each of the row's dtypes (gguf-py's quantizers), split as the
    parity lane splits it: every cut set bit-exact with the unsplit model of the same dtype."""
    if not row.dtypes:
        return LaneResult(row.key, "dtype", "skipped", "no dtypes for this row; set dtypes in [tiers.N] or the row")
    cuts = "period" if "boundary-sweep" in row.lanes else "all"
    statuses, parts, why = [], [], ""
    for dtype in row.dtypes:
        path = workdir / f"{row.key}.{dtype}.gguf"
        knobs = replace(row.knobs(), dtype=dtype)
        if dtype in WIDE_BLOCKS and knobs.embd is None:  # their blocks hold 256 values: rows of 256
            knobs = replace(knobs, embd=256)
        write_fixture(get_family(str(row.recipe["family"])).resolve(knobs), path)
        rep = Sweep(path, SweepConfig(cuts=cuts, period=row.sweep_period, tokens=8, target=target_spec)).run()
        status, detail = sweep_verdict(rep)
        why = why or next((r.reason for r in rep.results if r.status == "unsupported" and r.reason), "")
        statuses.append(status)
        label = f"{dtype}@{knobs.embd}" if knobs.embd else dtype
        parts.append(f"{label}: {detail}" if status == "fail" else f"{label} {rep.summary['pass']}/{len(rep.results)}")
    status = "fail" if "fail" in statuses else "pass" if "pass" in statuses else "unsupported"
    return LaneResult(row.key, "dtype", status, f"cut sets passing per dtype ({cuts}): " + ", ".join(parts)
                      + (f"; unsupported: {why}" if status == "unsupported" and why else ""))


def lane_isolation(row: Row, path: Path, target_spec: str) -> LaneResult:
    rep = Isolation(path, IsolationConfig(target=target_spec)).run()
    if not rep["findings"]:
        worst = max((r["max_abs_dlogit"] for r in rep["results"] if r["status"] == "pass"), default=0.0)
        numerics = f"; {len(rep['numerics'])} moved by numerics, not leaks ({rep['numerics'][0]['cause']['kind']})" \
            if rep["numerics"] else ""
        return LaneResult(row.key, "isolation", "pass", f"{rep['config']['n_seq']} sequences per batch, KV unified and "
                          f"per sequence: max |Δlogit| vs alone {worst:.1e} (tolerance {rep['config']['tol']:g})"
                          f"{numerics}")
    f = rep["findings"][0]
    what = f["reason"] if f["seq"] is None else (f"sequence {f['seq']} changes when batched (kv_unified="
                                                 f"{f['kv_unified']}, max |Δlogit| {f['max_abs_dlogit']:.3g})"
                                                 + (f", cause: {f['cause']['kind']}" if f.get("cause") else ""))
    return LaneResult(row.key, "isolation", "fail", f"{len(rep['findings'])} findings; first: {what}; "
                      f"reproduced={f['reproduced']}", {"findings": rep["findings"]})


def lane_prefix_cache(row: Row, path: Path, target_spec: str) -> LaneResult:
    if server_binary() is None:
        return LaneResult(row.key, "prefix-cache", "skipped",
                          "no llama-server binary: run scripts/build_llama_server.sh (make server)")
    server = target_spec if target_spec.startswith("mutant:server-") else "llama-server"
    rep = PrefixCache(path, PrefixCacheConfig(rounds=3, n_predict=6, target=server)).run()
    reused = sum(c for r in rep["rounds"] for c in r["cache_n"])
    if not rep["findings"]:
        return LaneResult(row.key, "prefix-cache", "pass", f"llama-server, {len(rep['rounds'])} rounds of concurrent "
                          f"duplicate inserts: answers as uncached, slots freed; {reused} prompt tokens from the cache")
    f = rep["findings"][0]
    return LaneResult(row.key, "prefix-cache", "fail", f"{len(rep['findings'])} findings; first: {f['kind']} in round "
                      f"{f['round']}: {f['message']}; reproduced={f['reproduced']}", {"findings": rep["findings"]})


def lane_handoff(row: Row, path: Path, target_spec: str) -> LaneResult:
    cuts = "period" if "boundary-sweep" in row.lanes else "all"
    rep = Handoff(path, HandoffConfig(cuts=cuts, period=row.sweep_period, prompt_len=8, tokens=3,
                                      target=target_spec)).run()
    s = rep["summary"]
    if s["unsupported"] == len(rep["results"]):  # no split expressible: hand off the unsplit model's state
        why = rep["results"][0].get("reason")
        rep = Handoff(path, HandoffConfig(cuts="none", prompt_len=8, tokens=3, target=target_spec)).run()
        s = rep["summary"]
        cuts = f"none; every split unsupported: {why}"
    bad = [r for r in rep["results"] if r["status"] in ("diverged", "crash", "timeout")]
    status = "fail" if bad else "pass" if s["pass"] else "unsupported"
    detail = f"{len(rep['results'])} cut sets ({cuts}): " + ", ".join(f"{v} {k}" for k, v in s.items() if v)
    if bad:
        detail += f"; first: cuts {bad[0]['cuts']}: {bad[0].get('reason')}"
        if describe_node(bad[0].get("node")):
            detail += f"; first node {describe_node(bad[0]['node'])}"
    elif status == "unsupported":
        detail += f"; {rep['results'][0].get('reason')}"
    return LaneResult(row.key, "handoff", status, detail, {"summary": s})


def lane_determinism(row: Row, path: Path, target_spec: str) -> LaneResult:
    rep = Determinism(path, DeterminismConfig(repeats=2, tokens=8, target=target_spec)).run()
    n_pairs = len(rep["summary"]["not_bit_exact_pairs"])
    if rep["findings"]:
        return LaneResult(row.key, "determinism", "fail", rep["findings"][0]["message"], {"findings": rep["findings"]})
    return LaneResult(row.key, "determinism", "pass",
                      f"{rep['summary']['schedules']} schedules: same-schedule and threads-only bit-exact; "
                      f"{n_pairs} ubatch/chunking/flash-attn pairs not bit-exact (not promised upstream)")


def lane_reject(row: Row, path: Path, target: Target, target_spec: str) -> LaneResult:
    """A dropped family against the target's expectation: a clean 'unsupported family' refusal, or (for upstream
    llama.cpp, which keeps every arch) a normal load."""
    want = row.expect.get(target_spec) or row.expect.get(target_spec.split(":")[0], "")
    loaded = target.load(str(path))
    if want.startswith("rejects"):
        ok = not loaded.ok and loaded.failure.kind == "error" and "unsupported" in loaded.failure.message.lower()
        detail = loaded.failure.message if not loaded.ok else "loaded; expected a clean 'unsupported family' error"
        return LaneResult(row.key, "reject", "pass" if ok else "fail", detail)
    if want == "loads":
        return LaneResult(row.key, "reject", "pass" if loaded.ok else "fail",
                          f"expected for {target_spec}: loads" + ("" if loaded.ok else f"; {loaded.failure.message}"))
    return LaneResult(row.key, "reject", "skipped", f"no expectation for target {target_spec} in the manifest")


def run_row(row: Row, lanes: list[str], target_spec: str, workdir: Path) -> list[LaneResult]:
    if not row.runnable:
        return [LaneResult(row.key, lane, "unsupported", row.reason or "") for lane in lanes]
    path = workdir / f"{row.key}.gguf"
    write_fixture(row.spec(), path)
    out = []
    with open_target(target_spec) as target:
        for lane in lanes:
            if lane == "load":
                out.append(lane_load(row, path, target))
            elif lane in ("parity", "boundary-sweep", "fixed-split"):
                out.append(lane_sweep(row, path, lane, target_spec))
            elif lane == "dtype":
                out.append(lane_dtype(row, workdir, target_spec))
            elif lane == "isolation":
                out.append(lane_isolation(row, path, target_spec))
            elif lane == "prefix-cache":
                out.append(lane_prefix_cache(row, path, target_spec))
            elif lane == "handoff":
                out.append(lane_handoff(row, path, target_spec))
            elif lane == "determinism":
                out.append(lane_determinism(row, path, target_spec))
            elif lane == "reject":
                out.append(lane_reject(row, path, target, target_spec))
            else:
                out.append(LaneResult(row.key, lane, "skipped", f"lane {lane} is not implemented yet"))
    return [known(row, r) for r in out]


def known(row: Row, r: LaneResult) -> LaneResult:
    """A lane the manifest lists under `known` (an upstream finding with its repro): failing as recorded is
    `known`, not a failure of this run; passing means the finding is gone and the entry must go (a failure) —
    unless it is marked "intermittent: ..." (it depends on timing, e.g. which slots a server batches together)."""
    what = row.known.get(r.lane)
    if what is None or r.status in ("skipped", "unsupported"):
        return r
    if r.status == "fail":
        return LaneResult(r.row, r.lane, "known", f"{what} — still reproduces: {r.detail}", r.data)
    if what.startswith("intermittent:"):
        return LaneResult(r.row, r.lane, r.status, f"{r.detail} (a known intermittent finding did not show this "
                          f"run: {what})", r.data)
    return LaneResult(r.row, r.lane, "fail", f"known finding no longer reproduces ({what}); remove known.{r.lane} "
                      f"from the manifest: {r.detail}", r.data)


@app.command("run")
def run_cmd(
    rows: Annotated[list[str] | None, typer.Argument(help="row names (default: every row of --tier)")] = None,
    tier: Annotated[int | None, Opt(help="only this tier")] = None,
    lane: Annotated[list[str] | None, Opt(help="only these lanes (repeatable)")] = None,
    manifest: Annotated[Path | None, Opt(help="manifest file")] = None,
    target: Annotated[str, Opt(help=TARGETS_HELP)] = "llama-cpp",
    report: Annotated[Path | None, Opt(help="write a JSON report here")] = None,
) -> int:
    """Run each selected row's lanes; print one line per lane; exit 1 if any lane fails."""
    m: Manifest = load_manifest(manifest)
    selected = m.select(tier, rows)
    if not selected:
        raise UserError("no rows selected; check --tier and the row names (`family-certify check`)")
    results: list[LaneResult] = []
    with tempfile.TemporaryDirectory(prefix="family-certify-") as d:
        for row in selected:
            lanes = [x for x in row.lanes if not lane or x in lane]
            for res in run_row(row, lanes, target, Path(d)):
                results.append(res)
                loud = "skipped: " if res.status == "skipped" else ""
                print(f"{res.row:<16} tier {row.tier}  {res.lane:<15} {res.status.upper():<12} {loud}{res.detail}",
                      flush=True)
    counts = Counter(r.status for r in results)
    print(f"{len(selected)} rows, {len(results)} lanes: " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())))
    if report:
        report.write_text(json.dumps([r.__dict__ for r in results], indent=2))
    return 1 if counts["fail"] else 0


# mutant → the manifest row and lane that must catch it (every mutant has one: tests/test_manifest.py)
CATCHERS: dict[str, tuple[str, str]] = {
    "b1-first-layer-probe": ("jamba", "handoff"),
    "b4-kidx-not-exported": ("deepseek3", "handoff"),
    "batched-rows-swapped": ("qwen3next", "parity"),
    "perturb-2-threads": ("llama", "determinism"),
    "rollback-zeroed": ("jamba", "handoff"),
    "seq-leak": ("llama", "isolation"),
    "server-dup-leak": ("llama", "prefix-cache"),
}


@app.command()
def mutants(manifest: Annotated[Path | None, Opt(help="manifest file")] = None,
            only: Annotated[list[str] | None, Opt("--mutant", help="only these mutants (repeatable)")] = None) -> int:
    """The battery against every mutant: each known bug class, re-created, must make its row's lane fail (caught);
    exit 1 if any escapes."""
    from targets.mutants import MUTANTS

    m = load_manifest(manifest)
    names = [n for n in MUTANTS if not only or n in only]
    unknown = sorted(set(only or ()) - set(MUTANTS))
    if unknown:
        raise UserError(f"--mutant {unknown[0]!r}: mutants are {', '.join(MUTANTS)}")
    escaped = 0
    with tempfile.TemporaryDirectory(prefix="family-certify-") as d:
        for name in names:
            row_key, lane = CATCHERS[name]
            row = m.row(row_key)
            (res,) = run_row(row, [lane], f"mutant:{name}", Path(d))
            caught = res.status == "fail"
            escaped += not caught
            print(f"{name:<22} {row_key + '/' + lane:<24} {'caught' if caught else 'ESCAPED (' + res.status + ')'}"
                  f"  {res.detail}", flush=True)
    print(f"{len(names)} mutants: {len(names) - escaped} caught, {escaped} escaped")
    return 1 if escaped else 0


@app.command()
def table(file: FileArg = None,
          target: Annotated[str, Opt(help=TARGETS_HELP)] = "llama-cpp") -> None:
    """Markdown table for the README: family, tier, arch, fixture size, loads, decodes (measured now)."""
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
