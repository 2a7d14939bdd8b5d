"""`fuzz campaign`: a budgeted, resumable, shardable fuzzing campaign across every oracle.

Case i of a campaign is a function of (seed, i) alone: a random legal spec (synth.strategies.random_spec) of one
of the selected families, one of the selected oracles, and that oracle's small random configuration (cuts, offsets,
modes, wire types, schedules). `--shard I/N` runs the cases with i % N == I, so N jobs split one campaign without
overlap. Every finding the oracle reports (reproduced by the oracle itself) is deduplicated by family and
fingerprint, then reproduced again, shrunk and bundled once under DIR/bundles. DIR/campaign.json holds the state:
a rerun with the same DIR continues at the next case and never bundles a fingerprint twice; `fuzz campaign-merge`
joins shards' directories the same way.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np

from fuzz.engine.contract import CRASH, matches
from fuzz.engine.fleet import server_spec
from fuzz.engine.progress import Progress
from fuzz.oracles.determinism import DeterminismConfig
from fuzz.oracles.handoff_state import HandoffConfig
from fuzz.oracles.isolation import IsolationConfig
from fuzz.oracles.memory_model import MemoryConfig
from fuzz.oracles.radix import LANE_PLANS, RadixConfig, drawn_trees
from fuzz.oracles.registry import ORACLES as ORACLES_BY_NAME
from fuzz.oracles.registry import get_oracle
from fuzz.oracles.sweep_report import SweepConfig
from fuzz.oracles.wire import WireConfig
from fuzz.repro.bundle import bundle_findings, finding_key
from synth.errors import UserError, read_json
from synth.families import FAMILIES
from synth.make import write_fixture
from synth.strategies import random_spec

STATE = "campaign.json"
REPROS = Path(__file__).resolve().parents[2] / "corpora" / "repros"
ORACLES = ("sweep", "handoff", "isolation", "determinism", "wire", "radix", "memory")
MAX_LAYERS = 8


def parse_budget(text: str) -> float:
    """10m, 90s, 1h, 1h30m, or plain seconds."""
    m = re.fullmatch(r"\s*(?:(\d+)h)?\s*(?:(\d+)m)?\s*(?:(\d+(?:\.\d+)?)s?)?\s*", text)
    if not text.strip() or not m or not any(m.groups()):
        raise UserError(f"--budget {text!r}: write it as seconds or with units, e.g. 90s, 10m, 1h30m")
    h, mi, sec = m.groups()
    return int(h or 0) * 3600 + int(mi or 0) * 60 + float(sec or 0)


def parse_shard(text: str) -> tuple[int, int]:
    m = re.fullmatch(r"(\d+)/(\d+)", text.strip())
    if not m or not 0 <= int(m.group(1)) < int(m.group(2)):
        raise UserError(f"--shard {text!r}: write it as I/N with 0 <= I < N, e.g. 0/4")
    return int(m.group(1)), int(m.group(2))


def case_config(oracle: str, rng: np.random.Generator, n_layer: int, target: str, seed: int) -> Any:
    """The oracle's small random configuration for one case."""
    cut = str(int(rng.integers(1, n_layer))) if n_layer > 1 else "none"
    pick = lambda *xs: xs[int(rng.integers(len(xs)))]  # noqa: E731
    if oracle == "sweep":
        return SweepConfig(cuts=pick("all", cut), tokens=4, prompt_len=int(rng.integers(2, 12)), n_seq=2,
                           target=target, seed=seed)
    if oracle == "handoff":
        return HandoffConfig(cuts=cut if n_layer > 1 else "none", tokens=2, prompt_len=int(rng.integers(2, 9)),
                             modes=(pick("full", "partial", "busy"),), decode_offsets=1, target=target, seed=seed)
    if oracle == "isolation":
        return IsolationConfig(n_seq=int(rng.integers(2, 4)), prompt_len=int(rng.integers(2, 9)), tokens=2,
                               target=target, seed=seed)
    if oracle == "determinism":
        return DeterminismConfig(threads=(1, 2), ubatch=(64, 7), chunks=(64,), flash_attn=(False,), repeats=2,
                                 prompt_len=8, tokens=4, cuts=pick("none", cut), target=target, seed=seed)
    if oracle == "wire":
        return WireConfig(wire=pick("f16", "bf16", "q8_0"), cuts=cut, tokens=4, prompt_len=8, target=target,
                          seed=seed)
    if oracle == "radix":  # the lane's plans on the fixed tree, or prompt trees drawn per schedule (counted, aimed
        # at the slots' checkpoints, going on past a finding), with the host prompt cache on or off
        server = server_spec(target)
        if pick(False, True):
            return drawn_trees(4, tokens=4, kv_unified=pick(False, True), target=server, seed=seed,
                               cache_ram=pick(64, 0))
        plans = LANE_PLANS.split(";")
        return RadixConfig(plan=pick(*plans), limit=3, budget=0.0, tokens=4, kv_unified=pick(False, True),
                           target=server, seed=seed)
    if oracle == "memory":  # a few drawn programs, in the layout drawn, with flash attention or without
        return MemoryConfig(programs=2, steps=int(rng.integers(8, 25)), n_seq=int(rng.integers(2, 5)),
                            kv_unified=(pick(False, True),), target=target, seed=seed, flash_attn=pick(False, True))
    raise UserError(f"--oracle {oracle!r}: campaigns run {', '.join(ORACLES)}")


