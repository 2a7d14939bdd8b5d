"""synth inspect reads layer kinds and K/V heads from the file alone, and agrees with llama.cpp."""

import pytest
from hypothesis import HealthCheck, given, settings

from synth.inspect import inspect_file
from synth.make import write_fixture
from synth.spec import ATTN, BOTH, REC
from synth.strategies import specs

from upstream import shapes, write_upstream_fixture

KIND = {ATTN: "attention", REC: "recurrent", BOTH: "both"}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(spec=specs())
def test_inspect_agrees_with_spec(tmp_path, spec):
    path = tmp_path / "f.gguf"
    write_fixture(spec, path)
    info = inspect_file(str(path))
    assert info.n_layer == spec.n_layer
    assert [x.kind for x in info.layers] == [KIND[c] for c in spec.pattern]
    for x, kv in zip(info.layers, spec.n_head_kv, strict=True):
        if x.kind == "recurrent":
            assert (x.n_head_kv, x.k_row_bytes, x.v_row_bytes) == (0, 0, 0)
        else:
            assert x.n_head_kv == kv
            assert x.k_row_bytes == (x.head_dim_k * kv * 2 if x.owns_kv else 0)  # f16 cache rows


def test_inspect_reports_uneven_kv_widths(fixtures):
    info = inspect_file(str(fixtures("jamba", kv_heads=(2, 0, 1, 0, 4, 0))))
    assert [x.n_head_kv for x in info.layers] == [2, 0, 1, 0, 4, 0]
    assert [x.k_row_bytes for x in info.layers] == [32, 0, 16, 0, 64, 0]


@pytest.mark.llama
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(spec=specs(max_layers=8))
def test_generated_specs_load_and_decode(llama, tmp_path, spec):
    path = tmp_path / "f.gguf"
    write_fixture(spec, path)
    loaded = llama.load(str(path))
    assert loaded.ok, (spec, loaded.failure)
    out = llama.generate([1, 2, 3, 4], 4)
    assert out.ok, (spec, out.failure)


@pytest.mark.llama
def test_recurrent_hybrid_flags_match_llama_cpp_on_upstream_fixtures(llama, tmp_path):
    """All 128 of upstream's own fixtures: our file-level flags equal llama_model_is_recurrent/hybrid."""
    seen = {"recurrent": 0, "hybrid": 0, "neither": 0}
    for name in shapes():
        path = tmp_path / "u.gguf"
        write_upstream_fixture(name, path)
        info = inspect_file(str(path))
        loaded = llama.load(str(path), n_ctx=64)
        assert loaded.ok, (name, loaded.failure)
        assert (info.is_recurrent, info.is_hybrid) == (loaded.data["is_recurrent"], loaded.data["is_hybrid"]), name
        assert info.n_layer == loaded.data["n_layer"]
        seen["recurrent" if info.is_recurrent else "hybrid" if info.is_hybrid else "neither"] += 1
        if info.is_recurrent:
            assert all(x.kind == "recurrent" for x in info.layers), name
    assert seen["recurrent"] >= 2 and seen["hybrid"] >= 15, seen  # upstream skips RWKV


@pytest.mark.llama
@pytest.mark.parametrize("family,knobs", [("gemma4", {}), ("gemma4", {"kv_heads": (2, 2, 2, 2)}), ("laguna", {}),
                                          ("jamba", {"kv_heads": (2, 0, 1, 0, 4, 0)}), ("qwen3next", {})])
def test_kv_row_bytes_equal_llama_cpp_state_growth(llama, fixtures, family, knobs):
    """K+V row bytes summed over the layers inspect says own KV = what llama.cpp's sequence state grows by per
    position, less its per-cell metadata (12 bytes per KV cache: 2 with an SWA cache beside the full one).
    Positions stay inside every sliding window, where an SWA cache still keeps them all."""
    path = fixtures(family, **knobs)
    info = inspect_file(str(path))
    rows = sum(x.k_row_bytes + x.v_row_bytes for x in info.layers)
    caches = (any(x.swa and x.owns_kv for x in info.layers)) + any(not x.swa and x.owns_kv and x.k_row_bytes
                                                                   for x in info.layers)
    sizes = []
    for n in (1, 3):
        assert llama.load(str(path)).ok
        assert llama.decode(list(range(1, n + 1))).ok
        sizes.append(len(llama.state_get(0).data["blob"]))
    assert (sizes[1] - sizes[0]) / 2 == rows + 12 * caches, (rows, caches, sizes)
