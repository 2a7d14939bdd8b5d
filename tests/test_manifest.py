"""family_tiers.toml: every seed row is present, validation errors are one line, moving a tier is one line."""

import json
import re
import shutil

import pytest

from synth.errors import UserError
from synth.manifest import load_manifest
from targets.builds import PINNED, sdist_files

from conftest import ROOT, run_cli

SEED_T1 = ["Qwen3 dense", "Qwen2", "Llama", "GLM-4.7 Flash", "GLM4 9B", "DeepSeek2", "DeepSeek3", "Qwen3-MoE",
           "Qwen3-VL-MoE", "MiniMax M2.7", "Jamba", "Kimi Linear", "Qwen3Next", "Mamba", "Mamba2", "RWKV6", "RWKV7",
           "Falcon-H1", "Granite-Hybrid", "LFM2", "Laguna S 2.1"]
SEED_T2_ROWS = ["Qwen2-VL / Qwen3-VL", "Gemma2 / Gemma3 / Gemma3n / Gemma4 A4B / Gemma4 E4B", "Phi2 / Phi3 / PhiMoE",
                "Granite (dense)", "Hunyuan-Dense / -MoE / -VL", "Falcon (dense)", "InternLM2", "OLMo / OLMo2 / OLMoE",
                "Mistral3", "Qwen2-MoE", "EXAONE / EXAONE4 / EXAONE-MoE", "Cohere2", "Qwen3.5 recurrent",
                "SmolLM3 / MiniCPM / MiniCPM3 / Plamo3", "DeepSeek-OCR"]
SEED_T3 = ["GPT2", "Bloom", "GPT-NeoX", "MPT", "CodeShell", "OpenELM", "Refact", "StableLM", "PLM", "Arcee", "Deci",
           "ChatGLM", "Baichuan", "Granite-MoE", "SmallThinker", "Maincoder", "XVerse", "StarCoder2"]


def test_every_seed_row_is_present():
    m = load_manifest(ROOT / "family_tiers.toml")
    names = {r.name: r for r in m.rows.values()}
    assert [r.tier for n in SEED_T1 for r in [names[n]]] == [1] * len(SEED_T1)
    assert [names[n].tier for n in SEED_T3] == [3] * len(SEED_T3)
    covered = {r.seed_row or r.name for r in m.rows.values() if r.tier == 2}
    assert set(SEED_T2_ROWS) <= covered
    assert len(m.rows) == 76 and all(r.runnable for r in m.rows.values())
    # the seed's own words, not invented ones
    assert names["Kimi Linear"].size == "12.1 GB" and "B1 canonical case" in names["Kimi Linear"].why
    assert names["Gemma4 A4B"].size == "22.6 GB" and names["Gemma4 A4B"].artifact == "Q6_K"


def test_tier_defaults_and_hybrid_sweeps():
    m = load_manifest(ROOT / "family_tiers.toml")
    assert m.row("qwen3next").lanes == ["load", "parity", "boundary-sweep", "dtype", "wire", "isolation", "memory",
                                        "shift", "handoff", "determinism", "prefix-cache", "prompt-trees"]
    assert m.row("qwen3next").dtypes == ["f16", "bf16", "q8_0", "q4_0", "mxfp4", "q4_k", "q6_k", "iq2_xxs"]
    assert m.row("qwen3next").wires == ["f16", "bf16", "q8_0"]
    assert m.row("gemma3").dtypes == [] and m.row("gemma3").wires == []
    assert "boundary-sweep" not in m.row("qwen3").lanes  # the tier's sweep is for interleaved layer kinds
    assert m.row("gpt2").expect["skippy"].startswith("rejects")
    assert m.row("gemma3").lanes == ["load", "fixed-split", "shift"]


def test_artifact_dtypes_name_the_models_weight_type():
    """What the scan's dtype lane quantizes a row without dtypes of its own as: its artifact's type."""
    m = load_manifest(ROOT / "family_tiers.toml")
    got = {k: m.row(k).artifact_dtypes() for k in ("llama", "qwen3", "qwen3vlmoe", "minimax-m2", "deepseek-ocr",
                                                   "hunyuan-moe", "qwen3next", "gemma4-a4b", "olmo", "exaone-moe")}
    assert got == {"llama": ["q4_k"], "qwen3": ["q8_0"], "qwen3vlmoe": ["mxfp4"], "minimax-m2": ["q2_k"],
                   "deepseek-ocr": ["q8_0"], "hunyuan-moe": ["iq2_xxs"], "qwen3next": ["iq2_xs"],
                   "gemma4-a4b": ["q6_k"], "olmo": ["f16"], "exaone-moe": []}


