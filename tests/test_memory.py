"""`fuzz memory`: drawn programs of memory operations over several sequences, each sequence checked against its own
history recomputed alone. The model and the drawer are pure (tested here without llama.cpp); against the pinned
llama.cpp, clean attention and recurrent models pass, every finding on a clean build is one of the committed
upstream repros (by its cause), and the two mutants no other lane sees are caught and shortened to 2 operations."""

import base64
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from fuzz.certify.corpus import fixture_for
from fuzz.certify.lanes import lane_memory
from fuzz.engine.contract import KNOWN, PASS, UNSUPPORTED
from fuzz.engine.fixtures import fixture_path, quant_head_fixture
from fuzz.oracles.memory import reduce_config, report
from fuzz.oracles.memory_configs import CAPACITY_CTX, PRESSURE_CTX, capacity_config, pressure_config, pressure_program
from fuzz.oracles.memory_controls import ORDER_ROUNDING, lineage, other_neighbours, without_neighbours
from fuzz.oracles.memory_model import (
    FILL_BATCH,
    Memory,
    MemoryConfig,
    Model,
    SeededDraws,
    check_positions,
    check_program,
    compare_logits,
    draw_op,
    final_decode,
    format_step,
    free_cells,
    overflows,
    precondition_problem,
    refuses_coupled,
    window_room,
)
from fuzz.oracles.memory_recompute import Recompute
from fuzz.oracles.registry import get_oracle
from fuzz.repro.campaign import known_repro, known_upstream
from synth.errors import UserError
from synth.manifest import load_manifest

from conftest import ROOT, run_cli

KV = Memory(n_vocab=64, recurrent=False, swa=0, can_shift=True, n_rs_seq=0)
RECURRENT = Memory(n_vocab=64, recurrent=True, swa=0, can_shift=True, n_rs_seq=4, kind="hybrid")
SWA = Memory(n_vocab=64, recurrent=False, swa=4, can_shift=True, n_rs_seq=0)
REPROS = ROOT / "corpora" / "repros"


# ---- the model (pure) ------------------------------------------------------------------------------------------
def test_a_truncation_of_decodes_is_the_shorter_decodes():
    m = Model(2)
    m.decode(0, [5, 6, 7])
    m.decode(0, [8, 9])
    m.rm(0, 3, -1)  # a rollback: the kept tokens, recomputed
    assert m.cells[0] == [0, 1, 2]
    assert m.log[0] == [["d", [[0, 5], [1, 6], [2, 7]]]]
    m.rm(0, 1, 2)  # a middle removal: replayed as it was done (the cells after it saw the removed one)
    assert m.cells[0] == [0, 2]
    assert m.log[0][-1] == ["rm", 1, 2]
    assert m.next_pos(0) == 3
    m.rm(0, -1, -1)
    assert m.cells[0] == [] and m.log[0] == [] and m.span(0) == (-1, -1)


def test_a_truncation_keeps_the_removals_between_the_kept_tokens():
    """laguna (window 4), one cache: decode 0..4, fork [1, -1) into another sequence, decode 5..9 there, roll every
    sequence back to 2. The fork keeps cell 1, computed beside position 0 and then head-removed; its recompute is
    0..1 decoded, 0 removed — not 5..9 decoded too, after which a fresh context's window cache has reused cell 1."""
    m = Model(3)
    m.decode(2, [3, 45, 13, 40, 2])
    m.cp(2, 0, 1, -1, shared=True)
    m.decode(0, [2, 61, 50, 47, 39])
    m.rm(-1, 2, -1)
    assert m.cells[0] == [1] and m.log[0] == [["d", [[0, 3], [1, 45]]], ["rm", 0, 1]]
    assert m.cells[2] == [0, 1] and m.log[2] == [["d", [[0, 3], [1, 45]]]]
    m.add(2, 1, -1, 3)  # shifted positions: a later truncation is replayed as the removal it is
    m.rm(2, 4, -1)
    assert m.log[2][-2:] == [["add", 1, -1, 3], ["rm", 4, -1]]


def test_fork_keep_shift_and_reload():
    m = Model(3)
    m.decode(0, [1, 2, 3, 4])
    m.cp(0, 1, 1, 3, shared=True)  # [1, 3): the log keeps what happened, then drops the rest
    assert m.cells[1] == [1, 2]
    assert m.log[1] == [["d", [[0, 1], [1, 2], [2, 3]]], ["rm", 0, 1]]  # the tail cut off: not decoded at all
    assert m.shares[0] == {1} and m.shares[1] == {0}
    m.add(0, 2, -1, -3)  # positions below 0 are dropped, as llama.cpp does
    assert sorted(m.cells[0]) == [0, 0, 1]
    m.div(0, -1, -1, 2)
    assert sorted(m.cells[0]) == [0, 0, 0]
    m.keep(1)
    assert m.live() == [1] and m.shares[1] == set()
    m.permute([2, 0, 1])
    assert m.live() == [0] and m.cells[0] == [1, 2]


def test_positions_as_each_memory_reports_them():
    m = Model(2)
    m.decode(0, [1, 2, 3])
    assert check_positions(m, KV, {"0": [0, 2], "1": [-1, -1]}) is None
    bad = check_positions(m, KV, {"0": [0, 2], "1": [0, 0]})
    assert bad["seq"] == 1 and "the model holds none" in bad["message"]
    assert check_positions(m, KV, {"0": [1, 2], "1": [-1, -1]})["seq"] == 0  # a plain cache keeps every cell
    assert check_positions(m, SWA, {"0": [1, 2], "1": [-1, -1]}) is None  # a window may have dropped the first
    assert check_positions(m, RECURRENT, {"0": [2, 2], "1": [-1, -1]}) is None  # one state cell: both its position
    assert check_positions(m, RECURRENT, {"0": [0, 2], "1": [-1, -1]})["seq"] == 0


def test_logits_within_the_tolerance():
    a = np.zeros(8, np.float32)
    assert compare_logits(a + 0.05, a, 0.1) == (pytest.approx(0.05), True)
    assert compare_logits(a + 0.5, a, 0.1)[1] is False


# ---- drawing programs (pure) -----------------------------------------------------------------------------------
def draw(mem: Memory, kv_unified: bool, seed: int, n: int = 300) -> list[dict]:
    rng, m, cfg, ops = SeededDraws(np.random.default_rng(seed)), Model(3), MemoryConfig(), []
    for _ in range(n):
        op = draw_op(rng, m, mem, cfg, kv_unified)
        ops.append(op)
        m.apply(op, shared=kv_unified or mem.recurrent)  # follow the program as the memory would accept it
    return ops


def test_drawing_is_seeded_and_covers_every_operation():
    assert draw(KV, True, 3) == draw(KV, True, 3)
    assert draw(KV, True, 3) != draw(KV, True, 4)
    kinds = {op["op"] for seed in range(3) for op in draw(KV, True, seed)}
    assert kinds == {"decode", "coupled", "rm", "cp", "keep", "add", "div", "copy_state", "refused_import", "reload"}
    spoiled = {op["how"] for seed in range(3) for op in draw(KV, True, seed) if op["op"] == "refused_import"}
    assert spoiled == {"cut", "width"}  # a state cut short, and one of a model of other widths
    decodes = [op for op in draw(KV, True, 0) if op["op"] == "decode"]
    assert any(len(op["parts"]) > 1 for op in decodes)  # several sequences per batch
    assert all(0 <= t < 64 for op in decodes for _, toks in op["parts"] for t in toks)


def test_state_moves_are_drawn_among_the_ways_the_target_offers():
    """A target that says it moves state through files and whole contexts (hello's state_via) gets copies through a
    file and whole-context reloads (their ids kept) drawn; one that says nothing gets only the default moves."""
    every = Memory(n_vocab=64, recurrent=False, swa=0, can_shift=True, n_rs_seq=0,
                   vias=("memory", "file", "context", "context-file"))
    ops = [op for seed in range(3) for op in draw(every, True, seed)]
    assert {op.get("via") for op in ops if op["op"] == "copy_state"} == {"memory", "file"}
    reloads = [op for op in ops if op["op"] == "reload"]
    assert {op.get("via", "sequences") for op in reloads} == {"sequences", "context", "context-file"}
    assert all(op["perm"] == [0, 1, 2] for op in reloads if "via" in op)
    plain = [op for seed in range(3) for op in draw(KV, True, seed)]
    assert not any("via" in op for op in plain)
    with pytest.raises(UserError, match="via 'file': reload moves state via sequences, context, context-file"):
        check_program([{"op": "reload", "perm": [0, 1, 2], "via": "file"}], 3)
    with pytest.raises(UserError, match="keeps every id"):
        check_program([{"op": "reload", "perm": [1, 0, 2], "via": "context"}], 3)


