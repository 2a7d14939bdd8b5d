"""Quantized fixtures (synth make --dtype): llama-quantize's tensor rule, bytes kept through slices, every family
running in every dtype, the split bit-exact, and the oracle catching a slicer that dequantizes."""

import json
import re

import gguf
import numpy as np
import pytest

from fuzz.oracles.sweep import Sweep
from fuzz.oracles.sweep_report import SweepConfig
from synth.dtype import DTYPES
from synth.families import FAMILIES
from synth.gguf_io import GGUFFile, Raw, read_all, write_gguf
from synth.make import resolve, write_fixture
from synth.spec import SPEC_KEY, Knobs, ModelSpec
from synth.stage import StageInfo, slice_model
from targets import open_target

from conftest import run_cli

pytestmark = pytest.mark.llama


def types_of(path):
    return {name: t.type for name, t in GGUFFile(path).tensors.items()}


def test_which_tensors_are_quantized(tmp_path):
    llama = types_of(_make(tmp_path, "llama", dtype="q8_0"))
    assert llama["blk.0.attn_q.weight"] == llama["blk.0.ffn_down.weight"] == llama["token_embd.weight"] == "Q8_0"
    assert llama["blk.0.attn_norm.weight"] == llama["output_norm.weight"] == "F32"
    mamba = types_of(_make(tmp_path, "mamba", dtype="q4_0"))
    assert mamba["blk.0.ssm_in.weight"] == "Q4_0" and mamba["blk.0.ssm_conv1d.weight"] == "F32"
    rwkv = types_of(_make(tmp_path, "rwkv6", dtype="q4_0"))
    assert rwkv["blk.0.time_mix_key.weight"] == "Q4_0"
    assert rwkv["blk.0.time_mix_lerp_x.weight"] == "F32"  # (1, 1, n): one ggml dimension
    narrow = types_of(_make(tmp_path, "llama", dtype="q8_0", embd=48, heads=4))  # rows of 48: not whole blocks
    assert narrow["blk.0.attn_q.weight"] == "F32" and narrow["blk.0.ffn_down.weight"] == "Q8_0"  # n_ff 64
    assert set(types_of(_make(tmp_path, "llama", dtype="f16")).values()) == {"F32", "F16"}


def test_f32_fixtures_are_unchanged_by_the_dtype_field(tmp_path):
    spec = resolve("qwen3next", Knobs(layers=4))
    assert spec.dtype == "f32" and "dtype" not in json.loads(spec.to_json())
    assert ModelSpec.from_json(spec.to_json()) == spec
    q = resolve("qwen3next", Knobs(layers=4, dtype="q4_0"))
    assert ModelSpec.from_json(q.to_json()) == q and json.loads(q.to_json())["dtype"] == "q4_0"
    assert GGUFFile(_make(tmp_path, "qwen3next", layers=4, dtype="q4_0")).kv[SPEC_KEY] == q.to_json()


def test_slices_keep_the_quantized_bytes(tmp_path):
    src = _make(tmp_path, "jamba", layers=8, period=4, dtype="q4_1")
    st = slice_model(src, tmp_path / "s.gguf", 3, 7)
    source = dict(read_all(src)[2])
    stage = dict(read_all(tmp_path / "s.gguf")[2])
    for j, i in enumerate(st.layers):
        name = "blk.{}.ffn_down.weight" if j not in st.pads else None
        if name is None:
            continue
        a, b = stage[name.format(j)], source[name.format(i)]
        if isinstance(b, Raw):
            assert isinstance(a, Raw) and a.qtype == b.qtype and a.data.tobytes() == b.data.tobytes()
    assert any(isinstance(v, Raw) and v.qtype == gguf.GGMLQuantizationType.Q4_1 for v in stage.values())


@pytest.mark.parametrize("dtype", [d for d in DTYPES if d != "f32" and (d == "q4_k" or
                                                                         gguf.GGML_QUANT_SIZES[DTYPES[d]][0] < 256)])
