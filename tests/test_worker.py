"""The llama.cpp target behind the protocol: typed results, crash and hang recovery, cmd: targets."""

import os
import shlex
import sys
from pathlib import Path

import numpy as np
import pytest

from fuzz.oracles.sweep import Sweep
from fuzz.oracles.sweep_report import SweepConfig
from synth.errors import UserError
from synth.gguf_io import GGUFFile
from targets import open_target

from helpers import aborting_at_decode, segfaulting_at_load

pytestmark = pytest.mark.llama


def test_hello_reports_the_pin(llama):
    h = llama.hello().data
    assert h["llama_cpp_python"] == "0.3.36"
    assert h["llama_cpp_commit"].startswith("0c1e570")


def test_abort_is_a_crash_and_the_next_call_works(fixtures, tmp_path):
    good = fixtures("llama")
    bad = aborting_at_decode(good, tmp_path / "abort.gguf")
    with open_target() as t:
        assert t.load(str(bad)).ok
        r = t.decode([1, 2, 3])
        assert not r.ok and r.failure.kind == "crash"
        assert r.failure.returncode == -6  # SIGABRT
        assert "binary_op" in r.failure.message and r.failure.request["tokens"] == [1, 2, 3]
        # the next call gets a fresh worker (which replays the last load: the same abort again)
        assert t.decode([1]).failure.kind == "crash"
        assert t.load(str(good)).ok
        out = t.generate([1, 2, 3], 5)
        assert out.ok and len(out.data["tokens"]) == 5
        assert t.restarts >= 2


def test_segfault_during_load_is_a_crash(fixtures, tmp_path):
    bad = segfaulting_at_load(fixtures("granitehybrid"), tmp_path / "segv.gguf")
    with open_target() as t:
        r = t.load(str(bad))
        assert not r.ok and r.failure.kind == "crash" and r.failure.returncode == -11
        assert t.load(str(fixtures("granitehybrid"))).ok


def test_corrupt_file_is_a_load_error_not_a_crash(fixtures, tmp_path, llama):
    bad = tmp_path / "trunc.gguf"
    bad.write_bytes(fixtures("llama").read_bytes()[:300])
    r = llama.load(str(bad))
    assert not r.ok and r.failure.kind == "error" and r.failure.error_kind == "load_failed"
    assert "\n" not in r.failure.message


def test_hang_is_a_timeout_and_the_worker_is_replaced():
    hang = f"cmd:{shlex.quote(sys.executable)} -c 'import sys, time; sys.stdin.readline(); time.sleep(60)'"
    with open_target(hang, timeout=1.5) as t:
        r = t.hello()
        assert not r.ok and r.failure.kind == "timeout" and r.failure.op == "hello"
        assert t.hello().failure.kind == "timeout"
        assert t.restarts == 1


def test_non_json_output_is_a_protocol_failure():
    prog = "import sys; sys.stdin.readline(); print('not-json', flush=True); sys.stdin.readline()"
    with open_target(f"cmd:{shlex.quote(sys.executable)} -c {shlex.quote(prog)}") as t:
        assert t.hello().failure.kind == "protocol"


def test_missing_binary_is_a_user_error():
    with pytest.raises(UserError, match="cannot start"):
        open_target("cmd:/nonexistent/skippy-worker --serve").hello()
    with pytest.raises(UserError, match="unknown --target"):
        open_target("llama-serve")


def test_bad_requests_leave_the_worker_usable(llama, fixtures):
    assert llama.load(str(fixtures("qwen3"))).ok
    assert llama.client.call("no_such_op").failure.error_kind == "bad_request"
    assert llama.decode([10_000]).failure.error_kind == "bad_request"
    assert llama.decode([1], capture=[99]).failure.error_kind == "bad_request"
    assert llama.decode([1, 2]).ok


