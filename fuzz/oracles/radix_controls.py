"""Why a reproduced radix divergence is numerics and not the prompt cache's: controls on the real server, run only
for a divergence that reproduced (Radix.explain). Each returns the cause in words, or None: then it is a finding.

A control explains a divergence by the same answers without the thing under test (the cache's reuse) and with only
the numerics it names changed: the model's batch shapes (batch_shape), or where one KV cache for all slots puts a
sequence's cells (top_k_layout)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from fuzz.oracles.conversations import shared_prefix
from fuzz.oracles.radix_schedules import Run, Schedule
from fuzz.oracles.server_answers import cold_answers

if TYPE_CHECKING:
    from targets import Target


class Engine(Protocol):
    """What a control uses of the radix engine (radix.Radix). Named here rather than imported: the engine imports
    the controls."""

    cfg: Any  # its RadixConfig
    fixture: Path
    srv: Target | None
    top_k: int
    experts: tuple[int, int] | None

    def reference(self, sched: Schedule) -> dict[str, Any]: ...

    def serve(self, t: Target, **params: Any) -> dict[str, Any]: ...

    def run_schedule(self, sched: Schedule, uncached: bool = False, kv_unified: bool | None = None) -> Run: ...


def explain(rx: Engine, run: Run) -> str | None:
    """Why a reproduced divergence is not the prompt cache's, or None (a finding): the model's own batch shapes
    (batch_shape), or one KV cache for all slots moving a top-k selection (top_k_layout)."""
    if any(f["kind"] != "diverged" for f in run.findings):
        return None
    return batch_shape(rx, run) or top_k_layout(rx, run)


def batch_shape(rx: Engine, run: Run) -> str | None:
    """A conversation's tokens reach the model in other batch shapes than its cold run's: what a slot reuses was
    processed as it came (a prompt in one ubatch, each generated token alone, a second turn's new tokens
    together), the cold run takes the whole prompt in one. With flash attention (llama-server's default on the
    CPU) a ubatch's keys are summed in tiles and a single token's in another order, so the two move apart by
    rounding, and a pick at a small margin can turn (seen on glm-4.7-flash: a third turn's fifth token, margin
    0.004, the server's token what the same tokens fed in its shapes give on the API). Control: each diverged
    prompt answered cold on a one-slot server with the cache off, one token per ubatch — no cache at all. A
    divergence is the model's batch-shape numerics when that answer parts from the batched cold answer at the
    same step, with the token the server gave."""
    ref = rx.reference(run.schedule)
    rx.serve(rx.srv, slots=1, cache_ram=0, n_ubatch=1)
    one = cold_answers(rx.srv, rx.fixture, {f["prompt"]: ref["prompts"][f["prompt"]] for f in run.findings},
                       ref["tokens"])
    turned = []
    for f in run.findings:
        want, alone, got = ref["answers"][f["prompt"]]["tokens"], one[f["prompt"]]["tokens"], f["tokens"]
        k = shared_prefix(want, got)  # the step where the server's answer left the cold one
        if k >= min(len(want), len(got)) or shared_prefix(alone, want) != k or k >= len(alone) or alone[k] != got[k]:
            return None
        turned.append(f"{f['prompt']}'s token {k}")
    return (f"the model's batch shapes, not the cache: answered cold one token per ubatch (no cache), "
            f"{', '.join(turned)} turns the same way (flash attention sums a ubatch's keys in another order)")


def top_k_layout(rx: Engine, run: Run) -> str | None:
    """On a model that picks a top-k by score — the keys each query keeps (DSA's indexer), the experts each token is
    routed to (MoE) — one KV cache for all slots moves those scores (where cells sit orders flash attention's sums;
    what a prompt was batched with: the measured placement move) and a score at the k-th place can swap a key or an
    expert, turning that move into another token — however clear the pick's margin (the memory oracle traces it on
    the API: a router near-tie). Such a divergence is explained when the same schedule gives every answer cold with
    one KV cache per slot: the same reuse, of the same cache code, each slot's cells where a cold run puts them. (A
    unified-only fault of the cache's shows on the rows without top-k selection, where the layout is judged to its
    measured move.) The same schedule with the prompt cache off says more: it moves too (placement and co-batching
    alone) or it answers cold."""
    if not (rx.cfg.kv_unified and (rx.top_k or rx.experts)):
        return None
    sched = Schedule.parse(run.schedule.replay)
    if any(f["kind"] == "diverged" for f in rx.run_schedule(sched, kv_unified=False).findings):
        return None
    uncached = rx.run_schedule(sched, uncached=True)
    moved = any(f["kind"] == "diverged" for f in uncached.findings)
    used, experts = rx.experts or (0, 0)
    what = f"the attention keeps each query's top-{rx.top_k} keys (DSA indexer)" if rx.top_k else \
        f"the router picks each token's top-{used} of {experts} experts (MoE)"
    return (f"{what}, and one KV cache for all slots moves their scores: the same schedule answers cold with one "
            "KV cache per slot (the same reuse); on the one KV cache with the prompt cache off it "
            + ("moves too" if moved else "answers cold"))
