"""Repro bundles: a finding shrunk to a minimal failing fixture, in a directory anyone can attach to a bug report
and replay with one command: `fuzz replay DIR`.

Shrinking keeps a fixed fingerprint (oracle, status, phase or mode, stage, where, and the kind of layer the
divergence was localized to), so it cannot slide to another bug (../shared/reference/oracle-anchors.md). It
shrinks the schedule first (only the failing phase or mode, fewer decode steps, a shorter prompt, fewer
sequences), then the model: for a synthetic fixture it regenerates the fixture without a leading or trailing layer
while the cuts still fall on the same layer kinds. Every candidate is a valid fixture and a full oracle run.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from fuzz.configs import config_from
from fuzz.handoff import Handoff, HandoffConfig
from fuzz.isolation import Isolation, IsolationConfig
from fuzz.parity import describe_node
from fuzz.prefix_cache import PrefixCache, PrefixCacheConfig
from fuzz.sweep import Sweep, SweepConfig
from synth.errors import UserError, read_text
from synth.families import get_family
from synth.gguf_io import GGUFFile
from synth.make import write_fixture
from synth.spec import SPEC_KEY, Knobs, ModelSpec

BUNDLE = "bundle.json"
SCHEMA = 1
ORACLES = ("sweep", "handoff", "isolation", "prefix-cache")


@dataclass
class Case:
    """One oracle run on one cut set: what a bundle replays."""

    oracle: str
    fixture: Path
    cuts: list[int]
    config: dict[str, Any]  # the oracle's config fields (cuts/target/workdir excluded)
    target: str

    def run(self) -> tuple[dict[str, Any] | None, dict[str, Any]]:
        """(fingerprint of the first finding or None, the oracle's report)."""
        cuts = ",".join(map(str, self.cuts)) if self.cuts else "none"
        where = f"{self.fixture.parent}/{BUNDLE}"
        if self.oracle == "sweep":
            rep = Sweep(self.fixture, config_from(SweepConfig, self.config, where, cuts=cuts, target=self.target)).run()
            data = rep.to_dict()
            bad = next((r for r in data["results"] if r["status"] in ("diverged", "crash", "timeout")), None)
            return (fingerprint(self.oracle, bad, data["kinds"]) if bad else None), data
        if self.oracle == "handoff":
            data = Handoff(self.fixture, config_from(HandoffConfig, self.config, where, cuts=cuts,
                                                     target=self.target)).run()
            bad = next((r for r in data["results"] if r["status"] in ("diverged", "crash", "timeout")), None)
            return (fingerprint(self.oracle, bad, data["kinds"]) if bad else None), data
        if self.oracle == "isolation":
            data = Isolation(self.fixture, config_from(IsolationConfig, self.config, where, target=self.target)).run()
            bad = data["findings"][0] if data["findings"] else None
            return ({"oracle": "isolation", "status": bad["status"], "kv_unified": bad["kv_unified"],
                     "seq": bad["seq"]} if bad else None), data
        if self.oracle == "prefix-cache":
            data = PrefixCache(self.fixture, config_from(PrefixCacheConfig, self.config, where,
                                                         target=self.target)).run()
            bad = data["findings"][0] if data["findings"] else None
            return ({"oracle": "prefix-cache", "status": bad["kind"]} if bad else None), data
        raise UserError(f"unknown oracle {self.oracle!r} in bundle; oracles: {', '.join(ORACLES)}")


def fingerprint(oracle: str, r: dict[str, Any], kinds: str) -> dict[str, Any]:
    layer = r.get("layer")
    fp = {"oracle": oracle, "status": r["status"], "phase": r.get("phase") or r.get("mode"), "stage": r.get("stage"),
          "where": r.get("where"), "cut_kinds": [kinds[c] for c in r["cuts"]]}
    if isinstance(layer, int):
        fp["layer_kind"] = kinds[layer]
    return fp


@dataclass
class Shrunk:
    case: Case
    fingerprint: dict[str, Any]
    report: dict[str, Any]
    runs: int = 0
    log: list[str] = field(default_factory=list)


def spec_of(path: Path) -> ModelSpec | None:
    text = GGUFFile(path).kv.get(SPEC_KEY)
    return ModelSpec.from_json(text) if isinstance(text, str) else None


def shrink(case: Case, fp: dict[str, Any], report: dict[str, Any], workdir: Path, *, max_runs: int = 40,
           budget_s: float = 120.0) -> Shrunk:
    """Greedy shrinking under a fixed fingerprint; every accepted step is a full oracle run that still fails."""
    out = Shrunk(case, fp, report)
    t0 = time.perf_counter()

    def keeps(candidate: Case) -> bool:
        if out.runs >= max_runs or time.perf_counter() - t0 > budget_s:
            return False
        out.runs += 1
        try:
            got, rep = candidate.run()
        except UserError:  # e.g. a schedule too small for the oracle: not a smaller reproduction
            return False
        if got == fp:
            out.case, out.report = candidate, rep
            return True
        return False

    # 1. the schedule
    c = out.case.config
    if case.oracle == "sweep":
        phase = fp["phase"] if fp["phase"] in ("prefill", "decode", "batched") else None
        if phase and list(c["phases"]) != [phase]:
            cand = replace(out.case, config={**c, "phases": [phase]})
            if keeps(cand):
                out.log.append(f"phases → {phase}")
        for key, floor in (("tokens", 1), ("prompt_len", 2), ("n_seq", 2)):
            while out.case.config[key] > floor:
                smaller = max(floor, out.case.config[key] // 2)
                if not keeps(replace(out.case, config={**out.case.config, key: smaller})):
                    break
                out.log.append(f"{key} → {smaller}")
    elif case.oracle in ("isolation", "prefix-cache"):
        keys = (("tokens", 1), ("prompt_len", 1), ("n_seq", 2)) if case.oracle == "isolation" else \
            (("rounds", 1), ("n_predict", 1), ("slots", 2))
        for key, floor in keys:
            while out.case.config[key] > floor:
                smaller = max(floor, out.case.config[key] // 2)
                if not keeps(replace(out.case, config={**out.case.config, key: smaller})):
                    break
                out.log.append(f"{key} → {smaller}")
    else:
        if fp["phase"] in ("full", "partial") and list(c["modes"]) != [fp["phase"]]:
            if keeps(replace(out.case, config={**c, "modes": [fp["phase"]]})):
                out.log.append(f"modes → {fp['phase']}")
        for key, floor in (("tokens", 1), ("prompt_len", 3)):
            while out.case.config[key] > floor:
                smaller = max(floor, out.case.config[key] // 2)
                if not keeps(replace(out.case, config={**out.case.config, key: smaller})):
                    break
                out.log.append(f"{key} → {smaller}")

    # 2. the model (synthetic fixtures only): drop a leading or a trailing layer while the failure holds
    spec = spec_of(out.case.fixture)
    if spec is not None:
        n = 0
        while True:
            progressed = False
            for drop_first in (True, False):
                cand = _fewer_layers(out.case, spec, drop_first, workdir / f"shrink-{n}.gguf")
                n += 1
                if cand is not None and keeps(cand[0]):
                    spec = cand[1]
                    out.log.append(f"dropped the {'first' if drop_first else 'last'} layer → {spec.n_layer} "
                                   f"layers {spec.pattern}, cuts {out.case.cuts}")
                    progressed = True
                    break
            if not progressed:
                break
    return out


def _fewer_layers(case: Case, spec: ModelSpec, drop_first: bool, path: Path) -> tuple[Case, ModelSpec] | None:
    cuts = [c - 1 for c in case.cuts] if drop_first else list(case.cuts)
    pattern = spec.pattern[1:] if drop_first else spec.pattern[:-1]
    if not pattern or any(not 0 < c < len(pattern) for c in cuts):
        return None
    fam = get_family(spec.family)
    kv = spec.n_head_kv[1:] if drop_first else spec.n_head_kv[:-1]
    given: dict[str, Any] = {"embd": spec.n_embd, "heads": spec.n_head, "head_dim": spec.head_dim, "ff": spec.n_ff,
                             "vocab": spec.n_vocab, "experts": spec.n_expert, "experts_used": spec.n_expert_used,
                             "shared_experts": spec.n_expert_shared, "leading_dense": spec.n_leading_dense,
                             "q_lora_rank": spec.q_lora_rank, "kv_lora_rank": spec.kv_lora_rank,
                             "indexer": spec.indexer, "indexer_top_k": spec.indexer_top_k}
    if fam.kind == "hybrid" and not fam.parallel_hybrid:
        given["pattern"] = pattern
        if fam.per_layer_kv:
            given["kv_heads"] = tuple(kv)
    else:
        given["layers"] = len(pattern)
    # every family takes a dtype: the shrunk fixture keeps the weights' type
    knobs = Knobs(seed=spec.seed, dtype=spec.dtype, **{k: v for k, v in given.items() if k in fam.knobs})
    try:
        new = fam.resolve(knobs)
    except UserError:
        return None
    write_fixture(new, path)
    return replace(case, fixture=path, cuts=cuts), new


def write_bundle(out_dir: Path, sh: Shrunk, *, original: Case, llama_cpp_commit: str | None) -> Path:
    """fixture.gguf + bundle.json + report.json + README.md; replay with `fuzz replay out_dir`."""
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    shutil.copyfile(sh.case.fixture, out_dir / "fixture.gguf")
    sha = hashlib.sha256((out_dir / "fixture.gguf").read_bytes()).hexdigest()
    spec = spec_of(out_dir / "fixture.gguf")
    data = {
        "schema": SCHEMA, "oracle": sh.case.oracle, "target": sh.case.target, "cuts": sh.case.cuts,
        "config": sh.case.config, "fingerprint": sh.fingerprint, "fixture": "fixture.gguf", "fixture_sha256": sha,
        "spec": json.loads(spec.to_json()) if spec else None, "llama_cpp_commit": llama_cpp_commit,
        "original": {"fixture": str(original.fixture),
                     "fixture_sha256": hashlib.sha256(original.fixture.read_bytes()).hexdigest(),
                     "cuts": original.cuts, "config": original.config},
        "shrink": {"runs": sh.runs, "steps": sh.log},
        "replay": f"fuzz replay {out_dir}",
    }
    (out_dir / BUNDLE).write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    (out_dir / "report.json").write_text(json.dumps(sh.report, indent=2) + "\n")
    fp = sh.fingerprint
    (out_dir / "README.md").write_text(
        f"# {describe(fp)}\n\n"
        f"Target `{sh.case.target}`, llama.cpp {llama_cpp_commit}. Cuts {sh.case.cuts} of the fixture in this "
        f"directory (sha256 {sha[:16]}), {sh.case.oracle} config `{json.dumps(sh.case.config, sort_keys=True)}`.\n\n"
        f"Replay (exit 1 while the finding reproduces, 0 once fixed):\n\n    fuzz replay {out_dir}\n\n"
        f"Shrunk in {sh.runs} oracle runs: " + ("; ".join(sh.log) or "nothing smaller reproduced") + ".\n"
        + (f"\n## Where it first differs\n\n{where}\n" if (where := localized(sh.case.oracle, sh.report)) else ""))
    return out_dir


def localized(oracle: str, report: dict[str, Any]) -> str | None:
    """What the oracle's report says about where the finding starts: the first differing layer and graph node
    (sweep, hand-off) or the cause (isolation)."""
    if oracle == "isolation":
        cause = next((f.get("cause") for f in report.get("findings", ()) if f.get("cause")), None)
        return f"Cause: {cause['kind']}: {cause['detail']}." if cause else None
    r = next((r for r in report.get("results", ()) if r.get("status") == "diverged"), None)
    layer = f"layer {r['layer']} (source index)" if r and isinstance(r.get("layer"), int) else ""
    node = describe_node((r or {}).get("node"))
    if node is None:
        return f"{layer[0].upper()}{layer[1:]} is the first whose output differs." if layer else None
    return (f"{layer}, " if layer else "") + f"first graph node whose bits differ: {node}."


def bundle_one(case: Case, out_dir: Path, llama_cpp_commit: str | None) -> Path | None:
    """Bundle a case once it reproduces on a second run, shrunk under its fingerprint; None if it does not."""
    first, rep = case.run()
    second, _ = case.run()
    if first is None or first != second:
        return None
    with tempfile.TemporaryDirectory(prefix="fuzz-shrink-") as d:
        sh = shrink(case, first, rep, Path(d))
        sh.runs += 2
        return write_bundle(out_dir, sh, original=case, llama_cpp_commit=llama_cpp_commit)


def describe(fp: dict[str, Any]) -> str:
    """One line for a fingerprint: oracle, status and where."""
    where = ", ".join(f"{k} {v}" for k, v in fp.items() if k not in ("oracle", "status", "cut_kinds", "layer_kind"))
    return f"{fp['oracle']} finding: {fp['status']}" + (f" ({where})" if where else "")


def read_bundle(path: Path) -> dict[str, Any]:
    f = path / BUNDLE
    if not f.is_file():
        raise UserError(f"{path}: no {BUNDLE}; pass a directory written by `fuzz sweep/handoff --bundle`")
    try:
        data = json.loads(read_text(f, "bundle file", "re-create the bundle"))
    except json.JSONDecodeError as e:
        raise UserError(f"{f}: not valid JSON ({e.msg}); re-create the bundle") from None
    if not isinstance(data, dict):
        raise UserError(f"{f}: a JSON {type(data).__name__}, not an object; re-create the bundle")
    if data.get("schema") != SCHEMA or data.get("oracle") not in ORACLES:
        raise UserError(f"{f}: schema {data.get('schema')!r} / oracle {data.get('oracle')!r} not understood; "
                        f"this fuzz reads schema {SCHEMA} with oracles {', '.join(ORACLES)}")
    fx = path / str(data.get("fixture", ""))
    if not fx.is_file() or hashlib.sha256(fx.read_bytes()).hexdigest() != data.get("fixture_sha256"):
        raise UserError(f"{path}: fixture missing or its sha256 does not match {BUNDLE}; re-create the bundle")
    return data


CONFIGS = {"sweep": SweepConfig, "handoff": HandoffConfig, "isolation": IsolationConfig,
           "prefix-cache": PrefixCacheConfig}


def load_case(path: Path, target: str | None = None) -> tuple[Case, dict[str, Any]]:
    """A bundle's case and recorded fingerprint, every field checked (nothing runs yet)."""
    data = read_bundle(path)
    where = f"{path / BUNDLE}"
    cuts, fp, tgt = data.get("cuts"), data.get("fingerprint"), target or data.get("target")
    if not isinstance(cuts, list) or any(type(c) is not int or c < 1 for c in cuts):
        raise UserError(f"{where}: cuts {cuts!r} is not a list of layer indices >= 1; re-create the bundle")
    if not isinstance(fp, dict) or not isinstance(tgt, str):
        raise UserError(f"{where}: fingerprint or target missing; re-create the bundle")
    fixed = {"cuts": "none", "target": tgt} if data["oracle"] in ("sweep", "handoff") else {"target": tgt}
    config_from(CONFIGS[data["oracle"]], data.get("config"), where, **fixed)
    return Case(data["oracle"], path / data["fixture"], cuts, dict(data["config"]), tgt), fp


def replay(path: Path, target: str | None = None) -> tuple[bool, dict[str, Any], dict[str, Any]]:
    """(reproduced, recorded fingerprint, this run's report)."""
    case, fp = load_case(path, target)
    got, rep = case.run()
    return got == fp, fp, rep


def bundle_findings(oracle: str, fixture: Path, results: list[dict[str, Any]], kinds: str, config: dict[str, Any],
                    target: str, out_root: Path, llama_cpp_commit: str | None, *, max_bundles: int = 3) -> list[Path]:
    """Shrink and bundle the first finding of each distinct fingerprint."""
    seen: list[dict[str, Any]] = []
    paths = []
    for r in results:
        if r["status"] not in ("diverged", "crash", "timeout"):
            continue
        fp = fingerprint(oracle, r, kinds)
        if fp in seen or len(seen) >= max_bundles:
            continue
        seen.append(fp)
        case = Case(oracle, Path(fixture), list(r["cuts"]), config, target)
        with tempfile.TemporaryDirectory(prefix="fuzz-shrink-") as d:
            got, rep = case.run()  # a second, independent reproduction before anything is bundled
            if got != fp:
                continue
            sh = shrink(case, fp, rep, Path(d))
            name = f"{Path(fixture).stem}-{oracle}-{'-'.join(map(str, r['cuts'])) or 'none'}-{fp['phase']}"
            paths.append(write_bundle(out_root / name, sh, original=case, llama_cpp_commit=llama_cpp_commit))
    return paths
