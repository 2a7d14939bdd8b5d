"""`family-certify bump`: what a llama.cpp bump (or a patch series) changes for split serving.

The selected rows' lanes run on the base build and on the candidate build (each built, or taken from the cache,
before any lane), and a cross-build lane per row runs the same fixture and prompt through both, unsplit. Each
row × lane gets a verdict:

  unchanged           the same outcome on both (both pass, or both fail the same way)
  broke               passes on the base, fails on the candidate — exit 1
  fixed               fails (a `known` upstream finding included) or is unsupported on the base, passes on the
                      candidate
  newly unsupported   ran on the base, unsupported on the candidate
  drifted             the cross-build lane only: greedy tokens differ between the builds

The prefix-cache lane also compares what the two builds reuse: its rewind conversations (one client, one slot:
deterministic) record the prompt tokens each request took from the cache; a candidate that takes fewer than the
base on any request reprocesses what the base resumed — a prompt-cache regression, `broke` (answers are the lane's
own to judge, on each build).

The cross-build policy (upstream promises no bit-exactness across commits, as across batch shapes): both builds
are teacher-forced with the base's greedy tokens; max |Δlogit| and NMSE (mse(a − b) / mse(a), llama.cpp's own test
measure) are reported; the first step whose greedy choice differs is `drifted`, with the base's top-1/top-2 margin
there (a near-tie flips on rounding; a wide margin is a real change). The lane also runs what a rolling upgrade does
across the machines of a split: sequence state exported by one build and imported by the other, and chains with
stage 0 on one build and stage 1 on the other — each must go on as the receiving build's own run or be refused with
an error; taken and wrong is `broke`."""

from __future__ import annotations

import contextlib
import json
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from fuzz.certify.battery import run_battery, write_certificate
from fuzz.certify.bump_known import fewer_known, fewer_offered, known_fixed, more_known, newly_refused
from fuzz.certify.lanes import NO_OPTIONS, LaneOptions
from fuzz.certify.outputs import manifest_identity, write_outputs
from fuzz.engine.contract import FAILING, KNOWN, MISSING, NUMERICS, PASS, SKIPPED, UNSUPPORTED
from fuzz.engine.schedule import prompt_tokens
from synth.make import write_fixture
from synth.manifest import Manifest, Row
from synth.stage import Unsupported
from targets import open_target
from targets.kvstate import kv_cells

UNCHANGED, BROKE, FIXED, NEWLY_UNSUPPORTED, DRIFTED = "unchanged", "broke", "fixed", "newly unsupported", "drifted"
VERDICTS = (BROKE, MISSING, DRIFTED, NEWLY_UNSUPPORTED, FIXED, UNCHANGED)
FAILED = (BROKE, MISSING)  # what makes a bump exit 1 (missing: planned, but no shard reported it)
CROSS_LANE = "cross-build"
POLICY = ("cross-build: not promised bit-exact; both builds teacher-forced with the base's greedy tokens, max |Δlogit| "
          "and NMSE reported, the first greedy choice that differs is `drifted` (with the base's margin there); "
          "a state imported wrong across the builds, a chain mixing them that moves past its bound, or the "
          "candidate's state of the same sequence carrying more KV cells than the base's is `broke`")
PROMPT_LEN, TOKENS = 16, 16
CROSS_FACTOR = 4.0  # a crossing moves at most this × what the two builds' own runs differ by (else it is wrong)
# a chain mixing two backends, measured on every tier-1 row (CPU and BLAS builds of the pinned tree, one prefill batch
# of 40 rows): at most 5.0× the backends' own unsplit spread (minimax-m2, BLAS stage 0 → CPU stage 1: one cached K
# value rounds to the other f16 in the chain than in either unsplit run; every other row ≤ 2.1×; chains on one
# backend bit-exact); docs/backends.md
BACKEND_FACTOR = 8.0


