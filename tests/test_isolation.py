"""`fuzz isolation`: a sequence's logits must not depend on the other sequences in its batch. Clean families pass
with batch-shape noise far below the tolerance; the two upstream findings reproduce; the manifest's `known`
entries turn a recorded failure into `known` and a vanished one into a failure."""

import json
import re
from dataclasses import replace

import numpy as np
import pytest

from fuzz.certify.battery import known
from fuzz.certify.lanes import LaneResult
from fuzz.engine.parity import first_rounding_flip
from fuzz.oracles.isolation import Isolation, IsolationConfig, format_report, is_numerics
from synth.errors import UserError
from synth.manifest import load_manifest

from conftest import ROOT, run_cli

pytestmark = pytest.mark.llama


@pytest.mark.parametrize("family,knobs", [("llama", {"layers": 4}), ("qwen3next", {"layers": 4, "period": 4}),
                                          ("mamba2", {"layers": 4}), ("deepseek2", {"layers": 4})])
def test_clean_families_keep_their_sequences_apart(fixtures, family, knobs):
    rep = Isolation(fixtures(family, **knobs), IsolationConfig()).run()
    assert rep["status"] == "pass", rep["findings"]
    assert {(r["kv_unified"], r["flash_attn"]) for r in rep["results"]} == {(True, False), (False, False),
                                                                           (True, True), (False, True)}
    assert len(rep["results"]) == 16
    assert max(r["max_abs_dlogit"] for r in rep["results"]) < 0.01  # batch-shape noise, far below the floor
    # the model's own batch-shape control moves as little, so the measured tolerance stays at its floor: 0.03 × its
    # logits' spread (2.5-3.5 on the fixtures: 0.1 there)
    assert set(rep["noise"]) == {"unified-kv", "per-seq-kv", "unified-kv-fa", "per-seq-kv-fa"}
    assert all(x["batch_shape"] < 0.01 and x["tolerance"] == 0.03 * x["spread"] and 2 < x["spread"] < 4
               for x in rep["noise"].values())


DSA_TIES = ROOT / "corpora" / "repros" / "deepseek32-isolation-unified-kv" / "fixture.gguf"  # a 2-head indexer


def test_dsa_top_k_ties_break_by_cell_position(fixtures):
    """The stored 2-head fixture: three keys tie at indexer score 0 for the 4th top-k slot of sequence 1's last
    prompt token; alone (cells 0-5) and after sequence 0 (cells 3-8) llama.cpp keeps a different one."""
    rep = Isolation(DSA_TIES, IsolationConfig(n_seq=2, prompt_len=3, tokens=1, flash_attn=(False,))).run()
    (f,) = rep["findings"]
    assert f["kv_unified"] is True and f["seq"] == 1 and f["step"] == 0 and f["max_abs_dlogit"] > 1
    assert f["reproduced"] is True
    # alone in its batches but in cells 3.. (where batching puts it), it gives the batched logits
    assert f["cause"]["kind"] == "cell position" and f["cause"]["cells_before"] == 3
    assert f["cause"]["placed_vs_batched"] < 1e-3 < 1 < f["cause"]["placed_vs_alone"]
    clean = [r for r in rep["results"] if not r["kv_unified"]]  # each stream starts at cell 0, as alone
    assert all(r["status"] == "pass" for r in clean)


def test_placement_through_a_moe_routing_flip_is_named(fixtures):
    """Found by the fuzz lane: a deepseek2 spec (MLA + MoE, seed 7) whose fourth sequence, in cells 27.. instead of
    0.., gets logits 0.17 off. Not a leak — alone but placed there it gives the batched logits — and traced node by
    node, the cells' summation order flips a near-tie expert choice in layer 3: numerics, reported, not a finding."""
    rep = Isolation(fixtures("deepseek2", layers=5, seed=7), IsolationConfig(prompt_len=6, tokens=1,
                                                                              kv_unified=(True,),
                                                                              flash_attn=(False,))).run()
    assert rep["status"] == "pass" and not rep["findings"]  # numerics, not a finding
    (f,) = rep["numerics"]
    assert f["seq"] == 3 and f["cause"]["kind"] == "cell position" and f["cause"]["cells_before"] == 27
    flip = f["cause"]["flip"]
    assert flip["kind"] == "routing" and flip["node"] == "ffn_moe_topk-3" and flip["alone"] != flip["placed"]
    # a near-tie the rounding crossed: the gap between the last expert chosen and the first not, at most twice the
    # measured score move
    assert flip["margin"] <= 2 * flip["scores_max_abs"] < 2e-2


