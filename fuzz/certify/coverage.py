"""`family-certify coverage`: which of llama.cpp's state code the lanes execute.

The selected rows' lanes run on the build's coverage build (targets/builds.py: libllama, llama-server and common
compiled with gcc's --coverage at -O0), one lane at a time, each lane's processes writing their counts (.gcda) under
a directory of their own (GCOV_PREFIX), each row's apart: so every function's first covering lane is known, a lane's
counts never mix with another's, and pairs.json says which lines each row × lane ran (what `family-certify mutate`
runs a mutant on). gcovr reads each lane's counts against the build's notes (.gcno) into a tracefile; the report
merges them over the files of STATE_CODE, groups their functions (GROUPS: the KV caches, memories and the context's
state paths; llama-server's cache and slot paths) and writes coverage.json (schemas/coverage.schema.json),
summary.md, gcovr's HTML pages and the lanes' tracefiles. The lanes' own verdicts are reported beside (junit.xml; a
coverage run is not a certification, but a lane that failed covered less than it would have: the summary says
which).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from fuzz.certify.schemas import COVERAGE_SCHEMA
from fuzz.engine.contract import FAILING
from synth.errors import UserError
from targets.client import ROW_COUNTS_ENV

# the files whose coverage is reported (paths relative to the llama.cpp tree)
STATE_FILES = (r"src/llama-kv-cache[^/]*\.cpp", r"src/llama-kv-cells\.h", r"src/llama-memory[^/]*\.cpp",
               r"src/llama-context\.cpp", r"src/llama-batch\.cpp", r"src/llama-graph\.cpp",
               r"tools/server/server-context\.cpp", r"tools/server/server-common\.cpp",
               r"tools/server/server-task\.cpp", r"tools/server/server-queue\.cpp", r"common/speculative\.cpp")


@dataclass(frozen=True)
class Group:
    """Functions whose lines one acceptance figure counts: a file pattern and a pattern of demangled function names
    (None: every function of those files)."""
    name: str
    title: str
    files: str
    functions: str | None = None

    def holds(self, file: str, function: str) -> bool:
        return bool(re.fullmatch(self.files, file)) and \
            (self.functions is None or re.search(self.functions, function) is not None)


# the context's state paths: state save and load (whole context and per sequence, memory and file), the memory API,
# decode and encode with their output handling, and the host/file readers and writers state goes through
CONTEXT_STATE = (r"^llama_context::(state_|memory_|decode|encode|process_ubatch|output_|extract_layer_inputs|"
                 r"get_(logits|embeddings))|^llama_io_(write|read)_|^llama_(state_|memory_|get_state_size|"
                 r"copy_state_data|set_state_data|load_session_file|save_session_file|decode|encode|get_logits|"
                 r"get_embeddings)")
# llama-server's slots (their prompt, checkpoints, speculative drafts), the prompt cache in host memory, the token
# sequences the cache matches prefixes of, the scheduling loop that decodes slots' batches, slot save/restore/erase,
# and common's speculative decoding (drafts, their contexts' state)
SERVER_STATE = (r"^server_slot::|^server_batch::|^server_context_impl::(get_available_slot|get_free_slots|"
                r"try_clear_idle_slots|launch_slot|create_checkpoint|process_single_task|update_slots|pre_decode|"
                r"decode|post_decode|process_token|n_ctx_slot|handle_sleeping_state)|^server_routes::handle_slots_|"
                r"^server_prompt_cache::|^server_tokens::|server_tokens_state_|^common_speculative")
GROUPS = (
    Group("state", "state functions (KV caches, recurrent and hybrid memories, the context's state paths)",
          r"src/llama-(kv-cache[^/]*|memory[^/]*)\.cpp|src/llama-kv-cells\.h", None),
    Group("state", "", r"src/llama-context\.cpp", CONTEXT_STATE),
    Group("server", "server paths (slots, prompt cache, checkpoints, cache reuse, speculative decoding)",
          r"tools/server/server-(context|task|common)\.cpp|common/speculative\.cpp", SERVER_STATE),
)
GROUP_NAMES = tuple(dict.fromkeys(g.name for g in GROUPS))


def in_group(name: str, file: str, function: str) -> bool:
    return any(g.name == name and g.holds(file, function) for g in GROUPS)


ACCOUNTS = Path(__file__).resolve().parents[2] / "corpora" / "coverage.toml"
ACCOUNT_STATUSES = ("unreachable", "todo")


@dataclass(frozen=True)
class Account:
    """Why a function of the groups no lane runs stays unrun: `unreachable` from a split runtime or a server (why,
    citing the code) or a `todo` (what would reach it)."""
    file: str
    match: str
    status: str
    why: str

    def holds(self, file: str, function: str) -> bool:
        return re.fullmatch(self.file, file) is not None and re.search(self.match, function) is not None


def load_accounts(path: Path = ACCOUNTS) -> list[Account]:
    """corpora/coverage.toml: each [[function]] a file pattern, a pattern of demangled names, a status and why."""
    import tomllib

    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise UserError(f"{path}: not a readable accounts file ({e}); fix it or restore it from git") from None
    out = []
    for i, x in enumerate(data.get("function", [])):
        try:
            a = Account(x["file"], x["match"], x["status"], x["why"])
            re.compile(a.file), re.compile(a.match)
        except (KeyError, TypeError, re.error) as e:
            raise UserError(f"{path}: [[function]] #{i + 1}: {e!r} (each needs file, match, status and why; file and "
                            "match are regular expressions)") from None
        if a.status not in ACCOUNT_STATUSES:
            raise UserError(f"{path}: [[function]] #{i + 1} ({a.match}): status {a.status!r}: use one of "
                            f"{', '.join(ACCOUNT_STATUSES)}")
        out.append(a)
    return out


def account_of(file: str, function: str, accounts: list[Account]) -> Account | None:
    return next((a for a in accounts if a.holds(file, function)), None)


# ---- reading gcovr's tracefiles ---------------------------------------------------------------------------
def functions_of(trace: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    """(file, demangled function name) → {"line": first line, "lines": {line: count}, "count": calls, "branches":
    [covered, total]} from a gcovr JSON tracefile; a line belongs to the function gcov attributes it to."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for f in trace.get("files", []):
        name = f["file"]
        for fn in f.get("functions", []):
            key = (name, fn.get("demangled_name") or fn["name"])
            got = out.setdefault(key, {"line": fn.get("lineno", 0), "lines": {}, "count": 0, "branches": [0, 0]})
            got["count"] += int(fn.get("execution_count") or 0)
        for ln in f.get("lines", []):
            if ln.get("gcovr/noncode"):
                continue
            fn_name = ln.get("function_name")
            if fn_name is None:
                continue
            key = (name, fn_name)
            got = out.setdefault(key, {"line": ln["line_number"], "lines": {}, "count": 0, "branches": [0, 0]})
            n = ln["line_number"]
            got["lines"][n] = got["lines"].get(n, 0) + int(ln.get("count") or 0)
            for b in ln.get("branches", []):
                got["branches"][1] += 1
                got["branches"][0] += int(b.get("count") or 0) > 0
    return out


