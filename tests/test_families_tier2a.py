"""Tier-2a families (Qwen-VL, Gemma 2/3/3n/4, Phi, Granite, Hunyuan, Falcon): the knobs and arch quirks that
change the file, what inspect reads back, and one-line errors for what the archs cannot express."""

import numpy as np
import pytest

from synth.errors import UserError
from synth.families import FAMILIES
from synth.families.gemma4 import is_swa, kv_from_start
from synth.gguf_io import GGUFFile, write_gguf
from synth.inspect import inspect_file
from synth.make import resolve, write_fixture
from synth.spec import Knobs

TIER2A = ["qwen2vl", "qwen3vl", "gemma2", "gemma3", "gemma3n", "gemma4", "phi2", "phi3", "phimoe", "granite",
          "hunyuan-dense", "hunyuan-moe", "hunyuan_vl", "falcon"]


def read(fixtures, family, **knobs) -> GGUFFile:
    return GGUFFile(str(fixtures(family, **knobs)))


def shape(g: GGUFFile, name: str) -> tuple[int, ...]:
    return g.tensors[name].ne


def test_all_tier2a_families_registered_with_their_arch_strings():
    assert set(TIER2A) <= set(FAMILIES)
    for name in TIER2A:
        assert FAMILIES[name].arch_name == name  # CLI name = gguf MODEL_ARCH_NAMES spelling
        assert FAMILIES[name].kind == "dense"


@pytest.mark.parametrize("family", TIER2A)
def test_inspect_agrees_with_every_layer_count(tmp_path, family):
    """Deterministic stand-in for the hypothesis property over just these families (1..8 layers)."""
    fam = FAMILIES[family]
    for layers in range(getattr(fam, "min_layers", 1), 9):
        spec = resolve(family, Knobs(layers=layers, seed=layers))
        path = tmp_path / f"{layers}.gguf"
        write_fixture(spec, path)
        info = inspect_file(str(path))
        assert info.n_layer == layers and not info.is_recurrent and not info.is_hybrid
        assert [x.kind for x in info.layers] == ["attention"] * layers
        assert [x.n_head_kv for x in info.layers] == list(spec.n_head_kv)


# ---- M-RoPE sections -------------------------------------------------------------------------------------

@pytest.mark.parametrize("family,knobs,sections", [
    ("qwen2vl", {}, [2, 3, 3, 0]),  # head dim 16
    ("qwen3vl", {}, [2, 3, 3, 0]),
    ("qwen3vl", {"head_dim": 64}, [8, 12, 12, 0]),  # Qwen2-VL proportions: [16, 24, 24, 0] for 128
    ("hunyuan_vl", {}, [2, 3, 3, 0]),
])
def test_mrope_archs_write_four_sections_summing_to_half_the_head(fixtures, family, knobs, sections):
    g = read(fixtures, family, **knobs)
    got = g.get("rope.dimension_sections")
    assert got == sections and len(got) == 4
    assert sum(got) * 2 == resolve(family, Knobs(**knobs)).head_dim


def test_hunyuan_dense_has_no_sections_but_vl_does(fixtures):
    assert read(fixtures, "hunyuan-dense").get("rope.dimension_sections") is None
    assert read(fixtures, "hunyuan_vl").get("rope.dimension_sections") is not None


# ---- Gemma stage contracts carried by the files -------------------------------------------------------------

def test_gemma2_head_is_token_embd_and_sliding_pattern_is_the_default_period(fixtures):
    g = read(fixtures, "gemma2")
    assert "output.weight" not in g.tensors  # llama.cpp never loads it: an extra tensor would be rejected
    assert g.get("attention.sliding_window") == 8
    assert g.get("attention.sliding_window_pattern") is None  # like converted files: period 2 by index
    assert "blk.0.post_attention_norm.weight" in g.tensors and "blk.0.post_ffw_norm.weight" in g.tensors


def test_gemma3_default_six_layers_hold_one_global_layer(fixtures):
    g = read(fixtures, "gemma3")
    assert g.get("block_count") == 6  # llama.cpp's default period 6: layers 0-4 slide, layer 5 is global
    assert g.get("attention.sliding_window") == 8 and g.get("attention.sliding_window_pattern") is None
    assert "output.weight" in g.tensors and shape(g, "blk.0.attn_q_norm.weight") == (16,)


