"""fuzz sampling: backend samplers on sequences whose batches verify drafts; every token sampled in the graph is the
greedy pick of the same batches on a context without samplers. The draws and the judge are pure; the runs need the
pinned llama.cpp."""

import numpy as np
import pytest

from fuzz.engine.contract import FINDING, PASS, UNSUPPORTED
from fuzz.oracles.sampling import (
    DRAFT,
    Program,
    Sampling,
    SamplingConfig,
    draw,
    greedy,
    outputs,
    program_steps,
)

from conftest import run_cli


def test_a_program_is_its_seed_and_index_and_a_shorter_one_its_prefix():
    ps = [draw(64, 3, 0, k, 16) for k in range(30)]
    assert ps[4] == draw(64, 3, 0, 4, 16) and ps[4] != draw(64, 3, 1, 4, 16)
    assert draw(64, 3, 0, 4, 5).steps == ps[4].steps[:5]  # (what the shrinker's halving of steps keeps)
    for p in ps:
        assert p.samplers and p.samplers == sorted(set(p.samplers)) and set(p.samplers) <= {0, 1, 2}
    assert {p.flash_attn for p in ps} == {True, False} and {p.kv_unified for p in ps} == {True, False}
    kinds = [k for p in ps for parts in p.steps for _, _, k in parts]
    assert {"one", "draft", "prompt"} == set(kinds)
    orders = {tuple(s for s, _, _ in parts) for p in ps for parts in p.steps if len(parts) > 1}
    assert any(list(o) != sorted(o) for o in orders)  # sequences out of order in a batch too


def test_a_program_decodes_drafts_with_every_token_an_output_and_prompts_with_their_last():
    p = Program(0, [1], False, True, [[(1, [5, 6, 7], "draft"), (0, [1, 2, 3, 4], "prompt")], [(1, [9], "one")]])
    steps = program_steps(p)
    assert steps == [{"tokens": [5, 6, 7, 1, 2, 3, 4], "seq": [1, 1, 1, 0, 0, 0, 0], "pos": [0, 1, 2, 0, 1, 2, 3],
                      "logits": [True, True, True, False, False, False, True]},
                     {"tokens": [9], "seq": [1], "pos": [3], "logits": [True]}]
    assert outputs(steps) == [(0, 1), (0, 1), (0, 1), (0, 0), (1, 1)]
    split = program_steps(p, split=True)  # the control: each part a batch of its own, positions the same
    assert [s["seq"] for s in split] == [[1, 1, 1], [0, 0, 0, 0], [1]] and split[1]["pos"] == [0, 1, 2, 3]
    assert DRAFT == (2, 5)


def test_the_greedy_pick_leaves_out_end_of_generation_tokens():
    row = np.array([0.1, 3.0, 2.5, 0.0], np.float32)
    assert greedy(row, []) == (1, pytest.approx(0.5))
    assert greedy(row, [1]) == (2, pytest.approx(2.4))


def judged(sampled, rows, moved=0.0, split_picks=(1, 0, 3), samplers=(0, 1)):
    o = Sampling.__new__(Sampling)
    p = Program(3, list(samplers), True, False, [])
    order = [(0, 0), (0, 1), (1, 2)]
    return o.judge(p, {"sampled": sampled, "eog": [3], "ref": [np.asarray(r, np.float32) for r in rows],
                       "order": order, "moved": [moved] * 3, "split_picks": list(split_picks)})[0]


