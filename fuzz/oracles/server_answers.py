"""What the llama-server oracles share (prefix-cache, radix, server-options): loading a server (a signal while
loading is a crash, a refusal bad input), the uncached reference answers, how an answer is judged against them (a
greedy pick only where the reference's top-2 margin clears the near-tie bound), what numerics move an answer by
(placement in one KV cache, the controls that explain a different answer), and the probes of a server left after
requests (busy slots, the capacity a slot still has)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from synth.errors import UserError
from targets import Target

NEAR_TIE = 1e-3  # logprob margin below which a greedy pick is not judged
NOISE_FACTOR = 4.0  # one KV cache for all slots: picks are judged where the margin exceeds this × the measured move
UNCACHED_TRIES = 8  # runs of a round with the prompt cache off, at most, that may show an answer is not the cache's


class ServerCrash(Exception):
    """llama-server aborted loading the model under the parameters chosen here (`params`)."""

    def __init__(self, message: str, params: dict[str, Any]):
        super().__init__(message)
        self.params = params


def load_server(t: Target, fixture: Path, kv_unified: bool = False, **params: Any) -> dict[str, Any]:
    """A server that refuses the model is bad input (UserError); one that aborts loading it (a signal) is a crash of
    the target under the configuration chosen here — a finding (ServerCrash). kv_unified: one KV cache shared by the
    slots (--kv-unified) instead of one per slot."""
    if kv_unified:
        params = {**params, "args": [*params.get("args", []), "--kv-unified"]}
    r = t.load(str(fixture), **params)
    if not r.ok:
        if "signal" in r.failure.message:
            raise ServerCrash(f"loading with {params.get('slots')} slots: {r.failure.message}", params)
        raise UserError(f"{fixture}: llama-server cannot serve it: {r.failure.message}")
    return r.data


def cold_answers(t: Target, fixture: Path, prompts: dict[str, list[int]], tokens: int) -> dict[str, Any]:
    """Each prompt's answer, one after another with the cache off (on a loaded one-slot server): the reference."""
    reqs = [{"prompt": p, "n_predict": tokens, "cache_prompt": False} for p in prompts.values()]
    r = t.call("complete", requests=reqs, concurrent=False)
    if not r.ok or any("error" in x for x in r.data["results"]):
        raise UserError(f"{fixture}: the uncached reference fails: "
                        f"{r.failure.message if not r.ok else r.data['results']}")
    return dict(zip(prompts, r.data["results"], strict=True))


def moved(ref: dict[str, Any], got: dict[str, Any]) -> float:
    """The largest |Δ logprob| of a top candidate both answers list, over the steps up to where they part."""
    worst = 0.0
    for k, (a, b) in enumerate(zip(ref["tokens"], got["tokens"], strict=False)):
        mine = {int(i): lp for i, lp in (got["top"][k] if k < len(got["top"]) else [])}
        worst = max([worst] + [abs(lp - mine[int(i)]) for i, lp in ref["top"][k] if int(i) in mine])
        if a != b:
            break
    return worst


