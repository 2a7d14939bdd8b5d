"""fuzz server-options: llama-server under drawn options (speculative decoding, n_cmpl, checkpoint flags) answers as
uncached. The draws and the judge are pure; the runs need the pinned llama-server."""

import pytest

from fuzz.engine.contract import FINDING, KNOWN, PASS
from fuzz.oracles.server_options import (
    DRAFTS,
    SPEC_TYPES,
    ServerOptions,
    ServerOptionsConfig,
    draw,
    format_report,
    spec_args,
)
from targets.llama_server_worker import server_binary

from conftest import run_cli


def test_a_draw_is_its_seed_and_index_and_asks_only_what_a_server_can_take():
    draws = [draw(64, 0, k, list(SPEC_TYPES), None) for k in range(40)]
    assert draws[7] == draw(64, 0, 7, list(SPEC_TYPES), None) and draws[7] != draw(64, 1, 7, list(SPEC_TYPES), None)
    for d in draws:
        assert 1 <= d.slots <= 3 and d.cache_ram in (0, 64)
        assert all(2 <= n <= d.slots for n in d.n_cmpl.values()), d  # the server refuses n_cmpl above its slots
        kinds = d.args[d.args.index("--spec-type") + 1].split(",")
        assert set(kinds) <= set(SPEC_TYPES) and 1 <= len(kinds) <= 2
        assert ("-md" in d.args) == ("draft-simple" in kinds)
        if "-md" in d.args:
            assert d.args[d.args.index("-md") + 1] in DRAFTS
        assert d.prompts["repeat"][:2 * len(d.prompts["motif"])] == d.prompts["motif"] * 2  # n-grams to hit
        assert d.prompts["branch"][:2] == d.prompts["random"][:2]
        if "-ub" in d.args:  # a prompt in several ubatches; a batch at least its ubatch (the server's own rule)
            b, ub = int(d.args[d.args.index("-b") + 1]), int(d.args[d.args.index("-ub") + 1])
            assert ub in (8, 16, 32) and b in (ub, 2 * ub, 256)
    spec = [d.args[d.args.index("--spec-type") + 1] for d in draws]
    assert sum("draft-simple" in s for s in spec) >= 12 and sum("ngram" in s for s in spec) >= 20  # both kinds
    assert {d.args[d.args.index("-md") + 1] for d in draws if "-md" in d.args} == set(DRAFTS)
    assert 10 <= sum("-ub" in d.args for d in draws) <= 30
    assert 6 <= sum(d.args[-1] == "-bs" for d in draws) <= 20  # sampling in the graph (llama-server's -bs), drawn last
    assert {s for d in draws for s in d.args[d.args.index("--spec-type") + 1].split(",")} == set(SPEC_TYPES)


def test_a_build_without_a_flag_or_a_type_is_not_drawn_it():
    """An older build (a bump's base) offers fewer speculative types and flags: the draw keeps to what it offers,
    dropping a flag together with its value."""
    old = {"-ctxcp", "--spec-type", "--spec-ngram-simple-size-n", "--spec-ngram-simple-size-m"}
    for k in range(20):
        d = draw(64, 0, k, ["ngram-simple"], old)
        assert d.args[:2] == ["--spec-type", "ngram-simple"], d.args
        assert not [a for a in d.args if a.startswith("-") and a not in old], d.args
        assert all(not a.startswith("-") for a in d.args[1::2]), d.args  # each flag kept with its value
    assert spec_args(__import__("numpy").random.default_rng(0), []) == []


def judged(got: dict, cold: dict, busy=((), ())) -> dict:
    o = ServerOptions.__new__(ServerOptions)
    o.near_tie = 1e-3
    d = draw(64, 0, 0, list(SPEC_TYPES), None)
    return o.judge(d, {"got": got, "cold": cold, "busy": [list(b) for b in busy]})[0]


def test_every_answer_and_every_child_completion_is_judged_against_the_uncached_one():
    ref = {"tokens": [5, 6, 7], "top": [[[5, -0.1], [9, -2.0]], [[6, -0.1], [1, -3.0]], [[7, -0.1], [2, -3]]]}
    ok = {"tokens": [5, 6, 7], "top": [], "draft_n": 4, "draft_n_accepted": 3, "cache_n": 2}
    row = judged({"random": {**ok, "more": [dict(ok)]}}, {"random": ref})
    assert row["status"] == PASS and (row["draft_n"], row["draft_n_accepted"], row["cache_n"]) == (8, 6, 4)
    row = judged({"random": {**ok, "more": [{**ok, "tokens": [5, 1, 7]}]}}, {"random": ref})
    assert row["status"] == FINDING
    assert row["reason"] == "random (completion 2 of 2): token 1: 1 instead of 6 (the reference's margin there 2.9)"
    assert row["diverged"] == [{"name": "random", "completion": 1, "tokens": [5, 1, 7]}]
    row = judged({"random": ok}, {"random": ref}, busy=((), (2,)))
    assert row["status"] == FINDING and row["reason"] == "slots [2] still processing after round 1"