def outcome(status: str) -> str:
    """A lane's status as the bump compares it: ok, failing, unsupported (or skipped)."""
    if status in (PASS, NUMERICS, KNOWN):
        return "ok"
    if status in FAILING:
        return "failing"
    return "unsupported" if status in (UNSUPPORTED, SKIPPED) else status


def verdict(base: str, candidate: str) -> str:
    a, b = outcome(base), outcome(candidate)
    if a == b:
        return UNCHANGED
    if b == "unsupported":
        return NEWLY_UNSUPPORTED
    if b == "failing":  # (unsupported on the base and failing on the candidate: broke too)
        return BROKE
    return FIXED if b == "ok" else UNCHANGED  # failing or unsupported on the base, passing on the candidate


def teacher_forced(target: Any, path: str, prompt: list[int], tokens: list[int] | None, n: int) \
        -> tuple[list[int], np.ndarray] | str:
    """Prefill, then n steps fed `tokens` (None: greedy, each step's own argmax): the greedy choice and the logits
    row of every step; or why it failed."""
    r = target.load(path)
    if not r.ok:
        return f"load: {r.failure.message}"
    steps = [{"tokens": prompt, "pos": list(range(len(prompt))), "logits": "last"}]
    for k in range(n):
        steps.append({"tokens": [tokens[k] if tokens else f"argmax@{len(prompt) - 1 if k == 0 else 0}"],
                      "pos": [len(prompt) + k], "logits": "last"})
    r = target.script(steps, reset=True)
    if not r.ok:
        return f"{r.failure.kind}: {r.failure.message}"
    res = r.data["results"]
    return [int(x["argmax"][-1]) for x in res], np.stack([x["logits"][-1] for x in res]).astype(np.float64)


def cross_build(path: str, n_vocab: int, base: Any, candidate: Any, *, seed: int = 0) -> dict[str, Any]:
    """The cross-build lane on one fixture: base greedy, then both builds fed the base's tokens."""
    prompt = prompt_tokens(seed + 101, PROMPT_LEN, n_vocab)
    first = teacher_forced(base, path, prompt, None, TOKENS)
    if isinstance(first, str):  # nothing to compare with: does the candidate run it?
        other = teacher_forced(candidate, path, prompt, None, TOKENS)
        return {"verdict": UNCHANGED if isinstance(other, str) else FIXED,
                "detail": f"the base fails: {first}; the candidate " + (f"too: {other}" if isinstance(other, str)
                                                                        else "runs it")}
    fed = first[0][:TOKENS]
    a = teacher_forced(base, path, prompt, fed, TOKENS)
    b = teacher_forced(candidate, path, prompt, fed, TOKENS)
    if isinstance(a, str):
        return {"verdict": UNCHANGED, "detail": f"the base fails teacher-forced: {a}"}
    if isinstance(b, str):
        return {"verdict": BROKE, "detail": f"the candidate fails where the base runs: {b}"}
    (ta, la), (tb, lb) = a, b
    spread = float(np.max(np.abs(la - lb)))
    states = {"base → candidate": state_across(path, prompt, fed, base, candidate, lb, spread),
              "candidate → base": state_across(path, prompt, fed, candidate, base, la, spread)}
    wrong = [f"{k}: {v['detail']}" for k, v in states.items() if v["status"] == "wrong"]
    if wrong:
        return {"verdict": BROKE, "states": states, "detail": "sequence state imported silently wrong across the "
                "builds: " + "; ".join(wrong)}
    grew = state_growth(states)
    if grew:
        return {"verdict": BROKE, "states": states, "detail": grew}
    diff = la - lb
    nmse = float(np.mean(diff ** 2) / max(np.mean(la ** 2), 1e-30))
    out: dict[str, Any] = {"max_abs_dlogit": float(np.max(np.abs(diff))), "nmse": nmse, "tokens": len(ta),
                           "bit_exact": bool(np.array_equal(la, lb)), "states": states}
    crossing = "; state " + ", ".join(f"{k} {v['status']}" for k, v in states.items())
    step = next((k for k, (x, y) in enumerate(zip(ta, tb, strict=True)) if x != y), None)
    if step is None:
        return out | {"verdict": UNCHANGED, "detail": f"{len(ta)} greedy choices equal; max |Δlogit| "
                      f"{out['max_abs_dlogit']:.3g}, NMSE {nmse:.3g}" + (", bit-exact" if out["bit_exact"] else "")
                      + crossing}
    top = np.sort(la[step])[-2:]
    margin = float(top[1] - top[0])
    return out | {"verdict": DRIFTED, "step": step, "base_token": ta[step], "candidate_token": tb[step],
                  "base_margin": margin,
                  "detail": f"greedy choice differs at step {step} ({ta[step]} → {tb[step]}, the base's top-1/top-2 "
                            f"margin {margin:.3g}); max |Δlogit| {out['max_abs_dlogit']:.3g}, NMSE {nmse:.3g}"
                            + crossing}