def test_a_reload_of_the_same_file_keeps_the_model_and_makes_a_fresh_context(fixtures, tmp_path):
    """A hand-off loads one stage into many fresh contexts: the worker keeps the model (not the context) while the
    file is the same and unchanged; the logits are the same bits as from a worker that loaded it anew."""
    import shutil

    path = tmp_path / "m.gguf"
    shutil.copyfile(fixtures("jamba"), path)
    with open_target("llama-cpp") as t, open_target("llama-cpp") as cold:
        first = t.load(str(path))
        assert first.ok and first.data["model_reused"] is False
        a = t.decode([1, 2, 3], logits="all")
        again = t.load(str(path))
        assert again.ok and again.data["model_reused"] is True
        b = t.decode([1, 2, 3], logits="all")  # a fresh context: no cells of the first decode
        assert cold.load(str(path)).ok
        c = cold.decode([1, 2, 3], logits="all")
        assert np.array_equal(a.data["logits"], b.data["logits"]) and np.array_equal(b.data["logits"], c.data["logits"])
        assert t.load(str(path), mmap=False).data["model_reused"] is False  # another load mode: loaded again
        shutil.copyfile(fixtures("qwen3"), path)  # the file rewritten in place: loaded again
        other = t.load(str(path))
        assert other.ok and other.data["model_reused"] is False and other.data["arch"] == "qwen3"


def test_a_closed_llama_cpp_worker_is_kept_idle_for_the_next_target_and_holds_nothing(fixtures):
    """An oracle run opens several workers: a closed plain llama.cpp worker is kept (after an unload) for the next
    target of the same command and environment — it starts with no model, no context; a mutant never shares it.
    The idle ones are at most IDLE_MAX: workers of an environment no longer used (here a full pool of them) give way
    to the newest, longest idle first."""
    from targets import target as tg

    stale = [open_target("llama-cpp", env={"FAMILY_CERTIFY_TEST_STALE": "1"}) for _ in range(tg.IDLE_MAX)]
    for w in stale:
        assert w.hello().ok
    tg.close_all(stale)
    with open_target("llama-cpp") as t:
        assert t.load(str(fixtures("qwen3"))).ok and t.decode([1, 2]).ok
        pid = t.client.proc.pid
    with open_target("llama-cpp") as again:
        assert again.client.proc.pid == pid  # the same process, taken from the idle ones
        assert again.decode([1]).failure.error_kind == "bad_request"  # no model loaded: nothing kept but the process
        assert again.load(str(fixtures("qwen3"))).data["model_reused"] is False
    with open_target("mutant:seq-leak") as m:
        assert m.hello().ok and m.client.proc.pid != pid
    assert len(tg._idle) <= tg.IDLE_MAX and stale[0].client.proc is None  # the longest idle was closed


def test_a_llama_cpp_mutants_worker_is_kept_idle_too_and_judges_each_load_afresh(fixtures):
    """A shrink runs its mutant twenty times and more: the mutant's workers are kept like the plain worker's (its state
    is made at each load), and so are the llama-server worker's (an unload stops its server); another program's never.
    B1 with its worker
    taken from the idle ones still decides per model: it drops the state of an attention-first stage of jamba, then
    imports a mamba stage (recurrent first layer) intact, then drops jamba's again."""
    from fuzz.oracles.handoff import report
    from fuzz.oracles.handoff_state import HandoffConfig
    from targets import target as tg

    def idle_pids():
        return {c.proc.pid for key, c in tg._idle if key[0][-1] == "b1-first-layer-probe"}

    cfg = HandoffConfig(cuts="1", modes=("full",), target="mutant:b1-first-layer-probe")
    jamba, mamba = fixtures("jamba", layers=4, period=2), fixtures("mamba", layers=2)
    assert report(jamba, cfg).to_dict()["results"][0]["status"] == "finding"  # stage 1 starts on an attention layer
    kept = idle_pids()
    assert kept
    assert report(mamba, cfg).to_dict()["results"][0]["status"] == "pass"
    assert report(jamba, cfg).to_dict()["results"][0]["status"] == "finding"
    assert idle_pids() & kept  # the same processes served the later runs
    for spec, kept in (("llama-server", True), ("mutant:server-dup-leak", True), ("mutant:batch-shape-noise", True),
                       (f"cmd:{shlex.quote(sys.executable)} -m targets.llama_cpp_worker", False)):  # (not ours)
        with open_target(spec) as t:
            assert (t.key is not None) == kept, spec


