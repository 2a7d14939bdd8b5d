"""Stage contracts, each proven against the real llama.cpp: a cut either computes the same function bit for bit
(after the slicer honours the contract) or is reported `unsupported` with the reason — never a silent pass."""

import pytest

from fuzz.oracles.sweep import Sweep
from fuzz.oracles.sweep_report import SweepConfig
from synth.stage import slice_model

pytestmark = pytest.mark.llama


def sweep(path, **cfg):
    return Sweep(path, SweepConfig(tokens=4, **cfg)).run()


def statuses(rep):
    return {tuple(r.cuts): r.status for r in rep.results}


def test_embedding_scale_is_neutralized_in_later_stages(fixtures, tmp_path):
    """granite/minicpm apply embedding_scale to embedding input too: later stages get it set to 0 (off)."""
    for fam in ("granite", "minicpm"):
        rep = sweep(fixtures(fam))
        assert set(statuses(rep).values()) == {"pass"}, rep.to_dict()
    from synth.gguf_io import GGUFFile
    slice_model(fixtures("granite"), tmp_path / "s.gguf", 2, 4)
    assert GGUFFile(tmp_path / "s.gguf").get("embedding_scale") == 0.0


def test_token_only_input_scale_is_applied_to_the_control(fixtures):
    rep = sweep(fixtures("gemma3", layers=6))
    assert rep.control["status"] == "pass"
    assert set(statuses(rep).values()) == {"pass"}


def test_hard_coded_input_scale_is_unsupported_after_the_first_stage(fixtures):
    rep = sweep(fixtures("gemma2"))
    assert set(statuses(rep).values()) == {"unsupported"}
    assert all("sqrt(n_embd)" in r.reason for r in rep.results)
    assert rep.exit_code == 0


def test_index_phase_pads_keep_nope_layers(fixtures):
    """smollm3 hard-wires NoPE at (il + 1) % 4 == 0 inside the file: stages get phase pads in front."""
    rep = sweep(fixtures("smollm3", layers=8))
    assert set(statuses(rep).values()) == {"pass"}
    assert rep.results[0].pads == {"1:8": [0]}  # stage starting at 1: one pad
    assert rep.results[2].pads == {"3:8": [0, 1, 2]}
    assert rep.results[3].pads == {}  # stage starting at 4: in phase


def test_sliding_window_pattern_is_re_expressed_and_padded(fixtures):
    """cohere2 requires a window; a stage holding only its full layer gets a pass-through SWA pad."""
    rep = sweep(fixtures("cohere2", layers=8))
    assert set(statuses(rep).values()) == {"pass"}, rep.to_dict()
    assert any(r.pads for r in rep.results)


def test_layer_zero_rope_trap_gets_a_full_layer_in_front(fixtures):
    rep = sweep(fixtures("laguna", layers=9), stages=3)
    assert len(rep.results) == 28 and set(statuses(rep).values()) == {"pass"}


def test_unsupported_contracts_name_their_reason(fixtures):
    cases = {"rwkv7": "token_embd_norm", "glm4": "glm4.cpp", "minicpm3": "residual scale",
             "gemma3n": "per-layer inputs"}
    for fam, words in cases.items():
        rep = sweep(fixtures(fam))
        assert set(statuses(rep).values()) == {"unsupported"}, fam
        assert all(words in r.reason for r in rep.results), (fam, rep.results[0].reason)


def test_glm_dsa_stage_starting_on_a_shared_indexer_layer_is_unsupported(fixtures):
    rep = sweep(fixtures("glm-dsa", layers=5))  # full layers 0, 1, 2; shared 3, 4
    st = statuses(rep)
    assert st[(1,)] == st[(2,)] == "pass"
    assert st[(3,)] == st[(4,)] == "unsupported"
    assert "shared indexer layer" in rep.results[2].reason


def test_a_shared_stage_computes_what_the_whole_stage_computes(fixtures, tmp_path):
    """A sweep's stages (shared: a two-file split, the model's globals in the shared second file, the tokenizer
    llama.cpp's `none` one with {arch}.vocab_size placeholder tokens): the pinned llama.cpp loads the split, reports
    the same n_vocab and, fed token ids, gives the same logits bit for bit as from the whole stage (`synth stage`)."""
    import numpy as np

    from fuzz.engine.parity import context_params
    from synth.gguf_io import GGUFFile
    from synth.stage import SourceModel, stage_path
    from targets import open_target

    fixture = fixtures("llama", layers=4, vocab=96)
    src = SourceModel(fixture)
    whole, shared = tmp_path / "whole.gguf", stage_path(tmp_path, fixture, 0, 2, shared=True)
    src.slice(whole, 0, 2)
    src.slice(shared, 0, 2, shared=True)
    g = GGUFFile(shared)
    assert (g.get("tokenizer.ggml.model"), g.get("vocab_size")) == ("none", 96)
    assert not any(k.startswith("tokenizer.") and k != "tokenizer.ggml.model" for k in g.kv)
    assert "token_embd.weight" not in g.tensors
    kept = GGUFFile(whole)
    assert kept.get("tokenizer.ggml.model") == "gpt2" and len(kept.get("tokenizer.ggml.tokens")) == 96
    t = open_target("llama-cpp")
    try:
        out = []
        for path in (whole, shared):
            loaded = t.load(str(path), **context_params())
            assert loaded.ok and loaded.data["n_vocab"] == 96, loaded
            r = t.decode(tokens=[5, 90, 17, 3], logits="all")
            assert r.ok, r.failure
            out.append(r.data["logits"])
        assert out[0].shape == (4, 96) and np.array_equal(out[0], out[1])
    finally:
        t.close()
