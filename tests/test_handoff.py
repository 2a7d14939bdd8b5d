"""fuzz handoff: every Foundation family hands state across every stage boundary of a period sweep, at every
prompt offset, bit-exact; the B1 mutant is caught exactly at the attention-first stages."""

import json
import sys
from pathlib import Path

import pytest

from fuzz.oracles.handoff import Handoff
from fuzz.oracles.handoff_state import HandoffConfig, split_schedule
from synth.errors import UserError
from synth.inspect import inspect_file

from conftest import run_cli

pytestmark = pytest.mark.llama

FOUNDATION = [("llama", {"layers": 4}), ("qwen2", {"layers": 4}), ("qwen3", {"layers": 4}), ("mamba", {"layers": 4}),
              ("mamba2", {"layers": 4}), ("falcon-h1", {"layers": 4})] + \
             [(f, {"layers": 8, "period": 4}) for f in ("jamba", "granitehybrid", "lfm2", "qwen3next", "kimi-linear")]


def handoff(path, **cfg):
    return Handoff(path, HandoffConfig(prompt_len=8, tokens=3, **cfg)).run()


@pytest.mark.parametrize("family,knobs", FOUNDATION, ids=[f for f, _ in FOUNDATION])
def test_every_offset_and_stage_hands_off_exactly(fixtures, family, knobs):
    rep = handoff(fixtures(family, **knobs), cuts="period" if "period" in knobs else "all")
    assert rep["config"]["modes"] == ["full", "partial", "busy"]  # busy: into a context with a live sequence
    assert rep["summary"]["pass"] == len(rep["results"]), rep["results"]
    for r in rep["results"]:
        assert r["offsets"] == 7 + 2  # prompt offsets 1..7 and two decode steps
        for b in r["bytes"]:
            # a stage with recurrent layers carries recurrent bytes — also when its first layer is attention
            assert (b["recurrent_bytes"] > 0) == (b["recurrent_layers"] > 0), b
            if b["attention_layers"]:
                assert b["kv_bytes_per_token"] >= b["kv_row_bytes"] > 0, b
            else:
                assert b["kv_bytes_per_token"] is None


@pytest.mark.parametrize("mutant,status,says", [
    # makes room for an import by clearing the whole context: the live sequence breaks at its first step after it
    # (position 12: prompt 11, one token decoded)
    ("import-clears-context", "finding", "busy hand-off at t=1: the live sequence 0 beside the import changes: "
                                         "stage 0 boundary differs from its own uninterrupted run at position 12"),
    # rolls back with seq_rm(-1, ...): the live sequence's positions go too, and llama.cpp refuses its next step
    ("rollback-all-sequences", "crash", "busy hand-off at t=1: target refused: llama_decode returned -1")])
def test_what_only_a_busy_context_shows_is_caught(fixtures, mutant, status, says):
    """Two mutants that are right alone in a context — into a fresh context (full), or rolled back alone (partial:
    on a dense model it imports nothing) — and wrong beside a live sequence: only the busy mode catches them."""
    path = fixtures("llama", layers=4)
    quiet = handoff(path, cuts="all", modes=("full", "partial"), target=f"mutant:{mutant}")
    assert quiet["summary"]["pass"] == len(quiet["results"]) == 3
    rep = handoff(path, cuts="all", target=f"mutant:{mutant}")
    assert [r["status"] for r in rep["results"]] == [status] * 3
    for r in rep["results"]:
        assert r["mode"] == "busy" and r["offset"] == 1 and r["reason"].startswith(says), r
        assert status == "crash" or r["reproduced"] is True, r


def test_attention_first_stages_are_covered(fixtures):
    rep = handoff(fixtures("qwen3next", layers=8, period=4), cuts="period")
    firsts = {tuple(b["range"]): b["first_layer"] for r in rep["results"] for b in r["bytes"]}
    assert firsts[(3, 8)] == "attention" and rep["results"][2]["bytes"][1]["recurrent_bytes"] > 0