def test_a_token_sampled_in_the_graph_must_be_the_greedy_pick_where_its_margin_clears_the_control():
    """Judged where the batches split by sequence pick the same and the margin clears 4x what the split moved the
    row (the control, row by row)."""
    rows = [[0, 2, 1, 9], [5, 0, 0, 0], [0, 0, 0, 1]]  # (token 3 is end of generation: left out)
    row = judged([1, 0, None], rows)  # (sequence 2 has no sampler: not judged)
    assert row["status"] == PASS and (row["outputs_sampled"], row["judged"]) == (2, 2)
    row = judged([2, 0, None], rows)
    assert row["status"] == FINDING and row["reason"] == \
        "batch 0, sequence 0: sampled 2 in the graph, the greedy pick is 1 (its margin 1, the bound 0)"
    assert judged([2, 0, None], rows, moved=0.3)["status"] == PASS  # a margin within 4x the control's move
    assert judged([2, 0, None], rows, split_picks=(2, 0, 3))["status"] == PASS  # the split picks otherwise
    assert judged([1, None, None], rows)["status"] == FINDING  # a sampler's row with nothing sampled
    o = Sampling.__new__(Sampling)
    unsupported = o.judge(Program(0, [0], False, False, []), {"unsupported": "no samplers"})[0]
    assert unsupported["status"] == UNSUPPORTED


@pytest.mark.llama
def test_the_worker_samples_in_the_graph_for_the_sequences_given_samplers(fixtures):
    from targets import open_target

    t = open_target("llama-cpp", timeout=60)
    t.start()
    try:
        path = fixtures("llama", layers=2)
        r = t.load(str(path), n_ctx=512, n_seq_max=2, n_batch=64, n_ubatch=64, samplers=[1], n_outputs_max=10,
                   n_outputs_max_per_seq=5, capture=False)
        assert r.ok and isinstance(r.data["sampler_eog"], list), r
        eog = r.data["sampler_eog"]
        r = t.decode([1, 2, 3, 4, 5], seq=[0, 0, 1, 1, 1], pos=[0, 1, 0, 1, 2], logits="all")
        assert r.ok and len(r.data["sampled"]) == 5 and r.data["sampled"][:2] == [None, None]
        sampled = r.data["sampled"][2:]
        assert t.load(str(path), n_ctx=512, n_seq_max=2, n_batch=64, n_ubatch=64, capture=False).ok  # no samplers
        r = t.decode([1, 2, 3, 4, 5], seq=[0, 0, 1, 1, 1], pos=[0, 1, 0, 1, 2], logits="all")
        assert "sampled" not in r.data
        assert sampled == [greedy(x, eog)[0] for x in r.data["logits"][2:]]  # (the rows sampled in the graph: their
        # logits are not copied out, llama_get_logits_ith gives zeros there)
    finally:
        t.close()


@pytest.mark.llama
def test_the_stale_allocation_plan_is_known_where_it_shows_and_the_cli_refuses_bad_input(tmp_path):
    """mamba's program 3 of seed 0 aborts in set_rows (the committed repro, matched in any family by its check and
    `backend samplers`); llama's four programs pass; the isolation lane on mamba reads known by it."""
    rep = Sampling(run_fixture("mamba", tmp_path), SamplingConfig(programs=4)).report()
    assert [r["status"] for r in rep.results] == [PASS, PASS, PASS, "crash"], [r.get("reason") for r in rep.results]
    from fuzz.repro.campaign import known_repro, known_upstream
    assert known_repro(known_upstream(), "mamba", rep.findings[0]) == "mamba-sampling-stale-plan-abort"
    r = run_cli("family-certify", "run", "mamba", "--lane", "isolation")
    assert r.returncode == 0 and "isolation       KNOWN" in r.stdout, r.stdout + r.stderr
    assert "mamba-sampling-stale-plan-abort" in r.stdout
    r = run_cli("fuzz", "sampling", str(run_fixture("llama", tmp_path)), "--n-seq", "1")
    assert r.returncode == 2 and "--n-seq at least 2" in r.stderr


def run_fixture(row: str, tmp_path):
    """The manifest row's own fixture (what its lanes run)."""
    from synth.make import write_fixture
    from synth.manifest import load_manifest

    out = tmp_path / f"{row}.gguf"
    if not out.exists():
        write_fixture(load_manifest("family_tiers.toml").rows[row].spec(), out)
    return out
