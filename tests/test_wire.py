"""Wire dtypes (`fuzz sweep --wire`, the tier-1 `wire` lane): the hidden states crossing each boundary as a split
runtime sends them. The target's conversion must equal the reference (gguf-py's quantizers) bit for bit, every
stage after a boundary must be bit-exact with the same stage fed the reference conversion, and a wire that does
more than its dtype is caught and localized."""

import json

import numpy as np
import pytest

from fuzz.wire import Wire, WireConfig, reference
from synth.manifest import WIRES as MANIFEST_WIRES
from targets.wire import WIRES, roundtrip_rows

from conftest import run_cli


@pytest.mark.parametrize("wire", WIRES)
def test_the_workers_wire_is_the_reference_bit_for_bit(wire):
    rng = np.random.default_rng(7)
    for scale in (1e-3, 1.0, 40.0):
        rows = (rng.standard_normal((5, 64)) * scale).astype(np.float32)
        rows[0, :32] = 0.0  # an all-zero q8_0 block (d = 0)
        got = roundtrip_rows(rows, wire, np).astype(np.float32)
        assert np.array_equal(got.view(np.uint32), reference(rows, wire).view(np.uint32))
        if wire != "f32":
            assert not np.array_equal(got, rows)  # it does convert
    assert MANIFEST_WIRES == WIRES


@pytest.mark.llama
@pytest.mark.parametrize("wire", ["f16", "bf16", "q8_0"])
def test_clean_wires_pass_at_every_cut(fixtures, wire):
    rep = Wire(fixtures("jamba", layers=8, period=4), WireConfig(wire=wire, tokens=8)).run()
    assert [r["status"] for r in rep["results"]] == ["pass"] * 7, rep["results"]
    m = [r["vs_unsplit"] for r in rep["results"]]
    # not bit-exact with the unsplit model (the wire rounds), yet close: the measures say how close
    assert all(x["max_abs_dlogit"] > 0 and x["nmse"] < 1e-3 for x in m), m
    if wire == "f16":
        assert all(x["clear_token_flips"] == 0 for x in m)


@pytest.mark.llama
def test_a_wire_that_does_more_than_its_dtype_is_caught_and_localized(fixtures, tmp_path):
    path = fixtures("qwen3next", layers=8, period=4)
    out = tmp_path / "w.json"
    r = run_cli("fuzz", "sweep", str(path), "--wire", "f16", "--cuts", "3;1,5", "--stages", "3", "--tokens", "4",
                "--target", "mutant:wire-f16-truncated", "--report", str(out))
    assert r.returncode == 1, r.stdout + r.stderr
    rep = json.loads(out.read_text())
    assert rep["oracle"] == "wire" and [x["status"] for x in rep["results"]] == ["finding", "finding"]
    for x in rep["results"]:  # the first stage after the first boundary, at its first layer: its input
        assert (x["stage"], x["where"], x["layer"], x["reproduced"]) == (1, "boundary" if len(x["cuts"]) > 1
                                                                         else "logits", x["cuts"][0], True)
    # the same wire in bf16 and q8_0 is the worker's own (correct) conversion: clean
    ok = run_cli("fuzz", "sweep", str(path), "--wire", "q8_0", "--cuts", "3", "--tokens", "4",
                 "--target", "mutant:wire-f16-truncated")
    assert ok.returncode == 0, ok.stdout


@pytest.mark.llama
def test_bad_wire_options_are_one_line_errors(fixtures):
    for args in (["--wire", "f8"], ["--wire", "q8_0", "--cuts", "1"]):
        path = fixtures("llama", layers=4, embd=48, heads=4) if "q8_0" in args else fixtures("llama", layers=4)
        r = run_cli("fuzz", "sweep", str(path), *args)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, (args, r.stderr)
