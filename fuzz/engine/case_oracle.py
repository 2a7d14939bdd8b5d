"""One oracle skeleton: the loop an oracle over cases runs, written once.

An oracle fills in its cases (cut sets, KV layouts, ...), how one case runs on the target (`observe`: target calls,
nothing judged), a pure `judge` (what was seen → result rows in the status vocabulary, testable without llama.cpp),
how a finding is explained (`explain`: more target calls; it may add where the difference starts, or a cause that
makes it `numerics`), and its one-line `message` for a finding. The skeleton owns the rest: the fleet of workers,
progress, timing, a failed target call as crash or timeout, the reproduce-once rule (a case with a finding is
observed and judged once more, before it is explained; each finding says whether it came back the same) and the
Report. Where an oracle's cases are not independent checks it says so through hooks, never its own loop: its cases
yielded as it explores (`total`: what progress counts to), findings explained together (`explain_all`: one control
for several), the run ended after a case (`done`), only what reproduced reported (`reproduce_only`), and which rows
the Report lists (`listed`: a finding met again is counted once).
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sized
from contextlib import ExitStack
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

from fuzz.engine.configs import check_config
from fuzz.engine.contract import FAILING, FINDING, NUMERICS, Finding, Report, make_report
from fuzz.engine.fleet import Fleet, failure_status
from fuzz.engine.progress import Progress
from targets import Failure

Case = TypeVar("Case")
# the row fields a finding is placed by (Finding's own): what `same` compares and `finding_of` carries over
WHERE = ("cuts", "stage", "offset", "phase", "step", "position", "seq", "where", "layer", "node", "cause",
         "reproduced")
SAME = ("status", "stage", "offset", "phase", "step", "seq", "where")


class CaseOracle(ABC, Generic[Case]):
    """`run()` → the oracle's own record (its formatter prints it); `report()` → the Report of the contract."""

    name: ClassVar[str]
    unit: ClassVar[str] = "cases"  # what progress counts
    # a finding that did not come back is not reported (it goes to `self.unreproduced`, for the record): an oracle
    # whose runs race (a server's schedules) reports only what it saw every time
    reproduce_only: ClassVar[bool] = False
    sections: ClassVar[tuple[str, ...]] = ()  # the oracle's own sections of the record kept in the Report

    def __init__(self, fixture: Path, cfg: Any):
        check_config(cfg)
        self.fixture = Path(fixture)
        self.cfg = cfg
        self.commit: str | None = None

    # ---- what an oracle fills in ------------------------------------------------------------------------
    @abstractmethod
    def open(self, fleet: Fleet) -> None:
        """Its workers (from the fleet) and what every case is compared against; sets `commit`. A context it must
        hold for the run (a stage-file workspace) goes on `self.scope`, left after the workers close."""

    @abstractmethod
    def cases(self) -> Iterable[Case]:
        """What it checks, in order (an oracle that explores until a budget is spent yields them as it goes)."""

    def total(self, cases: Iterable[Case]) -> int:
        """What progress counts to (0: unknown)."""
        return len(cases) if isinstance(cases, Sized) else 0

    @abstractmethod
    def observe(self, case: Case) -> Any:
        """One run of the case on the target: what it saw, or a Failure (the target died or hung)."""

    @abstractmethod
    def judge(self, case: Case, seen: Any) -> list[dict[str, Any]]:
        """Pure: what was seen → the case's result rows, each with a `status`."""

    def identity(self, case: Case) -> dict[str, Any]:
        """The fields that name the case in its rows (a failed call's row has only these)."""
        return {}

    def explain(self, case: Case, seen: Any, row: dict[str, Any]) -> dict[str, Any]:
        """Fields to add to a finding's row: where it starts, its cause; `status` NUMERICS when the cause is the
        model's numerics, not a bug."""
        return {}

    def explain_all(self, case: Case, seen: Any, bad: list[dict[str, Any]]) -> None:
        """Explain a case's failing rows (in place). Default: each finding by `explain` (a crash is what it is); an
        oracle whose controls serve several findings at once (one server load for all of them), or that shortens a
        crash too, explains them together."""
        for row in bad:
            if row["status"] == FINDING:
                row.update(self.explain(case, seen, row))

    def done(self, rows: list[dict[str, Any]]) -> bool:
        """Whether the run ends after a case with these rows (default: every case runs). A target that cannot even
        be set up under the oracle's configuration (a server that aborts loading) has nothing more to show."""
        return False

    @abstractmethod
    def message(self, row: dict[str, Any]) -> str:
        """A finding in one line."""

    @abstractmethod
    def record(self, results: list[dict[str, Any]]) -> dict[str, Any]:
        """The oracle's record of the run: its header, config and sections around the results."""

    # ---- the loop -------------------------------------------------------------------------------------------
    def failed(self, case: Case, f: Failure) -> list[dict[str, Any]]:
        return [{**self.identity(case), "status": failure_status(f), "reason": f.message}]

    def check(self, case: Case) -> tuple[Any, list[dict[str, Any]]]:
        seen = self.observe(case)
        return seen, self.failed(case, seen) if isinstance(seen, Failure) else self.judge(case, seen)

    def same(self, row: dict[str, Any], again: list[dict[str, Any]]) -> bool:
        """A finding came back: a row of the second run agrees on its status and place."""
        return any(all(a.get(k) == row.get(k) for k in SAME) for a in again)

    def again(self, case: Case, seen: Any, bad: list[dict[str, Any]]) -> None:
        """The reproduce-once rule: the case observed and judged once more; each failing row says whether it came
        back (`reproduced`). An oracle may run less again (the one step that failed)."""
        again = self.check(case)[1]
        for r in bad:
            r["reproduced"] = self.same(r, again)

    def fleet_timeout(self) -> float:
        """Seconds a worker call may take (default: the config's timeout)."""
        return self.cfg.timeout

    def timing(self, wall: float) -> dict[str, float]:
        """Seconds of its own to report beside the wall (llama_decode_s, ...)."""
        return {}

    def checked(self, cases: Iterable[Case], progress: Progress) -> Iterator[tuple[Case, Any, list[dict[str, Any]]]]:
        """Each case with what was seen and its rows, in case order, progress advanced as each is done (after the
        caller has reproduced and explained it). Default: one case after another; an oracle whose cases run side
        by side on several workers gives them here once they are all seen."""
        for case in cases:
            progress.working(f"{self.name} {self.identity(case)}")
            yield case, *self.check(case)
            progress.advance()

    def listed(self, row: dict[str, Any]) -> bool:
        """Whether a failing or numerics row is listed among the Report's findings or numerics (default: every
        one). An oracle whose policy makes some cases numerics without a cause lists only the explained ones; one
        that explores on past a finding lists each finding once."""
        return True

    def more_findings(self, data: dict[str, Any]) -> list[Finding]:
        """Findings that are not one case's (the sweep's control run)."""
        return []

    def native(self, data: dict[str, Any]) -> Any:
        """What `run()` returns and the formatter prints (default: the record itself)."""
        return data

    def collect(self) -> dict[str, Any]:
        """The run: every case checked, a failing one reproduced once, a finding explained; the record."""
        t0 = time.perf_counter()
        results: list[dict[str, Any]] = []
        with ExitStack() as self.scope, Fleet(self.cfg.target, self.fleet_timeout()) as fleet:
            self.open(fleet)
            cases = self.cases()
            self.unreproduced: list[dict[str, Any]] = []
            with Progress(self.total(cases), self.unit) as progress:
                for case, seen, rows in self.checked(cases, progress):
                    bad = [r for r in rows if r["status"] in FAILING]
                    if bad:  # once more before any is reported
                        self.again(case, seen, bad)
                        if self.reproduce_only:
                            self.unreproduced += [r for r in bad if r.get("reproduced") is False]
                            rows = [r for r in rows if r.get("reproduced") is not False]
                            bad = [r for r in bad if r.get("reproduced") is not False]
                    if bad and not isinstance(seen, Failure):
                        self.explain_all(case, seen, bad)
                    results += rows
                    if self.done(rows):
                        break
        wall = time.perf_counter() - t0
        return {**self.record(results), "results": results,
                "timing": {"wall_s": round(wall, 3), **self.timing(wall)}}

    def run(self) -> Any:
        return self.native(self.collect())

    def report(self) -> Report:
        data = self.collect()
        return make_report(self.name, self.fixture, data, results=data["results"], extra=self.sections,
                           native=self.native(data),
                           findings=[self.finding(r) for r in data["results"]
                                     if r["status"] in FAILING and self.listed(r)] + self.more_findings(data),
                           numerics=[self.finding(r) for r in data["results"]
                                     if r["status"] == NUMERICS and self.listed(r)])

    def finding(self, row: dict[str, Any]) -> Finding:
        return finding_of(self.name, row, self.message(row))


def finding_of(oracle: str, row: dict[str, Any], message: str, *, detail: dict[str, Any] | None = None,
               **place: Any) -> Finding:
    """A result row as a Finding: its status and the fields that place it; the row itself as the detail (or
    `detail`). `place` sets a placing field the row names otherwise, or drops one (None) that must stay out of the
    fingerprint (the sweep's batched sequence: fewer sequences may move it, the bug stays)."""
    where = {k: row[k] for k in WHERE if row.get(k) is not None}
    for k, v in place.items():
        if k not in WHERE:
            raise TypeError(f"finding_of: {k!r} is not a placing field")
        if v is None:
            where.pop(k, None)
        else:
            where[k] = v
    if "cuts" in where:
        where["cuts"] = list(where["cuts"])
    return Finding(oracle=oracle, status=row["status"], message=message, detail=row if detail is None else detail,
                   **where)