def test_gemma3n_per_layer_inputs_and_altup_are_sized_by_the_hard_coded_dims(fixtures):
    g = read(fixtures, "gemma3n", layers=7)
    assert g.get("attention.sliding_window_pattern") == [True] * 4 + [False] + [True] * 2
    assert shape(g, "per_layer_token_embd.weight") == (256 * 7, 32)
    assert shape(g, "per_layer_model_proj.weight") == (8, 256 * 7)
    assert shape(g, "altup_proj.weight") == (8, 8, 3)
    assert shape(g, "blk.6.altup_predict_coef.weight") == (4, 16)
    assert shape(g, "blk.6.laurel_l.weight") == (8, 64)


def test_gemma4_shared_kv_consumers_have_no_k_and_read_a_matching_producer(fixtures):
    g = read(fixtures, "gemma4", layers=6)
    start = kv_from_start(6, moe=False)
    assert start == 4 and g.get("attention.shared_kv_layers") == 2
    assert g.get("attention.sliding_window_pattern") == [is_swa(i) for i in range(6)] == [True, False] * 3
    assert g.get("attention.head_count_kv") == [2, 1, 2, 1, 2, 1]
    for i in range(6):
        assert (f"blk.{i}.attn_k.weight" in g.tensors) == (i < start)
        assert f"blk.{i}.attn_q.weight" in g.tensors
    # sliding layers use key_length_swa, global layers key_length (2x)
    assert g.get("attention.key_length_swa") == 8 and g.get("attention.key_length") == 16
    assert shape(g, "blk.0.attn_q.weight") == (32, 4 * 8)
    assert shape(g, "blk.1.attn_q.weight") == (32, 4 * 16)
    assert shape(g, "rope_freqs.weight") == (8,)
    assert shape(g, "per_layer_token_embd.weight") == (8 * 6, 64)


@pytest.mark.parametrize("kv_heads,shared", [
    ((2, 1, 2, 1), 2), ((1, 1, 1, 1), 2),
    ((2, 1, 1, 1), 0),  # layer 2 (sliding) would read layer 0's cache, whose K/V heads differ: no sharing
    ((2, 1, 2, 1, 2, 2), 0),  # layer 5 (global) would read layer 3: 2 vs 1 K/V heads
    ((2, 1, 2, 1, 1, 1, 1, 1), 2),  # the default boundary 4 fails (layer 4 vs 2), the next one (6) pairs up
])
def test_gemma4_shared_kv_tail_only_pairs_equal_kv_heads(fixtures, kv_heads, shared):
    g = read(fixtures, "gemma4", kv_heads=kv_heads)
    n = len(kv_heads)
    assert g.get("attention.shared_kv_layers") == shared
    start = n - shared
    for i in range(start, n):
        p = start - (2 if is_swa(i) else 1)
        assert kv_heads[i] == kv_heads[p]
        assert f"blk.{i}.attn_k.weight" not in g.tensors
    assert all(f"blk.{i}.attn_k.weight" in g.tensors for i in range(start))


def test_gemma4_experts_give_the_a4b_row(fixtures):
    g = read(fixtures, "gemma4", experts=4)
    assert g.get("attention.shared_kv_layers") == 0 and g.get("embedding_length_per_layer_input") == 0
    assert "per_layer_token_embd.weight" not in g.tensors
    assert all(f"blk.{i}.attn_k.weight" in g.tensors for i in range(4))
    assert shape(g, "blk.0.ffn_gate_exps.weight") == (32, 32, 4)
    assert "blk.0.ffn_gate_inp.scale" in g.tensors and "blk.0.ffn_gate.weight" in g.tensors  # + dense MLP


# ---- MoE layers visible in inspect -----------------------------------------------------------------------------

@pytest.mark.parametrize("family,knobs,n_expert", [
    ("phimoe", {}, 4), ("phimoe", {"experts": 8, "experts_used": 3}, 8),
    ("hunyuan-moe", {}, 4), ("hunyuan-moe", {"experts": 6}, 6),
    ("gemma4", {"experts": 4}, 4), ("granite", {"experts": 3}, 3),
])
def test_moe_layers_visible_in_inspect(fixtures, family, knobs, n_expert):
    info = inspect_file(str(fixtures(family, **knobs)))
    assert [(x.ffn, x.n_expert) for x in info.layers] == [("moe", n_expert)] * info.n_layer


@pytest.mark.parametrize("family", ["granite", "gemma4", "qwen3vl", "falcon"])
def test_dense_by_default(fixtures, family):
    assert {x.ffn for x in inspect_file(str(fixtures(family))).layers} == {"dense"}