def known_upstream() -> list[dict[str, Any]]:
    """Each committed upstream repro (corpora/repros, target not a mutant): its family, fingerprint and, for an
    abort, the assert it names. A campaign finding that is one of these (known_repro) is that known finding again —
    listed, not bundled again, not failing."""
    out = []
    for b in sorted(REPROS.glob("*/bundle.json")) if REPROS.is_dir() else []:
        data = json.loads(b.read_text())
        if not str(data.get("target", "")).startswith("mutant:") and isinstance(data.get("spec"), dict):
            report = b.parent / "report.json"
            key = finding_key(data["fingerprint"])
            out.append({"family": data["spec"]["family"], "key": key,
                        "layout": layout_family(key.get("phase")) or layout_of(data.get("config")),
                        "abort": abort_of(report.read_text()) if report.is_file() else None,
                        "repro": b.parent.name,
                        # "scope": "family" — the behaviour is the arch's own (its graph's code, not a memory's
                        # every family shares): matched in its own family even where it names a cause
                        "family_only": data.get("scope") == "family",
                        # "scope": "any" — an abort in code every family shares (llama-server's batch, the KV
                        # cache's shift) or one a layout does not decide: matched by the check it names in any
                        # family and either KV layout; a memory finding by its known_key fields in any family
                        "any_family": data.get("scope") == "any",
                        # "names": text the finding's message must hold (a string or several): a check as general
                        # as a shape assert, or a crash that names none, is that repro only where the message names
                        # the same configuration
                        "names": [data["names"]] if isinstance(data.get("names"), str) else data.get("names", [])})
    return out


def abort_of(text: str) -> str | None:
    """The check an abort names — `GGML_ASSERT(expr) failed` as `expr`, else what follows the source file and line
    — without the path and line number, which move between builds and checkouts; None if the text names none."""
    m = re.search(r"GGML_ASSERT\((.+?)\) failed", text)
    if m:  # (a report's JSON escapes the quotes of an assert's message: read as the abort printed them)
        return m.group(1).replace('\\"', '"')
    m = re.search(r"\.(?:c|cc|cpp|h|cu):\d+: ([^\n\"]+)", text)
    return m.group(1).split(" (replay")[0].strip() if m else None


def layout_family(phase: Any) -> str | None:
    """The KV layout a phase names (isolation's per-seq-kv / unified-kv, flash attention on or off alike: the same
    layout, the same known bug; a busy hand-off's context has one stream per sequence), or None when it names none
    (another hand-off mode, a server crash)."""
    text = "per-seq-kv" if phase == "busy" else str(phase or "")
    return next((x for x in ("per-seq-kv", "unified-kv") if text.startswith(x)), None)