def merge_functions(per_lane: list[tuple[str, dict[tuple[str, str], dict[str, Any]]]]) \
        -> dict[tuple[str, str], dict[str, Any]]:
    """The lanes' functions (in run order) merged: a line's count summed over lanes, a function's first covering
    lane the first lane that ran it."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for lane, fns in per_lane:
        for key, fn in fns.items():
            got = out.setdefault(key, {"line": fn["line"], "lines": {}, "count": 0, "first_lane": None})
            for n, c in fn["lines"].items():
                got["lines"][n] = got["lines"].get(n, 0) + c
            got["count"] += fn["count"]
            if got["first_lane"] is None and (fn["count"] > 0 or any(fn["lines"].values())):
                got["first_lane"] = lane
    return out


def figures(lines: dict[Any, int]) -> tuple[int, int]:
    return sum(1 for c in lines.values() if c > 0), len(lines)


def percent(covered: int, total: int) -> float:
    return round(100.0 * covered / total, 1) if total else 0.0


def report(fns: dict[tuple[str, str], dict[str, Any]], merged: dict[str, Any], lanes: list[dict[str, Any]],
           build: dict[str, Any], command: str, wall_s: float, accounts: list[Account] | None = None) \
        -> dict[str, Any]:
    """The coverage report: per file (lines, branches, functions, from gcovr's merged tracefile), per group (the
    lines of its functions, how many of its unrun functions no account explains) and per function (covered, its
    lines, the first lane that ran it; unrun: its account)."""
    accounts = load_accounts() if accounts is None else accounts
    ran: dict[tuple[str, int], int] = {}  # every source line's count over every function holding it
    for (file, _), fn in fns.items():
        for n, c in fn["lines"].items():
            ran[(file, n)] = ran.get((file, n), 0) + c

    def unrun(key: tuple[str, str]) -> bool:
        """Not run: not called, and none of its lines run (a template instantiation whose lines another one ran is
        not code no lane reaches)."""
        fn = fns[key]
        return fn["count"] == 0 and not any(ran[(key[0], n)] for n in fn["lines"])
    files = []
    for f in sorted(merged.get("files", []), key=lambda f: f["file"]):
        lines = [ln for ln in f.get("lines", []) if not ln.get("gcovr/noncode")]
        by_line: dict[int, int] = {}
        branches = [0, 0]
        for ln in lines:
            by_line[ln["line_number"]] = by_line.get(ln["line_number"], 0) + int(ln.get("count") or 0)
            for b in ln.get("branches", []):
                branches[1] += 1
                branches[0] += int(b.get("count") or 0) > 0
        mine = [fn for (file, _), fn in fns.items() if file == f["file"]]
        lc, lt = figures(by_line)
        files.append({"file": f["file"], "lines": [lc, lt], "line_percent": percent(lc, lt),
                      "branches": branches, "branch_percent": percent(*branches),
                      "functions": [sum(1 for fn in mine if fn["count"] > 0), len(mine)]})
    groups = []
    for name in GROUP_NAMES:
        g = next(x for x in GROUPS if x.name == name)
        held = [(k, fn) for k, fn in fns.items() if in_group(name, *k)]
        # a source line once, run if any function holding it ran it (a template's line: any instantiation)
        covered, total = figures({(file, n): ran[(file, n)] for (file, _), fn in held for n in fn["lines"]})
        idle = [k for k, _ in held if unrun(k)]
        groups.append({"name": g.name, "title": g.title, "lines": [covered, total],
                       "line_percent": percent(covered, total),
                       "functions": [len(held) - len(idle), len(held)],
                       "unaccounted": sum(1 for k in idle if account_of(*k, accounts) is None)})
    functions = []
    for (file, name), fn in sorted(fns.items(), key=lambda kv: (kv[0][0], kv[1]["line"], kv[0][1])):
        lc, lt = figures(fn["lines"])
        mine = [g for g in GROUP_NAMES if in_group(g, file, name)]
        acc = account_of(file, name, accounts) if mine and unrun((file, name)) else None
        functions.append({"file": file, "function": name, "line": fn["line"], "calls": fn["count"],
                          "lines": [lc, lt], "first_lane": fn["first_lane"], "groups": mine,
                          "ran": not unrun((file, name)),
                          "account": {"status": acc.status, "why": acc.why} if acc else None})
    return {"schema": COVERAGE_SCHEMA, "kind": "family-certify-coverage", "command": command, "build": build,
            "lanes": lanes, "files": files, "groups": groups, "functions": functions, "wall_s": round(wall_s, 1)}


def totals_line(rep: dict[str, Any]) -> str:
    g = {x["name"]: x for x in rep["groups"]}
    return (f"coverage: state functions {g['state']['line_percent']}% of lines, "
            f"server paths {g['server']['line_percent']}%")


def summary_md(rep: dict[str, Any]) -> str:
    out = ["# Coverage of llama.cpp's state code", "",
           f"`{rep['command']}` on build {rep['build'].get('key') or rep['build'].get('spec')}; "
           f"{len(rep['lanes'])} row × lane runs in {rep['wall_s']:.0f} s.", "",
           "| group | lines | % | functions run | not run, unaccounted |", "|---|---:|---:|---:|---:|"]
    for g in rep["groups"]:
        out.append(f"| {g['title']} | {g['lines'][0]} / {g['lines'][1]} | {g['line_percent']} | "
                   f"{g['functions'][0]} / {g['functions'][1]} | {g['unaccounted']} |")
    out += ["", "| file | lines | % | branches | % | functions run |", "|---|---:|---:|---:|---:|---:|"]
    for f in rep["files"]:
        out.append(f"| `{f['file']}` | {f['lines'][0]} / {f['lines'][1]} | {f['line_percent']} | "
                   f"{f['branches'][0]} / {f['branches'][1]} | {f['branch_percent']} | "
                   f"{f['functions'][0]} / {f['functions'][1]} |")
    failed = [x for x in rep["lanes"] if x["status"] in FAILING]
    if failed:
        out += ["", "Lanes that failed (they may have stopped before covering what they would have):", ""]
        out += [f"- {x['row']}/{x['lane']}: {x['status']} — {x['detail']}" for x in failed]
    first = Counter(fn["first_lane"] for fn in rep["functions"] if fn["first_lane"] and fn["groups"])
    out += ["", "Functions of the groups first covered by each lane: "
            + ", ".join(f"{lane} {n}" for lane, n in first.most_common()), "", totals_line(rep), ""]
    return "\n".join(out)


# ---- running the lanes on the coverage build -----------------------------------------------------------------
def note_beside(gcda: Path, prefix: Path) -> bool:
    """Copy a count file's notes (.gcno, in the build directory its path under the prefix names) beside it, where
    gcov looks; whether there were any."""
    gcno = Path("/") / gcda.relative_to(prefix).with_suffix(".gcno")
    if gcno.is_file():
        shutil.copyfile(gcno, gcda.with_suffix(".gcno"))
        return True
    return False


def notes_beside(counts: Path) -> int:
    """Every count file's notes beside it (note_beside); the number of count files that had them."""
    return sum(note_beside(gcda, counts) for gcda in counts.rglob("*.gcda"))


