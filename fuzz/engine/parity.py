"""The parity oracle's runs and comparisons: full model vs a chain of stages, bit for bit.

Every run goes through targets.Target (the protocol); nothing here knows how a target computes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fuzz.engine.schedule import Step
from targets import Failure, Reply, Target
from targets.target import script_request

MROPE_TYPES = (8, 40)  # LLAMA_ROPE_TYPE_MROPE / IMROPE
GGML_TYPE_F32 = 0
GGML_TYPE_I32 = 26


def context_params(*, n_seq: int = 1, n_ctx: int = 256, n_batch: int = 64, n_ubatch: int | None = None,
                   **extra: Any) -> dict[str, Any]:
    """The context every oracle loads a fixture or stage into (protocol `load`), defined once: 256 cells, batches
    of 64 rows in one ubatch unless a schedule says otherwise; `extra` for threads, flash attention, capture,
    tracing, the KV layout."""
    return {"n_ctx": n_ctx, "n_batch": n_batch, "n_ubatch": n_batch if n_ubatch is None else n_ubatch,
            "n_seq_max": n_seq, **extra}


def pos_per_token(info: dict[str, Any]) -> int:
    """Positions per token when feeding batch.embd: M-RoPE archs take 4 sections (notes §2.5), others 1."""
    return 4 if info.get("rope_type") in MROPE_TYPES else 1


@dataclass
class StepOut:
    tokens: list[int]
    logits: np.ndarray  # rows × n_vocab (every row of the step)
    captures: dict[int, np.ndarray] = field(default_factory=dict)  # layer → rows × n_embd


@dataclass
class Trace:
    steps: list[StepOut]
    decode_seconds: float


@dataclass
class RunFailure:
    failure: Failure
    stage: int | None  # None: the reference


def script_steps(steps: list[Step], *, tokens: list[list[int]] | None = None,
                 embd: list[np.ndarray] | None = None, capture: list[int] = (),
                 n_pos_per_token: int = 1, logits_mode: str = "all", wire: str | None = None) -> list[dict[str, Any]]:
    """Protocol steps for a schedule: its own tokens, resolved tokens, or embedding rows per step.
    logits_mode "all" (every row: no run prunes rows in its last layer), "last" (as a server decodes) or "none"
    (nothing sent back: a non-final stage, whose logits nobody compares); wire: embedding rows cross a wire."""
    out = []
    for k, st in enumerate(steps):
        d: dict[str, Any] = {"seq": st.seq, "pos": st.pos, "logits": logits_mode, "capture": list(capture),
                             "n_pos_per_token": n_pos_per_token}
        if embd is not None:
            d["embd"] = embd[k]
            if wire is not None:
                d["wire"] = wire  # the rows arrive through a split runtime's wire (protocol decode `wire`)
        else:
            d["tokens"] = tokens[k] if tokens is not None else st.tokens
        out.append(d)
    return out


def run_script(target: Target, steps: list[dict[str, Any]], *, reset: bool = False) -> Trace | Failure:
    return script_trace(target.script(steps, reset=reset))


def script_trace(r: Reply) -> Trace | Failure:
    """A script reply as a Trace (or its failure)."""
    if not r.ok:
        return r.failure
    return Trace([StepOut([int(t) for t in (res["tokens"] or [])], res["logits"], res["captures"])
                  for res in r.data["results"]], float(r.data.get("decode_seconds", 0.0)))


def run_chain(targets: list[Target], stage_layers: list[int], steps: list[Step], tokens: list[list[int]], *,
              capture_all: bool = False, n_pos_per_token: int = 1, logits_mode: str = "all",
              reset: bool = False) -> tuple[list[Trace], RunFailure | None]:
    """Run the stages in order over the whole schedule (teacher-forced with `tokens`); reset: each stage's memory
    cleared first, in the same round trip.

    Stage 0 takes tokens; stage s > 0 takes stage s-1's boundary rows (the residual after its last layer)
    through batch.embd, step by step. Non-final stages capture their last layer (or every layer)."""
    traces: list[Trace] = []
    inputs: list[np.ndarray] | None = None
    for s, (t, n) in enumerate(zip(targets, stage_layers, strict=True)):
        last = s == len(targets) - 1
        capture = list(range(n)) if capture_all else ([] if last else [n - 1])
        if s == 0:
            reqs = script_steps(steps, tokens=tokens, capture=capture, logits_mode=logits_mode)
        else:
            reqs = script_steps(steps, embd=inputs, capture=capture, n_pos_per_token=n_pos_per_token,
                                logits_mode=logits_mode)
        tr = run_script(t, reqs, reset=reset)
        if isinstance(tr, Failure):
            return traces, RunFailure(tr, s)
        traces.append(tr)
        if not last:
            inputs = [so.captures[n - 1] for so in tr.steps]
    return traces, None


@dataclass
class Divergence:
    phase: str
    step: int
    position: int
    seq: int
    stage: int  # the stage whose output first differs
    where: str  # "boundary" (a stage's output residual) or "logits"
    max_abs: float
    layer: int | str | None = None  # first source layer whose output differs, or "output" (head)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def max_abs(a: np.ndarray, b: np.ndarray) -> float:
    if a.shape != b.shape:
        return float("inf")
    d = np.abs(a.astype(np.float64) - b.astype(np.float64))
    return float(np.nanmax(d)) if d.size else 0.0


def nmse(a: np.ndarray, b: np.ndarray) -> float:
    """How far logits b are from a, scale-free: the worst row's normalized mean squared error, each row taken
    about its own mean (softmax ignores a constant offset, and kernels that round the final norm otherwise shift
    every logit alike) — sum(((a - mean a) - (b - mean b))^2) / sum((a - mean a)^2), llama.cpp's own measure of
    kernel agreement (test-backend-ops' NMSE) on what a sampler sees. The same for a model whose logits span 2 or
    40; inf for other shapes."""
    if a.shape != b.shape:
        return float("inf")
    x, y = np.atleast_2d(a.astype(np.float64)), np.atleast_2d(b.astype(np.float64))
    if not x.size:
        return 0.0
    x, y = x - x.mean(axis=-1, keepdims=True), y - y.mean(axis=-1, keepdims=True)
    spread, err = np.sum(x * x, axis=-1), np.sum((x - y) ** 2, axis=-1)
    return float(np.max(np.where(spread > 0, err / np.where(spread > 0, spread, 1), np.where(err > 0, np.inf, 0))))


def first_row_diff(a: np.ndarray, b: np.ndarray) -> int | None:
    if a.shape != b.shape:
        return 0
    rows = np.nonzero(np.any(a != b, axis=tuple(range(1, a.ndim))))[0]
    return int(rows[0]) if rows.size else None


def compare(ref: Trace, chain: list[Trace], steps: list[Step], cuts: list[int]) -> tuple[Divergence | None, float]:
    """First bit-level difference (step order, then stage order), and max |Δlogit| over the run."""
    quick = _identical(ref, chain, cuts)
    if quick is not None:  # the common case, in a few array operations instead of several per step
        return None, quick
    first: Divergence | None = None
    worst = 0.0
    final = chain[-1]
    for k, st in enumerate(steps):
        for s, c in enumerate(cuts):
            if first is None:
                got, want = chain[s].steps[k].captures[max(chain[s].steps[k].captures)], ref.steps[k].captures[c - 1]
                row = first_row_diff(got, want)
                if row is not None:
                    first = Divergence(st.phase, k, st.pos[row], st.seq[row], s, "boundary", max_abs(got, want))
        got, want = final.steps[k].logits, ref.steps[k].logits
        worst = max(worst, max_abs(got, want))
        if first is None:
            row = first_row_diff(got, want)
            if row is not None:
                first = Divergence(st.phase, k, st.pos[row], st.seq[row], len(cuts), "logits", max_abs(got, want))
    return first, worst


def _identical(ref: Trace, chain: list[Trace], cuts: list[int]) -> float | None:
    """0.0 if every boundary and every logit of the run is bit-identical to the reference, else None."""
    final = chain[-1]
    if len(final.steps) != len(ref.steps) or any(len(tr.steps) != len(ref.steps) for tr in chain):
        return None
    pairs = [(final.steps[k].logits, ref.steps[k].logits) for k in range(len(ref.steps))]
    for s, c in enumerate(cuts):
        pairs += [(so.captures[max(so.captures)], ro.captures[c - 1])
                  for so, ro in zip(chain[s].steps, ref.steps, strict=True)]
    if any(a.shape != b.shape for a, b in pairs):
        return None
    got = np.concatenate([a.ravel() for a, _ in pairs])
    want = np.concatenate([b.ravel() for _, b in pairs])
    return 0.0 if np.array_equal(got.view(np.uint32), want.view(np.uint32)) else None


def localize(ref: Trace, chain: list[Trace], stages: list[tuple[int, int, list[int], list[int]]],
             upto_step: int) -> int | str:
    """The first source layer the chain does not reproduce, from a run that captured every stage layer.

    stages: (first, last, source layer of each stage layer, pad indices). A layer of [first, last) that the
    stage does not hold at all (a slice that dropped it) is reported as not reproduced, too."""
    for k in range(upto_step + 1):
        for s, (first, last, sources, pads) in enumerate(stages):
            held = {src: j for j, src in enumerate(sources) if j not in pads}
            for src in range(first, last):
                if src not in held:
                    return src
                got = chain[s].steps[k].captures.get(held[src])
                want = ref.steps[k].captures.get(src)
                if got is not None and want is not None and first_row_diff(got, want) is not None:
                    return src
    return "output"


def tokens_equal(ref: Trace, chain: list[Trace]) -> bool:
    return all(np.array_equal(np.argmax(a.logits, axis=1), np.argmax(b.logits, axis=1))
               for a, b in zip(ref.steps, chain[-1].steps, strict=True))


# ---- inside a layer: which graph node first differs ----------------------------------------------------------

def describe_node(node: dict[str, Any] | None) -> str | None:
    """One line for a localized node ("`kq_soft_max-2` = SOFT_MAX(kq-2, ...) [256, 3, 4, 1], values"), or None
    when there is no node (not localized, or every node agreed)."""
    if not node or not node.get("name"):
        return None
    srcs = f"({', '.join(node['srcs'])})" if node.get("srcs") else ""
    return (f"`{node.get('node') or node['name']}` = {node.get('ggml_op')}{srcs} {node.get('ne', '')}, {node['kind']}"
            + (f", max |Δ| {node['max_abs']:.3g}" if "max_abs" in node else ""))


_NODE = re.compile(r"^(?P<op>.+?)-(?P<layer>\d+)(?P<tail>(?: \(.*\))*)$")


def node_key(name: str) -> str | None:
    """A node name without its layer index ("kq_soft_max-3" → "kq_soft_max", "Qcur-3 (view)" →
    "Qcur (view)"), so a stage's layer j pairs with the full model's layer a + j; None without an index."""
    m = _NODE.match(name)
    return m["op"] + m["tail"] if m else None


NO_NODES = {"kind": "untraced", "detail": "the target returned no graph nodes (protocol `trace`)"}


def traced_steps(t: Target, runs: list[tuple[dict[str, Any], list[dict[str, Any]]]], at: int) \
        -> list[dict[str, Any]] | dict[str, Any]:
    """Each run once more with its graph traced — (load arguments, script requests), loaded with `trace` on and run
    from a fresh context — and each run's result at step `at` (its "nodes" the traced step's graph); or, when a run
    fails or a traced step brings no nodes, the `untraced` record that says why."""
    out = []
    for load, reqs in runs:
        replies = t.pipeline([("load", {**load, "trace": True}), script_request(reqs, reset=True)])
        if len(replies) < 2 or not replies[-1].ok:
            why = replies[-1].failure.message if replies and not replies[-1].ok else "no reply"
            return {"kind": "untraced", "detail": f"a traced run failed: {why}"}
        out.append(replies[-1].data["results"][at])
    return NO_NODES if any(not r.get("nodes") for r in out) else out


def first_differing_node(want: list[dict[str, Any]], got: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The first node of got (in execution order) that differs from the same-named node of want, the reference
    (paired by name without the layer index and by occurrence), or None if every node is bit-identical. Nodes are
    {"name", "op", "type", "ne", "data" (bytes)} as the worker traces them (op: the ggml operation)."""
    def keyed(nodes):
        seen: dict[str, int] = {}
        out = {}
        for n in nodes:
            k = node_key(n["name"])
            if k is None:
                continue
            seen[k] = seen.get(k, 0) + 1
            out[(k, seen[k])] = n
        return out

    ref = keyed(want)
    same = 0
    for key, n in keyed(got).items():
        r = ref.get(key)
        base = {"name": key[0], "ggml_op": n.get("op"), "node": n["name"], "srcs": n.get("srcs", []), "ne": n["ne"],
                "same_before": same}
        if r is None:
            return base | {"kind": "extra", "detail": "the reference run's layer computes no such node"}
        if r["type"] != n["type"] or list(r["ne"]) != list(n["ne"]):
            return base | {"kind": "shape", "detail": f"type {n['type']} ne {list(n['ne'])} where the full "
                                                      f"model has type {r['type']} ne {list(r['ne'])}"}
        if r["data"] != n["data"]:
            return base | {"kind": "values", "reference_node": r["name"]} | _max_abs(r, n)
        same += 1
    return None


