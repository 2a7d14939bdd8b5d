"""`fuzz campaign`: case i is a function of (seed, i); a campaign finds a mutant's bug, bundles each fingerprint
once, resumes where it stopped without bundling anything twice; shards split the cases and merge."""

import json

import numpy as np
import pytest

from fuzz.certify.schemas import validate
from fuzz.repro.campaign import case_config, merge, parse_budget, parse_shard
from synth.errors import UserError
from synth.strategies import random_spec

from conftest import run_cli


def test_budgets_and_shards_parse_or_are_refused():
    assert [parse_budget(x) for x in ("90", "90s", "10m", "1h30m", "1.5")] == [90, 90, 600, 5400, 1.5]
    assert parse_shard("1/4") == (1, 4)
    for bad in ("", "ten", "5x"):
        with pytest.raises(UserError):
            parse_budget(bad)
    for bad in ("4/4", "1", "a/b"):
        with pytest.raises(UserError):
            parse_shard(bad)


def test_a_case_is_a_function_of_seed_and_index():
    draw = [random_spec(np.random.Generator(np.random.PCG64([7, i])), None, 8) for i in range(30)]
    again = [random_spec(np.random.Generator(np.random.PCG64([7, i])), None, 8) for i in range(30)]
    assert draw == again and sum(s is not None for s in draw) >= 27
    assert len({s.family for s in draw if s}) >= 8  # spread over the families


def test_radix_cases_draw_both_kv_layouts_and_every_lane_plan():
    """A campaign's radix cases run llama-server's two layouts (one KV cache per slot, one for all slots: its default
    without -np), every plan of the lane on the fixed tree and prompt trees drawn per schedule (a count of them)
    with the host prompt cache on and off, each case the same from its (seed, index)."""
    cases = [case_config("radix", np.random.Generator(np.random.PCG64([7, i])), 4, "llama-cpp", 0) for i in range(40)]
    assert cases == [case_config("radix", np.random.Generator(np.random.PCG64([7, i])), 4, "llama-cpp", 0)
                     for i in range(40)]
    assert {c.kv_unified for c in cases} == {False, True}
    fixed = [c for c in cases if c.tree == "fixed"]
    drawn = [c for c in cases if c.tree == "drawn"]
    assert len({c.plan for c in fixed}) == 3 and {c.target for c in cases} == {"llama-server"}
    assert drawn and all(c.schedules == 4 and not c.plan for c in drawn)
    assert {c.cache_ram for c in drawn} == {64, 0} and {c.cache_ram for c in fixed} == {64}


@pytest.mark.llama
def test_a_campaign_finds_bundles_once_and_resumes(tmp_path):
    out = tmp_path / "c"
    args = ["campaign", "--out", str(out), "--family", "jamba", "--oracle", "handoff", "--target",
            "mutant:b1-first-layer-probe", "--budget", "10m"]
    first = run_cli("fuzz", *args, "--cases", "6")
    assert first.returncode == 1, first.stdout + first.stderr
    st = json.loads((out / "campaign.json").read_text())
    validate(st, "campaign")
    assert st["cases"] == 6 and st["findings"], st
    keys = [json.dumps(f["key"], sort_keys=True) for f in st["findings"]]
    assert len(keys) == len(set(keys))
    bundles = sorted(p.name for p in (out / "bundles").iterdir())
    assert len(bundles) == len(st["findings"])
    assert run_cli("fuzz", "replay", str(out / st["findings"][0]["bundle"])).returncode == 1
    second = run_cli("fuzz", *args, "--cases", "4")
    st2 = json.loads((out / "campaign.json").read_text())
    assert st2["cases"] == 10 and st2["case_ids"][:6] == st["case_ids"] and min(st2["case_ids"][6:]) > \
        max(st["case_ids"])  # continued after the last case, never re-ran one
    keys2 = [json.dumps(f["key"], sort_keys=True) for f in st2["findings"]]
    assert keys2[:len(keys)] == keys and len(keys2) == len(set(keys2))
    assert len(list((out / "bundles").iterdir())) == len(st2["findings"])  # nothing bundled twice
    assert "Findings (" in (out / "summary.md").read_text() and second.returncode == 1
    other = run_cli("fuzz", "campaign", "--out", str(out), "--seed", "3", "--cases", "1")
    assert other.returncode == 2 and "other parameters" in other.stderr and len(other.stderr.splitlines()) == 1


