"""`fuzz radix`: schedules as data (replay strings), every interleaving exactly once, PCT sampling, shrinking — and
the oracle against a real llama-server built from the pinned source: clean on dense, hybrid, recurrent and
sliding-window fixtures; slot save → restore → continue equal to the uninterrupted run; both halves of H1 (as
mutants at the server surface) caught, shrunk and replayed; no llama-server outlives a killed engine."""

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fuzz.certify.corpus import fixture_for
from fuzz.certify.schemas import validate
from fuzz.oracles.radix import (
    LANE_PLANS,
    Radix,
    RadixConfig,
    Run,
    cleared,
    drawn_trees,
    format_report,
    reduce_config,
    report,
)
from fuzz.oracles.radix_controls import batch_shape, top_k_layout
from fuzz.oracles.radix_schedules import (
    CHECKPOINT_OFFSET,
    Op,
    Schedule,
    draw_tree,
    interleavings,
    parse_plans,
    parse_tree,
    pct_events,
    random_clients,
    script_of,
    smaller,
    tree_names,
    tree_prompts,
)
from synth.errors import UserError
from synth.manifest import load_manifest
from targets import close_all, open_target
from targets.client import ENGINE_PID
from targets.llama_server_worker import server_binary

from conftest import BIN, ROOT, run_cli

T, U, SAVE = Op("complete", "T"), Op("complete", "U"), Op("save")


def orders(chains):
    """Every total order of the clients' events that keeps each client's own order (brute force)."""
    if not any(chains):
        yield []
        return
    for c, chain in enumerate(chains):
        if chain:
            for rest in orders([ch[1:] if i == c else ch for i, ch in enumerate(chains)]):
                yield [chain[0], *rest]


@pytest.mark.parametrize("clients,count", [(((T, SAVE), (T, U)), 84), (((T, T), (T, U)), 102),
                                           (((T,), (T,), (SAVE,)), 78)])
def test_every_interleaving_exactly_once(clients, count):
    """The lazy scripts are exactly the distinct executions of all total orders of start/progress events."""
    scripts = list(interleavings(clients))
    assert len(scripts) == len(set(scripts)) == count
    chains = [[(c, i) for op in ops for i in range(len(op.points) + 1)] for c, ops in enumerate(clients)]
    assert {script_of(clients, e) for e in orders(chains)} == set(scripts)
    for s in scripts:
        assert Schedule(0, 8, 24, clients, s).problem() is None


def test_replay_strings_round_trip_and_bad_ones_are_one_line_errors():
    clients = ((T, SAVE), (Op("complete", "T"), Op("cancel", "B0")))
    for script in list(interleavings(clients))[::7]:
        s = Schedule(3, 6, 12, clients, script)
        assert Schedule.parse(s.replay) == s
    assert Schedule.parse("r1:0:8:24:cT,s/cT:A.Bap.A").script[1].waits == ((0, "prompt"),)
    for bad in ("r2:0:8:24:cT:A", "r1:0:8:24:cQ:A", "r1:0:8:24:cT/cT:A", "r1:0:8:24:cT:A.A", "r1:0:8:24:r,cT:A.A",
                "r1:0:8:24:cT/cT:A.Bcd", "r1:0:8:24:k:A", "r1:x:8:24:cT:A", "r1:0:8:2:cT:A"):
        with pytest.raises(UserError) as e:
            Schedule.parse(bad)
        assert "\n" not in str(e.value) and "r1:SEED" in str(e.value)
    with pytest.raises(UserError):
        parse_plans("cT,r/cT")


def test_pct_and_random_clients_are_seeded_and_valid():
    clients = random_clients(np.random.default_rng(5), 3, 3)
    assert clients == random_clients(np.random.default_rng(5), 3, 3)
    a = [script_of(clients, pct_events(clients, np.random.default_rng(k))) for k in range(20)]
    assert a == [script_of(clients, pct_events(clients, np.random.default_rng(k))) for k in range(20)]
    assert len(set(a)) > 10  # PCT spreads over the interleavings
    for s in a:
        assert Schedule(0, 8, 24, clients, s).problem() is None
    for c in clients:
        assert c[0].kind == "complete"


def test_shrinking_candidates_are_valid_and_distinct():
    s = Schedule.parse("r1:0:8:24:cT,s,r/cT,cB0:A.Bap.A.B.A")
    assert [c.replay for c in smaller(s)] == [
        "r1:0:8:12:cT,s,r/cT,cB0:A.Bap.A.B.A",  # the trunk halved
        "r1:0:4:24:cT,s,r/cT,cB0:A.Bap.A.B.A",  # the tokens halved
        "r1:0:8:24:cT,cB0:A.A",  # client A gone (B is A now)
        "r1:0:8:24:s,r/cT,cB0:B.A.B.A",  # A's T gone, and B's wait on it
        "r1:0:8:24:cT,s/cT,cB0:A.Bap.A.B",  # A's restore gone (its save cannot go: a restore without a save)
        "r1:0:8:24:cT,s,r:A.A.A",  # client B gone
        "r1:0:8:24:cT,s,r/cB0:A.A.B.A",
        "r1:0:8:24:cT,s,r/cT:A.Bap.A.A"]


def test_a_continue_with_nothing_to_continue_is_no_schedule_and_no_shrinking_candidate():
    """Removing a client's first completion before a save leaves a restore of an empty save and a continue of it:
    what the campaign's shrinker reached, and the engine recursed on (RecursionError, the run lost). It is refused
    as a schedule, never offered as a candidate, and the reference refuses a name that is no prompt in one line."""
    with pytest.raises(UserError, match="nothing to continue"):
        Schedule.parse("r1:0:8:24:s,cU,r,k:A.A.A.A")
    s = Schedule.parse("r1:0:8:24:cT,s,cU,r,k:A.A.A.A.A")
    got = [c.replay for c in smaller(s)]
    assert "r1:0:8:24:s,cU,r,k:A.A.A.A" not in got and all(Schedule.parse(r) for r in got)
    assert [c["replay"] for c in reduce_config({"replay": s.replay})] == got  # what the bundle's shrinker runs
    rx = Radix.__new__(Radix)
    with pytest.raises(UserError, match="neither a prompt"):
        rx.grow({"prompts": {"T": [1, 2]}, "answers": {}}, "None+")


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 3), st.integers(1, 3), st.integers(0, 2 ** 16), st.integers(4, 40), st.integers(1, 12))
def test_any_schedule_replays_from_its_string_and_shrinks_to_valid_ones(n_clients, n_ops, seed, trunk, tokens):
    rng = np.random.default_rng(seed)
    clients = random_clients(rng, n_clients, n_ops)
    s = Schedule(seed, tokens, trunk, clients, script_of(clients, pct_events(clients, rng)))
    assert s.problem() is None and Schedule.parse(s.replay) == s
    for c in smaller(s):
        assert c.problem() is None and Schedule.parse(c.replay) == c
        smaller_by = [a - b for a, b in zip((s.n_ops, s.trunk, s.tokens), (c.n_ops, c.trunk, c.tokens), strict=True)]
        assert min(smaller_by) >= 0 and max(smaller_by) > 0  # smaller in one dimension, larger in none


