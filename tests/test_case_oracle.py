"""fuzz/engine/case_oracle.py: the loop every oracle over cases shares — a failed call as crash or timeout, the
reproduce-once rule before a finding is explained, the Report — driven by a scripted oracle (no target process)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from fuzz.engine.case_oracle import CaseOracle, finding_of
from fuzz.engine.contract import CRASH, FINDING, NUMERICS, PASS, TIMEOUT, fingerprint
from targets import Failure


@dataclass
class ScriptedConfig:
    target: str = "llama-cpp"
    timeout: float = 1.0


class Scripted(CaseOracle[str]):
    """Each case's observations in turn (a list: the first run, then the reproduction)."""

    name = "scripted"

    def __init__(self, fixture, seen: dict[str, list[Any]], numerics: set[str] = frozenset()):
        super().__init__(fixture, ScriptedConfig())
        self.seen, self.numerics, self.calls = {k: list(v) for k, v in seen.items()}, numerics, []

    def open(self, fleet):
        self.commit = "abc"

    def cases(self):
        return list(self.seen)

    def identity(self, case):
        return {"case": case}

    def observe(self, case):
        self.calls.append(("observe", case))
        return self.seen[case].pop(0)

    def judge(self, case, seen):  # pure: the observation is the step that differs, or None
        return [{"case": case, "status": PASS if seen is None else FINDING, "step": seen, "phase": "p"}]

    def explain(self, case, seen, row):
        self.calls.append(("explain", case))
        return {"cause": {"kind": "near-tie"}, "status": NUMERICS} if case in self.numerics else {"layer": 3}

    def message(self, row):
        return f"case {row['case']} at step {row.get('step')}"

    def record(self, results):
        return {"fixture": str(self.fixture), "arch": "llama", "n_layer": 2, "config": {}, "llama_cpp_commit": "abc"}


def test_a_finding_is_observed_once_more_then_explained(fixtures):
    o = Scripted(fixtures("llama", layers=2), {"a": [None], "b": [4, 4], "c": [2, 5], "d": [1, 1]}, numerics={"d"})
    data = o.run()
    by = {r["case"]: r for r in data["results"]}
    assert by["a"] == {"case": "a", "status": PASS, "step": None, "phase": "p"}
    assert by["b"]["status"] == FINDING and by["b"]["reproduced"] is True and by["b"]["layer"] == 3
    assert by["c"]["reproduced"] is False  # came back at another step
    assert by["d"]["status"] == NUMERICS and by["d"]["reproduced"] is True  # reproduced, then explained away
    assert o.calls == [("observe", "a"), ("observe", "b"), ("observe", "b"), ("explain", "b"), ("observe", "c"),
                       ("observe", "c"), ("explain", "c"), ("observe", "d"), ("observe", "d"), ("explain", "d")]
    assert set(data["timing"]) == {"wall_s"}


def test_a_failed_call_is_a_crash_or_timeout_and_is_tried_again(fixtures):
    died, hung = Failure("crash", "signal 6", "script", {}), Failure("timeout", "no reply in 1 s", "script", {})
    data = Scripted(fixtures("llama", layers=2), {"x": [died, died], "y": [hung, None]}).run()
    assert [(r["status"], r["reason"], r["reproduced"]) for r in data["results"]] == [
        (CRASH, "signal 6", True), (TIMEOUT, "no reply in 1 s", False)]


def test_the_report_has_one_finding_per_failing_row_and_numerics_apart(fixtures):
    rep = Scripted(fixtures("llama", layers=2), {"b": [4, 4], "d": [1, 1]}, numerics={"d"}).report()
    assert rep.status == FINDING and rep.exit_code == 1 and rep.llama_cpp_commit is not None
    (f,) = rep.findings
    assert (f.oracle, f.message, f.step, f.phase, f.layer, f.reproduced) == ("scripted", "case b at step 4", 4, "p",
                                                                             3, True)
    assert [n.cause for n in rep.numerics] == [{"kind": "near-tie"}]


def test_finding_of_places_a_row_by_its_fields():
    f = finding_of("wire", {"status": FINDING, "cuts": (2, 4), "stage": 1, "where": "boundary", "junk": 1}, "m")
    assert (f.cuts, f.stage, f.where, f.offset, f.detail["junk"]) == ([2, 4], 1, "boundary", None, 1)


def test_finding_of_places_what_the_row_names_otherwise_and_drops_what_stays_out():
    row = {"status": FINDING, "cuts": [3], "seq": 2, "check": "wire", "payload": "kv"}
    f = finding_of("skippy", row, "m", phase=row["check"], where=row["payload"], seq=None, detail={"own": 1})
    assert (f.phase, f.where, f.seq, f.detail) == ("wire", "kv", None, {"own": 1})
    assert "seq" not in fingerprint(f, "AAAA")
    with pytest.raises(TypeError, match="'payload' is not a placing field"):
        finding_of("skippy", row, "m", payload="kv")


class Exploring(Scripted):
    """The hooks an exploring oracle uses: cases yielded as it goes, only what reproduced reported, the run ended
    after a case, a finding met again not listed."""

    reproduce_only = True

    def __init__(self, fixture, seen, stop_at: str | None = None):
        super().__init__(fixture, seen)
        self.stop_at, self.ends, self.explained_with = stop_at, [], []

    def cases(self):
        yield from self.seen  # (lazily: a generator has no length)

    def total(self, cases):
        return len(self.seen)

    def explain_all(self, case, seen, bad):
        self.explained_with.append((case, [r["case"] for r in bad]))
        for r in bad:
            r.update(self.explain(case, seen, r))

    def done(self, rows):
        self.ends.append([r["case"] for r in rows])
        return any(r["case"] == self.stop_at for r in rows)

    def listed(self, row):
        return row["case"] != "b2"  # (the same finding as b's, met again: counted, not listed)


def test_an_exploring_oracle_reports_only_what_came_back_and_ends_where_it_says(fixtures):
    o = Exploring(fixtures("llama", layers=2), {"a": [None], "flaky": [3, 5], "b": [4, 4], "b2": [4, 4],
                                                "stop": [None], "never": [None]}, stop_at="stop")
    rep = o.report()
    assert [r["case"] for r in rep.results] == ["a", "b", "b2", "stop"]  # the flaky row dropped; none past `stop`
    assert [(r["case"], r["step"], r["reproduced"]) for r in o.unreproduced] == [("flaky", 3, False)]
    assert o.ends == [["a"], [], ["b"], ["b2"], ["stop"]]  # (done sees a dropped finding's case as no rows)
    assert o.explained_with == [("b", ["b"]), ("b2", ["b2"])]  # only cases with a failing row, the flaky one not
    assert [f.message for f in rep.findings] == ["case b at step 4"]
    assert ("observe", "never") not in o.calls
