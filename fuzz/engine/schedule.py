"""Decode schedules: the token/position/sequence layout of each phase, shared by reference and chain runs.

A schedule is a list of steps (one llama_decode each). Every step outputs all rows (logits="all"), so no run
prunes rows in its last layer and reference and stages compute the same shapes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from synth.errors import UserError

PHASES = ("prefill", "decode", "batched")


@dataclass
class Step:
    tokens: list[int | str]  # ints, or "argmax@R" (greedy from the previous step's row R) in reference runs
    seq: list[int]
    pos: list[int]
    phase: str


@dataclass
class Schedule:
    """Two runs: `sequential` (seq 0: chunked prefill, then token-by-token decode) and `batched` (several
    sequences prefilled in one mixed batch, then one token per sequence per step)."""

    sequential: list[Step] = field(default_factory=list)
    batched: list[Step] = field(default_factory=list)
    n_seq: int = 1

    def runs(self) -> dict[str, list[Step]]:
        return {name: steps for name, steps in (("sequential", self.sequential), ("batched", self.batched)) if steps}


def prompt_tokens(seed: int, n: int, n_vocab: int) -> list[int]:
    rng = np.random.Generator(np.random.PCG64(seed))
    return [int(x) for x in rng.integers(0, n_vocab, n)]


def main_prompt(cfg: Any, n_vocab: int) -> list[int]:
    """An oracle's prompt: the token ids its config gives (`prompt`), else `prompt_len` tokens drawn from its seed."""
    if not cfg.prompt:
        return prompt_tokens(cfg.seed, cfg.prompt_len, n_vocab)
    bad = next((t for t in cfg.prompt if t >= n_vocab), None)
    if bad is not None:
        raise UserError(f"--prompt token {bad}: not in the fixture's vocabulary ({n_vocab} tokens)")
    return list(cfg.prompt)


def batch_width(n_seq: int, phases: tuple[str, ...]) -> int:
    """Sequences a context must hold for these phases (the batched phase's, else one)."""
    return n_seq if "batched" in phases else 1


def sequential_steps(prompt: list[int], chunk: int, n_decode: int, *, split_at: int | None = None,
                     seq: int = 0) -> list[Step]:
    """One sequence's run, the one builder every oracle uses: the prompt prefilled in chunks (restarting at
    split_at: a hand-off point, so no chunk spans it), then n_decode greedy steps, each taking the argmax of
    the previous step's last row."""
    n = len(prompt)
    bounds = [0, n] if split_at is None else [0, min(split_at, n), n]
    steps: list[Step] = []
    for lo, hi in zip(bounds, bounds[1:], strict=False):
        for i in range(lo, hi, chunk):
            j = min(i + chunk, hi)
            steps.append(Step(list(prompt[i:j]), [seq] * (j - i), list(range(i, j)), "prefill"))
    last = len(steps[-1].tokens) - 1 if steps else 0
    for d in range(n_decode):
        steps.append(Step([f"argmax@{last if d == 0 else 0}"], [seq], [n + d], "decode"))
    return steps


def build_schedule(*, n_vocab: int, prompt: list[int], chunk: int = 7, n_decode: int = 32, n_seq: int = 3,
                   batched_prompt_len: int = 12, batched_decode: int = 8, seed: int = 0,
                   phases: tuple[str, ...] = PHASES) -> Schedule:
    """prompt: the sequential run's (main_prompt); the batched phase's sequences draw their own from seed."""
    sched = Schedule(n_seq=batch_width(n_seq, phases))
    if "prefill" in phases or "decode" in phases:
        sched.sequential = sequential_steps(prompt, chunk, n_decode if "decode" in phases else 0)
    if "batched" in phases and n_seq > 1:
        prompts = [prompt_tokens(seed + 1 + s, batched_prompt_len, n_vocab) for s in range(n_seq)]
        toks, seqs, pos = [], [], []
        for s, p in enumerate(prompts):
            toks += p
            seqs += [s] * len(p)
            pos += list(range(len(p)))
        sched.batched.append(Step(toks, seqs, pos, "batched"))
        for k in range(batched_decode):
            rows = [s * batched_prompt_len + batched_prompt_len - 1 for s in range(n_seq)] if k == 0 \
                else list(range(n_seq))
            sched.batched.append(Step([f"argmax@{r}" for r in rows], list(range(n_seq)),
                                      [batched_prompt_len + k] * n_seq, "batched"))
    return sched
