"""What a state hand-off is, without a target: its config (modes, offsets, batch shapes), the schedule split at
the hand-off offset, the offsets where a prefill crosses a structural constant (ubatch, sliding window, a delta-net
chunk), what a stage's export holds, a cut set's result and its formatter, and the judgement on two exports of a
sliding-window cache (the same rows at the same positions, wherever the cells sit) with the bound on what cell order
may move."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fuzz.engine.parity import describe_node
from fuzz.engine.schedule import Step, sequential_steps
from synth.inspect import inspect_file
from targets.kvstate import kv_cells

MODES = ("full", "partial", "busy")


@dataclass
class HandoffConfig:
    cuts: str = "period"
    stages: int = 2
    tokens: int = 4  # decode steps after the prompt
    prompt_len: int = 12
    prompt: tuple[int, ...] = ()  # the prompt's token ids (default: prompt_len tokens drawn from seed)
    chunk: int = 5
    n_ubatch: int = 64  # ubatch rows (n_batch 64): below the chunk, each stage's batches split inside llama.cpp
    offsets: tuple[int, ...] = ()  # hand off at these prompt offsets only (default: every one), e.g. 15,16,17
    decode_offsets: int = 2  # hand-offs after this many decode steps, too
    modes: tuple[str, ...] = MODES
    period: int | None = None
    target: str = "llama-cpp"
    timeout: float = 120.0
    seed: int = 0
    workdir: Path | None = None


CELL_META = 12  # bytes a KV cell's metadata takes in a state export: pos, n_seq_id, one seq_id (int32 each)
ORDER_FACTOR = 4.0  # a cell-order difference is numerics up to this × what the same cells in another order move


@dataclass
class StageBytes:
    """What a stage's exported state holds, as measured by the target."""

    range: list[int]
    first_layer: str
    recurrent_layers: int
    attention_layers: int  # full (non-SWA) attention layers: their KV is the non-partial state
    swa_layers: int = 0  # sliding-window layers: their KV travels with the partial state, like recurrent state
    recurrent_bytes: int = 0  # partial-state payload at the last offset (recurrent and SWA)
    kv_bytes_per_token: float | None = None
    kv_row_bytes: int = 0  # Σ K+V (+ DSA indexer k_idx) cache row bytes of its full attention layers (synth inspect)
    pads: list[int] = field(default_factory=list)


@dataclass
class HandoffResult:
    cuts: list[int]
    stages: list[list[int]]
    status: str  # pass | diverged | unsupported | crash | timeout
    mode: str | None = None
    offset: int | None = None
    stage: int | None = None
    where: str | None = None
    position: int | None = None
    max_abs: float = 0.0
    reproduced: bool | None = None
    reason: str | None = None
    node: dict[str, Any] | None = None  # in the stage that differs, straight vs handed off: the first differing node
    cause: dict[str, Any] | None = None  # why a difference is numerics (status numerics)
    offsets: int = 0
    bytes: list[StageBytes] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in self.__dict__.items() if v is not None and k != "bytes"}
        if self.mode is not None:
            d["phase"] = self.mode  # (a finding's phase: the hand-off mode, or bytes)
        d["bytes"] = [b.__dict__ for b in self.bytes]
        return d


def split_schedule(prompt: list[int], t: int, chunk: int, n_decode: int, seq: int = 0) -> tuple[list[Step], int]:
    """Prefill chunks over [0, t) then [t, P), then greedy decode steps; and the step index where t begins.
    An offset t >= P hands off after t - P decode steps."""
    P = len(prompt)
    cut = min(t, P)
    steps = sequential_steps(prompt, chunk, n_decode, split_at=cut, seq=seq)
    k = sum(1 for s in steps if s.phase == "prefill" and s.pos[0] < cut)
    if t >= P:
        k += t - P
    return steps, k


def with_seq(steps: list[Step], seq: int) -> list[Step]:
    return [Step(s.tokens, [seq] * len(s.seq), s.pos, s.phase) for s in steps]


# ---- the oracle contract ---------------------------------------------------------------------------------
DELTA_NET_CHUNK = {"gated-deltanet": 64, "kda": 16}  # build_delta_net_chunking's CS (models/delta-net-base.cpp)


def structural_offsets(path: Path, n_ubatch: int) -> list[int]:
    """Prompt offsets one either side of the constants a prefill crosses: the ubatch size, the sliding window and
    a chunked delta-net's chunk size (a hand-off there splits a chunk, a window or a ubatch at its edge)."""
    from synth.gguf_io import GGUFFile

    info = inspect_file(str(path))
    consts = {n_ubatch} | {DELTA_NET_CHUNK[x.mixer] for x in info.layers if x.mixer in DELTA_NET_CHUNK}
    window = GGUFFile(path).kv.get(f"{info.arch}.attention.sliding_window")
    if isinstance(window, int) and window > 0 and any(x.swa for x in info.layers):
        consts.add(window)
    return sorted({c + d for c in consts for d in (-1, 0, 1) if c + d > 0})


