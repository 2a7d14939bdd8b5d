"""`family-certify mutate`: how many mutants of llama.cpp's covered state code the lanes kill.

Mutants come from universalmutator's C/C++ rules (its regular-expression engine: one changed line each), over the
lines a `family-certify coverage` run saw executed in the files of its groups (coverage.GROUPS), arid lines left out
as in Google's practice (logging, error and assert messages, statistics: ARID). A seeded sample of them, per group,
is each written as a one-patch series and built incrementally (targets/builds.py: the build spec's tree with the
patch, one object recompiled). A mutant whose object file is byte for byte the pristine one is equivalent (TCE,
trivially equivalent compiler output) and not run. Otherwise the rows × lanes of the coverage run that executed the
mutated line (its pairs.json: each row's processes counted apart) run on the mutant's build, one at a time, until
one fails: killed (by which row/lane, the finding's line; a crash or hang is a kill too), else survived. A lane that
passes but whose conversations take fewer prompt tokens from the cache than the pristine build's, or one known on
both builds that fails more seeded cases, is killed too, and so is one whose rows' cross-build lane breaks (a state
crossing between the two builds): a bump of the pristine build to the mutant's says it broke (fuzz.certify.bump:
reuse_regression, more_known, cross_broke). A mutant that does not compile is `build-failed` and not counted;
a lane that raises (the toolkit's own failure under a mutant) is `error`, listed and not counted. The score is
killed ÷ (run − equivalent) per group. `--diff BASE` mutates only the lines the coverage run's build changes against
BASE (a bump's own diff) and says which changed lines no lane ran. The state is mutate.json in --out
(schemas/mutate.schema.json), written after every mutant: a run resumes where it stopped (the same seed and sample
draw the same mutants), and `--budget` stops it in time. A worker call on a mutant may take MUTANT_CALL_TIMEOUT."""

from __future__ import annotations

import bisect
import contextlib
import difflib
import hashlib
import io
import json
import os
import re
import shutil
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer

from fuzz.certify.bump_known import compared, more_known
from fuzz.certify.coverage import GROUP_NAMES, in_group
from fuzz.certify.coverage import spans as spans_of
from fuzz.certify.schemas import MUTANT_STATUSES, MUTATE_SCHEMA
from fuzz.engine.contract import FAILING, KNOWN
from fuzz.engine.fleet import CALL_TIMEOUT
from synth.errors import UserError

RULES = ("universal", "c_like", "cpp")  # universalmutator's rule files for C++ (its own, as shipped)
# arid lines: what a mutant of changes no state — logging, error and assert messages, statistics and timing
ARID = re.compile(r"LLAMA_LOG|GGML_LOG|\bLOG_(INF|WRN|ERR|DBG|CNT|TEE)\b|"
                  r"\b(SRV|SLT|QUE|RES|SPC)_(INF|WRN|ERR|DBG|TRC)\b|"
                  r"printf\s*\(|GGML_UNUSED|std::runtime_error\s*\(|throw\b|format\s*\(|\bt_[a-z_]*_(us|ms)\b|"
                  r"\bn_(p_)?eval\b|ggml_time_us|perf")
STATUSES = MUTANT_STATUSES
MUTANT_CALL_TIMEOUT = 30.0  # seconds a worker call may take on a mutant (a hang is a kill; the lanes' calls take ~1 s)


@dataclass(frozen=True)
class Mutant:
    """One changed line of a file of the tree."""
    id: str
    group: str
    file: str  # relative to the tree
    line: int
    original: str
    mutated: str
    rule: str

    def patch(self, text: str) -> str:
        """The mutant as a unified diff of `text` (the file's pristine content), git-apply-able with -p1."""
        lines = text.splitlines(keepends=True)
        new = [*lines[:self.line - 1], *self.mutated.splitlines(keepends=True), *lines[self.line:]]
        return "".join(difflib.unified_diff(lines, new, f"a/{self.file}", f"b/{self.file}"))


WORD = re.compile(r"[A-Za-z_]\w*")
KEYWORDS = frozenset({"true", "false", "return", "nullptr", "if", "while", "for"})
BAD_PAIRS = re.compile(r"[+\-*/%&|^]%|%[*/%]|[+\-]\*(?=\s*[A-Za-z_(])(?<!\(\*)|[(,=]\s*%|[+\-]/(?![/*])")
# a declarator's `*` or `&` (`int32_t * data =`, `auto & x =`, `(ggml_tensor * dst)`): another operator there is no
# declaration
DECLARATOR = re.compile(r"(?:^|[(,;{])\s*(?:const\s+)?(?:struct\s+)?[A-Za-z_][\w:<>]*\s*([*&])\s*[A-Za-z_]\w*\s*"
                        r"(?=[=,);\[]|$)")