def state_cells(blob: bytes) -> int | None:
    """The KV cells a full sequence export carries (every cache of a KV or sliding-window memory), or None for
    another memory (recurrent, hybrid: their state is not cells)."""
    for n_caches in (1, 2):
        caches = kv_cells(blob, n_caches)
        if caches is not None:
            return sum(len(positions) for positions, _ in caches)
    return None


def state_growth(states: dict[str, dict[str, Any]]) -> str | None:
    """Where the candidate's export of the same sequence (same model, same prompt) carries more KV cells than the
    base's, why that breaks a split: what crosses between stages grows, and an import needs a free cell for each (a
    cache sized for the base's state refuses it); else None."""
    a, b = states["base → candidate"].get("cells"), states["candidate → base"].get("cells")
    if a is None or b is None or b <= a:
        return None
    return (f"the candidate's export of the same sequence carries {b} KV cells where the base's carries {a}: the "
            f"state a stage sends grows, and an importer needs room for {b - a} more cells")


def state_across(path: str, prompt: list[int], fed: list[int], src: Any, dst: Any, own: np.ndarray,
                 spread: float) -> dict[str, Any]:
    """A rolling upgrade's hand-off: the prompt's sequence state exported by one build and imported by the other,
    which goes on teacher-forced. It must continue as the importing build's own uninterrupted run (`own`: its
    logits rows, the first after the prompt) — `crosses` (bit-exact) or `crosses (numerics)` with the same greedy
    choices and a move within what the builds' own runs differ by (crossing) — or be refused with an error
    (`refused`); an import that takes the bytes and goes on otherwise is `wrong`."""
    r = src.load(path)
    got = src.script([{"tokens": prompt, "pos": list(range(len(prompt))), "logits": "last"}], reset=True) \
        if r.ok else r
    blob = src.state_get(0) if got.ok else got
    if not blob.ok:
        return {"status": "unrun", "detail": f"the exporter fails: {blob.failure.message}"}
    cells = state_cells(blob.data["blob"])
    r = dst.load(path)
    put = dst.state_set(blob.data["blob"], 0) if r.ok else r
    if not put.ok:
        return {"status": "refused", "cells": cells, "detail": f"import refused: {put.failure.message}"}
    steps = [{"tokens": [t], "pos": [len(prompt) + k], "logits": "last"} for k, t in enumerate(fed)]
    cont = dst.script(steps)
    if not cont.ok:
        return {"status": "refused", "cells": cells,
                "detail": f"imported, then decoding fails: {cont.failure.message}"}
    rows = np.stack([x["logits"][-1] for x in cont.data["results"]]).astype(np.float64)
    status, d = crossing(rows, own[1:len(rows) + 1], spread)
    return {"status": status, "max_abs_dlogit": d, "bytes": len(blob.data["blob"]), "cells": cells,
            "detail": "continues bit-exact" if status == "crosses" else
                      f"continues with max |Δlogit| {d:.3g} from the importer's own run (the builds' own runs "
                      f"differ by {spread:.3g})" + (", beyond what their numerics move" if status == "wrong" else "")}


