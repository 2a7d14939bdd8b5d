"""The upstream bug corpus: llama.cpp bugs upstream fixed, each re-created on the pinned tree by a patch series,
as the measure of the battery (`family-certify corpus`).

An entry is a directory corpora/upstream/<issue-or-pr-number>-<slug>/ holding
  *.patch      the series that puts the bug back into the pinned tree (the fix reverted, or re-introduced by hand
               where the code moved), applied and built as any `--patches` series
  entry.toml   upstream (the number the directory is named by), title, class (CLASSES), threads (the upstream
               issue and pull-request URLs), row (the manifest row whose fixture shows it), check (a `fuzz`
               command line: exit 1 on the entry's build, 0 on the pinned one; `{fixture}` is the row's fixture,
               `{entry}` the entry's directory; [] while no command shows the bug — the README says why)
  README.md    the upstream threads cited, what a user saw, which fixture and configuration show it, and for an
               escape, why the lanes miss it
Each entry runs through the per-bump gate exactly as a user's CI runs it (`family-certify bump --patches ENTRY` on
the manifest's tier: every row and lane, no per-bug options) and its direct check; the pinned build runs the same
gate and every check once, and must pass them. Caught: the gate's verdict on the entry's build is a failure.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fuzz.certify.schemas import CORPUS_CLASSES as CLASSES
from synth.errors import UserError

ROOT = Path(__file__).resolve().parents[2]
DIR = ROOT / "corpora" / "upstream"
GOAL = 0.9  # the share of entries the gate must catch
THREAD = re.compile(r"^https://github\.com/ggml-org/llama\.cpp/(issues|pull)/([0-9]+)$")
KEYS = {"upstream", "title", "class", "threads", "row", "check"}
CHECK_TIMEOUT = 900.0


@dataclass(frozen=True)
class Entry:
    name: str
    path: Path
    upstream: int
    title: str
    klass: str
    threads: tuple[str, ...]
    row: str
    check: tuple[str, ...]
    patches: tuple[Path, ...] = field(default=())

    def check_argv(self, fixture: Path) -> list[str]:
        return [a.replace("{fixture}", str(fixture)).replace("{entry}", str(self.path)) for a in self.check]


def load_entry(path: Path, rows: set[str]) -> Entry:
    """One entry, checked: anything missing or malformed is bad input naming the entry and the fix."""
    where = f"corpus entry {path.name}"
    try:
        meta = tomllib.loads((path / "entry.toml").read_text())
    except OSError:
        raise UserError(f"{where}: no entry.toml; write one (keys: {', '.join(sorted(KEYS))})") from None
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"{where}: entry.toml is not TOML ({e}); fix it") from None
    missing, extra = sorted(KEYS - set(meta)), sorted(set(meta) - KEYS)
    if missing or extra:
        raise UserError(f"{where}: entry.toml " + (f"lacks {', '.join(missing)}" if missing else
                                                   f"has unknown keys {', '.join(extra)}")
                        + f"; its keys are {', '.join(sorted(KEYS))}")
    num = meta["upstream"]
    if not isinstance(num, int) or not path.name.startswith(f"{num}-"):
        raise UserError(f"{where}: the directory must be named <upstream>-<slug> after entry.toml's upstream "
                        f"({num!r})")
    if meta["class"] not in CLASSES:
        raise UserError(f"{where}: class {meta['class']!r} is not one of {', '.join(CLASSES)}")
    threads = meta["threads"]
    if not isinstance(threads, list) or not threads or not all(isinstance(t, str) and THREAD.match(t)
                                                                for t in threads):
        raise UserError(f"{where}: threads must list upstream URLs (https://github.com/ggml-org/llama.cpp/issues/N "
                        "or /pull/N)")
    if not any(THREAD.match(t).group(2) == str(num) for t in threads):
        raise UserError(f"{where}: threads must include the upstream thread {num} the entry is named by")
    if meta["row"] not in rows:
        raise UserError(f"{where}: row {meta['row']!r} is not a manifest row (`family-certify check` lists them)")
    check = meta["check"]
    if not isinstance(check, list) or not all(isinstance(a, str) for a in check) or (check and check[0] != "fuzz"):
        raise UserError(f"{where}: check must be a `fuzz` command line as a list of strings, e.g. "
                        "[\"fuzz\", \"memory\", \"{fixture}\", \"--program\", \"{entry}/program.json\"]")
    readme = path / "README.md"
    if not readme.is_file():
        raise UserError(f"{where}: no README.md; cite the upstream threads and say what a user saw")
    text = readme.read_text()
    if not check and "## Why no command shows it yet" not in text:
        raise UserError(f"{where}: check is empty: say why under '## Why no command shows it yet' in README.md")
    uncited = [t for t in threads if t not in text]
    if uncited:
        raise UserError(f"{where}: README.md does not cite {uncited[0]}")
    patches = tuple(sorted(path.glob("*.patch")))
    if not patches:
        raise UserError(f"{where}: no *.patch: the series that re-creates the bug in the pinned tree")
    return Entry(path.name, path, num, meta["title"], meta["class"], tuple(threads), meta["row"], tuple(check),
                 patches)


def load_entries(rows: set[str], names: list[str] | None = None, corpus: Path = DIR) -> list[Entry]:
    """Every entry of the corpus (or those named: a directory name or its upstream number), in number order."""
    if not corpus.is_dir():
        raise UserError(f"--corpus {corpus}: not a directory of corpus entries")
    found = [load_entry(d, rows) for d in corpus.iterdir() if d.is_dir() and not d.name.startswith(".")]
    found.sort(key=lambda e: (e.upstream, e.name))
    if not names:
        if not found:
            raise UserError(f"--corpus {corpus}: no entries in it")
        return found
    out = []
    for n in names:
        hit = [e for e in found if n in (e.name, str(e.upstream))]
        if not hit:
            raise UserError(f"corpus entry {n!r}: none of that name or number in {corpus} "
                            f"(entries: {', '.join(e.name for e in found)})")
        out += [e for e in hit if e not in out]
    return out


def run_check(entry: Entry, fixture: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    """The entry's direct check on the build this process has active (workers inherit its environment):
    {exit_code, shows (exit 1: a finding), line (its last output line)}."""
    if not entry.check:
        return {"exit_code": None, "shows": False, "line": "no command shows it yet (see its README)"}
    argv = entry.check_argv(fixture)
    argv[0] = str(Path(sys.executable).parent / "fuzz")
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=CHECK_TIMEOUT, cwd=entry.path,
                           env={**os.environ, **(env or {})})
        code, out = r.returncode, (r.stdout + r.stderr).strip()
    except subprocess.TimeoutExpired:
        code, out = -1, f"no answer in {CHECK_TIMEOUT:.0f} s"
    return {"exit_code": code, "shows": code == 1, "line": (out.splitlines() or [""])[-1][:300]}


def entry_result(entry: Entry, bump: dict[str, Any], check: dict[str, Any], pinned_check: dict[str, Any],
                 seconds: float) -> dict[str, Any]:
    from fuzz.certify import bump as bp
    broke = [x for x in bump["results"] if x["verdict"] in bp.FAILED]
    return {"entry": entry.name, "upstream": entry.upstream, "title": entry.title, "class": entry.klass,
            "threads": list(entry.threads), "row": entry.row, "caught": bool(broke),
            "by": [f"{x['row']}/{x['lane']}" for x in broke], "verdicts": bump["totals"],
            "check": {**check, "on_pinned": pinned_check}, "build_s": bump["build_s"].get("candidate", 0.0),
            "seconds": round(seconds, 1)}


def corpus_report(entries: list[dict[str, Any]], pinned: dict[str, Any], *, command: str, gate: dict[str, Any],
                  wall_s: float) -> dict[str, Any]:
    caught = sum(e["caught"] for e in entries)
    share = caught / len(entries) if entries else 0.0
    checks_ok = all(e["check"]["exit_code"] is None or (e["check"]["shows"] and e["check"]["on_pinned"]["exit_code"]
                                                         == 0) for e in entries)
    ok = pinned["passes"] and checks_ok and share >= GOAL
    return {"schema": 1, "kind": "family-certify-corpus", "command": command, "gate": gate, "pinned": pinned,
            "entries": entries, "totals": {"entries": len(entries), "caught": caught, "escaped": len(entries) - caught,
                                           "classes": len({e["class"] for e in entries})},
            "caught_share": round(share, 3), "goal": GOAL, "wall_s": round(wall_s, 1), "exit_code": 0 if ok else 1}


def corpus_md(rep: dict[str, Any]) -> str:
    """One screen: the verdict, the pinned build's own run, a line per entry."""
    t = rep["totals"]
    pinned = rep["pinned"]
    head = "PASS" if rep["exit_code"] == 0 else "FAIL"
    out = [f"## family-certify corpus: {head} — {t['caught']} of {t['entries']} upstream bugs caught "
           f"({100 * rep['caught_share']:.0f} %, goal {100 * rep['goal']:.0f} %), {t['classes']} classes", "",
           f"Gate: {rep['gate']['description']}. The pinned build: "
           + ("passes the gate and every direct check" if pinned["passes"] and all(
               e["check"]["on_pinned"]["exit_code"] in (0, None) for e in rep["entries"]) else
              "FAILS: " + "; ".join(pinned["failing"] or ["a direct check fails on it"])), "",
           "| entry | class | caught by the gate | direct check (entry / pinned) | upstream |", "|---|---|---|---|---|"]
    for e in rep["entries"]:
        by = ", ".join(e["by"][:4]) + (f" (+{len(e['by']) - 4})" if len(e["by"]) > 4 else "")
        out.append(f"| {e['entry']} | {e['class']} | {'✅ ' + by if e['caught'] else '❌ escaped'} | "
                   f"{check_cell(e['check'])} | " + " ".join(f"[#{t.rsplit('/', 1)[1]}]({t})" for t in e["threads"])
                   + " |")
    escaped = [e for e in rep["entries"] if not e["caught"]]
    if escaped:
        out += ["", "Escapes are analysed in their entry's README (corpora/upstream/<entry>/README.md): "
                + ", ".join(e["entry"] for e in escaped) + "."]
    out.append("")
    return "\n".join(out)