@pytest.mark.parametrize("family", ["qwen3next", "jamba", "kimi-linear", "lfm2"])
def test_b1_mutant_is_caught_at_the_right_cuts(fixtures, family):
    """The mutant probes only a stage's first layer for recurrent tensor names and drops recurrent state on import
    where it finds none: caught exactly at cuts whose stage starts on an attention layer — and at every cut for
    LFM2, whose short-conv layers the name probe cannot see (the seed: "never matches LFM2")."""
    path = fixtures(family, layers=8, period=4)
    rep = handoff(path, cuts="period", target="mutant:b1-first-layer-probe", modes=("full",))
    kinds = rep["kinds"]
    want = set(range(1, 5)) if family == "lfm2" else {c for c in range(1, 5) if kinds[c] == "A"}
    got = {r["cuts"][0] for r in rep["results"] if r["status"] == "finding"}
    assert got == want, [(r["cuts"], r["status"], r.get("reason")) for r in rep["results"]]
    for r in rep["results"]:
        if r["status"] == "finding":
            assert r["reproduced"] is True and r["mode"] == "full"
            assert r["stage"] == (0 if family == "lfm2" else 1)
            # traced node by node, the first difference is the recurrent (conv) state as the stage reads it
            name = r["node"]["name"]
            assert r["node"]["kind"] == "values" and ("cache_r_l" in name or "conv_states" in name), r["node"]


@pytest.mark.parametrize("family", ["deepseek32", "glm-dsa"])
def test_dsa_exports_carry_the_indexer_rows_and_b4_is_caught(fixtures, family):
    """DSA stages export their k_idx rows too: KV bytes per position cover K and indexer rows. The B4 mutant
    (k_idx rows zeroed in the export, sizes intact) passes the byte check and is caught by the continuation, at
    every cut, once a query's top-k is sparse (more keys than indexer_top_k). (glm-dsa's layer 3 shares layer 2's
    top-k: no cut there.)"""
    path = fixtures(family, layers=4, indexer_top_k=4)
    rep = handoff(path, cuts="1;2")
    assert rep["summary"]["pass"] == len(rep["results"]) == 2, rep["results"]
    for r in rep["results"]:
        for b in r["bytes"]:
            assert b["kv_bytes_per_token"] >= b["kv_row_bytes"] > 0
    info = inspect_file(str(path))
    k_only = sum(x.k_row_bytes + x.v_row_bytes for x in info.layers[:2])
    assert rep["results"][1]["bytes"][0]["kv_row_bytes"] > k_only  # the indexer rows are required, too
    bad = handoff(path, cuts="1;2", target="mutant:b4-kidx-not-exported", modes=("full",))
    assert [r["status"] for r in bad["results"]] == ["finding"] * 2, bad["results"]
    assert all(r["reproduced"] and r["position"] >= 4 for r in bad["results"]), bad["results"]  # 5+ keys
    for r in bad["results"]:  # the first difference: the indexer's key cache (64 wide), as the new key lands in it
        node = r["node"]
        assert node["name"].startswith("cache_k_l") and node["ne"][0] == 64 and "attn_inp_k_idxs" in node["srcs"]


@pytest.mark.parametrize("family,knobs", [("jamba", {"layers": 8, "period": 4}), ("mamba2", {"layers": 4})])
def test_a_rollback_that_zeroes_recurrent_state_is_caught_and_traced(fixtures, family, knobs):
    """The rollback-zeroed mutant restores positions but not values on a partial import: the partial mode catches
    it at every cut, and node by node the first difference is the recurrent state cache it reads."""
    rep = handoff(fixtures(family, **knobs), cuts="all" if family == "mamba2" else "period",
                  target="mutant:rollback-zeroed", modes=("partial",))
    assert rep["results"] and all(r["status"] == "finding" and r["mode"] == "partial" and r["reproduced"]
                                  for r in rep["results"]), rep["results"]
    for r in rep["results"]:
        assert r["node"]["kind"] == "values" and r["node"]["name"].startswith("cache_r_l"), r["node"]


def test_split_schedule_splits_chunks_at_the_offset():
    steps, k = split_schedule(list(range(10)), 7, 5, 2)
    assert [s.pos for s in steps[:k]] == [[0, 1, 2, 3, 4], [5, 6]]
    assert [s.pos for s in steps[k:]][:1] == [[7, 8, 9]]
    steps, k = split_schedule(list(range(10)), 11, 5, 3)  # after one decode step
    assert steps[k].pos == [11] and steps[k - 1].pos == [10]