def test_every_family_runs_in_every_dtype(tmp_path, llama, dtype):
    """Block-32 types (iq4_nl too) at the families' own widths; 256-wide types (q4_k for all, the rest below) at
    --embd 256."""
    bad = []
    for family in sorted(FAMILIES):
        path = tmp_path / f"{family}.gguf"
        write_fixture(resolve(family, Knobs(dtype=dtype, embd=256 if dtype == "q4_k" else None)), path)
        if not llama.load(str(path)).ok:
            bad.append((family, "load"))
            continue
        r = llama.decode([1, 2, 3], logits="all")
        if not r.ok or not np.isfinite(r.data["logits"]).all():
            bad.append((family, "decode"))
    assert not bad, bad


@pytest.mark.parametrize("family,dtype,knobs", [("qwen3next", "q4_0", {"layers": 8, "period": 4}),
                                                ("granitehybrid", "mxfp4", {"layers": 8, "period": 4}),
                                                ("deepseek2", "bf16", {"layers": 4}),
                                                ("qwen3moe", "q5_1", {"layers": 4})])
def test_every_cut_is_bit_exact_with_quantized_weights(tmp_path, family, dtype, knobs):
    rep = Sweep(_make(tmp_path, family, dtype=dtype, **knobs), SweepConfig(cuts="all", tokens=8)).run()
    assert rep.control["status"] == "pass"
    assert [r.status for r in rep.results] == ["pass"] * (rep.n_layer - 1), [r.to_dict() for r in rep.results]


def dequantizing(src, dst, a, b) -> StageInfo:
    """A broken materializer: the stage is right, but its quantized tensors are written back as F32."""
    st = slice_model(src, dst, a, b)
    g, kv, tensors = read_all(dst)
    write_gguf(dst, g.arch, kv, [(n, gguf.quants.dequantize(t.data, t.qtype) if isinstance(t, Raw) else t)
                                 for n, t in tensors])
    return st


def test_a_slicer_that_dequantizes_is_caught(tmp_path):
    rep = Sweep(_make(tmp_path, "llama", layers=4, dtype="q4_0"), SweepConfig(cuts="2", tokens=4),
                slicer=dequantizing).run()
    (r,) = rep.results
    assert r.status == "finding" and r.reproduced and r.stage == 0 and r.where == "boundary"
    assert r.layer == 0  # the first layer whose (now F32) weights differ


def test_dtype_lane_and_bad_dtypes(tmp_path):
    r = run_cli("family-certify", "run", "qwen3next", "--lane", "dtype")
    assert r.returncode == 0 and "dtype" in r.stdout and "PASS" in r.stdout, r.stdout + r.stderr
    assert "q4_0 4/4" in r.stdout
    bad = run_cli("synth", "make", "llama", "--dtype", "q4_k", "-o", str(tmp_path / "x.gguf"))
    assert bad.returncode == 2 and "--embd 256" in bad.stderr and not (tmp_path / "x.gguf").exists()
    bad = run_cli("synth", "make", "llama", "--dtype", "q7_k", "-o", str(tmp_path / "x.gguf"))
    assert bad.returncode == 2 and "q4_k" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    toml = tmp_path / "m.toml"
    from synth.manifest import default_manifest_path
    toml.write_text(default_manifest_path().read_text().replace('dtypes = ["f16"', 'dtypes = ["f8"', 1))
    bad = run_cli("family-certify", "check", str(toml))
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "dtypes" in bad.stderr