def first_differing_graph_node(want: list[dict[str, Any]], got: list[dict[str, Any]],
                               unset: tuple[str, ...] = ()) -> dict[str, Any] | None:
    """Two traces of the same graph (same model file, same batch): the first node, by execution index, whose op,
    shape or bits differ; None if all are identical. unset: inputs these runs did not fill (llama.cpp builds the
    token and the embedding input path and selects one: the other computes on whatever memory holds) — nodes
    computed from them are not compared."""
    dead = set(unset)
    for i, (r, n) in enumerate(zip(want, got, strict=False)):
        if dead.intersection(n.get("srcs", ())):
            dead.add(n["name"])
            continue
        base = {"name": n["name"], "ggml_op": n.get("op"), "srcs": n.get("srcs", []), "ne": n["ne"], "index": i,
                "same_before": i}
        if (r["name"], r.get("op")) != (n["name"], n.get("op")) or r["type"] != n["type"] or r["ne"] != n["ne"]:
            return base | {"kind": "graph", "detail": f"the graphs part here: {r['name']} ({r.get('op')}) in the "
                                                      f"reference run"}
        if r["data"] != n["data"]:
            return base | {"kind": "values"} | _max_abs(r, n)
    if len(want) != len(got):
        i = min(len(want), len(got))
        return {"name": None, "kind": "graph", "index": i, "same_before": i,
                "detail": f"{len(got)} nodes where the reference run has {len(want)}"}
    return None


