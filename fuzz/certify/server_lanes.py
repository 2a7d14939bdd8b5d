"""The llama-server lanes: per bump the prefix-cache lane (concurrent duplicate inserts, rewind conversations, the
radix engine's plans, a seeded prefix of the drawn prompt trees and of the drawn server options), nightly the
prompt-trees lane (the drawn trees and options in depth); each in both KV layouts llama-server has, judged together,
upstream's known findings named."""

from __future__ import annotations

import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fuzz.certify.lane_result import LaneResult, known_findings, no_new_findings, oracle_run, worst
from fuzz.engine.contract import SKIPPED, Report
from fuzz.engine.fleet import server_spec
from fuzz.oracles.prefix_cache import PrefixCacheConfig
from fuzz.oracles.radix import LANE_PLANS, RadixConfig, drawn_trees
from fuzz.oracles.server_options import ServerOptionsConfig
from synth.manifest import Row
from targets.llama_server_worker import NO_SERVER, server_binary

# drawn prompt-tree schedules per KV layout and host-cache setting (on, off): per bump a seeded prefix of what the
# nightly prompt-trees lane draws; each setting its own seed (host cache MiB -> seed: a seed draws the same trees)
PER_BUMP_TREES, NIGHTLY_TREES, CACHE_SEEDS = 6, 96, {64: 1, 0: 0}
# drawn server-option schedules (speculative decoding, n_cmpl, checkpoint flags; server_options.py), per bump a seeded
# prefix of the nightly's. One KV cache per slot only: in the one-for-all layout where a sequence sits moves its
# answer, and the prefix-cache oracle measures and judges that; the options are judged where placement cannot move it
PER_BUMP_OPTIONS, NIGHTLY_OPTIONS = 6, 48


def lane_prefix_cache(row: Row, path: Path, target_spec: str) -> LaneResult:
    """Rounds of concurrent duplicate inserts and one client's rewind conversations (prefix_cache.py), then the
    radix engine on the lane's plans (a seeded sample of each plan's interleavings) and on PER_BUMP_TREES schedules
    of prompt trees drawn per schedule (aimed at the slots' checkpoints) with the host prompt cache on and as many
    with it off, in both KV layouts llama-server has: one cache per slot (-np given) and one for all slots (its
    default without -np); and PER_BUMP_OPTIONS schedules of drawn server options (server_options.py), and as many
    more as met a known finding (server_lane)."""
    def runs(server: str, unified: bool) -> list[tuple[str, Any]]:
        return [("prefix-cache", PrefixCacheConfig(rounds=3, tokens=6, target=server, kv_unified=unified)),
                ("radix", RadixConfig(plan=LANE_PLANS, limit=6, budget=0.0, tokens=6, target=server,
                                      kv_unified=unified)),
                *(("radix", drawn_trees(PER_BUMP_TREES, target=server, kv_unified=unified, cache_ram=cache, seed=seed))
                  for cache, seed in CACHE_SEEDS.items()),
                *options(row, PER_BUMP_OPTIONS, server, unified)]
    return server_lane(row, "prefix-cache", path, target_spec, runs)


def lane_prompt_trees(row: Row, path: Path, target_spec: str) -> LaneResult:
    """The nightly depth of the server's drawn surface: NIGHTLY_TREES schedules of drawn prompt trees per KV layout,
    with the host prompt cache on and off (the per-bump prefix-cache lane runs the first PER_BUMP_TREES of each)."""
    def runs(server: str, unified: bool) -> list[tuple[str, Any]]:
        return [*(("radix", drawn_trees(NIGHTLY_TREES, target=server, kv_unified=unified, cache_ram=cache, seed=seed))
                  for cache, seed in CACHE_SEEDS.items()),
                *options(row, NIGHTLY_OPTIONS, server, unified)]
    return server_lane(row, "prompt-trees", path, target_spec, runs)


def options(row: Row, schedules: int, server: str, unified: bool) -> list[tuple[str, Any]]:
    """A lane's run of the drawn server options: `schedules` of them, in the one-cache-per-slot layout only, seeded
    by the row (the battery's rows draw different options; a row draws the same ones every run)."""
    seed = zlib.crc32(row.key.encode()) % 100_000
    return [] if unified else [("server-options", ServerOptionsConfig(schedules=schedules, target=server, seed=seed))]