def test_drawing_keeps_to_the_apis_preconditions():
    # a fork across a per-sequence cache's streams copies whole sequences only (llama.cpp asserts otherwise)
    assert all(op["p0"] == op["p1"] == -1 for op in draw(KV, False, 1) if op["op"] == "cp")
    assert any(op["p0"] != -1 for op in draw(KV, True, 1) if op["op"] == "cp")
    # positions are not shifted under a sliding window; with a recurrent part (one position, its last token's) the
    # whole sequence moves, or its tail moves up
    assert not {"add", "div"} & {op["op"] for seed in range(3) for op in draw(SWA, True, seed)}
    rng, m, shifts = SeededDraws(np.random.default_rng(0)), Model(3), Counter()
    for _ in range(600):
        op = draw_op(rng, m, RECURRENT, MemoryConfig(), True)
        if op["op"] in ("add", "div"):
            whole = op["p0"] == m.span(op["seq"])[0]
            assert whole or (op["op"] == "add" and op["delta"] >= 0), op
            shifts[op["op"], whole] += 1
        m.apply(op, shared=True)
    assert shifts == {("add", True): 27, ("add", False): 17, ("div", True): 19}, shifts
    assert all(op["p0"] == op["p1"] == -1 for op in draw(RECURRENT, True, 2) if op["op"] == "cp")


def test_coupled_decodes_and_the_preconditions_a_given_program_must_keep():
    """A coupled decode (one token in several sequences: a shared prefix) is drawn for sequences whose histories are
    the same: to be taken in one unified cache, to be refused where the memory splits a batch sequence by sequence
    (a stream per sequence, a recurrent memory; drawn less often there); a given program that leaves the drawer's
    preconditions is refused."""
    recurrent = Memory(64, True, 0, True, 0, kind="recurrent")
    assert refuses_coupled(KV, False) and refuses_coupled(recurrent, True) and not refuses_coupled(KV, True)
    for mem, unified in ((KV, False), (recurrent, True)):
        ops = [op for seed in range(3) for op in draw(mem, unified, seed)]
        assert 0 < sum(op["op"] == "coupled" for op in ops) < sum(op["op"] == "decode" for op in ops) / 3
    m = Model(3)
    m.coupled([0, 2], [5, 6], shared=True)
    assert m.cells[0] == m.cells[2] == [0, 1] and m.shares[0] == {2} and m.log[0] == m.log[2]
    cfg = MemoryConfig()
    ok = [{"op": "coupled", "seqs": [0, 1], "tokens": [1, 2]}, {"op": "decode", "parts": [[2, [3]]]}]
    assert precondition_problem(ok, KV, cfg, True) is None
    diverged = ok + [{"op": "decode", "parts": [[0, [4]]]}, {"op": "decode", "parts": [[1, [5]]]},
                     {"op": "coupled", "seqs": [0, 1], "tokens": [6]}]
    assert "histories differ" in precondition_problem(diverged, KV, cfg, True)
    shifted = ok + [{"op": "add", "seq": 0, "p0": -1, "p1": -1, "delta": 2}]
    assert "shares since a fork" in precondition_problem(shifted, KV, cfg, True)


def test_a_recorded_program_is_checked_and_reduced():
    with pytest.raises(UserError, match="step 1"):
        check_program([{"op": "decode", "parts": [[0, [1]]]}, {"op": "explode"}], 3)
    with pytest.raises(UserError, match="sequence id"):
        check_program([{"op": "keep", "seq": 7}], 3)
    with pytest.raises(UserError, match="must be a list of operations"):
        check_program({"op": "keep", "seq": 0}, 3)
    assert check_program([], 3) == []  # (the contexts alone: a finding made creating one records no operation)
    prog = [{"op": "decode", "parts": [[0, [1, 2]]]}, {"op": "keep", "seq": 0},
            {"op": "decode", "parts": [[0, [3]]]}]
    assert [len(c["program"]) for c in reduce_config({"program": prog})] == [2, 2]  # the last (failing) one stays
    assert format_step(prog[0]) == "decode s0×2" and format_step(prog[1]) == "seq_keep s0"
    assert final_decode(SeededDraws(np.random.default_rng(0)), Model(2), KV)["parts"][0][0] == 0


def test_a_sequences_lineage_and_its_neighbours():
    """What the neighbour controls change: every decoded token outside the failing sequence's history (forks, state
    copies and reloads carry history between sequences), nothing in it."""
    prog = [{"op": "decode", "parts": [[0, [1, 2]], [1, [3]]]}, {"op": "cp", "src": 1, "dst": 2, "p0": -1, "p1": -1},
            {"op": "decode", "parts": [[0, [4]], [2, [5]]]}, {"op": "reload", "perm": [1, 0, 2]},
            {"op": "decode", "parts": [[1, [6]], [2, [7]]]}]
    assert lineage(prog, 2, 3) == {(0, 1), (2, 1), (4, 1)}  # 1's first decode, forked into 2
    assert lineage(prog, 1, 3) == {(0, 0), (2, 0), (4, 0)}  # sequence 0, reloaded as 1
    moved = other_neighbours(prog, lineage(prog, 2, 3), 64)
    assert [p for op in moved if op["op"] == "decode" for p in op["parts"]] == [
        [0, [34, 35]], [1, [3]], [0, [37]], [2, [5]], [1, [39]], [2, [7]]]
    assert without_neighbours(prog, lineage(prog, 2, 3)) == [
        {"op": "decode", "parts": [[1, [3]]]}, prog[1], {"op": "decode", "parts": [[2, [5]]]}, prog[3],
        {"op": "decode", "parts": [[2, [7]]]}]
    assert lineage([{"op": "decode", "parts": [[0, [1]]]}, {"op": "keep", "seq": 1}], 0, 2) == set()


def test_memory_findings_match_repros_by_cause_whatever_the_family():
    known = known_upstream()
    memory_repros = {x["repro"] for x in known if x["key"]["oracle"] == "memory"}
    assert memory_repros == {"llama-memory-seq-keep-per-stream", "llama-memory-div-lost-by-export",
                             "llama-memory-add-lost-by-export", "llama-memory-stream-copy-lost-by-export",
                             "lfm2-memory-rollback-stale-snapshot-26695", "lfm2-memory-rollback-moves-fork",
                             "qwen4exp-memory-qsa-shared-prefix", "qwen4exp-memory-qsa-block-tie",
                             "minimax-m3-memory-msa-dense-unified-kv", "minimax-m3-memory-msa-dense-coupled",
                             "glm4-memory-quantized-k-shift", "deepseek4-memory-quantized-coupled",
                             "llama-memory-quantized-k-undivided-head", "llama-memory-bf16-k-shift",
                             "qwen4exp-memory-qsa-block-tie-layout", "llama-memory-abort-coupled-keeps-cells",
                             "jamba-memory-abort-coupled-hybrid", "mamba-memory-abort-keeps-recurrent-tokens",
                             "llama-memory-abort-during-k-shift-add", "llama-memory-abort-during-k-shift-div",
                             "deepseek32-memory-shift-indexer-keys", "llama-memory-shift-yarn-magnitude",
                             "smollm3-memory-shift-nope-layers", "hunyuan-dense-memory-shift-k-norm-after-rope",
                             "hunyuan-moe-memory-shift-k-norm-after-rope", "deepseek-ocr-memory-shift-whole-head-rope",
                             "baichuan-memory-shift-alibi-keys-rotated", "maincoder-memory-shift-k-norm-after-rope",
                             "cohere2-memory-shift-nope-global-layers", "dots3note-memory-shift-indexer-keys",
                             "lfm2-swa-memory-shift-empty-graph-abort", "exaone-moe-memory-shift-nope-global-layers",
                             "minicpm3-memory-quantized-k-shift-null-rotation",
                             "lfm2-memory-refused-import-half-cleared"}
    # an arch's own behaviour (minimax-m3's sparse attention turning dense in a unified multi-sequence context)
    # names a cause (layout), but is that family's only: another family's finding of the same shape is no known one
    dense = next(x for x in known if x["repro"] == "minimax-m3-memory-msa-dense-unified-kv")
    assert dense["family_only"] and dense["key"]["cause"] == "layout"
    assert get_oracle("memory").known_key == ("status", "where", "op", "cause", "cause_op", "cause_then")

    class F:
        status = "finding"
        message = ""

        def __init__(self, **fp):
            self.fingerprint = {"oracle": "memory", "status": "finding", "phase": "unified-kv", **fp}

    keep = F(where="pos", op="keep", cause="layout", memory="kv-swa", ops=["decode", "keep"])
    assert known_repro(known, "gemma3", keep) == "llama-memory-seq-keep-per-stream"
    assert known_repro(known, "qwen35", F(where="logits", op="decode", cause="rollback")) == \
        "lfm2-memory-rollback-stale-snapshot-26695"
    layout_logits = F(where="logits", op="decode", cause="layout", memory="kv", ops=["decode"])
    assert known_repro(known, "minimax-m3", layout_logits) == "minimax-m3-memory-msa-dense-unified-kv"
    assert known_repro(known, "llama", layout_logits) is None
    # the same check and operation with no cause named (a mutant's, a new bug's) is no known one
    assert known_repro(known, "llama", F(where="pos", op="keep")) is None
    deferred = {"where": "logits", "op": "decode", "cause": "deferred"}
    assert known_repro(known, "llama", F(**deferred, cause_op="cp", cause_then="export")) == \
        "llama-memory-stream-copy-lost-by-export"
    assert known_repro(known, "llama", F(**deferred, cause_op="keep", cause_then="export")) is None
    # deferred work another shift ran before (two shifts before a decode: ggml-org/llama.cpp#3825), not an export
    assert known_repro(known, "qwen3", F(**deferred, cause_op="add", cause_then="export")) == \
        "llama-memory-add-lost-by-export"
    assert known_repro(known, "qwen3", F(**deferred, cause_op="add", cause_then="add")) is None
    # no control explained it: that repro only in its own family
    lfm2 = next(x for x in known if x["repro"] == "lfm2-memory-rollback-moves-fork")
    bare = [{**lfm2, "key": {k: v for k, v in lfm2["key"].items() if k != "cause"}}]
    f = F(**{k: v for k, v in lfm2["key"].items() if k not in ("cause", "oracle", "status", "phase")})
    assert known_repro(bare, "lfm2", f) == "lfm2-memory-rollback-moves-fork" and known_repro(bare, "llama", f) is None
    # a memory finding of scope "any" with the text it names (a hybrid's half-cleared sequence after a refused read):
    # in any family where the message names it, never for the same check and operation otherwise
    half = F(where="pos", op="refused_import", memory="hybrid", ops=["decode", "refused_import"])
    half.message = "sequence 2's state cut to 10 of 20 bytes, refused as 0, left 0 reporting positions [0, -1]: " \
                   "neither what it held ([0, 0]) nor empty"
    assert known_repro(known, "jamba", half) == "lfm2-memory-refused-import-half-cleared"
    half.message = "sequence 0 reports positions [0, -1], the model holds [0, 0]"
    assert known_repro(known, "jamba", half) is None
    # an abort of scope "any" (the KV cache's shift of a quantized cache): by the check it names, in any family and
    # either layout
    shift = F(status="crash", where="crash", op="decode", cause="cache-type", phase="per-seq-kv")
    shift.status, shift.message = "crash", "ggml/src/ggml-cpu/ops.cpp:321: not implemented"
    assert known_repro(known, "qwen3next", shift) == "glm4-memory-quantized-k-shift"