def placement_noise(t: Target, fixture: Path, prompts: dict[str, list[int]], cold: dict[str, Any], tokens: int,
                    n_vocab: int, seed: int, n_ctx: int) -> dict[str, Any]:
    """With one KV cache for all slots (and flash attention, llama-server's default) where a sequence's cells sit
    moves its logits: attention sums the cells in cell order (CPU flash attention accumulates V in f16), so a
    sequence whose next tokens land in cells another slot freed — below its own earlier ones — is summed in another
    order than a cold run's. Its rows are byte-identical to the cold run's (left where it was, it matches the cold
    run bit for bit); its answer moves by a few 1e-3 on most fixtures, by ~5e-2 on some sliding-window ones (the
    window's few cells weigh more), and a MoE router can turn that into another expert. Measured per prompt on the
    real server, two ways the server leaves a sequence so:
    - beside: the prompt answered on slot 0 while a filler is answered on slot 1 (their cells interleave), slot 1
      erased (as --cache-idle-slots clears an idle slot), the prompt's second turn on slot 0 (its answer and two
      more tokens) reusing its own cells and continuing into the freed ones — against the same second turn cold;
    - restored: the prompt answered on slot 0 and saved; slot 0 erased; a filler on slot 1 takes the low cells; the
      save restored on slot 0 above it; slot 1 erased; the prompt again on slot 0, reusing all but its last token —
      against its cold answer.
    {placement: the largest move (None: not measured), how: how (or why not), near_tie: the margin below which a
    pick is not judged — NOISE_FACTOR × the move, NEAR_TIE at least}."""
    rng = np.random.Generator(np.random.PCG64(seed + 77))
    load_server(t, fixture, slots=2, cache_ram=0, kv_unified=True, n_ctx=n_ctx)

    def submit(name: str, **req: Any) -> str:
        sent = t.call("submit", name=name, **req)
        if not sent.ok:
            raise RuntimeError(f"{name}: {sent.failure.message}")
        return name

    def done(name: str) -> dict[str, Any]:
        got = t.call("await", name=name, point="done", timeout=30)
        if not got.ok or "error" in got.data["result"]:
            raise RuntimeError(f"{name}: {got.failure.message if not got.ok else got.data['result']['error']}")
        return got.data["result"]

    def step(name: str, **req: Any) -> dict[str, Any]:
        return done(submit(name, **req))

    worst = 0.0
    try:
        for n, (name, prompt) in enumerate(prompts.items()):
            filler = [int(x) for x in rng.integers(0, n_vocab, len(prompt) + tokens + 2)]
            # beside: interleaved with another slot's cells, that slot freed, a second turn into its cells
            first = submit(f"beside-{n}", kind="complete", prompt=prompt, n_predict=tokens, slot=0,
                           cache_prompt=False)
            other = submit(f"beside-filler-{n}", kind="complete", prompt=filler[:len(prompt)], n_predict=tokens,
                           slot=1, cache_prompt=False)
            answer, _ = done(first), done(other)
            second = prompt + answer["tokens"] + [int(x) for x in rng.integers(0, n_vocab, 2)]
            step(f"beside-free-{n}", kind="erase", slot=1)
            got = step(f"beside-again-{n}", kind="complete", prompt=second, n_predict=tokens, slot=0)
            step(f"beside-erase-{n}", kind="erase", slot=0)
            alone = step(f"beside-cold-{n}", kind="complete", prompt=second, n_predict=tokens, slot=0,
                         cache_prompt=False)
            step(f"beside-done-{n}", kind="erase", slot=0)
            worst = max(worst, moved(alone, got))
            # restored: above another slot's cells, that slot freed, continued into its cells
            step(f"noise-{n}", kind="complete", prompt=prompt, n_predict=tokens, slot=0, cache_prompt=False)
            step(f"noise-save-{n}", kind="save", slot=0, file=f"noise-{n}")
            step(f"noise-erase-{n}", kind="erase", slot=0)
            step(f"noise-filler-{n}", kind="complete", prompt=filler, n_predict=1, slot=1, cache_prompt=False)
            step(f"noise-restore-{n}", kind="restore", slot=0, file=f"noise-{n}")
            step(f"noise-free-{n}", kind="erase", slot=1)
            got = step(f"noise-again-{n}", kind="complete", prompt=prompt, n_predict=tokens, slot=0)
            step(f"noise-done-{n}", kind="erase", slot=0)
            worst = max(worst, moved(cold[name], got))
    except RuntimeError as e:
        return {"placement": None, "how": f"not measured ({e})", "near_tie": NEAR_TIE}
    return {"placement": worst, "how": "each prompt's second turn continued into cells another slot freed beside "
                                       "it, and each prompt restored above another slot's cells and continued into "
                                       "them once freed, against the same requests cold",
            "near_tie": max(NEAR_TIE, NOISE_FACTOR * worst)}


def numerics_step(ref: dict[str, Any], answer: list[int], controls: list[list[int]]) -> str | None:
    """How uncached controls (the same prompt computed afresh otherwise) explain an answer that leaves the
    reference: they give that answer, or already leave the reference at or before its step. None: they do not."""
    if answer in controls:
        return "the same answer"
    k = parted(ref, {"tokens": answer})
    moves = [j for j in (parted(ref, {"tokens": c}) for c in controls) if j is not None]
    if k is not None and moves and min(moves) <= k:
        return f"a departure from the reference at step {min(moves)} (this answer's at step {k})"
    return None


def parted(ref: dict[str, Any], got: dict[str, Any]) -> int | None:
    """The first step where got's tokens leave ref's (None: got is ref's, or a prefix of it)."""
    return next((k for k, (a, b) in enumerate(zip(ref["tokens"], got["tokens"], strict=False)) if a != b), None)


PROBE_PREDICT = 2  # tokens a capacity probe generates
PROBE_SLACK = 2  # cells of a slot a capacity probe leaves unused: a slot holding more than this it cannot take


class Capacity(NamedTuple):
    slot: int  # -1: the server could not say
    why: str
    died: bool = False  # llama-server died on the probe: a crash, whichever phase it falls in