def crossing(got: np.ndarray, want: np.ndarray, spread: float, factor: float = CROSS_FACTOR) -> tuple[str, float]:
    """What crossed builds gave (logits rows) against the receiving build's own run: `crosses` (bit-exact),
    `crosses (numerics)` (the same greedy choice in every row, and a move within `factor` × `spread`, how far
    the two builds' own uninterrupted runs are apart: what mixing their numerics can move) or `wrong`; and the max
    |Δlogit|. Builds that agree bit for bit must cross bit for bit."""
    if np.array_equal(got, want):
        return "crosses", 0.0
    d = float(np.max(np.abs(got - want)))
    same = bool((got.argmax(axis=1) == want.argmax(axis=1)).all())
    return "crosses (numerics)" if same and d <= factor * spread else "wrong", d


def verdicts(base_run: dict[str, Any], cand_run: dict[str, Any], cross: dict[str, dict[str, Any]]) \
        -> list[dict[str, Any]]:
    """Every row × lane of the two runs (the base's plan order), then each row's cross-build lane."""
    theirs = {(x["row"], x["lane"]): x for x in cand_run["results"]}
    out = []
    for a in base_run["results"]:
        b = theirs.get((a["row"], a["lane"]), {"status": MISSING, "detail": "the candidate run has no result"})
        v = verdict(a["status"], b["status"])
        if a["status"] == KNOWN and (b.get("data") or {}).get("known_gone"):  # the upstream finding is gone there
            v = FIXED
        detail = b["detail"]
        less = lost(a, b) if v == UNCHANGED and outcome(b["status"]) == "ok" else None
        if less:
            v, detail = BROKE, f"{less} | {detail}"
        more = more_known(a, b) if v == UNCHANGED and a["status"] == KNOWN == b["status"] else None
        if more:
            v, detail = BROKE, f"{more} | {detail}"
        fewer = fewer_known(a, b) if v == UNCHANGED and a["status"] == KNOWN == b["status"] else None
        if fewer:
            v, detail = FIXED, f"{fewer} | {detail}"
        gone = known_fixed(a) if v == UNCHANGED and a["status"] == KNOWN and b["status"] in (PASS, NUMERICS) else None
        if gone:
            v, detail = FIXED, f"{gone} | {detail}"
        out.append({"row": a["row"], "lane": a["lane"], "verdict": v, "base": a["status"],
                    "candidate": b["status"], "detail": detail, "bundles": b.get("bundles", [])})
    for row, x in cross.items():
        out.append({"row": row, "lane": CROSS_LANE, "verdict": x["verdict"], "base": None, "candidate": None,
                    "detail": x["detail"], **{k: v for k, v in x.items() if k not in ("verdict", "detail")}})
    return out


def cross_builds(rows: list[Row], base_env: dict[str, str], candidate_env: dict[str, str]
                 ) -> Iterator[tuple[Row, str, dict[str, Any]]]:
    """Each runnable row's cross-build lane (cross_build) between the base's and the candidate's workers (their
    environments), with the fixture it ran: written for the row, there while the caller is at that row."""
    with tempfile.TemporaryDirectory(prefix="family-certify-") as d, \
            open_target("llama-cpp", env=base_env) as ta, open_target("llama-cpp", env=candidate_env) as tb:
        for row in rows:
            if not row.runnable:
                continue
            path = Path(d) / f"{row.key}.gguf"
            write_fixture(row.spec(), path)
            yield row, str(path), cross_build(str(path), row.spec().n_vocab, ta, tb)


def cross_broke(rows: list[Row], base_env: dict[str, str], candidate_env: dict[str, str]) -> tuple[str, str] | None:
    """The cross-build lane of a bump from the base build to the candidate on `rows`, as `bump` runs it: the first
    row it says broke (ROW/cross-build) and its detail; None."""
    with contextlib.closing(cross_builds(rows, base_env, candidate_env)) as lanes:
        return next(((f"{row.key}/{CROSS_LANE}", x["detail"]) for row, _, x in lanes if x["verdict"] == BROKE), None)