# ---- against the pinned llama.cpp ------------------------------------------------------------------------------
@pytest.mark.llama
@pytest.mark.parametrize("family,knobs", [("mamba2", {"layers": 3}), ("rwkv6", {"layers": 3})])
def test_clean_recurrent_memory_passes(fixtures, family, knobs):
    rep = report(fixtures(family, **knobs), MemoryConfig(programs=6))
    assert rep.status == PASS, [f.message for f in rep.findings]
    assert len(rep.results) == 12 and sum(r["checks"] for r in rep.results) > 100
    assert max(r["max_abs_dlogit"] for r in rep.results) < 1e-3
    assert sum(r["refused"].get("rm", 0) for r in rep.results) > 0  # rollbacks it cannot do, refused: checked


@pytest.mark.llama
def test_every_finding_on_clean_llama_cpp_is_a_known_upstream_one(fixtures):
    """llama, lfm2 (hybrid with rollback snapshots) and gemma3 (sliding window): each finding the drawn programs
    meet is shortened, explained by a control and one of the committed repros."""
    known = known_upstream()
    for family, knobs in (("llama", {"layers": 4}), ("lfm2", {"layers": 4}), ("gemma3", {"layers": 4})):
        rep = report(fixtures(family, **knobs), MemoryConfig(programs=8))
        assert rep.findings, family  # the upstream bugs are there on every one of these
        for f in rep.findings:
            assert f.reproduced and f.cause, (family, f.message)
            assert len(f.detail["program"]) <= 6, (family, f.detail["program"])
            assert known_repro(known, family, f), (family, f.fingerprint)


@pytest.mark.llama
def test_a_drawn_program_is_rerun_as_it_ran_its_refused_operations_not_counted_as_done(fixtures):
    """A partial removal a recurrent memory without rollback snapshots refuses leaves two sequences alike, so a
    coupled decode after it is valid. Given by hand, the program is refused (its walk counts the removal as done);
    re-run as the machine drew it (check=False: how a finding is reproduced and shortened), it runs through."""
    from fuzz.engine.parity import context_params
    from fuzz.oracles.memory_machine import run_program
    from targets import open_target

    fixture = fixtures("lfm2", layers=4)
    cfg = MemoryConfig(n_rs_seq=0)
    program = [{"op": "coupled", "seqs": [0, 1], "tokens": [1, 2, 3]}, {"op": "rm", "seq": 0, "p0": 1, "p1": -1},
               {"op": "coupled", "seqs": [0, 1], "tokens": [4]}]
    t, ref = open_target("llama-cpp"), open_target("llama-cpp")
    try:
        recompute = Recompute(ref, fixture, context_params(n_seq=1, capture=False, n_rs_seq=0))
        with pytest.raises(UserError, match="couples sequences whose histories differ"):
            run_program(t, fixture, cfg, True, recompute, program, None)
        done, problem, mach = run_program(t, fixture, cfg, True, recompute, program, None, check=False)
        assert problem is None and len(done) == 3 and mach.refused["rm"] == 1
    finally:
        t.close()
        ref.close()


@pytest.mark.llama
@pytest.mark.parametrize("family", ["mamba", "qwen3"])
def test_a_fork_copies_its_source_onto_itself_too_and_a_memory_that_takes_that_for_a_move_is_caught(fixtures, family):
    """Every fork is followed by seq_cp of its source onto itself, which every memory takes as a no-op (a runtime may
    ask it: upstream returns early); the same program on a target whose self-copy clears the sequence (as a recurrent
    memory without that early return does) fails at the fork."""
    from fuzz.engine.parity import context_params
    from fuzz.oracles.memory_machine import run_program
    from targets import open_target

    fixture = fixtures(family, layers=2)
    cfg = MemoryConfig()
    program = [{"op": "decode", "parts": [[0, [3, 1, 4]]]}, {"op": "cp", "src": 0, "dst": 1, "p0": -1, "p1": -1},
               {"op": "decode", "parts": [[0, [5]], [1, [9]]]}]
    t, ref = open_target("llama-cpp"), open_target("llama-cpp")
    calls = []
    real = t.call

    def spy(op, **args):
        calls.append((op, args.get("src"), args.get("dst")))
        if op == "seq_cp" and args.get("src") == args.get("dst") and clears:
            real("seq_rm", seq=args["src"], p0=-1, p1=-1)
        return real(op, **args)

    t.call = spy
    try:
        recompute = Recompute(ref, fixture, context_params(n_seq=1, capture=False))
        clears = False
        done, problem, _ = run_program(t, fixture, cfg, True, recompute, program, None)
        assert problem is None and len(done) == 3
        assert [c for c in calls if c[0] == "seq_cp"] == [("seq_cp", 0, 1), ("seq_cp", 0, 0)]
        clears = True
        done, problem, _ = run_program(t, fixture, cfg, True, recompute, program, None)
        assert problem is not None and len(done) == 2, (done, problem)
    finally:
        t.close()
        ref.close()


def test_a_recurrent_fork_is_drawn_onto_a_live_destination_too():
    """A recurrent memory's seq_cp replaces the destination's state, so a runtime need not clear it first: memory
    programs on a pure recurrent memory draw forks onto a live destination (no seq_rm before the copy), and only
    there (a KV cache's seq_cp adds the source's cells to the destination's own)."""
    def forks(kind):
        m = Model(3)
        m.decode(0, [3, 1, 4])
        m.decode(1, [2, 7])
        mem = Memory(n_vocab=64, recurrent=kind != "kv", swa=0, can_shift=True, n_rs_seq=0, kind=kind)
        draw = SeededDraws(np.random.Generator(np.random.PCG64(0)))
        return [draw_op(draw, m, mem, MemoryConfig(), True, "cp") for _ in range(40)]

    live = [op for op in forks("recurrent") if op.get("onto") == "live"]
    assert live and all(op["dst"] in (0, 1) for op in live)
    assert "onto its live state" in format_step(live[0])
    assert not any("onto" in op for kind in ("kv", "hybrid") for op in forks(kind))


