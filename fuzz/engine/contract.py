"""The oracle contract: one status vocabulary, one `Finding`, one `Report`, and the `Oracle` every oracle module
declares (its config type, how it runs, how its findings are fingerprinted, narrowed and shrunk).

The CLI commands, family-certify's lanes, repro bundles, `fuzz replay` and the shrinker read only this contract
(fuzz/oracles/registry.py is the registry), so a new oracle is one module with an `ORACLE` at its end. An oracle's own
per-case records stay in `Report.results` (a cut set, a sequence, a schedule pair), in the same vocabulary.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import numpy as np

from fuzz.engine.stages import KIND_LETTER
from synth.inspect import inspect_file

REPORT_SCHEMA = 2  # 1: each oracle's own shape (until 0.1.0); 2: this contract

# The one status vocabulary. A per-case record or a lane is exactly one of these.
PASS = "pass"  # checked, and as promised
FINDING = "finding"  # checked, and not as promised (reproduced, localized where the oracle can)
UNSUPPORTED = "unsupported"  # cannot be expressed for this fixture (a true reason is given)
KNOWN = "known"  # a lane failing exactly as a finding the manifest records (an upstream bug with its repro)
NUMERICS = "numerics"  # differs, and the oracle's cause analysis shows it is numerics, not a bug
CRASH = "crash"  # the target aborted, segfaulted or refused under a configuration the toolkit chose
TIMEOUT = "timeout"  # the target hung past the per-call timeout
MISSING = "missing"  # planned, but produced no result (fails closed)
SKIPPED = "skipped"  # could not run on this machine (a missing binary): said loudly, with why
STATUSES = (PASS, FINDING, UNSUPPORTED, KNOWN, NUMERICS, CRASH, TIMEOUT, MISSING, SKIPPED)
FAILING = (FINDING, CRASH, TIMEOUT, MISSING)  # a run with any of these exits 1

# ---- tolerances relative to the model's own logits -------------------------------------------------------------
# The least tolerance of a logits comparison, as a fraction of the logits' own spread (their standard deviation over
# the vocabulary): a bound in logits means something else on a model whose logits span tens than on one whose logits
# span hundreds. 0.03: 0.1 on the fixtures (their logits spread 2.6-3.5; cohere2's and minicpm3's scaled heads ~20).
TOL_SPREAD = 0.03


def logits_spread(rows: list[np.ndarray]) -> float:
    """The logits' spread: the median over the rows of their standard deviation over the vocabulary."""
    return float(np.median([np.std(np.asarray(r, dtype=np.float64)) for r in rows])) if rows else 0.0


def build_identity(llama_cpp_commit: str | None = None) -> dict[str, Any]:
    """What every report, bundle and summary records of the build: the llama.cpp build the workers ran (spec,
    commit, tree and patch-series hashes, options: targets.builds) and the toolkit's version."""
    from targets.builds import identity

    return {**identity(llama_cpp_commit), "toolkit": toolkit_version()}


def build_name(b: dict[str, Any]) -> str:
    """A build in one word: its cache key (a built tree), else its llama.cpp commit (the pinned build)."""
    return str(b.get("key") or b.get("llama_cpp_commit"))


def build_parts(b: dict[str, Any], tick: str = "`", spec: bool = True) -> list[str]:
    """The build beyond its commit, when it is not the plain pinned build: its spec, backend, tree hash and patch
    series, each a few words."""
    if b.get("spec", "pinned") == "pinned" and not b.get("patches") and b.get("backend", "cpu") == "cpu":
        return []
    p = b.get("patches")
    return ([f"build {tick}{b.get('spec')}{tick}"] if spec else []) \
        + ([f"backend {tick}{b['backend']}{tick}"] if b.get("backend", "cpu") != "cpu" else []) \
        + ([f"tree {tick}{b['tree_sha256'][:12]}{tick}"] if b.get("tree_sha256") else []) \
        + ([f"patches {', '.join(p['files'])} {tick}{p['sha256'][:12]}{tick}"] if p else [])


def commit_words(b: dict[str, Any], tick: str = "`", short: int | None = 12) -> str:
    """The build's llama.cpp commit, or "commit unknown" (a tree without git history: an sdist's)."""
    c = b.get("llama_cpp_commit")
    return f"{tick}{c[:short]}{tick}" if c else "commit unknown"


def build_label(b: dict[str, Any], tick: str = "`", short: int | None = 12) -> str:
    """The llama.cpp a report ran, in one phrase (a summary's header, a bundle's README, a CLI line with tick ""):
    its commit and the build beyond it."""
    parts = build_parts(b, tick)
    return f"llama.cpp {commit_words(b, tick, short)}" + (f" ({', '.join(parts)})" if parts else "")