# a line that declares a variable (`const bool unified = ...;`): commented out, its later uses do not compile
DECLARATION = re.compile(r"^\s*(?:const\s+)?(?:auto|[A-Za-z_][\w:<>]*)\s*[*&]?\s+[A-Za-z_]\w*\s*=(?!=)")


def plausible(original: str, mutated: str) -> bool:
    """Whether a mutant is worth a build: it names no identifier the line did not (the number rules also rewrite
    digits inside names — `uint32_t` into `uint1_t`), keeps its brackets balanced and templates' brackets alone,
    puts no operator before `%` or `/`, keeps a declarator's `*` and `&`, and comments out no declaration: rewrites
    that never compile."""
    if not set(WORD.findall(mutated)) <= set(WORD.findall(original)) | KEYWORDS:
        return False  # (also a `break;` or `continue;` added after the line: outside a loop it never compiles)
    code, was = (re.sub(r"/\*.*?\*/|//.*", "", x) for x in (mutated, original))  # (brackets outside comments)
    if any(code.count(a) - code.count(b) != was.count(a) - was.count(b) for a, b in ("()", "{}", "[]")):
        return False  # (a rule that commented out half a bracket pair, or dropped an `if (`)
    if BAD_PAIRS.search(mutated) and not BAD_PAIRS.search(original):
        return False  # (an operator before `%` or `/`: `+%i`, `(%1`, `+/s` are no expressions)
    if any(mutated[m.start(1):m.start(1) + 1] != m.group(1) for m in DECLARATOR.finditer(original)):
        return False  # (a declarator's `*` or `&` made an operator)
    if DECLARATION.match(original) and mutated.strip().startswith("/*"):
        return False  # (a declaration commented out: the name it declares is used further on)
    i = 0  # the changed span: an operator rule that took a template's angle bracket (vector<int>) never compiles
    while i < min(len(original), len(mutated)) and original[i] == mutated[i]:
        i += 1
    return not any(original[k:k + 1] in ("<", ">") and k > 0 and (original[k - 1].isalnum() or original[k - 1] == "_")
                   for k in (i - 1, i))


def arid(line: str) -> bool:
    s = line.strip()
    return not s or s.startswith(("//", "#", "/*", "*")) or ARID.search(line) is not None


def covered_lines(coverage_dir: Path) -> dict[tuple[str, int], list[str]]:
    """(file, line) → the lanes whose processes executed it, in the coverage run's order (its lanes/*.json)."""
    try:
        rep = json.loads((coverage_dir / "coverage.json").read_text())
        order = list(dict.fromkeys(x["lane"] for x in rep["lanes"]))
        out: dict[tuple[str, int], list[str]] = {}
        for lane in order:
            trace = json.loads((coverage_dir / "lanes" / f"{lane}.json").read_text())
            for f in trace.get("files", []):
                for ln in f.get("lines", []):
                    if int(ln.get("count") or 0) > 0:
                        lanes = out.setdefault((f["file"], ln["line_number"]), [])
                        if lane not in lanes:
                            lanes.append(lane)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UserError(f"--coverage {coverage_dir}: not a complete `family-certify coverage` run ({e}); run it "
                        "first (its --out directory)") from None
    return out


def line_functions(coverage_dir: Path) -> dict[tuple[str, int], str]:
    """(file, line) → the demangled function gcov attributes it to (for the groups' function patterns)."""
    out: dict[tuple[str, int], str] = {}
    for trace in sorted((coverage_dir / "lanes").glob("*.json")):
        for f in json.loads(trace.read_text()).get("files", []):
            for ln in f.get("lines", []):
                if ln.get("function_name"):
                    out.setdefault((f["file"], ln["line_number"]), ln["function_name"])
    return out


