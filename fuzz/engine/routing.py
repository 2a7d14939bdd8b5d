"""Discrete choices at a near-tie, token by token: a MoE router's expert choice and DSA's top-k of keys, read from two
traced runs (llama.cpp's `ffn_moe_*` and indexer nodes), and whether rounding explains where they part — the move
bounded by what the model's own rounding moves the same scores (own_rounding), measured on the tokens at hand."""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from fuzz.engine.parity import GGML_TYPE_F32, GGML_TYPE_I32

ROUNDING = 1e-2  # router scores moved by at most this are moved by kernel rounding (sigmoid/softmax scores in [0, 1]):
# the bound only where no control of the model's own rounding was measured (the wire oracle's stage splits)
ROUNDING_FACTOR = 4.0  # a router's scores moved by rounding: at most this × what the model's own rounding moves them


ROUTER_NODES = ("ffn_moe_argsort", "ffn_moe_probs", "ffn_moe_logits")
TOP_K_NODES = ("top_k", "indexer_score")  # DSA's lightning indexer: each token's key scores over the cells, its top-k


def token_rows(steps: list[list[dict[str, Any]]], tokens: list[int] | None = None, pick: Any = None,
               names: tuple[str, ...] = ROUTER_NODES) -> tuple[dict[str, np.ndarray], dict[str, int]]:
    """The MoE router's traced nodes of a run (`ffn_moe_logits/probs/argsort-L`), each with its rows in token order
    over all steps and ubatches; and each layer's k (the width of its top-k view, whose bytes are a strided view's,
    not rows). tokens: how many rows of each step are tokens of the run; a node whose rows are not one per token in
    every step (the last layer keeps output rows only) is left out (None: runs of one graph shape, paired as they
    are). names: which nodes (default the MoE router's; TOP_K_NODES: DSA's indexer). pick(step, rows): the rows of
    a step that are the run's tokens (default: all of them), e.g. one sequence's rows of a batch holding several."""
    rows: dict[str, list[np.ndarray]] = {}
    odd: set[str] = set()
    k: dict[str, int] = {}
    for i, nodes in enumerate(steps):
        step: dict[str, list[np.ndarray]] = {}  # (a step split into ubatches traces each of them)
        for n in nodes:
            name, layer = n["name"], n["name"].rsplit("-", 1)[-1]
            if name.startswith("ffn_moe_topk") and n["ne"][0]:
                k[layer] = n["ne"][0]
            elif name.startswith(names) and n["ne"][0] and n["type"] in (GGML_TYPE_F32, GGML_TYPE_I32) and \
                    len(n["data"]) == 4 * int(np.prod(n["ne"])):
                dt = "<i4" if n["type"] == GGML_TYPE_I32 else "<f4"
                step.setdefault(name, []).append(np.frombuffer(n["data"], dt).reshape(-1, n["ne"][0]))
        for name, parts in step.items():
            got = np.concatenate(parts)
            got = got if pick is None else got[pick(i, len(got))]
            if tokens is not None and len(got) != tokens[i]:
                odd.add(name)
            rows.setdefault(name, []).append(got)
    return {name: np.concatenate(parts) for name, parts in rows.items() if name not in odd}, k


def first_token_flip(a: tuple[dict[str, np.ndarray], dict[str, int]],
                     b: tuple[dict[str, np.ndarray], dict[str, int]]) -> dict[str, Any] | None:
    """The earliest token whose chosen experts (a layer's top-k set) differ between two runs (token_rows), and the
    router's scores there (the argsort's input: biased probabilities where the arch has them) in both: how far
    they moved and the first run's gap between its last chosen and first unchosen expert."""
    (ra, ka), (rb, _) = a, b
    best = None
    for layer, k in ka.items():
        order = f"ffn_moe_argsort-{layer}"
        if order not in ra or order not in rb or ra[order].shape != rb[order].shape:
            continue
        x, y = ra[order][:, :k], rb[order][:, :k]
        tok = next((i for i in range(len(x)) if sorted(x[i]) != sorted(y[i])), None)
        if tok is not None and (best is None or tok < best[1]):
            best = (layer, tok, sorted(x[tok].tolist()), sorted(y[tok].tolist()))
    if best is None:
        return None
    layer, tok, chosen_a, chosen_b = best
    out: dict[str, Any] = {"node": f"ffn_moe_topk-{layer}", "token": tok, "a": chosen_a, "b": chosen_b}
    k = len(chosen_a)
    for scores in (f"ffn_moe_probs_biased-{layer}", f"ffn_moe_probs-{layer}", f"ffn_moe_logits-{layer}"):
        if scores in ra and scores in rb and ra[scores].shape == rb[scores].shape:
            sa, sb = ra[scores][tok].astype(np.float64), rb[scores][tok].astype(np.float64)
            top = np.sort(sa)[::-1]
            out |= {"scores": scores, "scores_max_abs": float(np.max(np.abs(sa - sb))),
                    "margin": float(top[k - 1] - top[k]) if k < len(top) else float("inf")}
            break
    return out