def test_placement_through_a_16_bit_rounding_flip_is_named(fixtures):
    """Found by the fuzz lane on the portable build (AVX2 kernels; a clean-upstream finding in 3 of 1,620 such lfm2
    bf16 specs until then): a sequence placed in cells 45.. instead of 0.. gets logits 0.127 off. Not a leak — alone
    but placed there it gives the batched logits — and traced node by node, at the prompt's step, layer 0's softmax
    probabilities (one ulp apart: the cells' summation order) round to different f16 values where they meet the f16
    V cache: a near-tie, numerics, reported, not a finding. The logits that differ are two steps later: the
    rounded row reaches them through the cache."""
    path = fixtures("lfm2", pattern="AAAARRRR", kv_heads=(2, 1, 1, 1, 0, 0, 0, 0), dtype="bf16", seed=7422)
    rep = Isolation(path, IsolationConfig(tokens=3, kv_unified=(True,), flash_attn=(False,))).run()
    assert rep["status"] == "pass" and not rep["findings"]
    (f,) = rep["numerics"]
    assert (f["seq"], f["step"], f["cause"]["kind"], f["cause"]["cells_before"]) == (3, 1, "cell position", 45)
    flip = f["cause"]["flip"]
    assert (flip["kind"], flip["node"], flip["input"], flip["to"], flip["step"]) == \
        ("rounding", "kqv-0", "kq_soft_max-0", "f16", 0)
    a, b = np.float32(flip["alone"]), np.float32(flip["placed"])
    assert a != b and abs(a - b) <= 2 * np.spacing(a) and np.float16(a) != np.float16(b)
    assert "first value rounded otherwise (step 0): kqv-0 (MUL_MAT)" in format_report(rep)


def test_a_rounding_flip_is_an_ulp_that_rounds_to_another_16_bit_number():
    """parity.first_rounding_flip on two hand-made graphs: an f16 operand's product whose f32 input differs by
    two ulps across the f16 rounding midpoint of 1 + 2^-11 (a flip, found though the rows hold the values in other
    places: cells), the same two ulps away from a midpoint (no flip), and inputs further apart than rounding (not a
    near-tie: not named)."""
    mid = np.float32(1 + 2 ** -11)
    up, down = np.nextafter(mid, np.float32(2)), np.nextafter(mid, np.float32(0))

    def graph(values, out: bytes) -> list[dict]:
        def node(name, op, typ, data, srcs=()):
            return {"name": name, "op": op, "type": typ, "ne": [len(values), 1, 1, 1], "srcs": list(srcs),
                    "data": data}
        return [node("cache_v (view)", "VIEW", 1, b"\0" * 8),
                node("p", "SOFT_MAX", 0, np.array(values, "<f4").tobytes()),
                node("kqv", "MUL_MAT", 0, out, ["cache_v (view)", "p"])]

    flip = first_rounding_flip(graph([0.5, up], b"a"), graph([down, 0.5], b"b"))
    assert flip == {"kind": "rounding", "node": "kqv", "ggml_op": "MUL_MAT", "input": "p", "to": "f16", "row": 0,
                    "a": float(up), "b": float(down)}
    off = np.float32(1 + 2 ** -12)  # a quarter step: both ulps round to 1.0
    assert first_rounding_flip(graph([off, 0.5], b"a"), graph([np.nextafter(off, np.float32(2)), 0.5], b"b")) is None
    assert first_rounding_flip(graph([0.5, up], b"a"), graph([0.5, np.float32(1.001)], b"b")) is None


