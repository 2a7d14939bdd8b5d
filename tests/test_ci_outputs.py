"""What CI shows of a family-certify run (`run --out DIR`): summary.md, junit.xml (a testcase per row × lane),
report.json (schemas/certify-run.schema.json), pictures, and — when a lane fails — its bundles, linked from both
(each README naming the build); `aggregate` fails closed on a planned lane no shard reported; `matrix --shards`
covers each row once."""

import json
import xml.etree.ElementTree as ET

import pytest

from fuzz.certify.outputs import junit_xml, summary_md
from fuzz.certify.schemas import validate
from synth.manifest import load_manifest

from conftest import ROOT, run_cli

SVG = "{http://www.w3.org/2000/svg}"


def ids(svg_path) -> list[str]:
    return [g.get("id") for g in ET.parse(svg_path).getroot().iter(f"{SVG}g") if g.get("id")]


def junit_cases(junit_path) -> dict[tuple[str, str], ET.Element]:
    return {(c.get("classname"), c.get("name")): c for c in ET.parse(junit_path).getroot().iter("testcase")}


@pytest.mark.llama
def test_a_clean_run_writes_summary_junit_report_and_pictures(tmp_path):
    out = tmp_path / "out" / "nested"  # --out creates its directories
    r = run_cli("family-certify", "run", "jamba", "mamba", "--lane", "load", "--lane", "parity", "--lane", "handoff",
                "--out", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "\x1b[" not in r.stdout  # not a terminal: plain lines, no ANSI
    cases = junit_cases(out / "junit.xml")
    assert set(cases) == {(row, lane) for row in ("jamba", "mamba") for lane in ("load", "parity", "handoff")}
    assert not [c for c in cases.values() if len(c)]  # no failure, no skip
    run = json.loads((out / "report.json").read_text())
    validate(run, "certify-run")
    assert run["exit_code"] == 0 and run["totals"] == {"pass": 6}
    # parity and hand-off in the default batch shape and with chunks split into several ubatches; the tier-1
    # hand-off also at the offsets either side of the ubatch size (16), with chunks of 64
    assert {x["lane"]: [r["config"]["n_ubatch"] for r in x["reports"]] for x in run["results"]
            if x["row"] == "jamba"} == {"load": [], "parity": [64, 16], "handoff": [64, 3, 16]}
    summary = (out / "summary.md").read_text()
    commit = run["build"]["llama_cpp_commit"]
    assert summary.startswith("## family-certify: PASS — 6 lanes") and commit[:12] in summary
    assert run["manifest"]["sha256"][:12] in summary
    assert "| jamba | ✅ | ✅ | ✅ |" in summary and "![rows × lanes](pictures/battery.svg)" in summary
    # the hand-off picture: every cut set × offset × mode a cell, all passing; the strip has one cell per layer
    handoff = next(x for x in run["results"] if (x["row"], x["lane"]) == ("jamba", "handoff"))
    rep = handoff["reports"][0]
    cells = [i for i in ids(out / handoff["pictures"][0]) if i.startswith("cell:")]
    offsets = rep["config"]["prompt_len"] - 1 + min(rep["config"]["decode_offsets"], rep["config"]["tokens"])
    modes = rep["config"]["modes"]
    assert modes == ["full", "partial", "busy"] and len(cells) == len(rep["results"]) * offsets * len(modes)
    # busy hand-offs ran at three offsets (the first, middle and last): the other cells say not run
    busy = [c for c in cells if c.split(":")[1] == "busy"]
    assert len(busy) == len(rep["results"]) * offsets and len(rep["config"]["busy_offsets"]) == 3
    assert sum(c.endswith(":pass") for c in busy) == len(rep["results"]) * 3
    assert all(c.endswith(":pass") for c in cells if c not in busy) and all(c.endswith(":not-run") or
                                                                           c.endswith(":pass") for c in busy)
    strip = [i for i in ids(out / handoff["pictures"][0]) if i.startswith("layer:")]
    assert [s.split(":")[2][0].upper() for s in strip] == list(rep["kinds"])
    battery = [i for i in ids(out / "pictures" / "battery.svg") if i.startswith("cell:")]
    assert sorted(battery) == sorted(f"cell:{r}:{ln}:pass" for r, ln in cases)


@pytest.mark.llama
def test_a_mutant_run_fails_with_junit_failures_that_link_bundles(tmp_path):
    out = tmp_path / "out"
    r = run_cli("family-certify", "run", "jamba", "--lane", "parity", "--lane", "handoff",
                "--target", "mutant:b1-first-layer-probe", "--out", str(out))
    assert r.returncode == 1, r.stdout + r.stderr
    cases = junit_cases(out / "junit.xml")
    assert not len(cases[("jamba", "parity")])  # the mutant leaves parity alone
    (failure,) = cases[("jamba", "handoff")]
    assert failure.tag == "failure" and failure.get("type") == "finding"
    assert "full hand-off" in failure.get("message") and "cache_r_l" in failure.get("message")
    run = json.loads((out / "report.json").read_text())
    validate(run, "certify-run")
    (lane,) = [x for x in run["results"] if x["lane"] == "handoff"]
    (bundle,) = lane["bundles"]
    assert f"bundle: {bundle} (replay: fuzz replay {bundle})" in failure.text
    summary = (out / "summary.md").read_text()
    assert summary.startswith("## family-certify: FAIL — 1 of 2 lanes")
    assert f"[bundle]({bundle}/README.md)" in summary and "**jamba / handoff** — finding:" in summary
    b = out / bundle
    validate(json.loads((b / "bundle.json").read_text()), "bundle")
    validate(json.loads((b / "report.json").read_text()), "report")
    assert "![where it fails: the finding's cell is marked](picture.svg)" in (b / "README.md").read_text()
    fp = json.loads((b / "bundle.json").read_text())["fingerprint"]
    (marked,) = [i for i in ids(b / "picture.svg") if i.startswith("marked:")]
    assert marked.startswith(f"marked:{fp['phase']}:")  # the finding's cell, in its mode's panel
    assert run_cli("fuzz", "replay", str(b)).returncode == 1


@pytest.mark.llama
def test_aggregate_fails_closed_on_a_missing_lane(tmp_path):
    for row in ("jamba", "mamba"):
        r = run_cli("family-certify", "run", row, "--lane", "load", "--out", str(tmp_path / row))
        assert r.returncode == 0, r.stdout + r.stderr
    plan = ["--row", "jamba", "--row", "mamba", "--lane", "load"]
    ok = run_cli("family-certify", "aggregate", str(tmp_path / "jamba"), str(tmp_path / "mamba"), *plan,
                 "--out", str(tmp_path / "all"))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert set(junit_cases(tmp_path / "all" / "junit.xml")) == {("jamba", "load"), ("mamba", "load")}
    bad = run_cli("family-certify", "aggregate", str(tmp_path / "jamba"), *plan, "--out", str(tmp_path / "half"))
    assert bad.returncode == 1 and "MISSING (planned, no shard reported them): mamba/load" in bad.stdout
    (failure,) = junit_cases(tmp_path / "half" / "junit.xml")[("mamba", "load")]
    assert failure.get("type") == "missing"
    assert "⛔" in (tmp_path / "half" / "summary.md").read_text()
    refused = run_cli("family-certify", "aggregate", str(tmp_path / "nothing-here"), *plan)
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1


def test_matrix_shards_cover_each_row_once():
    r = run_cli("family-certify", "matrix", "--tier", "1", "--shards", "4")
    assert r.returncode == 0, r.stderr
    shards = json.loads(r.stdout)["include"]
    assert [s["shard"] for s in shards] == [1, 2, 3, 4] and all(s["of"] == 4 for s in shards)
    rows = [row for s in shards for row in s["rows"].split()]
    tier1 = [x.key for x in load_manifest(ROOT / "family_tiers.toml").select(1) if x.runnable]
    assert sorted(rows) == sorted(tier1) and len(rows) == len(set(rows))


def _run(results):
    return {"results": results, "build": {"llama_cpp_commit": "0c1e57098bba43ac", "toolkit": "0.1.0"},
            "manifest": {"path": "family_tiers.toml", "sha256": "ab" * 32}, "target": "llama-cpp", "wall_s": 3.0,
            "totals": {}}


def test_junit_and_summary_say_each_status_their_way():
    run = _run([{"row": "a", "lane": "handoff", "status": "finding", "detail": "cuts 2: full hand-off differs",
                 "seconds": 1.0, "bundles": ["bundles/a/x"]},
                {"row": "a", "lane": "isolation", "status": "known", "detail": "DSA top-k ties", "seconds": 1.0},
                {"row": "b", "lane": "handoff", "status": "unsupported", "detail": "no split", "seconds": 0.0},
                {"row": "b", "lane": "prefix-cache", "status": "skipped", "detail": "no llama-server", "seconds": 0},
                {"row": "b", "lane": "isolation", "status": "missing", "detail": "planned", "seconds": 0.0}])
    cases = {(c.get("classname"), c.get("name")): c for c in ET.fromstring(junit_xml(run)).iter("testcase")}
    assert cases[("a", "handoff")][0].tag == "failure" and "bundle: bundles/a/x" in cases[("a", "handoff")][0].text
    assert cases[("a", "isolation")].find("properties/property").get("name") == "known"
    assert cases[("b", "handoff")][0].tag == "skipped" and "unsupported: no split" in cases[("b", "handoff")][0].get(
        "message")
    assert cases[("b", "isolation")][0].get("type") == "missing"
    suite = ET.fromstring(junit_xml(run))
    assert (suite.get("tests"), suite.get("failures"), suite.get("skipped")) == ("5", "2", "2")
    md = summary_md(run)
    assert "FAIL — 2 of 5 lanes" in md and "[bundle](bundles/a/x/README.md)" in md
    assert "- skipped: b / prefix-cache: no llama-server" in md and "DSA top-k ties" in md
    # lanes in the manifest's order: isolation, handoff, prefix-cache
    assert "| a | 🟣 | ❌ |  |" in md and "| b | ⛔ | ⚪ | ➖ |" in md


def test_durations_refresh_from_runs_what_they_ran(tmp_path):
    """`durations RUN... --into FILE`: each row × lane the runs ran takes its seconds (the later run wins), a skipped
    or missing lane keeps its old entry, entries no run reports stay; the file is one `matrix --shards` reads."""
    from fuzz.certify.outputs import run_report, write_outputs

    into = tmp_path / "durations.json"
    into.write_text(json.dumps({"schema": 1, "seconds": {"qwen3/load": 1.0, "qwen3/handoff": 9.0,
                                                         "mamba/load": 4.0, "glm4/load": 5.0}}))

    def run(name, lanes, wall):
        results = [{"row": row, "lane": lane, "status": status, "seconds": s, "detail": ""}
                   for row, lane, status, s in lanes]
        rep = run_report(results, plan=[(row, [lane]) for row, lane, _, _ in lanes],
                         manifest={"path": "family_tiers.toml", "sha256": "ab" * 32}, target="llama-cpp",
                         llama_cpp_commit=None, wall_s=wall, command=f"family-certify run {name}",
                         build={"llama_cpp_commit": "0c1e57098bba43ac", "toolkit": "0.1.0"})
        write_outputs(tmp_path / name, rep)
        return tmp_path / name

    first = run("a", [("qwen3", "load", "pass", 2.0), ("qwen3", "handoff", "skipped", 0.0),
                      ("mamba", "load", "pass", 3.25)], 6.0)
    second = run("b", [("mamba", "load", "finding", 7.5), ("qwen2", "load", "pass", 0.5),
                       ("glm4", "load", "missing", 0.0)], 9.0)
    r = run_cli("family-certify", "durations", str(first), str(second / "report.json"), "--into", str(into))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "3 row/lane durations measured (2 changed, 1 new), 5 in all" in r.stdout
    data = json.loads(into.read_text())
    assert data["seconds"] == {"qwen3/load": 2.0, "qwen3/handoff": 9.0, "mamba/load": 7.5, "glm4/load": 5.0,
                               "qwen2/load": 0.5}
    assert data["note"].startswith("3 measured by `family-certify durations` from `family-certify run a` (3 lanes, "
                                   "wall 6 s); `family-certify run b` (3 lanes, wall 9 s)")
    assert "; the other 2 kept from before; rows or lanes missing" in data["note"]  # (the file had no note)
    shards = run_cli("family-certify", "matrix", "--tier", "1", "--shards", "1", "--durations", str(into))
    assert shards.returncode == 0, shards.stderr
    (only,) = json.loads(shards.stdout)["include"]
    assert only["seconds"] > 7.5 + 2.0 + 9.0  # qwen3 and its lanes as measured, the other rows by lane medians
    for args in ([str(tmp_path / "nowhere")], [str(run("c", [("qwen3", "load", "skipped", 0.0)], 1.0))]):
        bad = run_cli("family-certify", "durations", *args, "--into", str(into))
        assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    assert json.loads(into.read_text()) == data  # refused: the file as it was


@pytest.mark.parametrize("build, says", [
    ({"spec": "pypi:0.3.35", "llama_cpp_commit": None, "tree_sha256": "ab800e59bbfc48c6" + "0" * 48},
     "llama.cpp commit unknown (build `pypi:0.3.35`, tree `ab800e59bbfc`), family-certify"),
    ({"spec": "pinned", "llama_cpp_commit": "0c1e57098bba" + "0" * 28,
      "patches": {"files": ["0001-x.patch"], "sha256": "5" * 64}},
     f"llama.cpp `0c1e57098bba{'0' * 28}` (build `pinned`, patches 0001-x.patch `555555555555`), family-certify"),
    ({"spec": "pinned", "llama_cpp_commit": "0c1e57098bba" + "0" * 28},
     f"llama.cpp `0c1e57098bba{'0' * 28}`, family-certify"),
])
def test_a_bundle_readme_names_the_build_it_was_found_on(tmp_path, build, says):
    """A build without a git commit (an sdist) is "commit unknown" with its spec and tree, a patched build names its
    series: what `fuzz replay` rebuilds, in the words a reader of the bundle's README sees first."""
    from fuzz.engine.contract import FINDING, Finding, make_report
    from fuzz.repro.bundle import Shrunk, load_case, write_bundle

    case, fp = load_case(ROOT / "corpora" / "repros" / "jamba-handoff-2-full")
    finding = Finding("handoff", FINDING, "stage 1 logits differs", cuts=case.cuts, fingerprint=fp)
    data = {"arch": "jamba", "n_layer": 3, "config": case.config, "target": case.target}
    report = make_report("handoff", case.fixture, data, results=[{"status": FINDING}], findings=[finding])
    report.build = {**build, "toolkit": "0.1.0"}  # as recorded by the workers of that build
    made = write_bundle(tmp_path / "b", Shrunk(case, fp, report), original=case)
    assert says in (made / "README.md").read_text()


def test_summaries_name_a_build_without_a_commit():
    """A run's and a bump's summary name an sdist build (no git commit) by its spec and tree, not as `None`."""
    from fuzz.certify.bump import bump_md

    sdist = {"spec": "pypi:0.3.35", "llama_cpp_commit": None, "tree_sha256": "ab800e59bbfc" + "0" * 52,
             "toolkit": "0.1.0"}
    ok = [{"row": "a", "lane": "load", "status": "pass", "detail": "loads", "seconds": 1.0}]
    assert "\nllama.cpp `0c1e57098bba` · family-certify 0.1.0 · manifest" in summary_md(_run(ok))
    assert "\nllama.cpp commit unknown (build `pypi:0.3.35`, tree `ab800e59bbfc`) · family-certify 0.1.0" in \
        summary_md({**_run(ok), "build": sdist})
    rep = {"results": [{"row": "a", "lane": "load", "verdict": "unchanged", "base": "pass", "candidate": "pass",
                        "detail": "loads"}], "totals": {"unchanged": 1}, "build_s": {"base": 0, "candidate": 251},
           "wall_s": 9, "policy": "p",
           "base": {"spec": "pinned", "llama_cpp_commit": "0c1e57098bba43ac", "toolkit": "0.1.0"}, "candidate": sdist}
    assert "\nbase `pinned` (llama.cpp `0c1e57098bba`) → candidate `pypi:0.3.35` (llama.cpp commit unknown, tree " \
           "`ab800e59bbfc`)\n" in bump_md(rep)
