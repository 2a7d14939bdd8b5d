"""The parity oracle (fuzz sweep): every cut of every Foundation family is bit-exact on the pinned llama.cpp,
and the oracle itself catches a wrong stage."""

import json

import numpy as np
import pytest

from fuzz.engine.parity import first_differing_node, node_key
from fuzz.engine.stages import cut_sets, pattern_period
from fuzz.oracles.sweep import Sweep
from fuzz.oracles.sweep_report import SweepConfig, format_report
from synth.errors import UserError
from synth.gguf_io import KV, read_all, write_gguf
from synth.stage import StageInfo, Unsupported, slice_model

from conftest import run_cli
from helpers import aborting_at_decode

pytestmark = pytest.mark.llama

FOUNDATION = [("llama", {"layers": 8}), ("qwen2", {"layers": 8}), ("qwen3", {"layers": 8}),
              ("mamba", {"layers": 8}), ("mamba2", {"layers": 8}), ("falcon-h1", {"layers": 8})] + \
             [(f, k) for f in ("jamba", "granitehybrid", "lfm2", "qwen3next", "kimi-linear")
              for k in ({"layers": 12, "period": 4}, {"layers": 9, "period": 3, "offset": 0})]


IDS = [f"{f}-{'-'.join(map(str, k.values()))}" for f, k in FOUNDATION]


@pytest.mark.parametrize("family,knobs", FOUNDATION, ids=IDS)
def test_every_cut_is_bit_exact(fixtures, family, knobs):
    rep = Sweep(fixtures(family, **knobs), SweepConfig(cuts="all", tokens=8)).run()
    assert rep.control["status"] == "pass"
    assert len(rep.results) == rep.n_layer - 1
    bad = [r.to_dict() for r in rep.results if r.status != "pass"]
    assert not bad, bad
    assert all(r.max_abs_dlogit == 0.0 and r.tokens_equal for r in rep.results)
    assert rep.exit_code == 0


def test_three_stage_chains_at_every_pair_of_cuts(fixtures):
    rep = Sweep(fixtures("qwen3next", layers=8, period=4), SweepConfig(cuts="all", stages=3, tokens=4)).run()
    assert len(rep.results) == 21  # C(7, 2)
    assert all(r.status == "pass" and len(r.stages) == 3 for r in rep.results), [r.to_dict() for r in rep.results]


def dropping_last_layer(src, dst, a, b) -> StageInfo:
    """A broken materializer: a non-final stage silently loses its last layer."""
    full = slice_model(src, dst, a, b)
    return full if b == full.n_layer_source or b - a < 2 else slice_model(src, dst, a, b - 1)


def test_a_stage_that_drops_a_layer_is_caught_and_localized(fixtures):
    rep = Sweep(fixtures("jamba", layers=8, period=4), SweepConfig(cuts="3;5", tokens=4),
                slicer=dropping_last_layer).run()
    assert [r.status for r in rep.results] == ["finding", "finding"]
    for r, cut in zip(rep.results, (3, 5), strict=True):
        assert r.phase == "prefill" and r.step == 0 and r.position == 0
        assert r.where == "boundary" and r.stage == 0
        assert r.reproduced is True
        assert r.layer == cut - 1  # the layer the broken stage lost
        assert r.max_abs_dlogit > 0
    assert rep.exit_code == 1


def swa_by_stage_index(src, dst, a, b) -> StageInfo:
    """A broken materializer: the sliding-window pattern follows the stage's layer index (3 sliding, 1 global)
    instead of the source layers' kinds — the naive slice of an index-derived pattern."""
    st = slice_model(src, dst, a, b)
    g, kv, tensors = read_all(dst)
    key = f"{g.arch}.attention.sliding_window_pattern"
    kv[key] = KV([i % 4 < 3 for i in range(st.n_layer)], kv[key].type, kv[key].sub_type)
    write_gguf(dst, g.arch, kv, tensors)
    return st