def rewinds_of(lane: dict[str, Any]) -> list[dict[str, Any]]:
    """The prefix-cache lane's conversations sent one request at a time (fuzz.oracles.conversations) from its
    reports: the rewind conversations, then the clients taking turns."""
    return [c for rep in lane.get("reports", []) if rep.get("oracle") == "prefix-cache"
            for c in [*(rep.get("rewinds") or []), *([rep["clients"]] if rep.get("clients") else [])]]


def lost(base: dict[str, Any], candidate: dict[str, Any]) -> str | None:
    """What a lane that did not fail on the candidate lost against the base, or None: prompt-cache reuse, operations
    its seeded programs had taken, or speculative types its llama-server offered."""
    return reuse_regression(base, candidate) or newly_refused(base, candidate) or fewer_offered(base, candidate)


def reuse_regression(base: dict[str, Any], candidate: dict[str, Any]) -> str | None:
    """Where the candidate's prefix-cache lane took fewer prompt tokens from the cache than the base's on the same
    rewind conversation (the first such request), or None."""
    a, b = rewinds_of(base), rewinds_of(candidate)
    if not a or len(a) != len(b):
        return None
    lost = [(i, j, x, y) for i, (ca, cb) in enumerate(zip(a, b, strict=True)) if ca["lengths"] == cb["lengths"]
            for j, (x, y) in enumerate(zip(ca["cache_n"], cb["cache_n"], strict=True))
            if x is not None and y is not None and y < x]
    if not lost:
        return None
    i, j, x, y = lost[0]
    c = a[i]
    where = f"{c['name']}, request {j} ({c['order'][j]})" if c.get("name") else f"rewind conversation {i}, request {j}"
    return (f"prompt-cache reuse regression: {len(lost)} requests take fewer prompt tokens from the cache; first: "
            f"{where} ({c['lengths'][j]} tokens, {c['shared'][j]} shared with the one before): the base took {x}, "
            f"the candidate {y}")


def bump_report(base: dict[str, Any], candidate: dict[str, Any], rows: list[dict[str, Any]], *, wall_s: float,
                build_s: dict[str, float], command: str, manifest: dict[str, str]) -> dict[str, Any]:
    totals = {v: sum(x["verdict"] == v for x in rows) for v in VERDICTS}
    return {"schema": 1, "kind": "family-certify-bump", "command": command, "manifest": manifest,
            "base": base, "candidate": candidate, "policy": POLICY, "results": rows,
            "totals": {k: v for k, v in totals.items() if v}, "build_s": build_s, "wall_s": round(wall_s, 2),
            "exit_code": 1 if any(totals[v] for v in FAILED) else 0}


SYMBOL = {UNCHANGED: "·", BROKE: "❌ broke", FIXED: "✅ fixed", NEWLY_UNSUPPORTED: "⚪ unsupported",
          DRIFTED: "〰️ drifted", MISSING: "⛔ missing"}


def bump_md(rep: dict[str, Any]) -> str:
    """One screen: the verdict, both builds, the grid of what changed, and each change in a line."""
    from fuzz.certify.outputs import one_line
    from fuzz.engine.contract import build_parts, commit_words

    rows = rep["results"]
    broke = [x for x in rows if x["verdict"] in FAILED]
    head = f"FAIL — {len(broke)} lanes broke or missing" if broke else "PASS — nothing broke"

    def name(b: dict[str, Any]) -> str:
        return f"`{b.get('spec')}` ({', '.join([f'llama.cpp {commit_words(b)}', *build_parts(b, spec=False)])})"

    out = [f"## family-certify bump: {head}", "", f"base {name(rep['base'])} → candidate {name(rep['candidate'])}",
           "", "Totals: " + ", ".join(f"{v} {k}" for k, v in rep["totals"].items())
           + f" · builds {', '.join(f'{k} {v:.0f} s' for k, v in rep['build_s'].items())} · wall {rep['wall_s']:.0f} s",
           ""]
    lanes = list(dict.fromkeys(x["lane"] for x in rows))
    order = list(dict.fromkeys(x["row"] for x in rows))
    cell = {(x["row"], x["lane"]): x["verdict"] for x in rows}
    out += ["| row | " + " | ".join(lanes) + " |", "|---|" + "---|" * len(lanes)]
    out += [f"| {r} | " + " | ".join(SYMBOL[cell[(r, ln)]] if (r, ln) in cell else "" for ln in lanes) + " |"
            for r in order]
    changed = [x for x in rows if x["verdict"] != UNCHANGED]
    if changed:
        out += ["", "### What changed", ""]
        out += [f"- **{x['row']} / {x['lane']}** — {x['verdict']}"
                + (f" ({x['base']} → {x['candidate']})" if x["base"] else "") + f": {one_line(x['detail'])}"
                + "".join(f" · [bundle](candidate/{p}/README.md)" for p in x.get("bundles", ()))
                for x in changed]
    out += ["", f"Policy: {rep['policy']}", ""]
    return "\n".join(out)