def toolkit_version() -> str:
    try:
        return version("family-certify")
    except PackageNotFoundError:  # a checkout on sys.path without the package installed
        return "0+unknown"


@dataclass
class Finding:
    """One thing an oracle found, where it starts, and whether a second run saw it again."""

    oracle: str
    status: str  # finding | crash | timeout (numerics: explained away, listed in Report.numerics)
    message: str  # one line a reviewer reads
    cuts: list[int] | None = None  # the cut set ([] the unsplit model; None: not about one cut set)
    stage: int | None = None
    offset: int | None = None  # hand-off offset t
    phase: str | None = None  # sweep phase, hand-off mode, determinism class, isolation KV layout, server kind
    step: int | None = None
    position: int | None = None
    seq: int | None = None
    where: str | None = None  # boundary or logits
    layer: int | str | None = None  # the first differing layer (source index)
    node: dict[str, Any] | None = None  # the first differing graph node (fuzz.engine.parity.describe_node)
    cause: dict[str, Any] | None = None  # the cause analysis' verdict, {kind, detail, ...}
    reproduced: bool | None = None
    fingerprint: dict[str, Any] = field(default_factory=dict)  # stable identity for shrinking and dedup
    detail: dict[str, Any] = field(default_factory=dict)  # the oracle's own record of it

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)
                if getattr(self, f.name) is not None or f.name in ("oracle", "status", "message")}


def layer_strip(path: Path) -> list[dict[str, Any]]:
    """Per layer what pictures and fingerprints show: kind, sliding window, MoE (read from the file)."""
    return [{"kind": x.kind, "swa": x.swa, "moe": x.ffn == "moe"} for x in inspect_file(str(path)).layers]


@dataclass
class Report:
    """What every oracle returns, and what `--report` writes (schemas/report.schema.json)."""

    oracle: str
    fixture: str
    sha256: str
    arch: str
    n_layer: int
    kinds: str  # one letter per layer: A attention, R recurrent, B both, M mlp only
    layers: list[dict[str, Any]]
    target: str
    build: dict[str, Any]  # llama_cpp_commit, toolkit
    config: dict[str, Any]
    results: list[dict[str, Any]]  # per case (cut set, sequence, round), each with a `status` of STATUSES
    findings: list[Finding]
    numerics: list[Finding] = field(default_factory=list)
    timing: dict[str, float] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)  # the oracle's own sections (control, policy, rounds, ...)
    native: Any = field(default=None, repr=False, compare=False)  # the oracle's own result, for its formatter

    @property
    def summary(self) -> dict[str, int]:
        counts = {s: 0 for s in (PASS, FINDING, UNSUPPORTED, NUMERICS, CRASH, TIMEOUT)}
        for r in self.results:
            counts[r["status"]] = counts.get(r["status"], 0) + 1
        return counts

    @property
    def status(self) -> str:
        """The run's verdict: its first finding's status; else pass if anything was checked; else unsupported."""
        if self.findings:
            return self.findings[0].status
        checked = any(r["status"] in (PASS, NUMERICS) for r in self.results) or not self.results
        return PASS if checked else UNSUPPORTED

    @property
    def exit_code(self) -> int:
        return 1 if self.findings else 0

    @property
    def llama_cpp_commit(self) -> str | None:
        return self.build.get("llama_cpp_commit")

    def to_dict(self) -> dict[str, Any]:
        out = {"schema": REPORT_SCHEMA, "oracle": self.oracle, "status": self.status, "exit_code": self.exit_code,
               "fixture": self.fixture, "sha256": self.sha256, "arch": self.arch, "n_layer": self.n_layer,
               "kinds": self.kinds, "layers": self.layers, "target": self.target, "build": self.build,
               "llama_cpp_commit": self.llama_cpp_commit, "config": self.config, "summary": self.summary,
               "results": self.results, "findings": [f.to_dict() for f in self.findings],
               "numerics": [f.to_dict() for f in self.numerics], "timing": self.timing}
        out.update(self.extra)
        return out