def test_the_fixture_drafting_for_itself_must_draft_and_have_every_draft_accepted_where_its_picks_are_clear():
    """draft-simple alone with -md {self}: its drafts are the target's own greedy picks, so an answer that is the
    reference, clear at every pick, has every draft token accepted; with no probability floor it drafts at all.
    A pick the reference did not list first (a banned end token the draft may still propose) is not clear."""
    from dataclasses import replace

    from fuzz.oracles.server_options import self_draft_problems

    ref = {"tokens": [5, 6, 7], "top": [[[5, -0.1], [9, -2.0]], [[6, -0.1], [1, -3.0]], [[7, -0.1], [2, -3]]]}
    d = replace(draw(64, 0, 0, list(SPEC_TYPES), None), args=[
        "--spec-type", "draft-simple", "-md", "{self}", "--spec-draft-n-max", "2", "--spec-draft-p-min", "0.0"])

    def problems(d, **answer):
        return self_draft_problems(d, {"got": {"random": {"tokens": [5, 6, 7], **answer}}, "cold": {"random": ref}},
                                   1e-3)

    assert problems(d, draft_n=4, draft_n_accepted=4) == []
    assert problems(d, draft_n=4, draft_n_accepted=3) == [
        "random: the fixture drafting for itself, 1 of 4 draft tokens rejected on an answer that is the reference's, "
        "every pick clear"]
    assert problems(d, draft_n=0, draft_n_accepted=0) == [
        "the fixture drafting for itself with no probability floor drafted nothing in 1 answers: speculative "
        "decoding did not run"]
    floor = replace(d, args=[*d.args[:-1], "0.3"])
    assert problems(floor, draft_n=0, draft_n_accepted=0) == []  # (a floor may stop every draft on a flat model)
    banned = {**ref, "top": [ref["top"][0], [[11, -0.1], [6, -0.2]], ref["top"][2]]}
    assert self_draft_problems(d, {"got": {"random": {"tokens": [5, 6, 7], "draft_n": 4, "draft_n_accepted": 2}},
                                   "cold": {"random": banned}}, 1e-3) == []
    for other in (["--spec-type", "draft-simple,ngram-mod", "-md", "{self}"], ["--spec-type", "draft-simple", "-md",
                                                                                "{other}"]):
        assert self_draft_problems(replace(d, args=[*other, "--spec-draft-p-min", "0.0"]), {"got": {"random": {
            "tokens": [5, 6, 7], "draft_n": 4, "draft_n_accepted": 0}}, "cold": {"random": ref}}, 1e-3) == []


def test_embeddings_are_drawn_beside_completions_on_several_slots_in_a_stream_of_their_own():
    """--embeddings with a pooling in 16 of seed 0's 48 schedules, only where there are several slots (one slot would
    serve the embedding after the completions, never beside them); the embedding prompt is the random prompt's first
    8 tokens (within the smallest ubatch drawn). Its own stream: the rest of a draw is the draw without it."""
    from fuzz.oracles.server_options import POOLINGS

    draws = [draw(1000, 0, k, list(SPEC_TYPES), None) for k in range(48)]
    with_it = [d for d in draws if "--embeddings" in d.args]
    assert len(with_it) == 16 and all(d.slots > 1 for d in with_it)
    assert {d.args[d.args.index("--pooling") + 1] for d in with_it} == set(POOLINGS)
    for d in draws:
        assert ("embed" in d.prompts) == (d in with_it)
        if d in with_it:
            assert d.prompts["embed"] == d.prompts["random"][:8]
            at = d.args.index("--embeddings")
            assert d.args[at:at + 3] == ["--embeddings", "--pooling", d.args[at + 2]]


