"""`fuzz sampling`: sampling in the graph (backend samplers, llama_set_sampler) on several sequences of one context,
as a runtime that verifies drafts for several clients at once does (llama-server's `-bs`).

Per program a seeded draw: which sequences get llama-server's greedy chain as their backend sampler (the others
none), flash attention on or off, and steps of one batch each in which every sequence, in a drawn order, adds
nothing, one token, a draft of 2 to 5 tokens (every one an output: a draft verified) or a prompt chunk (its last
token an output). The context caps its outputs as llama-server's does for drafts of four (n_outputs_max_per_seq 5).
Every token sampled in the graph must be the greedy pick of the same batches decoded on a context without samplers
(the logits' argmax, end-of-generation tokens excluded as the chain's logit bias excludes them), wherever the same
batches split by sequence pick the same and its margin clears what that split moved the row (a control measured on
the model under test, row by row). A decode that kills the worker is a finding. `--program K` runs the K-th draw
alone (a bundle's).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fuzz.engine.case_oracle import CaseOracle
from fuzz.engine.contract import FINDING, PASS, UNSUPPORTED, Oracle, Report
from fuzz.engine.fleet import Fleet, fixture_header, load_full
from synth.inspect import inspect_file
from targets import Failure, Target

KINDS = ("none", "none", "one", "draft", "prompt")  # what a sequence adds to a step (none twice as likely)
DRAFT, CHUNK = (2, 5), (2, 12)  # a draft's tokens (all outputs), a prompt chunk's (its last an output)
PER_SEQ = DRAFT[1]  # outputs a sequence may have in one batch (n_outputs_max_per_seq)
NOISE_FACTOR = 4.0  # a pick is judged where its margin clears this many times what splitting the batches moves


@dataclass
class SamplingConfig:
    programs: int = 4
    program: int = -1  # only this drawn program (a bundle's); -1: 0 .. programs-1
    steps: int = 16  # batches a program decodes
    n_seq: int = 3
    seed: int = 0
    target: str = "llama-cpp"
    timeout: float = 120.0


@dataclass
class Program:
    index: int
    samplers: list[int]  # the sequences with a backend sampler
    flash_attn: bool
    kv_unified: bool  # one KV cache for every sequence, or one each (llama-server's -np)
    steps: list[list[tuple[int, list[int], str]]]  # per batch: (sequence, tokens, kind) in batch order


def draw(n_vocab: int, n_seq: int, seed: int, index: int, steps: int) -> Program:
    """The index-th program of a seed (its first k steps are the k-step program's: a shorter one is a prefix)."""
    rng = np.random.Generator(np.random.PCG64([seed, index]))
    samplers = sorted(int(s) for s in rng.choice(n_seq, int(rng.integers(1, n_seq + 1)), replace=False))
    flash, unified = bool(rng.random() < 0.5), bool(rng.random() < 0.5)
    out = []
    for _ in range(steps):
        parts = []
        for s in (int(x) for x in rng.permutation(n_seq)):
            kind = KINDS[int(rng.integers(0, len(KINDS)))]
            n = {"none": 0, "one": 1, "draft": int(rng.integers(DRAFT[0], DRAFT[1] + 1)),
                 "prompt": int(rng.integers(CHUNK[0], CHUNK[1] + 1))}[kind]
            if n:
                parts.append((s, [int(t) for t in rng.integers(0, n_vocab, n)], kind))
        out.append(parts)
    return Program(index, samplers, flash, unified, out)


def batch(parts: list[tuple[int, list[int], str]], pos: dict[int, int]) -> dict[str, Any]:
    """One decode request of a step's parts (positions advanced in `pos`)."""
    toks, seqs, where, outs = [], [], [], []
    for s, tokens, kind in parts:
        for j, t in enumerate(tokens):
            toks.append(t)
            seqs.append(s)
            where.append(pos.get(s, 0) + j)
            outs.append(kind == "draft" or j == len(tokens) - 1)
        pos[s] = pos.get(s, 0) + len(tokens)
    return {"tokens": toks, "seq": seqs, "pos": where, "logits": outs}


def program_steps(p: Program, split: bool = False) -> list[dict[str, Any]]:
    """The program's decode requests; split: each step's parts a batch of their own (the reference's control)."""
    pos: dict[int, int] = {}
    return [batch(part, pos) for parts in p.steps if parts for part in ([[x] for x in parts] if split else [parts])]


def outputs(steps: list[dict[str, Any]]) -> list[tuple[int, int]]:
    """Every output row of the decode requests, in order: (its batch, its sequence)."""
    return [(i, s) for i, st in enumerate(steps) for s, o in zip(st["seq"], st["logits"], strict=True) if o]


def greedy(row: np.ndarray, eog: list[int]) -> tuple[int, float]:
    """The pick of a logits row with the end-of-generation tokens excluded, and its margin over the next."""
    r = row.astype(np.float64).copy()
    r[eog] = -np.inf
    top = np.argsort(r)[::-1][:2]
    return int(top[0]), float(r[top[0]] - r[top[1]]) if len(top) > 1 else float("inf")


class Sampling(CaseOracle[Program]):
    name, unit, sections = "sampling", "programs", ("noise",)

    def __init__(self, fixture: Path, cfg: SamplingConfig):
        super().__init__(fixture, cfg)
        self.info = inspect_file(str(self.fixture))

    def open(self, fleet: Fleet) -> None:
        self.smp, self.ref = fleet.open(2, start=True)
        self.commit = load_full(self.ref, self.fixture).data.get("llama_cpp_commit")  # (a model it cannot load at
        # all is bad input; a context a program asks for that aborts is a finding)

    def params(self, p: Program, samplers: list[int] | None = None) -> dict[str, Any]:
        n = self.cfg.n_seq
        return {"n_ctx": 256 * n, "n_seq_max": n, "n_batch": 256, "n_ubatch": 256, "kv_unified": p.kv_unified,
                "flash_attn": p.flash_attn, "capture": False, "n_outputs_max": n * PER_SEQ,
                "n_outputs_max_per_seq": PER_SEQ, **({"samplers": samplers} if samplers else {})}

    def cases(self) -> list[Program]:
        cfg = self.cfg
        picks = [cfg.program] if cfg.program >= 0 else range(cfg.programs)
        return [draw(self.info.n_vocab, cfg.n_seq, cfg.seed, k, cfg.steps) for k in picks]

    def identity(self, p: Program) -> dict[str, Any]:
        return {"step": p.index, "samplers": p.samplers, "flash_attn": p.flash_attn, "kv_unified": p.kv_unified}

    def run_on(self, t: Target, p: Program, steps: list[dict[str, Any]], samplers: list[int] | None = None) -> Any:
        """The program's decode requests on a fresh context of the target (with samplers: each batch a decode call of
        its own, as a standalone reproducer makes it; without: one script)."""
        loaded = t.load(str(self.fixture), **self.params(p, samplers))
        if not loaded.ok:
            return loaded.failure
        if samplers and "sampler_eog" not in loaded.data:  # (a target that does not take load's `samplers`)
            return {"unsupported": "the target sets no backend samplers (its load reply has no sampler_eog)"}
        if samplers:
            results = []
            for step in steps:
                r = t.decode(**step)
                if not r.ok:
                    return r.failure
                results.append(r.data)
            return {"eog": loaded.data.get("sampler_eog", []), "results": results}
        r = t.script(steps)
        return r.failure if not r.ok else {"eog": [], "results": r.data["results"]}

    def observe(self, p: Program) -> dict[str, Any] | Failure:
        steps, parts = program_steps(p), program_steps(p, split=True)
        got = self.run_on(self.smp, p, steps, p.samplers)
        if isinstance(got, Failure) or "unsupported" in got:
            return got
        ref, split = self.run_on(self.ref, p, steps), self.run_on(self.ref, p, parts)
        if isinstance(ref, Failure) or isinstance(split, Failure):  # (the same target without samplers)
            return ref if isinstance(ref, Failure) else split
        order = outputs(steps)
        rows = [row for res in ref["results"] for row in res["logits"]]
        # the control: the same batches split by sequence; its rows matched by sequence and output number
        parted = {s: [] for _, s in order}
        for (_, s), row in zip(outputs(parts), (r for res in split["results"]
                                                                        for r in res["logits"]), strict=True):
            parted[s].append(row)
        moved, picks, seen_of = [], [], {s: 0 for s in parted}
        for (_, s), row in zip(order, rows, strict=True):
            other = parted[s][seen_of[s]]
            seen_of[s] += 1
            moved.append(float(np.max(np.abs(row.astype(np.float64) - other))))
            picks.append(greedy(other, got["eog"])[0])
        return {"sampled": [x for res in got["results"] for x in res.get("sampled", [])], "eog": got["eog"],
                "ref": rows, "order": order, "moved": moved, "split_picks": picks}

    def judge(self, p: Program, seen: dict[str, Any]) -> list[dict[str, Any]]:
        """Each row a sampler drew: its token the greedy pick where the batches split by sequence pick the same and
        the margin clears NOISE_FACTOR times what splitting moved that row (bit-exact on the fixtures: any margin)."""
        if "unsupported" in seen:
            return [{**self.identity(p), "status": UNSUPPORTED, "reason": seen["unsupported"]}]
        problems, judged = [], 0
        for (step, s), tok, row, moved, other in zip(seen["order"], seen["sampled"], seen["ref"], seen["moved"],
                                                     seen["split_picks"], strict=True):
            if s not in p.samplers:
                continue
            pick, margin = greedy(row, seen["eog"])
            bound = NOISE_FACTOR * moved
            clear = pick == other and margin > bound
            if tok is None or (tok != pick and clear):
                problems.append(f"batch {step}, sequence {s}: sampled {tok} in the graph, the greedy pick is {pick} "
                                f"(its margin {margin:.3g}, the bound {bound:.3g})")
            judged += clear
        row = {**self.identity(p), "outputs_sampled": sum(s in p.samplers for _, s in seen["order"]),
               "judged": judged, "moved": max(seen["moved"], default=0.0),
               "status": FINDING if problems else PASS}
        return [{**row, "reason": "; ".join(problems[:3]) + (f" (and {len(problems) - 3} more)"
                                                             if len(problems) > 3 else "")} if problems else row]

    def message(self, row: dict[str, Any]) -> str:
        kv = "one KV cache" if row["kv_unified"] else "a KV cache a sequence"
        return (f"program {row['step']} (backend samplers on sequences {row['samplers']}, flash attention "
                f"{'on' if row['flash_attn'] else 'off'}, {kv}): {row.get('reason')}")

    def record(self, results: list[dict[str, Any]]) -> dict[str, Any]:
        return {**fixture_header(self.fixture, self.info, target=self.cfg.target, commit=self.commit),
                "config": dict(self.cfg.__dict__), "noise": {"moved": max((r.get("moved", 0.0) for r in results),
                                                                           default=0.0)}}


def format_report(data: dict[str, Any]) -> str:
    lines = [f"sampling: {data['fixture']} ({data.get('arch', '?')})"]
    for r in data["results"]:
        what = r.get("reason") or (f"{r.get('outputs_sampled', 0)} tokens sampled in the graph, {r.get('judged', 0)} "
                                   f"clear of the bound" if r["status"] == PASS else "")
        lines.append(f"  program {r.get('step')} [{r['status']}] samplers {r.get('samplers')}: {what}")
    bad = [r for r in data["results"] if r["status"] != PASS]
    lines.append(f"{'FAIL' if bad else 'PASS'}: {len(bad)} of {len(data['results'])} programs")
    return "\n".join(lines)


def report(fixture: Path, cfg: SamplingConfig) -> Report:
    return Sampling(fixture, cfg).report()


def replay_of(cfg: dict[str, Any], finding: Any) -> dict[str, Any]:
    """A finding names its program (step): the bundle runs that draw alone."""
    return cfg if finding.step is None else {**cfg, "program": int(finding.step)}


# (known_key: a wrong token in the graph is a finding over code every family shares — llama-context's outputs and
# ggml-alloc's plan — matched by its status to a committed repro of scope "any", as the memory oracle's by cause)
ORACLE = Oracle(name="sampling", config=SamplingConfig, run=report, format=lambda rep: format_report(rep.native),
                replay_of=replay_of, shrink=(("steps", 1),), known_key=("status",),
                case_fields=("programs", "program", "steps", "n_seq", "seed"))