def make_report(oracle: str, fixture: Path, data: dict[str, Any], *, results: list[dict[str, Any]],
                findings: list[Finding], numerics: list[Finding] = (), extra: tuple[str, ...] = (),
                native: Any = None) -> Report:
    """A Report from an oracle's run: the common fields read from its data (and the fixture where it has none),
    `extra` the names of its own sections to keep, `native` what its formatter prints (default: data)."""
    native = data if native is None else native
    fixture = Path(fixture)
    layers = layer_strip(fixture)
    kinds = data.get("kinds") or "".join(KIND_LETTER[x["kind"]] for x in layers)
    for f in (*findings, *numerics):
        f.fingerprint = f.fingerprint or fingerprint(f, kinds)
    return Report(oracle=oracle, fixture=str(fixture),
                  sha256=data.get("sha256") or hashlib.sha256(fixture.read_bytes()).hexdigest(),
                  arch=data["arch"], n_layer=data["n_layer"], kinds=kinds, layers=layers,
                  target=data.get("target") or data["config"].get("target", ""),
                  build=build_identity(data.get("llama_cpp_commit")),
                  config=data["config"], results=results, findings=list(findings), numerics=list(numerics),
                  timing=data.get("timing", {}), extra={k: data[k] for k in extra if k in data}, native=native)


def fingerprint(f: Finding, kinds: str) -> dict[str, Any]:
    """Oracle, status, phase and where it is, and the kinds of layer at the cut and at the divergence: what must
    stay the same while shrinking, so the shrinker cannot slide to another bug."""
    fp: dict[str, Any] = {"oracle": f.oracle, "status": f.status, "phase": f.phase}
    for key in ("stage", "where", "seq"):
        if getattr(f, key) is not None:
            fp[key] = getattr(f, key)
    if f.cuts:
        fp["cut_kinds"] = [kinds[c] for c in f.cuts]
    if isinstance(f.layer, int) and 0 <= f.layer < len(kinds):
        fp["layer_kind"] = kinds[f.layer]
    if f.cause and f.cause.get("kind"):  # a leak must not shrink into a numerics difference (or back)
        fp["cause"] = f.cause["kind"]
    return fp


def matches(recorded: dict[str, Any], fp: dict[str, Any]) -> bool:
    """A fingerprint recorded earlier names this one: every key it holds agrees (a bundle recorded before a key
    was added — a cause, say — still replays)."""
    return all(fp.get(k) == v for k, v in recorded.items())


def describe(fp: dict[str, Any]) -> str:
    """One line for a fingerprint: oracle, status and where."""
    where = ", ".join(f"{k} {v}" for k, v in fp.items() if k not in ("oracle", "status", "cut_kinds", "layer_kind")
                      and v is not None)
    return f"{fp['oracle']} {fp['status']}" + (f" ({where})" if where else "")


@dataclass(frozen=True)
class Oracle:
    """What an oracle module declares for the CLI, the lanes, bundles, replay and the shrinker.

    run: (fixture, config) → Report. per_cut: a finding belongs to one cut set (a bundle replays that cut set
    only, with `cuts` fixed by the bundle). narrow: (config, finding) → the config with only the finding's phase,
    mode or KV layout selected (a bundle runs only that). shrink: config fields the shrinker halves, with floors.
    replay_of: (config, finding) → the config that runs exactly the finding (an exploring oracle's finding names
    its schedule: a bundle reproduces that, not the exploration). reduce: config → smaller configs to try, coarsest
    first (the shrinker takes the first that keeps the fingerprint, and asks again). replay_runs: see below.
    """

    name: str
    config: type
    run: Callable[[Path, Any], Report]
    format: Callable[[Report], str]
    per_cut: bool = False
    narrow: Callable[[dict[str, Any], Finding], dict[str, Any]] | None = None
    shrink: tuple[tuple[str, int], ...] = ()
    replay_of: Callable[[dict[str, Any], Finding], dict[str, Any]] | None = None
    reduce: Callable[[dict[str, Any]], list[dict[str, Any]]] | None = None
    case_fields: tuple[str, ...] = ()  # config fields a bundle records (the rest come from the bundle or defaults)
    # fingerprint fields that name an upstream bug whatever the family: an oracle over llama.cpp code every family
    # shares (its memory operations) matches a committed repro by these alone (fuzz.repro.campaign.known_repro)
    known_key: tuple[str, ...] = ()
    # runs a bundle's replay may take to show its finding before it says "not reproduced": an oracle whose runs race
    # a server's threads (one run may take the branch the finding does not) declares more than one
    replay_runs: int = 1

    def case_config(self, cfg: Any) -> dict[str, Any]:
        """The config fields a bundle replays, JSON-ready."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in
                ((k, getattr(cfg, k)) for k in self.case_fields)}


def select(key: str, value: Any) -> Callable[[dict[str, Any], Finding], dict[str, Any]]:
    """A narrow function: config[key] = [value(finding)] when the finding has one of the config's choices."""
    def narrow(config: dict[str, Any], f: Finding) -> dict[str, Any]:
        v = value(f)
        return {**config, key: [v]} if v is not None and v in config.get(key, ()) else config
    return narrow