def bump_junit(rep: dict[str, Any]) -> bytes:
    import xml.etree.ElementTree as ET

    suite = ET.Element("testsuite", name="family-certify bump", tests=str(len(rep["results"])),
                       failures=str(sum(rep["totals"].get(v, 0) for v in FAILED)), errors="0", skipped="0")
    for x in rep["results"]:
        case = ET.SubElement(suite, "testcase", classname=x["row"], name=x["lane"])
        if x["verdict"] in FAILED:
            ET.SubElement(case, "failure", message=x["detail"][:500], type=x["verdict"]).text = x["detail"]
        elif x["verdict"] != UNCHANGED:
            ET.SubElement(case, "system-out").text = f"{x['verdict']}: {x['detail']}"
    return ET.tostring(suite, encoding="utf-8", xml_declaration=True)


def merge_bumps(reports: list[dict[str, Any]], plan: list[tuple[str, list[str]]], runnable: set[str], *,
                manifest: dict[str, str]) -> dict[str, Any]:
    """Shards' bump reports as one, against the plan (every planned row × lane, and a cross-build lane per runnable
    row): a planned lane no shard reported is `missing` and fails the merge, like a broken one; shards on other
    builds or another manifest are refused."""
    from fuzz.engine.contract import build_name
    from synth.errors import UserError

    if not reports:
        raise UserError("no bump reports to aggregate: every shard was lost; re-run the bump")
    for r in reports:
        if r["manifest"]["sha256"] != manifest["sha256"]:
            raise UserError(f"a bump shard ran on manifest {r['manifest']['sha256'][:12]}, not "
                            f"{manifest['sha256'][:12]}; re-run every shard on the same commit")
    pairs = {(build_name(r["base"]), build_name(r["candidate"])) for r in reports}
    if len(pairs) > 1:
        raise UserError(f"bump shards compared different builds ({sorted(pairs)}); re-run them on one pair")
    got = {(x["row"], x["lane"]): x for r in reports for x in r["results"]}
    rows = []
    for row, lanes in plan:
        for lane in [*lanes, *([CROSS_LANE] if row in runnable else [])]:
            rows.append(got.get((row, lane)) or {"row": row, "lane": lane, "verdict": MISSING, "base": None,
                                                 "candidate": None, "detail": "planned, but no shard reported it"})
    return bump_report(reports[0]["base"], reports[0]["candidate"], rows,
                       wall_s=max(r["wall_s"] for r in reports), command="family-certify aggregate",
                       build_s={k: max(r["build_s"].get(k, 0.0) for r in reports) for k in ("base", "candidate")},
                       manifest=manifest)


WIDE_PREFILL = 40  # a prompt prefilled in one batch past 32 rows: a BLAS backend takes a product only from 32