def same_cells(straight: bytes, restored: bytes, positions: set[int] | None = None) -> dict[str, Any] | None:
    """Do two exports of a sliding-window model's caches (the base and the window) hold the same rows at the same
    positions, wherever the cells sit — and does each hold what it must: the base cache (full attention) every
    position the sequence has (`positions`), in both exports? A base cache that lost positions is lost state even
    when both exports lost them alike (the export itself is what is under test). None if the blobs are not that
    layout."""
    a, b = kv_cells(straight, 2), kv_cells(restored, 2)
    if a is None or b is None:
        return None
    rows_a, rows_b = [x[1] for x in a], [x[1] for x in b]
    missing = sorted(set(positions or ()) - (a[0][0] & b[0][0]))  # the base cache: every position, in both
    lost = sorted(set().union(*(set(x) - set(y) for x, y in zip(rows_a, rows_b, strict=True)),
                              *(x[0] - y[0] for x, y in zip(a, b, strict=True)), missing))
    changed = sorted({p for x, y in zip(rows_a, rows_b, strict=True) for p in set(x) & set(y) if x[p] != y[p]})
    same = not lost and not changed and all(x[0] == y[0] and set(x[1]) == set(y[1]) for x, y in zip(a, b, strict=True))
    n = sum(len(x) for x in rows_a)
    if same:
        detail = (f"the restored caches hold the same K/V bits at the same {n} positions as the uninterrupted run "
                  f"(the base cache all {len(a[0][0])} of the sequence's, the window its own), in other cells")
    elif missing:
        detail = (f"the full-attention cache does not hold positions {missing[:8]}"
                  + (f" (and {len(missing) - 8} more)" if len(missing) > 8 else "") + " of the sequence's "
                  f"{len(positions or ())}: state the continuation needs is gone")
    else:
        detail = f"the restored caches lose positions {lost[:8]} or change the rows at {changed[:8]}"
    return {"same": same, "positions": n, "lost": lost[:32], "changed": changed[:32], "missing": missing[:32],
            "detail": detail}


def order_verdict(cells: dict[str, Any] | None, moved: float, control: float | None) -> dict[str, Any] | None:
    """The cell-order excuse, bounded: a hand-off whose caches hold exactly the uninterrupted run's rows (every
    cache, every position it must) moves the continuation only by the order attention sums the cells in — as far as
    that order can move it: at most ORDER_FACTOR × what the same cells in another order move the uninterrupted run
    (`control`, measured on the same stages). The cause (numerics), or None: the difference stays a finding."""
    if not cells or not cells["same"] or not control or moved > ORDER_FACTOR * control:
        return None
    return {"kind": "cell order", "detail": f"{cells['detail']}: attention sums the window's cells in cell order, "
            f"and the same cells in another order move the uninterrupted run by {control:.2g} — this hand-off moves "
            f"it by {moved:.2g}, within {ORDER_FACTOR:g}×", "control": control, "bound": ORDER_FACTOR * control,
            "max_abs": moved}


def format_report(rep: dict[str, Any]) -> str:
    lines = [f"handoff {rep['fixture']}: arch {rep['arch']}, {rep['n_layer']} layers {rep['kinds']}, target "
             f"{rep['target']}, modes {','.join(rep['config']['modes'])}",
             f"{'cuts':<10} {'status':<11} {'offsets':>7}  stage bytes (range first-layer: recurrent B, KV B/token "
             f"≥ rows)"]
    for r in rep["results"]:
        by = "; ".join(f"{b['range'][0]}:{b['range'][1]} {b['first_layer'][:4]}: rec {b['recurrent_bytes']}, "
                       f"kv {b['kv_bytes_per_token'] if b['kv_bytes_per_token'] is not None else '-'}"
                       f"≥{b['kv_row_bytes']}" for b in r["bytes"])
        lines.append(f"{','.join(map(str, r['cuts'])):<10} {r['status']:<11} {r.get('offsets', 0):>7}  {by}")
        if r.get("reason"):
            lines.append(f"{'':<10} {r['reason']}" + (f" (reproduced={r['reproduced']})" if "reproduced" in r else ""))
        if describe_node(r.get("node")):
            lines.append(f"{'':<10} first differing graph node of that stage: {describe_node(r['node'])}")
    s = rep["summary"]
    lines.append(f"{len(rep['results'])} cut sets: " + ", ".join(f"{v} {k}" for k, v in s.items() if v)
                 + f"; wall {rep['timing']['wall_s']:.2f}s")
    return "\n".join(lines)
