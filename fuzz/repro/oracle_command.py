"""What every oracle command of `fuzz` (and certify's commands) does around its oracle: the build its workers run,
the run, its report and bundles."""

from __future__ import annotations

import json
from pathlib import Path

from fuzz.engine.fixtures import fixture_path
from fuzz.oracles.registry import get_oracle
from fuzz.repro import bundle as bd


def current_build_label(commit: str | None) -> str:
    """The llama.cpp a target runs, in a few words: its commit, and the build's spec when it is not the pinned one."""
    from fuzz.engine import contract
    from targets.builds import current_identity

    return contract.build_label({**current_identity(), "llama_cpp_commit": commit}, tick="", short=9)


def use_build(spec: str | None, patches: Path | None, backend: str | None = None) -> None:
    """--llama-cpp / --patches / --backend: the build every worker of this command runs, built (or taken from the
    cache) and its API checked before anything else runs."""
    from targets.builds import use

    b = use(spec, patches, backend)
    if b.seconds:
        print(f"built {b.spec} in {b.seconds:.0f} s (cached for later runs)")


def run_oracle(name: str, fixture: str, cfg: object, report: Path | None, bundle: Path | None,
               build: tuple[str | None, Path | None, str | None] = (None, None, None)) -> int:
    """Every oracle command's body: the build, then run, print, write the report, bundle each distinct finding;
    exit 1 on any."""
    use_build(*build)
    oracle = get_oracle(name)
    rep = oracle.run(fixture_path(fixture), cfg)
    print(oracle.format(rep))
    write_report(report, rep.to_dict())
    if bundle and rep.findings:
        report_bundles(bd.bundle_findings(rep, oracle.case_config(cfg), bundle))
    return rep.exit_code


def report_bundles(paths: list[Path]) -> None:
    for p in paths:
        print(f"bundle: {p}  (replay: fuzz replay {p})")


def write_report(report: Path | None, data: dict) -> None:
    if report:
        report.parent.mkdir(parents=True, exist_ok=True)
        report.write_text(json.dumps(data, indent=2))
