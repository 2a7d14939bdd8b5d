"""fuzz/certify/shards.py: CI shards of whole rows, balanced by measured lane seconds (pure Python, no llama.cpp)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fuzz.certify.shards import DEFAULT_SECONDS, load_durations, longest_first, plan_shards, row_seconds
from synth.errors import UserError
from synth.manifest import load_manifest

ROOT = Path(__file__).resolve().parent.parent
DURATIONS = ROOT / ".github" / "family-certify-durations.json"


def one_lane(seconds: list[float]) -> tuple[list[tuple[str, list[str]]], dict[str, float]]:
    """Rows r0, r1, ... with one lane "x" each, of the given seconds."""
    rows = [(f"r{i}", ["x"]) for i in range(len(seconds))]
    return rows, {f"r{i}/x": s for i, s in enumerate(seconds)}


def best_makespan(costs: list[float], k: int) -> float:
    """The optimal longest shard, by trying every assignment (small inputs only)."""
    best = float("inf")
    for assign in itertools.product(range(k), repeat=len(costs)):
        totals = [0.0] * k
        for c, s in zip(costs, assign, strict=True):
            totals[s] += c
        best = min(best, max(totals))
    return best


@given(st.lists(st.integers(0, 600), min_size=1, max_size=7), st.integers(1, 3))
def test_lpt_bound_and_partition(seconds, k):
    """Every row lands in exactly one shard, no shard is empty, each shard's seconds is its rows' sum, and the
    longest shard is within LPT's bound: ≤ (4/3 - 1/(3k)) × the optimal packing (found by brute force)."""
    rows, durations = one_lane([float(s) for s in seconds])
    plan = plan_shards(rows, durations, k)
    n = min(k, len(rows))
    assert [p["shard"] for p in plan] == list(range(1, n + 1)) and {p["of"] for p in plan} == {n}
    placed = [r for p in plan for r in p["rows"]]
    assert sorted(placed) == sorted(name for name, _ in rows)
    assert all(p["rows"] for p in plan), plan
    for p in plan:
        assert p["seconds"] == pytest.approx(sum(durations[f"{r}/x"] for r in p["rows"]), abs=0.05)
    makespan = max(p["seconds"] for p in plan)
    assert makespan <= (4 / 3 - 1 / (3 * n)) * best_makespan([float(s) for s in seconds], n) + 0.05


def test_balances_a_skewed_tier():
    """One long row and many short ones: the long row gets a shard of its own, the short ones share the rest
    evenly (within one short row), and rows inside a shard keep the order given."""
    rows, durations = one_lane([100.0] + [10.0] * 10)
    plan = plan_shards(rows, durations, 3)
    assert plan[0]["rows"] == ["r0"] and plan[0]["seconds"] == 100.0
    rest = [p["seconds"] for p in plan[1:]]
    assert sum(rest) == 100.0 and max(rest) - min(rest) <= 10.0
    for p in plan:
        assert p["rows"] == sorted(p["rows"], key=lambda r: int(r[1:]))


def test_deterministic_and_ties_by_row_order():
    """Same input, same plan; equal durations go round-robin in the order given (the first rows open shards
    1, 2, 3 in turn), so a plan never depends on dict or set ordering."""
    rows, durations = one_lane([5.0] * 6)
    plan = plan_shards(rows, durations, 3)
    assert plan == plan_shards(rows, dict(reversed(list(durations.items()))), 3)
    assert [p["rows"] for p in plan] == [["r0", "r3"], ["r1", "r4"], ["r2", "r5"]]


def test_whole_rows_with_all_lanes():
    """A row is never split across shards: its cost is the sum of all its lanes."""
    rows = [("a", ["load", "parity", "dtype"]), ("b", ["load"]), ("c", ["load"])]
    durations = {"a/load": 1.0, "a/parity": 2.0, "a/dtype": 30.0, "b/load": 20.0, "c/load": 12.0}
    plan = plan_shards(rows, durations, 2)
    assert [(p["rows"], p["seconds"]) for p in plan] == [(["a"], 33.0), (["b", "c"], 32.0)]


