"""Tier-3 families: RWKV-6/7 (recurrent) and the dropped transformers (gpt2, bloom, gptneox, mpt, codeshell,
openelm, refact, stablelm, plm, arcee, deci, chatglm, baichuan, granitemoe, smallthinker, maincoder, xverse,
starcoder2). What is specific to them: the RWKV head-size rule, RWKV decoding that does not depend on how the
prompt is chunked (upstream's own test skips RWKV: "models hang"), uneven K/V widths for openelm and deci,
tied heads, and one-line errors for what the archs cannot express."""

import numpy as np
import pytest

from synth.errors import UserError
from synth.families import get_family
from synth.gguf_io import GGUFFile
from synth.inspect import inspect_file
from synth.make import resolve
from synth.spec import Knobs

PROMPT = [1, 7, 3, 12, 5, 9, 2, 30, 17, 4, 40, 22, 8, 33, 61, 0, 19]  # 17 tokens: chunks of 8 leave a tail


def shapes_of(family: str, **knobs) -> dict[str, tuple[int, ...]]:
    _, tensors = get_family(family).to_gguf(resolve(family, Knobs(**knobs)))
    return {name: arr.shape[::-1] for name, arr in tensors}  # ggml ne order


def one_line_error(family: str, **knobs) -> str:
    with pytest.raises(UserError) as e:
        resolve(family, Knobs(**knobs))
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"family {family}:"), msg
    return msg


# ---- RWKV: head size ---------------------------------------------------------------------------

@pytest.mark.parametrize("knobs", [dict(embd=32), dict(embd=128, heads=4), dict(embd=96),
                                   dict(head_dim=32, heads=2)])
def test_rwkv7_head_size_must_be_a_multiple_of_64(knobs):
    msg = one_line_error("rwkv7", **knobs)
    assert "multiple of 64" in msg and "--embd 128 --heads 2" in msg


@pytest.mark.parametrize("family,knobs,hs", [("rwkv7", {}, 64), ("rwkv7", dict(embd=128, heads=2), 64),
                                             ("rwkv7", dict(embd=128), 128), ("rwkv6", {}, 32),
                                             ("rwkv6", dict(embd=64, heads=4), 16)])