def test_cli(fixtures, tmp_path):
    path = fixtures("lfm2", layers=8, period=4)
    r = run_cli("fuzz", "handoff", str(path), "--cuts", "3", "--prompt-len", "6", "--report", str(tmp_path / "h.json"))
    assert r.returncode == 0, r.stdout + r.stderr
    rep = json.loads((tmp_path / "h.json").read_text())
    assert rep["results"][0]["bytes"][1]["first_layer"] == "attention"
    r = run_cli("fuzz", "handoff", str(path), "--cuts", "3", "--target", "mutant:b1-first-layer-probe")
    assert r.returncode == 1 and "finding" in r.stdout
    bad = run_cli("fuzz", "handoff", str(path), "--modes", "sideways")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1


def clean_or_cell_order(r: dict) -> bool:
    """A cut's result on the pinned llama.cpp: a pass, or a full hand-off whose restored window sits in other cells
    (numerics, cause cell order, read from both exports) moving it no more than the bound its control measured."""
    return r["status"] == "pass" or (
        (r["status"], r["mode"], r["cause"]["kind"]) == ("numerics", "full", "cell order")
        and 0 < r["max_abs"] <= r["cause"]["bound"] == 4 * r["cause"]["control"])


def test_the_cell_order_excuse_is_bounded_by_its_control():
    """Numerics only when every cache holds the uninterrupted run's rows and the move stays within 4x what the same
    cells in another order move the uninterrupted run; a move of whole logits is never cell order."""
    from fuzz.oracles.handoff_state import order_verdict

    same = {"same": True, "detail": "the same rows"}
    assert order_verdict(same, 3e-3, 1e-3)["bound"] == 4e-3
    assert order_verdict(same, 7.0, 1e-3) is None
    assert order_verdict(same, 1e-6, 0.0) is None  # another order moves nothing: the order explains nothing
    assert order_verdict(same, 1e-6, None) is None  # no control: no excuse
    assert order_verdict({"same": False, "detail": "lost"}, 1e-6, 1e-3) is None
    assert order_verdict(None, 1e-6, 1e-3) is None


ISWA_ROWS = {"laguna": 4, "gemma2": 8, "gemma3": 8, "gemma3n": 8, "gemma4-a4b": 8, "gemma4-e4b": 8, "exaone-moe": 16,
             "cohere2": 16}  # the rows whose memory is llama_kv_cache_iswa (a full-attention cache, then the window's)
# every manifest row with sliding-window layers, and its window: the iSWA rows and those whose sliding window lives in
# another memory (deepseek4: llama_kv_cache_dsv4, dots3note: llama_kv_cache_dsa_iswa, lfm2-swa:
# llama_memory_hybrid_iswa), whose exports the window mutant below does not re-create (it rewrites the iSWA layout)
SWA_ROWS = {**ISWA_ROWS, "deepseek4": 8, "dots3note": 4, "lfm2-swa": 8}


def test_every_sliding_window_row_is_listed(tmp_path):
    from synth.gguf_io import GGUFFile
    from synth.make import write_fixture
    from synth.manifest import load_manifest

    from conftest import ROOT

    swa = {}
    for key, row in load_manifest(ROOT / "family_tiers.toml").rows.items():
        if row.runnable:
            write_fixture(row.spec(), tmp_path / f"{key}.gguf")
            info = inspect_file(str(tmp_path / f"{key}.gguf"))
            if any(x.swa for x in info.layers):
                swa[key] = GGUFFile(tmp_path / f"{key}.gguf").kv[f"{info.arch}.attention.sliding_window"]
    assert swa == SWA_ROWS


@pytest.mark.parametrize("row", sorted(ISWA_ROWS))
def test_an_export_that_masks_the_base_cache_by_the_window_is_caught_on_every_sliding_window_row(tmp_path, row):
    """mutant:swa-window-filters-base-export: the full-attention cache exported with the model's window, as a
    December 2026 build did (a hand-off keeps only the last n_swa positions of the global layers; the blob imports
    without an error). With a prompt past the window the unsplit model's hand-off is a finding on every row with
    sliding-window layers, its reason naming the positions the full-attention cache lost; the real llama.cpp is
    clean there (at most cell-order numerics within their measured bound)."""
    from synth.make import write_fixture
    from synth.manifest import load_manifest

    from conftest import ROOT

    path = tmp_path / f"{row}.gguf"
    write_fixture(load_manifest(ROOT / "family_tiers.toml").row(row).spec(), path)
    def run(target: str) -> dict:
        (res,) = Handoff(path, HandoffConfig(cuts="none", prompt_len=ISWA_ROWS[row] + 4, tokens=3, modes=("full",),
                                             target=target)).run()["results"]
        return res

    bad = run("mutant:swa-window-filters-base-export")
    assert bad["status"] == "finding" and bad["reproduced"] and bad["max_abs"] > 0.1, bad
    assert "the full-attention cache does not hold positions [0" in bad["reason"], bad["reason"]
    good = run("llama-cpp")
    assert clean_or_cell_order(good), good


