"""The prefix-cache lane against a real llama-server built from the pinned source: concurrent duplicate inserts
answer like the uncached reference and leave no slot busy; the H1 mutant (a duplicate insert that leaks) is
caught; the worker reports a missing binary and a dying server as what they are."""

import json

import pytest

from fuzz.oracles import prefix_cache as pc
from fuzz.oracles import server_answers as sa
from fuzz.oracles.prefix_cache import PrefixCache, PrefixCacheConfig, build_schedule, format_report
from fuzz.oracles.server_answers import compare, numerics_step
from targets import open_target
from targets.llama_server_worker import server_binary

from conftest import ROOT, run_cli
from helpers import impostor as impostor_server

pytestmark = [pytest.mark.llama, pytest.mark.server]


@pytest.fixture(scope="module", autouse=True)
def binary():
    path = server_binary()
    assert path is not None, "llama-server is not built: `make server` builds it (scripts/build_llama_server.sh)"
    return path


def test_schedule_has_a_duplicate_pair_every_round_and_is_seeded():
    a = build_schedule(64, slots=4, rounds=6, seed=3)
    assert a == build_schedule(64, slots=4, rounds=6, seed=3) and a != build_schedule(64, 4, 6, 4)
    for names in a.rounds:
        assert len(names) - len(set(names)) >= 1
    p = a.prompts
    assert p["branch1"][:24] == p["trunk"] and p["leaf"][:32] == p["branch0"]  # a radix: shared prefixes


def test_compare_judges_clear_steps_and_skips_near_ties():
    ref = {"tokens": [5, 6, 7], "top": [[[5, -0.1], [9, -2.0]], [[6, -0.5], [1, -0.5000001]], [[7, -0.1], [2, -3]]]}
    assert compare(ref, {"tokens": [5, 6, 7]}) is None
    assert compare(ref, {"tokens": [4, 6, 7]}) == "token 0: 4 instead of 5"
    assert compare(ref, {"tokens": [5, 1, 2]}) is None  # step 1 is a near-tie: not judged from there on


def test_compare_stops_where_the_reference_could_not_pick_its_listed_top():
    """minimax-m2's drawn tree r2:0:6:10_0+1_0@7+10 (one client: complete prompt 2, then its second turn): at step 4
    the server lists token 11 first, but 11 is the vocabulary's end token (llama.cpp's BPE default when the file
    names none) and the requests ignore it, so the pick is between 13 and 47, 7e-4 apart: a near-tie the listed
    margin (0.1) does not show. The cold run picked 13, the cached second turn 47 (as the server answered both)."""
    ref = {"tokens": [53, 47, 47, 47, 13, 13],
           "top": [[[53, -0.7989], [54, -1.02]], [[47, -1.0711], [9, -1.7759]], [[47, -1.0786], [6, -2.1854]],
                   [[47, -1.3332], [6, -1.9283]], [[11, -1.6778], [13, -1.7775]], [[13, -0.4808], [54, -2.3175]]]}
    assert compare(ref, {"tokens": [53, 47, 47, 47, 47, 13]}) is None
    assert compare(ref, {"tokens": [53, 47, 47, 6, 47, 13]}) == "token 3: 6 instead of 47"  # judged up to there


@pytest.mark.parametrize("family,knobs", [("llama", {"layers": 4}), ("qwen3next", {"layers": 4, "period": 4}),
                                          ("mamba2", {"layers": 4})])
def test_concurrent_duplicate_inserts_are_clean(fixtures, family, knobs):
    """The rounds and the rewind conversations are clean; the only findings, on the models that go back through
    checkpoints (recurrent, hybrid), are the known back-to-back one (corpora/repros/mamba-prefix-cache-rewind-
    diverged): an earlier conversation's state, each conversation right from an erased slot."""
    rep = PrefixCache(fixtures(family, **knobs), PrefixCacheConfig(rounds=3, tokens=6)).run()
    other = [f for f in rep["findings"] if not (f["phase"] == "rewind-diverged" and f.get("cause")
                                                  and f["cause"]["kind"] == pc.EARLIER)]
    assert not other, other
    assert bool(rep["findings"]) == (family != "llama"), rep["findings"]
    assert len(rep["rounds"]) == 3 and all(not r["busy_after"] for r in rep["rounds"])
    assert any(c > 0 for r in rep["rounds"] for c in r["cache_n"]), "the cache was never used"