def test_rwkv_head_size_key_and_time_mix_first(fixtures, family, knobs, hs):
    g = GGUFFile(fixtures(family, **knobs))
    assert g.get("wkv.head_size") == hs
    E = g.get("embedding_length")
    if family == "rwkv6":  # the "u" bonus is per head: [head_size, n_heads]
        assert g.tensors["blk.0.time_mix_first.weight"].ne == (hs, E // hs)


def test_rwkv_heads_times_head_size_must_be_the_embedding():
    msg = one_line_error("rwkv7", embd=128, head_dim=64)  # one head (default) of 64 ≠ 128
    assert "--heads 1" in msg and "--embd 128" in msg
    assert "--embd 64" in one_line_error("rwkv6", embd=64, head_dim=16, heads=2)


def test_rwkv7_layer0_value_lora_uses_the_iclr_rank():
    s = shapes_of("rwkv7", layers=3)
    x = resolve("rwkv7").extra
    assert x["lora_iclr"] != x["lora_value_res"]  # else the rule would not show in the shapes
    assert s["blk.0.time_mix_v1.weight"] == (64, x["lora_iclr"])
    assert s["blk.0.time_mix_v2.weight"] == (x["lora_iclr"], 64)
    for i in (1, 2):
        assert s[f"blk.{i}.time_mix_v1.weight"] == (64, x["lora_value_res"])
    assert s["blk.0.time_mix_lerp_fused.weight"] == (64, 1, 1, 6)


@pytest.mark.parametrize("family", ["rwkv6", "rwkv7"])
def test_rwkv_files_have_ln0_and_a_separate_head(family):
    s = shapes_of(family)
    for name in ("token_embd_norm.weight", "token_embd_norm.bias", "output_norm.bias", "output.weight"):
        assert name in s, name


# ---- RWKV against llama.cpp: chunking, state, finiteness --------------------------------------

RWKV_CASES = [("rwkv6", {}), ("rwkv6", dict(embd=64, heads=2, layers=3, seed=2)),
              ("rwkv7", {}), ("rwkv7", dict(embd=128, heads=2, layers=2, seed=1))]


@pytest.mark.llama
@pytest.mark.parametrize("family,knobs", RWKV_CASES, ids=[f"{f}-{k or 'default'}" for f, k in RWKV_CASES])
def test_rwkv_decoding_does_not_depend_on_prefill_chunks(llama, fixtures, family, knobs):
    assert llama.load(str(fixtures(family, **knobs))).ok
    runs = {}
    for chunk in (1, 8):
        assert llama.reset().ok
        out = llama.generate(PROMPT, 24, chunk=chunk)
        assert out.ok, out.failure
        runs[chunk] = out.data
    assert runs[1]["tokens"] == runs[8]["tokens"]
    assert len(set(runs[1]["tokens"])) >= 2
    for r in runs.values():
        assert np.isfinite(r["logits"]).all()
    np.testing.assert_allclose(runs[1]["logits"], runs[8]["logits"], atol=1e-3)


@pytest.mark.llama
@pytest.mark.parametrize("family", ["rwkv6", "rwkv7"])
def test_rwkv_state_carries_context_and_stays_finite(llama, fixtures, family):
    assert llama.load(str(fixtures(family, layers=6))).ok
    # the same last token after different prefixes: the recurrent state must change the prediction
    assert llama.reset().ok
    a = llama.decode([3, 9, 14, 5]).data["logits"][-1]
    assert llama.reset().ok
    b = llama.decode([40, 2, 33, 5]).data["logits"][-1]
    assert np.abs(a - b).max() > 0.1
    # a long context (200 prompt tokens + 40 generated, near n_ctx 256): decay keeps the state bounded
    assert llama.reset().ok
    prompt = [int(t) for t in np.random.default_rng(0).integers(0, 64, 200)]
    out = llama.generate(prompt, 40, chunk=64)
    assert out.ok, out.failure
    assert np.isfinite(out.data["logits"]).all() and np.abs(out.data["logits"]).max() < 100
    assert len(set(out.data["tokens"])) >= 2


# ---- uneven K/V widths (openelm, deci) -------------------------------------------------------

@pytest.mark.parametrize("family", ["openelm", "deci"])
def test_per_layer_kv_heads_give_uneven_kv_widths(fixtures, family):
    info = inspect_file(str(fixtures(family, kv_heads=(2, 1, 4, 2))))
    assert [x.n_head_kv for x in info.layers] == [2, 1, 4, 2]
    assert [x.k_row_bytes for x in info.layers] == [32, 16, 64, 32]  # head dim 8, f16 cache
    assert [x.v_row_bytes for x in info.layers] == [32, 16, 64, 32]
    assert all(x.n_head == 4 for x in info.layers)


def test_openelm_fused_qkv_is_sized_per_layer():
    s = shapes_of("openelm", kv_heads=(2, 1, 4, 2), head_dim=16)
    assert [s[f"blk.{i}.attn_qkv.weight"] for i in range(4)] == [(32, (4 + 2 * h) * 16) for h in (2, 1, 4, 2)]
    assert s["blk.0.attn_output.weight"] == (64, 32)  # H·D wide, not E


@pytest.mark.llama
@pytest.mark.parametrize("family", ["openelm", "deci"])
def test_uneven_kv_widths_load_and_decode(llama, fixtures, family):
    loaded = llama.load(str(fixtures(family, layers=6, kv_heads=(1, 4, 2, 1, 4, 2), head_dim=16)))
    assert loaded.ok, loaded.failure
    out = llama.generate(PROMPT, 16, chunk=5)
    assert out.ok, out.failure
    assert np.isfinite(out.data["logits"]).all() and len(set(out.data["tokens"])) >= 2


def test_uniform_kv_archs_reject_per_layer_kv_heads():
    msg = one_line_error("starcoder2", kv_heads=(2, 1, 2, 2))
    assert "--kv-heads" in msg and "layer 0" in msg


# ---- heads: tied, required, positions --------------------------------------------------------

@pytest.mark.parametrize("family", ["openelm", "plm"])
def test_tied_head_archs_have_no_output_weight(family):
    s = shapes_of(family)
    assert "output.weight" not in s and "token_embd.weight" in s  # an output.weight would be unconsumed


def test_gpt2_position_rows_are_the_context_length():
    spec = resolve("gpt2")
    g_kv, tensors = get_family("gpt2").to_gguf(spec)
    pos = dict(tensors)["position_embd.weight"]
    assert pos.shape[::-1] == (spec.n_embd, spec.n_ctx_train)
    assert g_kv["gpt2.context_length"].value == spec.n_ctx_train


@pytest.mark.parametrize("family,name", [("starcoder2", "blk.0.ffn_up.bias"), ("starcoder2", "blk.0.ffn_down.bias"),
                                         ("starcoder2", "blk.0.attn_output.bias"), ("gpt2", "blk.0.attn_qkv.bias"),
                                         ("codeshell", "blk.0.attn_output.bias"), ("bloom", "token_embd_norm.bias")])
def test_loader_required_biases_are_present(family, name):
    assert name in shapes_of(family)


def test_gptneox_parallel_residual_and_partial_rope():
    kv, _ = get_family("gptneox").to_gguf(resolve("gptneox"))
    assert kv["gptneox.use_parallel_residual"].value is True
    assert kv["gptneox.rope.dimension_count"].value == 4  # half of the head dim 8


@pytest.mark.llama
@pytest.mark.parametrize("layers", [32, 40])  # baichuan: 32 layers = 7B (RoPE), 40 = 13B (ALiBi)
def test_baichuan_positional_variants_load_and_decode(llama, fixtures, layers):
    loaded = llama.load(str(fixtures("baichuan", layers=layers, embd=16, heads=2, kv_heads=(1,), ff=16)))
    assert loaded.ok, loaded.failure
    out = llama.generate(PROMPT, 8, chunk=5)
    assert out.ok and np.isfinite(out.data["logits"]).all()


# ---- MoE knobs -------------------------------------------------------------------------------

def test_granitemoe_experts_and_shared_expert(fixtures):
    info = inspect_file(str(fixtures("granitemoe", experts=4, experts_used=2, shared_experts=1)))
    assert [x.ffn for x in info.layers] == ["moe"] * 4 and info.layers[0].n_expert == 4
    s = shapes_of("granitemoe", experts=4, shared_experts=2)
    assert s["blk.0.ffn_up_shexp.weight"] == (32, 2 * 32)  # S × ff wide
    assert [x.ffn for x in inspect_file(str(fixtures("granitemoe", experts=0))).layers] == ["dense"] * 4


# ---- what the archs cannot express -----------------------------------------------------------

@pytest.mark.parametrize("family,knobs,words", [
    ("gpt2", dict(head_dim=16), ["--head-dim", "supports"]),  # Q and attn_output are E wide
    ("xverse", dict(head_dim=16), ["--head-dim"]),
    ("bloom", dict(experts=4), ["--experts"]),
    ("mpt", dict(period=2), ["--period"]),
    ("stablelm", dict(q_lora_rank=8), ["--q-lora-rank"]),
    ("plm", dict(kv_heads=(2,)), ["--kv-heads"]),  # K/V heads are always the query heads
    ("plm", dict(kv_lora_rank=0), ["--kv-lora-rank", "> 0"]),
    ("plm", dict(heads=16), ["head dim", "≥ 4"]),
    ("plm", dict(embd=20, heads=4), ["head dim of 5", "even"]),  # ggml asserts an even RoPE offset
    ("smallthinker", dict(experts=0), ["--experts", "MoE only"]),
    ("granitemoe", dict(experts=0, shared_experts=1), ["--shared-experts", "--experts"]),
    ("openelm", dict(kv_heads=(2, 0, 2, 2)), ["--kv-heads", "layer 1"]),  # no recurrent layers in a dense arch
    ("deci", dict(kv_heads=(3,)), ["--kv-heads", "divide"]),
    ("mpt", dict(embd=4, heads=4), ["head dim 1", "at least 2"]),  # aborts llama.cpp at context creation
    ("codeshell", dict(embd=12, heads=4), ["head dim 3", "even"]),  # full RoPE
    ("refact", dict(head_dim=1), ["head dim 1"]),
    ("rwkv6", dict(kv_heads=(1,)), ["--kv-heads"]),
    ("rwkv7", dict(experts=2), ["--experts"]),
])
def test_unexpressible_knobs_are_one_line_errors(family, knobs, words):
    msg = one_line_error(family, **knobs)
    for w in words:
        assert w in msg, (w, msg)