# ---- against the real llama-server ----------------------------------------------------------------------
FAMILIES = [("llama", {"layers": 4}), ("qwen3next", {"layers": 4, "period": 4}), ("mamba2", {"layers": 4}),
            ("gemma3", {"layers": 4})]


@pytest.fixture(scope="module")
def binary():
    path = server_binary()
    assert path is not None, "llama-server is not built: `make server` builds it (scripts/build_llama_server.sh)"
    return path


def test_drawn_prompt_trees_are_seeded_and_replay_from_their_strings():
    """A drawn tree in the replay string (r2): prompts named 0, 1, ...; each a root, or an earlier prompt cut
    anywhere, at or just before its end, or around the sliding window, then fresh tokens."""
    tree = "20_0+1_0@16+7_1@7+7_3+5_25"
    p = tree_prompts(64, 0, tree)
    assert [len(p[n]) for n in tree_names(tree)] == [20, 21, 23, 14, 19, 25]
    assert p["1"][:20] == p["0"] and p["2"][:16] == p["0"][:16] and p["3"][:7] == p["1"][:7] \
        and p["4"][:14] == p["3"]
    assert p["5"][:1] != p["0"][:1] or p["5"][:2] != p["0"][:2]  # a root of its own
    assert tree_prompts(64, 0, tree) == p and tree_prompts(64, 1, tree) != p
    s = Schedule.parse("r2:0:8:20_0+1_0@16+7_1@7+7_3+5_25:c4/c1,c3:A.Bad.B")
    assert s.prompts == ("0", "1", "2", "3", "4", "5") and Schedule.parse(s.replay) == s
    for bad in ("r2:0:8:20_7+1:c0:A", "r2:0:8:20_x:c0:A", "r2:0:8:20:cT:A", "r2:0:8:20_0+1:c2:A"):
        with pytest.raises(UserError, match="replay string"):
            Schedule.parse(bad)
    rng = np.random.default_rng(0)
    trees = [draw_tree(rng, window=8) for _ in range(200)]
    assert draw_tree(np.random.default_rng(0), window=8) == trees[0]
    for t in trees:
        names = tree_names(t)
        assert 3 <= len(names) <= 6 and all(len(v) <= 80 for v in tree_prompts(64, 0, t).values())
    cuts = [int(x.split("@")[1].split("+")[0]) for t in trees for x in t.split("_") if "@" in x]
    assert {7, 8, 9} <= set(cuts)  # around the window
    at_checkpoint = covered = 0
    for t in trees:
        sizes = {k: len(v) for k, v in tree_prompts(64, 0, t).items()}
        for parent, cut, n in parse_tree(t):
            at_checkpoint += parent is not None and cut == sizes[str(parent)] - CHECKPOINT_OFFSET
            covered += parent is not None and n == 0  # a prompt the cache may cover whole (a retry, a regenerate)
    assert at_checkpoint >= 20 and covered >= 50, (at_checkpoint, covered)


def test_aimed_trees_cut_at_other_prompts_checkpoints_and_root_at_the_windows_edge():
    """With the host cache off the drawn trees aim at a slot's own checkpoints: cuts where another earlier prompt
    left its checkpoint, roots whose checkpoint lands at the window's edge (laguna's window 4: 8 or 9 tokens)."""
    rng = np.random.default_rng(0)
    trees = [draw_tree(rng, window=4, aim=True) for _ in range(300)]
    at_edge = sum(1 for t in trees for parent, cut, n in parse_tree(t) if parent is None and n in (8, 9))
    other = 0
    for t in trees:
        items = parse_tree(t)
        sizes = [len(v) for v in tree_prompts(64, 0, t).values()]
        for i, (parent, cut, _) in enumerate(items):
            if parent is not None and cut != sizes[parent] - CHECKPOINT_OFFSET and \
                    any(cut == sizes[m] - CHECKPOINT_OFFSET for m in range(i) if m != parent):
                other += 1
    assert at_edge >= 60 and other >= 30, (at_edge, other)
    plain_rng = np.random.default_rng(0)
    plain_edge = sum(1 for _ in range(300) for parent, cut, n in parse_tree(draw_tree(plain_rng, window=4))
                     if parent is None and n in (8, 9))
    assert plain_edge < at_edge / 2, (plain_edge, at_edge)


def test_a_one_token_prompt_with_children_is_drawn_without_error():
    """A prompt cut at 1 with no new tokens is 1 token long; a child of it has no cut inside it (the draw once
    raised there: 26 of 5,926 seeded draws)."""
    for aim in (False, True):
        for seed in range(400):
            rng = np.random.default_rng(seed)
            for _ in range(5):
                for _, cut, _ in parse_tree(draw_tree(rng, window=4, aim=aim)):
                    assert cut is None or cut >= 1


@pytest.mark.llama
@pytest.mark.server
def test_clean_upstream_passes_drawn_prompt_trees(binary, fixtures):
    """The prefix-cache lane's drawn surface on a dense, a hybrid and a sliding-window fixture, both KV layouts: 8
    schedules each (counted, not timed), clean."""
    for family, knobs in (("llama", {"layers": 4}), ("qwen3next", {"layers": 4, "period": 4}),
                          ("gemma2", {"layers": 4})):
        for unified in (False, True):
            rep = Radix(fixtures(family, **knobs), RadixConfig(tree="drawn", mode="pct", clients=2, ops=3, limit=2,
                                                               schedules=8, budget=0.0, tokens=6,
                                                               kv_unified=unified)).run()
            assert rep["status"] == "pass" and rep["explored"] == 8, (family, unified, rep["finding"])
            assert all(r["replay"].startswith("r2:") for r in rep["runs"])