@pytest.mark.llama
def test_a_recurrent_fork_onto_a_live_destination_replaces_its_state(fixtures):
    """seq_cp onto a sequence that holds a state, with no seq_rm first: the copy replaces it (upstream frees the
    destination's old cell); a memory that kept the destination's own state instead fails at its next decode."""
    from fuzz.engine.parity import context_params
    from fuzz.oracles.memory_machine import run_program
    from targets import open_target

    fixture = fixtures("mamba", layers=2)
    program = [{"op": "decode", "parts": [[0, [3, 1, 4]], [1, [2, 7]]]},
               {"op": "cp", "src": 1, "dst": 0, "p0": -1, "p1": -1, "onto": "live"},
               {"op": "decode", "parts": [[0, [5]], [1, [9]]]}]
    t, ref = open_target("llama-cpp"), open_target("llama-cpp")
    calls = []
    real = t.call

    def spy(op, **args):
        calls.append((op, args.get("seq", args.get("src")), args.get("dst")))
        if op == "seq_cp" and args.get("src") != args.get("dst") and ignores:
            return real("seq_pos", seq=args["src"])  # (the copy not made: the destination keeps its own state)
        return real(op, **args)

    t.call = spy
    try:
        recompute = Recompute(ref, fixture, context_params(n_seq=1, capture=False))
        ignores = False
        done, problem, _ = run_program(t, fixture, MemoryConfig(), True, recompute, program, None)
        assert problem is None and len(done) == 3
        assert ("seq_rm", 0, None) not in calls and ("seq_cp", 1, 0) in calls
        ignores = True
        done, problem, _ = run_program(t, fixture, MemoryConfig(), True, recompute, program, None)
        assert problem is not None and len(done) in (2, 3), (done, problem)
    finally:
        t.close()
        ref.close()


@pytest.mark.llama
def test_a_coupled_decode_a_memory_cannot_split_is_refused_and_changes_nothing(fixtures):
    """One token in two sequences, decoded where llama.cpp splits a batch sequence by sequence — a recurrent memory,
    or a KV cache with a stream per sequence: the decode fails, and both sequences go on as if it never came."""
    program = [{"op": "coupled", "seqs": [0, 1], "tokens": [3, 1]},
               {"op": "decode", "parts": [[0, [4, 1]], [1, [5]], [2, [7]]]},
               {"op": "coupled", "seqs": [1, 2], "tokens": [9]},
               {"op": "decode", "parts": [[2, [2, 6]], [1, [3]]]}]
    for family, layouts in (("mamba2", (True, False)), ("llama", (False,))):
        rep = report(fixtures(family, layers=2), MemoryConfig(program=program, kv_unified=layouts))
        assert rep.status == PASS, (family, [f.message for f in rep.findings])
        assert all(r["refused"].get("coupled") == 2 for r in rep.results), [r["refused"] for r in rep.results]
    # a memory that takes them anyway is held to them as to any decode: DeepSeek-V4's cache splits a coupled set
    # into ubatches of its own (llama-kv-cache-dsv4.cpp, split_seq), and each sequence goes on as recomputed alone
    rep = report(fixture_path("deepseek4"), MemoryConfig(program=program, kv_unified=(False,)))
    (row,) = rep.results
    # (taken, the first puts sequences 0 and 1 ahead of 2, so the second couples sequences no longer in line)
    assert (rep.status, row["refused"], row["checks"]) == (PASS, {"skipped": 1}, 7), row