def _max_abs(r: dict[str, Any], n: dict[str, Any]) -> dict[str, float]:
    if n["type"] != GGML_TYPE_F32 or len(r["data"]) != len(n["data"]):
        return {}
    a = np.frombuffer(r["data"], "<f4").astype(np.float64)
    b = np.frombuffer(n["data"], "<f4").astype(np.float64)
    with np.errstate(invalid="ignore"):
        d = np.abs(a - b)
    return {"max_abs": float(np.nanmax(d)) if np.isfinite(d).any() else float("inf")}


GGML_TYPE_F16 = 1
GGML_TYPE_BF16 = 30
ULP_LEVEL = 1e-5  # relative: two f32 inputs this close differ only in their summation order's rounding


def _bf16(a: np.ndarray) -> np.ndarray:
    """f32 → bf16 (round to nearest even), as ggml converts a row, kept as the bf16 bits."""
    u = a.astype("<f4").view("<u4").astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def _rounding_operands(x: dict[str, Any], seen: dict[str, dict[str, Any]]) -> tuple[str, int] | None:
    """(the f32 source, the 16-bit type it is rounded to) of a node that rounds one: a matrix product with an f16 /
    bf16 operand (ggml converts the other to its type first: the softmax probabilities times an f16 V cache), or a
    row store / copy into an f16 / bf16 tensor (K and V rows written into their cache)."""
    if x["op"] == "MUL_MAT" and len(x["srcs"]) == 2 and x["srcs"][0] in seen:
        return x["srcs"][1], seen[x["srcs"][0]]["type"]
    if x["op"] in ("SET_ROWS", "CPY") and x["srcs"]:
        return x["srcs"][0], x["type"]
    return None