def routing_near_tie(flip: dict[str, Any], rounding: float | None = None) -> bool:
    """A routing flip (first_token_flip) that rounding explains: the router's scores moved by no more than
    ROUNDING_FACTOR × `rounding`, what the model's own rounding moves them on the same tokens (own_rounding; None:
    not measured, the absolute ROUNDING), and the gap the choice crossed is at most twice that move — two scores
    swapping places, each moving by up to the measured move, close a gap up to twice it (deepseek3, flash
    attention: experts 0 and 2 moved +2.0e-4 and -2.2e-4 across a gap of 4.1e-4). The measured move is the bound
    the excuse names."""
    move = flip.get("scores_max_abs")
    bound = ROUNDING if rounding is None else ROUNDING_FACTOR * rounding
    return move is not None and move <= bound and flip["margin"] <= 2 * move


def own_rounding(flip: dict[str, Any], own: tuple[dict[str, np.ndarray], dict[str, int]],
                 others: list[tuple[dict[str, np.ndarray], dict[str, int]] | None]) -> float | None:
    """What the model's own rounding moves the router's scores at a flip's token (first_token_flip): the largest
    move from `own` (token_rows of one run) of `others` (the same run with one rounding changed: its K and V cached
    in f32, flash attention the other way); None where a run failed or lacks those scores."""
    name, tok, moves = flip.get("scores"), flip["token"], []
    mine = own[0].get(name) if name else None
    for rows in others:
        x = rows[0].get(name) if rows is not None and name else None
        if x is None or mine is None or x.shape != mine.shape or tok >= len(x):
            return None
        moves.append(float(np.max(np.abs(x[tok].astype(np.float64) - mine[tok].astype(np.float64)))))
    return max(moves) if moves else None


def rounding_controls(params: dict[str, Any]) -> list[dict[str, Any]]:
    """own_rounding's runs: a context's params with its K and V cached in f32 (one rounding of every cached value
    fewer), and with flash attention the other way (another summation order)."""
    return [{**params, "type_k": "f32", "type_v": "f32"}, {**params, "flash_attn": not params.get("flash_attn")}]


def first_top_k_flip(a: tuple[dict[str, np.ndarray], dict[str, int]],
                     b: tuple[dict[str, np.ndarray], dict[str, int]]) -> dict[str, Any] | None:
    """The earliest token whose DSA top-k (the keys its indexer keeps: cell indices) differs between two runs whose
    sequence sits in the same cells (token_rows with TOP_K_NODES), and the indexer's scores there: how far they moved
    over the keys either run kept, and the first run's gap between its k-th and (k+1)-th key. None if none differs."""
    (ra, _), (rb, _) = a, b
    best = None
    for name in ra:
        if not name.startswith("top_k-") or name not in rb or ra[name].shape != rb[name].shape:
            continue
        tok = next((i for i in range(len(ra[name])) if set(ra[name][i]) != set(rb[name][i])), None)
        if tok is not None and (best is None or tok < best[1]):
            best = (name, tok)
    if best is None:
        return None
    name, tok = best
    layer = int(name.split(" ")[0].rsplit("-", 1)[-1])
    ka, kb = ra[name][tok].tolist(), rb[name][tok].tolist()
    out: dict[str, Any] = {"node": name, "token": tok, "a": sorted(ka), "b": sorted(kb)}
    # the scores it kept the top of: its layer's indexer, or the latest before it (a layer may reuse another's)
    found = [int(n.rsplit("-", 1)[-1]) for n in ra if re.fullmatch(r"indexer_score-\d+", n)]
    scores = f"indexer_score-{max((x for x in found if x <= layer), default=layer)}"
    if scores in ra and scores in rb and ra[scores].shape == rb[scores].shape:
        sa, sb = ra[scores][tok].astype(np.float64), rb[scores][tok].astype(np.float64)
        kept = sorted(set(ka) | set(kb))
        both = [c for c in kept if c < len(sa) and np.isfinite(sa[c]) and np.isfinite(sb[c])]
        top = np.sort(sa[np.isfinite(sa)])[::-1]
        k = len(ka)
        out |= {"scores": scores, "scores_max_abs": float(np.max(np.abs(sa[both] - sb[both]))) if both else None,
                "margin": float(top[k - 1] - top[k]) if k < len(top) else float("inf")}
    return out


def top_k_near_tie(flip: dict[str, Any]) -> bool:
    """A top-k flip (first_top_k_flip) that rounding explains: the gap between the last key kept and the first not is
    at most twice how far the scores moved (an exact tie, gap 0, broken another way, included) — the measured move
    is the bound."""
    move = flip.get("scores_max_abs")
    return move is not None and flip["margin"] <= 2 * move
