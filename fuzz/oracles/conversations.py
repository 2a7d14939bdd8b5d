"""Clients' conversations sent to llama-server one request after another: with one request at a time what each
request takes from the prompt cache is deterministic, so a bump compares it across two builds (fuzz.certify.bump).

Two sets (the prefix-cache oracle judges every answer against the uncached reference):
- rewind_conversations: one client whose conversations go back, on one slot (where a restore decides reuse);
- client_conversations: three clients taking turns on two slots with the host cache on, so a turn finds its
  conversation in its slot, in the other one, or only in the host cache: which slot a request gets (by prompt
  similarity, else the least recently used), what is saved to the host cache when a slot is taken over, and which
  cached prompt is loaded back all decide what a request reuses.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from targets import Target

ANSWER = -1  # in a turn's prompt: the answer to the turn before it, sent back as a chat client does
PREVIOUS = -2  # in a turn's prompt: the prompt the turn before it sent (its placeholders filled)


def rewind_conversations(n_vocab: int, seed: int) -> list[list[list[int]]]:
    """One client's conversations that go back: for prompts of 6 to 40 tokens, the prompt then the prompt cut back
    to k tokens with 3 new ones (k = 2, 3, 4, half, two before the end); the prompt, a second turn of 6 more, then
    that turn cut back to 3 with 3 new ones; and the prompt, the second turn, a third that carries the second's
    answer (ANSWER) and 5 more, then the second turn continued otherwise (the checkpoint the second turn left must
    outlive the third's). The lengths straddle the tiny fixtures' sliding windows (4-8 tokens) and the server's
    checkpoints (taken 4 tokens before a prompt's end)."""
    rng = np.random.Generator(np.random.PCG64(seed + 7))

    def toks(n: int) -> list[int]:
        return [int(x) for x in rng.integers(0, n_vocab, n)]

    convs = []
    for n in (6, 8, 12, 24, 40):
        for k in sorted({2, 3, 4, n // 2, n - 2}):
            p = toks(n)
            convs.append([p, p[:k] + toks(3)])
        p, turn = toks(n), toks(6)
        convs.append([p, p + turn, p + turn[:3] + toks(3)])
        p, turn = toks(n), toks(6)
        convs.append([p, p + turn, p + turn + [ANSWER] + toks(5), p + turn + toks(4)])
    return convs


# (conversation, turn) in the order sent: clients A, B, C take turns so that a turn finds its conversation in the
# slot it left (B2), in the other slot (A2 after C1 took A's), or only in the host cache (B3, C2); A's and B's
# first turns asked again once both slots hold other prompts; D shares a third of A's first turn (a slot chosen by
# similarity that keeps under half of its prompt: that prompt is saved to the host cache first), then A's first
# turn again; E shares most of B's first turn, then B's first turn again
CLIENT_ORDER = ((0, 0), (1, 0), (1, 1), (0, 1), (2, 0), (0, 2), (1, 2), (2, 1), (0, 0), (1, 0), (3, 0), (0, 0),
                (2, 2), (0, 3), (4, 0), (1, 0))


def client_conversations(n_vocab: int, seed: int) -> tuple[list[list[list[int]]], tuple[tuple[int, int], ...]]:
    """Three clients' conversations of four turns (a 24-token prompt; each later turn the turn before, its answer
    and 4 new tokens) and two one-turn clients sharing a prefix of A's and of B's first turn; and the order they
    are sent in (CLIENT_ORDER)."""
    rng = np.random.Generator(np.random.PCG64(seed + 11))

    def toks(n: int) -> list[int]:
        return [int(x) for x in rng.integers(0, n_vocab, n)]

    a, b, c = toks(24), toks(24), toks(24)
    convs = [[p, *([PREVIOUS, ANSWER, *toks(4)] for _ in range(3))] for p in (a, b, c)]
    return [*convs, [a[:8] + toks(6)], [b[:20] + toks(3)]], CLIENT_ORDER


def converse(t: Target, convs: list[list[list[int]]], order: list[tuple[int, int]] | tuple[tuple[int, int], ...],
             tokens: int, name: str, erase: bool = False) -> tuple[dict[str, list[int]], dict[str, dict[str, Any]],
                                                                   str | None]:
    """Each (conversation, turn) of `order` sent alone, waiting for its answer; ANSWER and PREVIOUS in a turn's
    prompt filled from the last time the turn before it was sent. Requests are named NAME<conversation>.<turn>
    (NAME<conversation>.<turn>+<k> for its k-th time). erase: slot 0 erased before every conversation's first turn
    but the first (each conversation from an empty slot). The prompts sent and the answers by name, in the order
    sent, and what went wrong if a request failed (the requests before it only)."""
    sent: dict[str, list[int]] = {}
    answers: dict[str, dict[str, Any]] = {}
    last: dict[tuple[int, int], str] = {}
    for i, j in order:
        if erase and j == 0 and sent:
            done = t.call("submit", name=f"erase{len(sent)}", kind="erase", slot=0)
            if not done.ok or not t.call("await", name=f"erase{len(sent)}", point="done").ok:
                return sent, answers, "llama-server cannot erase its slot between conversations"
        before = last.get((i, j - 1))
        prompt = [x for tok in convs[i][j]
                  for x in (answers[before].get("tokens", []) if tok == ANSWER else
                            sent[before] if tok == PREVIOUS else [tok])]
        key, k = f"{name}{i}.{j}", 1
        while key in sent:
            k += 1
            key = f"{name}{i}.{j}+{k}"
        r = t.call("complete", requests=[{"prompt": prompt, "n_predict": tokens}], concurrent=False)
        if not r.ok:
            return sent, answers, f"{key}: {r.failure.message}"
        sent[key], answers[key], last[(i, j)] = prompt, r.data["results"][0], key
    return sent, answers, None


def shared_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def reuse(sent: dict[str, list[int]], answers: dict[str, dict[str, Any]], names: list[str]) -> dict[str, Any]:
    """What the requests `names` (in the order sent) took from the cache: their lengths, what each shares with the
    one sent before it, the slot that served it and the prompt tokens it took from the cache."""
    prompts = [sent[n] for n in names]
    return {"lengths": [len(p) for p in prompts],
            "shared": [0] + [shared_prefix(a, b) for a, b in zip(prompts, prompts[1:], strict=False)],
            "cache_n": [answers[n].get("cache_n") for n in names],
            "slots": [answers[n].get("id_slot") for n in names]}