@pytest.mark.llama
def test_a_state_cut_short_or_of_other_widths_is_refused_and_the_sequence_continues_empty(fixtures):
    """A sequence's state cut in half, and the same state claiming rows two bytes wider than the model's (a stage's
    peer of another model), imported as another sequence: llama.cpp refuses both (the width at its row-size check,
    llama_kv_cache::state_read_data), and the sequence dropped continues as a fresh one. On a recurrent memory the
    width is not drawn as such (its export is not a KV cache's): the cut stands in, and is refused too."""
    from targets import as_bytes, open_target
    from targets.kvstate import other_width

    program = [{"op": "decode", "parts": [[0, [3, 1, 4, 1]], [2, [5, 9]]]},
               {"op": "refused_import", "src": 0, "dst": 1, "how": "width"},
               {"op": "refused_import", "src": 2, "dst": 1, "how": "cut"},
               {"op": "decode", "parts": [[1, [2, 6]], [0, [5]]]}]
    for family in ("llama", "mamba2"):
        rep = report(fixtures(family, layers=2), MemoryConfig(program=program))
        assert rep.status == PASS, (family, [f.message for f in rep.findings])
        assert all(r["refused"].get("import") == 2 for r in rep.results), [r["refused"] for r in rep.results]
    with open_target("llama-cpp") as t:
        assert t.load(str(fixtures("llama", layers=2)), n_seq_max=2).ok
        assert t.call("decode", tokens=[3, 1, 4], seq=0).ok
        blob = as_bytes(t.call("state_get", seq=0).data["data"])
        wider = other_width(blob)
        assert wider is not None and len(wider) == len(blob) and wider != blob

        def imports(b: bytes) -> bool:
            return t.call("state_set", seq=1, data=base64.b64encode(b).decode()).ok
        assert not imports(wider) and imports(blob)
    assert other_width(blob[:len(blob) // 2]) is None


def test_a_state_whose_counts_run_past_its_end_is_no_kv_cache_and_is_read_at_once():
    """A blob read as a KV cache whose transposed V claims 3.4e9 values a cell (counts of another layout: DeepSeek's
    export once read so took hours and gigabytes building rows never there) is not that layout: other_width finds
    none, keep_cells leaves it as it is, both without reading rows."""
    import struct
    import time

    from targets.kvstate import HEADER, keep_cells, kv_cells, other_width

    cells, row = 2, 4
    blob = struct.pack("<Ii", 1, 0) + struct.pack("<I", 1) + struct.pack("<I", cells)
    blob += b"".join(struct.pack("<iII", p, 1, 0) for p in range(cells))
    blob += struct.pack("<II", 1, 1)  # v_trans, one layer
    blob += struct.pack("<iQ", 1, row) + bytes(cells * row)  # K
    blob += struct.pack("<iII", 1, 2, 3392449469) + bytes(64)  # V: element size 2, n_embd_v 3.4e9, 64 bytes there
    assert len(blob) > HEADER
    t0 = time.perf_counter()
    assert kv_cells(blob, 1) is None and other_width(blob) is None
    assert keep_cells(blob, 0, lambda p, top: p == top) == blob
    assert time.perf_counter() - t0 < 1.0


@pytest.mark.llama
def test_state_moved_through_files_and_whole_contexts_continues_as_recomputed(fixtures):
    """A sequence copied through a state file (its tokens given back as saved) and the whole context reloaded in
    memory and through a session file: on clean llama.cpp every sequence continues as its recompute, in both
    layouts, and the counts name each way."""
    program = [{"op": "decode", "parts": [[0, [3, 1, 4, 1]], [2, [5, 9]]]},
               {"op": "copy_state", "src": 0, "dst": 1, "via": "file"},
               {"op": "reload", "perm": [0, 1, 2], "via": "context"},
               {"op": "decode", "parts": [[1, [2, 6]], [2, [5]]]},
               {"op": "reload", "perm": [0, 1, 2], "via": "context-file"},
               {"op": "decode", "parts": [[0, [7]], [1, [8]], [2, [3]]]}]
    for family in ("llama", "mamba2"):
        rep = report(fixtures(family, layers=2), MemoryConfig(program=program))
        assert rep.status == PASS, (family, [f.message for f in rep.findings])
        for r in rep.results:
            assert r["ops"] == {"decode": 3, "copy_state via file": 1, "reload via context": 1,
                                "reload via context-file": 1}, r["ops"]


@pytest.mark.llama
@pytest.mark.parametrize("mutant,op", [("seq-rm-leaves-one-cell", "rm"), ("seq-keep-keeps-neighbour", "keep")])
def test_mutants_are_caught_and_shortened(fixtures, mutant, op):
    # (24 programs: the state moves also draw how they move state, and a refused import how its state is spoiled,
    # so the 8 that once drew a keep beside a neighbour's cells draw other programs now; the 24th draws one)
    rep = report(fixtures("llama", layers=2), MemoryConfig(programs=24, target=f"mutant:{mutant}",
                                                           kv_unified=(True,)))
    mine = [f for f in rep.findings if f.detail["op"] == op]
    assert mine and all(f.cause is None and f.reproduced for f in mine)  # no control explains it away
    assert min(len(f.detail["program"]) for f in mine) == 2  # a decode, then the operation
    assert all(len(f.detail["program"]) <= 6 for f in mine)
    assert not any(known_repro(known_upstream(), "llama", f) for f in mine)


@pytest.mark.llama
def test_the_repro_programs_name_their_causes(fixtures):
    causes = {}
    for name in ("llama-memory-seq-keep-per-stream", "llama-memory-div-lost-by-export",
                 "lfm2-memory-rollback-stale-snapshot-26695"):
        b = json.loads((REPROS / name / "bundle.json").read_text())
        cfg = MemoryConfig(**{**b["config"], "kv_unified": tuple(b["config"]["kv_unified"])})
        rep = report(REPROS / name / "fixture.gguf", cfg)
        causes[name] = [(f.cause["kind"], f.cause.get("op")) for f in rep.findings]
    assert causes == {"llama-memory-seq-keep-per-stream": [("layout", None)],
                      "llama-memory-div-lost-by-export": [("deferred", "div")],
                      "lfm2-memory-rollback-stale-snapshot-26695": [("rollback", None)]}


@pytest.mark.llama
def test_the_lane_reports_known_upstream_bugs_as_known(tmp_path):
    m = load_manifest()
    for key, want in (("llama", KNOWN), ("mamba", KNOWN)):
        res = lane_memory(m.row(key), fixture_path(key, tmp_path), "llama-cpp")
        assert res.status == want, res.detail
    # (a recurrent row meets only the cancelled decodes' upstream defect: every other program passes there)
    assert res.detail.endswith("only upstream's known memory bugs: mamba-memory-abort-keeps-recurrent-tokens")
    detail = lane_memory(m.row("llama"), fixture_path("llama", tmp_path), "llama-cpp").detail
    # (the bf16 cache's one program meets an export losing a pending shift before its bf16 shift since removals are
    # followed now and then by a reload: the bf16 abort is met on other rows, falcon-h1's among them)
    assert "llama-memory-seq-keep-per-stream" in detail and "llama-memory-div-lost-by-export" in detail
    # the programs known findings ended are drawn again with other seeds (three rounds at most): 17 of the first
    # 46 met one, and 30 more were drawn past them, 18 clean
    assert detail.startswith("76 programs") and "30 drawn past 17 known findings, 18 of them clean" in detail, detail
    # numerics far larger than our fixtures' (batch-shape-noise: 0.3 on every multi-token batch, 0.2 beside another
    # sequence in one cache) is no finding: the tolerance is 4 × the model's own measured batch-shape move
    noisy = lane_memory(m.row("llama"), fixture_path("llama", tmp_path), "mutant:batch-shape-noise")
    assert noisy.status == KNOWN, noisy.detail
    assert noisy.reports[0].extra["noise"]["batch_shape"] == pytest.approx(0.3, abs=1e-3)


@pytest.mark.llama
def test_the_cli_runs_a_given_program_and_refuses_a_broken_one(tmp_path):
    prog = tmp_path / "p.json"
    prog.write_text(json.dumps([{"op": "decode", "parts": [[0, [1, 2]], [1, [3]]]}, {"op": "keep", "seq": 1},
                                {"op": "decode", "parts": [[1, [4]]]}]))
    ok = run_cli("fuzz", "memory", "llama", "--program", str(prog), "--report", str(tmp_path / "r.json"))
    assert ok.returncode == 1  # per-seq-kv: the other stream's sequence stays (the upstream seq_keep bug)
    rep = json.loads((tmp_path / "r.json").read_text())
    assert [r["status"] for r in rep["results"]] == ["pass", "finding"]
    prog.write_text("[{]")
    bad = run_cli("fuzz", "memory", "llama", "--program", str(prog))
    assert bad.returncode == 2 and "--program" in bad.stderr


@pytest.mark.llama
def test_the_workers_memory_operations(fixtures):
    from targets import open_target

    with open_target("llama-cpp") as t:
        info = t.load(str(fixtures("llama", layers=2)), n_seq_max=3, kv_unified=True, n_ctx=768).data
        assert info["can_shift"] is True and info["n_rs_seq"] == 0  # llama has no rollback snapshots: clamped
        assert t.call("decode", tokens=[1, 2, 3], seq=[0, 0, 1], logits="none").ok
        assert t.call("seq_pos", seqs=[0, 1, 2]).data["pos"] == {"0": [0, 1], "1": [0, 0], "2": [-1, -1]}
        assert t.call("seq_cp", src=0, dst=2, p0=1, p1=-1).ok
        assert t.call("seq_add", seq=2, p0=-1, p1=-1, delta=5).ok
        assert t.call("seq_pos", seqs=[2]).data["pos"] == {"2": [6, 6]}
        assert t.call("seq_div", seq=2, p0=-1, p1=-1, d=2).ok
        assert t.call("seq_keep", seq=2).ok
        assert t.call("seq_pos", seqs=[0, 1, 2]).data["pos"] == {"0": [-1, -1], "1": [-1, -1], "2": [3, 3]}
        for op, args in (("seq_keep", {"seq": 3}), ("seq_cp", {"src": 0, "dst": 9}),
                         ("seq_div", {"seq": 0, "d": 0})):
            r = t.call(op, **args)
            assert not r.ok and r.failure.error_kind == "bad_request", op  # refused, not an abort
        assert t.call("seq_pos", seqs=[2]).ok  # and the worker goes on
        # a coupled decode: one token in sequences 0 and 1 (a shared prefix), positions given
        assert t.call("decode", tokens=[4, 5], seq=[[0, 1], [0, 1]], pos=[0, 1], logits="last").ok
        assert t.call("seq_pos", seqs=[0, 1]).data["pos"] == {"0": [0, 1], "1": [0, 1]}
        bad = t.call("decode", tokens=[6], seq=[[0, 1]], logits="last")
        assert not bad.ok and "needs its 'pos'" in bad.failure.message


@pytest.mark.llama
def test_the_hypothesis_engine_finds_and_shrinks_a_mutant(fixtures):
    """The same rules as a Hypothesis RuleBasedStateMachine: in one unified cache it finds the off-by-one removal and
    shrinks it to two operations ending in the removal (a shared prefix decoded, then the removal from position 1;
    the seeded engine's shortening reaches a two-operation form too, test_mutants_are_caught_and_shortened). With
    one cache per sequence too: a decode, then the removal (the rollback of the cell the mutant leaves), no control
    explaining it. On a clean recurrent model every example passes."""
    rep = report(fixtures("llama", layers=2), MemoryConfig(engine="hypothesis", programs=60, kv_unified=(True,),
                                                           target="mutant:seq-rm-leaves-one-cell"))
    (f,) = rep.findings
    assert [op["op"] for op in f.detail["program"]] == ["coupled", "rm"]
    assert f.where == "pos" and f.cause is None
    per_seq = report(fixtures("llama", layers=2), MemoryConfig(engine="hypothesis", programs=60, kv_unified=(False,),
                                                               target="mutant:seq-rm-leaves-one-cell"))
    (g,) = per_seq.findings
    assert [op["op"] for op in g.detail["program"]] == ["decode", "rm"] and g.where == "pos" and g.cause is None
    clean = report(fixtures("mamba2", layers=2), MemoryConfig(engine="hypothesis", programs=20, kv_unified=(True,)))
    assert clean.status == PASS and clean.results[0]["examples"] >= 20 and clean.results[0]["checks"] > 50


@pytest.mark.llama
def test_where_the_neighbours_put_a_sequence_is_numerics_not_a_finding(tmp_path):
    """qwen3moe (a MoE router) in one unified cache: sequence 0 prefilled beside two others, then alone, moves by
    ~1.5 against its recompute — passing without the others, bit for bit the same with other tokens for them: a
    routing near-tie the placement turns; numerics. Without the others it is a plain pass."""
    prog = [{"op": "decode", "parts": [[0, [63, 58, 22, 45, 59, 62, 37, 39]], [1, [53]], [2, [12, 32, 20]]]},
            {"op": "decode", "parts": [[0, [25, 23, 56, 24, 48, 32]]]},
            {"op": "decode", "parts": [[0, [25, 46, 15, 16, 41]]]}]
    rep = report(fixture_path("qwen3moe", tmp_path), MemoryConfig(program=prog, kv_unified=(True,)))
    assert not rep.findings and rep.status == PASS
    (n,) = rep.numerics
    assert n.cause["kind"] == "neighbour-numerics" and n.detail["max_abs_dlogit"] > 1.0


@pytest.mark.llama
def test_a_shifted_keys_second_f16_rounding_is_numerics_within_the_bound_its_own_history_measures(tmp_path):
    """llama-wide-vocab (one 4-wide head, a 128256-token tied head): 18 tokens shifted whole by +6, then 11 more,
    move 0.145 against the same tokens decoded at the new positions — over the 0.1 tolerance. The shift rounds the
    rotated f16 keys again; on an f32 K cache the same program moves by 0, and one rounding of the keys to f16 moves
    this history by 0.086: within 4x, numerics (shift-rounding). A tolerance of 0 (noise factor 0) excuses nothing."""
    fixture = fixture_for(load_manifest().rows["llama-wide-vocab"], tmp_path)
    prog = [{"op": "decode", "parts": [[0, [26157, 121476]]]}, {"op": "copy_state", "src": 0, "dst": 2},
            {"op": "decode", "parts": [[2, [56273, 2744, 14882, 35900, 27870, 97986, 123418, 98070, 18491, 48929,
                                            104375, 109080, 16127, 45205, 121447, 14831]]]},
            {"op": "add", "seq": 2, "p0": 0, "p1": -1, "delta": 6},
            {"op": "decode", "parts": [[2, [84604, 70518, 4249, 37533, 28309, 110034]]]},
            {"op": "decode", "parts": [[2, [11320, 112014, 23015, 115232, 103349]]]}]
    rep = report(fixture, MemoryConfig(program=prog, kv_unified=(True,)))
    assert not rep.findings and rep.status == PASS
    (n,) = rep.numerics
    assert n.cause["kind"] == "shift-rounding" and n.detail["max_abs_dlogit"] == pytest.approx(0.145, abs=0.01)
    assert n.cause["once"] == pytest.approx(0.086, abs=0.01)
    exact = report(fixture, MemoryConfig(program=prog, kv_unified=(True,), type_k="f32"))
    assert exact.status == PASS and not exact.numerics and exact.results[0]["max_abs_dlogit"] == 0.0
    strict = report(fixture, MemoryConfig(program=prog, kv_unified=(True,), noise_factor=0.0))
    assert [f.detail["max_abs_dlogit"] for f in strict.findings] == [pytest.approx(0.145, abs=0.01)]


@pytest.mark.llama
def test_a_sliding_window_model_fills_its_window_cache_wrapping_and_full_size(tmp_path):
    """laguna (full/SWA/SWA/SWA): three sequences filling one 768-cell cache, whose window cache llama.cpp sizes 256
    cells (padded) — it reuses cells past the window — and full-size with swa_full: both pass."""
    fixture = fixture_for(load_manifest().rows["laguna"], tmp_path)
    for full in (False, True):
        rep = report(fixture, capacity_config(n_seq=3, context=768, kv_unified=(True,), swa_full=full))
        assert rep.status == PASS and not rep.findings, [f.message for f in rep.findings]
        assert rep.config["swa_full"] is full and rep.results[0]["steps"] == 32


@pytest.mark.llama
def test_a_routing_near_tie_under_flash_attention_is_numerics_not_a_finding(tmp_path):
    """laguna's tier-1 row (a MoE router; K/V heads 1 on layer 0, 2 elsewhere) in one unified cache with flash
    attention, as llama-server runs it: sequence 1's state imported as sequence 0 (its cells beside the source's),
    the source dropped, sequence 0 continued. Its fourth token moves by 1.24 against the recompute: layer 6's router
    picks experts 0 and 2 here, 1 and 2 alone, its scores moved by 1.9e-4 across a gap of 4.2e-5 — the routing
    control names it numerics. No other sequence's data is in the history (the neighbour control cannot apply),
    and without flash attention the same program passes."""
    fixture = fixture_for(load_manifest().rows["laguna"], tmp_path)
    prog = [{"op": "decode", "parts": [[1, [48, 6, 3, 0, 36, 56]]]}, {"op": "copy_state", "src": 1, "dst": 0},
            {"op": "rm", "seq": 1, "p0": 0, "p1": -1}, {"op": "decode", "parts": [[0, [59, 11, 20]]]},
            {"op": "decode", "parts": [[0, [7]]]}]
    rep = report(fixture, MemoryConfig(program=prog, kv_unified=(True,), flash_attn=True))
    assert not rep.findings and rep.status == PASS
    (n,) = rep.numerics
    assert n.cause["kind"] == "routing-numerics" and n.detail["max_abs_dlogit"] > 1.0
    flip = n.cause["flip"]
    assert (flip["node"], flip["token"], flip["a"], flip["b"]) == ("ffn_moe_topk-6", 0, [1, 2], [0, 2])
    assert flip["margin"] <= 2 * flip["scores_max_abs"] <= 2e-2
    plain = report(fixture, MemoryConfig(program=prog, kv_unified=(True,)))
    assert plain.status == PASS and not plain.numerics and plain.results[0]["max_abs_dlogit"] < 1e-3


@pytest.mark.llama
def test_a_recomputes_cell_order_under_flash_attention_is_numerics_not_a_finding(tmp_path):
    """llama-wide-vocab's tier-1 row in one unified cache with flash attention: sequence 1's token copied to 0 and 2,
    a token pair decoded for 0 and 2 together, 0's first two positions removed (their cells still held by 1 and 2),
    six tokens decoded for 0. The recompute of 0's history alone refills the two cells its removal freed, so two of
    the six sit below position 2; flash attention sums cells in that order: 0.278 on the last logits. The cell-order
    control: held by a filler sequence, the recompute agrees with this context; the recomputes first part at layer 0,
    by 4.5e-4 of its largest output (f16 rounding); without flash attention the program passes bit for bit."""
    fixture = fixture_for(load_manifest().rows["llama-wide-vocab"], tmp_path)
    prog = [{"op": "decode", "parts": [[1, [40091]]]}, {"op": "cp", "src": 1, "dst": 0, "p0": -1, "p1": -1},
            {"op": "cp", "src": 1, "dst": 2, "p0": -1, "p1": -1},
            {"op": "coupled", "seqs": [0, 2], "tokens": [98093, 25213]}, {"op": "rm", "seq": 0, "p0": 0, "p1": 2},
            {"op": "decode", "parts": [[0, [101118, 14906, 50601, 91292, 107093, 49767]]]}]
    rep = report(fixture, MemoryConfig(program=prog, kv_unified=(True,), flash_attn=True))
    assert not rep.findings and rep.status == PASS
    (n,) = rep.numerics
    assert n.cause["kind"] == "cell-order-numerics" and n.cause["layer"] == 0
    assert 1e-4 < n.cause["moved"] <= ORDER_ROUNDING and 0.2 < n.detail["max_abs_dlogit"] < 0.4
    plain = report(fixture, MemoryConfig(program=prog, kv_unified=(True,)))
    assert plain.status == PASS and not plain.numerics and plain.results[0]["max_abs_dlogit"] == 0.0


@pytest.mark.llama
def test_the_deferred_control_names_the_operation_whose_work_was_still_pending(tmp_path):
    """granite's tier-1 row: two divisions of sequence 2, its state copied to sequence 0, 0 decoded — the export
    loses the divisions' deferred work (upstream's, `llama-memory-div-lost-by-export`). A decode right after the first
    division is enough too (what the second leaves pending moves the logits less), but the work still pending when
    the export read the cache is the second's: the cause names the division before the export, and the finding is
    the known one (seed 5's 24 drawn programs found it and, naming the first, matched nothing)."""
    row = load_manifest().rows["granite"]
    prog = [{"op": "decode", "parts": [[2, [31, 40, 30]]]}, {"op": "div", "seq": 2, "p0": 1, "p1": -1, "d": 2},
            {"op": "div", "seq": 2, "p0": 0, "p1": -1, "d": 2}, {"op": "copy_state", "src": 2, "dst": 0},
            {"op": "decode", "parts": [[0, [6]]]}]
    rep = report(fixture_for(row, tmp_path), MemoryConfig(program=prog, kv_unified=(False,)))
    (f,) = rep.findings
    assert (f.cause["kind"], f.cause["op"], f.cause["step"], f.cause["then"]) == ("deferred", "div", 2, "export")
    assert known_repro(known_upstream(), "granite", f) == "llama-memory-div-lost-by-export"


def test_a_held_recompute_gives_the_cells_each_removal_frees_to_a_filler():
    """The cell-order control's recompute: after each removal a filler sequence takes as many cells as the removal
    freed of the sequence's positions (shifts and divisions followed), and the context holds both sequences in one
    cache; the plain recompute has neither."""
    rc = Recompute(None, Path("m.gguf"), {"n_seq_max": 1})
    log = [["d", [[0, 5], [1, 6], [2, 7], [3, 8]]], ["rm", 0, 2], ["add", 2, -1, 4], ["d", [[8, 9]]],
           ["div", 0, -1, 2], ["rm", 3, -1], ["d", [[4, 1]]]]
    reqs = rc.requests(log, hold=True)
    assert reqs[0][1]["n_seq_max"] == 2 and reqs[0][1]["kv_unified"] is True
    fillers = [(i, r) for i, (op, r) in enumerate(reqs) if op == "decode" and r["seq"] == 1]
    # removal 1 frees positions 0, 1; 2, 3 shift to 6, 7; 8 decoded; ÷2: 3, 3, 4; removal 2 frees all three cells
    assert [(i, r["pos"]) for i, r in fillers] == [(3, [0, 1]), (8, [2, 3, 4])]
    assert [op for op, _ in rc.requests(log)].count("decode") == 3 and "kv_unified" not in rc.requests(log)[0][1]


@pytest.mark.llama
def test_a_stage_past_the_first_is_fed_rows_and_b1_is_caught_there(tmp_path):
    """--stage 4:8 of jamba (rrrr|arrr: the stage starts on its attention layer) runs the machine on the stage's own
    context, fed seeded rows: clean upstream shows only the known memory bugs; the B1 mutant (a stage whose first
    layer is attention exports no recurrent state) is caught by a state move and shortened to a decode, the move
    and a decode."""
    path = fixture_path("jamba", tmp_path)
    known = known_upstream()
    clean = report(path, MemoryConfig(programs=6, stage="4:8"))
    assert clean.config["stage"] == "4:8" and sum(r["checks"] for r in clean.results) > 50
    assert all(known_repro(known, "jamba", f) for f in clean.findings)
    b1 = report(path, MemoryConfig(programs=6, stage="4:8", kv_unified=(True,),
                                   target="mutant:b1-first-layer-probe"))
    mine = [f for f in b1.findings if f.cause is None]
    assert mine and min(len(f.detail["program"]) for f in mine) == 3
    assert {op["op"] for f in mine for op in f.detail["program"]} & {"copy_state", "reload"}
    with pytest.raises(UserError, match="--stage"):
        report(path, MemoryConfig(stage="5:3"))


def test_a_whole_shift_is_recomputed_at_the_new_positions_where_the_model_shifts_faithfully():
    """Two shifts before a decode (ggml-org/llama.cpp#3825 lost the first one's rotation): replaying the shifts in the
    recompute would carry such a bug into it too, so a whole-sequence shift on a model whose own shift was measured
    faithful is recomputed as the tokens decoded at their new positions; a partial shift, or any shift on a model
    that is not faithful (absolute positions), is replayed."""
    m = Model(2)
    m.faithful_shifts = True
    m.decode(0, [5, 9, 13])
    m.add(0, 0, -1, 3)
    m.add(0, 0, -1, 2)
    assert m.cells[0] == [5, 6, 7] and m.log[0] == [["d", [[5, 5], [6, 9], [7, 13]]]]
    m.add(0, 6, -1, 1)  # partial: the kept part's attention saw other distances
    assert m.cells[0] == [5, 7, 8] and m.log[0][-1] == ["add", 6, -1, 1]
    m.faithful_shifts = False
    m.decode(1, [4])
    m.add(1, 0, -1, 2)
    assert m.log[1] == [["d", [[0, 4]]], ["add", 0, -1, 2]]


def test_after_a_shift_or_removal_the_same_operation_follows_now_and_then():
    """Work llama.cpp defers to the next decode piles up only when two operations meet before it: the seeded drawer
    follows a shift or a removal with the same operation on the same sequence about BURST of the time, and a removal
    with the state reloaded into a fresh context (an export of a pending rollback) about MOVE of the time."""
    import numpy as np

    from fuzz.oracles.memory_model import BURST, MOVE, burst

    class Mach:
        model = Model(3)
        mem = KV

    Mach.model.decode(1, [1, 2, 3, 4])
    rng = np.random.default_rng(0)
    last = [{"op": "add", "seq": 1, "p0": 0, "p1": -1, "delta": 2}]
    got = [burst(rng, last, Mach, MemoryConfig(), True) for _ in range(400)]
    assert {g for g in got} == {(None, None), ("add", 1)}
    assert abs(got.count(("add", 1)) / 400 - BURST) < 0.06
    rm = [{"op": "rm", "seq": 1, "p0": 3, "p1": -1}]  # (a rollback: its index pending until the next decode)
    got = [burst(rng, rm, Mach, MemoryConfig(), True) for _ in range(400)]
    assert {g for g in got} == {(None, None), ("rm", 1), ("reload", None)}
    assert abs(got.count(("reload", None)) / 400 - MOVE) < 0.05
    assert burst(rng, [{"op": "decode", "parts": [[1, [5]]]}], Mach, MemoryConfig(), True) == (None, None)


def test_the_pressure_program_frees_enough_cells_in_total_but_no_run_long_enough():
    """The memory-pressure program (upstream 17527's shape), laid out as one cache allocates each batch's cells in
    order: 240 of 256 cells used, sequence 1's removal frees 80 in five blocks of 16, and the import of sequence 0's
    80 cells fits the 96 free cells only if it may scatter (the longest free run is 16)."""
    cfg = pressure_config(64)
    program = cfg.program
    assert (cfg.context, cfg.n_seq, cfg.kv_unified) == (PRESSURE_CTX, 3, (True,)) == (256, 3, (True,))
    assert [op["op"] for op in program] == ["decode"] * 5 + ["rm", "copy_state", "decode"]
    cells: list[int | None] = [None] * cfg.context
    at = 0
    for op in program[:5]:
        for q, toks in op["parts"]:
            cells[at:at + len(toks)] = [q] * len(toks)
            at += len(toks)
    assert at == 240 and cfg.max_len >= 81  # (the decodes are not cut short by max_len)
    cells = [None if c == 1 else c for c in cells]
    free = [i for i, c in enumerate(cells) if c is None]
    runs, run = [], 0
    for c in cells + [0]:
        run = run + 1 if c is None else (runs.append(run) or 0)
    need = cells.count(0)
    assert (need, len(free), max(runs)) == (80, 96, 16) and max(runs) < need <= len(free)
    assert pressure_program(64) == program and pressure_program(64, seed=1) != program  # seeded
    r = run_cli("fuzz", "memory", "llama", "--pressure", "--stage", "1:2")
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "fuzz: error: --pressure runs its own program on the model: drop --program and --stage"], r.stderr


def test_the_cells_left_in_a_stream_are_counted_where_the_model_can_count_them():
    """One KV cache for every sequence: its cells less every sequence's; one stream each: the sequence's own. Not
    counted (None): recurrent state, a sliding window, a target that did not say its size, cells shared since a
    fork or a coupled decode."""
    kv = Memory(n_vocab=64, recurrent=False, swa=0, can_shift=True, n_rs_seq=0, cells=256)
    m = Model(3)
    m.decode(0, [1] * 10)
    m.decode(1, [2] * 30)
    assert [free_cells(m, kv, True, s) for s in range(3)] == [216, 216, 216]
    assert [free_cells(m, kv, False, s) for s in range(3)] == [246, 226, 256]
    assert overflows(m, kv, True, [[0, [0] * 100], [2, [0] * 116]]) == (False, 216, 216)  # to the brim
    assert overflows(m, kv, True, [[0, [0] * 100], [2, [0] * 117]]) == (True, 217, 216)
    assert overflows(m, kv, False, [[1, [0] * 227], [2, [0] * 5]]) == (True, 227, 226)
    hybrid = Memory(n_vocab=64, recurrent=True, swa=0, can_shift=True, n_rs_seq=0, kind="hybrid", cells=256)
    assert free_cells(m, hybrid, True, 0) == 216  # (its attention cache's cells)
    for mem in (Memory(n_vocab=64, recurrent=True, swa=0, can_shift=True, n_rs_seq=0, kind="recurrent", cells=256),
                Memory(n_vocab=64, recurrent=False, swa=4, can_shift=True, n_rs_seq=0, cells=256), KV):
        assert free_cells(m, mem, True, 0) is None
    m.cp(0, 2, -1, -1, shared=True)
    assert free_cells(m, kv, True, 1) is None and free_cells(m, kv, False, 1) == 226  # (the fork: its stream only)
    assert overflows(m, kv, True, [[1, [0]]]) is None and overflows(m, kv, True, [[[0, 2], [0]]]) is None


def test_a_filling_program_fills_its_streams_and_asks_for_more_than_is_left():
    """Followed as llama.cpp takes it (a decode with no room refused whole), each of 12 seeded filling programs (six
    seeds, both KV layouts) asks a stream of CAPACITY_CTX cells for more than it has left; one filling decode gives
    at most FILL_BATCH tokens, and what a stream takes stays within the positions a sequence holds (max_len)."""
    cfg = capacity_config()
    kv = Memory(n_vocab=64, recurrent=False, swa=0, can_shift=True, n_rs_seq=0, cells=CAPACITY_CTX)
    assert (cfg.context, cfg.n_seq, cfg.steps, cfg.max_len, cfg.fill) == (256, 2, 32, 248, True)
    asked = []
    for kvu in (True, False):
        for seed in range(6):
            rng, m, refused = SeededDraws(np.random.default_rng([seed, 0, int(kvu)])), Model(cfg.n_seq), 0
            for _ in range(cfg.steps):
                op = draw_op(rng, m, kv, cfg, kvu)
                assert op["op"] not in ("copy_state", "refused_import", "reload")
                over = overflows(m, kv, kvu, op["parts"]) if op["op"] == "decode" else None
                if over and over[0]:
                    refused += 1
                    continue
                assert all(len(t) <= FILL_BATCH for _, t in op.get("parts", ()))
                m.apply(op, shared=kvu)
                assert all(max(c, default=0) < cfg.max_len + 8 for c in m.cells.values())
            asked.append(refused > 0)
    assert asked.count(True) == 12, asked



def test_a_filling_program_on_a_sliding_window_fills_short_of_the_full_cache_and_asks_nothing_past_it():
    """A sliding-window model's window cache reuses the cells the window masks (none counted), so its filling
    decodes are long ones short of the full cache by a batch (window_room) and never ask for more than is left:
    three sequences in a 768-cell cache take past 256 cells (the window cache's size: it wraps), never past 704."""
    cfg = capacity_config(n_seq=3, context=768, kv_unified=(True,))
    swa = Memory(n_vocab=64, recurrent=False, swa=8, can_shift=True, n_rs_seq=0, cells=768)
    rng, m, peak = SeededDraws(np.random.default_rng([0, 0, 1])), Model(cfg.n_seq), 0
    for _ in range(cfg.steps):
        op = draw_op(rng, m, swa, cfg, True)
        assert overflows(m, swa, True, op.get("parts", ())) is None  # (nothing counted: nothing asked past it)
        m.apply(op, shared=True)
        peak = max(peak, sum(len(c) for c in m.cells.values()))
        assert peak <= 768 - FILL_BATCH and window_room(m, swa, True, 0) >= 0
    assert peak > 256, peak

@pytest.mark.llama
def test_a_decode_the_cache_has_no_room_for_is_refused_whole_and_a_runtime_that_keeps_part_is_caught():
    """The pinned build refuses a decode no stream has room for (llama_decode returns 1: no_memory_slot) and keeps
    nothing of it: the filling program passes on llama in one KV cache, 5 decodes refused for room. A runtime that
    feeds the batch in pieces of its own and leaves the first piece in the cache when the whole is refused is
    caught: the positions its sequence reports after the refusal are not the ones it held. (With one stream per
    sequence upstream's seq_keep bug ends the pinned build's program first: corpora/fixes.)"""
    cfg = capacity_config(kv_unified=(True,))
    (row,) = report(fixture_path("llama"), cfg).native["results"]
    assert (row["status"], row["steps"], row["refused"]) == (PASS, 32, {"no slot": 5}), row
    bad = report(fixture_path("llama"), capacity_config(kv_unified=(True,),
                                                        target="mutant:refused-decode-keeps-prefix")).native
    f = bad["findings"][0]
    assert f["check"] == "pos" and f["reproduced"] and "was refused for room" in f["message"], f


@pytest.mark.llama
def test_a_quantized_cache_runs_on_64_wide_heads_and_its_shift_is_upstreams_abort_on_partial_rotary(tmp_path):
    """The memory lane's quantized-cache programs run on the row's fixture with heads 64 wide (a q8_0 cache needs a
    head a whole number of its blocks): on llama (whole-head rotary) a whole-sequence shift of a q8_0 cache passes;
    on glm4 (half the head rotary) it aborts, and the cache-type control names the cache (f16 passes). llama.cpp
    refusing the types on a model (an MLA head of 48) is unsupported, with its reason."""
    rows = load_manifest().rows
    shift = [{"op": "decode", "parts": [[0, [1, 2, 3, 4, 5]]]}, {"op": "add", "seq": 0, "p0": 0, "p1": -1, "delta": 3},
             {"op": "decode", "parts": [[0, [6]]]}]
    q8 = {"type_k": "q8_0", "type_v": "q8_0", "flash_attn": True, "kv_unified": (True,), "program": shift}
    llama = quant_head_fixture(rows["llama"], tmp_path)
    assert llama is not None and llama.name == "llama-heads64.gguf"
    assert report(llama, MemoryConfig(**q8)).status == PASS
    glm4 = report(quant_head_fixture(rows["glm4"], tmp_path), MemoryConfig(**q8))
    (f,) = glm4.findings
    assert f.status == "crash" and "ops.cpp" in f.message and f.cause["kind"] == "cache-type", f.message
    mla = report(quant_head_fixture(rows["deepseek3"], tmp_path), MemoryConfig(**q8))
    assert mla.status == UNSUPPORTED and "does not divide n_embd_head_k=48" in mla.results[0]["reason"]
    assert quant_head_fixture(rows["mamba"], tmp_path) is None


@pytest.mark.llama
def test_the_pressure_program_passes_on_the_pinned_build_and_its_import_is_judged():
    """On the pinned build (which scatters a restore over free cells) the program runs all 8 operations: the import
    accepted, 18 logits checks (every sequence after each decode), all within tolerance."""
    d = report(fixture_path("llama"), pressure_config(64)).native
    (row,) = d["results"]
    assert row["status"] == PASS and (row["steps"], row["checks"]) == (8, 18), row
    assert row["ops"] == {"decode": 6, "rm": 1, "copy_state": 1} and not d["findings"]


def test_a_shift_on_a_model_with_rotary_positions_must_equal_decoding_at_the_new_positions():
    """Whether a shift is recomputed as the same tokens decoded at the new positions (else replayed in the recompute,
    checked for consistency only) follows from what the model is, not from measuring the shift under test: a rotary
    model's shift that moves it (DeepSeek-V3.2's indexer keys: 4.0) is a finding, not an excuse. Without rotary
    positions (gpt2's absolute embeddings, rope type -1) or a rope type (a target that does not say) the measured move
    decides; a quantized K cache is always replayed (its shift quantizes the rotated keys again)."""
    from fuzz.oracles.memory import shifts_faithful

    rotary = {"tolerance": 0.1, "shift": 4.0, "rope_type": 0}
    absolute = {"tolerance": 0.1, "shift": 2.5, "rope_type": -1}
    assert shifts_faithful(rotary, 4.0, "") and shifts_faithful({**rotary, "rope_type": 2}, 4.0, "bf16")
    assert not shifts_faithful(absolute, 4.0, "") and shifts_faithful({**absolute, "shift": 0.0}, 4.0, "")
    assert not shifts_faithful(rotary, 4.0, "q8_0")
    unsaid = {"tolerance": 0.1, "shift": 0.003}
    assert shifts_faithful(unsaid, 4.0, "") and not shifts_faithful({**unsaid, "shift": 0.2}, 4.0, "")
    assert not shifts_faithful({"tolerance": 0.1, "rope_type": 0}, 4.0, "")  # (no shift measured: it cannot shift)


def test_a_recompute_without_some_params_keeps_what_it_measured():
    """The cache-type control's recompute: the same one (tolerance, the model's rope type and its shifts' promise)
    in contexts loaded without the changed params, its own cache of logits."""
    r = Recompute(None, Path("m.gguf"), {"n_ctx": 64, "type_k": "q8_0", "swa_full": True}, tol=0.25)
    r.rope_type, r.faithful_shifts, r.memo["x"] = 2, True, "cached"
    plain = r.without("type_k", "swa_full")
    assert plain.params == {"n_ctx": 64} and r.params["type_k"] == "q8_0"
    assert (plain.tol, plain.rope_type, plain.faithful_shifts, plain.memo) == (0.25, 2, True, {})


@pytest.mark.llama
def test_a_hang_is_not_shortened_and_ends_its_layouts_programs(fixtures, monkeypatch):
    """A program whose call times out (a hang: a mutant's endless loop) is a crash, run once more to reproduce it,
    then neither shortened nor controlled (each try would wait out the timeout), and the run ends there: no more
    programs, in that layout or the other."""
    from types import SimpleNamespace

    import fuzz.oracles.memory as mo

    ran = []

    def hung(t, fixture, cfg, kvu, recompute, program, rng, **kw):
        ran.append(kvu)
        op = {"op": "decode", "parts": [[0, [1, 2]]]}
        mach = SimpleNamespace(commit="c", checks=0, worst=0.0, refused={}, mem=None, rows={},
                               model=SimpleNamespace(log={}))
        return [op], {"check": "crash", "op": "decode", "message": "decode: timeout: no reply in 30 s",
                      "failure": {"kind": "timeout"}}, mach

    monkeypatch.setattr(mo, "run_program", hung)
    monkeypatch.setattr(mo, "minimize", lambda *a, **k: pytest.fail("a hang was shortened"))
    monkeypatch.setattr(mo, "cache_type", lambda *a, **k: pytest.fail("a hang was controlled"))
    rep = mo.run(fixtures("qwen3", layers=2), MemoryConfig(programs=5))
    assert [r["status"] for r in rep["results"]] == ["crash"] and len(rep["findings"]) == 1
    assert ran == [True, True]  # (the program, and once more to reproduce it)


def test_a_fleet_takes_the_call_timeout_cap_where_it_is_set(monkeypatch):
    """`mutate` caps every worker call on a mutant (a hang is a kill, waited out once per call, not 120 s)."""
    from fuzz.engine.fleet import CALL_TIMEOUT, Fleet

    monkeypatch.delenv(CALL_TIMEOUT, raising=False)
    assert Fleet("llama-cpp", 120.0).timeout == 120.0
    monkeypatch.setenv(CALL_TIMEOUT, "30")
    assert Fleet("llama-cpp", 120.0).timeout == 30.0 and Fleet("llama-cpp", 10.0).timeout == 10.0