@pytest.mark.llama
@pytest.mark.server
def test_clean_upstream_restores_only_a_prompts_own_checkpoints(binary, fixtures):
    """The drawn trees aimed at each slot's checkpoints (host cache off) on laguna (window 4, full attention every
    fourth layer): the server restores checkpoints, and every one was made from the prompt's own tokens."""
    fixture = fixtures("laguna")
    for unified in (False, True):
        rep = Radix(fixture, drawn_trees(12, kv_unified=unified, cache_ram=0)).run()
        assert rep["status"] == "pass" and rep["explored"] == 12, rep["finding"]
        assert sum(r["restores"] for r in rep["runs"]) >= 1 and not any(r.get("unjudged") for r in rep["runs"])


@pytest.mark.parametrize("family,knobs", FAMILIES, ids=[f for f, _ in FAMILIES])
@pytest.mark.llama
@pytest.mark.server
def test_clean_upstream_passes_the_lane_plans(binary, fixtures, family, knobs):
    rep = Radix(fixtures(family, **knobs), RadixConfig(plan=LANE_PLANS, limit=6, tokens=6, budget=0.0)).run()
    assert rep["status"] == "pass" and not rep["flaky"], rep["finding"] or rep["flaky"]
    assert rep["explored"] == 18 and len(rep["runs"]) == 18
    promised = sum(r["promised"] for r in rep["runs"])
    assert sum(r["reused"] for r in rep["runs"]) >= promised
    assert (promised == 0) == (family == "gemma3")  # sliding window: nothing promised (REUSE_POLICY)


@pytest.mark.parametrize("family,knobs", FAMILIES, ids=[f for f, _ in FAMILIES])
@pytest.mark.llama
@pytest.mark.server
def test_save_restore_continue_equals_the_uninterrupted_run(binary, fixtures, family, knobs):
    """A completes T, saves, completes U (T leaves the slot), restores, continues T's conversation: the answer is
    the cold run's, and (not sliding-window) every restored token is reused."""
    r = Radix(fixtures(family, **knobs), RadixConfig(replay="r1:0:8:24:cT,s,cU,r,k:A.A.A.A.A"))
    rep = r.run()
    assert rep["status"] == "pass", rep["finding"]
    ops = {o["code"]: o for o in rep["runs"][0]["ops"]}
    assert ops["s"]["n_tokens"] == ops["r"]["n_tokens"] == 24 + 7
    assert ops["k"]["tokens"] == r.refs[(0, 8, 24, "")]["answers"]["T+"]["tokens"]
    assert rep["runs"][0]["promised"] == (0 if family == "gemma3" else 24 + 7)
    if family != "gemma3":
        assert ops["k"]["cache_n"] == 24 + 7


@pytest.mark.llama
@pytest.mark.server
def test_a_restore_that_reuses_nothing_is_its_own_finding(binary, fixtures):
    """The cache reports the restore done (31 tokens) and the answer is right, but nothing is reused: no-reuse,
    not a wrong answer."""
    rep = Radix(fixtures("llama", layers=4), RadixConfig(replay="r1:0:8:24:cT,s,cU,r,k:A.A.A.A.A",
                                                         target="mutant:radix-restore-reuses-nothing")).run()
    (f,) = rep["finding"]["findings"]
    assert f["kind"] == "no-reuse" and f["op"] == "continue" and "from a restore" in f["message"]
    assert "0 prompt tokens from the cache" in f["message"] and "extends 31" in f["message"]


def test_the_reuse_floor_follows_the_policy(fixtures):
    held, more = list(range(31)), list(range(31)) + [7, 8]
    dense = Radix(fixtures("llama", layers=4), RadixConfig())
    assert dense.floor(held, held[:24]) == 23 and dense.floor(held, more) == 31 and dense.floor([], more) == 0
    hybrid = Radix(fixtures("qwen3next", layers=4, period=4), RadixConfig())
    assert hybrid.floor(held, held[:24]) == 0 and hybrid.floor(held, more) == 31
    swa = Radix(fixtures("gemma3", layers=4), RadixConfig())
    assert swa.floor(held, more) == 0


@pytest.mark.llama
@pytest.mark.server
def test_a_unified_cache_forfeits_an_idle_slot_at_another_clients_start(binary, fixtures):
    """A completes T; B completes B0 once A is done; A continues. One KV cache per slot: A's slot still holds T and
    its answer, all 31 tokens promised and reused. One unified cache (--kv-unified): B's start saved A's idle slot
    to the host cache and cleared it, so nothing is promised — and llama-server, asked for slot 0 by id, does not
    look in the host cache for an empty slot (it looks only when it chooses the slot, or the slot keeps under half
    of what it held): 0 reused. The same answers either way."""
    fixture = fixtures("llama", layers=4)
    script = "r1:0:8:24:cT,k/cB0:A.Bad.Abd"
    per_slot = Radix(fixture, RadixConfig(replay=script)).run()
    unified = Radix(fixture, RadixConfig(replay=script, kv_unified=True)).run()
    assert per_slot["status"] == unified["status"] == "pass", per_slot["finding"] or unified["finding"]
    ops = [{o["op"]: (o["cache_n"], o["tokens"]) for o in rep["runs"][0]["ops"]} for rep in (per_slot, unified)]
    assert ops[0]["A1"][0] == 31 and per_slot["runs"][0]["promised"] == 31
    assert ops[1]["A1"][0] == 0 and unified["runs"][0]["promised"] == 0
    assert {k: v[1] for k, v in ops[0].items()} == {k: v[1] for k, v in ops[1].items()}
    # a bundle replays the layout it was found in
    from fuzz.oracles.prefix_cache import ORACLE as PREFIX_CACHE
    from fuzz.oracles.prefix_cache import PrefixCacheConfig
    from fuzz.oracles.radix import ORACLE as RADIX

    assert RADIX.case_config(RadixConfig(kv_unified=True))["kv_unified"] is True
    assert PREFIX_CACHE.case_config(PrefixCacheConfig(kv_unified=True))["kv_unified"] is True