def generate(root: Path, covered: dict[tuple[str, int], list[str]], functions: dict[tuple[str, int], str],
             groups: tuple[str, ...] = GROUP_NAMES) -> list[Mutant]:
    """Every mutant universalmutator's rules make of a covered, non-arid line of a group's function, in file and
    line order (ids stable: the file, line and the mutant's own text)."""
    from universalmutator import mutator

    by_file: dict[str, set[int]] = {}
    for (file, line) in covered:
        by_file.setdefault(file, set()).add(line)
    out = []
    for file in sorted(by_file):
        path = root / file
        if not path.is_file():
            continue
        src = path.read_text(errors="replace").splitlines(keepends=True)
        with contextlib.redirect_stdout(io.StringIO()):  # (it prints the rules it read)
            made = mutator.mutants_regexp(src, ruleFiles=list(RULES), ignorePatterns=[], ignoreStringOnly=True)
        for line, mutated, rule, *_ in made:
            if line not in by_file[file] or arid(src[line - 1]) or not plausible(src[line - 1], mutated):
                continue
            fn = functions.get((file, line), "")
            group = next((g for g in groups if in_group(g, file, fn)), None)
            if group is None:
                continue
            h = hashlib.sha256(f"{file}:{line}:{mutated}".encode()).hexdigest()[:10]
            out.append(Mutant(f"{Path(file).stem}-{line}-{h}", group, file, line, src[line - 1], mutated,
                              rule[1].split(":", 1)[-1] if isinstance(rule, tuple) else str(rule)))
    return out


def changed_lines(base: Path, root: Path, files: list[str]) -> dict[str, set[int]]:
    """Per file (relative to both trees), the lines of `root` that its diff against `base` adds or changes."""
    out: dict[str, set[int]] = {}
    for f in files:
        a, b = ((t / f).read_text(errors="replace").splitlines() if (t / f).is_file() else [] for t in (base, root))
        ops = difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes()
        lines = {j + 1 for tag, _, _, j1, j2 in ops if tag in ("replace", "insert") for j in range(j1, j2)}
        if lines:
            out[f] = lines
    return out


def diff_account(root: Path, changed: dict[str, set[int]], covered: dict[tuple[str, int], list[str]],
                 functions: dict[tuple[str, int], str], groups: tuple[str, ...]) -> dict[str, Any]:
    """The changed state-code lines (code lines of a group's functions, arid ones left out) and which of them the
    lanes ran: {changed, ran, unrun: file → ranges}."""
    from fuzz.certify.coverage import ranges

    code = [(f, n) for f, lines in sorted(changed.items()) for n in sorted(lines)
            if any(in_group(g, f, functions.get((f, n), "\0")) for g in groups) and (f, n) in functions
            and not arid((root / f).read_text(errors="replace").splitlines()[n - 1])]
    unrun: dict[str, list[int]] = {}
    for f, n in code:
        if (f, n) not in covered:
            unrun.setdefault(f, []).append(n)
    return {"changed": len(code), "ran": len(code) - sum(map(len, unrun.values())),
            "unrun": {f: ranges(v) for f, v in unrun.items()}}


def sample(mutants: list[Mutant], per_group: dict[str, int], seed: int) -> list[Mutant]:
    """A seeded sample of each group's mutants (its order: the draw's), at most per_group[g] of group g."""
    rng = np.random.default_rng(seed)
    out = []
    for g, n in per_group.items():
        mine = [m for m in mutants if m.group == g]
        out += [mine[i] for i in rng.permutation(len(mine))[:n]]
    return out


# ---- running one mutant ---------------------------------------------------------------------------------------
def object_digest(work: Path, file: str) -> str | None:
    """sha256 of the object file the build in `work` compiled from `file` (None: not found)."""
    hits = sorted((work / "build").rglob(f"{Path(file).name}.o"))
    return hashlib.sha256(hits[0].read_bytes()).hexdigest() if hits else None


def score(results: list[dict[str, Any]], group: str | None = None) -> dict[str, Any]:
    """Counts by status and the mutation score killed ÷ (killed + survived) (equivalent and build-failed apart)."""
    mine = [r for r in results if group is None or r["group"] == group]
    c = Counter(r["status"] for r in mine)
    run = c["killed"] + c["survived"]
    return {**{s: c[s] for s in STATUSES}, "score": round(100.0 * c["killed"] / run, 1) if run else 0.0}


def totals_line(results: list[dict[str, Any]]) -> str:
    t = score(results)
    return (f"mutation score: {t['killed']} of {t['killed'] + t['survived']} killed ({t['score']}%), "
            f"{t['equivalent']} equivalent, {t['survived']} survived")