def test_hunyuan_moe_experts_and_shared_expert_sized_by_feed_forward_length(fixtures):
    g = read(fixtures, "hunyuan-moe", ff=24)
    assert g.get("feed_forward_length") == g.get("expert_feed_forward_length") == 24
    assert g.get("expert_shared_feed_forward_length") == 24
    assert shape(g, "blk.0.ffn_up_exps.weight") == (32, 24, 4)
    assert shape(g, "blk.0.ffn_up_shexp.weight") == (32, 24)


# ---- per-layer K/V widths ------------------------------------------------------------------------------------

def test_gemma4_per_layer_kv_heads_reach_file_and_inspect(fixtures):
    path = fixtures("gemma4", kv_heads=(1, 2, 1, 2))
    g = GGUFFile(str(path))
    assert g.get("attention.head_count_kv") == [1, 2, 1, 2]
    assert shape(g, "blk.0.attn_k.weight") == (32, 1 * 8)
    assert shape(g, "blk.1.attn_k.weight") == (32, 2 * 16)
    assert [x.n_head_kv for x in inspect_file(str(path)).layers] == [1, 2, 1, 2]


@pytest.mark.parametrize("family,knobs", [("falcon", {}), ("falcon", {"kv_heads": (4,)}), ("phi3", {"kv_heads": (1,)}),
                                          ("phi2", {"kv_heads": (2,)})])
def test_fused_qkv_width_follows_kv_heads(fixtures, family, knobs):
    g = read(fixtures, family, **knobs)
    spec = resolve(family, Knobs(**knobs))
    assert shape(g, "blk.0.attn_qkv.weight") == (32, 32 + 2 * spec.n_head_kv[0] * spec.head_dim)


def test_phi2_and_falcon_carry_their_required_biases(fixtures):
    g = read(fixtures, "phi2")
    for n in ("output_norm.bias", "output.bias", "blk.0.attn_norm.bias", "blk.0.attn_output.bias",
              "blk.0.ffn_up.bias", "blk.0.ffn_down.bias"):
        assert n in g.tensors, n
    assert g.get("rope.dimension_count") == 4  # partial rotary: half of head dim 8
    f = read(fixtures, "falcon")
    assert "output_norm.bias" in f.tensors and "blk.0.attn_norm.bias" in f.tensors
    assert "blk.0.ffn_norm.weight" not in f.tensors  # parallel attention + MLP


def test_granite_writes_its_scales(fixtures):
    g = read(fixtures, "granite", head_dim=16)
    assert g.get("logit_scale") == 16.0 and g.get("embedding_scale") == 12.0
    assert g.get("residual_scale") == pytest.approx(0.22)
    assert g.get("attention.scale") == pytest.approx(1 / 16)


# ---- one-line errors ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("family,knobs,words", [
    ("gemma4", Knobs(layers=1), ["gemma4", "--layers", "at least 2"]),
    ("gemma2", Knobs(kv_heads=(2, 1, 2, 1)), ["gemma2", "--kv-heads", "layer 0"]),
    ("gemma3", Knobs(experts=4), ["gemma3", "--experts", "supports"]),
    ("gemma3n", Knobs(period=5), ["gemma3n", "--period"]),
    ("gemma3n", Knobs(ff=1), ["gemma3n", "--ff"]),
    ("phimoe", Knobs(experts=0), ["phimoe", "--experts"]),
    ("hunyuan-moe", Knobs(experts=0), ["hunyuan-moe", "--experts"]),
    ("phi2", Knobs(head_dim=16), ["phi2", "--head-dim", "supports"]),
    ("phi2", Knobs(embd=8, heads=4), ["phi2", "head dim 2"]),
    ("falcon", Knobs(experts=2), ["falcon", "--experts"]),
    ("qwen2vl", Knobs(embd=16, heads=4), ["qwen2vl", "M-RoPE", "--embd/--heads"]),
    ("qwen3vl", Knobs(head_dim=4), ["qwen3vl", "M-RoPE", "--head-dim"]),
    ("hunyuan_vl", Knobs(head_dim=4), ["hunyuan_vl", "M-RoPE"]),
    ("hunyuan_vl", Knobs(head_dim=5), ["hunyuan_vl", "even"]),
    ("granite", Knobs(head_dim=7), ["granite", "even"]),
    ("granite", Knobs(shared_experts=1), ["granite", "--shared-experts"]),
    ("qwen3vl", Knobs(kv_heads=(3,)), ["qwen3vl", "divide"]),
])
def test_unexpressible_knobs_are_one_line_errors(family, knobs, words):
    with pytest.raises(UserError) as e:
        resolve(family, knobs)
    msg = str(e.value)
    assert "\n" not in msg
    for w in words:
        assert w in msg, (w, msg)


