"""Repro bundles: a finding shrunk to a minimal failing fixture, in a directory anyone can attach to a bug report
and replay with one command: `fuzz replay DIR`.

Everything here reads the oracle contract (engine/contract.py, oracles/registry.py): a bundle is a `Case` (oracle,
fixture, cut set, the oracle's config) plus the fingerprint of its finding. Shrinking keeps that fingerprint
fixed (oracle, status, phase, stage, where, the kinds of layer at the cut and at the divergence), so it cannot
slide to another bug (as test-case reducers do). Coarse first: it narrows the run to the finding's
phase, mode or KV layout, halves the config fields the oracle declares shrinkable, drops cuts (fewer stages: the
finding at the remaining cuts), bisects the layer range (for a synthetic fixture regenerated from its spec, for a
user's GGUF sliced from the model itself) while the cuts still fall on the same layer kinds, moves a cut toward
the one before it, halves every width, then deletes prompt tokens ddmin-style. Every candidate is a valid fixture
and a full oracle run.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from fuzz.engine.configs import config_from
from fuzz.engine.contract import CRASH, FINDING, Finding, Report, build_label, describe, matches
from fuzz.engine.parity import describe_node
from fuzz.engine.schedule import main_prompt
from fuzz.oracles.registry import ORACLES, get_oracle
from synth.errors import UserError, read_json
from synth.families import get_family
from synth.gguf_io import GGUFFile
from synth.inspect import inspect_file
from synth.make import spec_of, write_fixture
from synth.spec import KNOBS, Knobs, ModelSpec

BUNDLE = "bundle.json"
SCHEMA = 2  # 1: fingerprints in each oracle's own status words (read and migrated)
PICTURE = "picture.svg"


@dataclass
class Case:
    """One oracle run (on one cut set, for oracles whose findings are per cut set): what a bundle replays."""

    oracle: str
    fixture: Path
    cuts: list[int]
    config: dict[str, Any]  # the oracle's case fields (Oracle.case_fields)
    target: str

    def config_object(self, where: str) -> Any:
        o = get_oracle(self.oracle)
        fixed: dict[str, Any] = {"target": self.target}
        if o.per_cut:
            fixed["cuts"] = ",".join(map(str, self.cuts)) if self.cuts else "none"
        return config_from(o.config, self.config, where, **fixed)

    def run(self) -> tuple[list[dict[str, Any]], Report]:
        """The fingerprints of this run's findings, in order, and its report."""
        rep = get_oracle(self.oracle).run(self.fixture, self.config_object(f"{self.fixture.parent}/{BUNDLE}"))
        return [f.fingerprint for f in rep.findings], rep


@dataclass
class Shrunk:
    case: Case
    fingerprint: dict[str, Any]
    report: Report
    runs: int = 0
    log: list[str] = field(default_factory=list)

    @property
    def finding(self) -> Finding:
        return next(f for f in self.report.findings if f.fingerprint == self.fingerprint)