def test_a_mutant_keeps_nothing_of_its_own_past_an_unload(fixtures):
    """What makes a kept mutant worker a fresh one: whatever a mutant set on the worker (B1's probe of the model it
    loaded, or anything a careless mutant might cache) is gone at the unload the idle pool sends; the worker's own
    state stays (the next load needs it)."""
    from targets.mutants import B1FirstLayerProbe

    w = B1FirstLayerProbe()
    fresh = set(vars(w))
    w.op_load({"path": str(fixtures("jamba", layers=4, period=2))})
    w.cached_forever = "a careless mutant's"
    assert {"probe_recurrent", "n_recurrent", "cached_forever"} <= set(vars(w))
    w.op_unload({})
    assert set(vars(w)) == fresh and w.model is None and w.ctx is None


def test_a_worker_with_a_call_in_flight_is_never_kept_idle(fixtures):
    """A call still waiting for its reply on another thread (the sweep's early full-model loads, when bad input stops
    it first) owns the worker: closing the target then closes the worker — parked, another target would read that
    reply, or two threads the same stream (the sweep CLI once hung 300 s on `--prompt 1,2,999`)."""
    from targets import target as tg

    t = open_target("llama-cpp")
    assert t.hello().ok
    t.client.in_flight += 1  # as while another thread waits on it
    proc = t.client.proc
    t.close()
    assert not t.parked and proc.poll() is not None and all(c is not t.client for _, c in tg._idle)
    with pytest.raises(UserError, match="--prompt token 999: not in the fixture's vocabulary"):
        Sweep(fixtures("llama"), SweepConfig(prompt=(1, 2, 999), prompt_len=3, tokens=1)).run()
    for _, c in tg._idle:  # the sweep's workers, kept only once their loads answered: each answers its next call
        assert c.in_flight == 0 and c.call("hello", timeout=10).ok


def test_cmd_target_speaks_the_same_protocol(llama, fixtures):
    """The worker as a cmd: program that answers in base64 (no frames) reads the same as our framed worker."""
    path = str(fixtures("lfm2"))
    cmd = f"cmd:env -u FAMILY_CERTIFY_FRAMES {shlex.quote(sys.executable)} -m targets.llama_cpp_worker"
    with open_target(cmd) as t:
        assert t.load(path).ok
        a = t.generate([4, 5, 6], 8)
        a_state = t.state_get(0).data["blob"]
    assert llama.load(path).ok
    b = llama.generate([4, 5, 6], 8)
    assert a.data["tokens"] == b.data["tokens"]
    assert np.array_equal(a.data["logits"], b.data["logits"])
    assert a_state == llama.state_get(0).data["blob"] and len(a_state) > 1000


@pytest.mark.parametrize("family", ["qwen3", "jamba", "qwen3next", "kimi-linear", "mamba2"])
def test_embedding_input_equals_token_input(llama, fixtures, family):
    """Feeding token_embd rows through batch.embd gives bit-identical logits (the stage-input path)."""
    path = fixtures(family)
    toks = [3, 9, 27, 5, 1]
    rows = GGUFFile(path).tensor_data("token_embd.weight")[toks]
    assert llama.load(str(path)).ok
    a = llama.decode(toks, logits="all")
    llama.reset()
    b = llama.decode(embd=rows, logits="all")
    assert a.ok and b.ok
    assert np.array_equal(a.data["logits"], b.data["logits"])


def test_capture_returns_every_row_of_the_residual(llama, fixtures):
    path = fixtures("jamba")
    assert llama.load(str(path)).ok
    r = llama.decode([1, 2, 3, 4, 5, 6], capture=[0, 3, 7])
    assert r.ok
    assert {k: v.shape for k, v in r.data["captures"].items()} == {0: (6, 32), 3: (6, 32), 7: (6, 32)}
    assert r.data["logits"].shape == (1, 64)  # still only the requested rows come back