def test_an_unordered_start_may_clear_a_unified_slot():
    """`cleared(z, x, ops)`: another client's completion y clears z's slot unless the engine knew the server had y
    before x was started (y.known <= x.step) or had z before y was started (z.known <= y.step). Slot actions and
    z's own client never clear it."""
    def op(client, kind, step, known):
        return {"client": client, "op": Op(kind, "T"), "step": step, "known": known}

    x, z = op(0, "complete", 0, 1), op(0, "continue", 3, 6)
    for y, clears in ((op(1, "complete", 2, 4), True),   # between x and z: the old rule's case
                      (op(1, "cancel", 4, 5), True),     # right after z, before the server surely had z
                      (op(1, "complete", 0, 1), True),   # right before x, not known to the server before x started
                      (op(1, "complete", 0, 0), False),  # the server had it before x started
                      (op(1, "complete", 6, 7), False),  # started once the server had z
                      (op(1, "restore", 2, 3), False),   # a slot action clears nothing
                      (op(0, "complete", 2, 3), False)):  # z's own client
        assert cleared(z, x, {"x": x, "z": z, "y": y}) is clears, y


@pytest.mark.llama
@pytest.mark.server
def test_a_start_the_script_does_not_order_forfeits_a_unified_slot(binary, fixtures):
    """A completes T, saves, completes U, restores T and continues it; B disconnects from B0 mid-stream. One KV cache
    (--kv-unified): with B's start and A's restore back to back the server takes either first, and when the restore
    comes first B's start clears the restored idle slot and A's continue reuses nothing (seen now and then on
    smollm3, every time when B's request was held back 50 ms): nothing is promised. With the restore waiting for
    B's first token the server surely had B first: the 29 restored tokens are promised and reused."""
    fixture = fixtures("llama", layers=4)
    racing, ordered = (Radix(fixture, RadixConfig(replay=f"r1:0:6:24:cT,s,cU,r,k/xB0:A.A.A.Bad.{step}.Abd",
                                                  kv_unified=True)).run() for step in ("A", "Abp"))
    assert racing["status"] == ordered["status"] == "pass", racing["finding"] or ordered["finding"]
    assert racing["runs"][0]["promised"] == 0
    assert ordered["runs"][0]["promised"] == 29
    assert {o["op"]: o["cache_n"] for o in ordered["runs"][0]["ops"] if o["op"] == "A4"} == {"A4": 29}


@pytest.mark.llama
@pytest.mark.server
def test_a_unified_layout_measures_what_placement_moves(binary, fixtures):
    """With one KV cache for the slots, a sequence that continues into cells another slot freed — beside it (their
    cells interleaved) or below a restore of it — moves by a few 1e-3 (flash attention sums cells in cell order; the
    rows are the cold run's bytes): measured once per run, picks at margins below 4x it are not judged. One KV cache
    per slot: nothing measured, the strict margin stays."""
    fixture = fixtures("llama", layers=4)
    script = "r1:0:6:24:cT,k/cB0:A.Bad.Abd"
    unified = Radix(fixture, RadixConfig(replay=script, kv_unified=True)).run()
    per_slot = Radix(fixture, RadixConfig(replay=script)).run()
    assert unified["status"] == per_slot["status"] == "pass"
    noise = unified["noise"]
    assert 1e-3 < noise["placement"] < 2e-2 and noise["near_tie"] == pytest.approx(4 * noise["placement"])
    assert "noise" not in per_slot


# a drawn tree on the deepseek3 row (DSA, indexer top-4) with one KV cache for both slots: B2 reuses 10 cells B's
# first complete computed, and when that complete was batched with A's (timing decides) B2 answers 48 for 2 at its
# 4th token
DSA_UNIFIED_REPLAY = "r2:0:6:14_0@10+1_0@10+7_0@10+11_1@6+3_25:c1,s,x4/c1,c1,c3:A.B.B.B.Abd.A"
# a drawn tree on the laguna row (MoE: 2 of 4 experts) with one KV cache for both slots and the host cache on: B's
# prompt is processed while A still decodes (timing decides), their cells interleave, and B1, restored from a
# checkpoint, answers 63 for 25 at its 3rd token — a router near-tie flash attention's cell order crosses (the memory
# oracle traces it on the API: tests/test_memory.py)
MOE_UNIFIED_REPLAY = "r2:0:6:7_0@5+0_0@5+6_0@1+6_2@4+0_4@3+11:c0,c3,s/c5,c0,c3:A.A.Bap.B.B.A"


@pytest.mark.llama
@pytest.mark.server
@pytest.mark.parametrize("selects,replay,diverged_at,why,cold_when_uncached", [
    ("dsa", DSA_UNIFIED_REPLAY, "B2 (c3, slot 1): token 3: 48 for 2",
     "the attention keeps each query's top-4 keys (DSA indexer)", True),
    ("moe", MOE_UNIFIED_REPLAY, "B1 (c0, slot 1): token 2: 63 for 25",
     "the router picks each token's top-2 of 4 experts (MoE)", None)])