def test_an_embedding_beside_completions_must_equal_the_same_prompts_alone():
    from fuzz.oracles.server_options import embedding_problems

    alone = {"embedding": [0.6, -0.8, 0.0]}
    assert embedding_problems({}) == []  # (no embedding in the schedule)
    same = {"round 1": {"embedding": [0.6, -0.8, 0.0]}, "round 2": {"embedding": [0.6, -0.8, 1e-4]}}
    assert embedding_problems({"embeddings": {**same, "alone": alone}}) == []
    zeros = {"round 1": {"embedding": [0.0, 0.0, 0.0]}, "round 2": {"error": "HTTP 500: boom"}}
    assert embedding_problems({"embeddings": {**zeros, "alone": alone}}) == [
        "the embedding sent beside the completions of round 1 differs from the same prompt's alone: NMSE 1 (the "
        "bound: 0.0001 of its power)",
        "the embedding sent beside the completions of round 2: HTTP 500: boom"]


def test_a_bundle_replays_its_schedules_flags_and_shrinks_them_one_by_one():
    """A finding's bundle runs its schedule with the flags it ran under (given, not drawn again), and the shrinker
    tries each flag (with its values) left out."""
    from fuzz.engine.contract import Finding
    from fuzz.oracles.server_options import flag_spans, reduce_config, replay_of, with_args

    f = Finding("server-options", FINDING, "x", step=12, detail={"options": "-ctxcp 0 --swa-full --embeddings "
                                                                             "--pooling mean"})
    cfg = replay_of({"schedules": 13, "seed": 0}, f)
    assert cfg == {"schedules": 13, "seed": 0, "schedule": 12,
                   "args": ["-ctxcp", "0", "--swa-full", "--embeddings", "--pooling", "mean"]}
    assert flag_spans(cfg["args"]) == [(0, 2), (2, 3), (3, 4), (4, 6)]
    assert [c["args"] for c in reduce_config(cfg)] == [
        ["--swa-full", "--embeddings", "--pooling", "mean"], ["-ctxcp", "0", "--embeddings", "--pooling", "mean"],
        ["-ctxcp", "0", "--swa-full", "--pooling", "mean"], ["-ctxcp", "0", "--swa-full", "--embeddings"]]
    d = draw(1000, 0, 3, list(SPEC_TYPES), None)
    given = with_args(d, ["--embeddings", "--pooling", "mean"])
    assert (given.slots, given.prompts["random"], given.prompts["embed"]) == (d.slots, d.prompts["random"],
                                                                               d.prompts["random"][:8])
    assert "embed" not in with_args(given, ["-ctxcp", "0"]).prompts


@pytest.mark.llama
@pytest.mark.server
@pytest.mark.parametrize("family,knobs", [("qwen3", {"layers": 2}), ("qwen3next", {"layers": 4, "period": 4})])
def test_drawn_options_answer_as_uncached_with_drafts_accepted_and_rejected(fixtures, family, knobs):
    """On an attention model and a hybrid (whose rejected drafts roll back through a checkpoint): every schedule
    passes, the draft model and the n-grams drafted, some drafts were accepted and some rejected, children of an
    n_cmpl request answered, and the draft of other weights is the family's next seed."""
    assert server_binary() is not None, "llama-server is not built: `make server`"
    rep = ServerOptions(fixtures(family, **knobs), ServerOptionsConfig(schedules=6)).report()
    rows = rep.results
    assert [r["status"] for r in rows] == [PASS] * 6, format_report(rep.native)
    drafted, accepted = sum(r["draft_n"] for r in rows), sum(r["draft_n_accepted"] for r in rows)
    assert 0 < accepted < drafted, (accepted, drafted)
    assert any(r["n_cmpl"] for r in rows) and rep.extra["drafts"]["other"] == "its family, seed + 1"


@pytest.mark.llama
@pytest.mark.server
@pytest.mark.parametrize("family,knobs,k", [("qwen3", {"layers": 2}, 8), ("qwen3next", {"layers": 4, "period": 4}, 36)])
def test_ngram_mod_alone_drafts_in_its_one_at_a_time_control_what_its_table_says(fixtures, family, knobs, k):
    """Seed 0's schedules 8 and 36 draft with ngram-mod alone: before the rounds, six requests one at a time whose
    draft counts equal the table re-derived from the slots' tokens (on the hybrid, partly accepted drafts decoded
    again from a checkpoint): drafts that hold, drafts that fail, and the table emptied by a run of poor ones."""
    rep = ServerOptions(fixtures(family, **knobs), ServerOptionsConfig(schedules=40, schedule=k)).report()
    assert [r["status"] for r in rep.results] == [PASS], format_report(rep.native)
    mod = rep.results[0]["ngram_mod"]
    assert len(mod["drafted"]) == 6 and 0 < sum(mod["accepted"]) < sum(mod["drafted"]) and mod["resets"] >= 1, mod


