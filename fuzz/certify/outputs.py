"""What a family-certify run leaves for CI to show: `report.json` (every lane's full reports; schemas/
certify-run.schema.json), `summary.md` (fits a GitHub step summary: the row × lane grid, the failing lanes' one-line
findings with links to their bundles, the build identity, totals and wall time) and `junit.xml` (one testcase per
row × lane). `aggregate` merges the report.json of several shards and fails closed on a planned row × lane that
reported nothing."""

from __future__ import annotations

import hashlib
import json
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path
from typing import Any

from fuzz.engine.contract import (
    FAILING,
    KNOWN,
    MISSING,
    SKIPPED,
    STATUSES,
    UNSUPPORTED,
    build_identity,
    build_label,
    build_name,
)
from synth.errors import UserError, read_json
from synth.manifest import LANES

RUN_SCHEMA = 1
SYMBOLS = {"pass": "✅", "finding": "❌", "crash": "💥", "timeout": "⏱️", "missing": "⛔", "known": "🟣",
           "numerics": "〰️", "unsupported": "⚪", "skipped": "➖"}


def manifest_identity(path: Path) -> dict[str, str]:
    return {"path": str(path), "sha256": hashlib.sha256(Path(path).read_bytes()).hexdigest()}


def run_report(lanes: list[dict[str, Any]], *, plan: list[tuple[str, list[str]]], manifest: dict[str, str],
               target: str, llama_cpp_commit: str | None, wall_s: float, command: str,
               build: dict[str, Any] | None = None) -> dict[str, Any]:
    """The run's report: every planned row × lane exactly once (a planned lane with no result is `missing`).
    `build`: the build identity (default: the active build's, with the commit the target reported)."""
    got = {(x["row"], x["lane"]): x for x in lanes}
    results = []
    for row, planned in plan:
        for lane in planned:
            results.append(got.get((row, lane)) or {"row": row, "lane": lane, "status": MISSING, "seconds": 0.0,
                                                    "detail": "planned, but this run produced no result"})
    totals = Counter(x["status"] for x in results)
    failed = sum(totals[s] for s in FAILING)
    return {"schema": RUN_SCHEMA, "kind": "family-certify-run", "command": command, "target": target,
            "build": build or build_identity(llama_cpp_commit), "manifest": manifest,
            "plan": [{"row": r, "lanes": ls} for r, ls in plan], "results": results,
            "totals": {s: totals[s] for s in STATUSES if totals[s]}, "wall_s": round(wall_s, 2),
            "exit_code": 1 if failed else 0}


def read_run(path: Path) -> dict[str, Any]:
    f = path / "report.json" if path.is_dir() else path
    if not f.is_file():
        raise UserError(f"{path}: no report.json; pass a directory written by `family-certify run --out DIR`")
    data = read_json(f, "run report", "re-run family-certify run --out")
    if not isinstance(data, dict) or data.get("kind") != "family-certify-run" or data.get("schema") != RUN_SCHEMA:
        raise UserError(f"{f}: not a family-certify run report (schema {RUN_SCHEMA}); re-run family-certify run --out")
    return data


def merge(runs: list[dict[str, Any]], plan: list[tuple[str, list[str]]], manifest: dict[str, str], *,
          also: list[dict[str, Any]] = ()) -> dict[str, Any]:
    """Shards' reports (and `also`: lanes known without running them) as one, against the whole plan: a lane no
    shard reported is missing; a shard run on another manifest or build is refused (its results would not be
    comparable)."""
    for r in runs:
        if r["manifest"]["sha256"] != manifest["sha256"]:
            raise UserError(f"a shard ran on manifest {r['manifest']['sha256'][:12]}, not {manifest['sha256'][:12]} "
                            f"({manifest['path']}); re-run every shard on the same commit")
    builds = {build_name(r["build"]) for r in runs}
    if len(builds) > 1:
        raise UserError(f"shards ran on different builds ({', '.join(sorted(builds))}); re-run them on one")
    lanes = [x for r in runs for x in r["results"] if x["status"] != MISSING] + list(also)
    return run_report(lanes, plan=plan, manifest=manifest, target=runs[0]["target"] if runs else "",
                      llama_cpp_commit=None, wall_s=max((r["wall_s"] for r in runs), default=0.0),
                      command="family-certify aggregate", build=runs[0]["build"] if runs else None)