def test_a_top_k_swap_one_kv_cache_makes_is_numerics_not_a_finding(binary, fixtures, tmp_path, selects, replay,
                                                                      diverged_at, why, cold_when_uncached):
    """A model that picks a top-k by score — DSA's indexer keeps each query's top-k keys, a MoE router each token's
    top experts — can swap the k-th one when one KV cache for the slots moves the scores (where cells sit orders flash
    attention's sums; what a prompt was batched with), a different token however clear the pick's margin. Such a
    divergence is explained when the same schedule answers cold with one KV cache per slot (the same reuse): numerics
    with that cause (and what the prompt cache off does), never a finding, however the run's timing falls. Per slot
    the schedule passes with nothing to explain; a model without top-k selection explains nothing."""
    fixture = fixtures("deepseek32", layers=6, indexer_top_k=4) if selects == "dsa" else \
        fixture_for(load_manifest().rows["laguna"], tmp_path)  # (the deepseek3 row's recipe; the laguna row)
    cfg = dict(replay=replay, tree="drawn", tokens=6)
    rx = Radix(fixture, RadixConfig(kv_unified=True, **cfg))
    assert (rx.top_k, rx.experts) == ((4, (2, 4)) if selects == "dsa" else (0, (2, 4)))
    rx.ref_t, rx.srv = open_target("llama-server"), open_target("llama-server")
    try:
        diverged = Run(Schedule.parse(replay), findings=[
            {"kind": "diverged", "op": "complete", "client": 1, "message": diverged_at}])
        said = top_k_layout(rx, diverged)
        assert said.startswith(f"{why}, and one KV cache for all slots moves their scores: the same schedule answers "
                               "cold with one KV cache per slot (the same reuse); on the one KV cache with the prompt "
                               "cache off it ")
        assert cold_when_uncached is None or said.endswith("answers cold" if cold_when_uncached else "moves too")
        mixed = Run(diverged.schedule, findings=[*diverged.findings, {"kind": "leaked-slot", "op": "-", "client": None,
                                                                       "message": ""}])
        assert rx.explain(mixed.schedule, mixed, mixed.to_dict()) == {}  # a leak beside it: nothing explained
    finally:
        close_all([rx.ref_t, rx.srv])
    for _ in range(3):
        unified = Radix(fixture, RadixConfig(kv_unified=True, **cfg)).run()
        assert unified["status"] == "pass" and unified["finding"] is None
        assert all(x["cause"].startswith(why) for x in unified["numerics"])
        assert not {x["replay"] for x in unified["numerics"]} & {x["replay"] for x in unified["flaky"]}
        assert {r["status"] for r in unified["runs"]} <= {"numerics" if unified["numerics"] else "pass"}
    per_slot = Radix(fixture, RadixConfig(**cfg)).run()
    assert per_slot["status"] == "pass" and per_slot["numerics"] == [] and per_slot["flaky"] == []
    dense = Radix(fixtures("llama", layers=4), RadixConfig(kv_unified=True, replay="r1:0:6:24:cT/cT:A.B"))
    assert (dense.top_k, dense.experts) == (0, None) and top_k_layout(dense, diverged) is None


# glm-4.7-flash's row (MLA, MoE), one client, one KV cache per slot: a prompt, a second turn, a third; the third's
# fifth token turns 48 → 19 (cold margin 0.004) — what the same tokens fed in the server's batch shapes give on the
# API too (measured: with flash attention the server's shapes pick 19 and the cold run's 48; without, both pick 19)
GLM_THIRD_TURN = "r2:1:6:25_0@24+11_1@30+10_2@21+5_1@33+6_0@20+5:c5,k,k:A.A.A"


@pytest.mark.llama
@pytest.mark.server
def test_a_pick_the_models_own_batch_shapes_turn_is_numerics_not_a_finding(binary, tmp_path):
    """A conversation's tokens reach the model in other batch shapes than its cold run's (each generated token
    alone, then the next turn's few new ones together; the cold run takes the whole prompt at once), and under flash
    attention a pick at a small margin turns. The batch-shape control answers the prompt cold one token per ubatch,
    with no cache at all: it turns the same token the same way, so the divergence is numerics with that cause, not a
    finding. A divergence the control does not reproduce (another token) stays a finding."""
    fixture = fixture_for(load_manifest().rows["glm-4.7-flash"], tmp_path)
    rep = Radix(fixture, RadixConfig(replay=GLM_THIRD_TURN, tree="drawn", tokens=6)).run()
    assert rep["status"] == "pass" and rep["finding"] is None, rep["finding"]
    (x,) = rep["numerics"]
    assert x["findings"][0]["message"].startswith("A2 (k=5++, slot 0): token 4: 19 instead of 48")
    assert x["cause"].startswith("the model's batch shapes, not the cache: answered cold one token per ubatch (no "
                                 "cache), 5++'s token 4 turns the same way")
    rx = Radix(fixture, RadixConfig(replay=GLM_THIRD_TURN, tree="drawn", tokens=6))
    rx.ref_t, rx.srv = open_target("llama-server"), open_target("llama-server")
    try:
        run = rx.run_schedule(rx.fixed)
        (f,) = run.findings
        assert f["prompt"] == "5++" and f["tokens"][4] == 19
        other = Run(run.schedule, findings=[{**f, "tokens": [*f["tokens"][:4], 20, *f["tokens"][5:]]}])
        assert batch_shape(rx, other) is None and batch_shape(rx, run).startswith("the model's batch shapes")
    finally:
        close_all([rx.ref_t, rx.srv])


# case 126 of seed 0's campaign: gemma3, every layer sliding-window (window 8), q4_0 weights
CASE_126 = ('{"dtype":"q4_0","extra":{},"family":"gemma3","head_dim":16,"indexer":false,"indexer_top_k":0,'
            '"kv_lora_rank":0,"n_ctx_train":256,"n_embd":32,"n_expert":0,"n_expert_shared":0,"n_expert_used":0,'
            '"n_ff":64,"n_ff_exp":0,"n_head":4,"n_head_kv":[2,2,2,2,2],"n_leading_dense":0,"n_vocab":64,'
            '"pattern":"AAAAA","q_lora_rank":0,"seed":37974}')
CASE_126_REPLAY = "r1:54763:4:24:cT,k/cT,cB0:B.A.Abp.Bad"


