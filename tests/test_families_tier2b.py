"""Tier-2b families (internlm2, olmo, olmo2, olmoe, mistral3, qwen2moe, exaone, exaone4, exaone-moe, cohere2,
qwen35, qwen4exp, smollm3, minicpm, minicpm3, plamo3, deepseek2-ocr, deepseek4; lfm2's sliding window, the lfm2-swa
row): what their knobs change in the file, what llama.cpp makes of it, and one-line errors for what the archs cannot
express."""

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from synth.errors import UserError
from synth.gguf_io import GGUFFile
from synth.inspect import inspect_file
from synth.make import resolve, write_fixture
from synth.spec import Knobs
from synth.strategies import specs

from conftest import run_cli

TIER2B = ["internlm2", "olmo", "olmo2", "olmoe", "mistral3", "qwen2moe", "exaone", "exaone4", "exaone-moe",
          "cohere2", "qwen35", "qwen4exp", "smollm3", "minicpm", "minicpm3", "plamo3", "deepseek2-ocr",
          "minimax-m3", "dots3note",
          "deepseek4"]
PROMPT = [1, 7, 3, 12, 5, 9, 2, 30]


def ffn_kinds(path) -> list[str]:
    return [f"moe{x.n_expert}" if x.ffn == "moe" else x.ffn for x in inspect_file(str(path)).layers]


# ---- MoE layers ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("family,knobs,expected", [
    ("olmoe", {}, ["moe4"] * 4),
    ("olmoe", {"experts": 8, "experts_used": 3}, ["moe8"] * 4),
    ("qwen2moe", {"layers": 3}, ["moe4"] * 3),
    ("exaone-moe", {}, ["dense", "moe4", "moe4", "moe4"]),
    ("exaone-moe", {"leading_dense": 2, "experts": 6}, ["dense", "dense", "moe6", "moe6"]),
    ("exaone-moe", {"leading_dense": 0}, ["moe4"] * 4),
    ("deepseek2-ocr", {}, ["dense", "moe4", "moe4", "moe4"]),
    ("deepseek2-ocr", {"leading_dense": 3, "layers": 5}, ["dense"] * 3 + ["moe4"] * 2),
    ("mistral3", {}, ["dense"] * 4),
    ("mistral3", {"experts": 4}, ["moe4"] * 4),
    ("minicpm", {"experts": 2, "experts_used": 1}, ["moe2"] * 4),
])
def test_moe_layers_visible_in_inspect(fixtures, family, knobs, expected):
    assert ffn_kinds(fixtures(family, **knobs)) == expected


def test_moe_families_write_their_expert_widths(fixtures):
    g = GGUFFile(fixtures("qwen2moe", ff=96))
    assert (g.get("expert_feed_forward_length"), g.get("expert_shared_feed_forward_length")) == (24, 96)
    assert g.tensors["blk.0.ffn_up_exps.weight"].ne == (32, 24, 4)  # [E, Fe, X]
    g = GGUFFile(fixtures("deepseek2-ocr", shared_experts=3))
    assert g.get("expert_shared_count") == 3
    assert g.tensors["blk.1.ffn_up_shexp.weight"].ne == (32, 16 * 3)
    assert "blk.0.ffn_up_shexp.weight" not in g.tensors  # the leading dense layer has no experts


# ---- qwen35 interleaving -------------------------------------------------------------------------------------

@pytest.mark.parametrize("knobs,pattern,interval", [
    ({}, "RRRARRRA", 4),
    ({"period": 2}, "RARARARA", 2),
    ({"period": 3, "layers": 9}, "RRARRARRA", 3),
    ({"layers": 4, "period": 1}, None, None),  # all attention: rejected (hybrid needs both kinds)
    ({"period": 4, "offset": 0}, "ARRRARRR", None),
    ({"pattern": "ARRA RRAR"}, "ARRARRAR", None),
])
def test_qwen35_interleaving_keys(fixtures, knobs, pattern, interval):
    if pattern is None:
        with pytest.raises(UserError, match="qwen35"):
            resolve("qwen35", Knobs(**knobs))
        return
    path = fixtures("qwen35", **knobs)
    g = GGUFFile(path)
    assert g.get("full_attention_interval") == interval
    rec = g.get("attention.recurrent_layers")
    if interval is None:  # any other pattern goes into the per-layer array
        assert [bool(r) for r in rec] == [c == "R" for c in pattern]
    else:
        assert rec is None
    assert "".join(x.kind[0].upper() for x in inspect_file(str(path)).layers) == pattern