def row_lines(prefix: Path, root: Path, files: tuple[str, ...] = STATE_FILES) -> dict[str, str]:
    """The lines of `files` one row's processes ran (its count directory), per file relative to the tree's root, as
    ranges ("3-9,12"): gcov's own JSON of each count file of an object compiled from one of them, its notes copied
    beside it (a header's lines come with the objects that include it)."""
    want = re.compile("|".join(files))
    hit: dict[str, set[int]] = {}
    for gcda in sorted(prefix.rglob("*.gcda")):
        # (CMake's object of DIR/FILE is build/DIR/CMakeFiles/TARGET.dir/FILE.o: an object of another file is skipped)
        m = re.search(r"/build/(.+)/CMakeFiles/[^/]+\.dir/(.+)\.gcda$", str(gcda))
        if m and not want.fullmatch(f"{m.group(1)}/{m.group(2)}"):
            continue
        note_beside(gcda, prefix)
        r = subprocess.run(["gcov", "--json-format", "--stdout", gcda.name], cwd=gcda.parent, capture_output=True,
                           text=True)
        text, at = r.stdout, 0
        while at < len(text.rstrip()):
            doc, at = json.JSONDecoder().raw_decode(text, at)
            for f in doc.get("files", []):
                rel = os.path.relpath(f["file"], root)
                if want.fullmatch(rel):
                    hit.setdefault(rel, set()).update(ln["line_number"] for ln in f["lines"] if ln["count"] > 0)
            while at < len(text) and text[at].isspace():
                at += 1
    return {f: ranges(sorted(lines)) for f, lines in sorted(hit.items()) if lines}