@pytest.mark.llama
def test_a_sequence_continuing_into_cells_another_freed_keeps_its_rows_and_moves_by_summation_order(llama, tmp_path):
    """The cause of case 126's divergence, at llama.cpp's level (one KV cache for two sequences, flash attention on,
    as llama-server runs them): A and B answer T side by side (their cells interleave), B is cleared (what
    --cache-idle-slots does at A's next start), A's second turn continues into B's freed cells, below its own. A's
    rows stay the cold run's bytes at every position, and with B left in place A is bit-exact with the cold run; but
    attention now meets A's cells in another order and CPU flash attention accumulates V in f16, so its logits move
    by ~6e-2 — enough to flip the second token, whose cold margin is 3e-2. With flash attention off: bit-exact."""
    from fuzz.engine.parity import context_params
    from fuzz.oracles.radix_schedules import prompt_tree
    from synth.make import write_fixture
    from synth.spec import ModelSpec
    from targets.kvstate import kv_caches

    path = tmp_path / "case126.gguf"
    write_fixture(ModelSpec.from_json(CASE_126), path)
    tree = prompt_tree(64, 54763, 24)
    T, tail, answer = tree["T"], tree["tail"], [9, 63, 60, 8]  # T's cold answer
    then = [43, 30, 39, 38]  # the second turn's cold answer, teacher-forced

    def run(fa: bool, layout: str):
        assert llama.load(str(path), **context_params(n_seq=2, n_ctx=512, n_batch=256, kv_unified=True,
                                                      flash_attn=fa)).ok
        if layout == "cold":
            steps = [{"tokens": T + answer[:3], "seq": 0, "pos": list(range(27)), "logits": "none"}]
        else:
            steps = [{"tokens": T, "seq": s, "pos": list(range(24)), "logits": "none"} for s in (1, 0)]
            steps += [{"tokens": [answer[k]] * 2, "seq": [0, 1], "pos": [24 + k] * 2, "logits": "none"}
                      for k in range(3)]
        assert llama.script(steps, reset=True).ok
        if layout == "cleared":
            assert llama.call("seq_rm", seq=1, p0=-1, p1=-1).ok
        held = llama.state_get(0).data["blob"]  # what A continues from
        more = [{"tokens": [answer[3], *tail], "seq": 0, "pos": [27, 28, 29], "logits": "last"}]
        more += [{"tokens": [x], "seq": 0, "pos": [30 + i], "logits": "last"} for i, x in enumerate(then[:3])]
        r = llama.script(more)
        assert r.ok
        return [x["logits"][-1] for x in r.data["results"]], held

    def moved(a, b):
        return max(float(np.max(np.abs(x.astype(np.float64) - y))) for x, y in zip(a, b, strict=True))

    cold, cold_rows = run(True, "cold")
    kept, _ = run(True, "kept")
    cleared, cleared_rows = run(True, "cleared")
    assert moved(cold, kept) == 0.0
    assert 1e-2 < moved(cold, cleared) < 0.2
    rows = kv_caches(cold_rows, 2)
    assert rows == kv_caches(cleared_rows, 2) and len(rows[1]) == 8  # the window's rows, the same bytes
    assert int(np.argmax(cleared[1])) != int(np.argmax(cold[1])) == then[1]
    top = np.sort(cold[1])[::-1]
    assert top[0] - top[1] < 0.05
    off_cold, off_cleared = run(False, "cold")[0], run(False, "cleared")[0]
    assert moved(off_cold, off_cleared) == 0.0


@pytest.mark.llama
@pytest.mark.server
def test_a_second_turn_into_freed_cells_is_judged_against_the_measured_placement(binary, tmp_path):
    """Case 126 on the real server with one KV cache: the second turn's second token flips at a cold margin of 3e-2
    (above). The placement control now measures the move it is judged against where the server really leaves a
    sequence so — a second turn into cells another slot freed beside it — (4e-2 here; the restore-only control
    measured 0 on this sliding-window model, whose restored prompt is processed again) and the pick is not judged:
    the schedule passes. Per slot the layout never arises and it passes with the strict margin."""
    from synth.make import write_fixture
    from synth.spec import ModelSpec

    path = tmp_path / "case126.gguf"
    write_fixture(ModelSpec.from_json(CASE_126), path)
    unified = Radix(path, RadixConfig(replay=CASE_126_REPLAY, kv_unified=True, tokens=4)).run()
    per_slot = Radix(path, RadixConfig(replay=CASE_126_REPLAY, tokens=4)).run()
    assert unified["status"] == per_slot["status"] == "pass", unified["finding"] or per_slot["finding"]
    assert 1e-2 < unified["noise"]["placement"] < 0.1 and unified["noise"]["near_tie"] > 3e-2
    (a1,) = [o for o in unified["runs"][0]["ops"] if o["op"] == "A1"]
    assert a1["cache_n"] == 27  # the second turn reused its own 27 cells


@pytest.mark.llama
@pytest.mark.server
def test_the_host_prompt_cache_path_is_exercised(binary, fixtures):
    """T moved out of slot A by U (into the host cache, --cache-ram), then asked for again on slot A: its answer is
    the cold run's, taken from the cache. On slot B (which holds U) it may come from the cache too: whether slot A
    was saved there again depends on whether A was released before B's request arrived — so it is counted, never
    promised (REUSE_POLICY); the answer is judged either way."""
    rep = Radix(fixtures("llama", layers=4), RadixConfig(replay="r1:0:8:24:cT,cU,cT/cU,cT:A.A.A.B.B")).run()
    assert rep["status"] == "pass", rep["finding"]
    reused = [(o["op"], o["cache_n"]) for o in rep["runs"][0]["ops"]]
    assert reused[:4] == [("A0", 0), ("A1", 0), ("A2", 23), ("B0", 0)] and reused[4] in (("B1", 0), ("B1", 23))
    assert rep["runs"][0]["promised"] == 0


@pytest.mark.slow
@pytest.mark.llama
@pytest.mark.server
@pytest.mark.parametrize("family,knobs", FAMILIES, ids=[f for f, _ in FAMILIES])
def test_pct_exploration_of_three_clients_is_clean(binary, fixtures, family, knobs):
    """The nightly's longer exploration: 3 clients × 3 random operations, PCT-sampled, 50 schedules per family
    (counted, no time limit)."""
    rep = Radix(fixtures(family, **knobs), RadixConfig(clients=3, ops=3, mode="pct", schedules=50, budget=0.0)).run()
    assert rep["status"] == "pass" and not rep["flaky"], rep["finding"] or rep["flaky"]
    assert rep["explored"] == 50


@pytest.mark.llama
@pytest.mark.server
@pytest.mark.parametrize("mutant,shrunk,phase,op", [
    ("radix-dup-leak", "r1:0:3:4:cU/cU:A.B", "leaked-slot", "schedule"),
    ("radix-replace-live-borrower", "r1:0:3:4:cU,k/cU:A.A.Bap", "diverged", "continue")])