@pytest.mark.llama
def test_qwen35_recurrent_layers_as_llama_cpp_counts_them(llama, fixtures):
    """The recurrent (partial) state grows by one fixed per-layer block per gated-delta-net layer, so
    llama.cpp's recurrent-layer count equals ours for interval- and array-encoded patterns alike."""
    sizes = {}
    for knobs in ({"pattern": "RRRA"}, {}, {"pattern": "ARRA RRAR"}, {"period": 2}, {"pattern": "AAAR"}):
        path = fixtures("qwen35", **knobs)
        n_rec = sum(x.kind == "recurrent" for x in inspect_file(str(path)).layers)
        assert llama.load(str(path)).ok
        assert llama.generate(PROMPT, 2).ok
        sizes[n_rec] = llama.state_get(0, partial=True).data["size"]
    assert sorted(sizes) == [1, 3, 4, 5, 6]
    steps = {(sizes[b] - sizes[a]) // (b - a) for a, b in zip(sorted(sizes), sorted(sizes)[1:], strict=False)}
    assert len(steps) == 1 and steps.pop() > 0, sizes


# ---- per-layer K/V widths ------------------------------------------------------------------------------------

def test_plamo3_per_layer_kv_widths_in_inspect(fixtures):
    info = inspect_file(str(fixtures("plamo3", kv_heads=(4, 2, 1, 2, 4, 1))))
    assert info.n_layer == 6  # the list alone sets the layer count
    assert [x.n_head_kv for x in info.layers] == [4, 2, 1, 2, 4, 1]
    assert [x.k_row_bytes for x in info.layers] == [64, 32, 16, 32, 64, 16]
    g = GGUFFile(fixtures("plamo3", kv_heads=(4, 2, 1, 2, 4, 1)))
    assert g.tensors["blk.2.attn_qkv.weight"].ne == (32, (4 + 2 * 1) * 8)  # [E, (H + 2·Hkv)·D]


@pytest.mark.llama
def test_plamo3_kv_cache_uses_per_layer_widths(llama, fixtures):
    """llama.cpp's KV-cache state for n tokens differs between two files by n × the difference of the per-layer
    K+V row bytes that inspect reports: the cache really has uneven widths."""
    sizes, rows = [], []
    for kv in ((4, 4, 4, 4), (4, 2, 1, 2)):
        path = fixtures("plamo3", kv_heads=kv)
        assert llama.load(str(path)).ok
        out = llama.generate(PROMPT, 4)
        assert out.ok and len(set(out.data["tokens"])) >= 2
        sizes.append(llama.state_get(0).data["size"])
        rows.append(sum(x.k_row_bytes + x.v_row_bytes for x in inspect_file(str(path)).layers))
    n_tokens = len(PROMPT) + 4  # generate decodes every greedy token it picks
    assert sizes[0] - sizes[1] == n_tokens * (rows[0] - rows[1])


def test_mha_families_follow_heads(fixtures):
    for family in ("olmoe", "minicpm3", "deepseek2-ocr"):
        info = inspect_file(str(fixtures(family, heads=2)))
        assert {x.n_head_kv for x in info.layers} == {2}, family


def test_minicpm3_cache_widths(fixtures):
    x = inspect_file(str(fixtures("minicpm3"))).layers[0]
    assert (x.mixer, x.n_head_kv, x.head_dim_k, x.head_dim_v) == ("mla", 4, 8 + 4, 8)  # nope + rope, E/H


# ---- stage-contract keys -------------------------------------------------------------------------------------

def test_minicpm_writes_its_three_scales(fixtures):
    g = GGUFFile(fixtures("minicpm", layers=9))
    assert g.get("embedding_scale") == pytest.approx(12.0)
    assert g.get("residual_scale") == pytest.approx(1.4 / 3)
    assert g.get("logit_scale") == pytest.approx(2.0)


def test_cohere2_has_tied_head_and_swa_keys(fixtures):
    g = GGUFFile(fixtures("cohere2"))
    assert "output.weight" not in g.tensors  # llama.cpp always ties it; an extra tensor would fail the load
    assert g.get("attention.sliding_window") == 16 and g.get("logit_scale") > 0
    assert GGUFFile(fixtures("exaone-moe")).get("attention.sliding_window") == 16


def test_qwen4exp_writes_hyper_connections_and_qsa_on_attention_layers_only(fixtures):
    g = GGUFFile(fixtures("qwen4exp", pattern="RARA"))
    assert (g.get("hyper_connection.count"), g.get("hyper_connection.low_rank")) == (4, 8)
    assert g.get("attention.compress_ratios") == [0, 4, 0, 4]  # the converter's rule: full-attention layers only
    assert g.get("attention.indexer.top_k") == 8
    assert "output_norm.weight" not in g.tensors and g.tensors["output_hc_norm.weight"].ne == (32, 4)
    assert "blk.1.indexer.q_proj.weight" in g.tensors and "blk.0.indexer.q_proj.weight" not in g.tensors
    assert g.tensors["blk.0.hc_attn_inject.weight"].ne == (128, 4)  # [hc * n_embd, hc]


def test_lfm2_sliding_window_marks_the_attention_layers_and_a_stage_keeps_them(fixtures, tmp_path):
    from synth.stage import slice_model

    path = fixtures("lfm2", layers=6, period=3, sliding_window=8)
    g = GGUFFile(str(path))
    assert g.get("attention.sliding_window") == 8
    assert [x.swa for x in inspect_file(str(path)).layers] == [False, False, True] * 2  # is_swa = !is_recr
    assert GGUFFile(str(fixtures("lfm2", layers=6, period=3))).get("attention.sliding_window") is None
    stage = tmp_path / "stage.gguf"
    slice_model(str(path), str(stage), 3, 6)
    assert GGUFFile(str(stage)).get("attention.sliding_window_pattern") == [False, False, True]


EXAONE4_64 = {"layers": 64, "embd": 16, "heads": 2, "ff": 16}  # ~0.5 MB


@pytest.mark.llama
@pytest.mark.parametrize("family,knobs,swa", [
    ("cohere2", {}, True), ("exaone-moe", {}, True), ("exaone4", {}, False), ("exaone4", EXAONE4_64, True),
    ("exaone4", {**EXAONE4_64, "layers": 63}, False), ("smollm3", {}, False), ("olmo2", {}, False),
])
def test_swa_cache_split(llama, fixtures, family, knobs, swa):
    """With SWA layers llama.cpp keeps a separate SWA cache, so the partial-only state is smaller than the full
    state. exaone4 has SWA only at exactly 64 blocks (models/exaone4.cpp:4); the others have one cache."""
    assert llama.load(str(fixtures(family, **knobs))).ok
    assert llama.generate(PROMPT, 4).ok
    full, part = llama.state_get(0).data["size"], llama.state_get(0, partial=True).data["size"]
    assert (part < full) == swa, (full, part)


# ---- deepseek2-ocr: why upstream skips it ----------------------------------------------------------------------

@pytest.mark.llama
def test_deepseek2_ocr_has_no_dense_variant(llama, tmp_path):
    """Upstream's test-llama-archs runs archs outside moe_mandatory() only as a dense variant (expert_count 0);
    deepseek2-ocr throws on that at load, while our MoE fixture loads and decodes (test_families_decode)."""
    spec = replace(resolve("deepseek2-ocr", Knobs(layers=2)), n_expert=0, n_expert_used=0)
    path = tmp_path / "dense.gguf"
    write_fixture(spec, path)
    loaded = llama.load(str(path))
    assert not loaded.ok and "n_expert must be > 0" in loaded.failure.message


# ---- deepseek4: the layers llama_kv_cache_dsv4 serves, and why no cut can ----------------------------------------

def test_deepseek4_layout(fixtures):
    """Window-only hash layer, then CSA / HCA alternating; indexer tensors on CSA layers only; the hash layer's
    routing table is I32 (as the converter writes it) with distinct experts per token."""
    g = GGUFFile(fixtures("deepseek4", layers=5))
    assert g.get("attention.compress_ratios") == [0, 4, 128, 4, 128] and g.get("hash_layer_count") == 1
    assert [f"blk.{i}.indexer.proj.weight" in g.tensors for i in range(5)] == [False, True, False, True, False]
    assert g.tensors["blk.2.attn_compressor_ape.weight"].ne == (16, 128)  # HCA: one half, ratio rows
    assert g.tensors["blk.1.attn_compressor_ape.weight"].ne == (32, 4)  # CSA: two overlapping halves
    routes = g.tensor_data("blk.0.ffn_gate_tid2eid.weight")
    assert routes.dtype == np.int32 and routes.shape == (64, 2)  # [n_vocab][n_expert_used]
    assert all(len(set(r)) == 2 and 0 <= min(r) and max(r) < 4 for r in routes.tolist())
    assert "blk.0.exp_probs_b.bias" not in g.tensors and "blk.1.exp_probs_b.bias" in g.tensors


def test_deepseek4_refuses_every_cut(fixtures):
    from synth.stage import embd_input_contract, stage_contract

    g = GGUFFile(fixtures("deepseek4"))
    assert stage_contract(g, 0, 4) is None
    assert "hyper-connection streams" in stage_contract(g, 0, 2)  # its output cannot be handed on
    assert "tid2eid" in embd_input_contract(g)  # hash routing: hidden states cannot stand in for tokens
    assert "tid2eid" in stage_contract(g, 2, 4) and "tid2eid" in stage_contract(g, 1, 3)  # (checked first)


@pytest.mark.llama
def test_deepseek4_state_holds_the_compressed_caches(llama, fixtures):
    """llama_kv_cache_dsv4's sequence state carries the compressed caches besides the raw window and the compressor
    rings (the partial state): the difference grows as CSA blocks complete, one row every 4 tokens."""
    assert llama.load(str(fixtures("deepseek4"))).ok
    diffs = []
    for prompt in (PROMPT[:3], [*PROMPT, 4, 8, 11]):
        assert llama.generate(prompt, 1).ok
        full, part = llama.state_get(0).data["size"], llama.state_get(0, partial=True).data["size"]
        diffs.append(full - part)
    assert 0 < diffs[0] < diffs[1], diffs


# ---- variants load and decode ----------------------------------------------------------------------------------

VARIANTS = [
    ("internlm2", {"kv_heads": (1,)}), ("olmo", {"kv_heads": (2,), "heads": 8}), ("olmo2", {"kv_heads": (1,)}),
    ("olmoe", {"experts": 8, "experts_used": 3}), ("mistral3", {"experts": 4, "head_dim": 16}),
    ("qwen2moe", {"kv_heads": (4,), "ff": 96}), ("exaone", {"head_dim": 16, "kv_heads": (1,)}),
    ("exaone4", {"kv_heads": (4,)}), ("exaone-moe", {"leading_dense": 0, "head_dim": 16}),
    ("exaone-moe", {"leading_dense": 2, "layers": 6}), ("cohere2", {"layers": 8, "kv_heads": (1,)}),
    ("qwen35", {"head_dim": 8, "kv_heads": (2,)}), ("qwen35", {"head_dim": 12, "pattern": "ARRA"}),
    ("qwen4exp", {"pattern": "RARA", "indexer_top_k": 4}), ("qwen4exp", {"experts": 2, "experts_used": 1}),
    ("lfm2", {"sliding_window": 8}), ("lfm2", {"sliding_window": 4, "pattern": "ARRA"}),
    ("smollm3", {"layers": 8, "head_dim": 16}), ("minicpm", {"experts": 4}), ("minicpm", {"head_dim": 4}),
    ("minicpm3", {"q_lora_rank": 8, "kv_lora_rank": 24, "heads": 2}),
    ("plamo3", {"kv_heads": (2, 1, 4, 2), "head_dim": 16}),
    ("deepseek2-ocr", {"shared_experts": 2, "leading_dense": 0}),
    ("deepseek4", {"layers": 2}), ("deepseek4", {"experts": 8, "experts_used": 3, "shared_experts": 2}),
    ("deepseek4", {"heads": 2, "head_dim": 8, "indexer_top_k": 1}),
    ("minimax-m3", {"kv_heads": (1,), "leading_dense": 0}), ("minimax-m3", {"layers": 3, "indexer_top_k": 1}),
    ("dots3note", {"layers": 3, "seed": 1}), ("dots3note", {"layers": 9, "leading_dense": 3, "indexer_top_k": 1}),
]


@pytest.mark.llama
@pytest.mark.parametrize("family,knobs", VARIANTS, ids=[f"{f}-{'-'.join(map(str, k))}" for f, k in VARIANTS])
def test_variants_decode(llama, fixtures, family, knobs):
    loaded = llama.load(str(fixtures(family, **knobs)))
    assert loaded.ok, loaded.failure
    out = llama.generate(PROMPT, 16, chunk=5)
    assert out.ok, out.failure
    assert np.isfinite(out.data["logits"]).all()
    assert len(set(out.data["tokens"])) >= 2, out.data["tokens"]


@pytest.mark.llama
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(spec=specs(families=TIER2B, max_layers=8))
def test_generated_tier2b_specs_load_and_decode(llama, tmp_path, spec):
    path = tmp_path / "f.gguf"
    write_fixture(spec, path)
    loaded = llama.load(str(path))
    assert loaded.ok, (spec, loaded.failure)
    out = llama.generate([1, 2, 3, 4], 4)
    assert out.ok, (spec, out.failure)
    assert np.isfinite(out.data["logits"]).all()


# ---- what the archs cannot express -----------------------------------------------------------------------------

@pytest.mark.parametrize("family,knobs,words", [
    ("olmoe", {"kv_heads": (2,)}, ["--kv-heads", "k_norm"]),
    ("minicpm3", {"kv_heads": (2,)}, ["--kv-heads"]),
    ("deepseek2-ocr", {"kv_heads": (1,)}, ["--kv-heads"]),
    ("olmoe", {"experts": 0}, ["--experts", "MoE-only"]),
    ("qwen2moe", {"experts": 0}, ["--experts"]),
    ("exaone-moe", {"experts": 0}, ["--experts"]),
    ("deepseek2-ocr", {"experts": 0}, ["--experts"]),
    ("exaone-moe", {"leading_dense": 5}, ["--leading-dense", "--layers 4"]),
    ("deepseek2-ocr", {"shared_experts": 0}, ["--shared-experts"]),
    ("minicpm3", {"q_lora_rank": 0}, ["--q-lora-rank"]),
    ("minicpm3", {"kv_lora_rank": 0}, ["--kv-lora-rank"]),
    ("internlm2", {"head_dim": 16}, ["--head-dim"]),
    ("olmo2", {"head_dim": 16}, ["--head-dim"]),
    ("exaone4", {"head_dim": 16}, ["--head-dim"]),
    ("cohere2", {"experts": 4}, ["--experts"]),
    ("qwen35", {"experts": 4}, ["--experts"]),
    ("qwen35", {"head_dim": 5}, ["--head-dim 5"]),
    ("qwen35", {"sliding_window": 8}, ["--sliding-window"]),
    ("qwen4exp", {"experts": 0}, ["--experts", "MoE"]),
    ("qwen4exp", {"indexer_top_k": 0}, ["--indexer-top-k 0"]),
    ("qwen4exp", {"head_dim": 64}, ["--head-dim 64", "indexer key"]),
    ("qwen4exp", {"indexer": False}, ["--indexer"]),
    ("lfm2", {"sliding_window": -1}, ["--sliding-window -1", ">= 0"]),
    ("plamo3", {"head_dim": 7}, ["head dim 7", "--head-dim", "even"]),
    ("mistral3", {"embd": 12, "heads": 4}, ["head dim 3", "--embd 12 / --heads 4"]),
    ("minicpm3", {"heads": 32}, ["head dim 1"]),
    ("minicpm3", {"embd": 24, "heads": 8}, ["head dim 3"]),
    ("deepseek2-ocr", {"embd": 12, "heads": 4}, ["head dim 3"]),
    ("cohere2", {"embd": 12, "heads": 4, "kv_heads": (2,)}, ["head dim 3"]),
    ("smollm3", {"period": 4}, ["--period"]),
    ("exaone", {"kv_heads": (2, 1, 2, 1)}, ["--kv-heads", "varies"]),
    ("plamo3", {"kv_heads": (2, 1, 2), "layers": 4}, ["--kv-heads"]),
    ("plamo3", {"kv_heads": (3,)}, ["--kv-heads 3", "divide"]),
    ("deepseek4", {"layers": 1}, ["--layers 1", "CSA"]),
    ("deepseek4", {"heads": 3, "head_dim": 16}, ["--heads 3", "output groups"]),
    ("deepseek4", {"head_dim": 6}, ["--head-dim 6"]),
    ("deepseek4", {"q_lora_rank": 0}, ["--q-lora-rank"]),
    ("deepseek4", {"experts": 0}, ["--experts"]),
    ("deepseek4", {"kv_heads": (2,)}, ["--kv-heads"]),
    ("minimax-m3", {"layers": 2, "leading_dense": 2}, ["--leading-dense 2", "no MSA layer"]),
    ("minimax-m3", {"indexer_top_k": 0}, ["--indexer-top-k 0"]),
    ("minimax-m3", {"head_dim": 18}, ["--head-dim 18"]),
    ("dots3note", {"layers": 1}, ["--layers 1", "sliding-window"]),
    ("dots3note", {"indexer": False}, ["--no-indexer"]),
    ("dots3note", {"q_lora_rank": 0}, ["--q-lora-rank"]),
])
def test_unexpressible_knobs_are_one_line_errors(family, knobs, words):
    with pytest.raises(UserError) as e:
        resolve(family, Knobs(**knobs))
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"family {family}:"), msg
    for w in words:
        assert w in msg, msg