def summary_md(rep: dict[str, Any]) -> str:
    out = ["# Mutation score of the lanes on llama.cpp's state code", "",
           f"`{rep['command']}`: {len(rep['results'])} mutants of {rep['generated']} generated (seed "
           f"{rep['seed']}), {rep['wall_s']:.0f} s.", "",
           "| group | killed | survived | equivalent | build failed | score |", "|---|---:|---:|---:|---:|---:|"]
    for g in GROUP_NAMES:
        t = score(rep["results"], g)
        out.append(f"| {g} | {t['killed']} | {t['survived']} | {t['equivalent']} | {t['build-failed']} | "
                   f"{t['score']}% |")
    d = rep.get("diff")
    if d:
        out += ["", f"Against {d['base']}: {d['changed']} state-code lines changed, {d['ran']} of them run by the "
                    "lanes (the mutants are of those).", ""]
        out += [f"- not run: `{f}` lines {r}" for f, r in d["unrun"].items()]
    errors = [r for r in rep["results"] if r["status"] == "error"]
    if errors:
        out += ["", "The toolkit failed under these mutants (not counted; a bug of the toolkit's to fix):", ""]
        out += [f"- `{r['file']}:{r['line']}` on {r['by']}: {r['detail']}" for r in errors]
    surv = [r for r in rep["results"] if r["status"] == "survived"]
    if surv:
        out += ["", "Survivors (the lanes ran the line; no verdict saw the change):", ""]
        out += [f"- `{r['file']}:{r['line']}` `{r['original'].strip()}` → `{r['mutated'].strip()}` "
                f"(ran: {', '.join(r['ran'])})" for r in surv]
    return "\n".join([*out, "", totals_line(rep["results"]), ""])


def interleaved(pairs: list[tuple[Any, str]]) -> list[tuple[Any, str]]:
    """Row × lane pairs taken round-robin over their lanes, each turn's lane on a row no pair before took where it
    has one: a mutant meets every covering lane and as many rows (architectures) as it can early, not one lane's
    every row first nor one row's every lane (a memory only one family has is found by that family's lanes)."""
    by: dict[str, list[tuple[Any, str]]] = {}
    for pair in pairs:
        by.setdefault(pair[1], []).append(pair)
    out, seen = [], set()
    while any(by.values()):
        for lane in list(by):
            if by[lane]:
                pick = next((q for q in by[lane] if getattr(q[0], "key", q[0]) not in seen), by[lane][0])
                by[lane].remove(pick)
                seen.add(getattr(pick[0], "key", pick[0]))
                out.append(pick)
    return out


class RowLines:
    """Which row × lane ran which lines: a coverage run's pairs.json ("row/lane" → file → ranges of lines)."""

    def __init__(self, coverage_dir: Path) -> None:
        path = coverage_dir / "pairs.json"
        self.pairs: dict[str, dict[str, str]] = json.loads(path.read_text()) if path.is_file() else {}
        self.spans: dict[tuple[str, str], list[tuple[int, int]]] = {}

    def ran(self, pair: str, file: str, line: int) -> bool:
        key = (pair, file)
        if key not in self.spans:
            self.spans[key] = spans_of(self.pairs.get(pair, {}).get(file, ""))
        spans = self.spans[key]
        i = bisect.bisect_right(spans, (line, 1 << 30)) - 1
        return i >= 0 and spans[i][0] <= line <= spans[i][1]


def covering(plan: list[tuple[Any, str]], m: Mutant, lanes: list[str], rows: RowLines) -> list[tuple[Any, str]]:
    """The rows × lanes of the plan that ran the mutant's line, interleaved by lane: as the coverage run counted
    them per row (pairs.json), else every row of a lane that ran it (a run from before rows were counted apart)."""
    if rows.pairs:
        return interleaved([(row, lane) for row, lane in plan if rows.ran(f"{row.key}/{lane}", m.file, m.line)])
    return interleaved([(row, lane) for row, lane in plan if lane in lanes])


