"""The shift lane: a context shift (a whole sequence's positions moved by seq_add, then one more token) on every tier-1
and tier-2 row, in the model's own context, in a YaRN one (the worker's `rope_scaling`, `rope_freq_scale`) and with a
full-size window cache. The program, the configs and the YaRN control are tested without llama.cpp; against the pinned
llama.cpp, YaRN's shift is an upstream defect every rotary family shares (one repro, matched by its cause), a
recurrent memory shifts faithfully and a window's default cache refuses the shift."""

import pytest

from fuzz.certify.lanes import lane_shift
from fuzz.cli import rope_params
from fuzz.engine.contract import KNOWN, PASS
from fuzz.oracles.memory import run
from fuzz.oracles.memory_configs import SHIFT_DELTA, SHIFT_TOKENS, YARN, shift_config, shift_program
from fuzz.oracles.memory_controls import cache_name
from fuzz.oracles.memory_machine import cache_params
from fuzz.oracles.memory_model import MemoryConfig, check_program
from fuzz.repro.campaign import known_repro, known_upstream
from fuzz.repro.upstream_python import TYPED_HELPER, call_line, helpers
from synth.errors import UserError
from synth.make import write_fixture
from synth.manifest import load_manifest
from targets import open_target


def test_the_shift_program_moves_one_whole_sequence_then_decodes_one_more_token():
    p = shift_program(64)
    assert p == shift_program(64)  # seeded
    assert [op["op"] for op in p] == ["decode", "add", "decode"]
    assert len(p[0]["parts"][0][1]) == SHIFT_TOKENS == 12 and len(p[2]["parts"][0][1]) == 1
    assert p[1] == {"op": "add", "seq": 1, "p0": 0, "p1": -1, "delta": SHIFT_DELTA}  # (not 0: see shift_program)
    assert p[0]["parts"][0][0] == p[2]["parts"][0][0] == 1
    assert all(0 <= t < 64 for op in (p[0], p[2]) for t in op["parts"][0][1])
    assert check_program(p, 2) == p
    cfg = shift_config(64, **YARN)
    assert (cfg.n_seq, cfg.kv_unified, cfg.program) == (2, (True,), p)
    assert cache_params(cfg) == {"rope_scaling": "yarn", "rope_freq_scale": 0.25}
    assert cache_name(cfg) == "a yarn RoPE scaling, frequency scale 0.25"
    assert cache_params(shift_config(64)) == {}


def test_a_rope_scaling_is_asked_for_plainly():
    assert rope_params("yarn:0.25") == {"rope_scaling": "yarn", "rope_freq_scale": 0.25}
    assert rope_params("") == {"rope_scaling": "", "rope_freq_scale": 0.0}
    with pytest.raises(UserError, match="SCALING"):
        rope_params("yarn:x")
    for bad in (MemoryConfig(rope_scaling="longrope"), MemoryConfig(rope_scaling="yarn", rope_freq_scale=-1)):
        with pytest.raises(UserError, match="yarn:0.5"):
            run("no-such.gguf", bad)  # (refused before any file is read)


def test_a_reproducers_context_takes_the_changed_params_by_their_llama_h_names():
    assert call_line("ctx", "load", {"n_seq_max": 2, "rope_scaling": "yarn", "rope_freq_scale": 0.25}, "rows") == (
        "ctx = new_context(model, n_ctx=256, n_batch=64, n_ubatch=64, n_seq_max=2, n_rs_seq=0, flash_attn=False, "
        "kv_unified=True, rope_scaling_type=L.LLAMA_ROPE_SCALING_TYPE_YARN, rope_freq_scale=0.25)")
    assert call_line("ctx", "load", {"swa_full": True}, "rows").endswith("kv_unified=False, swa_full=True)")
    # KV cache types by ggml's enum (the map the prelude gets only where a load has them), with the others alike
    assert call_line("ctx", "load", {"swa_full": True, "type_k": "q8_0"}, "rows").endswith(
        "type_k=GGML_TYPES['q8_0'], type_v=GGML_TYPES['f16'], swa_full=True)")
    assert helpers([("load", {"swa_full": True})]) == []
    assert helpers([("load", {"type_k": "bf16"})]) == [TYPED_HELPER]


def test_the_yarn_shift_repro_is_known_in_every_family_by_its_cause():
    known = known_upstream()

    class F:
        status, message = "finding", ""

        def __init__(self, **fp):
            self.fingerprint = {"oracle": "memory", "status": "finding", "phase": "unified-kv", "where": "logits",
                                "op": "decode", "ops": ["add", "decode"], "memory": "kv", **fp}

    for family in ("llama", "qwen3", "deepseek2", "phi3"):
        assert known_repro(known, family, F(cause="rope-scaling")) == "llama-memory-shift-yarn-magnitude"
    # no cause: a family's own shift bug, known only in its family
    assert known_repro(known, "smollm3", F()) == "smollm3-memory-shift-nope-layers"
    assert known_repro(known, "llama", F()) is None


# ---- against the pinned llama.cpp ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    root, m = tmp_path_factory.mktemp("rows"), load_manifest()

    def make(key: str):
        row = m.row(key)
        path = root / f"{key}.gguf"
        if not path.exists():
            write_fixture(row.spec(), path)
        return row, path

    return make


@pytest.mark.llama
def test_the_worker_takes_a_rope_scaling_and_refuses_an_unknown_one(rows):
    _, path = rows("llama")
    with open_target("llama-cpp") as t:
        assert t.load(str(path), rope_scaling="yarn", rope_freq_scale=0.25).ok
        r = t.load(str(path), rope_scaling="longrope")
        assert not r.ok and r.failure.error_kind == "bad_request" and "none, linear, yarn" in r.failure.message


@pytest.mark.llama
def test_yarns_shift_is_upstreams_known_defect_and_the_models_own_shift_is_faithful(rows):
    row, path = rows("llama")
    res = lane_shift(row, path, "llama-cpp")
    assert res.status == KNOWN, res.detail
    assert res.data["known"] == ["corpora/repros/llama-memory-shift-yarn-magnitude"]
    plain, yarn = res.reports
    assert plain.status == PASS and plain.results[0]["max_abs_dlogit"] < 1e-2
    assert yarn.findings[0].cause["kind"] == "rope-scaling" and yarn.findings[0].reproduced
    assert "the model's positions: max|Δlogit|" in res.detail and "YaRN (frequency scale 0.25)" in res.detail


@pytest.mark.llama
@pytest.mark.parametrize("key,refused", [("mamba", False), ("gemma3", True)])
def test_a_recurrent_memory_shifts_faithfully_and_a_windows_cache_refuses_unless_full_size(rows, key, refused):
    row, path = rows(key)
    res = lane_shift(row, path, "llama-cpp")
    assert res.status == PASS, res.detail
    assert len(res.reports) == (3 if refused else 2)  # (a window's full-size cache run too)
    assert ("the model's positions: refused (the memory cannot shift), nothing changed" in res.detail) == refused
    if refused:
        assert "a full-size window cache: max|Δlogit|" in res.detail