def _f32_rows(x: dict[str, Any], y: dict[str, Any], a: dict[str, Any] | None,
              b: dict[str, Any] | None) -> tuple[np.ndarray, np.ndarray] | None:
    """The rows of node x's / y's f32 source (a in one run, b in the other) when the two are comparable — the same
    node and shape, f32, their bytes its rows (not a view's), and not equal; None otherwise."""
    if a is None or b is None or (x["name"], x["ne"]) != (y["name"], y["ne"]) or a["type"] != GGML_TYPE_F32 or \
            (a["ne"], a["type"]) != (b["ne"], b["type"]) or not a["ne"][0] or a["data"] == b["data"] or \
            not len(a["data"]) == len(b["data"]) == 4 * int(np.prod(a["ne"])):  # (a view's bytes: not its rows)
        return None
    rows = np.frombuffer(a["data"], "<f4").reshape(-1, a["ne"][0])
    return rows, np.frombuffer(b["data"], "<f4").reshape(rows.shape)


def _close(rows_a: np.ndarray, rows_b: np.ndarray, level: float) -> bool:
    """Every value of the two within `level` of its row's largest magnitude."""
    scale = np.maximum(np.max(np.abs(rows_a), axis=1, keepdims=True), np.finfo(np.float32).tiny)
    return bool(np.all(np.abs(rows_a.astype(np.float64) - rows_b) <= level * scale))