class Pristine:
    """Each row × lane's result on the pristine build, as much of it as a bump compares (run once each, kept in
    out/pristine.json for a resumed run): a lane that passes on a mutant but reuses less of the prompt cache, or is
    known on both builds but fails more seeded cases, or whose seeded programs have operations refused the pristine
    build took, broke — as the bump of the pristine build to the mutant's says (fuzz.certify.bump.reuse_regression,
    fuzz.certify.bump_known)."""

    def __init__(self, out: Path, spec: str, manifest: Path):
        self.path, self.spec, self.manifest = out / "pristine.json", spec, manifest
        kept = json.loads(self.path.read_text()) if self.path.is_file() else {}
        self.lanes: dict[str, Any] = kept.get("lanes", {}) if kept.get("spec") == spec else {}  # (not another build)

    def lane(self, row: Any, lane: str) -> dict[str, Any]:
        """The pristine build's lane result (what a bump compares of it); run now if it was not run yet."""
        from fuzz.certify.battery import run_battery
        from targets.builds import activate, resolve

        key = f"{row.key}/{lane}"
        if key not in self.lanes:
            activate(resolve(self.spec, None, from_env=False))
            x = run_battery([(row, [lane])], "llama-cpp", None, manifest=self.manifest,
                            command="family-certify mutate (the pristine build, as a bump's base)")["results"][0]
            self.lanes[key] = compared(x)
            self.path.write_text(json.dumps({"spec": self.spec, "lanes": self.lanes}) + "\n")
        return self.lanes[key]


def bump_broke(pristine: Pristine | None, row: Any, lane: str, x: dict[str, Any], build: Any) -> str | None:
    """What the bump from the pristine build to the mutant's says of a lane the mutant's run did not fail: a reuse
    regression, operations newly refused, or a known lane failing more cases (None: unchanged); the mutant's build
    activated again after a pristine run."""
    from fuzz.certify.bump import lost, rewinds_of
    from targets.builds import activate

    if pristine is None or not (rewinds_of(x) or x["status"] == KNOWN or lane in ("memory", "shift")):
        return None
    base, cand = pristine.lane(row, lane), compared(x)
    activate(build)
    if base["status"] == KNOWN == x["status"]:
        return more_known(base, cand) or lost(base, cand)
    return lost(base, cand) if base["status"] not in FAILING else None


def run_mutant(m: Mutant, root: Path, pristine: dict[str, str | None], work: Path, pairs: list[tuple[Any, str]],
               out: Path, spec: str, manifest: Path, max_runs: int = 12, bundles: bool = False,
               base: Pristine | None = None) -> dict[str, Any]:
    """Build the mutant, compare its object with the pristine one, run the rows × lanes that ran its line (`pairs`,
    at most max_runs of them) until one fails — or until the bump from the pristine build (`base`) says one broke.
    bundles: the killing lane's findings bundled (out/patches/ID/run, the mutant's patch series as its build)."""
    from fuzz.certify.battery import run_battery
    from fuzz.certify.bump import cross_broke
    from targets.builds import activate, resolve

    t0 = time.perf_counter()
    series = out / "patches" / m.id
    series.mkdir(parents=True, exist_ok=True)
    (series / f"0001-{m.id}.patch").write_text(m.patch((root / m.file).read_text(errors="replace")))
    res = {**asdict(m), "status": "build-failed", "by": None, "detail": "", "ran": [], "seconds": 0.0}
    try:
        build = resolve(spec, series, from_env=False, fresh=True)  # (compiled in the work directory, compared below)
    except UserError as e:
        res["detail"] = str(e)[:300]
        return {**res, "seconds": round(time.perf_counter() - t0, 1)}
    try:
        if object_digest(work, m.file) == pristine.get(m.file) is not None:
            return {**res, "status": "equivalent", "detail": "the compiled object is the pristine one",
                    "seconds": round(time.perf_counter() - t0, 1)}
        activate(build)
        os.environ[CALL_TIMEOUT] = str(MUTANT_CALL_TIMEOUT)
        res["status"] = "survived"
        for row, lane in pairs[:max_runs]:
            try:
                run = run_battery([(row, [lane])], "llama-cpp", series / "run" if bundles else None,
                                  manifest=manifest, command="family-certify mutate")
            except Exception as e:  # noqa: BLE001 — the toolkit's own failure under a mutant: listed, not counted
                res.update(status="error", by=f"{row.key}/{lane}", detail=f"the lane raised {type(e).__name__}: {e}")
                break
            x = run["results"][0]
            res["ran"].append(f"{row.key}/{lane}")
            if x["status"] in FAILING:
                res.update(status="killed", by=f"{row.key}/{lane}", detail=f"{x['status']}: {x['detail'][:300]}")
                if x.get("bundles"):
                    res["bundles"] = [str((series / "run" / b).relative_to(out)) for b in x["bundles"]]
                break
            broke = bump_broke(base, row, lane, x, build)
            if broke:
                res.update(status="killed", by=f"{row.key}/{lane}", detail=f"bump from the pristine build: {broke}")
                break
        else:  # and the bump's cross-build lane on those rows: the state crossing between the two builds
            rows = list({row.key: row for row, _ in pairs[:max_runs] if row.runnable}.values())
            crossed = cross_broke(rows, resolve(spec, None, from_env=False).env(), build.env()) if base else None
            if crossed:
                res.update(status="killed", by=crossed[0], detail=f"bump from the pristine build: {': '.join(crossed)}")
            else:
                res["detail"] = (f"{len(res['ran'])} of the {len(pairs)} row x lanes that ran the line, none failed"
                                 + ("; the cross-build lane on their rows did not break" if base else ""))
    finally:
        os.environ.pop(CALL_TIMEOUT, None)
        activate(resolve("pinned" if spec == "pinned" else spec, None, from_env=False))
        if build.bindings:  # (the mutant's cache entry: one build per mutant, not kept)
            shutil.rmtree(Path(build.bindings).parent, ignore_errors=True)
    return {**res, "seconds": round(time.perf_counter() - t0, 1)}


