"""A lane known on both builds of a bump, compared: the library oracles' findings case by case (`more_known`: a new
failure of a known class, except in a drawn program the base failed too — unmasked where a fix let it go on), the
known repros each build met in the runs both drew alike (`fewer_known`), and a known lane passing on the candidate
(`known_fixed`). llama-server's reports are left out: which schedules meet a known abort is timing. And any memory
lane's seeded programs, program by program: an operation the candidate refuses where the base took it
(`newly_refused`)."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

LOAD_ABORT = "llama-server aborted loading"  # a server finding's message (server_options.observe): no request made


def compared(x: dict[str, Any]) -> dict[str, Any]:
    """What a bump compares of a lane result: its status, its reports' findings and conversations, and a memory
    run's config and what each of its programs ran and had refused."""
    keep, ran = ("phase", "step", "cuts", "fingerprint", "message"), ("kv_unified", "program", "steps", "status",
                                                                      "refused")

    def programs(r: dict[str, Any]) -> dict[str, Any]:
        return {"config": r.get("config"), "results": [{k: y.get(k) for k in ran} for y in r.get("results", [])]}

    return {"status": x["status"],
            "reports": [{"oracle": r.get("oracle"), "target": r.get("target"),
                         "findings": [{k: f.get(k) for k in keep} for f in r.get("findings", [])],
                         **{k: r[k] for k in ("rewinds", "clients", "offered") if r.get(k)},
                         **(programs(r) if r.get("oracle") == "memory" else {})} for r in x.get("reports", [])]}


def library_findings(lane: dict[str, Any]) -> list[tuple[int, dict[str, Any]]]:
    """The findings of a lane's library oracles' runs, each with the index of its run. llama-server's lanes are left
    out (which schedules meet a known abort is timing)."""
    return [(i, f) for i, rep in enumerate(lane.get("reports", [])) if rep.get("target") != "llama-server"
            for f in rep.get("findings", [])]


def case_key(i: int, f: dict[str, Any]) -> tuple[Any, ...]:
    """A finding as what it is and where: its run, phase, step, cuts and fingerprint (numbers that move with numerics
    left out). Seeded programs and cases fail the same way on the same build."""
    return i, f.get("phase"), f.get("step"), json.dumps(f.get("cuts")), json.dumps(f.get("fingerprint"), sort_keys=True)


def known_cases(lane: dict[str, Any]) -> Counter:
    """How many of a lane's library findings each case_key has."""
    return Counter(case_key(i, f) for i, f in library_findings(lane))


def program_slots(lane: dict[str, Any]) -> dict[tuple[int, str, int], str]:
    """A memory lane's drawn programs by (run, KV layout, program index) → their status (other lanes: none)."""
    return {(i, "unified-kv" if r["kv_unified"] else "per-seq-kv", r["program"]): r["status"]
            for i, rep in enumerate(lane.get("reports", [])) if rep.get("oracle") == "memory"
            for r in rep.get("results", []) if isinstance(r.get("program"), int) and r.get("kv_unified") is not None}


def unmasked(i: int, f: dict[str, Any], base_slots: dict[tuple[int, str, int], str]) -> bool:
    """A candidate's memory finding in a program the base ran and failed too: that program ended at the base's first
    finding (fixed on the candidate, which goes on and meets a later known one), so it is no new failure."""
    index = (f.get("detail") or {}).get("index")
    return isinstance(index, int) and base_slots.get((i, f.get("phase"), index), "pass") != "pass"


def more_known(base: dict[str, Any], candidate: dict[str, Any]) -> str | None:
    """A lane known on both builds that fails on the candidate where the base did not — each finding of a known
    upstream finding's class, so the lane still reads `known`: a new bug of a known class (or None). A drawn memory
    program that failed on the base as well is not counted (unmasked): it ended there at another finding."""
    slots = program_slots(base)
    new = known_cases(candidate) - known_cases(base)
    for i, f in library_findings(candidate):
        if case_key(i, f) in new and unmasked(i, f, slots):
            new[case_key(i, f)] -= 1
    new = +new
    if not new:
        return None
    first = next(f for i, f in library_findings(candidate) if case_key(i, f) in new)
    return (f"known, and more: {sum(new.values())} findings the base does not have, each of a known upstream "
            f"finding's class; first: {first.get('message', '')}")