def test_cli_rejects_kv_heads_for_mha_only_family(tmp_path):
    r = run_cli("synth", "make", "olmoe", "--kv-heads", "2", "-o", str(tmp_path / "x.gguf"))
    assert r.returncode == 2
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "olmoe" in lines[0] and "--kv-heads" in lines[0], r.stderr


# ---- minimax-m3 (llama_kv_cache_msa) and dots3note (llama_kv_cache_dsa_iswa) -------------------------------------

def test_minimax_m3_puts_the_msa_indexer_on_the_moe_layers_only(fixtures):
    g = GGUFFile(str(fixtures("minimax-m3", layers=4)))
    assert g.get("leading_dense_block_count") == 1
    assert g.get("attention.indexer.head_count") == g.get("attention.head_count_kv") == 2  # one per GQA group
    assert (g.get("attention.indexer.block_size"), g.get("attention.indexer.local_blocks")) == (4, 1)
    assert "blk.0.indexer.q_proj.weight" not in g.tensors and "blk.0.ffn_up.weight" in g.tensors
    for i in (1, 2, 3):
        assert g.tensors[f"blk.{i}.indexer.q_proj.weight"].ne == (32, 2 * 32)
        assert f"blk.{i}.exp_probs_b.bias" in g.tensors and f"blk.{i}.ffn_up_shexp.weight" in g.tensors