def test_both_halves_of_h1_are_caught_shrunk_and_replayed(binary, fixtures, tmp_path, mutant, shrunk, phase, op):
    fixture = fixtures("llama", layers=4)
    out = tmp_path / "b"
    r = run_cli("fuzz", "radix", str(fixture), "--target", f"mutant:{mutant}", "--bundle", str(out),
                "--report", str(tmp_path / "r.json"))
    assert r.returncode == 1, r.stdout + r.stderr
    rep = json.loads((tmp_path / "r.json").read_text())
    validate(rep, "report")
    f = rep["findings"][0]
    assert f["reproduced"] and f["fingerprint"] == {"oracle": "radix", "status": "finding", "phase": phase,
                                                    "where": op}
    (bundle,) = out.iterdir()
    data = json.loads((bundle / "bundle.json").read_text())
    validate(data, "bundle")
    assert data["config"]["replay"] == shrunk  # ≤ 2 clients, ≤ 4 operations, trunk 4, 3 tokens
    s = Schedule.parse(shrunk)
    assert len(s.clients) == 2 and s.n_ops <= 4
    again = run_cli("fuzz", "replay", str(bundle))
    assert again.returncode == 1, again.stdout + again.stderr
    fixed = run_cli("fuzz", "replay", str(bundle), "--target", "llama-server")
    # not reproduced on the real server, and the replay says what it saw instead: the schedule, passing
    assert fixed.returncode == 0 and f"replay {shrunk}: 1 schedules" in fixed.stdout, fixed.stdout + fixed.stderr
    assert fixed.stdout.splitlines()[-2] == "pass: 0 findings", fixed.stdout
    again = run_cli("fuzz", "radix", str(fixture), "--target", f"mutant:{mutant}", "--replay", shrunk)
    assert again.returncode == 1 and "reproduced 3 of 3" in again.stdout
    assert run_cli("fuzz", "radix", str(fixture), "--replay", shrunk).returncode == 0


@pytest.mark.llama
@pytest.mark.server
@pytest.mark.parametrize("mutant,replay,kind", [
    ("radix-dup-leak", "r1:0:3:4:cU/cU:A.B", "leaked-slot"),
    ("radix-replace-live-borrower", "r1:0:3:4:cU,k/cU:A.A.Bap", "diverged"),
    ("radix-restore-reuses-nothing", "r1:0:8:24:cT,s,cU,r,k:A.A.A.A.A", "no-reuse")])
def test_the_h1_mutants_are_caught_with_one_kv_cache_too(binary, fixtures, mutant, replay, kind):
    """The lane runs llama-server's default layout too (one KV cache for all slots): each re-created radix bug is
    caught there on its shrunk schedule, reproduced 3 of 3, and the real server passes the same schedule."""
    fixture = fixtures("llama", layers=4)
    caught = Radix(fixture, RadixConfig(replay=replay, kv_unified=True, target=f"mutant:{mutant}")).run()
    assert caught["status"] == "finding" and caught["finding"]["findings"][0]["kind"] == kind, caught["finding"]
    clean = Radix(fixture, RadixConfig(replay=replay, kv_unified=True)).run()
    assert clean["status"] == "pass", clean["finding"]


@pytest.mark.llama
@pytest.mark.server
def test_the_interleaving_decides(binary, fixtures):
    """The same two operations: concurrent (B before A is seen done) leaks on the mutant; in sequence it does not."""
    fixture = fixtures("llama", layers=4)
    hit = Radix(fixture, RadixConfig(replay="r1:0:4:8:cT/cT:A.B", target="mutant:radix-dup-leak")).run()
    miss = Radix(fixture, RadixConfig(replay="r1:0:4:8:cT/cT:A.Bad", target="mutant:radix-dup-leak")).run()
    assert hit["status"] == "finding" and miss["status"] == "pass"


@pytest.mark.llama
@pytest.mark.server
def test_the_drawn_surface_goes_on_past_a_finding(binary, fixtures):
    """The drawn trees on the H1 leak mutant: the second schedule leaks a slot (reproduced, reported); the lanes' and
    the campaign's drawn surface explores all 12 schedules anyway, reporting that finding once and counting the four
    later schedules that leak the same way (not replayed); a run told not to go on stops at the second."""
    fixture = fixtures("llama", layers=4)
    got = report(fixture, drawn_trees(12, target="mutant:radix-dup-leak"))
    validate(got.to_dict(), "report")  # drawn trees' replay strings and `again` as the schema says
    rep = got.native
    assert rep["status"] == "finding" and rep["explored"] == 12 and len(rep["runs"]) == 12
    (found,) = rep["found"]
    assert [x["kind"] for x in found["findings"]] == ["leaked-slot"] and rep["finding"] == found
    assert len(rep["again"]) == 4 and found["replay"] not in rep["again"]
    assert "the same findings again in 4 more schedules (not replayed)" in format_report(rep)
    once = Radix(fixture, replace(drawn_trees(12, target="mutant:radix-dup-leak"), keep_going=False)).run()
    assert once["explored"] == 2 and [f["replay"] for f in once["found"]] == [found["replay"]] and not once["again"]


@pytest.mark.llama
@pytest.mark.server
def test_no_llama_server_outlives_a_killed_engine(binary, fixtures, tmp_path):
    fixture = tmp_path / "kill-me.gguf"
    fixture.write_bytes(fixtures("llama", layers=4).read_bytes())
    p = subprocess.Popen([str(BIN / "fuzz"), "radix", str(fixture), "--budget", "120"], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)

    started, left = kill_engine_once_started(p, f"llama-server -m {fixture}", within=10)
    assert started, "the engine never started a llama-server"
    assert not left, f"a llama-server outlived the engine:\n{processes(left)}"


def kill_engine_once_started(p: subprocess.Popen, server: str, within: float) -> tuple[bool, list[str]]:
    """Wait (up to 60 s) for a process matching `server` (pgrep -f), SIGKILL the engine `p`, then give what it
    started `within` seconds to go: (whether one started, the pids still there). What it started: the servers
    matching `server` and every process carrying the engine's pid in its environment (its workers, and their
    servers) — a worker the engine forked as it died may start its server after the first ones are gone, so an
    instant with no server matching is not the end."""
    def servers() -> list[str]:
        return subprocess.run(["pgrep", "-f", server], capture_output=True, text=True).stdout.split()

    deadline = time.monotonic() + 60
    while not servers() and time.monotonic() < deadline:
        time.sleep(0.05)
    if not servers():
        return False, []
    os.kill(p.pid, signal.SIGKILL)
    p.wait()

    def left() -> list[str]:
        return sorted(set(servers()) | set(engine_children(p.pid)))

    deadline = time.monotonic() + within
    while left() and time.monotonic() < deadline:
        time.sleep(0.05)
    return True, left()