def test_pipelined_requests_stop_at_the_first_failure_and_leave_the_stream_clean(fixtures, tmp_path):
    from targets.target import script_request

    good = str(fixtures("llama"))
    bad = str(aborting_at_decode(fixtures("llama"), tmp_path / "abort.gguf"))
    step = {"tokens": [1, 2, 3], "logits": "all"}
    with open_target() as t:
        ok = t.pipeline([("load", {"path": good}), script_request([step], reset=True),
                         script_request([step], reset=True)])
        assert [r.ok for r in ok] == [True, True, True]
        assert ok[1].data["results"][0]["logits"].tobytes() == ok[2].data["results"][0]["logits"].tobytes()
        # a refused request ends the replies; the worker answered the rest, which must not leak into later calls
        refused = t.pipeline([("load", {"path": str(tmp_path / "missing.gguf")}), script_request([step])])
        assert len(refused) == 1 and refused[0].failure.error_kind == "bad_request"
        assert t.hello().ok and t.load(good).ok
        # a crash ends them too; the next call restarts the worker with the last good load
        crashed = t.pipeline([("load", {"path": bad}), script_request([step], reset=True), ("hello", {})])
        assert crashed[0].ok and crashed[1].failure.kind == "crash" and len(crashed) == 2
        r = t.decode([1, 2, 3])
        assert r.failure.kind == "crash"  # the replayed load is the aborting model, as with single calls
        assert t.load(good).ok and t.decode([1, 2, 3]).ok


def test_trace_returns_every_node_of_one_layer_in_execution_order(llama, fixtures):
    """A context loaded with trace=true hands back each graph node of the traced layer: the same bits a capture
    gives for its l_out, and nothing of other layers; the same request without trace is refused, not ignored."""
    assert llama.load(str(fixtures("llama", layers=3)), trace=True).ok
    r = llama.decode([1, 2, 3], logits="all", capture=[1], trace=1)
    assert r.ok, r.failure
    nodes = r.data["nodes"]
    names = [n["name"] for n in nodes]
    assert names[-1] == "l_out-1" and all(n.split(" (")[0].endswith("-1") for n in names)
    assert names.index("attn_norm-1") < names.index("kq_soft_max-1") < names.index("ffn_out-1")
    ops = {n["name"]: n["op"] for n in nodes}
    assert ops["kq_soft_max-1"] == "SOFT_MAX" and ops["ffn_out-1"] == "MUL_MAT"
    out = np.frombuffer(nodes[-1]["data"], "<f4").reshape(3, -1)
    assert nodes[-1]["ne"][:2] == [out.shape[1], 3]
    assert np.array_equal(out, r.data["captures"][1])
    whole = llama.decode([1, 2, 3], logits="all", trace="all")
    names = [n["name"] for n in whole.data["nodes"]]
    assert {"l_out-0", "l_out-1", "l_out-2"} <= set(names) and names.index("l_out-0") < names.index("l_out-2")
    soft = next(n for n in whole.data["nodes"] if n["name"] == "kq_soft_max-0")
    assert "kq-0" in soft["srcs"]  # each node names its sources
    bad = llama.call("decode", tokens=[1, 2, 3], trace="some")
    assert not bad.ok and "layer index" in bad.failure.message
    assert llama.load(str(fixtures("llama", layers=3))).ok
    refused = llama.decode([1, 2, 3], trace=1)
    assert not refused.ok and "trace=true" in refused.failure.message


def _unset(monkeypatch, *names: str) -> None:
    """Unset for this test, and whatever the code under test sets in their place undone after it."""
    for k in names:
        monkeypatch.setenv(k, "")  # (records the value before, or its absence, for the undo)
        monkeypatch.delenv(k)


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(x.decode().split("=", 1) for x in raw if b"=" in x)