def layout_of(config: Any) -> str | None:
    """The KV layout a server case ran (its config's kv_unified: one cache for all slots or one per slot; a config
    from before the option: per slot), or None for a config that is not a server's."""
    if not isinstance(config, dict) or not {"replay", "rounds", "slots"} & set(config):
        return None
    return "unified-kv" if config.get("kv_unified") is True else "per-seq-kv"


def known_repro(known: list[dict[str, Any]], family: str, f: Any, layout: str | None = None) -> str | None:
    """The committed upstream repro a campaign finding is, matched by what the finding is rather than by the
    configuration the repro was shrunk under: an abort by the family and the check it names — whichever oracle, cut
    or stage reached it — in the same KV layout where both name one (flash attention on or off alike); a finding of an
    oracle over code every family shares (its `known_key`: the memory operations) by those fields, whatever the
    family where they name a cause (in the repro's own family where none does, or where the repro's scope is its
    family: bundle.json "scope": "family"); an abort whose repro's scope is "any" by the check it names in any
    family and either layout; anything else by the family, the
    oracle, the status, the layout and the rest of its fingerprint — each only where the finding's message holds
    every text the repro `names`. None if it is none of them."""
    fp = finding_key(f.fingerprint)
    abort = abort_of(f.message) if f.status == CRASH else None
    shared = get_oracle(fp["oracle"]).known_key if fp.get("oracle") in ORACLES_BY_NAME else ()
    for x in sorted(known, key=lambda x: x["key"].get("oracle") != fp.get("oracle")):  # its own oracle's first
        k = x["key"]
        if any(n not in str(f.message) for n in x["names"]):
            continue
        if shared and k.get("oracle") == fp.get("oracle") and not x["abort"]:  # a bug every family shares
            # (by its cause; a finding no control explained is that repro only in the repro's own family)
            if all(k.get(n) == fp.get(n) for n in shared) and (x["family"] == family or x["any_family"] or (
                    k.get("cause") and not x.get("family_only"))):
                return x["repro"]
            continue
        if (x["family"] != family and not (x["any_family"] and x["abort"])) or k.get("status") != fp.get("status"):
            continue
        a, b = x.get("layout"), layout_family(fp.get("phase")) or layout
        if a and b and a != b and not (x["any_family"] and x["abort"]):
            continue
        if x["abort"] and k.get("status") == CRASH:
            if abort == x["abort"]:
                return x["repro"]
        same_phase = layout_family(k.get("phase")) == layout_family(fp.get("phase")) and \
            (a or k.get("phase") == fp.get("phase"))
        if not x["abort"] and k.get("oracle") == fp.get("oracle") and same_phase and \
                matches({n: v for n, v in k.items() if n != "phase"}, fp):
            return x["repro"]
    return None