@pytest.mark.llama
@pytest.mark.server
def test_embeddings_beside_completions_equal_each_alone_and_mean_pooling_on_three_slots_is_upstreams_abort(fixtures):
    """qwen3's drawn schedules 2 and 6 serve embeddings (last pooling, 3 and 2 slots): both rounds' embeddings sent
    beside the completions equal the prompt's alone. Schedule 12 of llama (mean pooling, 3 slots) aborts loading:
    corpora/repros/server-embeddings-mean-pooling-parallel, known in any family by the check and mean pooling."""
    from fuzz.repro.campaign import known_repro, known_upstream

    for k in (2, 6):
        rep = ServerOptions(fixtures("qwen3", layers=2), ServerOptionsConfig(schedules=8, schedule=k)).report()
        assert [(r["status"], r.get("embeddings")) for r in rep.results] == [(PASS, 2)], format_report(rep.native)
    rep = ServerOptions(fixtures("llama"), ServerOptionsConfig(schedules=13, schedule=12)).report()
    assert [f.status for f in rep.findings] == ["crash"] and "--pooling mean" in rep.findings[0].message
    assert known_repro(known_upstream(), "llama", rep.findings[0]) == "server-embeddings-mean-pooling-parallel"


@pytest.mark.llama
@pytest.mark.server
def test_the_cli_runs_one_schedule_and_refuses_bad_input(fixtures, tmp_path):
    path = fixtures("llama", layers=2)
    r = run_cli("fuzz", "server-options", str(path), "--schedule", "2", "--report", str(tmp_path / "r.json"))
    assert r.returncode == 0, r.stderr
    assert "schedule 2 [pass]" in r.stdout and "PASS: 0 of 1 schedules" in r.stdout
    r = run_cli("fuzz", "server-options", str(path), "--schedules", "0")
    assert r.returncode == 2 and "--schedules must be at least 1" in r.stderr


@pytest.mark.llama
@pytest.mark.server
def test_the_prefix_cache_lane_runs_the_drawn_options_per_slot_seeded_by_its_row(tmp_path):
    """Per bump the lane runs PER_BUMP_OPTIONS drawn schedules in the one-cache-per-slot layout, seeded by the row:
    another row draws other options. llama's schedule 1 serves embeddings with mean pooling on 3 slots: upstream's
    abort loading (the lane's only known finding); the schedules after it still run, and one more is drawn past it
    (schedule 6)."""
    import zlib

    from fuzz.certify.server_lanes import PER_BUMP_OPTIONS, lane_prefix_cache
    from synth.make import write_fixture
    from synth.manifest import load_manifest

    row = load_manifest().row("llama")
    path = tmp_path / "llama.gguf"
    write_fixture(row.spec(), path)
    res = lane_prefix_cache(row, path, "llama-server")
    assert res.status == KNOWN and res.detail.endswith(
        "only upstream's known findings: server-embeddings-mean-pooling-parallel"), res.detail
    reps = [r for r in res.reports if r.oracle == "server-options"]
    assert len(reps) == 2 and not reps[0].config["kv_unified"] and len(reps[0].results) == PER_BUMP_OPTIONS
    assert [r["status"] for r in reps[0].results] == [PASS, "crash", PASS, PASS, PASS, PASS]
    assert "--embeddings --pooling mean" in reps[0].results[1]["options"] and reps[0].results[1]["slots"] == 3
    assert [(r["step"], r["status"]) for r in reps[1].results] == [(PER_BUMP_OPTIONS, PASS)]
    assert "1 drawn past schedules spent on known findings" in res.detail
    assert reps[0].config["seed"] == zlib.crc32(b"llama") % 100_000
    assert f"{PER_BUMP_OPTIONS + 1} drawn server-option schedules" in res.detail
    other = draw(64, zlib.crc32(b"qwen3") % 100_000, 0, list(SPEC_TYPES), None)
    assert reps[0].results[0]["options"] != " ".join(other.args)


def test_a_wrong_answer_that_is_an_error_is_judged_not_raised():
    """An answer the server gives as an error (no tokens: a mutated server once did) is a problem of the schedule;
    the margin the judge adds is computed only where there are tokens to part from the reference."""
    from fuzz.oracles.server_options import margin_at

    ref = {"tokens": [3, 1, 4], "top": [[[3, 2.0], [1, 1.5]], [[1, 2.0], [5, 0.5]], [[4, 1.0], [2, 0.9]]]}
    assert margin_at(ref, {"error": "500: the slot failed"}) == ""
    assert margin_at(ref, {"tokens": [3, 1, 9]}) == " (the reference's margin there 0.1)"
    assert margin_at(ref, {"tokens": [3, 1]}) == ""