def test_batch_shape_numerics_are_told_from_a_leak(fixtures):
    """Found by the fuzz lane (the seeds re-found by a search over the same specs on the portable build, AVX2 kernels:
    AVX-512 ones moved others): an lfm2 spec in bf16 whose fourth sequence moves 0.125 in a 4-sequence decode batch.
    Alone in the same cells it is bit-identical to its solo run, and with other neighbours (other tokens, same
    lengths) it gets the very same bits as before: the batch's shape changes its numerics, no data leaks in —
    reported as numerics, not a finding."""
    path = fixtures("lfm2", pattern="AAAARRRR", kv_heads=(2, 1, 1, 1, 0, 0, 0, 0), dtype="bf16", seed=8113)
    rep = Isolation(path, IsolationConfig(tokens=3, kv_unified=(True,), noise_factor=0, flash_attn=(False,))).run()
    assert rep["status"] == "pass" and not rep["findings"]
    (f,) = rep["numerics"]
    assert f["seq"] == 3 and f["cause"]["kind"] == "batch shape" and f["cause"]["placed_vs_alone"] == 0.0
    assert [r["status"] for r in rep["results"]].count("numerics") == 1
    # the same with per-sequence caches (laguna, q5_1, MoE: found the same way), at the fixed tolerance 0.1
    path = fixtures("laguna", layers=8, kv_heads=(1, 4, 1, 1, 4, 2, 2, 1), dtype="q5_1", seed=6037)
    (f,) = Isolation(path, IsolationConfig(tokens=3, kv_unified=(False,), noise_factor=0,
                                                flash_attn=(False,))).run()["numerics"]
    assert f["seq"] == 2 and f["cause"]["kind"] == "batch shape" and "own cache stream" in f["cause"]["detail"]
    # its own batch-shape control (alone, other chunks) moves exactly as much: 4 × that is its tolerance, and it passes
    rep = Isolation(path, IsolationConfig(tokens=3, kv_unified=(False,), flash_attn=(False,))).run()
    noise = rep["noise"]["per-seq-kv"]
    assert noise["batch_shape"] == pytest.approx(f["max_abs_dlogit"], rel=1e-3) and noise["batch_shape"] > 0.1
    assert noise["tolerance"] == pytest.approx(4 * noise["batch_shape"])
    assert rep["status"] == "pass" and not rep["numerics"] and all(r["status"] == "pass" for r in rep["results"])


def test_the_tolerance_is_measured_on_the_model(fixtures):
    """A model whose batches move its logits far more than our fixtures' (the batch-shape-noise mutant: 0.3 for a
    batch of several tokens, 0.2 more for sharing a unified cache — as real quantized weights move them by up to ~2):
    its batch-shape control measures 0.3, so the tolerance is 1.2 and every sequence passes; at the fixed tolerance
    0.1 every sequence moves more, and the cause tells numerics from a leak by itself — with a unified cache neither
    the cells (0.2) nor the batch (0.3) alone explain the 0.5, and the same bits with other neighbours say both at
    once. The seq-leak mutant stays caught under the measured tolerance."""
    path = fixtures("llama", layers=4)
    rep = Isolation(path, IsolationConfig(target="mutant:batch-shape-noise", flash_attn=(False,))).run()
    assert set(rep["noise"]) == {"unified-kv", "per-seq-kv"}
    for v in rep["noise"].values():  # 0.3 and the fixture's own noise (below 1e-3)
        assert v["batch_shape"] == pytest.approx(0.3, abs=1e-3) and v["tolerance"] == 4 * v["batch_shape"]
    assert rep["status"] == "pass" and [r["status"] for r in rep["results"]] == ["pass"] * 8
    fixed = Isolation(path, IsolationConfig(target="mutant:batch-shape-noise", noise_factor=0,
                                           flash_attn=(False,))).run()
    assert fixed["status"] == "pass" and not fixed["findings"] and len(fixed["numerics"]) == 8
    kinds = {(f["kv_unified"], f["cause"]["kind"]) for f in fixed["numerics"]}
    assert kinds == {(True, "cells and batch shape"), (False, "batch shape")}
    both = next(f["cause"] for f in fixed["numerics"] if f["kv_unified"])
    assert both["placed_vs_alone"] == pytest.approx(0.2, abs=1e-3)
    assert both["placed_vs_batched"] == pytest.approx(0.3, abs=1e-3)
    leak = Isolation(path, IsolationConfig(target="mutant:seq-leak", flash_attn=(False,))).run()
    noise = leak["noise"]["unified-kv"]
    assert noise["tolerance"] == 0.03 * noise["spread"]  # alone, the leak has nothing to leak
    assert leak["status"] == "finding" and all(f["cause"]["kind"] == "batch" for f in leak["findings"])


