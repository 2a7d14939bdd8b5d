"""What a fresh context computes for one sequence's history: the recompute every memory check compares against (a
sequence's log replayed alone), and the rows a stage past the first is fed for drawn ids."""

from __future__ import annotations

import base64
import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fuzz.engine.contract import logits_spread
from targets import Reply, Target, as_bytes


@functools.lru_cache(maxsize=4096)
def row_of(token: int, width: int) -> bytes:
    """The residual-stream row a stage past the first receives for a drawn id: seeded by the id, so the machine and
    its recompute give a context the same rows."""
    return np.random.default_rng([token, width]).standard_normal(width).astype("<f4").tobytes()


@dataclass(frozen=True)
class Feed:
    """What a decode gives the context: token ids (a model, a first stage), or rows (a stage past the first)."""

    width: int = 0  # n_embd_inp of a stage fed rows; 0: token ids
    n_pos: int = 1  # positions per token (4 for M-RoPE archs fed rows)

    def args(self, tokens: list[int]) -> dict[str, Any]:
        if not self.width:
            return {"tokens": tokens}
        rows = b"".join(row_of(int(t), self.width) for t in tokens)
        return {"embd": base64.b64encode(rows).decode(), "n_pos_per_token": self.n_pos}


class Recompute:
    """A sequence's log replayed alone in a fresh context: the logits its last decode gives (cached by log)."""

    def __init__(self, t: Target, fixture: Path, params: dict[str, Any], feed: Feed = Feed(), tol: float = 0.1):
        self.t, self.fixture, self.params, self.feed = t, fixture, params, feed
        self.memo: dict[str, np.ndarray | str] = {}
        self.runs = 0
        self.tol = tol  # the run's tolerance (tolerance())
        self.faithful_shifts = False  # a shift must equal decoding at the new positions (memory.calibrated)
        self.rope_type: int | None = None  # the model's, as the target's load reports it (llama_model_rope_type)

    def with_params(self, **changed: Any) -> Recompute:
        """The same recompute (tolerance, what it measured of the model's shifts) in contexts loaded with some
        params changed; its own cache of logits."""
        other = Recompute(self.t, self.fixture, {**self.params, **changed}, self.feed, tol=self.tol)
        other.faithful_shifts, other.rope_type = self.faithful_shifts, self.rope_type
        return other

    def without(self, *names: str) -> Recompute:
        """The same recompute in contexts loaded without some params (the model's and llama.cpp's defaults)."""
        other = self.with_params()
        other.params = {k: v for k, v in self.params.items() if k not in names}
        return other

    def batch_shape_move(self, n_vocab: int) -> tuple[float, float]:
        """The model's own batch-shape numerics: one seeded sequence of 12 tokens, decoded as one batch and one token
        at a time, alone in fresh contexts: how far its last logits move (0 on every fixture's f32 weights; a real
        model's quantized matmuls move them more, and so does everything a batch holds), and the spread of those
        logits (logits_spread: what the least tolerance is relative to)."""
        toks = [int(x) for x in np.random.default_rng(12).integers(0, n_vocab, 12)]
        one = self.logits([["d", [[p, t] for p, t in enumerate(toks)]]])
        each = self.logits([["d", [[p, t]]] for p, t in enumerate(toks)])
        if isinstance(one, str) or isinstance(each, str):
            return 0.0, 0.0
        return float(np.max(np.abs(one.astype(np.float64) - each.astype(np.float64)))), logits_spread([one])

    def shift_move(self, n_vocab: int) -> float | None:
        """The model's own shift against a recompute: one seeded sequence of 12 tokens shifted whole by +5, then one
        more token, against the 12 decoded at the shifted positions in a fresh context: how far its logits move
        (2-6e-3 on the rotary fixtures; None where the memory cannot shift)."""
        toks = [int(x) for x in np.random.default_rng(13).integers(0, n_vocab, 13)]
        shifted = self.logits([["d", [[p, t] for p, t in enumerate(toks[:12])]], ["add", 0, -1, 5],
                               ["d", [[17, toks[12]]]]])
        direct = self.logits([["d", [[p + 5, t] for p, t in enumerate(toks[:12])]], ["d", [[17, toks[12]]]]])
        if isinstance(shifted, str) or isinstance(direct, str):
            return None
        return float(np.max(np.abs(shifted.astype(np.float64) - direct.astype(np.float64))))

    def requests(self, log: list[list[Any]], trace: bool = False, hold: bool = False,
                 capture: int = 0) -> list[tuple[str, dict[str, Any]]]:
        """The log as requests to a fresh context. trace: loaded for tracing, its last decode traced. hold: the cells
        each removal frees are taken at once by a filler sequence (one more sequence, one unified cache), so the
        sequence's later tokens never sit below its earlier ones: its cells in position order, as where other
        sequences still hold them (the cell-order control). capture: the last decode's first `capture` layers'
        outputs returned."""
        load = {"path": str(self.fixture), **self.params, **({"trace": True} if trace else {}),
                **({"n_seq_max": 2, "kv_unified": True} if hold else {}), **({"capture": True} if capture else {})}
        reqs: list[tuple[str, dict[str, Any]]] = [("load", load)]
        last = max((i for i, e in enumerate(log) if e[0] == "d"), default=-1)
        held: list[int] = []  # the sequence's positions, one per cell (hold: what a removal frees)
        filler = 0  # the filler sequence's next position
        for i, e in enumerate(log):
            if e[0] == "d":
                reqs.append(("decode", {**self.feed.args([t for _, t in e[1]]), "pos": [p for p, _ in e[1]],
                                        "seq": 0, "logits": "last", **({"trace": "all"} if trace and i == last
                                                                       else {}),
                                        **({"capture": list(range(capture))} if capture and i == last else {})}))
                held += [p for p, _ in e[1]]
                continue
            lo, hi = (e[1] if e[1] >= 0 else 0), (e[2] if e[2] >= 0 else np.inf)
            inside = [p for p in held if lo <= p < hi]
            outside = [p for p in held if not lo <= p < hi]
            if e[0] == "rm":
                reqs.append(("seq_rm", {"seq": 0, "p0": e[1], "p1": e[2]}))
                held = outside
                if hold and inside:
                    reqs.append(("decode", {**self.feed.args([0] * len(inside)), "seq": 1, "logits": "last",
                                            "pos": list(range(filler, filler + len(inside)))}))
                    filler += len(inside)
            elif e[0] == "add":
                reqs.append(("seq_add", {"seq": 0, "p0": e[1], "p1": e[2], "delta": e[3]}))
                held = outside + [p + e[3] for p in inside]
            else:
                reqs.append(("seq_div", {"seq": 0, "p0": e[1], "p1": e[2], "d": e[3]}))
                held = outside + [p // e[3] for p in inside]
        return reqs

    def replay(self, reqs: list[tuple[str, dict[str, Any]]]) -> Reply | str:
        """Requests (requests()) sent to a fresh context: the reply to the sequence's last decode, or why it failed."""
        replies = self.t.pipeline(reqs)
        if replies and replies[0].ok and replies[0].request.get("op") == "load" and "rope_type" in replies[0].data:
            self.rope_type = int(replies[0].data["rope_type"])
        bad = next((r for r in replies if not r.ok), None)
        if bad is not None or len(replies) < len(reqs):
            why = bad.failure.message if bad is not None and bad.failure else "no reply"
            return f"the recompute in a fresh context failed: {why}"
        return next(r for r in reversed(replies) if r.request.get("op") == "decode" and r.request.get("seq") == 0)

    def logits(self, log: list[list[Any]]) -> np.ndarray | str:
        key = json.dumps(log)
        if key not in self.memo:
            self.runs += 1
            last = self.replay(self.requests(log))
            self.memo[key] = last if isinstance(last, str) else np.frombuffer(as_bytes(last.data["logits"]), "<f4")
        return self.memo[key]

    def layers(self, log: list[list[Any]], n_layer: int, hold: bool = False) \
            -> tuple[np.ndarray, dict[int, np.ndarray]] | None:
        """The log's last logits and its last decode's layer outputs (captured), replayed in a fresh context — with
        the freed cells held (hold: requests) or not; None if the replay failed."""
        last = self.replay(self.requests(log, hold=hold, capture=n_layer))
        if isinstance(last, str):
            return None
        return (np.frombuffer(as_bytes(last.data["logits"]), "<f4"),
                {int(k): np.frombuffer(as_bytes(v), "<f4") for k, v in last.data["captures"].items()})

    def traced(self, log: list[list[Any]]) -> list[dict[str, Any]] | None:
        """Every graph node of the log's last decode, replayed alone in a fresh context loaded for tracing (the
        routing control); None if the replay failed."""
        last = self.replay(self.requests(log, trace=True))
        return None if isinstance(last, str) else last.data["nodes"]