def test_moving_a_family_between_tiers_is_one_line(tmp_path):
    src = (ROOT / "family_tiers.toml").read_text()
    moved = re.sub(r"(\[family\.qwen35\]\ntier = )2", r"\g<1>1", src)
    assert moved != src
    path = tmp_path / "family_tiers.toml"
    path.write_text(moved)
    r = load_manifest(path).row("qwen35")
    assert r.tier == 1 and "handoff" in r.lanes and "boundary-sweep" in r.lanes
    out = run_cli("family-certify", "check", str(path), "--json")
    assert out.returncode == 0
    assert {x["name"]: x["tier"] for x in json.loads(out.stdout)["rows"]}["qwen35"] == 1


@pytest.mark.parametrize("edit,words", [
    (lambda s: s.replace('[family.mamba]\ntier = 1', '[family.mamba]\ntier = 4'), ["[family.mamba]", "tier"]),
    (lambda s: s.replace('[family.mamba]\ntier = 1', '[family.mamba]\ntier = 1\ncolour = "red"'),
     ["[family.mamba]", "unknown key 'colour'"]),
    (lambda s: s.replace('recipe = { family = "mamba", layers = 6 }', 'recipe = { family = "mambo" }'),
     ["[family.mamba]", "unknown family 'mambo'"]),
    (lambda s: s + '\n[family.mamba]\ntier = 1\n', ["duplicate family"]),
    (lambda s: s.replace('recipe = { family = "mamba", layers = 6 }', 'recipe = { family = "mamba", period = 4 }'),
     ["[family.mamba]", "--period"]),
    (lambda s: s.replace('arch = "mamba"\n', 'arch = "mamba2"\n', 1), ["[family.mamba]", "arch"]),
    (lambda s: s.replace("schema = 1", "schema = 2"), ["schema"]),
    (lambda s: s.replace('lanes = ["load", "reject"]', 'lanes = ["load", "vibes"]'), ["unknown lane 'vibes'"]),
    (lambda s: s.replace("[tiers.3]", "[tiers.7]"), ["tiers.7", "out of range"]),
    (lambda s: s + "\n[family.broken\n", ["not valid TOML"]),
])
def test_bad_manifests_are_one_line_errors(tmp_path, edit, words):
    path = tmp_path / "family_tiers.toml"
    path.write_text(edit((ROOT / "family_tiers.toml").read_text()))
    with pytest.raises(UserError) as e:
        load_manifest(path)
    assert "\n" not in str(e.value)
    for w in words:
        assert w in str(e.value), str(e.value)
    r = run_cli("family-certify", "check", str(path))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1


def test_check_json_and_matrix():
    rows = json.loads(run_cli("family-certify", "check", "--json").stdout)["rows"]
    assert {"name", "tier", "arch", "runnable", "reason"} <= set(rows[0])
    matrix = json.loads(run_cli("family-certify", "matrix", "--tier", "3").stdout)["include"]
    assert len(matrix) == 18 and all(m["tier"] == 3 for m in matrix)


def test_make_row_equals_make_with_the_recipe(tmp_path):
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    assert run_cli("synth", "make", "--row", "lfm2", "-o", str(a)).returncode == 0
    assert run_cli("synth", "make", "lfm2", "--layers", "9", "--period", "3", "-o", str(b)).returncode == 0
    assert a.read_bytes() == b.read_bytes()
    r = run_cli("synth", "make", "--row", "nosuchrow", "-o", str(a))
    assert r.returncode == 2 and "no row" in r.stderr


def test_every_lane_the_manifest_names_has_one_runner():
    """The lane table (fuzz/certify/lanes.py) and the manifest's lanes (the battery's and the scan's) are the same
    names: a lane added to one and not the other fails here, not as a KeyError mid-run."""
    from fuzz.certify.lanes import LANE_RUNNERS
    from synth.manifest import LANES, SCAN_LANES

    assert set(LANE_RUNNERS) == set(LANES) | set(SCAN_LANES)
    assert len(LANE_RUNNERS) == 19