@pytest.mark.parametrize("family", ["deepseek32", "glm-dsa"])
def test_dsa_fixtures_keep_their_sequences_apart(fixtures, family):
    """With 12 indexer heads exact score ties are rare enough that the lane tests DSA itself: the top-k really is
    sparse here (4 of up to 21 keys), and no sequence depends on its batch."""
    rep = Isolation(fixtures(family, layers=4, indexer_top_k=4), IsolationConfig()).run()
    assert rep["status"] == "pass", rep["findings"]
    assert max(r["max_abs_dlogit"] for r in rep["results"] if not r["flash_attn"]) < 0.01
    # flash attention on: a batch's shape may move a near-tie top-k choice (glm-dsa's sequence 0 in a unified cache,
    # 1.17 at step 3): the cause analysis calls it numerics, with the same bits from other neighbours, not a leak —
    # more than a whole logit, so only with the near-tie named (layer 2's indexer scores move 4e-4 across a gap of
    # 1.9e-4 between its 4th and 5th key)
    assert all(r["status"] == "pass" or (r["flash_attn"] and r["status"] == "numerics") for r in rep["results"])
    assert all(is_numerics(f["cause"]) for f in rep["numerics"])
    for f in rep["numerics"]:
        if f["max_abs_dlogit"] >= 1.0:
            assert f["cause"]["flip"]["kind"] in ("top-k", "routing", "rounding"), f["cause"]


def test_a_context_that_cannot_hold_the_sequences_is_a_finding(fixtures):
    rep = Isolation(fixtures("kimi-linear", layers=8, period=4), IsolationConfig(kv_unified=(False,))).run()
    assert [f["flash_attn"] for f in rep["findings"]] == [False, True]  # flash attention or not
    for f in rep["findings"]:
        assert f["status"] == "crash" and f["reproduced"] and "ggml_can_repeat" in f["reason"]


def test_cli_exit_codes(fixtures):
    assert run_cli("fuzz", "isolation", str(fixtures("llama", layers=4)), "--tokens", "2").returncode == 0
    r = run_cli("fuzz", "isolation", str(DSA_TIES), "--n-seq", "2", "--prompt-len", "3", "--tokens", "1")
    assert r.returncode == 1 and "FINDING" in r.stdout
    bad = run_cli("fuzz", "isolation", str(fixtures("llama", layers=4)), "--n-seq", "1")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
    with pytest.raises(UserError):
        Isolation(fixtures("llama", layers=4), IsolationConfig(tokens=0))


def test_known_findings_are_reported_as_known_and_must_keep_reproducing():
    row = replace(load_manifest(ROOT / "family_tiers.toml").row("deepseek3"),
                  known={"isolation": "an upstream finding; corpora/repros/x",
                         "prefix-cache": "intermittent: the same, through llama-server; corpora/repros/x"})
    fail = LaneResult("deepseek3", "isolation", "finding", "3 findings")
    assert known(row, fail).status == "known" and "still reproduces" in known(row, fail).detail
    gone = known(row, LaneResult("deepseek3", "isolation", "pass", "clean"))
    assert gone.status == "finding" and "no longer reproduces" in gone.detail
    flaky = known(row, LaneResult("deepseek3", "prefix-cache", "pass", "clean"))
    assert flaky.status == "pass" and "intermittent" in flaky.detail
    assert known(row, LaneResult("deepseek3", "parity", "finding", "x")).status == "finding"  # not a known lane