class Campaign:
    def __init__(self, out: Path, *, families: list[str] | None = None, oracles: list[str] | None = None,
                 target: str = "llama-cpp", seed: int = 0, shard: tuple[int, int] = (0, 1)):
        unknown = sorted(set(families or ()) - set(FAMILIES))
        if unknown:
            raise UserError(f"--family {unknown[0]!r}: not a family (synth families lists them)")
        bad = sorted(set(oracles or ()) - set(ORACLES))
        if bad:
            raise UserError(f"--oracle {bad[0]!r}: campaigns run {', '.join(ORACLES)}")
        self.out = Path(out)
        self.params = {"families": sorted(families or []), "oracles": sorted(oracles or ORACLES), "target": target,
                       "seed": seed, "shard": list(shard)}
        self.state = self._load()

    def _load(self) -> dict[str, Any]:
        path = self.out / STATE
        if not path.is_file():
            return {"schema": 1, "params": self.params, "next_case": 0, "cases": 0, "refused": 0, "seconds": 0.0,
                    "runs": {}, "specs": {}, "statuses": {}, "findings": []}
        state = read_json(path, "campaign state", f"remove {self.out} to start a new campaign")
        if not isinstance(state, dict) or state.get("params") != self.params:
            was = state.get("params") if isinstance(state, dict) else state
            raise UserError(f"{path}: a campaign with other parameters ({was}); rerun it with those, or give "
                            "another --out")
        return state

    def save(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        tmp = self.out / (STATE + ".tmp")
        tmp.write_text(json.dumps(self.state, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, self.out / STATE)

    def run(self, budget: float, max_cases: int = 0) -> dict[str, Any]:
        """Cases until the budget is spent (checked between cases) or max_cases (> 0) more have run."""
        st = self.state
        ran = 0
        shard, of = self.params["shard"]
        families = self.params["families"] or None
        oracles = self.params["oracles"]
        t0 = time.perf_counter()
        before = st["seconds"]
        work = self.out / "work"
        work.mkdir(parents=True, exist_ok=True)
        with Progress(int(budget), "s") as progress:
            while time.perf_counter() - t0 < budget and not (max_cases and ran >= max_cases):
                i = st["next_case"]
                st["next_case"] += 1
                if i % of != shard:
                    continue
                rng = np.random.Generator(np.random.PCG64([self.params["seed"], i]))
                spec = random_spec(rng, families, MAX_LAYERS)
                if spec is None:
                    st["refused"] += 1
                    continue
                oracle_name = oracles[int(rng.integers(len(oracles)))]
                oracle = get_oracle(oracle_name)
                cfg = case_config(oracle_name, rng, spec.n_layer, self.params["target"], int(rng.integers(1 << 16)))
                fixture = work / f"case-{i}-{spec.family}.gguf"
                write_fixture(spec, fixture)
                progress.working(f"case {i}: {oracle_name} {spec.family} {spec.pattern}")
                try:
                    rep = oracle.run(fixture, cfg)
                except UserError:  # a case this oracle cannot express for this spec (a split of one layer, ...)
                    st["refused"] += 1
                    fixture.unlink(missing_ok=True)
                    continue
                st["cases"] += 1
                ran += 1
                st.setdefault("case_ids", []).append(i)
                st["runs"][oracle_name] = st["runs"].get(oracle_name, 0) + 1
                st["specs"][spec.family] = st["specs"].get(spec.family, 0) + 1
                st["statuses"][rep.status] = st["statuses"].get(rep.status, 0) + 1
                for f in rep.numerics:  # differences the oracle's cause analysis explained: counted by cause
                    kind = f"{oracle_name} {(f.cause or {}).get('kind', 'numerics')}"
                    st.setdefault("numerics", {})[kind] = st.get("numerics", {}).get(kind, 0) + 1
                self._bundle(rep, oracle, cfg, i, spec.family, progress)
                fixture.unlink(missing_ok=True)
                st["seconds"] = round(before + time.perf_counter() - t0, 3)
                self.save()  # after every case: a campaign killed now resumes at the next one
                progress.at(int(time.perf_counter() - t0))
        self.save()
        shutil.rmtree(work, ignore_errors=True)
        write_summary(self.out, st)
        return st

    def _bundle(self, rep: Any, oracle: Any, cfg: Any, case: int, family: str, progress: Progress) -> None:
        st = self.state
        if not rep.findings:
            return

        def fp(g: Any) -> dict[str, Any]:
            return finding_key(g.fingerprint)

        seen = [f["key"] for f in st["findings"]]
        known = known_upstream()
        for f in rep.findings:
            key = {"family": family, **fp(f)}
            repro = known_repro(known, family, f, layout=layout_of(oracle.case_config(cfg)))
            if repro:  # an upstream finding already bundled in corpora/repros
                st.setdefault("known", {})[repro] = st.get("known", {}).get(repro, 0) + 1
                continue
            if key in seen:
                continue
            seen.append(key)
            # this finding only: the report's others are marked seen for bundle_findings
            paths = bundle_findings(rep, oracle.case_config(cfg), self.out / "bundles", max_bundles=1,
                                    seen=[fp(g) for g in rep.findings if fp(g) != fp(f)])
            if not paths:  # reported, but not seen again: not a finding (listed, never bundled)
                st.setdefault("flaky", []).append({"key": key, "case": case, "message": f.message})
                progress.line(f"not reproduced (not a finding): case {case} ({family}): {f.message}")
                continue
            bundle = str(paths[0].relative_to(self.out))
            st["findings"].append({"key": key, "case": case, "message": f.message, "bundle": bundle})
            progress.line(f"FINDING case {case} ({family}): {f.message} → {bundle}")


def summary_text(st: dict[str, Any]) -> str:
    p = st["params"]
    lines = [f"# fuzz campaign (seed {p['seed']}, shard {p['shard'][0]}/{p['shard'][1]}, target `{p['target']}`)", "",
             f"{st['cases']} cases in {st['seconds']:.0f} s (next case {st['next_case']}; {st['refused']} drawn cases "
             "or their oracle refused), oracle runs: "
             + ", ".join(f"{k} {v}" for k, v in sorted(st["runs"].items())), "",
             "Specs per family: " + ", ".join(f"{k} {v}" for k, v in sorted(st["specs"].items())), "",
             "Statuses: " + ", ".join(f"{k} {v}" for k, v in sorted(st["statuses"].items())), "",
             "Numerics (differences explained by a traced cause, not findings): "
             + (", ".join(f"{k} {v}" for k, v in sorted(st.get("numerics", {}).items())) or "none"), "",
             f"## Findings ({len(st['findings'])}, each bundled once)", ""]
    for f in st["findings"]:
        lines.append(f"- case {f['case']} ({f['key']['family']}): {f['message']} — `fuzz replay {f['bundle']}`")
    if not st["findings"]:
        lines.append("none")
    for repro, n in sorted(st.get("known", {}).items()):
        lines.append(f"- known upstream, not counted: `corpora/repros/{repro}` seen again in {n} case(s)")
    for f in st.get("flaky", []):
        lines.append(f"- not reproduced, not a finding: case {f['case']} ({f['key']['family']}): {f['message']}")
    return "\n".join(lines) + "\n"


def write_summary(out: Path, st: dict[str, Any]) -> None:
    (out / "summary.md").write_text(summary_text(st))


def merge(out: Path, dirs: list[Path]) -> dict[str, Any]:
    """Shards' campaign directories as one: counts summed, findings deduplicated by key, their bundles copied."""
    states = []
    for d in dirs:
        path = d / STATE
        if not path.is_file():
            raise UserError(f"{d}: no {STATE}; pass directories written by `fuzz campaign --out`")
        states.append((d, read_json(path, "campaign state", f"re-run the campaign into {d}")))
    seeds = {(s["params"]["seed"], s["params"]["target"], tuple(s["params"]["oracles"]),
              tuple(s["params"]["families"])) for _, s in states}
    if len(seeds) != 1:
        raise UserError("campaign-merge: the directories are shards of different campaigns (seed, target, oracles "
                        "or families differ)")
    merged: dict[str, Any] = {"schema": 1, "params": {**states[0][1]["params"], "shard": [0, 1]}, "next_case": 0,
                              "cases": 0, "refused": 0, "seconds": 0.0, "runs": {}, "specs": {}, "statuses": {},
                              "findings": [], "shards": [str(d) for d in dirs]}
    if len({i for _, s in states for i in s.get("case_ids", [])}) != sum(len(s.get("case_ids", [])) for _, s in states):
        raise UserError("campaign-merge: two directories ran the same case (the same shard twice?)")
    for d, s in states:
        for k in ("cases", "refused", "seconds"):
            merged[k] += s[k]
        merged["next_case"] = max(merged["next_case"], s["next_case"])
        merged.setdefault("case_ids", []).extend(s.get("case_ids", []))
        for k in ("runs", "specs", "statuses", "numerics", "known"):
            merged.setdefault(k, {})
            for name, n in s.get(k, {}).items():
                merged[k][name] = merged[k].get(name, 0) + n
        for f in s["findings"]:
            if any(g["key"] == f["key"] for g in merged["findings"]):
                continue
            dest = out / f["bundle"]
            if not dest.exists():
                shutil.copytree(d / f["bundle"], dest)
            merged["findings"].append(f)
    out.mkdir(parents=True, exist_ok=True)
    (out / STATE).write_text(json.dumps(merged, indent=1, sort_keys=True) + "\n")
    write_summary(out, merged)
    return merged


def exit_code(st: dict[str, Any]) -> int:
    """1 while the campaign holds a (reproduced, bundled) finding."""
    return 1 if st["findings"] else 0