@pytest.mark.llama
def test_run_lanes_for_a_row(tmp_path):
    shutil.copy(ROOT / "family_tiers.toml", tmp_path)
    r = run_cli("family-certify", "run", "mamba", "lfm2", "--lane", "load", "--lane", "parity",
                "--lane", "boundary-sweep", "--report", str(tmp_path / "r.json"), cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    res = json.loads((tmp_path / "r.json").read_text())["results"]
    assert {(x["row"], x["lane"], x["status"]) for x in res} == {
        ("mamba", "load", "pass"), ("mamba", "parity", "pass"),
        ("lfm2", "load", "pass"), ("lfm2", "parity", "pass"), ("lfm2", "boundary-sweep", "pass")}


@pytest.mark.llama
def test_a_row_that_raises_in_its_process_stops_the_run(tmp_path):
    """Rows at a time run in processes: an error one raises (here: its fixture cannot be written, its directory is a
    file) is raised in the caller once the row beside it finished, and no other row starts. (Rows start longest
    first: the failing one is the first to start, and one row runs beside it.)"""
    from fuzz.certify.battery import _as_is, run_rows
    from fuzz.certify.lanes import LaneOptions
    from fuzz.certify.shards import longest_first

    m = load_manifest(ROOT / "family_tiers.toml")
    told = []
    (tmp_path / "a-file").write_text("not a directory")
    keys = ["mamba", "lfm2", "llama", "qwen3", "qwen2", "rwkv6"]
    first, beside, *rest = longest_first([(k, ["parity"]) for k in keys])
    tasks = [(m.row(k), ["parity"], "llama-cpp", tmp_path / "a-file" if i == first else tmp_path, LaneOptions())
             for i, k in enumerate(keys)]
    with pytest.raises(OSError):
        run_rows(tasks, 2, _as_is, lambda i, res: told.append((i, res.lane, res.status)))
    assert {i for i, _, _ in told} <= {beside}, told  # the row that was running beside it
    assert not [keys[i] for i in rest if (tmp_path / f"{keys[i]}.gguf").exists()]


@pytest.mark.llama
def test_rows_run_two_at_a_time_report_in_plan_order(tmp_path):
    """--jobs 2: two rows at a time (lines as lanes finish), the same results as one at a time, the report in the
    plan's order; --jobs 0 is refused in one line."""
    shutil.copy(ROOT / "family_tiers.toml", tmp_path)
    lanes = ["--lane", "load", "--lane", "parity", "--lane", "handoff"]
    got = {}
    for jobs in ("1", "2"):
        r = run_cli("family-certify", "run", "mamba", "lfm2", "llama", *lanes, "--jobs", jobs,
                    "--report", str(tmp_path / f"r{jobs}.json"), cwd=tmp_path)
        assert r.returncode == 0, r.stdout + r.stderr
        got[jobs] = [(x["row"], x["lane"], x["status"]) for x in
                     json.loads((tmp_path / f"r{jobs}.json").read_text())["results"]]
        # a line per lane, also from rows run in processes of their own
        lines = sorted(tuple(line.split()[i] for i in (0, 3, 4)) for line in r.stdout.splitlines()
                       if re.match(r"\S+ +tier 1  ", line))
        assert lines == sorted((row, lane, "PASS") for row, lane, _ in got[jobs]), r.stdout
    assert got["2"] == got["1"] == [(row, lane, "pass") for row in ("mamba", "lfm2", "llama")
                                    for lane in ("load", "parity", "handoff")]
    bad = run_cli("family-certify", "run", "mamba", "--jobs", "0", cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines()[-1].endswith("--jobs 0: must be 1..64"), bad.stderr


@pytest.mark.llama
def test_a_bump_runs_two_rows_at_a_time_too(tmp_path):
    """family-certify bump --jobs 2 (the canary's shards on 2-core runners): each build's battery two rows at a time,
    verdicts in the plan's order; the pinned build against itself changes nothing. --jobs 0 is refused in one line."""
    shutil.copy(ROOT / "family_tiers.toml", tmp_path)
    r = run_cli("family-certify", "bump", "mamba", "lfm2", "llama", "--candidate", "pinned", "--lane", "load",
                "--lane", "parity", "--jobs", "2", "--report", str(tmp_path / "bump.json"), "--out",
                str(tmp_path / "out"), cwd=tmp_path, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    rep = json.loads((tmp_path / "bump.json").read_text())
    for which in ("base", "candidate"):  # each build's certificate, as run --out writes one
        cert = json.loads((tmp_path / "out" / which / "certificate.json").read_text())
        assert sorted(cert["architectures"]) == ["lfm2", "llama", "mamba"], which
    assert [(x["row"], x["lane"], x["verdict"]) for x in rep["results"]] == \
        [(row, lane, "unchanged") for row in ("mamba", "lfm2", "llama") for lane in ("load", "parity")] + \
        [(row, "cross-build", "unchanged") for row in ("mamba", "lfm2", "llama")]
    bad = run_cli("family-certify", "bump", "mamba", "--candidate", "pinned", "--jobs", "0", cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines()[-1].endswith("--jobs 0: must be 1..64"), bad.stderr


@pytest.mark.llama
def test_reject_lane_checks_each_targets_expectation(llama, fixtures):
    from fuzz.certify.lanes import lane_reject

    row = load_manifest(ROOT / "family_tiers.toml").row("gpt2")
    path = fixtures("gpt2")
    assert lane_reject(row, path, llama, "llama-cpp").status == "pass"  # upstream keeps every arch: loads
    row.expect["llama-cpp"] = "rejects: unsupported family"  # what skippy must do: llama.cpp does not
    res = lane_reject(row, path, llama, "llama-cpp")
    assert res.status == "finding" and "expected a clean 'unsupported family' error" in res.detail


ROWS = list(load_manifest(ROOT / "family_tiers.toml").rows.values())


@pytest.mark.llama
@pytest.mark.parametrize("row", [r for r in ROWS if r.runnable], ids=[r.key for r in ROWS if r.runnable])
def test_every_rows_fixture_loads_and_decodes(llama, tmp_path, row):
    from synth.make import write_fixture

    path = tmp_path / f"{row.key}.gguf"
    assert write_fixture(row.spec(), path) <= 1 << 20
    loaded = llama.load(str(path))
    assert loaded.ok, loaded.failure
    assert loaded.data["arch"] == row.arch
    out = llama.generate([1, 7, 3, 12, 5, 9, 2, 30], 32, chunk=5)
    assert out.ok, out.failure
    import numpy as np

    assert np.isfinite(out.data["logits"]).all() and len(set(out.data["tokens"])) >= 2


def test_every_mutant_has_a_catching_lane_in_the_manifest():
    from fuzz.certify.commands import CATCHERS
    from targets.mutants import MUTANTS

    assert set(CATCHERS) == set(MUTANTS)
    m = load_manifest(ROOT / "family_tiers.toml")
    for row, lane in CATCHERS.values():
        assert lane in m.row(row).lanes, (row, lane)


def test_mutants_bad_options_are_one_line_errors():
    """(The mutants themselves are caught by the mutants job's workflow test, which runs `family-certify mutants`.)"""
    for args in (["--mutant", "nope"], ["--jobs", "0"]):
        bad = run_cli("family-certify", "mutants", *args)
        assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, (args, bad.stderr)


def test_scan_lanes_outside_the_scan_are_one_line_errors():
    r = run_cli("family-certify", "scan", "--lane", "prefix-cache", "qwen3")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "'prefix-cache'" in r.stderr and "wire-all" in r.stderr, r.stderr


def test_every_architecture_the_pinned_tree_knows_is_classified(tmp_path):
    """Every name in the pinned tree's LLM_ARCH_NAMES has a row or a [not_split_served] line; a tree with one more
    architecture (tests/data/patches/new-architecture applied to a copy of the file) fails `check --tree` with one
    line naming it, exit 1; a directory that is no llama.cpp tree is bad input."""
    import subprocess

    from targets.builds import resolve

    m = load_manifest()
    names = resolve("pinned", from_env=False).arch_names()
    assert len(names) == 153 and "jamba" in names and "(unknown)" not in names
    assert m.unclassified(names) == [] and len(m.not_split_served) == 81
    tree = tmp_path / "tree"
    (tree / "src").mkdir(parents=True)
    for name, data in zip(("llama-arch.cpp", "llama-arch.h"),
                          sdist_files(PINNED, ("src/llama-arch.cpp", "src/llama-arch.h")), strict=True):
        (tree / "src" / name).write_bytes(data)
    patch = ROOT / "tests" / "data" / "patches" / "new-architecture" / "0001-add-an-architecture.patch"
    r = run_cli("family-certify", "check", "--tree", str(tree))
    assert r.returncode == 0 and r.stdout.startswith(f"{tree}: all 153 architectures classified (72 by rows, 81 not "
                                                     "split-served)"), r.stdout + r.stderr
    subprocess.run(["git", "apply", "-p1", str(patch)], cwd=tree, check=True)
    r = run_cli("family-certify", "check", "--tree", str(tree))
    assert r.returncode == 1 and r.stdout.strip().splitlines() == [
        "unclassified architecture split-probe: llama.cpp knows it and family_tiers.toml neither has a row for it nor "
        "lists it under [not_split_served]; add one or the other"], r.stdout
    r = run_cli("family-certify", "check", "--tree", str(tmp_path / "nothing"))
    assert r.returncode == 2 and "no src/llama-arch.cpp" in r.stderr


def test_not_split_served_is_checked(tmp_path):
    text = (ROOT / "family_tiers.toml").read_text()
    for extra, words in (('\n[not_split_served]\njamba = "x"\n', "'jamba' is also a row's arch"),
                         ('\n[not_split_served]\nfoo = 3\n', "one line per architecture")):
        (tmp_path / "m.toml").write_text(text.split("\n[not_split_served]\n")[0] + extra)
        with pytest.raises(UserError, match=words):
            load_manifest(tmp_path / "m.toml")


def test_every_lane_runs_in_one_ci_job():
    """[jobs] names the CI job of every lane once: per bump the gate (the split) and the server job (llama-server's
    schedules) side by side, repeat-determinism, the quantized-weight splits and the deep drawn prompt trees
    nightly."""
    from synth.manifest import LANES

    m = load_manifest(ROOT / "family_tiers.toml")
    assert sorted(lane for ls in m.jobs.values() for lane in ls) == sorted(LANES)
    assert m.jobs["server"] == ["prefix-cache"] and set(m.jobs["nightly"]) == {"determinism", "dtype", "prompt-trees"}
    assert {"parity", "boundary-sweep", "handoff", "wire", "isolation"} <= set(m.jobs["gate"])
    assert m.jobs["memory"] == ["memory", "shift"]
    assert m.job_lanes(["gate", "memory", "server"]) == set(LANES) - {"determinism", "dtype", "prompt-trees"}
    assert m.job_lanes(None) is None
    with pytest.raises(UserError, match="--job 'gpu': .*jobs are gate, memory, server, nightly"):
        m.job_lanes(["gpu"])


@pytest.mark.parametrize("jobs, words", [
    ('gate = ["load", "parity"]\nserver = ["parity"]', "lane 'parity' is in 'gate' and 'server'"),
    ('gate = ["load"]', "is in no job"),
    ('gate = ["lode"]', "unknown lane 'lode'"),
    ('gate = "load"', "lanes must be a list"),
])
def test_a_broken_jobs_table_is_one_line(tmp_path, jobs, words):
    text = (ROOT / "family_tiers.toml").read_text()
    start = text.index("\n[jobs]\n")
    end = text.index("\n\n", start + 1)
    (tmp_path / "m.toml").write_text(text[:start] + "\n[jobs]\n" + jobs + text[end:])
    with pytest.raises(UserError, match=re.escape(words) if "'" in words else words):
        load_manifest(tmp_path / "m.toml")


def test_the_ci_matrix_and_run_follow_the_jobs():
    """`matrix --job gate --job memory --job server --shards 2`: each job its own shards, every entry naming its job,
    the server job without the row that has no llama-server lane; a job no row of the tier has yields no entry, and
    `run` of it says it skipped (exit 0) without starting anything; an unknown job is bad input (exit 2, one line)."""
    r = run_cli("family-certify", "matrix", "--tier", "1", "--job", "gate", "--job", "memory", "--job", "server",
                "--shards", "2")
    include = json.loads(r.stdout)["include"]
    assert [(e["job"], e["shard"], e["of"]) for e in include] == [
        ("gate", 1, 2), ("gate", 2, 2), ("memory", 1, 2), ("memory", 2, 2), ("server", 1, 2), ("server", 2, 2)]
    rows = {job: [x for e in include if e["job"] == job for x in e["rows"].split()] for job in ("gate", "memory",
                                                                                               "server")}
    assert len(rows["gate"]) == 22 and sorted(rows["memory"]) == sorted(rows["gate"])
    assert sorted(rows["server"]) == sorted(set(rows["gate"]) - {"llama-wide-vocab"})
    r = run_cli("family-certify", "matrix", "--tier", "1", "--job", "nightly")
    assert {e["lanes"] for e in json.loads(r.stdout)["include"]} == {"dtype,determinism,prompt-trees",
                                                                     "dtype,determinism"}  # (no server lane)
    r = run_cli("family-certify", "matrix", "--tier", "2", "--job", "server", "--shards", "2")
    assert json.loads(r.stdout) == {"include": []}
    r = run_cli("family-certify", "run", "--tier", "2", "--job", "server")
    assert r.returncode == 0 and r.stdout.strip() == \
        "skipped: no selected row has a lane of --job server: nothing to run"
    r = run_cli("family-certify", "run", "qwen3", "--job", "gpu")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "--job 'gpu'" in r.stderr, r.stderr