def check_cell(chk: dict[str, Any]) -> str:
    if chk["exit_code"] is None:
        return "none yet"
    pinned = chk["on_pinned"]["exit_code"]
    return (f"{'shows it' if chk['shows'] else 'exit ' + str(chk['exit_code'])} / "
            f"{'clean' if pinned == 0 else 'exit ' + str(pinned)}")


def corpus_junit(rep: dict[str, Any]) -> bytes:
    import xml.etree.ElementTree as ET

    suite = ET.Element("testsuite", name="family-certify corpus", tests=str(len(rep["entries"])),
                       failures=str(rep["totals"]["escaped"]), errors="0", skipped="0")
    for e in rep["entries"]:
        case = ET.SubElement(suite, "testcase", classname=e["class"], name=e["entry"])
        if not e["caught"]:
            ET.SubElement(case, "failure", message=f"escaped the gate: {e['title']}", type="escaped")
        else:
            ET.SubElement(case, "system-out").text = "caught by " + ", ".join(e["by"])
    return ET.tostring(suite, encoding="utf-8", xml_declaration=True)


def write_corpus(out: Path, rep: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(rep, indent=2) + "\n")
    (out / "summary.md").write_text(corpus_md(rep))
    (out / "junit.xml").write_bytes(corpus_junit(rep))


def fixture_for(row: Any, into: Path) -> Path:
    """The row's fixture, written once into `into`."""
    from synth.make import write_fixture

    path = into / f"{row.key}.gguf"
    if not path.exists():
        write_fixture(row.spec(), path)
    return path