def capacity_problems(t: Target, n_vocab: int, seed: int) -> list[Capacity]:
    """Every slot in turn given a prompt that fills its context — the cells the server says the slot has (llama.cpp
    pads what was asked for), but PROBE_SLACK and the tokens it generates — with the cache off: it fits only if
    the slot gave back every cell its earlier requests held. One problem for each slot that could not; a server
    that died ends the probe there."""
    r = t.call("slots")
    if not r.ok:
        return [Capacity(-1, f"the server could not list its slots: {r.failure.message}",
                         r.failure.error_kind == "server_crash" or r.failure.kind == "crash")]
    rng = np.random.Generator(np.random.PCG64(seed + 99))
    out = request_problems(t, n_vocab, rng)
    for s in r.data["slots"] if not out or not out[-1].died else ():
        c, cells = s["id"], s.get("n_ctx")
        if not cells:
            out.append((c, f"slot {c}: the server did not say how many cells it has"))
            continue
        n = cells - PROBE_PREDICT - PROBE_SLACK
        prompt = [int(x) for x in rng.integers(0, n_vocab, n)]
        sent = t.call("submit", name=f"probe{c}", kind="complete", prompt=prompt, n_predict=PROBE_PREDICT, slot=c,
                      cache_prompt=False)
        a = t.call("await", name=f"probe{c}", point="done", timeout=20) if sent.ok else sent
        got = a.data["result"] if a.ok else {"error": a.failure.message, "server_crash":
                                             a.failure.error_kind == "server_crash" or a.failure.kind == "crash"}
        if "error" not in got and len(got["tokens"]) < PROBE_PREDICT:  # (the server stops a full slot quietly)
            got["error"] = f"stopped after {len(got['tokens'])} of {PROBE_PREDICT} tokens: the slot is full"
        if "error" in got:
            out.append(Capacity(c, f"a {n}-token prompt on slot {c} ({cells} cells): {got['error']}",
                                bool(got.get("server_crash"))))
            if out[-1].died:
                break
    return out


def request_problems(t: Target, n_vocab: int, rng: np.random.Generator) -> list[Capacity]:
    """A prompt holding an id past the vocabulary's last must be refused as an invalid request (HTTP 400: llama-server
    validates a prompt's ids before a slot takes it), not decoded nor failed as the server's own error; the probes
    after it then show the slot it came to kept every cell. And a request for one token gets one (n_predict is the
    most an answer holds; the requests ignore end of generation)."""
    prompt = [*(int(x) for x in rng.integers(0, n_vocab, 3)), n_vocab]
    r = t.call("complete", requests=[{"prompt": prompt, "n_predict": PROBE_PREDICT},
                                     {"prompt": prompt[:3], "n_predict": 1}])
    bad, one = r.data["results"] if r.ok else [{"error": r.failure.message, "server_crash": r.failure.error_kind ==
                                                "server_crash" or r.failure.kind == "crash"}] * 2
    out = []
    if "error" not in bad or "400" not in str(bad["error"]) or bad.get("server_crash"):
        said = f"answered {bad['tokens']}" if "error" not in bad else f"failed: {str(bad['error'])[:160]}"
        out.append(Capacity(-1, f"a prompt holding token id {n_vocab} (the vocabulary has {n_vocab}) was not refused "
                                f"as an invalid request (HTTP 400): it {said}", bool(bad.get("server_crash"))))
    if not out and "error" not in one and len(one["tokens"]) != 1:  # (and n_predict is what an answer holds)
        out.append(Capacity(-1, f"a request for one token (n_predict 1, end of generation ignored) was answered "
                                f"{len(one['tokens'])}: {one['tokens']}"))
    return out


def busy_slots(t: Target) -> list[int]:
    """The slots still processing ([-1]: the server could not say)."""
    r = t.call("slots")
    if not r.ok:
        return [-1]
    return [s["id"] for s in r.data["slots"] if s["is_processing"]]


def compare(ref: dict[str, Any], got: dict[str, Any], near_tie: float = NEAR_TIE) -> str | None:
    """Why got's greedy continuation is not the reference's, or None. Steps where the reference's top-2 logprob
    margin is below `near_tie` end the comparison (numerics may pick either there), and so does a step where the
    reference did not pick its listed top candidate: that one was banned (the requests ignore end-of-generation
    tokens, and llama.cpp takes token 11 as a BPE vocabulary's end when the file names none), so the margin of
    what it picked over what else it could pick is not listed."""
    for k, (a, b) in enumerate(zip(ref["tokens"], got["tokens"], strict=False)):
        top = ref["top"][k] if k < len(ref["top"]) else []
        if len(top) >= 2 and (top[0][1] - top[1][1] < near_tie or int(top[0][0]) != a):
            return None
        if a != b:
            return f"token {k}: {b} instead of {a}"
    if len(ref["tokens"]) != len(got["tokens"]):
        return f"{len(got['tokens'])} tokens instead of {len(ref['tokens'])}"
    return None


def noise_line(noise: dict[str, Any]) -> str:
    """What a unified layout's placement moves answers by, and the margin below which picks are not judged."""
    move = "not measured" if noise["placement"] is None else f"{noise['placement']:.2g}"
    return (f"  one KV cache for all slots: placement moves answers by {move} ({noise['how']}); picks at margins "
            f"below {noise['near_tie']:.2g} not judged")