@pytest.mark.parametrize("row", ["gemma3", "cohere2", "exaone-moe"])
def test_sliding_window_only_stages_hand_off_at_every_cut(tmp_path, row):
    """A stage holding only sliding-window layers exports no K/V rows in its non-partial state, only the cells'
    metadata llama.cpp's empty base cache still writes (12 bytes a position): not a finding (it was, at every cut).
    (A continuation may differ in bits where the imported window sits in other cells than the ring held it — the
    order attention sums them in: numerics, its cause read from both exports; on the portable build, with AVX2
    kernels, gemma3's full hand-offs do at every cut.)"""
    from synth.make import write_fixture
    from synth.manifest import load_manifest

    from conftest import ROOT

    path = tmp_path / f"{row}.gguf"
    write_fixture(load_manifest(ROOT / "family_tiers.toml").row(row).spec(), path)
    rep = handoff(path, cuts="all")
    assert rep["results"] and all(map(clean_or_cell_order, rep["results"])), rep["results"]
    swa_only = [b for r in rep["results"] for b in r["bytes"] if b["swa_layers"] and not b["attention_layers"]]
    assert swa_only and all(b["recurrent_bytes"] > 0 for b in swa_only)  # the window travels as partial state


def test_rows_in_a_stage_without_full_attention_are_caught():
    from types import SimpleNamespace

    from fuzz.oracles.handoff import Handoff
    from fuzz.oracles.handoff_state import CELL_META, HandoffResult, StageBytes

    def check(grow: int) -> str:
        res = HandoffResult(cuts=[2], stages=[[0, 2], [2, 6]], status="pass",
                            bytes=[StageBytes(range=[0, 2], first_layer="attention", recurrent_layers=0,
                                              attention_layers=0, swa_layers=2)])
        kv_first: dict = {}
        out = ""
        for t in (1, 2, 3):  # full = partial + 8 header bytes + `grow` a position
            out = out or Handoff._check_bytes(SimpleNamespace(_offsets=lambda: [1, 2, 3]), res,
                                              [(b"x" * (100 + t * (40 + grow) + 8), b"x" * (100 + t * 40))],
                                              [(108, 100)], t, kv_first)
        return out

    assert check(CELL_META) == ""
    assert "grows by 76 bytes per position" in check(CELL_META + 64)  # a 64-byte K row where none can be


def test_b5_an_export_that_assumes_uniform_kv_rows_is_caught(tmp_path):
    """The seed's B5: the export treats every attention layer as its first one's K/V width. laguna with 1 K/V head
    on layer 0 and 2 elsewhere: every stage holding both widths in one cache fails at the first offset (logits off
    by 3.3), localized to the key cache the import restored. The stage starting at 4 holds one width per cache:
    there the mutant's export is llama.cpp's own, and it moves only rounding, at t=5, where the pinned llama.cpp does
    too — the restored window in other cells. Its exports are not taken on trust: imported into llama.cpp they hold
    the same rows, llama.cpp continuing from them moves as little, and the cell-order control runs on llama.cpp — so
    there it is the same numerics as the real llama.cpp's, not a finding. The real llama.cpp: no finding."""
    from synth.make import write_fixture
    from synth.manifest import load_manifest

    from conftest import ROOT

    path = tmp_path / "laguna.gguf"
    write_fixture(load_manifest(ROOT / "family_tiers.toml").row("laguna").spec(), path)
    bad = handoff(path, cuts="period", period=4, target="mutant:b5-uniform-kv-rows", modes=("full",))
    assert [(r["cuts"], r["status"], r["offset"]) for r in bad["results"]] == [([1], "finding", 1), ([2], "finding", 1),
                                                                              ([3], "finding", 1), ([4], "numerics", 5)]
    assert all(r["node"]["name"].startswith("cache_k_l") and r["reproduced"] for r in bad["results"])
    assert all(r["max_abs"] > 1 for r in bad["results"][:3]) and bad["results"][3]["max_abs"] < 1e-4
    cells = bad["results"][3]["node"]["cells"]
    assert cells["same"] and cells["control_on"] == "llama-cpp" and cells["exports_checked"]["moved"] < 1e-4
    assert clean_or_cell_order(bad["results"][3])
    good = handoff(path, cuts="period", period=4)["results"]
    assert all(map(clean_or_cell_order, good)), good