def base_tree(spec: str) -> Path:
    """The llama.cpp tree of a base build spec: pinned, pypi:VERSION (its sdist's) or a tree's path."""
    from targets.builds import PINNED, sdist_tree

    if spec == "pinned" or spec.startswith("pypi:"):
        return sdist_tree(PINNED if spec == "pinned" else spec[len("pypi:"):])[0]
    if (Path(spec) / "src" / "llama-context.cpp").is_file():
        return Path(spec)
    raise UserError(f"--diff {spec}: give pinned, pypi:VERSION or a llama.cpp tree (a directory with src/)")


def pristine_objects(spec: str, files: list[str]) -> tuple[Path, Path, dict[str, str | None]]:
    """The build spec's tree (pinned or pypi:VERSION), its work directory built pristine (incrementally: what the
    last mutant changed is compiled back) and each file's pristine object digest."""
    from targets.builds import PINNED, sdist_tree
    from targets.cmake_build import BuildError, built
    from targets.native import cache_dir

    if spec != "pinned" and not spec.startswith("pypi:"):
        raise UserError(f"--llama-cpp {spec}: mutate builds an sdist's tree (pinned or pypi:VERSION)")
    version = PINNED if spec == "pinned" else spec[len("pypi:"):]
    src, _, _ = sdist_tree(version)
    work = cache_dir() / "builds" / f"work-pypi-{version}"
    try:
        with built(src, work, f"{spec} (pristine, for the mutants' object comparison)"):
            pass
    except BuildError as e:
        raise UserError(f"--llama-cpp {spec}: {e}") from None
    return src, work, {f: object_digest(work, f) for f in files}


