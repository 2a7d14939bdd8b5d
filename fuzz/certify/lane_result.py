"""What a lane returns (LaneResult) and what the lanes share: one oracle run with its case config, the worst status
of several runs, each finding matched to the committed upstream repro it is, and the result that names them known."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fuzz.engine.contract import FAILING, KNOWN, PASS, UNSUPPORTED, Report
from fuzz.oracles.registry import ORACLES
from synth.manifest import Row


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


def worst(statuses: list[str]) -> str:
    """A lane of several runs: its first failing status; else pass if any run passed; else unsupported."""
    return next((s for s in statuses if s in FAILING), PASS if PASS in statuses else UNSUPPORTED)


def known_findings(row: Row, reps: list[Report]) -> dict[int, str | None]:
    """Each finding of the reports (by id) → the committed upstream repro it is (corpora/repros, matched by what
    it is: fuzz.repro.campaign.known_repro), or None."""
    return known_of(str(row.recipe.get("family", row.key)), reps)


def known_of(family: str, reps: list[Report]) -> dict[int, str | None]:
    """known_findings for a family named directly."""
    from fuzz.repro.campaign import known_repro, known_upstream

    known = known_upstream()
    return {id(f): known_repro(known, family, f) for rep in reps for f in rep.findings}


def no_new_findings(row: Row, lane: str, did: str, what: str, reps: list[Report], cases: list[dict[str, Any]],
                    repros: dict[int, str | None]) -> LaneResult:
    """A lane whose every finding is a committed upstream repro (`repros`: known_findings): known, each named, if it
    has any; else the worst status of its runs."""
    names = sorted({n for n in repros.values() if n})
    if names:
        # (and which repros each run met: a bump compares the runs both builds drew alike)
        runs = [sorted({repros[id(f)] for f in rep.findings if repros.get(id(f))}) for rep in reps]
        return LaneResult(row.key, lane, KNOWN, f"{did}; only upstream's known {what}: {', '.join(names)}",
                          data={"known": [f"corpora/repros/{n}" for n in names], "known_runs": runs},
                          reports=reps, cases=cases)
    return LaneResult(row.key, lane, worst([r.status for r in reps]), did, reports=reps, cases=cases)


def memory_verdict(row: Row, lane: str, did: str, what: str, reps: list[Report], cases: list[dict[str, Any]],
                   repros: dict[int, str | None]) -> LaneResult:
    """A lane of memory-oracle runs: the first finding that is no committed upstream repro fails it (its message, the
    operations it took, its cause and whether it reproduced); else no_new_findings."""
    new = [f for rep in reps for f in rep.findings if repros[id(f)] is None]
    if not new:
        return no_new_findings(row, lane, did, what, reps, cases, repros)
    f = new[0]
    cause = f"; cause: {f.cause['kind']}" if f.cause else ""
    return LaneResult(row.key, lane, f.status, f"{len(new)} findings; first: {f.message} after "
                      f"{len(f.detail['program'])} operations{cause}; reproduced={f.reproduced}", reports=reps,
                      cases=cases)
