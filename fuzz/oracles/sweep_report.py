"""The sweep's data, without a target: its config, one cut set's result, the report (the full model's control,
every cut set, the timing) and the report's text."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fuzz.engine.contract import (
    CRASH,
    FAILING,
    FINDING,
    PASS,
    TIMEOUT,
    UNSUPPORTED,
    commit_words,
)
from fuzz.engine.parity import (
    describe_node,
)
from fuzz.engine.schedule import PHASES

STATUSES = (PASS, FINDING, UNSUPPORTED, CRASH, TIMEOUT)


@dataclass
class SweepConfig:
    cuts: str = "all"  # all | period | "3;5;2,6" (cut sets separated by ';', cuts by ',') | planner:CMD
    stages: int = 2
    tokens: int = 32
    prompt_len: int = 24
    prompt: tuple[int, ...] = ()  # the prompt's token ids (default: prompt_len tokens drawn from seed)
    chunk: int = 7
    n_seq: int = 3
    n_ubatch: int = 64  # llama.cpp splits each batch (n_batch 64) into ubatches of this many rows: a chunk of
    # hidden states larger than it, fed to a later stage, takes the split path every real stage takes
    phases: tuple[str, ...] = PHASES
    period: int | None = None
    target: str = "llama-cpp"
    timeout: float = 120.0
    seed: int = 0
    workdir: Path | None = None  # where stage files go (default: a temporary directory)
    workers: int = 0  # stage workers, each taking any (cut set, stage) task (0: one per core, 2..8)


@dataclass
class CutResult:
    cuts: list[int]
    stages: list[list[int]]
    status: str
    phase: str | None = None
    step: int | None = None
    position: int | None = None
    seq: int | None = None
    stage: int | None = None
    where: str | None = None
    layer: int | str | None = None
    node: dict[str, Any] | None = None  # the first graph node of `layer` whose bits differ (fuzz.engine.parity)
    max_abs_dlogit: float = 0.0
    tokens_equal: bool | None = None
    reproduced: bool | None = None
    reason: str | None = None
    pads: dict[str, list[int]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None and v != {}}


@dataclass
class SweepReport:
    fixture: str
    sha256: str
    arch: str
    n_layer: int
    kinds: str
    target: str
    llama_cpp_commit: str | None
    config: dict[str, Any]
    control: dict[str, Any]
    results: list[CutResult]
    timing: dict[str, float]

    @property
    def summary(self) -> dict[str, int]:
        return {s: sum(r.status == s for r in self.results) for s in STATUSES}

    @property
    def exit_code(self) -> int:
        bad = any(r.status in FAILING for r in self.results)
        return 1 if bad or self.control.get("status") not in ("pass", "unsupported", None) else 0

    def to_dict(self) -> dict[str, Any]:
        return {"fixture": self.fixture, "sha256": self.sha256, "arch": self.arch, "n_layer": self.n_layer,
                "kinds": self.kinds, "target": self.target, "llama_cpp_commit": self.llama_cpp_commit,
                "config": self.config, "control": self.control, "summary": self.summary,
                "results": [r.to_dict() for r in self.results], "timing": self.timing}


def format_report(rep: SweepReport) -> str:
    lines = [f"sweep {rep.fixture}: arch {rep.arch}, {rep.n_layer} layers {rep.kinds}, target {rep.target}, "
             f"llama.cpp {commit_words({'llama_cpp_commit': rep.llama_cpp_commit}, tick='', short=9)}",
             f"control (full model, embedding input): {rep.control.get('status')}"
             + (f" — {rep.control['reason']}" if rep.control.get("reason") else ""),
             f"{'cuts':<12} {'status':<11} {'phase':<9} {'pos':>4} {'stage':>5} {'layer':>6} {'max|Δ|':>9}  note"]
    for r in rep.results:
        note = r.reason or (f"pad {r.pads}" if r.pads else "")
        if r.status == FINDING:
            note = f"{r.where} differs; reproduced={r.reproduced}" + (f"; {r.reason}" if r.reason else "")
            if describe_node(r.node):
                note += f"; first node {describe_node(r.node)}"
        lines.append(f"{','.join(map(str, r.cuts)):<12} {r.status:<11} {r.phase or '':<9} "
                     f"{'' if r.position is None else r.position:>4} {'' if r.stage is None else r.stage:>5} "
                     f"{'' if r.layer is None else r.layer:>6} {r.max_abs_dlogit:>9.2e}  {note}")
    s = rep.summary
    lines.append(f"{len(rep.results)} cut sets: " + ", ".join(f"{v} {k}" for k, v in s.items() if v)
                 + f"; wall {rep.timing['wall_s']:.2f}s, llama_decode {rep.timing['llama_decode_s']:.2f}s")
    return "\n".join(lines)