WORKER = f'cmd:"{sys.executable}" -m targets.llama_cpp_worker'  # the unmodified worker, as another program
LIAR = f'cmd:"{sys.executable}" {Path(__file__).parent / "stashed_exports_worker.py"}'


def test_a_runtime_behind_cmd_gets_the_cell_order_excuse_from_a_trusted_control(tmp_path):
    """laguna's period cuts (sliding-window rows: the restored window sits in other cells of the ring) through the
    unmodified worker behind cmd:, as a user certifies their own runtime: exactly the built-in target's statuses —
    numerics, cause cell order — the control measured on the build's own llama.cpp worker and the target's exports
    checked there (imported and exported again: the same rows; llama.cpp continuing from them within the bound).
    Before, every target but the built-in one lost the excuse: a FINDING at every cut."""
    from synth.make import write_fixture
    from synth.manifest import load_manifest

    from conftest import ROOT

    path = tmp_path / "laguna.gguf"
    write_fixture(load_manifest(ROOT / "family_tiers.toml").row("laguna").spec(), path)
    built_in = handoff(path, cuts="period", period=4, modes=("full",))["results"]
    behind_cmd = handoff(path, cuts="period", period=4, modes=("full",), target=WORKER)["results"]
    assert [(r["cuts"], r["status"]) for r in behind_cmd] == [(r["cuts"], r["status"]) for r in built_in]
    assert {r["status"] for r in built_in} == {"numerics"} and all(map(clean_or_cell_order, behind_cmd))
    for a, b in zip(built_in, behind_cmd, strict=True):
        assert b["max_abs"] == a["max_abs"] and b["cause"]["control"] == a["cause"]["control"]
        cells = b["node"]["cells"]
        assert cells["control_on"] == "llama-cpp" and cells["exports_checked"]["moved"] == a["max_abs"]
        assert "control_on" not in a["node"]["cells"]  # (the built-in target's own control is the trusted one)


def test_exports_that_lie_do_not_excuse_themselves(tmp_path):
    """A runtime whose exports drop the K rows but whose imports restore what it kept (tests/stashed_exports_worker.py)
    hands off as cleanly as llama.cpp among its own processes, and its exports agree with each other — but llama.cpp
    continuing from its hand-off export moves the uninterrupted run by whole logits: a finding at every cut, the
    lie named."""
    from synth.make import write_fixture
    from synth.manifest import load_manifest

    from conftest import ROOT

    path = tmp_path / "laguna.gguf"
    write_fixture(load_manifest(ROOT / "family_tiers.toml").row("laguna").spec(), path)
    res = handoff(path, cuts="period", period=4, modes=("full",), target=LIAR)["results"]
    assert [(r["cuts"], r["status"], r["offset"]) for r in res] == [([c], "finding", 5) for c in (1, 2, 3, 4)]
    assert all("the target's exports do not bear out the same cells: llama-cpp continuing from the target's "
               "hand-off export moves the uninterrupted run by" in r["reason"] and r["reproduced"] for r in res)
    assert all(r["max_abs"] < 1e-4 for r in res)  # its own move: as small as llama.cpp's


@pytest.mark.parametrize("family,knobs", [("jamba", {"layers": 8, "period": 4}),
                                          ("qwen3next", {"layers": 8, "period": 4}), ("llama", {"layers": 4}),
                                          ("mamba2", {"layers": 4})])
def test_hand_offs_with_chunks_larger_than_a_ubatch(fixtures, family, knobs):
    """Prefill chunks of 5 rows split into ubatches of 3 and 2 inside every stage, on both sides of each hand-off."""
    rep = handoff(fixtures(family, **knobs), cuts="period" if "period" in knobs else "all", n_ubatch=3)
    assert rep["summary"]["pass"] == len(rep["results"]) and rep["config"]["n_ubatch"] == 3, rep["results"]


