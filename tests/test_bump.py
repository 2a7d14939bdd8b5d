"""`family-certify bump` against real builds (slow: each candidate is a CMake build of a llama.cpp tree, ~4 minutes
on 2 cores the first time, seconds for another patch series on the same tree; `make test-slow`, the nightly).

- A real bump: the pinned build vs the tree llama-cpp-python 0.3.35 vendors, with that version's own bindings, on a
  hybrid and an MLA row: nothing breaks; jamba's and deepseek3's logits are bit-identical across the two commits,
  qwen3next's move (its gated delta-net changed) with every greedy choice equal; sequence state crosses both
  ways although the state format version went 2 → 3, and so do chains with their stages on different builds.
- Patch series as mutants of the real binary (corpora/patches): each is caught by the row and lane it breaks, named
  in the verdict and bundled; the comment-only patch is unchanged everywhere."""

import json

import pytest

from fuzz.certify import bump as bp

from conftest import ROOT, run_cli

pytestmark = [pytest.mark.slow, pytest.mark.llama, pytest.mark.server]
PATCHES = ROOT / "corpora" / "patches"
# patch series → the row and lane that must break (and nothing else on that row)
CAUGHT = {# a mixed-build chain feeds the candidate's stage 1 embeddings: it moves where the builds' unsplit runs agree
          "embd-input-scaled": ("gemma3", {"fixed-split", bp.CROSS_LANE}),
          # llama-server's slot cache restores the same state, and so does the other build; the memory lane's state
          # moves (a sequence into another id, into a fresh context) read it too
          "recurrent-state-layer-mixup": ("jamba", {"handoff", "memory", "prefix-cache", bp.CROSS_LANE}),
          # llama-server restoring a slot saved without the indexer rows aborts (nread <= state_size)
          "dsa-export-drops-indexer": ("deepseek3", {"handoff", "memory", "prefix-cache"}),
          # the full-attention cache exported with the model's window: the hand-off lane (the base cache lost
          # positions: before #32 it passed as cell-order numerics), the memory lane's state moves, llama-server's
          # host-cache restores, the other build
          "swa-window-filters-base-export": ("laguna", {"handoff", "memory", "prefix-cache", bp.CROSS_LANE})}


def bump(tmp_path, *args: str):
    out = tmp_path / "bump"
    r = run_cli("family-certify", "bump", *args, "--out", str(out), timeout=3600)
    rep = json.loads((out / "report.json").read_text())
    return r, rep, {(x["row"], x["lane"]): x for x in rep["results"]}, out


def test_a_real_bump_to_the_previous_release(tmp_path):
    """Back to 0.3.35: every lane unchanged but the memory lane, which meets two bugs 0.3.36 no longer has — a
    recurrent memory accepting seq_rm of every sequence and leaving its tails dangling (the next decode asserts
    `cell.has_seq_id(seq_id)`), and a K shift of the DSA cache after seq_div asserting `buffer`."""
    r, rep, cell, out = bump(tmp_path, "jamba", "deepseek3", "qwen3next", "--candidate", "pypi:0.3.35")
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-2000:]
    assert rep["candidate"]["llama_cpp_python"] == "0.3.35" and rep["base"]["llama_cpp_python"] == "0.3.36"
    assert set(rep["totals"]) == {"unchanged", "broke"}
    broke = {(x["row"], x["lane"]): x for x in rep["results"] if x["verdict"] == bp.BROKE}
    assert set(broke) == {("jamba", "memory"), ("deepseek3", "memory"), ("qwen3next", "memory")}
    assert all(x["base"] == "known" and x["candidate"] == "crash" for x in broke.values())
    assert "GGML_ASSERT(cell.has_seq_id(seq_id))" in broke[("jamba", "memory")]["detail"]
    assert "GGML_ASSERT(buffer)" in broke[("deepseek3", "memory")]["detail"]
    for row in ("jamba", "deepseek3"):
        assert cell[(row, bp.CROSS_LANE)]["bit_exact"] is True
    q = cell[("qwen3next", bp.CROSS_LANE)]
    assert not q["bit_exact"] and 0 < q["max_abs_dlogit"] < 1e-2 and q["nmse"] < 1e-8
    for x in (cell[(row, bp.CROSS_LANE)] for row in ("jamba", "deepseek3", "qwen3next")):
        assert {s["status"] for s in x["states"].values()} <= {"crosses", "crosses (numerics)"}, x["states"]
        # a rolling upgrade: stage 0 on one build, stage 1 on the other, both ways
        chains = x["mixed_chains"]["chains"]
        assert set(chains) == {"base → candidate", "candidate → base"}, chains
        assert {c["status"] for c in chains.values()} <= {"crosses", "crosses (numerics)"}, chains
    assert {c["status"] for c in cell[("jamba", bp.CROSS_LANE)]["mixed_chains"]["chains"].values()} == {"crosses"}
    assert "**jamba / memory** — broke" in (out / "summary.md").read_text()