def test_dots3note_swa_layers_have_their_own_mla_geometry_and_no_indexer(fixtures):
    g = GGUFFile(str(fixtures("dots3note", layers=6)))
    full = [True, False, False, False, True, False]
    assert g.get("attention.sliding_window_pattern") == [not f for f in full]
    assert g.get("attention.indexer.types") == full
    assert g.get("attention.head_count") == [4 if f else 8 for f in full]
    assert (g.get("attention.kv_lora_rank_swa"), g.get("attention.key_length_swa")) == (8, 16)
    assert g.get("rope.freq_base_swa") != g.get("rope.freq_base")
    assert g.tensors["blk.0.attn_k_b.weight"].ne == (8, 16, 4) and g.tensors["blk.1.attn_k_b.weight"].ne == (16, 8, 8)
    assert g.tensors["blk.1.attn_gate.weight"].ne == (32, 8) and g.tensors["blk.1.attn_k_norm.weight"].ne == (8,)
    assert "blk.4.indexer.proj.weight" in g.tensors and "blk.5.indexer.proj.weight" not in g.tensors


@pytest.mark.parametrize("family,a,b,layers", [
    ("minimax-m3", 0, 1, [0, 1]),  # only the leading dense layer: an MSA layer is appended
    ("minimax-m3", 0, 3, [0, 1, 2]),
    ("dots3note", 5, 6, [5, 4]),  # only a sliding layer: a full (indexer) layer is appended
    ("dots3note", 1, 4, [1, 2, 3, 4]),
    ("dots3note", 3, 6, [3, 4, 5]),  # starts on a sliding layer: no top-k sideband to refuse
])
def test_stages_get_the_layer_kind_llama_cpp_cannot_run_without(fixtures, tmp_path, family, a, b, layers):
    from synth.stage import slice_model

    st = slice_model(str(fixtures(family, layers=6)), str(tmp_path / "s.gguf"), a, b)
    assert st.layers == layers and st.pads == list(range(b - a, len(layers)))


@pytest.mark.llama
@pytest.mark.parametrize("flash_attn", [False, True])
@pytest.mark.parametrize("family,a,b", [("minimax-m3", 0, 1), ("dots3note", 5, 6)])
def test_padded_stages_load_and_decode(llama, fixtures, tmp_path, family, a, b, flash_attn):
    """Unpadded, these stages crash llama.cpp: minimax-m3's dense-only stage aborts with flash attention
    (GGML_ASSERT(buffer) on the unallocated indexer k_idxs input), dots3note's sliding-only one at load (SIGFPE in
    build_input_k_rot over an empty indexer cache)."""
    from synth.stage import slice_model

    path = tmp_path / "s.gguf"
    slice_model(str(fixtures(family, layers=6)), str(path), a, b)
    assert llama.load(str(path), flash_attn=flash_attn).ok
    out = llama.generate(PROMPT, 8)
    assert out.ok, out.failure
    assert np.isfinite(out.data["logits"]).all()