def test_a_wrong_layer_kind_is_localized_to_the_first_differing_graph_node(fixtures):
    """cohere2: sliding layers use RoPE, the global ones (every 4th) none. A stage from 1, 2 or 3 that takes
    source layer 3 for a sliding one is caught at layer 3, and inside it at the RoPE the full model does not
    apply; a cut at 4 is in phase and passes."""
    rep = Sweep(fixtures("cohere2", layers=8), SweepConfig(cuts="1;2;3;4", tokens=4), slicer=swa_by_stage_index).run()
    assert [r.status for r in rep.results] == ["finding"] * 3 + ["pass"]
    for r, cut in zip(rep.results, (1, 2, 3), strict=False):
        assert r.reproduced and r.layer == 3
        assert r.node["name"] == "Qcur" and r.node["ggml_op"] == "ROPE" and r.node["kind"] == "extra", r.node
        assert r.node["stage_layer"] == 3 - cut and r.node["same_before"] > 0
    assert "first node `Qcur-0` = ROPE(Qcur-0, inp_pos)" in format_report(rep)  # the cut at 3: stage layer 0


def test_the_first_differing_node_pairs_nodes_by_name_and_occurrence():
    def node(name, values, op="ADD", ne=(2, 1, 1, 1)):
        return {"name": name, "op": op, "type": 0, "ne": list(ne), "data": np.float32(values).tobytes()}

    full = [node("attn_norm-5", [1, 2]), node("Qcur-5", [3, 4]), node("Qcur-5", [5, 6], "ROPE")]
    assert first_differing_node(full, [node("attn_norm-2", [1, 2]), node("Qcur-2", [3, 4]),
                                       node("Qcur-2", [5, 6], "ROPE")]) is None
    d = first_differing_node(full, [node("attn_norm-2", [1, 2]), node("Qcur-2", [3, 4]),
                                    node("Qcur-2", [5, 6.5], "ROPE")])
    assert (d["name"], d["ggml_op"], d["kind"], d["same_before"], d["max_abs"]) == ("Qcur", "ROPE", "values", 2, 0.5)
    assert d["reference_node"] == "Qcur-5" and d["node"] == "Qcur-2"
    d = first_differing_node(full, [node("attn_norm-2", [1, 2], ne=(1, 2, 1, 1))])
    assert d["kind"] == "shape" and d["same_before"] == 0
    d = first_differing_node(full[:2], full)
    assert d["kind"] == "extra" and d["name"] == "Qcur"  # the second Qcur has no partner
    assert node_key("kq_soft_max-12") == "kq_soft_max"
    assert node_key("Qcur-3 (view) (permuted)") == "Qcur (view) (permuted)"
    assert node_key("inp_embd") is None


def test_period_cuts_cover_every_offset():
    assert cut_sets("period", 12, 2, 4) == [[1], [2], [3], [4]]
    assert pattern_period("RRRARRRARRRA") == 4 and pattern_period("AAAA") == 1
    assert cut_sets("3;5;2,6", 8, 2, 1) == [[3], [5], [2, 6]]
    assert len(cut_sets("all", 8, 3, 1)) == 21
    for bad in ("0", "8", "3,3", "x"):
        with pytest.raises(UserError):
            cut_sets(bad, 8, 2, 1)


def test_cli_sweep_report_and_exit_codes(fixtures, tmp_path):
    path = fixtures("lfm2", layers=8, period=4)
    out = tmp_path / "r.json"
    r = run_cli("fuzz", "sweep", str(path), "--cuts", "period", "--tokens", "4", "--report", str(out))
    assert r.returncode == 0, r.stderr
    rep = json.loads(out.read_text())
    assert rep["summary"]["pass"] == 4 and rep["config"]["period"] == 4
    assert {"cuts", "status", "stages", "max_abs_dlogit"} <= set(rep["results"][0])
    assert rep["llama_cpp_commit"].startswith("0c1e570")
    for args in (["--cuts", "9"], ["--stages", "1"], ["--phases", "warmup"]):
        bad = run_cli("fuzz", "sweep", str(path), *args)
        assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr


def test_a_stage_that_crashes_is_reported_and_the_pipeline_goes_on(fixtures, tmp_path):
    """Stage workers take (cut set, stage) tasks: one crashing stage is that cut set's finding, and the
    restarted worker serves the tasks after it (one worker doing everything, and three)."""
    def crashing_at_3_8(src, dst, a, b) -> StageInfo:
        st = slice_model(src, dst, a, b)
        if (a, b) == (3, 8):
            aborting_at_decode(dst, tmp_path / "abort.gguf").replace(dst)
        return st

    path = fixtures("llama", layers=8)
    for workers in (1, 3):
        rep = Sweep(path, SweepConfig(cuts="2;3;2,5;5", tokens=4, workers=workers), slicer=crashing_at_3_8).run()
        assert [r.status for r in rep.results] == ["pass", "crash", "pass", "pass"], [r.to_dict() for r in rep.results]
        crash = rep.results[1]
        assert crash.stage == 1 and crash.phase == "sequential" and "SIGABRT" in crash.reason
        assert rep.config["workers"] == workers and rep.exit_code == 1


def test_an_unsupported_stage_is_reported_beside_passing_cuts(fixtures):
    def refusing_0_3(src, dst, a, b) -> StageInfo:
        if (a, b) == (0, 3):
            raise Unsupported("test: this range cannot be expressed")
        return slice_model(src, dst, a, b)

    rep = Sweep(fixtures("mamba2", layers=6), SweepConfig(cuts="3;2;4", tokens=4), slicer=refusing_0_3).run()
    assert [r.status for r in rep.results] == ["unsupported", "pass", "pass"]
    assert "stage 0:3" in rep.results[0].reason and rep.exit_code == 0


def test_an_engine_error_in_the_pipeline_is_raised_not_reported(fixtures):
    def broken(src, dst, a, b) -> StageInfo:
        raise RuntimeError("slicer bug")

    with pytest.raises(RuntimeError, match="slicer bug"):
        Sweep(fixtures("llama", layers=4), SweepConfig(cuts="2", tokens=2), slicer=broken).run()


@pytest.mark.parametrize("family", ["jamba", "qwen3next", "mamba2", "lfm2", "llama"])
def test_batches_of_hidden_states_larger_than_a_ubatch(fixtures, family):
    """A prefill chunk of 37 rows split by llama.cpp into ubatches of 16, 16 and 5 in every stage, and the batched
    phase's 3 × 12 rows too: recurrent and hybrid memory orders a multi-sequence batch's rows into ubatches by
    sequence (split_equal), so the worker puts captured rows back in batch order (from the logits llama.cpp
    returns in batch order) — before it did, every cut of these families failed in the batched phase."""
    knobs = {"layers": 8, "period": 4} if family in ("jamba", "qwen3next", "lfm2") else {"layers": 4}
    rep = Sweep(fixtures(family, **knobs), SweepConfig(cuts="all", tokens=4, prompt_len=40, chunk=37,
                                                       n_ubatch=16)).run()
    assert rep.exit_code == 0 and rep.summary["pass"] == len(rep.results), [r.to_dict() for r in rep.results]
    assert (rep.config["n_batch"], rep.config["n_ubatch"]) == (64, 16)


def test_batch_order_matches_rows_by_their_logits():
    import ctypes

    from targets.llama_cpp_worker import batch_order

    rows = [np.arange(4, dtype="<f4") + i for i in range(3)]  # batch order 0, 1, 2
    bufs = [ctypes.create_string_buffer(r.tobytes(), 16) for r in rows]
    ptrs = [ctypes.addressof(b) for b in bufs]
    ubatch = b"".join(rows[i].tobytes() for i in (2, 0, 1))  # the ubatches computed 2, 0, 1
    assert batch_order(ubatch, ptrs, 4) == [1, 2, 0]  # batch row 0 is ubatch row 1, ...
    assert batch_order(b"".join(r.tobytes() for r in rows), ptrs, 4) is None  # already in batch order