def engine_children(engine: int) -> list[str]:
    """Pids of the processes whose environment names `engine` as the engine that started them (a worker, and what
    it runs)."""
    mark = f"{ENGINE_PID}={engine}".encode()
    out = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and mark in (proc / "environ").read_bytes().split(b"\0"):
                out.append(proc.name)
        except OSError:  # (gone, or not ours to read)
            pass
    return out


def processes(pids: list[str]) -> str:
    """ps lines for these pids and their parents (who started a survivor, and is that one still there?)."""
    ps = ["ps", "-o", "pid,ppid,pgid,stat,etime,wchan:20,args", "-p"]
    mine = subprocess.run([*ps, ",".join(pids)], capture_output=True, text=True).stdout
    parents = {ln.split()[1] for ln in mine.splitlines()[1:] if ln.split()}
    return mine + subprocess.run([*ps, ",".join(parents or {"1"})], capture_output=True, text=True).stdout


def stand_in_server(tmp_path: Path, marker: str) -> Path:
    """A llama-server stand-in that answers --help at once and otherwise never listens (sleeps 600 s, `marker` in
    its command line)."""
    sleeper = tmp_path / "llama-server"
    sleeper.write_text(f'#!/bin/sh\ncase " $* " in *" --help "*) exit 0;; esac\n'
                       f'exec "{sys.executable}" -c "import time; time.sleep(600)" {marker}\n')
    sleeper.chmod(0o755)
    (tmp_path / "x.gguf").write_bytes(b"GGUF")
    return sleeper


@pytest.mark.llama
def test_a_worker_busy_in_a_request_goes_with_a_killed_engine(tmp_path):
    """A killed engine closes its workers' stdin, but a worker in the middle of a request reads it only when the
    request ends — here a load waiting up to 300 s for a server that never becomes healthy (a stand-in). The worker
    notices its engine is gone and exits within a second, its server with it."""
    marker = f"stand-in-server-{os.getpid()}"
    sleeper = stand_in_server(tmp_path, marker)
    engine = ("from targets import open_target\n"
              "t = open_target('llama-server', timeout=600)\n"
              f"t.call('load', path={str(tmp_path / 'x.gguf')!r}, start_timeout=300)\n")
    p = subprocess.Popen([sys.executable, "-c", engine], cwd=ROOT, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, env={**os.environ, "FAMILY_CERTIFY_LLAMA_SERVER": str(sleeper)})

    try:
        started, left = kill_engine_once_started(p, f"sleep.600. {marker}", within=5)
        assert started, "the worker never started the stand-in server"
        assert not left, "a worker busy in a load outlived its engine, and kept its server"
    finally:
        p.kill()
        subprocess.run(["pkill", "-f", f"sleep.600. {marker}"])


@pytest.mark.llama
def test_a_worker_whose_engine_died_before_it_looked_goes_at_once(tmp_path):
    """An engine killed while its worker is still starting leaves a load in the worker's pipe; the worker, already
    reparented when it first looks at its parent, knows its engine by the pid in its environment: it exits within
    a second, and the server that load started with it (not after the load's 300 s)."""
    marker = f"stand-in-server-orphan-{os.getpid()}"
    sleeper = stand_in_server(tmp_path, marker)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    load = json.dumps({"id": 1, "op": "load", "path": str(tmp_path / "x.gguf"), "start_timeout": 300})
    w = subprocess.Popen([sys.executable, "-m", "targets.llama_server_worker"], cwd=ROOT, stdin=subprocess.PIPE,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                         env={**os.environ, "FAMILY_CERTIFY_LLAMA_SERVER": str(sleeper),
                              "FAMILY_CERTIFY_ENGINE_PID": gone.stdout.strip()})  # (an engine no more)
    try:
        w.stdin.write((load + "\n").encode())
        w.stdin.flush()  # (the pipe stays open: only the engine's pid says it is gone)
        assert w.wait(timeout=10) != 0
        time.sleep(0.5)
        left = subprocess.run(["pgrep", "-f", f"sleep.600. {marker}"], capture_output=True, text=True).stdout
        assert not left.split(), f"the orphaned worker's server stayed:\n{processes(left.split())}"
    finally:
        w.kill()
        subprocess.run(["pkill", "-f", f"sleep.600. {marker}"])


def test_cli_bad_input_is_one_line(tmp_path):
    for args in (["--replay", "r1:0:8:24:cT:B"], ["--plan", "cT/k"], ["--clients", "0"], ["--budget", "0"]):
        r = run_cli("fuzz", "radix", "llama", *args)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, (args, r.stderr)
    assert "--budget 0 (no time limit) needs --schedules N or --plan" in r.stderr


@pytest.mark.parametrize("bundle,shown_at,runs,reproduced", [
    ("laguna-radix-checkpoint-past-window", 3, 3, True),  # a disconnect races the server: up to three runs
    ("laguna-radix-checkpoint-past-window", 4, 3, False),
    ("jamba-handoff-2-full", 2, 1, False),  # an oracle whose runs race nothing: one
])
def test_a_replay_runs_a_racing_schedule_until_it_shows_the_finding(monkeypatch, bundle, shown_at, runs, reproduced):
    """`fuzz replay` of a radix bundle runs its schedule until the finding shows, at most three times (a client that
    disconnects races the server, which may finish the answer before it notices); other oracles' bundles run once."""
    from fuzz.repro import bundle as bd

    path = ROOT / "corpora" / "repros" / bundle
    fp = json.loads((path / "bundle.json").read_text())["fingerprint"]
    ran: list[str] = []

    def run(case):
        ran.append(case.oracle)
        return ([fp] if len(ran) == shown_at else [{**fp, "status": "pass"}]), f"report {len(ran)}"

    monkeypatch.setattr(bd, "use_recorded_build", lambda build, where: None)
    monkeypatch.setattr(bd.Case, "run", run)
    assert bd.replay(path) == (reproduced, fp, f"report {runs}") and len(ran) == runs