def server_lane(row: Row, lane: str, path: Path, target_spec: str,
                runs: Callable[[str, bool], list[tuple[str, Any]]]) -> LaneResult:
    """A llama-server lane: its oracle runs in both KV layouts, judged together; upstream's known findings named. The
    drawn option schedules that met a known finding are spent on upstream's bug: as many are drawn past them, once
    (the schedules after the lane's), so a row's exploration does not end where a known bug begins."""
    if server_binary(build=True) is None:
        return LaneResult(row.key, lane, SKIPPED, NO_SERVER)
    server = server_spec(target_spec)
    reps, cases = [], []
    for unified in (False, True):
        for oracle, cfg in runs(server, unified):
            rep, case = oracle_run(oracle, path, cfg)
            reps.append(rep)
            cases.append(case)
    repros = known_findings(row, reps)
    bad = next((r for r in reps if any(repros[id(f)] is None for f in r.findings)), None)
    if bad is None:  # drawn option schedules spent on known findings: as many drawn past them (once)
        spent = [r for r in reps if r.oracle == "server-options" and r.findings]
        n = sum(len({f.step for f in r.findings}) for r in spent)
        if n:
            cfg = spent[0].config
            rep, case = oracle_run("server-options", path, ServerOptionsConfig(
                schedules=n, first=cfg["first"] + cfg["schedules"], target=server, seed=cfg["seed"]))
            reps.append(rep)
            cases.append(case)
            repros.update(known_findings(row, [rep]))
            bad = rep if any(repros[id(f)] is None for f in rep.findings) else None
    if bad is None:
        detail = "llama-server, one KV cache per slot and one for all: " + "; ".join(server_parts(reps))
        return no_new_findings(row, lane, detail, "findings", reps, cases, repros)
    f = next(f for f in bad.findings if repros[id(f)] is None)
    layout = "one KV cache for all slots" if bad.config.get("kv_unified") else "one KV cache per slot"
    detail = f"{bad.oracle} ({layout}): {len(bad.findings)} findings; first: {f.message}; reproduced={f.reproduced}"
    return LaneResult(row.key, lane, worst([r.status for r in reps]), detail, reports=reps, cases=cases)


def unjudged_part(scheds: list[Report]) -> str:
    """The schedules whose server log could not be judged (a build that does not say which checkpoint it restored
    is not passed on that count: it is said)."""
    n = sum(1 for r in scheds for x in r.results if x.get("unjudged"))
    why = next((x["unjudged"] for r in scheds for x in r.results if x.get("unjudged")), "")
    return f" ({n} schedules' checkpoint logs unjudged: {why})" if n else ""


def server_parts(reps: list[Report]) -> list[str]:
    """What a clean server lane checked, part by part (the rounds and rewinds, the radix schedules, the noise)."""
    rounds = [r for r in reps if r.oracle == "prefix-cache"]
    scheds = [r for r in reps if r.oracle == "radix"]
    parts = []
    if rounds:
        reused = sum(c for r in rounds for x in r.extra.get("rounds") or [] for c in x["cache_n"])
        rewinds = [c for r in rounds for c in r.extra.get("rewinds") or []]
        parts += [f"{len(rounds[0].extra.get('rounds') or [])} rounds of concurrent duplicate inserts each: answers "
                  f"as uncached, slots freed; {reused} prompt tokens from the cache",
                  f"{len(rewinds)} rewind conversations (one client, the slot erased between them): answers as "
                  f"uncached, {sum(sum(c['cache_n']) for c in rewinds)} prompt tokens from the cache"]
    if scheds:
        drawn = sum(r.extra["explored"] for r in scheds if r.config.get("tree") == "drawn")
        parts.append(f"{sum(r.extra['explored'] for r in scheds)} radix schedules (save, restore, disconnect, "
                     f"second turns, host cache; {drawn} on drawn prompt trees): clean, "
                     f"{sum(x['reused'] for r in scheds for x in r.results)} prompt tokens reused (promised "
                     f"{sum(x['promised'] for r in scheds for x in r.results)}); "
                     f"{sum(x.get('restores', 0) for r in scheds for x in r.results)} checkpoint restores, each of "
                     "the prompt's own tokens" + unjudged_part(scheds))
    drawn = [x for r in reps if r.oracle == "server-options" for x in r.results]
    past = sum(len(r.results) for r in reps if r.oracle == "server-options" and r.config.get("first"))
    if drawn:
        parts.append(f"{len(drawn)} drawn server-option schedules (speculative decoding, n_cmpl, checkpoint flags, "
                     f"embeddings; {sum(x.get('draft_n_accepted', 0) for x in drawn)} of "
                     f"{sum(x.get('draft_n', 0) for x in drawn)} draft tokens accepted"
                     + (f"; {past} drawn past schedules spent on known findings" if past else "")
                     + "): answers as uncached, slots freed")
    noise = next((r.extra["noise"] for r in scheds if r.extra.get("noise")), None)
    if noise and noise["placement"] is not None:
        parts.append(f"one KV cache: placement moves answers by {noise['placement']:.1g}, picks below "
                     f"{noise['near_tie']:.1g} not judged")
    moved = sum(len(r.numerics) + len(r.extra.get("numerics", [])) for r in reps)
    if moved:
        parts.append(f"{moved} answers moved by numerics the controls name, not by the prompt cache")
    return parts