def test_a_unified_layout_tells_where_a_sequence_sits_from_the_cache(fixtures):
    """One KV cache for the slots (llama-server without -np). The DSA fixture of the deepseek3 row answers leaf
    [4, 38, 19, 4, 7, 37] instead of its cold [.., 52, 55] in round 0 of the rounds: where the sequence sits and what
    it is batched with move it (its indexer keeps tied keys by cell). That answer recurs in the same round with the
    prompt cache off, so it is numerics with that cause; an answer leaving the cold one before any cache-off answer
    does (here at step 0) stays a finding.
    The placement move is measured here too and picks below 4x it are not judged; its size is not pinned on this
    fixture: where the co-batched filler's cells land depends on when the server batches it, and with tied indexer
    keys that moves this fixture's answer anywhere from a few 1e-3 to ~0.8 (the llama fixture's bound is pinned in
    test_radix.py)."""
    from targets import close_all

    pc = PrefixCache(fixtures("deepseek32", layers=6, indexer_top_k=4),
                     PrefixCacheConfig(rounds=3, tokens=6, kv_unified=True))
    sched = pc.sched
    assert sched.rounds[0].count("leaf") >= 2
    moved = {"phase": "diverged", "round": 0, "prompt": "leaf", "answer": [4, 38, 19, 4, 7, 37]}
    made_up = {"phase": "diverged", "round": 0, "prompt": "leaf", "answer": [1, 2, 3, 4, 5, 6]}
    t = open_target("llama-server", timeout=60)
    try:
        t.start()
        cold = pc.reference = pc._reference(t, sched)
        pc.explain_rounds(t, [moved, made_up])
        pc.measure_noise(t, sched.prompts, cold)
    finally:
        close_all([t])
    assert cold["leaf"]["tokens"] == [4, 38, 19, 4, 52, 55]
    assert moved["cause"]["kind"] == "shared KV cache, not the prompt cache", moved
    assert "cause" not in made_up
    assert pc.noise["placement"] > 1e-3 and pc.near_tie == pytest.approx(4 * pc.noise["placement"])


def test_numerics_step_excuses_only_by_controls_that_leave_the_reference_no_later():
    ref = {"tokens": [1, 2, 3, 4]}
    assert numerics_step(ref, [1, 2, 9, 9], [[1, 2, 3, 4], [1, 2, 9, 9]]) == "the same answer"
    assert numerics_step(ref, [1, 2, 9, 9], [[1, 5, 3, 4]]) == \
        "a departure from the reference at step 1 (this answer's at step 2)"
    assert numerics_step(ref, [1, 9, 3, 4], [[1, 2, 5, 4]]) is None  # the control leaves it later
    assert numerics_step(ref, [1, 9, 3, 4], [[1, 2, 3, 4]]) is None  # the control is the reference


