"""Shards for CI: whole manifest rows packed into K parallel jobs of about equal wall time.

`family-certify matrix --shards K` plans with it from `.github/family-certify-durations.json`
(`{"schema": 1, "seconds": {"ROW/LANE": 12.3, ...}}`, refreshed from a real run's report). Pure Python: nothing
here needs llama.cpp, so the matrix job plans without it.

Packing is longest processing time first (LPT): rows sorted by their summed lane seconds, longest first (ties
keep manifest order), each into the shard with the least seconds so far. Its longest shard is within
4/3 - 1/(3K) of the best possible packing and within sum/K + the longest row — good enough, and deterministic.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from synth.errors import UserError, read_text

DEFAULT_SECONDS = 10.0  # a lane no run has measured on any row yet
DURATIONS = Path(__file__).resolve().parents[2] / ".github" / "family-certify-durations.json"  # the committed one
SCHEMA = 1
NOT_MEASURED = ("missing", "skipped")  # a lane that did not run says nothing about how long it takes


def load_durations(path: str | Path) -> dict[str, float]:
    """The "ROW/LANE" → seconds table of a durations file; UserError (one line) if it is not one."""
    return read_durations(path)[0]


def read_durations(path: str | Path) -> tuple[dict[str, float], str]:
    """A durations file's table and note; UserError (one line) if it is not one."""
    fix = 'expected {"schema": 1, "seconds": {"ROW/LANE": seconds, ...}} (see fuzz/certify/shards.py)'
    text = read_text(path, "durations file", fix)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(f"{path}: durations file is not JSON ({e.msg}, line {e.lineno}); {fix}") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or not isinstance(data.get("seconds"), dict):
        raise UserError(f"{path}: not a schema-{SCHEMA} durations file; {fix}")
    unknown = sorted(set(data) - {"schema", "seconds", "note"})
    if unknown:
        raise UserError(f"{path}: unknown key {unknown[0]!r} in the durations file; {fix}")
    seconds: dict[str, float] = {}
    for key, value in data["seconds"].items():
        row, _, lane = key.partition("/")
        if not row or not lane or "/" in lane:
            raise UserError(f"{path}: {key!r} is not ROW/LANE; {fix}")
        # bool is an int in Python: refuse it explicitly, it is a typo, not a duration
        if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0 or value == float("inf"):
            raise UserError(f"{path}: {key}: {value!r} is not a finite number of seconds >= 0; {fix}")
        seconds[key] = float(value)
    return seconds, str(data.get("note", ""))


def measured(results: list[dict[str, Any]]) -> dict[str, float]:
    """"ROW/LANE" → seconds of the lanes a run report's results ran (a missing or skipped lane measured nothing)."""
    return {f"{x['row']}/{x['lane']}": round(float(x.get("seconds", 0.0)), 2) for x in results
            if x["status"] not in NOT_MEASURED}


NOTE_TAIL = ("; rows or lanes missing here are estimated by their lane's median (fuzz/certify/shards.py). Refresh: "
             "`family-certify durations OUT...` with the --out directories of real runs (CI's aggregate uploads one).")


def refresh_durations(path: Path, got: dict[str, float], source: str) -> dict[str, float]:
    """Write `got` over the durations file at `path` (made if missing): its other entries kept, the note saying
    where the new ones came from (`source`) and, if some were kept, where those came from. Returns the old table."""
    old, note = read_durations(path) if path.exists() else ({}, "")
    kept = len(set(old) - set(got))
    earlier = note.split(NOTE_TAIL)[0] if kept else ""
    note = (f"{len(got)} measured by `family-certify durations` from {source}"
            + (f"; the other {kept} kept from before" + (f" ({earlier})" if earlier else "") if kept else "")
            + NOTE_TAIL)
    path.write_text(json.dumps({"schema": SCHEMA, "note": note, "seconds": {**old, **got}}, indent=2,
                               ensure_ascii=False) + "\n")
    return old


def lane_estimates(durations: dict[str, float]) -> dict[str, float]:
    """Per lane, the median of its known durations over every row (what an unmeasured row/lane is taken to cost)."""
    by_lane: dict[str, list[float]] = {}
    for key, value in durations.items():
        by_lane.setdefault(key.partition("/")[2], []).append(value)
    return {lane: statistics.median(values) for lane, values in by_lane.items()}


def row_seconds(row: str, lanes: list[str], durations: dict[str, float], default: float = DEFAULT_SECONDS,
                estimates: dict[str, float] | None = None) -> float:
    """A row's expected seconds: its lanes' measured durations, else the lane's median over rows, else `default`."""
    est = lane_estimates(durations) if estimates is None else estimates
    return sum(durations.get(f"{row}/{lane}", est.get(lane, default)) for lane in lanes)


def longest_first(rows: list[tuple[str, list[str]]], path: Path = DURATIONS) -> list[int]:
    """The rows' indices in the order a pool of processes should start them: the longest expected first (ties keep
    their order), so a long row does not start last and run alone at the end; as given without a durations file."""
    try:
        durations = load_durations(path)
    except UserError:
        return list(range(len(rows)))
    est = lane_estimates(durations)
    cost = [row_seconds(name, lanes, durations, DEFAULT_SECONDS, est) for name, lanes in rows]
    return sorted(range(len(rows)), key=lambda i: -cost[i])


def plan_shards(rows: list[tuple[str, list[str]]], durations: dict[str, float], k: int,
                default: float = DEFAULT_SECONDS) -> list[dict]:
    """Whole rows (row, lanes) into min(k, len(rows)) shards balanced by summed seconds (LPT; deterministic).

    Returns [{"shard": i (1-based), "of": n, "rows": [row, ...] in the order given, "seconds": total (0.1 s)}];
    no shard is empty. k < 1 is a UserError.
    """
    if k < 1:
        raise UserError(f"--shards {k}: need at least 1 shard")
    names = [name for name, _ in rows]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise UserError(f"row {dup!r} listed twice; a row is sharded whole, once")
    n = min(k, len(rows))
    if n == 0:
        return []
    est = lane_estimates(durations)
    cost = [row_seconds(name, lanes, durations, default, est) for name, lanes in rows]
    totals = [0.0] * n
    members: list[list[int]] = [[] for _ in range(n)]
    # longest first; sorted() is stable, so equal costs keep the order given
    for i in sorted(range(len(rows)), key=lambda i: -cost[i]):
        # least seconds so far; then fewest rows (so zero-second rows still fill every shard); then lowest index
        s = min(range(n), key=lambda s: (totals[s], len(members[s]), s))
        totals[s] += cost[i]
        members[s].append(i)
    return [{"shard": s + 1, "of": n, "rows": [names[i] for i in sorted(members[s])], "seconds": round(totals[s], 1)}
            for s in range(n)]
