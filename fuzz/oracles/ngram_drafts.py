"""What llama-server's n-gram speculators must draft, re-derived from the slot's tokens: extra opinions the
server-options oracle holds the real server's drafts to (the server is the thing under test).

ngram-simple looks the slot's last tokens up in its own tokens (ngram_problems: where it finds them, it must draft).

ngram-mod keeps one hash table for all slots (common_ngram_mod, common/ngram-mod.cpp: 4 Mi entries, an n-gram's
hash → the token after it, the last writer wins); a slot's prompt is added when its generation begins, its own tokens
in chunks once 32 more stand beyond what was added, and a draft is the chain of lookups from the slot's last n-1
tokens and the token just sampled (common_speculative_impl_ngram_mod, common/speculative.cpp). Five drafts in a row
with under a quarter accepted empty the table. llama-server truncates a draft to what the slot has room for, and the
target verifies it: the longest prefix equal to its own greedy picks is accepted, then its next pick
(server-context.cpp, handle_last_sampled_token and the speculative accept). A memory that cannot drop a suffix
(recurrent, hybrid) restores a checkpoint on a partial acceptance and decodes the accepted tokens and the pick again
as a draft (`replay`). Given requests a fresh server ran one after another and the answers it gave, `predict` says how
many draft tokens each drafted and how many were accepted (its `draft_n`, `draft_n_accepted`); `mod_control` sends
such requests, made to fill the table with drafts that hold, then with drafts that fail until the table is emptied.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from targets import Failure, Target

TABLE = 4 * 1024 * 1024  # common_ngram_mod's entries
MULT = 6364136223846793005  # its hash's multiplier
CHUNK = 32  # tokens beyond the last added before a slot's own are added
LOW, LOW_RUN = 0.25, 5  # an acceptance fraction under LOW, LOW_RUN drafts in a row: the table emptied
MASK = (1 << 64) - 1


@dataclass
class Slot:
    i_last: int = 0  # the slot's tokens up to here are in the table
    n_draft_last: int = 0  # the last draft's length before truncation
    n_low: int = 0


@dataclass
class NgramMod:
    n_match: int
    n_min: int
    n_max: int
    table: dict[int, int] = field(default_factory=dict)
    slots: dict[int, Slot] = field(default_factory=dict)
    resets: int = 0  # times a run of low acceptance emptied the table

    def idx(self, tokens: list[int], at: int) -> int:
        res = 0
        for t in tokens[at:at + self.n_match]:
            res = (res * MULT + t) & MASK
        return res % TABLE

    def add(self, tokens: list[int], at: int) -> None:
        self.table[self.idx(tokens, at)] = tokens[at + self.n_match]

    def begin(self, slot: int, prompt: list[int]) -> None:
        s = self.slots.setdefault(slot, Slot())
        s.i_last, s.n_draft_last = 0, 0
        n = self.n_match
        if len(prompt) < n:
            return
        for i in range(len(prompt) - n):
            self.add(prompt, i)
        s.i_last = len(prompt) - n  # (occupancy never nears the reset threshold on a handful of requests)

    def draft(self, slot: int, tokens: list[int], sampled: int) -> list[int]:
        s, n = self.slots[slot], self.n_match
        s.n_draft_last = 0
        if len(tokens) < n:
            return []
        if s.i_last + CHUNK < len(tokens):
            for i in range(s.i_last, len(tokens) - n):
                self.add(tokens, i)
            s.i_last = len(tokens) - n
        chain = tokens[len(tokens) - n + 1:] + [sampled]
        for i in range(self.n_max):
            nxt = self.table.get(self.idx(chain, i))
            if nxt is None:
                if i < self.n_min:
                    return []
                break
            chain.append(nxt)
        out = chain[n:]
        s.n_draft_last = len(out)
        return out

    def accept(self, slot: int, n_accepted: int) -> None:
        s = self.slots[slot]
        if s.n_draft_last <= 0:
            return
        if n_accepted / s.n_draft_last < LOW:
            s.n_low += 1
            if s.n_low >= LOW_RUN:
                self.table.clear()
                s.n_low, s.i_last = 0, 0
                self.resets += 1
        else:
            s.n_low = 0


def run(mod: NgramMod, slot: int, prompt: list[int], answer: list[int], n_predict: int, n_ctx: int,
        replay: bool) -> tuple[int, int]:
    """One request on `slot`: the draft tokens llama-server drafts and accepts while it generates `answer`."""
    mod.begin(slot, prompt)
    drafted = accepted = 0
    t = 1  # the prompt's first pick is sampled before any draft
    while t < len(answer):
        tokens = prompt + answer[:t - 1]
        room = min(n_ctx - len(tokens) - 2, n_predict - t - 1)
        if room <= 0:
            t += 1
            continue
        d = mod.draft(slot, tokens, answer[t - 1])[:room]
        if not d:
            t += 1
            continue
        drafted += len(d)
        m = 0
        while m < len(d) and t + m < len(answer) and d[m] == answer[t + m]:
            m += 1
        if replay and m < len(d):  # restored, the accepted tokens and the pick decoded again as a draft
            mod.accept(slot, m + 1)
            accepted += m
            t += m + 2
            continue
        mod.accept(slot, m)
        accepted += m
        t += m + 1
    return drafted, accepted


def predict(sizes: tuple[int, int, int], requests: list[dict[str, Any]], n_ctx: int,
            replay: bool) -> tuple[list[tuple[int, int]], int]:
    """Each request's (draft_n, draft_n_accepted), the requests [{slot, prompt, tokens, n_predict}] run one after
    another on a fresh server, and how often the table was emptied; sizes: ngram-mod's n-match, n-min, n-max."""
    mod = NgramMod(*sizes)
    counts = [run(mod, r["slot"], r["prompt"], r["tokens"], r["n_predict"], n_ctx, replay) for r in requests]
    return counts, mod.resets