def mixed_chains(path: str, envs: dict[str, dict[str, str]], *, seed: int = 0, wide: bool = False) -> dict[str, Any]:
    """A rolling upgrade across the machines of a split: stage 0 on one build, stage 1 on the other (both ways), at
    the fixture's first period cut, teacher-forced with the base's greedy tokens. Each chain's logits are compared
    with the unsplit run of the build that computed them (stage 1's): bit-exact `crosses`, the same greedy choices
    `crosses (numerics)`, else `wrong`. {"status": "unsupported"} when the fixture has no expressible split.
    wide (builds on two backends): the chains again with a prompt of WIDE_PREFILL tokens in one prefill batch, the
    batch a BLAS backend computes (prefill chunks of 7 never reach it), judged against that shape's own spread,
    every chain within BACKEND_FACTOR × the spread."""
    from fuzz.engine.stages import FixtureStages

    st = FixtureStages(Path(path), shared=False)  # (as before: each build loads whole stage files)
    if st.info.n_layer < 2:
        return {"status": "unsupported", "detail": "one layer: no split"}
    out: dict[str, Any] = {}
    with st.workspace(None):
        cuts = chain_cuts(st)
        if cuts is None:
            return {"status": "unsupported", "detail": "every split is unsupported"}
        shapes = [("", prompt_tokens(seed + 101, PROMPT_LEN, st.info.n_vocab), 7)]
        if wide:
            shapes.append((f" (one batch of {WIDE_PREFILL})",
                           prompt_tokens(seed + 101, WIDE_PREFILL, st.info.n_vocab), WIDE_PREFILL))
        for label, prompt, chunk in shapes:
            got = chains_of(path, envs, st.stages(cuts), cuts, prompt, chunk,
                            BACKEND_FACTOR if wide else CROSS_FACTOR)
            if isinstance(got, str):
                return {"status": "unrun", "detail": got}
            out |= {k + label: v for k, v in got.items()}
    return {"status": "wrong" if any(v["status"] == "wrong" for v in out.values()) else "ok", "cuts": cuts,
            "chains": out}


def chain_cuts(st: Any) -> list[int] | None:
    """Where a mixed chain splits a fixture (FixtureStages, in its workspace): its first period cut into two stages
    that its stage contracts allow; None if they allow none."""
    from fuzz.engine.stages import cut_sets

    return next((c for c in cut_sets("period", st.info.n_layer, 2, st.period)
                 if not isinstance(st.stages(c), Unsupported)), None)


def chains_of(path: str, envs: dict[str, dict[str, str]], stages: Any, cuts: list[int], prompt: list[int],
              chunk: int, factor: float) -> dict[str, Any] | str:
    """mixed_chains for one prompt and prefill chunk: each build's unsplit run (their spread), then both chains;
    or why a build cannot run the unsplit model."""
    from fuzz.engine.parity import pos_per_token, run_chain, run_script, script_steps
    from fuzz.engine.schedule import sequential_steps
    from targets import open_target

    steps = sequential_steps(prompt, chunk, TOKENS)
    out: dict[str, Any] = {}
    full: dict[str, np.ndarray] = {}
    tokens: list[list[int]] | None = None
    n_pos = 1  # positions per token fed as embeddings (M-RoPE: 4)
    for name in ("base", "candidate"):  # each build's unsplit run, teacher-forced with the base's tokens
        with open_target("llama-cpp", env=envs[name]) as t:
            r = t.load(path)
            n_pos = pos_per_token(r.data) if r.ok else n_pos
            tr = run_script(t, script_steps(steps, tokens=tokens), reset=True) if r.ok else r.failure
            if not hasattr(tr, "steps"):
                return f"{name} cannot run the unsplit model: {tr.message}"
            tokens = tokens or [so.tokens for so in tr.steps]
            full[name] = np.concatenate([so.logits for so in tr.steps]).astype(np.float64)
    spread = float(np.max(np.abs(full["base"] - full["candidate"])))  # what the builds' own numerics move
    for first, second in (("base", "candidate"), ("candidate", "base")):
        ts = [open_target("llama-cpp", env=envs[first]), open_target("llama-cpp", env=envs[second])]
        try:
            loaded = [t.load(str(p), capture=k == 0) for k, (t, (p, _)) in enumerate(zip(ts, stages, strict=True))]
            bad = next((r for r in loaded if not r.ok), None)
            if bad is not None:
                out[f"{first} → {second}"] = {"status": "refused", "detail": bad.failure.message}
                continue
            chain, fail = run_chain(ts, [s.n_layer for _, s in stages], steps, tokens, logits_mode="all",
                                    n_pos_per_token=n_pos)
        finally:
            for t in ts:
                t.close()
        if fail:
            out[f"{first} → {second}"] = {"status": "refused", "detail": fail.failure.message}
            continue
        got = np.concatenate([so.logits for so in chain[-1].steps]).astype(np.float64)
        status, d = crossing(got, full[second], spread, factor)
        out[f"{first} → {second}"] = {"status": status, "max_abs_dlogit": d,
                                      "detail": f"cut {cuts}: max |Δlogit| {d:.3g} from {second}'s unsplit run "
                                                f"(the builds' unsplit runs differ by {spread:.3g})"
                                                + (", beyond what their numerics move" if status == "wrong"
                                                   else "")}
    return out