@pytest.mark.parametrize("series", sorted(CAUGHT))
def test_each_patch_is_caught_named_and_bundled(tmp_path, series):
    row, lanes = CAUGHT[series]
    r, rep, cell, out = bump(tmp_path, row, "--candidate", "pinned", "--patches", str(PATCHES / series))
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-2000:]
    broke = {lane for (rw, lane), x in cell.items() if x["verdict"] == bp.BROKE}
    assert broke == lanes, {k: (x["verdict"], x["detail"][:200]) for k, x in cell.items()}
    for lane in lanes - {bp.CROSS_LANE}:
        x = cell[(row, lane)]
        # (the memory lane is `known` on the base: upstream's own memory bugs, matched by cause)
        assert x["base"] in ("pass", "known") and x["candidate"] in ("finding", "crash") and x["bundles"], x
        assert all((out / "candidate" / b / "bundle.json").is_file() for b in x["bundles"])
    assert f"**{row} / {sorted(lanes)[0]}** — broke" in (out / "summary.md").read_text()
    # a bundle made on the patched build replays on it (the bundle records the build), and says so
    lane = sorted(lanes - {bp.CROSS_LANE})[0]
    r = run_cli("fuzz", "replay", str(out / "candidate" / cell[(row, lane)]["bundles"][0]), timeout=1200)
    patch = sorted(x.name for x in (PATCHES / series).glob("*.patch"))[0]
    assert r.returncode == 1 and "REPRODUCED" in r.stdout and f"patches {patch}" in r.stdout, r.stdout + r.stderr


def test_a_comment_only_patch_changes_nothing(tmp_path):
    r, rep, cell, _ = bump(tmp_path, "jamba", "--candidate", "pinned", "--patches", str(PATCHES / "noop"))
    assert r.returncode == 0 and set(rep["totals"]) == {"unchanged"}, rep["totals"]
    assert cell[("jamba", bp.CROSS_LANE)]["bit_exact"] is True
    assert rep["candidate"]["patches"]["files"] == ["0001-comment-only.patch"]


# two series that change different files: each lane breaks under its own series only
OWN_LANE = {"recurrent-state-layer-mixup": ("jamba", "handoff"), "embd-input-scaled": ("gemma3", "fixed-split")}


@pytest.mark.parametrize("first,then", [tuple(OWN_LANE), tuple(reversed(OWN_LANE))])
def test_a_series_built_after_another_carries_none_of_its_changes(tmp_path, first, then):
    """Every build of the pinned tree shares one work tree (incremental: a few objects per series). Built right
    after `first`, `then` leaves first's file as the pristine tree has it (the sdist's old time): its build must
    behave as a clean build of `then` alone — its own row's lane broken, first's row's lane passing."""
    import shutil

    from targets import builds
    from targets.native import cache_dir

    # each series' cache entry removed (resolved once for its key: built if it was not cached), so that the runs
    # below build both again, in this order, on the one work tree
    for series in (first, then):
        key = builds.resolve("pinned", PATCHES / series, from_env=False).identity["key"]
        shutil.rmtree(cache_dir() / "builds" / key)
    for series in (first, then):
        out = tmp_path / series
        r = run_cli("family-certify", "run", "jamba", "gemma3", "--lane", "handoff", "--lane", "fixed-split",
                    "--patches", str(PATCHES / series), "--out", str(out), timeout=3600)
        rep = json.loads((out / "report.json").read_text())
        broke = {(x["row"], x["lane"]) for x in rep["results"] if x["status"] != "pass"}
        assert broke == {OWN_LANE[series]}, (series, r.stdout[-2000:], r.stderr[-2000:])
        assert "incremental" in r.stderr, r.stderr[-2000:]  # (on the work tree the other series left)


def test_a_candidate_tree_with_an_unclassified_architecture_fails_the_bump_before_any_lane(tmp_path):
    """tests/data/patches/new-architecture adds `split-probe` to the candidate's LLM_ARCH_NAMES: the manifest has
    neither a row nor a [not_split_served] line for it, so the bump fails (exit 1) naming it, before any lane runs."""
    r = run_cli("family-certify", "bump", "llama", "--lane", "load", "--patches",
                str(ROOT / "tests" / "data" / "patches" / "new-architecture"), timeout=3600)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "unclassified architecture split-probe: llama.cpp knows it and family_tiers.toml neither has a row for " \
           "it nor lists it under [not_split_served]" in r.stdout and "== base" not in r.stdout, r.stdout