def test_the_dtype_lane_catches_a_stage_repacking_bug_only_its_q4_k_split_shows(tmp_path):
    """mutant:stage-q4k-mins-dropped zeroes every Q4_K block's dmin in stage files only: llama's dtype lane fails on
    its q4_k split at every cut set and passes the seven other weight types (its parity lane, f32, passes)."""
    r = run_cli("family-certify", "run", "llama", "--lane", "dtype", "--lane", "parity",
                "--target", "mutant:stage-q4k-mins-dropped", "--report", str(tmp_path / "r.json"))
    assert r.returncode == 1, r.stdout + r.stderr
    lanes = {x["lane"]: x for x in json.loads((tmp_path / "r.json").read_text())["results"]}
    assert lanes["parity"]["status"] == "pass" and lanes["dtype"]["status"] == "finding", lanes
    detail = lanes["dtype"]["detail"]
    for dtype in ("f16", "bf16", "q8_0", "q4_0", "mxfp4", "q6_k", "iq2_xxs"):
        assert re.search(rf"\b{dtype}(@256)? (\d+)/\2\b", detail), (dtype, detail)
    assert re.search(r"q4_k@256: ", detail) and not re.search(r"q4_k@256 \d", detail), detail


def test_a_q4_k_finding_shrinks_to_two_layers_at_the_width_its_blocks_need(tmp_path):
    """The shrinker's candidates are made from the spec in its dtype: the mutant's finding on an 8-layer q4_k llama
    shrinks to 2 layers cut at 1 and vocab 8, but its width stays 256 — a Q4_K block's 256 values (narrower, the
    matmuls would be f32 and the bug gone)."""
    from fuzz.oracles.registry import get_oracle
    from fuzz.repro.bundle import bundle_findings

    path = _make(tmp_path, "llama", layers=8, dtype="q4_k", embd=256)
    oracle = get_oracle("sweep")
    cfg = oracle.config(cuts="4", target="mutant:stage-q4k-mins-dropped")
    rep = oracle.run(path, cfg)
    assert [r["status"] for r in rep.results] == ["finding"], rep.results
    (bundle,) = bundle_findings(rep, oracle.case_config(cfg), tmp_path / "bundles", max_bundles=1)
    data = json.loads((bundle / "bundle.json").read_text())
    spec = data["spec"]
    assert (spec["pattern"], data["cuts"], spec["n_embd"], spec["n_vocab"], spec["dtype"]) == \
        ("AA", [1], 256, 8, "q4_k"), data
    assert "Q4_K" in types_of(bundle / "fixture.gguf").values()


def _make(tmp_path, family, **knobs):
    name = family + "-" + "-".join(f"{k}{v}" for k, v in sorted(knobs.items()))
    path = tmp_path / f"{name}.gguf"
    write_fixture(resolve(family, Knobs(**knobs)), path)
    return path


@pytest.mark.parametrize("dtype", ["q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "iq1_s", "iq1_m", "iq2_xxs", "iq2_xs",
                                   "iq2_s", "iq3_xxs", "iq3_s", "iq4_xs"])
def test_made_blocks_are_seeded_centered_and_split_exactly(tmp_path, dtype):
    """K-quant and i-quant blocks are made directly (gguf-py cannot quantize to them): same seed → same bytes;
    dequantized weights are centered with a fixture-like spread (the models emit varied tokens); every cut is
    bit-exact."""
    from synth.dtype import DTYPES as TYPES
    from synth.dtype import made_blocks

    a = made_blocks("blk.0.attn_q.weight", (256, 256), TYPES[dtype], 0)
    assert a.tobytes() == made_blocks("blk.0.attn_q.weight", (256, 256), TYPES[dtype], 0).tobytes()
    assert a.tobytes() != made_blocks("blk.0.attn_q.weight", (256, 256), TYPES[dtype], 1).tobytes()
    w = gguf.quants.dequantize(a, TYPES[dtype])
    assert abs(float(w.mean())) < 0.01 and 0.03 < float(w.std()) < 0.12
    path = _make(tmp_path, "llama", layers=3, embd=256, ff=256, dtype=dtype)
    assert types_of(path)["blk.0.attn_q.weight"] == dtype.upper()
    rep = Sweep(path, SweepConfig(cuts="all", tokens=8)).run()
    assert rep.control["status"] == "pass" and [r.status for r in rep.results] == ["pass", "pass"]
    with open_target() as t:
        assert t.load(str(path)).ok
        assert len(set(t.generate([1, 2, 3, 4, 5], 16).data["tokens"])) >= 3  # not one token over and over