def test_a_fixtures_batch_shapes_excuse_no_made_up_answer(fixtures):
    """explain_shapes computes a diverged prompt uncached at every ubatch of SHAPE_UBATCHES: on the llama fixture
    each gives the reference (a finding that claims the reference's answer is excused at the first, ubatch 1, and
    named so), and an answer no shape gives, leaving the reference at step 0, stays a finding."""
    from fuzz.oracles.prefix_cache import BATCHING
    from targets import close_all

    pc = PrefixCache(fixtures("llama", layers=4), PrefixCacheConfig(rounds=1, tokens=6))
    sched = build_schedule(pc.info.n_vocab, 4, 1, 0)
    t = open_target("llama-server", timeout=60)
    try:
        t.start()
        cold = pc._reference(t, sched)["leaf"]["tokens"]
        same = {"phase": "rewind-diverged", "prompt": "leaf", "answer": cold, "tokens": sched.prompts["leaf"]}
        other = [(cold[0] + 1) % pc.info.n_vocab, *cold[1:]]
        made_up = {"phase": "rewind-diverged", "prompt": "leaf", "answer": other, "tokens": sched.prompts["leaf"]}
        pc.explain_shapes(t, [same, made_up])
    finally:
        close_all([t])
    assert same["cause"]["kind"] == BATCHING and "at ubatch 1 gives the same answer" in same["cause"]["detail"]
    assert "cause" not in made_up


def test_a_duplicate_insert_that_leaks_is_caught(fixtures):
    rep = PrefixCache(fixtures("llama", layers=4),
                      PrefixCacheConfig(rounds=2, tokens=4, target="mutant:server-dup-leak")).run()
    kinds = {f["phase"] for f in rep["findings"]}
    assert rep["status"] == "finding" and "leaked-slot" in kinds, rep["findings"]
    assert all(f["reproduced"] for f in rep["findings"] if f["phase"] == "leaked-slot")


def test_the_capacity_probe_fills_every_slot(fixtures, monkeypatch):
    """The probe after a schedule is as long as the server's real slots allow — llama.cpp pads the 160 cells asked
    per slot to 256 (a probe sized from what was asked left 104 cells of every slot unchecked) — so a slot holding
    more than PROBE_SLACK cells cannot take it: every slot takes it, and none takes one token more."""
    from synth.inspect import inspect_file

    path = fixtures("llama", layers=4)
    n_vocab = inspect_file(str(path)).n_vocab
    with open_target("llama-server") as t:
        assert t.load(str(path), slots=2, n_ctx=320).ok
        assert [s["n_ctx"] for s in t.call("slots").data["slots"]] == [256, 256]
        assert sa.capacity_problems(t, n_vocab, seed=0) == []
        monkeypatch.setattr(sa, "PROBE_SLACK", sa.PROBE_SLACK - 3)  # one token more than the slot has room for
        assert t.load(str(path), slots=2, n_ctx=320).ok
        bad = sa.capacity_problems(t, n_vocab, seed=0)
    assert [(p.slot, p.died) for p in bad] == [(0, False), (1, False)], bad
    assert all("a 255-token prompt" in p.why and "stopped after 1 of 2 tokens: the slot is full" in p.why
               for p in bad), bad