def spec_type(a: list[str]) -> str | None:
    """The schedule's --spec-type value (a comma-separated list of speculators), or None."""
    return a[a.index("--spec-type") + 1] if "--spec-type" in a else None


def mod_sizes(a: list[str]) -> tuple[int, int, int] | None:
    """ngram-mod's n-match, n-min and n-max where it is the schedule's only speculator with all three given."""
    names = [f"--spec-ngram-mod-{k}" for k in ("n-match", "n-min", "n-max")]
    if spec_type(a) != "ngram-mod" or not set(names) <= set(a):
        return None
    n_match, n_min, n_max = (int(a[a.index(k) + 1]) for k in names)
    return n_match, n_min, n_max


def mod_control(srv: Target, a: list[str], prompt: list[int], tokens: int, n_vocab: int,
                rng: np.random.Generator) -> list[dict[str, Any]] | Failure:
    """Requests one at a time on the freshly loaded server, for mod_problems: the prompt (answer A), the prompt
    and A (the table learns A), the prompt again (drafts that hold), each of A's n-grams followed by a random token
    (the table learns wrong successors), the prompt twice more (drafts that fail until the table is emptied, then the
    slot's own tokens again). Each with what it was asked and what it answered."""
    sizes = mod_sizes(a)
    assert sizes is not None
    n = sizes[0]
    asked: list[dict[str, Any]] = []

    def ask(p: list[int]) -> list[int] | Failure:
        r = srv.call("complete", requests=[{"prompt": p, "n_predict": tokens}])
        if not r.ok:
            return r.failure
        got = r.data["results"][0]
        asked.append({"prompt": p, "n_predict": tokens, **{k: got[k] for k in (
            "tokens", "error", "id_slot", "draft_n", "draft_n_accepted") if k in got}})
        return got.get("tokens") or []

    first = ask(prompt)
    if isinstance(first, Failure):
        return first
    wrong = [t for i in range(len(first) - n + 1) for t in first[i:i + n] + [int(rng.integers(0, n_vocab))]]
    for p in (prompt + first, prompt, wrong, prompt, prompt):
        got = ask(p)
        if isinstance(got, Failure):
            return got
    return asked