def token_slice(nodes: list[dict[str, Any]], n_tokens: int, rows: slice) -> list[dict[str, Any]]:
    """A traced graph of a batch holding several sequences, as one sequence's: every f32 node laid out one row per
    token of the batch (ne = [width, n_tokens, 1, 1], its bytes its rows) keeps only that sequence's rows; the rest
    as it is (it does not pair with a one-sequence graph, and is skipped)."""
    out = []
    for n in nodes:
        ne = n["ne"]
        if n["type"] == GGML_TYPE_F32 and ne[1] == n_tokens and ne[2] == ne[3] == 1 and ne[0] and \
                len(n["data"]) == 4 * ne[0] * n_tokens:
            got = np.frombuffer(n["data"], "<f4").reshape(n_tokens, ne[0])[rows]
            n = {**n, "ne": [ne[0], len(got), 1, 1], "data": got.tobytes()}
        out.append(n)
    return out


def first_rounding_flip(want: list[dict[str, Any]], got: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The first node that rounds f32 values to f16 / bf16 (_rounding_operands) where the two runs' f32 values are
    the same but for rounding (≤ ULP_LEVEL relative: the summation order) and one of them rounds to another 16-bit
    number — a near-tie that turns an ulp into the 16-bit type's step. Each row's values are compared sorted: a row
    over KV cells (softmax probabilities) holds them in other cells when the sequence sits elsewhere. The runs are
    one graph (nodes paired in order; a source is the latest node of its name); None if there is no such node."""
    seen: list[dict[str, dict[str, Any]]] = [{}, {}]
    for x, y in zip(want, got, strict=False):
        ops = _rounding_operands(x, seen[0])
        a, b = (seen[0].get(ops[0]), seen[1].get(ops[0])) if ops else (None, None)
        seen[0][x["name"]], seen[1][y["name"]] = x, y
        rows = _f32_rows(x, y, a, b) if ops is not None and ops[1] in (GGML_TYPE_F16, GGML_TYPE_BF16) else None
        if rows is None:
            continue
        rows_a, rows_b = (np.sort(r, axis=1) for r in rows)
        if not _close(rows_a, rows_b, ULP_LEVEL):
            continue  # the values differ by more than rounding: the flip, if any, is earlier
        kind = "f16" if ops[1] == GGML_TYPE_F16 else "bf16"
        ra, rb = (r.astype(np.float16).view(np.uint16) if kind == "f16" else _bf16(r) for r in (rows_a, rows_b))
        diff = np.argwhere(ra != rb)
        if diff.size:
            row, col = (int(v) for v in diff[0])
            return {"kind": "rounding", "node": x["name"], "ggml_op": x["op"], "input": ops[0], "to": kind,
                    "row": row, "a": float(rows_a[row, col]), "b": float(rows_b[row, col])}
    return None


# The type a matrix product with quantized weights quantizes its f32 activations to before its dot products
# (ggml-cpu's vec_dot_type): q8_0 and q8_1 in blocks of 32 (the same integers, round(x · 127/amax)), q8_K in
# blocks of 256 (round(x · −127/max), max the block's value of largest magnitude, at most 127).
ACTIVATION_QUANT = {"Q4_0": "q8_0", "Q5_0": "q8_0", "Q8_0": "q8_0", "MXFP4": "q8_0", "IQ4_NL": "q8_0",
                    "Q4_1": "q8_1", "Q5_1": "q8_1",
                    **{t: "q8_K" for t in ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ1_S", "IQ1_M", "IQ2_XXS",
                                           "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ4_XS")}}
WIRE_LEVEL = 2.0 ** -9  # relative: two f32 inputs this close differ by an f16 rounding (≤ 2^-11), carried by a norm


def activation_ints(rows: np.ndarray, to: str) -> np.ndarray:
    """The integers ggml quantizes f32 rows to as the activations of a quantized matrix product (`to`:
    ACTIVATION_QUANT's), in f32 arithmetic and rounding to nearest even as ggml's x86 kernels do; rows × values."""
    block = 256 if to == "q8_K" else 32
    r = np.ascontiguousarray(rows, dtype=np.float32).reshape(-1, block)
    if to == "q8_K":
        peak = r[np.arange(len(r)), np.argmax(np.abs(r), axis=1)][:, None]
        scale = np.divide(np.float32(-127), peak, out=np.zeros_like(peak), where=peak != 0)
        q = np.minimum(np.rint(r * scale), 127)
    else:
        amax = np.max(np.abs(r), axis=1, keepdims=True)
        q = np.rint(r * np.divide(np.float32(127), amax, out=np.zeros_like(amax), where=amax != 0))
    return q.astype(np.int32).reshape(rows.shape)


def first_requantization_flip(want: list[dict[str, Any]], got: list[dict[str, Any]],
                              weights: dict[str, str]) -> dict[str, Any] | None:
    """The first matrix product with quantized weights (`weights`: tensor name → its type's name, as the model
    file holds it) whose f32 activations are the same in the two runs but for an f16 rounding (≤ WIRE_LEVEL
    relative) and yet quantize to other integers (ACTIVATION_QUANT) — the rounding carried across a quantization
    step, turning an f16 ulp into a step of 1/127 of the block's largest value. The runs are one graph (nodes paired
    in order; a source is the latest node of its name); None if there is no such product."""
    seen: list[dict[str, dict[str, Any]]] = [{}, {}]
    for x, y in zip(want, got, strict=False):
        to = ACTIVATION_QUANT.get(weights.get(x["srcs"][0], "")) if x["op"] in ("MUL_MAT", "MUL_MAT_ID") and \
            len(x["srcs"]) >= 2 else None
        src = x["srcs"][1] if to else None
        rows = _f32_rows(x, y, seen[0].get(src), seen[1].get(src)) if to else None
        seen[0][x["name"]], seen[1][y["name"]] = x, y
        if rows is None or rows[0].shape[1] % (256 if to == "q8_K" else 32) or not _close(*rows, WIRE_LEVEL):
            continue
        qa, qb = (activation_ints(r, to) for r in rows)
        moved = qa != qb
        if moved.any():
            row, col = (int(v) for v in np.argwhere(moved)[0])
            return {"kind": "requantization", "node": x["name"], "ggml_op": x["op"], "input": src,
                    "weight": x["srcs"][0], "weight_type": weights[x["srcs"][0]].lower(), "to": to, "row": row,
                    "moved": int(moved.sum()), "of": int(moved.size), "a": float(rows[0][row, col]),
                    "b": float(rows[1][row, col]), "ints": [int(qa[row, col]), int(qb[row, col])]}
    return None