def fewer_known(base: dict[str, Any], candidate: dict[str, Any]) -> str | None:
    """A lane known on both builds whose candidate no longer meets some of the base's known upstream repros, in the
    runs both builds drew alike (the same config: a lane that draws again past known findings draws fewer programs
    where fewer met one), and meets none the base did not: those repros are fixed there, the rest still known (or
    None). Library oracles' runs only, as more_known."""
    runs_a, runs_b = (x.get("data", {}).get("known_runs") for x in (base, candidate))
    reps_a, reps_b = base.get("reports", []), candidate.get("reports", [])
    if not runs_a or not runs_b or len(runs_a) != len(reps_a) or len(runs_b) != len(reps_b):
        return None
    alike = [i for i in range(min(len(reps_a), len(reps_b))) if reps_a[i].get("target") != "llama-server"
             and reps_a[i].get("config") == reps_b[i].get("config")]
    gone = sorted({n for i in alike for n in runs_a[i]} - {n for i in alike for n in runs_b[i]})
    if not gone or any(set(runs_b[i]) - set(runs_a[i]) for i in alike):
        return None
    still = sorted({n for r in runs_b for n in r})
    return f"fixed: {', '.join(gone)} no longer met; still known: {', '.join(still)}"


def known_fixed(base: dict[str, Any]) -> str | None:
    """A lane known on the base that passes on the candidate, every known finding of the base's the library's or
    llama-server aborting as it loads (no request: not timing): those upstream findings are fixed there (a fix series,
    a newer llama.cpp). None where llama-server's reports had other findings: which schedules meet a known abort
    during requests is timing, so a pass there is no fix."""
    lib = library_findings(base) + [(i, f) for i, rep in enumerate(base.get("reports", []))
                                    if rep.get("target") == "llama-server" for f in rep.get("findings", [])
                                    if LOAD_ABORT in str(f.get("message", ""))]
    if not lib or len(lib) != sum(len(rep.get("findings", [])) for rep in base.get("reports", [])):
        return None
    first = lib[0][1].get("message", "")
    return f"fixed: the base's {len(lib)} findings of known upstream bugs are gone; first: {first}"


def newly_refused(base: dict[str, Any], candidate: dict[str, Any]) -> str | None:
    """A memory lane's seeded programs that ran alike on both builds (the same run's config, KV layout and index, as
    many operations, the same status) where the candidate refused an operation more often than the base: a memory
    that took it (a rollback, a shift) and no longer does is a capability lost, though each refusal is one the API
    allows and changes nothing (or None). Seeded programs run the same on the same build."""
    reps_a, reps_b = base.get("reports", []), candidate.get("reports", [])
    lost = []
    for i, (ra, rb) in enumerate(zip(reps_a, reps_b, strict=False)):
        if ra.get("oracle") != "memory" or rb.get("oracle") != "memory" or ra.get("config") != rb.get("config"):
            continue
        theirs = {(r.get("kv_unified"), r.get("program")): r for r in rb.get("results", [])}
        for x in ra.get("results", []):
            y = theirs.get((x.get("kv_unified"), x.get("program")))
            if not isinstance(x.get("program"), int) or y is None or (x["steps"], x["status"]) != (y["steps"],
                                                                                                  y["status"]):
                continue
            more = {op: n - x["refused"].get(op, 0) for op, n in y["refused"].items() if n > x["refused"].get(op, 0)}
            if more:
                lost.append((i, x, more))
    if not lost:
        return None
    i, x, more = lost[0]
    layout = "unified-kv" if x["kv_unified"] else "per-seq-kv"
    return (f"newly refused: {len(lost)} seeded memory programs refuse operations the base took; first: run {i}, "
            f"program {x['program']} ({layout}, {x['steps']} operations): "
            + ", ".join(f"{op} {n} more" for op, n in sorted(more.items())))


def fewer_offered(base: dict[str, Any], candidate: dict[str, Any]) -> str | None:
    """A speculative decoding type the base's llama-server offers (its --help, as server-options reads it) that the
    candidate's does not: a capability lost, though every schedule drawn from what the candidate offers passes (or
    None)."""
    def offered(lane: dict[str, Any]) -> set[str] | None:
        got = [set(r["offered"]) for r in lane.get("reports", []) if r.get("offered")]
        return set.union(*got) if got else None

    a, b = offered(base), offered(candidate)
    if a is None or b is None or a <= b:
        return None
    return (f"capability lost: the candidate's llama-server offers no --spec-type {', '.join(sorted(a - b))}, which "
            "the base's does")