def test_cli_report_and_bad_input(fixtures, tmp_path):
    out = tmp_path / "r.json"
    r = run_cli("fuzz", "prefix-cache", str(fixtures("llama", layers=4)), "--rounds", "2", "--report", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(out.read_text())["status"] == "pass" and "round 1" in r.stdout
    bad = run_cli("fuzz", "prefix-cache", str(fixtures("llama", layers=4)), "--slots", "1")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1


def test_a_server_that_aborts_loading_is_a_crash_finding_not_bad_input(fixtures, tmp_path):
    """llama-server aborts loading any PLM model under its default flash attention (the upstream finding
    corpora/repros/plm-radix-server-crash): a crash of the target in the configuration the oracle chose — exit 1,
    a crash finding seen twice — as the radix oracle reports it, not 'cannot serve it' (exit 2)."""
    out = tmp_path / "r.json"
    r = run_cli("fuzz", "prefix-cache", str(fixtures("plm", layers=1)), "--rounds", "1", "--report", str(out))
    assert r.returncode == 1, r.stdout + r.stderr
    rep = json.loads(out.read_text())
    assert rep["status"] == "crash" and len(rep["findings"]) == 1, rep["findings"]
    f = rep["findings"][0]
    assert (f["phase"], f["reproduced"]) == ("server-crash", True) and "GGML_ASSERT" in f["message"], f


def test_missing_binary_and_dead_server_are_reported(fixtures, tmp_path, monkeypatch):
    monkeypatch.setenv("FAMILY_CERTIFY_LLAMA_SERVER", str(tmp_path / "no-such-llama-server"))
    bad = run_cli("fuzz", "prefix-cache", str(fixtures("llama", layers=4)))
    assert bad.returncode == 2 and "scripts/build_llama_server.sh" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
    monkeypatch.delenv("FAMILY_CERTIFY_LLAMA_SERVER")
    with open_target("llama-server") as t:
        corrupt = tmp_path / "trunc.gguf"
        corrupt.write_bytes(fixtures("llama", layers=4).read_bytes()[:300])
        r = t.load(str(corrupt))
        assert not r.ok and r.failure.error_kind == "load_failed" and "exited while loading" in r.failure.message
        assert t.load(str(fixtures("llama", layers=4)), slots=2).ok
        # 512 cells each, capped at the fixture's training context
        assert t.call("slots").data["slots"] == [{"id": 0, "is_processing": False, "n_ctx": 256},
                                                 {"id": 1, "is_processing": False, "n_ctx": 256}]


def test_a_port_another_server_took_first_is_not_mistaken_for_ours(fixtures, monkeypatch, tmp_path):
    """A free port is free only until someone binds it: under parallel tests (or rows) another server can take it
    between our pick and our server's bind. Ours then exits ("couldn't bind") while the port answers /health for
    the other one — the worker must not talk to that server. Here an impostor holds the first port picked (healthy,
    another alias): the worker starts again on a second port and serves from its own server. (Our server lingers
    0.3 s after it failed to bind, as a loaded machine may let it: the worker does ask the impostor who it is — else
    a server quick to exit is never asked, and nothing here would check the asking.)"""
    import targets.llama_server_worker as w

    impostor, asked = impostor_server({"status": "ok", "model_alias": "someone-else", "slots": []})
    taken = impostor.server_address[1]
    lingering = tmp_path / "llama-server"  # (on any other port it is the server itself: nothing left running)
    lingering.write_text(f'#!/bin/sh\ncase " $* " in *" --port {taken} "*) "{server_binary()}" "$@"; rc=$?; '
                         f'sleep 0.3; exit $rc;; esac\nexec "{server_binary()}" "$@"\n')
    lingering.chmod(0o755)
    monkeypatch.setenv("FAMILY_CERTIFY_LLAMA_SERVER", str(lingering))
    picks = iter([taken])
    real = w.free_port
    monkeypatch.setattr(w, "free_port", lambda: next(picks, None) or real())
    worker = w.ServerWorker()
    try:
        got = worker.op_load({"path": str(fixtures("llama", layers=2)), "slots": 2, "n_ctx": 512})
        assert got["port"] != taken and "--alias" in got["argv"]
        assert [s["id"] for s in worker.op_slots({})["slots"]] == [0, 1]  # its own server's two slots
        assert asked and "/slots" not in asked  # the impostor was asked who it is, never served
    finally:
        worker._stop()
        impostor.shutdown()


def test_a_server_starts_without_the_steps_we_never_use_when_the_binary_knows_the_flags(fixtures, tmp_path,
                                                                                        monkeypatch):
    """`-fit off` and `--no-jinja` (start-up time only: fitting arguments we all set, a chat template we never use)
    are passed when the binary's --help lists them; a build that does not know them still starts, without them."""
    import targets.llama_server_worker as w

    assert w.fast_start_args(str(server_binary())) == ("-fit", "off", "--no-jinja")
    worker = w.ServerWorker()
    try:
        argv = worker.op_load({"path": str(fixtures("llama", layers=2)), "slots": 1, "n_ctx": 256})["argv"]
        assert argv[argv.index("-fit") + 1] == "off" and "--no-jinja" in argv
    finally:
        worker._stop()
    older = tmp_path / "llama-server"  # a build whose --help lists neither (and which would refuse them)
    older.write_text(f'#!/bin/sh\ncase " $* " in *" --help "*) echo "-m, --model FNAME"; exit 0;; '
                     f'*" -fit "*|*" --no-jinja "*) echo "error: invalid argument" >&2; exit 1;; esac\n'
                     f'exec "{server_binary()}" "$@"\n')
    older.chmod(0o755)
    monkeypatch.setenv("FAMILY_CERTIFY_LLAMA_SERVER", str(older))
    assert w.fast_start_args(str(older)) == ()
    worker = w.ServerWorker()
    try:
        argv = worker.op_load({"path": str(fixtures("llama", layers=2)), "slots": 1, "n_ctx": 256})["argv"]
        assert "-fit" not in argv and "--no-jinja" not in argv
        assert worker.op_complete({"requests": [{"prompt": [1, 2, 3], "n_predict": 2}]})["results"][0]["tokens"]
    finally:
        worker._stop()


def test_a_kept_server_worker_holds_no_server_and_its_mutant_no_leak(fixtures):
    """Idle llama-server workers are kept for the next target (the radix engine opens two per run, a shrink runs it
    twenty times): an unload stops the server, and a mutant's leak goes with it — the next target of the same
    worker starts with no server, and its own load leaks afresh."""
    import time

    from targets import open_target

    def busy(t, want):  # (the leaked request starts on its own thread: wait for it a moment)
        for _ in range(100):
            got = [s["id"] for s in t.call("slots").data["slots"] if s["is_processing"]]
            if len(got) == want:
                return got
            time.sleep(0.02)
        return got

    path, same = str(fixtures("llama", layers=2)), [1, 2, 3, 4]
    with open_target("mutant:server-dup-leak") as t:
        assert t.call("load", path=path, slots=2, n_ctx=512).ok
        assert t.call("complete", requests=[{"prompt": same, "n_predict": 2}] * 2, concurrent=True).ok
        assert len(busy(t, 1)) == 1  # the leak: a slot busy after every answer is in
        pid = t.client.proc.pid
    with open_target("mutant:server-dup-leak") as again:
        assert again.client.proc.pid == pid  # the same worker, from the idle ones
        assert again.call("slots").failure.message.startswith("no server running")
        assert again.call("load", path=path, slots=2, n_ctx=512).ok
        assert busy(again, 0) == []  # nothing leaked on this load yet
        assert again.call("complete", requests=[{"prompt": same, "n_predict": 2}] * 2, concurrent=True).ok
        assert len(busy(again, 1)) == 1  # this load's own leak


def test_the_rewind_conversations_answer_as_uncached_and_record_their_reuse(tmp_path):
    """On laguna's fixture (sliding window 4: the checkpoints decide what a cut-back prompt reuses) the pinned
    llama-server answers every rewind as uncached from an erased slot; the reuse it records is the same run after
    run. Back to back on the slot it does not (an upstream finding, corpora/repros/mamba-prefix-cache-rewind-
    diverged): every such finding has the earlier conversation as its cause and is that known repro."""
    from fuzz.repro.campaign import known_repro, known_upstream
    from synth.make import write_fixture
    from synth.manifest import load_manifest

    path = tmp_path / "laguna.gguf"
    write_fixture(load_manifest(ROOT / "family_tiers.toml").row("laguna").spec(), path)
    cfg = pc.PrefixCacheConfig(rounds=1, tokens=6)
    a, b = pc.report(path, cfg), pc.report(path, cfg)
    assert len(a.extra["rewinds"]) == 32 and a.findings, format_report(a.native)
    assert {(f.phase, f.cause["kind"]) for f in a.findings} == {("rewind-diverged", pc.EARLIER)}
    assert all("(back to back)" in f.message and f.reproduced for f in a.findings)
    known = known_upstream()
    assert {known_repro(known, "laguna", f) for f in a.findings} == {"mamba-prefix-cache-rewind-diverged"}
    assert [c["cache_n"] for c in a.extra["rewinds"]] == [c["cache_n"] for c in b.extra["rewinds"]]
    assert a.extra["rewinds"][0]["cache_n"] == [0, 1]  # the checkpoint at pos_min 0 restored (upstream #21510)


def test_a_server_that_dies_on_the_capacity_probe_is_a_crash_and_the_probe_ends_there():
    """Where llama-server dies is timing (a mutant's crash in round 0 on one run falls on the probe on the next): a
    death on the probe is the server-crash a replay looks for, not a slot short of cells, and no slot after it is
    probed."""
    from targets.client import Failure, Reply

    class Dying:  # (a stand-in answering the probe's three requests as a crashed llama-server's worker does)
        def __init__(self):
            self.sent = []

        def call(self, op, **kw):
            if op == "slots":
                return Reply(True, {"slots": [{"id": 0, "n_ctx": 64}, {"id": 1, "n_ctx": 64}]})
            if op == "complete":  # (the prompt with an id past the vocabulary: refused, as llama-server does)
                return Reply(True, {"results": [{"error": "HTTP 400: Prompt contains invalid tokens"},
                                                {"tokens": [3]}]})
            self.sent.append((op, kw.get("name")))
            if op == "submit":
                return Reply(True, {})
            return Reply(False, {}, Failure("error", "llama-server is not running: signal SIGSEGV", op, kw,
                                            error_kind="server_crash"))

    t = Dying()
    got = sa.capacity_problems(t, 16, seed=0)
    assert [(p.slot, p.died) for p in got] == [(0, True)] and "SIGSEGV" in got[0].why, got
    assert t.sent == [("submit", "probe0"), ("await", "probe0")]


REFUSED = {"error": "HTTP 400: Prompt contains invalid tokens"}


@pytest.mark.parametrize("answers, died, said", [
    ([{"tokens": [3, 5], "cache_n": 0}, {"tokens": [7]}], False, "token id 16 (the vocabulary has 16)"),
    ([{"error": "HTTP 500: Compute error."}, {"tokens": [7]}], False, "token id 16 (the vocabulary has 16)"),
    ([{"error": "llama-server died: signal SIGABRT", "server_crash": True}] * 2, True, "token id 16"),
    ([REFUSED, {"tokens": [7, 9]}], False, "a request for one token (n_predict 1, end of generation ignored) was "
                                           "answered 2: [7, 9]")])
def test_a_prompt_with_an_id_past_the_vocabulary_must_be_refused_as_an_invalid_request(answers, died, said):
    """Before the capacity probes, a prompt ending in id n_vocab: llama-server validates a prompt's ids and refuses
    it as an invalid request (HTTP 400; the probes in the llama-server test above pass that way). Answered, failed
    as the server's own error, or a crash is a problem (a server that died ends the probe there); so is a request
    for one token answered with more (a slot that stopped past its n_predict)."""
    from targets.client import Reply

    class Server:  # (a stand-in: the requests of the probe as a llama-server's worker answers them)
        def __init__(self):
            self.sent = []

        def call(self, op, **kw):
            self.sent.append((op, [r["prompt"][-1] for r in kw.get("requests", [])]))
            if op == "slots":
                return Reply(True, {"slots": [{"id": 0, "n_ctx": 64}]})
            if op == "complete":
                return Reply(True, {"results": answers})
            return Reply(True, {"result": {"tokens": [1, 2]}})

    t = Server()
    got = sa.capacity_problems(t, 16, seed=0)
    assert got[0].slot == -1 and got[0].died == died and said in got[0].why, got
    assert len(got) == 1 and t.sent[1][0] == "complete" and t.sent[1][1][0] == 16
    assert [op for op, _ in t.sent] == ["slots", "complete"] + ([] if died else ["submit", "await"])