def test_a_restored_window_in_other_cells_is_numerics_a_lost_one_is_not(tmp_path, llama):
    """gemma3 unsplit, 32-token prompt: the full hand-off at t=9 moves logits by ~6e-6 at position 32 (the portable
    build's AVX2 kernels; with AVX-512 ones the first was at t=20). The
    exports just before that step hold the same K/V bits at the same positions in both contexts, only in other
    cells of the sliding-window ring: attention sums them in another order — numerics, with that cause (exit 0).
    A restore that lost or changed a window row would not compare equal: a finding."""
    from fuzz.oracles.handoff_state import same_cells
    from synth.make import write_fixture
    from synth.manifest import load_manifest

    from conftest import ROOT

    path = tmp_path / "gemma3.gguf"
    write_fixture(load_manifest(ROOT / "family_tiers.toml").row("gemma3").spec(), path)
    out = tmp_path / "h.json"
    r = run_cli("fuzz", "handoff", str(path), "--cuts", "none", "--prompt-len", "32", "--report", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    (res,) = json.loads(out.read_text())["results"]
    assert (res["status"], res["mode"], res["offset"], res["cause"]["kind"]) == ("numerics", "full", 9, "cell order")
    assert res["node"]["cells"]["same"] and res["node"]["cells"]["positions"] > 30
    assert clean_or_cell_order(res) and res["cause"]["control"] > 1e-5  # moved 6e-6; the control's bound 2e-3

    def export(prompt):
        assert llama.load(str(path), n_seq_max=2).ok
        assert llama.script([{"tokens": prompt, "seq": 0, "pos": list(range(len(prompt))), "logits": "last"}]).ok
        return llama.state_get(0).data["blob"]

    a = export(list(range(1, 21)))
    assert same_cells(a, export(list(range(1, 21))))["same"]
    other = same_cells(a, export([*range(1, 20), 33]))  # the last position holds another token's rows
    assert not other["same"] and other["changed"] == [19] and not other["lost"]
    shorter = same_cells(a, export(list(range(1, 20))))
    assert not shorter["same"] and shorter["lost"] == [19]
    # both exports' full-attention cache cut to the window alike (the export under test): still lost state
    from targets.kvstate import keep_cells

    windowed = keep_cells(a, 0, lambda p, top: top - p < 8)
    cut = same_cells(windowed, windowed, set(range(20)))
    assert not cut["same"] and cut["missing"] == list(range(12)) and "does not hold positions" in cut["detail"]
    assert same_cells(a, a, set(range(20)))["same"]


def test_hand_offs_one_either_side_of_the_constants_a_prefill_crosses(fixtures, tmp_path):
    """The tier-1 lane's third run: offsets at the ubatch size, the sliding window and a chunked delta-net's chunk
    size ±1 (qwen3next: gated delta-net chunks of 64; kimi-linear: KDA chunks of 16; laguna: a window of 4), the
    prompt prefilled in chunks of 64 so a single batch really reaches them."""
    from fuzz.oracles.handoff_state import structural_offsets
    from synth.make import write_fixture
    from synth.manifest import load_manifest

    from conftest import ROOT

    m = load_manifest(ROOT / "family_tiers.toml")
    got = {}
    for row in ("qwen3next", "kimi-linear", "laguna", "llama"):
        path = tmp_path / f"{row}.gguf"
        write_fixture(m.row(row).spec(), path)
        got[row] = structural_offsets(path, 16)
    assert got == {"qwen3next": [15, 16, 17, 63, 64, 65], "kimi-linear": [15, 16, 17],
                   "laguna": [3, 4, 5, 15, 16, 17], "llama": [15, 16, 17]}
    rep = Handoff(tmp_path / "qwen3next.gguf", HandoffConfig(cuts="period", period=4, offsets=(63, 64, 65),
                                                           prompt_len=67, tokens=3, chunk=64, n_ubatch=16)).run()
    assert rep["summary"]["pass"] == len(rep["results"]) == 4
    assert all(r["offsets"] == 3 + 2 for r in rep["results"])  # the three offsets and two decode steps
    with pytest.raises(UserError):
        handoff(tmp_path / "llama.gguf", offsets=(9,))  # past the prompt