def mutate(coverage_dir: Path, out: Path, *, per_group: dict[str, int], seed: int, budget: float, command: str,
           manifest: Path, spec: str = "pinned", max_runs: int = 12, diff: str | None = None,
           bundles: bool = False, ids: list[str] | None = None) -> dict[str, Any]:
    """Draw the sample, run each mutant not already in out/mutate.json, write it after each; the report. diff: a
    base build spec (pypi:VERSION, pinned) — only the lines the coverage run's build changes against it are mutated,
    and the report says how many state-code lines changed and which of them no lane ran."""
    from synth.manifest import load_manifest

    t0 = time.perf_counter()
    covered, rows = covered_lines(coverage_dir), RowLines(coverage_dir)
    cov_rep = json.loads((coverage_dir / "coverage.json").read_text())
    m = load_manifest(manifest)
    plan = [(m.row(x["row"]), x["lane"]) for x in cov_rep["lanes"] if x["status"] not in ("unsupported", "skipped")]
    files = sorted({f for f, _ in covered})
    root = base_tree(spec)
    functions = line_functions(coverage_dir)
    account = None
    if diff is not None:
        changed = changed_lines(base_tree(diff), root, sorted({f for f, _ in functions}))
        account = {"base": diff, **diff_account(root, changed, covered, functions, tuple(per_group))}
        covered = {k: v for k, v in covered.items() if k[1] in changed.get(k[0], ())}
    mutants = generate(root, covered, functions, tuple(per_group))
    chosen = sample(mutants, per_group, seed) if not ids else [x for x in mutants if x.id in ids]
    if ids and len(chosen) < len(set(ids)):
        missing = sorted(set(ids) - {x.id for x in chosen})
        raise UserError(f"--id {missing[0]}: no such mutant of the lines this coverage run ran (an id names the file, "
                        "line and the mutated text: the tree or the coverage changed)")
    _, work, pristine = pristine_objects(spec, files)  # (built only once what is asked is known to exist)
    state = out / "mutate.json"
    out.mkdir(parents=True, exist_ok=True)
    base = Pristine(out, spec, m.path)
    done: dict[str, dict[str, Any]] = {}
    before = 0.0  # the seconds of the runs this one resumes
    if state.is_file():
        old = json.loads(state.read_text())
        if old.get("seed") == seed and old.get("coverage") == str(coverage_dir.resolve()) and \
                (old.get("diff") or {}).get("base") == diff:
            done = {r["id"]: r for r in old["results"]}
            before = float(old.get("wall_s") or 0.0)
    out.mkdir(parents=True, exist_ok=True)
    rep: dict[str, Any] = {"schema": MUTATE_SCHEMA, "kind": "family-certify-mutate", "command": command,
                           "coverage": str(coverage_dir.resolve()), "build": cov_rep["build"], "seed": seed,
                           "sample": per_group, "generated": len(mutants), "results": [], "wall_s": 0.0,
                           "complete": False, **({"diff": account} if account else {})}
    for i, mu in enumerate(chosen):
        if mu.id in done:
            rep["results"].append(done[mu.id])
            continue
        if budget and time.perf_counter() - t0 > budget:
            print(f"budget: {budget:.0f} s spent; {len(chosen) - i} mutants left for the next run (it resumes)")
            break
        r = run_mutant(mu, root, pristine, work, covering(plan, mu, covered.get((mu.file, mu.line), []), rows), out,
                       spec, m.path, max_runs, bundles, base)
        rep["results"].append(r)
        print(f"{mu.id:<34} {mu.group:<6} {r['status']:<12} {r['by'] or ''} {r['seconds']:.0f} s", flush=True)
        rep["wall_s"] = round(before + time.perf_counter() - t0, 1)
        state.write_text(json.dumps(rep, indent=1) + "\n")
    rep["complete"] = len(rep["results"]) == len(chosen)
    rep["wall_s"] = round(before + time.perf_counter() - t0, 1)
    state.write_text(json.dumps(rep, indent=1) + "\n")
    (out / "summary.md").write_text(summary_md(rep))
    return rep


def mutate_diff(plan: list[tuple[Any, list[str]]], base: str, candidate: str, out: Path, *, budget: float,
                manifest: Path, jobs: int, command: str, per_group: dict[str, int] | None = None,
                seed: int = 0) -> dict[str, Any]:
    """What a bump's battery sees of the bump itself: the candidate's coverage build runs the plan (out/coverage),
    then a seeded sample of mutants of the state-code lines the candidate changes against the base, within `budget`
    seconds of mutants (out/mutate: a rerun resumes). Lines and totals printed; the mutate report returned."""
    from fuzz.certify.coverage import print_totals, run_coverage
    from targets.builds import use

    check_mutate_diff(candidate, None, None)
    build = use(candidate, None, coverage=True)
    if build.seconds:
        print(f"built {build.spec} (coverage) in {build.seconds:.0f} s (cached for later runs)")
    print_totals(run_coverage(plan, out / "coverage", manifest=manifest, command=command, jobs=jobs, build=build))
    rep = mutate(out / "coverage", out / "mutate", per_group=per_group or {"state": 20, "server": 10}, seed=seed,
                 budget=budget, command=command, manifest=manifest, spec=candidate, diff=base)
    print_mutate(rep)
    return rep


def check_mutate_diff(candidate: str, patches: Path | None, backend: str | None) -> None:
    """Mutants are built in an sdist's tree on the CPU: a candidate of another kind is bad input, said before any
    lane runs."""
    sdist = candidate == "pinned" or candidate.startswith("pypi:")
    if not sdist or patches is not None or backend not in (None, "cpu"):
        raise UserError(f"--mutate-diff: the candidate must be pinned or pypi:VERSION, without --patches or another "
                        f"backend (mutants are built in an sdist's tree), got {candidate}")