def test_a_worker_alone_spins_briefly_a_worker_beside_others_waits_passively_and_the_user_decides(monkeypatch):
    """How llama.cpp's OpenMP threads wait reaches the worker process: a short spin when nothing said the cores are
    shared (a 2-thread schedule alone runs 2.7x faster than passive), passive after share_cores() (rows side by side:
    spinning there took the determinism lane 39.5 -> 90 s); a policy the user set is never overridden."""
    import targets

    _unset(monkeypatch, "OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
    assert targets.worker_env() == {"OPENBLAS_NUM_THREADS": "1", "OMP_WAIT_POLICY": "active", "GOMP_SPINCOUNT": "1000"}
    with open_target("llama-cpp") as t:
        assert t.hello().ok
        env = _environ(t.client.proc.pid)
        assert (env["OMP_WAIT_POLICY"], env["GOMP_SPINCOUNT"], env["OPENBLAS_NUM_THREADS"]) == ("active", "1000", "1")
    targets.share_cores()
    assert targets.worker_env() == {"OPENBLAS_NUM_THREADS": "1"}
    with open_target("llama-cpp") as t:
        assert t.hello().ok
        env = _environ(t.client.proc.pid)
        assert env["OMP_WAIT_POLICY"] == "passive" and "GOMP_SPINCOUNT" not in env
    monkeypatch.setenv("OMP_WAIT_POLICY", "active")
    monkeypatch.setenv("GOMP_SPINCOUNT", "50")
    targets.share_cores()  # the user's choice stands
    with open_target("llama-cpp") as t:
        assert t.hello().ok
        env = _environ(t.client.proc.pid)
        assert (env["OMP_WAIT_POLICY"], env["GOMP_SPINCOUNT"]) == ("active", "50")


def test_rows_run_side_by_side_share_the_cores(monkeypatch):
    """`--jobs N` runs each row in a process of its own: that process says the cores are shared before any worker
    starts, so its workers wait passively."""
    from fuzz.certify import battery as certify
    _unset(monkeypatch, "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "FAMILY_CERTIFY_PROGRESS")

    class Events:
        def cancel_join_thread(self) -> None:
            pass

    monkeypatch.setattr(certify, "_EVENTS", None)
    certify._row_process(Events())
    import targets

    assert targets.worker_env() == {"OPENBLAS_NUM_THREADS": "1"}
    assert os.environ["OMP_WAIT_POLICY"] == "passive"


@pytest.mark.parametrize("family", ["mamba", "qwen3"])
def test_the_one_logits_buffer_holds_the_rows_in_the_batchs_order_as_each_row_read_alone(llama, fixtures, family):
    """decode's logits_from "buffer" reads llama_get_logits (every output row in one buffer, in the batch's order, as
    llama.h promises) instead of llama_get_logits_ith per row. Three sequences of 9, 3 and 5 tokens in one batch, an
    output at each one's last token: a recurrent memory splits it into equal ubatches, so the shortest sequence's
    output is computed first and llama.cpp must put the rows back in order in the buffer; the same rows either way."""
    assert llama.load(str(fixtures(family)), n_seq_max=3).ok
    lengths = (9, 3, 5)
    toks = [(7 * i + 3) % 32 for i in range(sum(lengths))]
    seqs = [s for s, n in enumerate(lengths) for _ in range(n)]
    pos = [p for n in lengths for p in range(n)]
    last = {sum(lengths[:s + 1]) - 1 for s in range(3)}
    rows = {}
    for via in ("ith", "buffer"):
        assert llama.reset().ok
        r = llama.decode(toks, seq=seqs, pos=pos, logits=[i in last for i in range(len(toks))],
                         **({"logits_from": via} if via == "buffer" else {}))
        assert r.ok, r.failure
        rows[via] = r.data["logits"]
    assert rows["ith"].shape == (3, rows["ith"].shape[1]) and np.array_equal(rows["ith"], rows["buffer"])
    assert not np.array_equal(rows["ith"][0], rows["ith"][1])  # (three distinct rows: an order is visible)
