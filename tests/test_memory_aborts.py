"""Decodes the runtime cancels (llama.cpp's abort callback): the worker's `abort_after`, how memory programs draw and
judge them (each sequence must hold what its reported positions say), and their upstream reproducers. The model and
the drawer are tested without llama.cpp; against the pinned llama.cpp, an aborted coupled decode leaves a sequence
holding cells it never computed (an upstream defect), and a target that keeps its positions truthful passes."""

import numpy as np
import pytest

from fuzz.oracles.memory_model import (
    ABORT_NODES,
    Memory,
    MemoryConfig,
    Model,
    SeededDraws,
    check_program,
    draw_op,
    format_step,
    op_name,
    op_weights,
    precondition_problem,
)
from fuzz.repro.upstream_python import after_abort, memory_script
from synth.errors import UserError

KV = Memory(n_vocab=64, recurrent=False, swa=0, can_shift=True, n_rs_seq=0, aborts=True)
COUPLED = [{"op": "coupled", "seqs": [0, 1], "tokens": [39, 51, 7, 44], "abort": 5},
           {"op": "decode", "parts": [[0, [10]]]}]


def test_aborted_decodes_are_drawn_only_where_the_config_asks_and_the_target_takes_them():
    m = Model(3)
    m.decode(0, [1, 2, 3])
    assert op_weights(m, KV, MemoryConfig(aborts=True))["aborted"] > 0
    assert op_weights(m, KV, MemoryConfig())["aborted"] == 0  # (every other config's programs drawn as before)
    cannot = Memory(n_vocab=64, recurrent=False, swa=0, can_shift=True, n_rs_seq=0)  # hello without abort_after
    assert op_weights(m, cannot, MemoryConfig(aborts=True))["aborted"] == 0
    rng = np.random.default_rng(0)
    ops = [draw_op(SeededDraws(rng), Model(3), KV, MemoryConfig(aborts=True), True, "aborted") for _ in range(200)]
    assert {op["op"] for op in ops} == {"decode", "coupled"}
    assert all(1 <= op["abort"] <= ABORT_NODES for op in ops)
    assert min(op["abort"] for op in ops) == 1 and max(op["abort"] for op in ops) > 12  # early and anywhere


def test_an_aborted_decode_is_named_checked_and_left_out_of_the_precondition_walk():
    assert format_step(COUPLED[0]) == "decode s0+s1×4 (one token in each, aborted at graph node 5)"
    assert format_step({"op": "decode", "parts": [[2, [1, 2]]], "abort": 11}) == \
        "decode s2×2, aborted at graph node 11"
    assert op_name(COUPLED[0]) == "coupled aborted" and op_name(COUPLED[1]) == "decode"
    assert check_program(COUPLED, 3) == COUPLED
    for bad in ({"op": "rm", "seq": 0, "p0": -1, "p1": -1, "abort": 3}, {**COUPLED[1], "abort": 0},
                {**COUPLED[1], "abort": "5"}):
        with pytest.raises(UserError, match="only a decode is aborted"):
            check_program([bad], 3)
    # (what an aborted decode keeps only the run knows: the walk does not count it as done)
    later = [{"op": "decode", "parts": [[0, [7, 8]]], "abort": 2}, {"op": "coupled", "seqs": [0, 1], "tokens": [3]}]
    assert precondition_problem(later, KV, MemoryConfig(), True) is None
    assert "histories differ" in precondition_problem([{**later[0], "abort": None}, later[1]], KV, MemoryConfig(), True)