def shrink(case: Case, fp: dict[str, Any], report: Report, workdir: Path, *, max_runs: int = 40,
           budget_s: float = 120.0) -> Shrunk:
    """Greedy shrinking under a fixed fingerprint; every accepted step is a full oracle run that still fails."""
    oracle = get_oracle(case.oracle)
    out = Shrunk(case, fp, report)
    t0 = time.perf_counter()

    def keeps(candidate: Case, like: Callable[[dict[str, Any]], bool] | None = None) -> bool:
        """candidate still fails with the fingerprint (or with one `like` accepts: it becomes the fingerprint)."""
        if out.runs >= max_runs or time.perf_counter() - t0 > budget_s:
            return False
        out.runs += 1
        try:
            got, rep = candidate.run()
        except UserError:  # e.g. a schedule too small for the oracle: not a smaller reproduction
            return False
        except Exception as e:  # a candidate that cannot be built or run is not a reproduction either; said once
            why = f"a smaller candidate could not be run ({error_line(e)}): skipped"
            if why not in out.log:
                out.log.append(why)
                say(why)
            return False
        hit = next((g for g in got if (like(g) if like else g == out.fingerprint)), None)
        if hit is None:
            return False
        out.case, out.report, out.fingerprint = candidate, rep, hit
        return True

    # 1. the schedule: only the finding's phase / mode / KV layout, then each shrinkable field halved
    if oracle.narrow:
        narrowed = oracle.narrow(out.case.config, out.finding)
        if narrowed != out.case.config and keeps(replace(out.case, config=narrowed)):
            out.log.append(", ".join(f"{k} → {v}" for k, v in narrowed.items() if case.config.get(k) != v))
    tried: list[dict[str, Any]] = []
    while oracle.reduce:  # the oracle's own smaller cases, e.g. a schedule with an operation fewer
        before = out.case.config
        fresh = [c for c in oracle.reduce(before) if c not in tried]
        tried += fresh
        if not any(keeps(replace(out.case, config=c)) for c in fresh):
            break
        out.log.append(", ".join(f"{k} → {v}" for k, v in out.case.config.items() if before.get(k) != v))
    for key, floor in oracle.shrink:
        while out.case.config[key] > floor:
            smaller = max(floor, out.case.config[key] // 2)
            cfg = {**out.case.config, key: smaller}
            if key == "prompt_len" and cfg.get("prompt"):  # a prompt given: its first tokens
                cfg["prompt"] = cfg["prompt"][:smaller]
            if not keeps(replace(out.case, config=cfg)):
                break
            out.log.append(f"{key} → {smaller}")

    # 2. the stages: a cut dropped (two stages merged) while the finding holds at the others
    _fewer_stages(out, keeps)

    # 3. the model: the layer range bisected (half the leading or trailing layers at once, then a quarter, ...
    # one), again after a cut moved toward the one before it, then (synthetic fixtures: regenerated from the
    # spec) each width halved, while the failure holds
    spec = spec_of(out.case.fixture)
    if spec is None:  # a user's GGUF: its layer range only, as slices of the model itself
        _shrink_real_layers(out, keeps, workdir)
    else:
        _shrink_spec_model(out, spec, keeps, workdir)

    # 4. the prompt's tokens, deleted ddmin-style
    _delete_prompt_tokens(out, keeps)
    return out


def _shrink_spec_model(out: Shrunk, spec: ModelSpec, keeps: Callable[..., bool], workdir: Path) -> None:
    """A synthetic fixture, regenerated from its spec: layers bisected away (again after a cut moved), then each
    width halved while the finding holds."""
    n = 0

    def attempt(why: str, **change: Any) -> bool:
        nonlocal spec, n
        cand = _smaller_model(out.case, spec, workdir / f"shrink-{n}.gguf", **change)
        n += 1
        if cand is None or not keeps(cand[0]):
            return False
        spec = cand[1]
        out.log.append(f"{why} → {cand[2] or f'{spec.n_layer} layers {spec.pattern}, cuts {out.case.cuts}'}")
        return True

    _bisect_layers(lambda: spec.n_layer, attempt)
    while _move_cuts(out, keeps):
        _bisect_layers(lambda: spec.n_layer, attempt)
    for knob, floor in WIDTHS:
        while True:
            now = _width(spec, knob)
            if now is None or now <= floor or not attempt(f"{knob} halved", **{knob: max(floor, now // 2)}):
                break


def _delete_prompt_tokens(out: Shrunk, keeps: Callable[..., bool]) -> None:
    """ddmin over the prompt (an oracle whose config takes one, `prompt`): the tokens split in n parts (2 at first),
    each part deleted in turn; a deletion that keeps the finding is taken (n one fewer), else n doubles — until
    single tokens cannot go. The prompt is then given as token ids (the oracle drew it from its seed)."""
    oracle = get_oracle(out.case.oracle)
    if "prompt" not in oracle.case_fields:
        return
    floor = dict(oracle.shrink).get("prompt_len", 1)
    toks = main_prompt(out.case.config_object("shrink"), inspect_file(str(out.case.fixture)).n_vocab)
    parts = 2
    while len(toks) > floor:
        size = -(-len(toks) // parts)
        for lo in range(0, len(toks), size):
            fewer = toks[:lo] + toks[lo + size:]
            if len(fewer) >= floor and keeps(replace(out.case, config={**out.case.config, "prompt": fewer,
                                                                          "prompt_len": len(fewer)})):
                out.log.append(f"deleted prompt token{'s' if size > 1 else ''} {lo}"
                               + (f"..{lo + size - 1}" if size > 1 else "") + f" → prompt {fewer}")
                toks, parts = fewer, max(parts - 1, 2)
                break
        else:
            if size == 1:
                return
            parts = min(len(toks), 2 * parts)


def _fewer_stages(out: Shrunk, keeps: Callable[..., bool]) -> None:
    """Each cut dropped in turn (its two stages merged into one) while the same finding holds at the others: every
    key of its fingerprint but the stage index (the merge renumbers the stages), one cut kind fewer, and a
    boundary's divergence may now show in the logits (its stage became the last)."""
    def same(want: dict[str, Any]) -> Callable[[dict[str, Any]], bool]:
        def like(g: dict[str, Any]) -> bool:
            rest = {k: v for k, v in g.items() if k not in ("stage", "where")}
            return rest == {k: v for k, v in want.items() if k not in ("stage", "where")} and \
                (g.get("where") == want.get("where") or (want.get("where"), g.get("where")) == ("boundary", "logits"))
        return like

    i = 0
    while len(out.case.cuts) > 1 and i < len(out.case.cuts):
        cuts = out.case.cuts[:i] + out.case.cuts[i + 1:]
        want = dict(out.fingerprint)
        if "cut_kinds" in want:
            want["cut_kinds"] = want["cut_kinds"][:i] + want["cut_kinds"][i + 1:]
        dropped = out.case.cuts[i]
        if keeps(replace(out.case, cuts=cuts), same(want)):
            out.log.append(f"dropped cut {dropped} → cuts {cuts}")
        else:
            i += 1


def _move_cuts(out: Shrunk, keeps: Callable[..., bool]) -> bool:
    """A stage between two cuts loses no layer when the model's ends are cut away: each cut after another is moved
    toward it, onto the first layer of its own kind after the cut before (the fingerprint unchanged), so that the
    layers it leaves behind are trailing ones the bisection can drop. True if a cut moved."""
    moved = False
    for i in range(1, len(out.case.cuts)):
        cuts, kinds = out.case.cuts, out.report.kinds
        for p in range(cuts[i - 1] + 1, cuts[i]):
            if kinds[p] == kinds[cuts[i]] and keeps(replace(out.case, cuts=[*cuts[:i], p, *cuts[i + 1:]])):
                out.log.append(f"moved cut {cuts[i]} to {p} → cuts {out.case.cuts}")
                moved = True
                break
    return moved


def _bisect_layers(n_layer: Callable[[], int], attempt: Callable[..., bool]) -> None:
    """Leading or trailing layers dropped while the failure holds: half of them at once, then a quarter, … one —
    from the top again after each success. attempt(why, drop_first=k | drop_last=k) tries one candidate."""
    progressed = True
    while progressed:
        progressed = False
        for side in ("first", "last"):
            k = n_layer() // 2
            while k >= 1:
                if attempt(f"dropped the {side} {k} layer{'s' if k > 1 else ''}", **{f"drop_{side}": k}):
                    progressed = True
                    break
                k //= 2


def _shrink_real_layers(out: Shrunk, keeps: Callable[..., bool], workdir: Path) -> None:
    """A model without our spec (a user's GGUF) shrunk to the layers the finding needs: leading or trailing layers
    bisected away (again after a cut moved), each candidate the layers [a, b) of the model as synth.stage slices
    them — a standalone GGUF (the token embedding, those layers, the head), its cuts moved with the layers."""
    layers = inspect_file(str(out.case.fixture)).n_layer
    n = 0

    def attempt(why: str, **drop: int) -> bool:
        nonlocal layers, n
        cand = _sliced_model(out.case, layers, workdir / f"shrink-{n}.gguf", **drop)
        n += 1
        if cand is None or not keeps(cand[0]):
            return False
        layers = cand[1]
        out.log.append(f"{why} → {layers} layers, cuts {out.case.cuts}")
        return True

    _bisect_layers(lambda: layers, attempt)
    while _move_cuts(out, keeps):
        _bisect_layers(lambda: layers, attempt)


def _sliced_model(case: Case, n: int, path: Path, *, drop_first: int = 0, drop_last: int = 0) \
        -> tuple[Case, int] | None:
    """The case on layers [drop_first, n - drop_last) of its n-layer model, and the slice's layer count (None: not
    expressible, or a cut falls outside). Pass-through pads synth.stage adds (a contract of the arch) move the cuts
    by as many layers."""
    from synth.stage import SourceModel, Unsupported

    a, b = drop_first, n - drop_last
    if not 0 <= a < b <= n or any(not a < c < b for c in case.cuts):
        return None
    try:
        st = SourceModel(case.fixture).slice(path, a, b)
    except (Unsupported, UserError):
        return None
    where = {src: j for j, src in enumerate(st.layers) if j not in st.pads}
    return replace(case, fixture=path, cuts=[where[c] for c in case.cuts]), st.n_layer


# the widths the shrinker halves, coarsest first, with floors (synth refuses what a family cannot express)
WIDTHS = (("embd", 4), ("ff", 2), ("vocab", 8), ("heads", 1), ("experts", 2), ("kv_lora_rank", 2),
          ("q_lora_rank", 2), ("indexer_top_k", 1))


def tensor_types(path: Path) -> set[str]:
    return {t.type for t in GGUFFile(path).tensors.values()}


def _width(spec: ModelSpec, knob: str) -> int | None:
    field = next(k.spec_field for k in KNOBS if k.name == knob)
    v = getattr(spec, field)
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def _smaller_model(case: Case, spec: ModelSpec, path: Path, *, drop_first: int = 0, drop_last: int = 0,
                   **width: int) -> tuple[Case, ModelSpec, str] | None:
    """The fixture regenerated from its spec with layers dropped (cuts moved with them) or a width changed; None
    when that is not a fixture the family can make or the cuts no longer fall inside it."""
    n = spec.n_layer
    pattern = spec.pattern[drop_first:n - drop_last]
    cuts = [c - drop_first for c in case.cuts]
    if not pattern or any(not 0 < c < len(pattern) for c in cuts):
        return None
    fam = get_family(spec.family)
    kv = spec.n_head_kv[drop_first:n - drop_last]
    given: dict[str, Any] = {k.name: getattr(spec, k.spec_field) for k in KNOBS if k.spec_field}
    if fam.kind == "hybrid" and not fam.parallel_hybrid:
        given["pattern"] = pattern
    else:
        given["layers"] = len(pattern)
    if fam.per_layer_kv:  # uneven K/V widths (what B5 needs) stay uneven
        given["kv_heads"] = tuple(kv)
    if "embd" in width and "head_dim" in given and "head_dim" in fam.knobs:
        given["head_dim"] = None  # the family's own for the new width
    given.update(width)
    if "experts" in width and given.get("experts_used"):
        given["experts_used"] = min(given["experts_used"], width["experts"])
    # every family takes a dtype: the shrunk fixture keeps the weights' type
    knobs = Knobs(seed=spec.seed, dtype=spec.dtype, **{k: v for k, v in given.items() if k in fam.knobs})
    try:
        new = fam.resolve(knobs)
    except UserError:
        return None
    if new == spec:
        return None
    write_fixture(new, path)
    if width and tensor_types(path) != tensor_types(case.fixture):
        return None  # narrower than the weights' blocks: tensors that were quantized would stay float
    what = ", ".join(f"{k} {v}" for k, v in width.items())
    config = case.config
    if "vocab" in width and config.get("prompt"):  # a prompt given as ids: folded into the smaller vocabulary
        config = {**config, "prompt": [t % width["vocab"] for t in config["prompt"]]}
    return replace(case, fixture=path, cuts=cuts, config=config), new, what


def write_bundle(out_dir: Path, sh: Shrunk, *, original: Case) -> Path:
    """fixture.gguf + bundle.json + report.json + README.md (+ picture.svg); replay with `fuzz replay out_dir`."""
    from fuzz.repro.pictures import report_picture

    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    shutil.copyfile(sh.case.fixture, out_dir / "fixture.gguf")
    sha = hashlib.sha256((out_dir / "fixture.gguf").read_bytes()).hexdigest()
    spec = spec_of(out_dir / "fixture.gguf")
    report = sh.report.to_dict()
    data = {
        "schema": SCHEMA, "oracle": sh.case.oracle, "target": sh.case.target, "cuts": sh.case.cuts,
        "config": sh.case.config, "fingerprint": sh.fingerprint, "fixture": "fixture.gguf", "fixture_sha256": sha,
        "spec": json.loads(spec.to_json()) if spec else None, "build": report["build"],
        "llama_cpp_commit": report["build"]["llama_cpp_commit"],
        "original": {"fixture": str(original.fixture),
                     "fixture_sha256": hashlib.sha256(original.fixture.read_bytes()).hexdigest(),
                     "cuts": original.cuts, "config": original.config},
        "shrink": {"runs": sh.runs, "steps": sh.log},
        "replay": f"fuzz replay {out_dir}",
    }
    (out_dir / BUNDLE).write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    (out_dir / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    picture = report_picture(report, out_dir / PICTURE)
    fp = sh.fingerprint
    where = localized(sh.finding)
    (out_dir / "README.md").write_text(
        f"# {describe(fp)}\n\n{sh.finding.message}\n\n"
        f"Target `{sh.case.target}`, {build_label(report['build'], short=None)}, family-certify "
        f"{report['build']['toolkit']}. Cuts {sh.case.cuts} of the fixture in this directory (sha256 {sha[:16]}), "
        f"{sh.case.oracle} config `{json.dumps(sh.case.config, sort_keys=True)}`.\n\n"
        f"Replay (exit 1 while the finding reproduces, 0 once fixed):\n\n    fuzz replay {out_dir}\n\n"
        f"Shrunk in {sh.runs} oracle runs: " + ("; ".join(sh.log) or "nothing smaller reproduced") + ".\n"
        + (f"\n## Where it first differs\n\n{where}\n" if where else "")
        + (f"\n![where it fails: the finding's cell is marked]({PICTURE})\n" if picture else ""))
    return out_dir


def localized(f: Finding) -> str | None:
    """Where the finding starts: the first differing layer and graph node, or the cause analysis' verdict."""
    if f.cause:
        return f"Cause: {f.cause['kind']}: {f.cause['detail']}."
    layer = f"layer {f.layer} (source index)" if isinstance(f.layer, int) else ""
    node = describe_node(f.node)
    if node is None:
        return f"{layer[0].upper()}{layer[1:]} is the first whose output differs." if layer else None
    return (f"{layer}, " if layer else "") + f"first graph node whose bits differ: {node}."


def bundle_name(fixture: Path, f: Finding, per_cut: bool) -> str:
    where = ["-".join(map(str, f.cuts)) or "none"] if per_cut else []
    return "-".join([Path(fixture).stem, f.oracle, *where, str(f.phase)])


def finding_key(fp: dict[str, Any]) -> dict[str, Any]:
    """What makes two findings one bug: the fingerprint without the sequence it was seen on."""
    return {k: v for k, v in fp.items() if k != "seq"}


def bundle_findings(report: Report, config: dict[str, Any], out_root: Path, *, max_bundles: int = 3,
                    seen: list[dict[str, Any]] | None = None,
                    skip: Callable[[Finding], bool] | None = None) -> list[Path]:
    """Each distinct finding of a report (by fingerprint, whichever sequence) run again — it must reproduce — then
    shrunk and bundled. `config` is the run's case config (Oracle.case_config); `seen`: fingerprints bundled
    already (another run of the same lane), shared and extended; `skip`: findings not to bundle (a committed
    repro's already: the lane's own bundles go to what is new)."""
    oracle = get_oracle(report.oracle)
    seen = [] if seen is None else seen
    paths = []
    for f in report.findings:
        # the same finding on another sequence of the batch is the same bug: bundled once, for its first sequence
        key = finding_key(f.fingerprint)
        if (oracle.per_cut and f.cuts is None) or key in seen or len(paths) >= max_bundles or (skip and skip(f)):
            continue
        seen.append(key)
        config_f = oracle.replay_of(config, f) if oracle.replay_of else config
        case = Case(report.oracle, Path(report.fixture), list(f.cuts or []) if oracle.per_cut else [],
                    dict(config_f), report.target)
        where = out_root / bundle_name(report.fixture, f, oracle.per_cut)
        if where in paths:  # two findings of one phase and cut set, told apart where they are (a payload kind)
            where = where.with_name(f"{where.name}-{f.where or len(paths)}")
        # nothing that goes wrong from here on loses the finding: it is bundled as far as it got, and said
        unshrunk = Shrunk(case, f.fingerprint, report)
        try:
            got, rep = case.run()  # a second, independent reproduction before anything is bundled
        except Exception as e:
            paths.append(_bundle_unshrunk(where, unshrunk, f"running it again failed ({error_line(e)})"))
            continue
        if f.fingerprint not in got:
            continue
        unshrunk.report, unshrunk.runs = rep, 1
        with tempfile.TemporaryDirectory(prefix="fuzz-shrink-") as d:
            try:
                sh = shrink(case, f.fingerprint, rep, Path(d))
                sh.runs += 1
                paths.append(write_bundle(where, sh, original=case))
            except Exception as e:
                paths.append(_bundle_unshrunk(where, unshrunk, f"shrinking or bundling failed ({error_line(e)})"))
    return paths


def _bundle_unshrunk(where: Path, sh: Shrunk, why: str) -> Path:
    """The finding bundled as reported (its own case, not shrunk), after something went wrong; said in one line."""
    say(f"{where.name}: {why}; bundled as reported, not shrunk")
    sh.log.append(f"not shrunk: {why}")
    return write_bundle(where, sh, original=sh.case)


def error_line(e: BaseException) -> str:
    """An exception in one short line: its type and the first line of its message."""
    msg = (str(e).strip().splitlines() or [""])[0][:200]
    return f"{type(e).__name__}: {msg}" if msg else type(e).__name__


def say(msg: str) -> None:
    print(f"bundle: {msg}", file=sys.stderr, flush=True)


# ---- reading bundles ------------------------------------------------------------------------------------
def migrate(data: dict[str, Any]) -> dict[str, Any]:
    """A schema-1 bundle in schema 2's words: the one status vocabulary, the KV layout or server kind as the
    phase, no empty fingerprint fields, prefix-cache's `n_predict` named `tokens` like every oracle's, and the
    build identity as schema 2 records it."""
    fp = dict(data["fingerprint"])
    if data.get("oracle") == "isolation" and "kv_unified" in fp:
        fp["phase"] = "unified-kv" if fp.pop("kv_unified") else "per-seq-kv"
    if data.get("oracle") == "prefix-cache":
        fp["phase"] = fp.get("status")
        fp["status"] = CRASH if fp["phase"] == "server-crash" else FINDING
    fp["status"] = {"diverged": FINDING, "mixed": FINDING}.get(fp.get("status"), fp.get("status"))
    fp = {k: v for k, v in fp.items() if v is not None or k == "phase"}
    config = dict(data.get("config") or {}) if isinstance(data.get("config"), dict) else data.get("config")
    if isinstance(config, dict) and "n_predict" in config:
        config["tokens"] = config.pop("n_predict")
    build = data.get("build") or {"llama_cpp_commit": data.get("llama_cpp_commit"), "toolkit": "unknown (schema 1)"}
    return {**data, "schema": SCHEMA, "fingerprint": fp, "config": config, "build": build}


def read_bundle(path: Path) -> dict[str, Any]:
    f = path / BUNDLE
    if not f.is_file():
        raise UserError(f"{path}: no {BUNDLE}; pass a directory written by `fuzz sweep/handoff --bundle`")
    data = read_json(f, "bundle file", "re-create the bundle")
    if not isinstance(data, dict):
        raise UserError(f"{f}: a JSON {type(data).__name__}, not an object; re-create the bundle")
    if data.get("schema") not in (1, SCHEMA) or data.get("oracle") not in ORACLES:
        raise UserError(f"{f}: schema {data.get('schema')!r} / oracle {data.get('oracle')!r} not understood; "
                        f"this fuzz reads schemas 1-{SCHEMA} with oracles {', '.join(ORACLES)}")
    fx = path / str(data.get("fixture", ""))
    if not fx.is_file() or hashlib.sha256(fx.read_bytes()).hexdigest() != data.get("fixture_sha256"):
        raise UserError(f"{path}: fixture missing or its sha256 does not match {BUNDLE}; re-create the bundle")
    data = migrate(data) if data["schema"] == 1 and isinstance(data.get("fingerprint"), dict) else data
    if data.get("oracle") == "isolation" and isinstance(data.get("config"), dict):
        data["config"].setdefault("flash_attn", [False])  # recorded before isolation ran flash attention on too
    return data


def load_case(path: Path, target: str | None = None) -> tuple[Case, dict[str, Any]]:
    """A bundle's case and recorded fingerprint, every field checked (nothing runs yet)."""
    data = read_bundle(path)
    where = f"{path / BUNDLE}"
    cuts, fp, tgt = data.get("cuts"), data.get("fingerprint"), target or data.get("target")
    if not isinstance(cuts, list) or any(type(c) is not int or c < 1 for c in cuts):
        raise UserError(f"{where}: cuts {cuts!r} is not a list of layer indices >= 1; re-create the bundle")
    if not isinstance(fp, dict) or not isinstance(tgt, str):
        raise UserError(f"{where}: fingerprint or target missing; re-create the bundle")
    case = Case(data["oracle"], path / data["fixture"], cuts, data.get("config"), tgt)
    case.config_object(where)  # every config field checked now, before anything runs
    case.config = dict(case.config)
    return case, fp


def replay(path: Path, target: str | None = None, build: dict[str, Any] | None = None) \
        -> tuple[bool, dict[str, Any], Report]:
    """(reproduced, recorded fingerprint, the last run's report), on the llama.cpp build the bundle was made on (or
    `build`: {spec, patches}, another one): the case run until it shows the finding, at most its oracle's
    replay_runs times."""
    case, fp = case_on_build(path, target, build)
    for _ in range(get_oracle(case.oracle).replay_runs):
        got, rep = case.run()
        if any(matches(fp, g) for g in got):
            return True, fp, rep
    return False, fp, rep


def case_on_build(path: Path, target: str | None = None, build: dict[str, Any] | None = None) \
        -> tuple[Case, dict[str, Any]]:
    """A bundle's case and recorded fingerprint (load_case), its build activated: the one the bundle records, or
    `build` ({spec, patches}, another one)."""
    case, fp = load_case(path, target)
    use_recorded_build(build or read_bundle(path).get("build") or {}, path)
    return case, fp


def use_recorded_build(build: dict[str, Any], path: Path) -> None:
    """Activate the build a bundle records (built again, or taken from the cache): the same spec, patch series and
    backend, and the same tree content (its cache key) — a tree that has changed since is refused, naming both."""
    from targets.builds import activate, resolve

    spec = build.get("spec", "pinned")
    patches = (build.get("patches") or {}).get("dir")
    b = resolve(spec, patches, from_env=False, backend=build.get("backend"))  # (the bare pinned build has no key)
    if build.get("key") and b.identity.get("key") != build["key"]:
        raise UserError(f"{path}: made on build {build['key']} of {spec}" + (f" + {patches}" if patches else "")
                        + f"; that now builds as {b.identity.get('key')} (the tree or the patches changed): check "
                        "out what the bundle was made on, or re-create it")
    activate(b)