def summary_md(run: dict[str, Any], *, links: str = "") -> str:
    """The reviewer's ten seconds: verdict, build, grid, the failing lanes' lines with their bundles, totals.
    `links` prefixes relative links (where summary.md sits relative to the run directory)."""
    results = run["results"]
    failed = [x for x in results if x["status"] in FAILING]
    seen = list(dict.fromkeys(x["lane"] for x in results))  # the manifest's lane order, then any other
    lanes_order = [ln for ln in LANES if ln in seen] + [ln for ln in seen if ln not in LANES]
    rows_order = list(dict.fromkeys(x["row"] for x in results))
    cell = {(x["row"], x["lane"]): x for x in results}
    b = run["build"]
    verdict = f"FAIL — {len(failed)} of {len(results)} lanes" if failed else f"PASS — {len(results)} lanes"
    out = [f"## family-certify: {verdict}", "",
           f"{build_label(b)} · family-certify {b['toolkit']} · manifest "
           f"`{run['manifest']['sha256'][:12]}` · target `{run['target']}` · {len(rows_order)} rows × "
           f"{len(lanes_order)} lanes · wall {run['wall_s']:.0f} s", ""]
    out.append("| row | " + " | ".join(lanes_order) + " |")
    out.append("|---|" + "---|" * len(lanes_order))
    for row in rows_order:
        out.append(f"| {row} | " + " | ".join(SYMBOLS[cell[(row, ln)]["status"]] if (row, ln) in cell else ""
                                             for ln in lanes_order) + " |")
    out += ["", "Legend: " + " ".join(f"{SYMBOLS[s]} {s}" for s in STATUSES), ""]
    if failed:
        out += ["### Failing lanes", ""]
        for x in failed:
            line = f"- **{x['row']} / {x['lane']}** — {x['status']}: {one_line(x['detail'])}"
            line += "".join(f" · [bundle]({links}{p}/README.md)" for p in x.get("bundles", ()))
            line += "".join(f" · [picture]({links}{p})" for p in x.get("pictures", ())[:1])
            out.append(line)
        out.append("")
    known = [x for x in results if x["status"] == KNOWN]
    if known:
        out += ["### Known upstream findings (still reproducing)", ""]
        out += [f"- {x['row']} / {x['lane']}: {one_line(x['detail'])}" for x in known] + [""]
    skipped = [x for x in results if x["status"] == SKIPPED]
    if skipped:
        out += ["### Skipped (could not run here)", ""]
        out += [f"- skipped: {x['row']} / {x['lane']}: {one_line(x['detail'])}" for x in skipped] + [""]
    out.append("Totals: " + ", ".join(f"{v} {k}" for k, v in run["totals"].items()))
    if run.get("picture"):
        out += ["", f"![rows × lanes]({links}{run['picture']})"]
    return "\n".join(out) + "\n"


def one_line(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


def junit_xml(run: dict[str, Any]) -> bytes:
    """One testcase per row × lane (classname = row, name = lane): failing statuses are failures whose message is
    the lane's finding line; unsupported and skipped are skipped with their reason; known passes, with a property
    naming the manifest entry."""
    results = run["results"]
    failures = sum(x["status"] in FAILING for x in results)
    skipped = sum(x["status"] in (UNSUPPORTED, SKIPPED) for x in results)
    wall = sum(x.get("seconds", 0.0) for x in results)
    suite = ET.Element("testsuite", name="family-certify", tests=str(len(results)), failures=str(failures),
                       errors="0", skipped=str(skipped), time=f"{wall:.2f}")
    props = ET.SubElement(suite, "properties")
    for k, v in (("llama_cpp_commit", run["build"]["llama_cpp_commit"]), ("toolkit", run["build"]["toolkit"]),
                 ("build", build_name(run["build"])),
                 ("manifest_sha256", run["manifest"]["sha256"]), ("target", run["target"])):
        ET.SubElement(props, "property", name=k, value=str(v))
    for x in results:
        case = ET.SubElement(suite, "testcase", classname=x["row"], name=x["lane"], time=f"{x.get('seconds', 0):.2f}")
        if x["status"] in FAILING:
            fail = ET.SubElement(case, "failure", message=one_line(x["detail"]), type=x["status"])
            fail.text = x["detail"] + "".join(f"\nbundle: {p} (replay: fuzz replay {p})" for p in x.get("bundles", ()))
        elif x["status"] in (UNSUPPORTED, SKIPPED):
            ET.SubElement(case, "skipped", message=f"{x['status']}: {one_line(x['detail'])}")
        elif x["status"] == KNOWN:
            p = ET.SubElement(case, "properties")
            ET.SubElement(p, "property", name="known", value=one_line(x["detail"]))
    ET.indent(suite)
    return ET.tostring(suite, encoding="utf-8", xml_declaration=True) + b"\n"


def write_outputs(out: Path, run: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(run, indent=2) + "\n")
    (out / "summary.md").write_text(summary_md(run))
    (out / "junit.xml").write_bytes(junit_xml(run))