def test_the_reproducer_of_an_aborted_decode_goes_on_where_the_sequence_says_it_ends():
    """A logits finding whose program ends with an aborted decode and one decode of the failing sequence: its
    repro.py asks the memory where that sequence ends and continues there, against what it says it holds decoded
    alone — so a fix that drops the sequence whole (it reports nothing) passes, as the oracle judges it."""
    load = ("load", {"n_ctx": 1024, "n_seq_max": 4, "kv_unified": True})
    steps = [load, ("decode", {"tokens": [56], "pos": [0], "seq": 0, "logits": "last"}),
             ("decode", {"tokens": [41, 39], "pos": [1, 2], "seq": [0, 0], "abort_after": 11,
                         "logits": [False, True]}),
             ("decode", {"tokens": [21], "pos": [3], "seq": [0], "logits": [True]})]
    run = {"steps": steps, "problem": {"check": "logits", "seq": 0, "max_abs_dlogit": 1.6},
           "reference": [("load", {"n_ctx": 256}), ("decode", {"tokens": [56, 41, 39, 21], "pos": [0, 1, 2, 3],
                                                               "seq": 0, "logits": "last"})],
           "tol": 0.1, "kv_unified": True, "commit": "0" * 40}
    assert after_abort(run) == (2, [[0, 56], [1, 41], [2, 39]])
    script = memory_script(run, {"spec": {"family": "mamba"}, "fingerprint": {"phase": "unified-kv"},
                                 "config": {"program": []}})
    compile(script, "repro.py", "exec")
    assert "aborted_decode(ctx, tokens=[41, 39], pos=[1, 2], seqs=[[0], [0]], abort_after=11)" in script
    assert "end = positions(ctx, 0)[1]" in script
    assert "held = [(p, t) for p, t in [[0, 56], [1, 41], [2, 39]] if p <= end]" in script
    assert "pos=[3]" not in script  # (the last decode's positions follow what the memory reports)
    # anything else after the abort (a shift, another sequence): the steps as they ran
    shifted = {**run, "steps": [*steps[:3], ("seq_add", {"seq": 0, "p0": 0, "p1": -1, "delta": 2}), steps[3]]}
    assert after_abort(shifted) is None


@pytest.mark.llama
def test_the_worker_aborts_a_decode_at_the_node_asked_and_clears_its_callback_after(fixtures):
    from targets import open_target

    t = open_target("llama-cpp")
    try:
        assert t.hello().data["abort_after"] is True
        assert t.load(str(fixtures("llama", layers=2)), n_seq_max=2).ok
        r = t.call("decode", tokens=[1, 2, 3], seq=0, abort_after=1)
        assert not r.ok and r.failure.error_kind == "aborted" and "returned 2" in r.failure.message
        assert t.call("seq_pos", seqs=[0]).data["pos"]["0"] == [-1, -1]  # (its only ubatch: nothing kept)
        assert t.call("decode", tokens=[1, 2, 3], seq=0).ok  # (no callback left behind)
        assert t.call("decode", tokens=[4], seq=0, abort_after=1_000_000).ok  # (it ends before that call)
        bad = t.call("decode", tokens=[5], seq=0, abort_after=-1)
        assert bad.failure.error_kind == "bad_request"
    finally:
        t.close()


@pytest.mark.llama
def test_an_aborted_coupled_decode_is_the_upstream_defect_and_a_truthful_memory_passes(fixtures):
    """On the pinned build the aborted coupled decode leaves one sequence holding cells it never computed: a logits
    finding after 2 operations. A target that, after each aborted decode, removes what it did not finish from every
    sequence (as the fix does) passes; so does one that drops such sequences whole (they report nothing)."""
    from fuzz.engine.parity import context_params
    from fuzz.oracles.memory_machine import run_program
    from fuzz.oracles.memory_recompute import Recompute
    from targets import open_target

    fixture = fixtures("llama", layers=2)
    t, ref = open_target("llama-cpp"), open_target("llama-cpp")
    real = t.call
    mend = None

    def truthful(op, **args):
        before = real("seq_pos", seqs=[0, 1]).data["pos"] if op == "decode" and args.get("abort_after") else None
        r = real(op, **args)
        if before is not None and mend and r.failure is not None and r.failure.error_kind == "aborted":
            for s in (0, 1):
                real("seq_rm", seq=s, p0=-1 if mend == "whole" else before[str(s)][1] + 1, p1=-1)
        return r

    t.call = truthful
    try:
        recompute = Recompute(ref, fixture, context_params(n_seq=1, capture=False))
        done, problem, _ = run_program(t, fixture, MemoryConfig(), True, recompute, COUPLED, None)
        assert problem is not None and problem["check"] == "logits" and len(done) == 2, problem
        for mend in ("tail", "whole"):
            done, problem, mach = run_program(t, fixture, MemoryConfig(), True, recompute, COUPLED, None)
            assert problem is None and mach.refused["aborted"] == 1, (mend, problem)
    finally:
        t.close()
        ref.close()