@pytest.mark.llama
def test_shards_split_the_cases_and_merge(tmp_path):
    dirs = []
    for i in range(2):
        d = tmp_path / f"s{i}"
        r = run_cli("fuzz", "campaign", "--out", str(d), "--shard", f"{i}/2", "--cases", "3", "--oracle", "sweep",
                    "--oracle", "isolation", "--budget", "10m")
        assert r.returncode == 0, r.stdout + r.stderr
        dirs.append(d)
    ids = [json.loads((d / "campaign.json").read_text())["case_ids"] for d in dirs]
    assert all(i % 2 == 0 for i in ids[0]) and all(i % 2 == 1 for i in ids[1])
    st = merge(tmp_path / "all", dirs)
    validate(json.loads((tmp_path / "all" / "campaign.json").read_text()), "campaign")
    assert st["cases"] == 6 and sorted(st["case_ids"]) == sorted(ids[0] + ids[1])
    with pytest.raises(UserError):
        merge(tmp_path / "twice", [dirs[0], dirs[0]])


@pytest.mark.llama
def test_a_campaign_counts_explained_numerics_apart_from_findings(tmp_path):
    """Seed 25's first wire case (llama, q4_0 weights, the f16 wire): a clear-margin token flip the wire oracle
    traces to a quantized matrix product re-quantizing the rounded rows — counted under numerics by its cause, not
    a finding, not bundled."""
    d = tmp_path / "c"
    r = run_cli("fuzz", "campaign", "--out", str(d), "--oracle", "wire", "--seed", "25", "--cases", "1",
                "--budget", "5m")
    assert r.returncode == 0, r.stdout + r.stderr
    st = json.loads((d / "campaign.json").read_text())
    validate(st, "campaign")
    assert (st["specs"], st["numerics"], st["findings"]) == ({"llama": 1}, {"wire requantization": 1}, [])
    assert "Numerics (differences explained by a traced cause, not findings): wire requantization 1" in \
        (d / "summary.md").read_text()
    assert not (d / "bundles").exists() or not any((d / "bundles").iterdir())


@pytest.mark.llama
def test_a_known_upstream_abort_is_known_under_any_layout_variant_and_cut(tmp_path):
    """Seed 0's first six kimi-linear isolation cases: two abort creating a context with one KV stream per sequence,
    with flash attention off and on — corpora/repros/kimi-linear-isolation-per-seq-kv (shrunk with it off). Matched
    by what the finding is (the family, the oracle, the layout, the assert it names), both are that known finding:
    the clean pinned build's campaign passes."""
    d = tmp_path / "c"
    r = run_cli("fuzz", "campaign", "--out", str(d), "--family", "kimi-linear", "--oracle", "isolation",
                "--cases", "6", "--budget", "5m")
    st = json.loads((d / "campaign.json").read_text())
    assert r.returncode == 0 and st["findings"] == [], r.stdout + r.stderr
    assert st["statuses"] == {"crash": 2, "pass": 4} and st["known"] == {"kimi-linear-isolation-per-seq-kv": 4}, st