def test_known_entries_name_a_lane_of_the_row(tmp_path):
    text = (ROOT / "family_tiers.toml").read_text()
    bad = re.sub(r'known = \{ isolation = "llama.cpp b11312: creating', 'known = { fixed-split = "llama.cpp b11312: '
                 'creating', text, count=1)
    assert bad != text
    (tmp_path / "m.toml").write_text(bad)
    r = run_cli("family-certify", "check", str(tmp_path / "m.toml"))
    assert r.returncode == 2 and "known.fixed-split" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_an_isolation_finding_is_bundled_shrunk_and_replays(fixtures, tmp_path):
    """fuzz isolation --bundle: reproduced twice, shrunk (schedule, then layers; the weights keep their dtype),
    replayed with one command; the real llama.cpp is clean on the same bundle (the bug is the mutant's)."""
    from synth.gguf_io import GGUFFile

    path = fixtures("llama", layers=3, dtype="q8_0")
    r = run_cli("fuzz", "isolation", str(path), "--tokens", "2", "--target", "mutant:seq-leak",
                "--bundle", str(tmp_path))
    assert r.returncode == 1 and "bundle:" in r.stdout
    assert "cause: batch:" in r.stdout  # alone in the same cells it is clean; other neighbours change it again
    # the leak shows with flash attention off and on: a bundle each, its layout in the name, each narrowed to it
    bundles = sorted(p.name for p in tmp_path.iterdir() if p.is_dir())
    assert [b.rsplit("-isolation-", 1)[1] for b in bundles] == ["unified-kv", "unified-kv-fa"], bundles
    assert json.loads((tmp_path / bundles[1] / "bundle.json").read_text())["config"]["flash_attn"] == [True]
    bundle = tmp_path / bundles[0]
    readme = (bundle / "README.md").read_text()
    assert "n_seq → 2" in readme and "dropped the" in readme and "Cause: batch:" in readme
    types = {t.type for t in GGUFFile(bundle / "fixture.gguf").tensors.values()}
    assert "Q8_0" in types
    assert run_cli("fuzz", "replay", str(bundle)).returncode == 1  # still reproduces
    assert run_cli("fuzz", "replay", str(bundle), "--target", "llama-cpp").returncode == 0


def test_a_model_that_aborts_only_with_flash_attention_on_is_a_crash_finding(fixtures, tmp_path):
    """PLM loads with flash attention off and aborts with it on (corpora/repros/plm-isolation-per-seq-kv-fa): both
    layouts with flash attention on are reproduced crash findings (exit 1), each layout with it off passes; not
    bad input (exit 2), which a model that loads in no configuration is."""
    out = tmp_path / "r.json"
    r = run_cli("fuzz", "isolation", str(fixtures("plm", layers=1)), "--n-seq", "2", "--tokens", "1",
                "--report", str(out))
    assert r.returncode == 1, r.stdout + r.stderr
    rep = json.loads(out.read_text())
    assert sorted(f["phase"] for f in rep["findings"]) == ["per-seq-kv-fa", "unified-kv-fa"]
    assert all(f["status"] == "crash" and f["reproduced"] and "it loads with it off" in f["message"]
               for f in rep["findings"])
    assert [r["status"] for r in rep["results"] if not r["flash_attn"]] == ["pass"] * 4


def test_a_batch_shape_excuse_is_bounded():
    """The same bits with other neighbours say no data leaks in; they do not say how far a batch's shape may move
    a sequence. Below a whole logit (0.3 × the logits' spread: 1.0 on the fixtures, `whole`), or within 4x the
    batch-shape control, it is numerics; a whole logit or more only with the near-tie choice that turned the rounding
    into it named; a cell-position difference only with one."""
    from fuzz.oracles.isolation import WHOLE_SPREAD, is_numerics

    shape = {"kind": "batch shape", "control": 0.01, "bound": 0.04, "whole": WHOLE_SPREAD * 3.3}
    assert is_numerics({**shape, "moved": 0.125})
    assert not is_numerics({**shape, "moved": 7.0})
    assert not is_numerics({**shape, "moved": 0.125, "whole": WHOLE_SPREAD * 0.2})  # (a model whose logits spread 0.2)
    assert is_numerics({**shape, "moved": 7.0, "whole": WHOLE_SPREAD * 100})  # (one whose logits spread 100)
    assert is_numerics({**shape, "moved": 7.0, "flip": {"kind": "top-k"}})
    assert is_numerics({"kind": "cells and batch shape", "control": 2.0, "bound": 8.0, "moved": 7.0})
    assert not is_numerics({"kind": "cell position"})
    assert is_numerics({"kind": "cell position", "flip": {"kind": "rounding"}})
    assert not is_numerics({"kind": "batch"}) and not is_numerics(None)


def test_a_crashed_batched_run_is_reported_not_a_crash_of_the_oracle():
    """A batched run that crashed has no logits to compare (max |Δlogit| None): its finding's line names the crash.
    (Found by `family-certify mutate`: under a mutant that made the batched decode crash, the line itself raised.)"""
    row = {"kv_unified": True, "flash_attn": False, "seq": 2, "status": "crash", "step": 0, "max_abs_dlogit": None,
           "reason": "llama-cpp crashed (SIGABRT) during 'decode'"}
    line = Isolation.message(object.__new__(Isolation), row)
    assert line.endswith("sequence 2 batched with the others: llama-cpp crashed (SIGABRT) during 'decode'"), line
