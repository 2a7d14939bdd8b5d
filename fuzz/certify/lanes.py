"""The manifest's lanes: each lane is a function of the row (its fixture on disk, the target) that runs one or more
oracles with the lane's settings and says, in one LaneResult (lane_result.py), what the lane certifies (the
llama-server lanes: server_lanes.py); LANE_RUNNERS is the table
from a lane's name (family_tiers.toml) to its function. A lane's cut sets come from `lane_cuts`, and `check_cuts`
holds it to them (planned = executed)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from fuzz.certify.lane_result import LaneResult, known_findings, memory_verdict, no_new_findings, oracle_run
from fuzz.certify.server_lanes import lane_prefix_cache, lane_prompt_trees
from fuzz.engine.contract import FAILING, FINDING, MISSING, NUMERICS, PASS, SKIPPED, UNSUPPORTED, Report
from fuzz.engine.fixtures import quant_head_fixture
from fuzz.engine.stages import PLANNER, FixtureStages, cut_sets
from fuzz.oracles.determinism import DeterminismConfig
from fuzz.oracles.handoff_state import HandoffConfig
from fuzz.oracles.isolation import IsolationConfig
from fuzz.oracles.memory_configs import SHIFT_DELTA, YARN, capacity_config, pressure_config, shift_config
from fuzz.oracles.memory_machine import hung, sliding_window
from fuzz.oracles.memory_model import MemoryConfig
from fuzz.oracles.sampling import SamplingConfig
from fuzz.oracles.sweep_report import SweepConfig
from synth.dtype import DTYPES, MADE_SCALES
from synth.errors import UserError
from synth.families import get_family
from synth.make import write_fixture
from synth.manifest import Row
from targets import Target

PROMPT = [1, 7, 3, 12, 5, 9, 2, 30]


WIDE_BLOCKS = {name for name, q in DTYPES.items() if q in MADE_SCALES}  # 256-wide blocks


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


NO_OPTIONS = LaneOptions()  # a run's lanes without a planner


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


def lane_sweep(row: Row, path: Path, lane: str, target_spec: str, options: LaneOptions = NO_OPTIONS) \
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
                  f"{worst_d:.1e} (tolerance {max(v['tolerance'] for v in rep.extra['noise'].values()):.2g})"
                  f"{numerics}")
    else:
        f = rep.findings[0]
        detail = f"{len(rep.findings)} findings; first: {f.message}; reproduced={f.reproduced}"
    return with_sampling(row, path, target_spec, LaneResult(row.key, "isolation", rep.status, detail, reports=[rep],
                                                            cases=[case]))


def with_sampling(row: Row, path: Path, target_spec: str, res: LaneResult) -> LaneResult:
    """The isolation lane's sequences batched together once more, sampling in the graph (fuzz sampling: backend
    samplers, batches verifying drafts): its findings that are committed upstream repros make the lane `known` where
    isolation itself passes (no_new_findings); any other counts as the lane's."""
    smp, case = oracle_run("sampling", path, SamplingConfig(target=target_spec))
    repros = known_findings(row, [smp])
    if smp.findings and all(repros.values()) and res.status not in FAILING:
        return no_new_findings(row, "isolation", f"{res.detail}; sampling in the graph", "findings",
                               [*res.reports, smp], [*res.cases, case], repros)
    res.add(smp, case)
    first = smp.findings[0].message if smp.findings else ""
    res.detail += f"; sampling in the graph: {smp.status}" + (f" ({first})" if first else
                                                              f", {len(smp.results)} programs")
    return res