def ranges(lines: list[int]) -> str:
    """Sorted line numbers as ranges: [3, 4, 5, 9] → "3-5,9"."""
    out: list[str] = []
    for n in lines:
        if out and int(out[-1].split("-")[-1]) == n - 1:
            out[-1] = f"{out[-1].split('-')[0]}-{n}"
        else:
            out.append(str(n))
    return ",".join(out)


def spans(text: str) -> list[tuple[int, int]]:
    """ranges() read back as (first, last) pairs, in order."""
    return [(int(a), int(b or a)) for a, _, b in (part.partition("-") for part in text.split(",") if part)]


def unranges(text: str) -> set[int]:
    """ranges() read back."""
    return {n for a, b in spans(text) for n in range(a, b + 1)}


def gcovr(args: list[str]) -> None:
    r = subprocess.run([sys.executable, "-m", "gcovr", *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise UserError(f"gcovr failed ({' '.join(args[:3])} ...): "
                        + (r.stderr.strip().splitlines() or ["no output"])[-1])


def prefixes(counts: Path) -> list[Path]:
    """A lane's count directories (GCOV_PREFIX): each row's (counts/rows/ROW) and the rest of its processes'
    (counts/all)."""
    return [p for p in [counts / "all", *sorted((counts / "rows").glob("*"))] if p.is_dir()]


def merged_counts(counts: Path) -> list[Path]:
    """A lane's count directories merged into one (gcov-tool, gcc's: counts summed per object) where it can be, so
    gcov reads each object once, not once a row; else the directories as they are."""
    dirs = prefixes(counts)
    if len(dirs) < 2 or not shutil.which("gcov-tool"):
        return dirs
    acc = counts / "merged"
    shutil.rmtree(acc, ignore_errors=True)
    shutil.copytree(dirs[0], acc)
    for d in dirs[1:]:
        tmp = counts / "merging"
        r = subprocess.run(["gcov-tool", "merge", "-o", str(tmp), str(acc), str(d)], capture_output=True, text=True)
        if r.returncode != 0:
            raise UserError(f"gcov-tool merge failed on {d}: {(r.stderr.strip().splitlines() or ['?'])[-1]}")
        shutil.rmtree(acc)
        tmp.rename(acc)
    return [acc]


def lane_tracefile(counts: Path, root: Path, into: Path, files: tuple[str, ...] = STATE_FILES) -> dict[str, Any]:
    """gcovr's JSON tracefile of one lane's counts (of `files`, patterns of paths relative to the tree's root),
    its rows' merged."""
    dirs = merged_counts(counts)
    for d in dirs:
        notes_beside(d)
    # (one gcov at a time: gcov writes its .gcov files into the directory it runs in, and two runs over objects of
    # one build collide on a header's)
    args = ["--root", str(root), "--json", str(into), "-j", "1",
            "--gcov-ignore-parse-errors=negative_hits.warn_once_per_file", "--merge-mode-functions=separate"]
    for pat in files:
        args += ["--filter", re.escape(str(root) + "/") + pat]
    gcovr([*args, *map(str, dirs)])
    return json.loads(into.read_text())


def run_coverage(plan: list[tuple[Any, list[str]]], out: Path, *, manifest: Path, command: str, jobs: int,
                 build: Any) -> dict[str, Any]:
    """Each lane of the plan in turn over its rows, on the (active) coverage build; the report, written into out."""
    from fuzz.certify.battery import run_battery
    from fuzz.certify.outputs import junit_xml
    from targets.target import close_idle

    work = Path(build.identity["coverage"]["work"])
    root = (work / "src").resolve()
    t0 = time.perf_counter()
    order: list[str] = []
    for _, ls in plan:
        order += [x for x in ls if x not in order]
    shutil.rmtree(out / "counts", ignore_errors=True)
    (out / "lanes").mkdir(parents=True, exist_ok=True)
    per_lane, results = [], []
    pairs: dict[str, dict[str, str]] = {}  # "row/lane" → file → the lines it ran (row_lines)
    verdicts: dict[str, Any] = {}  # the lanes' run reports merged: junit.xml (one testcase per row x lane)
    for lane in order:
        counts = out / "counts" / lane
        counts.mkdir(parents=True)
        sub = [(row, [lane]) for row, ls in plan if lane in ls]
        saved = {k: os.environ.get(k) for k in ("GCOV_PREFIX", "GCOV_PREFIX_STRIP", ROW_COUNTS_ENV)}
        os.environ["GCOV_PREFIX"], os.environ["GCOV_PREFIX_STRIP"] = str((counts / "all").resolve()), "0"
        os.environ[ROW_COUNTS_ENV] = str((counts / "rows").resolve())  # (battery.row_counts: a directory a row)
        try:
            run = run_battery(sub, "llama-cpp", None, manifest=manifest, command=command, jobs=jobs)
            close_idle()  # (a worker writes its counts when it exits: all of this lane's, before they are read)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        results += [{k: x[k] for k in ("row", "lane", "status", "detail", "seconds")} for x in run["results"]]
        verdicts = {**run, "results": [*verdicts.get("results", []), *run["results"]]} if verdicts else run
        trace = lane_tracefile(counts, root, out / "lanes" / f"{lane}.json")
        per_lane.append((lane, functions_of(trace)))
        rows = [p for p in prefixes(counts) if p.parent.name == "rows"]
        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:  # (gcov processes, side by side)
            ran = list(pool.map(lambda p: row_lines(p, root), rows))
        pairs.update({f"{p.name}/{lane}": lines for p, lines in zip(rows, ran, strict=True)})
        shutil.rmtree(counts, ignore_errors=True)  # (every row's copy of the notes: gigabytes on a long lane)
    (out / "pairs.json").write_text(json.dumps(pairs, indent=0, sort_keys=True) + "\n")
    shutil.rmtree(out / "counts", ignore_errors=True)
    if verdicts:
        (out / "junit.xml").write_bytes(junit_xml(verdicts))
    return write_report(out, root, per_lane, results, build.identity, command, time.perf_counter() - t0)


def write_report(out: Path, root: Path, per_lane: list[tuple[str, dict[tuple[str, str], dict[str, Any]]]],
                 results: list[dict[str, Any]], build: dict[str, Any], command: str, wall_s: float) -> dict[str, Any]:
    """The lanes' tracefiles (out/lanes) merged by gcovr (tracefile.json, html/) and the report written."""
    args = ["--root", str(root), "--json", str(out / "tracefile.json"), "--merge-mode-functions=separate"]
    for lane, _ in per_lane:
        args += ["--add-tracefile", str(out / "lanes" / f"{lane}.json")]
    (out / "html").mkdir(exist_ok=True)
    gcovr([*args, "--html-details", str(out / "html" / "index.html"), "--html-title", "llama.cpp state code"])
    merged = json.loads((out / "tracefile.json").read_text())
    rep = report(merge_functions(per_lane), merged, results, build, command, wall_s)
    (out / "coverage.json").write_text(json.dumps(rep, indent=1) + "\n")
    (out / "summary.md").write_text(summary_md(rep))
    return rep


def reread(out: Path) -> dict[str, Any]:
    """The report of a coverage run in `out` made again from its lanes' tracefiles (after corpora/coverage.toml or
    the groups changed), without running anything."""
    try:
        old = json.loads((out / "coverage.json").read_text())
        order = list(dict.fromkeys(x["lane"] for x in old["lanes"]))
        per_lane = [(lane, functions_of(json.loads((out / "lanes" / f"{lane}.json").read_text()))) for lane in order]
        root = Path(old["build"]["coverage"]["work"]) / "src"
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UserError(f"--reread: {out} holds no complete coverage run ({e}); run `family-certify coverage --out "
                        f"{out}` first") from None
    return write_report(out, root.resolve(), per_lane, old["lanes"], old["build"], old["command"], old["wall_s"])


def coverage_command(
    rows: Annotated[list[str] | None, typer.Argument(help="row names (default: every row of --tier, tier 1 — the "
                                                         "rows the per-bump jobs run — if no row or tier is "
                                                         "given)")] = None,
    tier: Annotated[int | None, typer.Option(help="only this tier")] = None,
    every_tier: Annotated[bool, typer.Option("--every-tier", help="every row of every tier")] = False,
    lane: Annotated[list[str] | None, typer.Option(help="only these lanes (repeatable)")] = None,
    job: Annotated[list[str] | None, typer.Option("--job", help="only the lanes of this CI job (gate, memory, "
                                                                "server, nightly; repeatable)")] = None,
    manifest: Annotated[Path | None, typer.Option(help="manifest file")] = None,
    out: Annotated[Path, typer.Option(help="write coverage.json, summary.md, html/ and the lanes' tracefiles "
                                           "here")] = Path("coverage-out"),
    llama_cpp: Annotated[str | None, typer.Option("--llama-cpp", help="the build whose coverage build runs: pinned "
                                                                   "(default), pypi:VERSION or a source tree's path "
                                                                   "[env: FAMILY_CERTIFY_LLAMA_CPP]")] = None,
    patches: Annotated[Path | None, typer.Option(help="a patch series applied onto that tree "
                                                      "[env: FAMILY_CERTIFY_PATCHES]")] = None,
    jobs: Annotated[int, typer.Option(help="rows run at a time")] = 1,
    again: Annotated[bool, typer.Option("--reread", help="run nothing: make the report in --out again from its "
                                                         "lanes' tracefiles (after editing corpora/coverage.toml)")]
    = False,
) -> int:
    """Run the selected lanes on the build's coverage build (built once, cached like every build) and report which
    of llama.cpp's state code they execute: per file, per function (with the lane that first ran it) and per group,
    ending with one totals line."""
    from fuzz.certify.battery import check_jobs, lane_plan, nothing_planned
    from synth.manifest import load_manifest
    from targets.builds import use

    if again:
        rep = reread(out)
        print_totals(rep)
        return 0
    m = load_manifest(manifest)
    if every_tier and (tier is not None or rows):
        raise UserError("--every-tier: give no --tier and no rows with it")
    plan = lane_plan(m, 1 if tier is None and not rows and not every_tier else tier, rows, lane, jobs=job)
    if not plan:
        return nothing_planned(job)
    check_jobs(jobs)
    build = use(llama_cpp, patches, coverage=True)
    if build.seconds:
        print(f"built {build.spec} (coverage) in {build.seconds:.0f} s (cached for later runs)")
    rep = run_coverage(plan, out, manifest=m.path, command="family-certify coverage " + " ".join(sys.argv[2:]),
                       jobs=jobs, build=build)
    print_totals(rep)
    return 0


def print_totals(rep: dict[str, Any]) -> None:
    for g in rep["groups"]:
        print(f"{g['name']}: {g['lines'][0]} of {g['lines'][1]} lines ({g['line_percent']}%), "
              f"{g['functions'][0]} of {g['functions'][1]} functions run, {g['unaccounted']} of those not run "
              f"unaccounted for (corpora/coverage.toml) — {g['title']}")
    print(totals_line(rep))