def print_mutate(rep: dict[str, Any]) -> None:
    """The per-group lines, the diff's line (--diff) and the totals line that ends a mutate run's log."""
    for g in GROUP_NAMES:
        t = score(rep["results"], g)
        print(f"{g}: {t['killed']} of {t['killed'] + t['survived']} killed ({t['score']}%), {t['equivalent']} "
              f"equivalent, {t['survived']} survived, {t['build-failed']} did not build")
    if rep.get("diff"):
        d = rep["diff"]
        print(f"changed against {d['base']}: {d['changed']} state-code lines, {d['ran']} run by the lanes, "
              f"{d['changed'] - d['ran']} by none")
    print(totals_line(rep["results"]))


def mutate_command(
    coverage: Annotated[Path, typer.Option(help="a `family-certify coverage --out` directory: the lines the lanes "
                                                "ran, and which lanes ran each")] = Path("coverage-out"),
    out: Annotated[Path, typer.Option(help="mutate.json (resumed from), summary.md, junit.xml, patches/")]
    = Path("mutate-out"),
    state: Annotated[int, typer.Option(help="mutants of the state group (KV caches, memories, the context's state "
                                            "paths)")] = 20,
    server: Annotated[int, typer.Option(help="mutants of the server group (slots, prompt cache, speculative)")] = 10,
    seed: Annotated[int, typer.Option(help="the sample's seed (the same seed draws the same mutants)")] = 0,
    budget: Annotated[float, typer.Option(help="stop after this many seconds (0: no limit); a rerun resumes")] = 0.0,
    max_runs: Annotated[int, typer.Option(help="row x lanes a mutant runs at most (interleaved by lane) before it "
                                               "counts as survived")] = 12,
    diff: Annotated[str | None, typer.Option(help="a base build (pypi:VERSION, pinned, a tree): mutate only the lines "
                                                  "the coverage run's build changes against it")] = None,
    mutant_id: Annotated[list[str] | None, typer.Option("--id", help="only these mutants (ids of an earlier run, "
                                                                      "repeatable): a survivor judged again")] = None,
    bundles: Annotated[bool, typer.Option("--bundles", help="bundle each killing finding (out/patches/ID/run/"
                                                             "bundles, the mutant's patch series as its build)")]
    = False,
    manifest: Annotated[Path | None, typer.Option(help="manifest file")] = None,
) -> int:
    """Mutants of the state code the coverage run saw executed, each built and run on the lanes that executed its
    line until one fails (or the bump from the pristine build says it broke); the score per group, ending with one
    totals line. Exit 0: a measurement, not a verdict (the survivors are the generators' to-do list,
    docs/mutation.md)."""
    import sys

    from fuzz.certify.outputs import junit_xml
    from synth.manifest import load_manifest

    m = load_manifest(manifest)
    spec = "pinned"
    try:
        spec = json.loads((coverage / "coverage.json").read_text())["build"].get("spec") or "pinned"
    except (OSError, ValueError, KeyError):
        pass  # (covered_lines says what is wrong with the directory)
    rep = mutate(coverage, out, per_group={"state": state, "server": server}, seed=seed, budget=budget,
                 command="family-certify mutate " + " ".join(sys.argv[2:]), manifest=m.path, spec=spec,
                 max_runs=max_runs, diff=diff, bundles=bundles, ids=mutant_id)
    results = [{"row": r["id"], "lane": r["group"], "seconds": r["seconds"],
                "status": {"killed": "pass", "survived": "finding", "equivalent": "unsupported",
                           "build-failed": "skipped", "error": "crash"}[r["status"]],
                "detail": f"{r['status']}: {r['file']}:{r['line']} {r['mutated'].strip()}"
                          + (f" (by {r['by']}: {r['detail']})" if r["by"] else "")} for r in rep["results"]]
    junit = {"results": results, "build": {"llama_cpp_commit": rep["build"].get("llama_cpp_commit"),
                                          "toolkit": rep["build"].get("toolkit", ""), **rep["build"]},
             "manifest": {"sha256": hashlib.sha256(m.path.read_bytes()).hexdigest()}, "target": "mutants"}
    (out / "junit.xml").write_bytes(junit_xml(junit))
    print_mutate(rep)
    return 0