def test_known_findings_match_by_assert_and_layout_not_by_the_shrunk_configuration():
    from fuzz.engine.contract import CRASH, FINDING, Finding
    from fuzz.repro.campaign import abort_of, known_repro, known_upstream

    known = known_upstream()
    where = "/tmp/pip-req-build-x/vendor/llama.cpp/ggml/src/ggml.c:2099: GGML_ASSERT(ggml_can_repeat(b, a)) failed"
    assert abort_of(where) == "ggml_can_repeat(b, a)"

    def crash(phase, message, **fp):
        return Finding("isolation", CRASH, message, phase=phase,
                       fingerprint={"oracle": fp.pop("oracle", "isolation"), "status": CRASH, "phase": phase, **fp})

    assert known_repro(known, "kimi-linear", crash("per-seq-kv-fa", where)) == "kimi-linear-isolation-per-seq-kv"
    assert known_repro(known, "kimi-linear", crash("per-seq-kv", where)) == "kimi-linear-isolation-per-seq-kv"
    # the handoff repro was shrunk at a recurrent cut: an attention cut aborting on the same check is it too
    assert known_repro(known, "kimi-linear", crash("busy", where, oracle="handoff", cut_kinds=["A"])) == \
        "kimi-linear-handoff-busy-ubatch-3"
    assert known_repro(known, "kimi-linear", crash("unified-kv", where)) is None  # another layout
    assert known_repro(known, "kimi-linear", crash("per-seq-kv", where.replace("can_repeat", "can_mul"))) is None
    assert known_repro(known, "jamba", crash("per-seq-kv", where)) is None  # another family
    # plm's abort with flash attention on, known from the determinism lane, reached by isolation's unified layout
    plm = "ggml/src/ggml.c:4014: GGML_ASSERT(a->ne[0] == b->ne[0]) failed"
    assert known_repro(known, "plm", crash("unified-kv-fa", plm)) == "plm-determinism-crash"
    leak = Finding("isolation", FINDING, "leak", phase="unified-kv-fa", seq=2,
                   fingerprint={"oracle": "isolation", "status": FINDING, "phase": "unified-kv-fa", "seq": 2})
    assert known_repro(known, "deepseek32", leak) == "deepseek32-isolation-unified-kv"
    assert known_repro(known, "deepseek32", Finding("isolation", FINDING, "x", fingerprint={
        "oracle": "isolation", "status": FINDING, "phase": "per-seq-kv"})) is None
    # an abort in code every family shares (llama-server's batch; its repro's scope "any"): known in any family, by
    # the check it names (its report's JSON-escaped quotes read as the abort printed them)
    drafts = ('server-context.cpp:508: GGML_ASSERT(add_ok && "batch must be large enough to hold the sampled and '
              'draft tokens") failed')
    for family in ("mamba", "rwkv7", "qwen3next"):
        assert known_repro(known, family, crash(None, drafts, oracle="server-options")) == \
            "server-spec-draft-batch-overflow"
    assert known_repro(known, "mamba", crash(None, drafts.replace("sampled", "drafted"), oracle="server-options")) \
        is None


def test_a_general_check_is_known_only_where_the_message_names_the_repros_configuration():
    """llama-server loading with --embeddings, mean pooling and a slot count that does not divide the ubatch aborts on
    a shape check every graph shares (corpora/repros/server-embeddings-mean-pooling-parallel, scope "any", names
    "--pooling mean"): known in any family where the message names mean pooling, never for the same check elsewhere."""
    from fuzz.engine.contract import CRASH, Finding
    from fuzz.repro.campaign import known_repro, known_upstream

    known = known_upstream()
    check = "ggml/src/ggml.c:3354: GGML_ASSERT(ggml_can_mul_mat(a, b)) failed"

    def crash(message):
        return Finding("server-options", CRASH, message,
                       fingerprint={"oracle": "server-options", "status": CRASH, "phase": None})

    loading = "llama-server aborted loading with -b 16 -ub 16 --embeddings --pooling mean: loading with 3 slots: "
    for family in ("llama", "qwen3", "mamba"):
        assert known_repro(known, family, crash(loading + check)) == "server-embeddings-mean-pooling-parallel"
    assert known_repro(known, "llama", crash(loading.replace("mean", "last") + check)) is None
    assert known_repro(known, "llama", crash("llama-server died during the requests: " + check)) is None