# ---- against the real llama.cpp ------------------------------------------------------------------------------

PROMPT = [1, 7, 3, 12, 5, 9, 2, 30]


@pytest.mark.llama
@pytest.mark.parametrize("family,knobs", [
    ("gemma4", {"experts": 4}), ("gemma4", {"kv_heads": (1, 2, 1, 2)}), ("gemma4", {"layers": 3}),
    ("gemma4", {"kv_heads": (2, 1, 2, 1, 1, 1, 1, 1)}),
    ("gemma3n", {"layers": 22}),  # beyond the hard-coded KV-sharing boundary (layers 20, 21 read 18, 19)
    ("granite", {"experts": 4}), ("phimoe", {"experts": 8, "experts_used": 3}),
    ("qwen3vl", {"head_dim": 32}), ("hunyuan_vl", {"head_dim": 32, "kv_heads": (1,)}),
    ("falcon", {"kv_heads": (4,)}), ("gemma3", {"layers": 12}),
])
def test_knob_variants_decode(llama, fixtures, family, knobs):
    loaded = llama.load(str(fixtures(family, **knobs)))
    assert loaded.ok, loaded.failure
    out = llama.generate(PROMPT, 16, chunk=5)
    assert out.ok, out.failure
    assert np.isfinite(out.data["logits"]).all()
    assert len(set(out.data["tokens"])) >= 2, out.data["tokens"]


def gemma4_kv_bytes_per_token(family_knobs: dict) -> int:
    """True f16 K+V bytes a token adds to gemma4's cache: only producer layers, with their own head dim."""
    spec = resolve("gemma4", Knobs(**family_knobs))
    start = spec.extra["kv_from_start"]
    return sum(2 * 2 * spec.n_head_kv[i] * (spec.head_dim if is_swa(i) else spec.extra["head_dim_full"])
               for i in range(start))


def state_growth(llama, path) -> int:
    assert llama.load(str(path)).ok
    sizes = []
    for n in (2, 3, 4):
        llama.reset()
        assert llama.decode(PROMPT[:n]).ok
        sizes.append(llama.state_get(0).data["size"])
    assert sizes[2] - sizes[1] == sizes[1] - sizes[0]
    return sizes[1] - sizes[0]


@pytest.mark.llama
def test_gemma4_cache_honours_per_layer_widths_and_shared_kv(llama, fixtures):
    """llama.cpp's per-token state growth differs between variants exactly as the true K/V widths predict:
    uneven K/V heads, sliding (8) vs global (16) head dims, and no cache rows for shared-KV consumers."""
    variants = [{}, {"kv_heads": (2, 2, 2, 2)}, {"kv_heads": (1, 2, 1, 2)}, {"experts": 2}, {"layers": 6}]
    growth = {i: state_growth(llama, fixtures("gemma4", **v)) for i, v in enumerate(variants)}
    want = {i: gemma4_kv_bytes_per_token(v) for i, v in enumerate(variants)}
    assert want[0] == 128 and want[3] == 256  # 2 of 4 layers own KV by default; none shared with --experts
    for i in range(1, len(variants)):
        assert growth[i] - growth[0] == want[i] - want[0], (variants[i], growth, want)


@pytest.mark.llama
def test_one_layer_gemma4_really_aborts_in_llama_cpp(llama, tmp_path):
    """Why gemma4 rejects --layers 1: the pinned llama.cpp asserts n_layer_kv_from_start >= 2 at load."""
    from dataclasses import replace

    fam = FAMILIES["gemma4"]
    two = fam.resolve(Knobs(layers=2))
    one = replace(two, pattern="A", n_head_kv=two.n_head_kv[:1])
    one = replace(one, extra=fam.derive(one))
    kv, tensors = fam.to_gguf(one)
    path = tmp_path / "one.gguf"
    write_gguf(path, fam.arch_name, kv, tensors)
    loaded = llama.load(str(path))
    assert not loaded.ok and "n_layer_kv_from_start >= 2" in loaded.failure.message