def lane_memory(row: Row, path: Path, target_spec: str) -> LaneResult:
    """Drawn programs of memory operations (fuzz memory's defaults, both KV layouts; half as many with flash attention)
    on the model, and on its second half as a stage (fed rows: a stage's own context, a hybrid's perhaps starting on
    attention), the program under memory pressure (a state imported into cells free in total but in no long enough
    run), with flash attention and without, programs that fill their KV streams and ask for more than is left, and
    (where the family's heads widen to 64 within a megabyte) programs on a q8_0 KV cache with flash attention, a bf16
    cache, and programs that cancel decodes part way (llama.cpp's abort callback).
    A finding that is a committed upstream repro (corpora/repros, matched by its check, operation and cause whatever
    the family) is known, and as many programs as met one are drawn again with other seeds (up to three rounds); any
    other finding fails the lane."""
    spec = row.spec()
    n = spec.n_layer
    configs = [(path, MemoryConfig(target=target_spec)),
               (path, MemoryConfig(target=target_spec, programs=4, flash_attn=True))]
    if n > 1:
        configs.append((path, MemoryConfig(target=target_spec, programs=4, stage=f"{n // 2}:{n}")))
    for fa in (False, True):  # (flash attention: llama-server's default on the CPU, where a server's cells interleave)
        configs.append((path, pressure_config(spec.n_vocab, target=target_spec, flash_attn=fa)))
    configs.append((path, capacity_config(target=target_spec)))
    wide = quant_head_fixture(row, path.parent)
    if wide is not None:  # (a quantized KV cache, as llama-server's -ctk/-ctv: on heads a whole number of blocks)
        configs.append((wide, MemoryConfig(target=target_spec, programs=2, flash_attn=True, type_k="q8_0",
                                           type_v="q8_0")))
    # and a bf16 one (-ctk/-ctv bf16: a float type without blocks, any head, flash attention off)
    configs.append((path, MemoryConfig(target=target_spec, programs=1, type_k="bf16", type_v="bf16")))
    # decodes the runtime cancels (llama.cpp's abort callback, after a drawn number of graph nodes)
    configs.append((path, MemoryConfig(target=target_spec, programs=2, aborts=True)))
    window = sliding_window(str(path)) > 0
    for full in (False, True) if window else ():  # three sequences filling one 768-cell cache: the window's cache
        # (256 cells, padded) reuses cells past the window; full-size (llama-server's --swa-full) it keeps them
        configs.append((path, capacity_config(target=target_spec, n_seq=3, context=768, kv_unified=(True,),
                                              swa_full=full)))
    runs_of = []
    for fixture, cfg in configs:  # (a hang ends the lane: every run more would wait out its calls' timeouts)
        runs_of.append(oracle_run("memory", fixture, cfg))
        if any(hung(f.detail) for f in runs_of[-1][0].findings):
            break
    reps, cases = [r for r, _ in runs_of], [c for _, c in runs_of]
    repros = known_findings(row, reps)
    new = [f for rep in reps for f in rep.findings if repros[id(f)] is None]
    # a program that met a known finding is spent on upstream's bug: as many are drawn again with other seeds (up to
    # three rounds), so a row's exploration does not end where a known bug begins
    met = sum(1 for v in repros.values() if v)
    spent, past, clean = met, 0, 0
    for again in range(1, 4):
        if new or not spent:
            break
        rep, case = oracle_run("memory", path, MemoryConfig(target=target_spec, programs=-(-spent // 2),
                                                            seed=again))
        reps.append(rep)
        cases.append(case)
        more = known_findings(row, [rep])
        repros.update(more)
        new = [f for f in rep.findings if more[id(f)] is None]
        spent = sum(1 for v in more.values() if v)
        past += len(rep.results)
        clean += len(rep.results) - len(rep.findings)
    runs = [r for rep in reps for r in rep.results]
    did = (f"{len(runs)} programs (model, with flash attention too, stage {n // 2}:{n}, under memory pressure with "
           "and without flash attention, filling the cache" + (", a q8_0 cache on 64-wide heads" if wide else "")
           + ", a bf16 cache, cancelled decodes"
           + (", three sequences filling a window's cache, and a full-size one" if window else "") + "), "
           f"{sum(r['steps'] for r in runs)} operations, "
           f"{sum(r['checks'] for r in runs)} logits checks"
           + (f"; {past} drawn past {met} known findings, {clean} of them clean" if past else ""))
    return memory_verdict(row, "memory", did, "memory bugs", reps, cases, repros)


def lane_shift(row: Row, path: Path, target_spec: str) -> LaneResult:
    """A context shift on every row: a whole sequence's positions moved (seq_add), then one more token, against the
    same tokens decoded at the new positions (the memory oracle's shift program: on a model whose positions are
    rotary the two must agree), in the model's own context and in a YaRN one, and with a full-size window cache where
    the model has a sliding window (llama.cpp shifts a window's cache only full-size: llama-server's --swa-full). A
    memory that cannot shift must refuse it and change nothing. Known findings as in the memory lane (committed
    upstream repros)."""
    n_vocab = row.spec().n_vocab
    configs = {"the model's positions": shift_config(n_vocab, target=target_spec),
               f"YaRN (frequency scale {YARN['rope_freq_scale']:g})": shift_config(n_vocab, target=target_spec,
                                                                                  **YARN)}
    if sliding_window(str(path)) > 0:
        configs["a full-size window cache"] = shift_config(n_vocab, target=target_spec, swa_full=True)
    runs_of = [oracle_run("memory", path, cfg) for cfg in configs.values()]
    reps, cases = [r for r, _ in runs_of], [c for _, c in runs_of]
    parts = []
    for rep, what in zip(reps, configs, strict=True):
        ran = [r for r in rep.results if r["status"] != UNSUPPORTED]
        if not ran:
            parts.append(f"{what}: unsupported ({rep.results[0].get('reason') if rep.results else 'no run'})")
        elif any(r["refused"].get("add") for r in ran):
            parts.append(f"{what}: refused (the memory cannot shift), nothing changed")
        else:
            worst_d = max(r["max_abs_dlogit"] for r in ran)
            parts.append(f"{what}: max|Δlogit| {worst_d:.1e} (tolerance {rep.extra['noise'].get('tolerance', 0):.2g})")
    did = f"a whole sequence shifted +{SHIFT_DELTA} then one more token, vs decoded there: " + "; ".join(parts)
    return memory_verdict(row, "shift", did, "shift bugs", reps, cases, known_findings(row, reps))


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
        from fuzz.oracles.handoff_state import structural_offsets

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
    if lane in ("memory", "shift"):
        return LaneResult(row.key, lane, UNSUPPORTED, f"the {lane} lane drives llama.cpp's memory API (seq_rm, "
                                                      "seq_add, state get/set per sequence); skippy's OpenAI API "
                                                      "exposes none")
    if lane == "prompt-trees":
        return LaneResult(row.key, lane, UNSUPPORTED, "the prompt-trees lane drives llama-server's slots (save, "
                                                      "restore, host prompt cache); skippy's prefix cache is checked "
                                                      "by the prefix-cache lane")
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


@dataclass(frozen=True)
class LaneCall:
    """What a lane is given: the row, the lane's name, the row's fixture on disk, the open target and its spec, a
    work directory for fixtures the lane makes, the run's options."""
    row: Row
    lane: str
    path: Path
    target: Target
    target_spec: str
    workdir: Path
    options: LaneOptions


def _sweep(c: LaneCall) -> LaneResult:  # parity, boundary-sweep, fixed-split: lane_cuts tells them apart
    return lane_sweep(c.row, c.path, c.lane, c.target_spec, c.options)


# every lane of the manifest (synth.manifest.LANES and the scan's) → how it runs; a test holds the two equal
LANE_RUNNERS: dict[str, Callable[[LaneCall], LaneResult]] = {
    "load": lambda c: lane_load(c.row, c.path, c.target),
    "parity": _sweep,
    "boundary-sweep": _sweep,
    "fixed-split": _sweep,
    "dtype": lambda c: lane_dtype(c.row, c.workdir, c.target_spec),
    "wire": lambda c: lane_wire(c.row, c.path, c.target_spec),
    "isolation": lambda c: lane_isolation(c.row, c.path, c.target_spec),
    "memory": lambda c: lane_memory(c.row, c.path, c.target_spec),
    "shift": lambda c: lane_shift(c.row, c.path, c.target_spec),
    "prefix-cache": lambda c: lane_prefix_cache(c.row, c.path, c.target_spec),
    "prompt-trees": lambda c: lane_prompt_trees(c.row, c.path, c.target_spec),
    "handoff": lambda c: lane_handoff(c.row, c.path, c.target_spec),
    "determinism": lambda c: lane_determinism(c.row, c.path, c.target_spec),
    "reject": lambda c: lane_reject(c.row, c.path, c.target, c.target_spec),
    # the scan's lanes: every cut, the row's dtypes (else its artifact's; q8_0 when it names none), the f16 gate
    "handoff-all": lambda c: lane_handoff(c.row, c.path, c.target_spec, cuts="all", lane=c.lane),
    "dtype-all": lambda c: lane_dtype(c.row, c.workdir, c.target_spec, cuts="all", lane=c.lane,
                                      dtypes=c.row.dtypes or c.row.artifact_dtypes() or ["q8_0"]),
    "wire-all": lambda c: lane_wire(c.row, c.path, c.target_spec, cuts="all", lane=c.lane,
                                    wires=c.row.wires or ["f16"]),
    "determinism-full": lambda c: lane_determinism(c.row, c.path, c.target_spec, cfg=DeterminismConfig(),
                                                   lane=c.lane),  # the fuzz determinism defaults, unsplit
    "determinism-chains": lambda c: lane_determinism(c.row, c.path, c.target_spec, lane=c.lane,
                                                     cfg=DeterminismConfig(cuts="all", repeats=2, tokens=8)),
}


def run_lane(row: Row, lane: str, path: Path, target: Target, target_spec: str, workdir: Path,
             options: LaneOptions = NO_OPTIONS) -> LaneResult:
    if target_spec.startswith("skippy:") and lane != "reject":
        return lane_skippy(row, lane, path, target, target_spec, workdir)
    return LANE_RUNNERS[lane](LaneCall(row, lane, path, target, target_spec, workdir, options))