def test_unknown_durations_take_the_lane_median_else_the_default():
    """An unmeasured row/lane costs the median of that lane's measured rows; a lane measured nowhere costs
    DEFAULT_SECONDS."""
    durations = {"a/load": 1.0, "b/load": 3.0, "c/load": 100.0, "a/parity": 8.0}
    assert row_seconds("new", ["load"], durations) == 3.0
    assert row_seconds("new", ["parity"], durations) == 8.0
    assert row_seconds("new", ["never-measured"], durations) == DEFAULT_SECONDS
    assert row_seconds("a", ["load", "parity"], durations) == 9.0
    plan = plan_shards([("new", ["load", "never-measured"]), ("c", ["load"])], durations, 2)
    assert [p["seconds"] for p in plan] == [100.0, 3.0 + DEFAULT_SECONDS]


def test_rows_start_longest_first_and_as_given_without_durations(tmp_path):
    """A pool running rows side by side starts the longest expected first (ties in their order), so the long row
    does not start last and run alone at the end; without a durations file, as given."""
    f = tmp_path / "d.json"
    f.write_text(json.dumps({"schema": 1, "seconds": {"a/x": 1.0, "b/x": 9.0, "c/x": 1.0, "d/x": 4.0}}))
    rows = [("a", ["x"]), ("b", ["x"]), ("c", ["x"]), ("d", ["x"]), ("e", ["x"])]  # e: the lane's median, 2.5
    assert longest_first(rows, f) == [1, 3, 4, 0, 2]
    assert longest_first(rows, tmp_path / "none.json") == [0, 1, 2, 3, 4]


def test_more_shards_than_rows():
    """k > rows gives one shard per row ("of" says so), never an empty shard; no rows, no shards."""
    rows, durations = one_lane([1.0, 2.0])
    plan = plan_shards(rows, durations, 5)
    assert [(p["shard"], p["of"], p["rows"]) for p in plan] == [(1, 2, ["r1"]), (2, 2, ["r0"])]
    assert plan_shards([], durations, 4) == []


def test_zero_second_rows_still_fill_every_shard():
    """Rows measured at 0 s (or rounded to it) are spread, not piled into shard 1 leaving others empty."""
    rows, durations = one_lane([0.0] * 4)
    assert all(p["rows"] for p in plan_shards(rows, durations, 4))


def test_bad_input_is_one_user_error(tmp_path):
    """k < 1, a row listed twice, and malformed durations files are refused with a UserError naming the problem."""
    rows, durations = one_lane([1.0])
    with pytest.raises(UserError, match="at least 1"):
        plan_shards(rows, durations, 0)
    with pytest.raises(UserError, match="twice"):
        plan_shards(rows + rows, durations, 2)
    bad = {
        "not JSON": "{",
        "not a schema-1": json.dumps({"schema": 2, "seconds": {}}),
        "not ROW/LANE": json.dumps({"schema": 1, "seconds": {"llama": 1}}),
        "not a finite number": json.dumps({"schema": 1, "seconds": {"llama/load": -1}}),
        "unknown key": json.dumps({"schema": 1, "seconds": {}, "secnds": {}}),
    }
    for i, (what, text) in enumerate(bad.items()):
        p = tmp_path / f"d{i}.json"
        p.write_text(text)
        with pytest.raises(UserError, match=what):
            load_durations(p)
    p = tmp_path / "true.json"
    p.write_text(json.dumps({"schema": 1, "seconds": {"llama/load": True}}))
    with pytest.raises(UserError, match="not a finite number"):
        load_durations(p)


def test_committed_durations_cover_the_manifest():
    """The committed durations file loads, and names only rows and lanes the manifest has (a renamed row or
    lane would otherwise silently fall back to estimates); every runnable row of every tier is measured."""
    durations = load_durations(DURATIONS)
    m = load_manifest(ROOT / "family_tiers.toml")
    known = {f"{r.key}/{lane}" for r in m.rows.values() for lane in r.lanes}
    assert set(durations) <= known, sorted(set(durations) - known)[:5]
    runnable = {f"{r.key}/{lane}" for r in m.rows.values() if r.runnable for lane in r.lanes}
    missing = sorted(runnable - set(durations))
    assert not missing, missing[:5]
    tier1 = [(r.key, r.lanes) for r in m.select(1) if r.runnable]
    plan = plan_shards(tier1, durations, 4)
    assert len(plan) == 4 and sorted(r for p in plan for r in p["rows"]) == sorted(k for k, _ in tier1)