def with_chains(cross: dict[str, Any], chains: dict[str, Any]) -> dict[str, Any]:
    """The cross-build lane with its mixed-build chains: a chain whose hidden states cross wrong breaks it."""
    out = {**cross, "mixed_chains": chains}
    if chains["status"] not in ("ok", "wrong"):
        return out | {"detail": f"{cross['detail']}; mixed chains {chains['status']}: {chains['detail']}"}
    said = ", ".join(f"{k} {v['status']}" for k, v in chains["chains"].items())
    if chains["status"] == "wrong":
        bad = "; ".join(f"{k}: {v['detail']}" for k, v in chains["chains"].items() if v["status"] == "wrong")
        return out | {"verdict": BROKE, "detail": f"a mixed-build chain goes wrong: {bad}; {cross['detail']}"}
    return out | {"detail": f"{cross['detail']}; mixed chains (cut {chains['cuts']}) {said}"}


def bump_builds(plan: list[tuple[Row, list[str]]], builds: dict[str, Any], *, manifest: Manifest, command: str,
                out: Path | None, jobs: int, base_run: dict[str, Any] | None = None,
                options: LaneOptions = NO_OPTIONS) -> dict[str, Any]:
    """The per-bump gate on two resolved builds (base, candidate): the plan's lanes on each (the base's run taken
    as given when base_run is), a cross-build lane per row, a verdict per row x lane; the bump report."""
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
    for row, path, x in cross_builds([row for row, _ in plan], builds["base"].env(), builds["candidate"].env()):
        cross[row.key] = with_chains(x, mixed_chains(path, {k: b.env() for k, b in builds.items()},
                                                     wide=len({b.backend for b in builds.values()}) > 1))
        print(f"{row.key:<16} {CROSS_LANE:<15} {cross[row.key]['verdict'].upper():<12} {cross[row.key]['detail']}",
              flush=True)
    return bump_report(runs["base"]["build"], runs["candidate"]["build"],
                          verdicts(runs["base"], runs["candidate"], cross), wall_s=time.perf_counter() - t0,
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
    print(", ".join(f"{v} {k}" for k, v in rep["totals"].items()) + f"; wall {rep['wall_s']:.0f} s")
    for x in rep["results"]:
        if x["verdict"] != UNCHANGED:
            print(f"  {x['verdict'].upper()}: {x['row']} / {x['lane']}: {x['detail']}")
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "report.json").write_text(json.dumps(rep, indent=2) + "\n")
        (out / "summary.md").write_text(bump_md(rep))
        (out / "junit.xml").write_bytes(bump_junit(rep))
        print(f"wrote {out}/summary.md, junit.xml, report.json")
    if report is not None:
        report.parent.mkdir(parents=True, exist_ok=True)
        report.write_text(json.dumps(rep, indent=2) + "\n")
    return rep["exit_code"]