def mod_judged(a: list[str], control: dict[str, Any] | None) -> tuple[list[str], dict[str, Any]]:
    """A promise of the schedule itself: each request of the one-at-a-time control (mod_control: `asked`, on slots
    of `n_ctx` tokens, a memory that must `replay` or not) drafted and had accepted as many tokens as ngram-mod's
    table, re-derived from the slots' tokens and the answers (predict), says. The problems, and what the control
    measured (each request's draft tokens and accepted ones, the table's resets predicted) for the schedule's row.
    An answer with an error is judged by the rounds' own promises, not here."""
    sizes, asked = mod_sizes(a), (control or {}).get("asked")
    if sizes is None or not asked or any("error" in r or "id_slot" not in r for r in asked):
        return [], {}
    want, resets = predict(sizes, [{"slot": r["id_slot"], **r} for r in asked], control["n_ctx"], control["replay"])
    got = [(r.get("draft_n", 0), r.get("draft_n_accepted", 0)) for r in asked]
    seen = {"ngram_mod": {"drafted": [g[0] for g in got], "accepted": [g[1] for g in got], "resets": resets}}
    for k, (have, (drafted, taken)) in enumerate(zip(got, want, strict=True)):
        if have != (drafted, taken):  # (the first: a table that went wrong drafts otherwise after it too)
            return [f"ngram-mod (n-match {sizes[0]}, n-min {sizes[1]}, n-max {sizes[2]}): request {k + 1} of "
                    f"{len(asked)} sent one at a time drafted {have[0]} tokens, {have[1]} accepted; its table, "
                    f"re-derived from the slots' tokens, drafts {drafted}, {taken} accepted"], seen
    return [], seen


def ngram_draft(tokens: list[int], sampled: int, n: int, m: int) -> tuple[int, int] | None:
    """Where llama.cpp's ngram-simple speculator finds a draft, and how long it is, or None: the slot's last n-1
    tokens and the token just sampled, searched for backwards in the slot's tokens (not at position 0 nor at the
    end), the m-gram after the match the draft (common_ngram_simple_draft, common/ngram-map.cpp)."""
    size = len(tokens)
    if size <= n + m + 1:
        return None
    pattern = tokens[size - n + 1:] + [sampled]
    for j in range(size - n - 1, 0, -1):
        if tokens[j:j + n] == pattern:
            copy = min(m, size - (j + n))
            return (j, copy) if copy >= n else None
    return None


def first_ngram_draft(prompt: list[int], answer: list[int], n: int, m: int) -> tuple[int, int, int] | None:
    """The first generated token at which ngram-simple must draft (the step, the match's position, the draft's
    length), or None. Until its first draft a slot drafts after every token it samples, from its tokens so far (the
    prompt and the tokens generated before it), while the answer has room for a draft (two tokens more to come)."""
    for i in range(len(answer) - 2):
        found = ngram_draft(prompt + answer[:i], answer[i], n, m)
        if found:
            return i, *found
    return None


def ngram_problems(a: list[str], seen: dict[str, Any]) -> list[str]:
    """A promise of the schedule itself: with ngram-simple the only speculator, an answer that reaches a token the
    speculator finds a draft for (first_ngram_draft: the pattern is in the slot's own tokens) was drafted for. An
    answer with no draft is a speculator that was not added or not given the slot's tokens; which drafts are accepted
    is the model's, and not judged. (a: the schedule's flags, on a server that verifies drafts.)"""
    if spec_type(a) != "ngram-simple" or \
            not {"--spec-ngram-simple-size-n", "--spec-ngram-simple-size-m"} <= set(a):
        return []
    n, m = (int(a[a.index(f"--spec-ngram-simple-size-{x}") + 1]) for x in "nm")
    out = []
    for name, got in seen["got"].items():
        found = first_ngram_draft(seen["sent"][name], got.get("tokens") or [], n, m)
        if found and not got.get("draft_n"):
            step, at, size = found
            out.append(f"{name}: ngram-simple (size-n {n}, size-m {m}) drafted nothing, though at generated token "
                       f"{step} its pattern stands at position {at} of the slot's tokens with {size} after it")
    return out
