"""`fuzz server-options`: llama-server under options drawn per schedule — the flags and request fields that change how
it keeps, copies and rolls back state, beyond the prompt cache the prefix-cache and radix oracles draw.

Per schedule a seeded draw of: speculative decoding (a draft model — the fixture itself, whose drafts the target
accepts, or the same family written with other weights, whose drafts it often rejects, so the slot rolls its memory
back, through a checkpoint where the memory cannot drop a suffix — and n-gram drafts of every kind the build offers,
sized to hit on the schedule's repeating prompt), several completions of one prompt (`n_cmpl`: child slots copy the
parent's state), the slots' context checkpoints and their spacing, the host prompt cache on or off, idle slots kept
or not, a full-size sliding-window cache, batches and ubatches smaller than a prompt, one to three slots. Then two
rounds of concurrent requests: fresh prompts (one random, one repeating a short motif, one branching off the first),
then second turns carrying the first answers, and the repeating prompt again. Every answer, every child completion
too, must equal the uncached reference (each prompt alone on a one-slot server with the cache off and no options):
token-exact wherever the reference's top-2 margin is clear. After each round every slot must be idle. The fixture
drafting for itself alone must have every draft accepted on an answer clear at every pick, and draft at all with no
probability floor (self_draft_problems); ngram-simple alone must draft where its pattern lookup matches the slot's
tokens (ngram_problems); ngram-mod alone first serves six requests one at a time (on its fresh table) whose draft
counts, drafted and accepted, must be what its table re-derived from the slots' tokens says (ngram_drafts). In some
schedules the server also serves embeddings (--embeddings, a pooling type): an /embedding sent beside each round's
completions must equal the same prompt's alone (embedding_problems). A schedule with a finding is observed once more
before it counts (reproduced or not); `--schedule K` runs the K-th draw alone (what a bundle replays, with its flags
as shrunk: `args`).
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from fuzz.engine.case_oracle import CaseOracle
from fuzz.engine.contract import FAILING, FINDING, NUMERICS, PASS, Oracle, Report
from fuzz.engine.fleet import Fleet, fixture_header, need_server
from fuzz.oracles.ngram_drafts import mod_control, mod_judged, mod_sizes, ngram_problems
from fuzz.oracles.server_answers import (
    NEAR_TIE,
    NOISE_FACTOR,
    UNCACHED_TRIES,
    ServerCrash,
    busy_slots,
    cold_answers,
    compare,
    load_server,
    moved,
    parted,
    placement_noise,
)
from synth.inspect import inspect_file
from synth.make import spec_of, write_fixture
from targets import Failure

# the speculative decoding a fixture can serve: a draft model or n-grams (EAGLE3, DFlash, DSpark and MTP need draft
# heads or next-token layers no fixture has: docs/coverage.md)
SPEC_TYPES = ("draft-simple", "ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")
DRAFTS = ("{self}", "{other}")  # the draft model: the fixture itself, or its family with other weights
BATCHING_RUNS = 2  # runs of three prompts at once that measure what batching moves an answer (batching_noise)
# the causes explain() gives (numerics), by KV layout
PLACEMENT, BATCHED = "shared KV cache, not the options", "batched with other slots, not the options"
CHECKPOINT = "a checkpoint another prompt left"  # a finding's cause (checkpoint_cause), still a finding
ROUNDS = (("random", "repeat", "branch"), ("random+", "repeat", "branch+"))  # + : the first turn and its answer, more
# an /embedding request sent in each round beside the completions, in about this share of the schedules with several
# slots, on a server loaded with --embeddings and one of these poolings; it must equal the same prompt's embedding
# alone on the idle server to within EMBED_NMSE of its own power (scale-free: a slot batched with a completion it must
# not share a batch with reads no embedding at all, 1.0)
EMBED_SHARE, POOLINGS, EMBED_TOKENS, EMBED_NMSE = 0.4, ("mean", "last", "cls"), 8, 1e-4


@dataclass
class ServerOptionsConfig:
    schedules: int = 4  # drawn option sets, each on a fresh server
    schedule: int = -1  # only this drawn schedule (a bundle's replay); -1: 0 .. schedules-1
    tokens: int = 12  # greedy tokens per request
    n_ctx: int = 1024
    kv_unified: bool = False  # one KV cache shared by the slots (--kv-unified)
    seed: int = 0
    target: str = "llama-server"
    timeout: float = 120.0
    args: list[str] | None = None  # the schedule's flags as given (a bundle's, shrunk) instead of the drawn ones
    first: int = 0  # the first schedule drawn (a lane's draws past schedules spent on known findings go on from there)


@dataclass
class Draw:
    """One schedule's options and fresh prompts. `args` hold DRAFTS placeholders for the draft models' paths."""
    index: int
    slots: int
    cache_ram: int
    args: list[str]
    n_cmpl: dict[str, int]  # a request's name → completions asked (absent: 1)
    prompts: dict[str, list[int]]  # the first round's prompts; a second turn is made from the answers

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def spec_args(rng: np.random.Generator, offered: list[str]) -> list[str]:
    """Speculative decoding among the types the build offers: a draft model in half the schedules, an n-gram kind in
    the others and beside a draft model in half of those, with sizes small enough to draft on short prompts
    (upstream's n-gram defaults look 12 to 24 tokens back)."""
    kinds = [k for k in SPEC_TYPES if k in offered]
    grams = [k for k in kinds if k.startswith("ngram-")]
    draft = "draft-simple" in kinds and (not grams or rng.random() < 0.5)  # a draft model in half the schedules
    names = (["draft-simple"] if draft else []) + \
        ([grams[int(rng.integers(0, len(grams)))]] if grams and (not draft or rng.random() < 0.5) else [])
    if not names:
        return []
    args = ["--spec-type", ",".join(names)]
    if "draft-simple" in names:
        n_max = int(rng.integers(1, 7))
        args += ["-md", DRAFTS[int(rng.integers(0, 2))], "--spec-draft-n-max", str(n_max),
                 "--spec-draft-n-min", str(int(rng.integers(0, min(2, n_max) + 1))),
                 "--spec-draft-p-min", ("0.0", "0.3")[int(rng.integers(0, 2))]]
        if rng.random() < 0.5:
            args.append("--no-spec-draft-backend-sampling")
    for kind in ("simple", "map-k", "map-k4v"):
        if f"ngram-{kind}" in names:
            args += [f"--spec-ngram-{kind}-size-n", str(int(rng.integers(1, 4))),
                     f"--spec-ngram-{kind}-size-m", str(int(rng.integers(2, 7))),
                     f"--spec-ngram-{kind}-min-hits", str(int(rng.integers(1, 3)))]
    if "ngram-mod" in names:
        lo = int(rng.integers(1, 3))
        args += ["--spec-ngram-mod-n-match", str(int(rng.integers(2, 5))), "--spec-ngram-mod-n-min", str(lo),
                 "--spec-ngram-mod-n-max", str(int(rng.integers(lo + 1, 9)))]
    return args


def draw(n_vocab: int, seed: int, index: int, offered: list[str], flags: set[str] | None) -> Draw:
    """The index-th schedule of a seed: the same options and prompts for the same build offer, whatever ran before.
    flags: the flags the build's --help names (None: take the pinned build's as given)."""
    rng = np.random.Generator(np.random.PCG64([seed, index]))

    def toks(n: int) -> list[int]:
        return [int(x) for x in rng.integers(0, n_vocab, n)]

    slots = int(rng.integers(1, 4))
    args = spec_args(rng, offered)
    args += ["-ctxcp", str((0, 1, 3, 32)[int(rng.integers(0, 4))]),
             "-cms", str((0, 4, 8192)[int(rng.integers(0, 3))])]
    if rng.random() < 0.3:
        args.append("--no-cache-idle-slots")
    if rng.random() < 0.3:
        args.append("--swa-full")
    if rng.random() < 0.5:  # a prompt in several ubatches: checkpoints mid-prompt, drafts beside other slots' tokens
        ub = (8, 16, 32)[int(rng.integers(0, 3))]
        args += ["-b", str((ub, 2 * ub, 256)[int(rng.integers(0, 3))]), "-ub", str(ub)]
    embed = np.random.Generator(np.random.PCG64([seed, index, 2]))  # (a stream of its own, as -bs's below)
    if slots > 1 and embed.random() < EMBED_SHARE:  # an /embedding beside completions
        args += ["--embeddings", "--pooling", POOLINGS[int(embed.integers(0, len(POOLINGS)))]]
    if np.random.Generator(np.random.PCG64([seed, index, 1])).random() < 0.3:  # (a stream of its own: the draws
        args.append("-bs")  # above stay the same) sampling in the graph: the context's output buffers laid out anew
    if flags is not None:  # a build without a flag is not drawn it (its value goes with it)
        args = [a for i, a in enumerate(args) if a in flags or (i and args[i - 1] in flags and not a.startswith("-"))]
    motif = toks(int(rng.integers(2, 6)))
    random = toks(int(rng.integers(8, 31)))
    repeat = (motif * 16)[:int(rng.integers(16, 29))] + toks(2)
    branch = random[:int(rng.integers(2, len(random)))] + toks(int(rng.integers(4, 9)))
    n_cmpl = {name: int(rng.integers(2, slots + 1)) for name in ("random", "repeat", "branch+")
              if slots > 1 and rng.random() < 0.4}
    return with_args(Draw(index, slots, (0, 64)[int(rng.integers(0, 2))], args, n_cmpl,
                          {"random": random, "repeat": repeat, "branch": branch, "motif": motif}), args)


def with_args(d: Draw, args: list[str]) -> Draw:
    """The draw with these flags (its prompts and slots kept): with --embeddings an embedding prompt, the random
    prompt's first tokens (within the smallest ubatch drawn: an embedding is computed in one)."""
    prompts = {k: v for k, v in d.prompts.items() if k != "embed"}
    if "--embeddings" in args:
        prompts["embed"] = d.prompts["random"][:EMBED_TOKENS]
    return replace(d, args=list(args), prompts=prompts)


def flag_spans(args: list[str]) -> list[tuple[int, int]]:
    """Each flag of a command line and the values after it, as [start, end) spans."""
    starts = [i for i, a in enumerate(args) if a.startswith("-")]
    return list(zip(starts, starts[1:] + [len(args)], strict=True))


class ServerOptions(CaseOracle[Draw]):
    name, unit, sections = "server-options", "schedules", ("drafts", "noise", "offered")

    def __init__(self, fixture: Path, cfg: ServerOptionsConfig):
        super().__init__(fixture, cfg)
        self.info = inspect_file(str(self.fixture))
        self.cold: dict[tuple[int, ...], dict[str, Any]] = {}  # a prompt → its uncached reference answer
        self.near_tie = NEAR_TIE
        self.noise: dict[str, Any] = {}  # what batching (and in one KV cache, placement) moves answers: not judged

    def open(self, fleet: Fleet) -> None:
        self.ref, self.srv = fleet.one(start=True), fleet.one(start=True)
        hello = need_server(self.srv, self.name).data
        self.commit = hello.get("llama_cpp_commit")
        self.offered = hello.get("spec_types", list(SPEC_TYPES))
        self.flags = set(hello["flags"]) if "flags" in hello else None
        self.drafts = {"{self}": str(self.fixture), "{other}": self.other_weights()}
        load_server(self.ref, self.fixture, slots=1, cache_ram=0, n_ctx=self.cfg.n_ctx)
        first = draw(self.info.n_vocab, self.cfg.seed, 0, self.offered, self.flags).prompts
        prompts = {k: first[k] for k in ROUNDS[0]}
        cold = cold_answers(self.ref, self.fixture, prompts, self.cfg.tokens)
        self.noise = {"batching": self.batching_noise(prompts, cold)}  # measured, not judged
        if self.cfg.kv_unified:  # where a sequence sits in the one cache moves its answer too
            self.noise.update(placement_noise(self.srv, self.fixture, prompts, cold, self.cfg.tokens,
                                              self.info.n_vocab, self.cfg.seed, self.cfg.n_ctx))
        self.near_tie = max(NEAR_TIE, self.noise.get("near_tie", NEAR_TIE), NOISE_FACTOR * self.noise["batching"])
        self.noise["near_tie"] = self.near_tie

    def batching_noise(self, prompts: dict[str, list[int]], cold: dict[str, Any]) -> float:
        """What decoding beside other slots' tokens moves an answer: the first draw's three prompts at once on two
        slots, the cache off, BATCHING_RUNS times; the largest |Δ logprob| of a top candidate against each one alone
        (picks are judged where the reference's margin clears NOISE_FACTOR × this). (Two slots: kimi-linear's
        llama-server aborts loading with three, corpora/repros/kimi-linear-radix-server-crash.)"""
        try:
            load_server(self.srv, self.fixture, slots=2, cache_ram=0, n_ctx=self.cfg.n_ctx,
                        kv_unified=self.cfg.kv_unified)
        except ServerCrash:  # (the schedules that load the same way report it as a finding)
            return 0.0
        worst = 0.0
        for _ in range(BATCHING_RUNS):
            reqs = [{"prompt": p, "n_predict": self.cfg.tokens, "cache_prompt": False} for p in prompts.values()]
            r = self.srv.call("complete", requests=reqs, concurrent=True)
            if r.ok:
                worst = max([worst] + [moved(cold[k], got) for k, got in zip(prompts, r.data["results"], strict=True)
                                       if "tokens" in got])
        return worst

    def other_weights(self) -> str:
        """The fixture's family written with the next seed (same vocabulary, other weights: a draft the target
        disagrees with); the fixture itself when synth did not write it (a real model)."""
        spec = spec_of(self.fixture)
        if spec is None:
            return str(self.fixture)
        out = Path(self.scope.enter_context(tempfile.TemporaryDirectory(prefix="server-options-"))) / "draft.gguf"
        write_fixture(replace(spec, seed=spec.seed + 1), out)
        return str(out)

    def argv(self, d: Draw) -> list[str]:
        """The draw's server flags, its draft-model placeholders (DRAFTS) made paths."""
        return [self.drafts.get(a, a) for a in d.args]

    def cases(self) -> list[Draw]:
        cfg = self.cfg
        picks = [cfg.schedule] if cfg.schedule >= 0 else range(cfg.first, cfg.first + cfg.schedules)
        drawn = [draw(self.info.n_vocab, cfg.seed, k, self.offered, self.flags) for k in picks]
        return drawn if cfg.args is None else [with_args(d, cfg.args) for d in drawn]

    def identity(self, d: Draw) -> dict[str, Any]:
        return {"step": d.index, "options": " ".join(d.args), "slots": d.slots, "cache_ram": d.cache_ram}

    def observe(self, d: Draw) -> dict[str, Any] | Failure:
        cfg = self.cfg
        try:
            load_server(self.srv, self.fixture, slots=d.slots, cache_ram=d.cache_ram, n_ctx=cfg.n_ctx,
                        kv_unified=cfg.kv_unified, args=self.argv(d))
        except ServerCrash as e:
            return Failure("crash", f"llama-server aborted loading with {' '.join(d.args)}: {e}", "load", e.params)
        mod: dict[str, Any] = {}  # ngram-mod alone: its one-at-a-time control first, on the fresh table
        if mod_sizes(d.args) and verifies_drafts(d):
            asked = mod_control(self.srv, d.args, d.prompts["random"], 2 * cfg.tokens, self.info.n_vocab,
                                np.random.Generator(np.random.PCG64([cfg.seed, d.index, 3])))
            if isinstance(asked, Failure):
                return asked
            mod = {"ngram_mod": {"asked": asked, "n_ctx": cfg.n_ctx if cfg.kv_unified else cfg.n_ctx // d.slots,
                                 "replay": self.info.is_recurrent or self.info.is_hybrid}}  # (a slot's context)
        seen = self.rounds(d)
        return seen if isinstance(seen, Failure) else {**self.with_cold(seen), **mod}

    def with_cold(self, seen: dict[str, Any]) -> dict[str, Any]:
        """What a run saw, with the uncached reference of every prompt it sent (each asked once per oracle run)."""
        missing = {k: p for k, p in seen["sent"].items() if tuple(p) not in self.cold}
        if missing:  # (a schedule observed again sends what it sent before)
            for k, ref in cold_answers(self.ref, self.fixture, missing, self.cfg.tokens).items():
                self.cold[tuple(missing[k])] = ref
        return {**seen, "cold": {k: self.cold[tuple(p)] for k, p in seen["sent"].items()}}

    def rounds(self, d: Draw, sent: dict[str, list[int]] | None = None) -> dict[str, Any] | Failure:
        """The schedule's rounds on the loaded server: each round's requests at once, a second turn carrying the
        first's answer; or, given what a run `sent`, those prompts again with the prompt cache off (a control)."""
        again = sent is not None
        sent = dict(sent or {})
        got: dict[str, dict[str, Any]] = {}
        busy: list[list[int]] = []
        embeds: dict[str, dict[str, Any]] = {}  # an /embedding beside each round's completions (not in a control)
        for r_i, names in enumerate(ROUNDS):
            reqs = [(f"round {r_i + 1}", {"prompt": d.prompts["embed"], "embed": True})] \
                if "embed" in d.prompts and not again else []
            for name in names:
                key = name if name not in got else f"{name}.again"
                base = name.rstrip("+")
                if not again:
                    sent[key] = d.prompts[base] if name == base else \
                        sent[base] + got[base].get("tokens", []) + d.prompts["motif"]
                n = d.n_cmpl.get(name, 1)
                # (the control asks each completion as a request of its own: no child copies a parent's state)
                reqs += [(key, {"prompt": sent[key], "n_predict": self.cfg.tokens, "cache_prompt": not again,
                                "n_cmpl": 1 if again else n}) for _ in range(n if again else 1)]
            r = self.srv.call("complete", requests=[q for _, q in reqs], concurrent=True)
            if not r.ok:
                return r.failure
            for (key, q), answer in zip(reqs, r.data["results"], strict=True):
                if q.get("embed"):
                    embeds[key] = answer
                elif key in got:  # (a control's further completion of the same prompt)
                    got[key].setdefault("more", []).append(answer)
                else:
                    got[key] = answer
            busy.append(busy_slots(self.srv))
        if embeds:  # the same prompt's embedding alone, the slots idle: what each round's must equal
            alone = self.srv.call("complete", requests=[{"prompt": d.prompts["embed"], "embed": True}])
            if not alone.ok:
                return alone.failure
            embeds["alone"] = alone.data["results"][0]
        return {"sent": sent, "got": got, "busy": busy, **({"embeddings": embeds} if embeds else {})}

    def explain(self, d: Draw, seen: dict[str, Any], row: dict[str, Any]) -> dict[str, Any]:
        """A different answer the same rounds give with no options at all — the prompt cache off, each completion a
        request of its own, every request computed afresh, up to UNCACHED_TRIES runs — is not the options' doing:
        what the request was batched with (and, in one KV cache for all slots, where its sequence sat) moved it, as
        the prefix-cache oracle explains its rounds; so is one that leaves the reference at or after a step where
        those answers already leave it."""
        wrong = row.get("diverged") or []
        if not wrong or any("tokens" not in w for w in wrong):
            return {}
        control: dict[str, list[list[int]]] = {}
        for _ in range(UNCACHED_TRIES):
            load_server(self.srv, self.fixture, slots=d.slots, cache_ram=0, n_ctx=self.cfg.n_ctx,
                        kv_unified=self.cfg.kv_unified)
            plain = self.rounds(d, seen["sent"])
            if isinstance(plain, Failure):
                return {}
            for name, g in plain["got"].items():
                control.setdefault(name, []).extend(a["tokens"] for a in completions(g) if "tokens" in a)
            if all(w["tokens"] in control.get(w["name"], []) for w in wrong):
                break

        def moved(w: dict[str, Any]) -> bool:
            ref = seen["cold"][w["name"]]
            k = parted(ref, {"tokens": w["tokens"]})
            steps = [j for j in (parted(ref, {"tokens": a}) for a in control.get(w["name"], [])) if j is not None]
            return w["tokens"] in control.get(w["name"], []) or (k is not None and bool(steps) and min(steps) <= k)
        if not all(moved(w) for w in wrong):
            return self.checkpoint_cause(d, seen)
        where = "where a sequence sits in the one KV cache and what it is batched with decide its tokens" \
            if self.cfg.kv_unified else "what a request is batched with (the other slots' tokens) decides its tokens"
        return {"status": NUMERICS, "cause": {
            "kind": PLACEMENT if self.cfg.kv_unified else BATCHED,
            "detail": f"the same rounds with no options, the prompt cache off and each completion a request of its "
                      f"own (every request computed afresh, up to {UNCACHED_TRIES} runs) leave the reference there "
                      f"too: {where}"}}

    def checkpoint_cause(self, d: Draw, seen: dict[str, Any]) -> dict[str, Any]:
        """A wrong answer the same rounds never give with the slots' context checkpoints off (-ctxcp 0; UNCACHED_TRIES
        runs, each with the cache and every other option as drawn) has its cause: a checkpoint — on recurrent, hybrid
        and sliding-window models a slot serving unrelated prompts in turn resumes one from a checkpoint another left
        (the upstream bug of corpora/repros/mamba-prefix-cache-rewind-diverged). It stays a finding, named."""
        if "-ctxcp" not in d.args or d.args[d.args.index("-ctxcp") + 1] == "0":
            return {}
        args = self.argv(d) + ["-ctxcp", "0"]
        for _ in range(UNCACHED_TRIES):
            load_server(self.srv, self.fixture, slots=d.slots, cache_ram=d.cache_ram, n_ctx=self.cfg.n_ctx,
                        kv_unified=self.cfg.kv_unified, args=args)
            off = self.rounds(d)
            if isinstance(off, Failure):
                return {}
            off = self.with_cold(off)
            if any("error" in a or compare(off["cold"][k], a, self.near_tie) for k, g in off["got"].items()
                   for a in completions(g)):
                return {}
        return {"cause": {"kind": CHECKPOINT, "detail": f"the same rounds with the slots' context checkpoints off "
                          f"(-ctxcp 0) answer as uncached in {UNCACHED_TRIES} runs: a slot resumed a prompt from a "
                          "checkpoint another prompt left (the upstream bug of corpora/repros/"
                          "mamba-prefix-cache-rewind-diverged)"}}

    def judge(self, d: Draw, seen: dict[str, Any]) -> list[dict[str, Any]]:
        problems: list[str] = []
        wrong: list[dict[str, Any]] = []  # the answers that left the reference (what explain() controls)
        for name, got in seen["got"].items():
            for c, answer in enumerate(completions(got)):
                who = name + (f" (completion {c + 1} of {1 + len(got['more'])})" if got.get("more") else "")
                ref = seen["cold"][name]
                why = answer["error"] if "error" in answer else compare(ref, answer, self.near_tie)
                if why:
                    problems.append(f"{who}: {why}{margin_at(ref, answer)}")
                    wrong.append({"name": name, "completion": c, **({"tokens": answer["tokens"]}
                                                                   if "tokens" in answer else {})})
        problems += [f"slots {b} still processing after round {k}" for k, b in enumerate(seen["busy"]) if b]
        problems += self_draft_problems(d, seen, self.near_tie) + embedding_problems(seen)
        mod_wrong, mod_seen = mod_judged(d.args, seen.get("ngram_mod"))
        problems += (ngram_problems(d.args, seen) if verifies_drafts(d) else []) + mod_wrong
        answers = [a for g in seen["got"].values() for a in completions(g)]
        row = {**self.identity(d), "n_cmpl": d.n_cmpl,
               "draft_n": sum(a.get("draft_n", 0) for a in answers),
               "draft_n_accepted": sum(a.get("draft_n_accepted", 0) for a in answers),
               "cache_n": sum(a.get("cache_n", 0) for a in answers),
               **({"embeddings": len(seen["embeddings"]) - 1} if seen.get("embeddings") else {}),  # (compared)
               **mod_seen,
               "status": FINDING if problems else PASS}
        return [{**row, "reason": "; ".join(problems), "diverged": wrong} if problems else row]

    def message(self, row: dict[str, Any]) -> str:
        return f"schedule {row['step']} ({row['options']}, {row['slots']} slots): {row.get('reason')}"

    def record(self, results: list[dict[str, Any]]) -> dict[str, Any]:
        cfg = self.cfg
        return {**fixture_header(self.fixture, self.info, target=cfg.target, commit=self.commit),
                "config": dict(cfg.__dict__),
                "noise": self.noise,
                "offered": list(self.offered),  # the speculative types the build's --help offers (a bump compares)
                "drafts": {"self": self.drafts["{self}"],
                           "other": "the fixture itself (not written by synth: no other weights of its family)"
                           if self.drafts["{other}"] == str(self.fixture) else "its family, seed + 1"}}


def completions(got: dict[str, Any]) -> list[dict[str, Any]]:
    """A request's answer and its further completions (n_cmpl's children, a control's requests of the same prompt)."""
    return [got, *got.get("more", [])]


def verifies_drafts(d: Draw) -> bool:
    """Whether the server can verify a draft at all: with --embeddings it reserves one output per sequence
    (server_output_limits, server-context.cpp:41-45), and with -bs the context's backend samplers are made for that
    many (llama-context.cpp:1311, 1758), so with both it drafts nothing (answers stay right; measured on every row's
    embeddings schedules: the same schedules draft with either flag alone)."""
    return not {"--embeddings", "-bs"} <= set(d.args)


def self_drafted(d: Draw) -> bool:
    """The schedule drafts with the fixture itself alone: draft-simple, no n-gram kind beside it, -md {self}."""
    a = d.args
    return "--spec-type" in a and a[a.index("--spec-type") + 1] == "draft-simple" and "-md" in a and \
        a[a.index("-md") + 1] == "{self}"


def clear(ref: dict[str, Any], near_tie: float) -> bool:
    """Whether every pick of the reference clears the near-tie margin (and is its listed top candidate)."""
    return len(ref.get("top", [])) >= len(ref["tokens"]) and all(
        len(top) < 2 or (top[0][1] - top[1][1] >= near_tie and int(top[0][0]) == tok)
        for tok, top in zip(ref["tokens"], ref["top"], strict=False))


def self_draft_problems(d: Draw, seen: dict[str, Any], near_tie: float) -> list[str]:
    """A promise of the schedule itself, no rule about models: a draft model that is the target's own weights drafts
    the target's own greedy picks, so on an answer that is the reference and clear at every pick the target must
    accept every draft token it was given (a rejection there is a speculator told the wrong count, a rollback that
    lost state, or drafts made from another context than the slot's); with no probability floor it must draft."""
    if not self_drafted(d) or not verifies_drafts(d):
        return []
    out = []
    answers = [a for g in seen["got"].values() for a in completions(g) if len(a.get("tokens", [])) > 1]
    if d.args[d.args.index("--spec-draft-p-min") + 1] == "0.0" and answers and \
            not sum(a.get("draft_n", 0) for a in answers):  # (no probability floor: it drafts at every step)
        out.append(f"the fixture drafting for itself with no probability floor drafted nothing in {len(answers)} "
                   "answers: speculative decoding did not run")
    for name, got in seen["got"].items():
        ref = seen["cold"][name]
        for answer in completions(got):
            drafted, taken = answer.get("draft_n", 0), answer.get("draft_n_accepted", 0)
            if "tokens" in answer and taken < drafted and answer["tokens"] == ref["tokens"] and clear(ref, near_tie):
                out.append(f"{name}: the fixture drafting for itself, {drafted - taken} of {drafted} draft tokens "
                           f"rejected on an answer that is the reference's, every pick clear")
    return out


def embedding_problems(seen: dict[str, Any]) -> list[str]:
    """A promise of the schedule itself: an /embedding sent beside completions equals the same prompt's embedding
    alone on the idle server, to within EMBED_NMSE of its own power. (llama-server batches a slot only with slots of
    its task's type: an embedding batched with a completion is computed with the context's embeddings off and comes
    back zeros.)"""
    embeds = dict(seen.get("embeddings") or {})
    alone = embeds.pop("alone", None)
    if alone is None:
        return []
    if "error" in alone or not alone.get("embedding"):
        return [f"the embedding alone: {alone.get('error', 'no vector')}"]
    ref = np.asarray(alone["embedding"], dtype=np.float64)
    power = float(np.sum(ref ** 2)) or 1.0
    out = []
    for when, got in embeds.items():
        if "error" in got or len(got.get("embedding", [])) != len(ref):
            out.append(f"the embedding sent beside the completions of {when}: {got.get('error', 'another size')}")
            continue
        nmse = float(np.sum((np.asarray(got["embedding"], dtype=np.float64) - ref) ** 2)) / power
        if not nmse <= EMBED_NMSE:
            out.append(f"the embedding sent beside the completions of {when} differs from the same prompt's alone: "
                       f"NMSE {nmse:.3g} (the bound: {EMBED_NMSE:g} of its power)")
    return out


def margin_at(ref: dict[str, Any], got: dict[str, Any]) -> str:
    """The reference's top-2 margin where got leaves it ("" where it does not, lists no two candidates, or got is an
    error without tokens)."""
    k = parted(ref, got) if "tokens" in got else None
    top = ref["top"][k] if k is not None and k < len(ref["top"]) else []
    return f" (the reference's margin there {top[0][1] - top[1][1]:.2g})" if len(top) >= 2 else ""


def format_report(rep: dict[str, Any]) -> str:
    lines = [f"server-options {rep['fixture']}: arch {rep['arch']}, "
             f"{'one KV cache for all slots' if rep['config']['kv_unified'] else 'one KV cache per slot'}"]
    for r in rep["results"]:
        drafted = f"{r.get('draft_n_accepted', 0)}/{r.get('draft_n', 0)} drafts accepted"
        lines.append(f"  schedule {r['step']} [{r['status']}] {r['slots']} slots, host cache {r['cache_ram']} MiB, "
                     f"{r['options']}: {drafted}, {r.get('cache_n', 0)} prompt tokens from the cache"
                     + (f"; {r['reason']}" if r.get("reason") else ""))
    noise = rep.get("noise") or {}
    if noise:
        lines.append(f"  batching moves answers by {noise['batching']:.2g}"
                     + (f", placement in the one KV cache by {noise['placement']:.2g}"
                        if noise.get("placement") is not None else "")
                     + f": picks at margins below {noise['near_tie']:.2g} not judged")
    bad = sum(r["status"] in FAILING for r in rep["results"])
    lines.append(f"{'FINDING' if bad else 'PASS'}: {bad} of {len(rep['results'])} schedules")
    return "\n".join(lines)


def report(fixture: Path, cfg: ServerOptionsConfig) -> Report:
    return ServerOptions(fixture, cfg).report()


def replay_of(cfg: dict[str, Any], finding: Any) -> dict[str, Any]:
    """A finding names its schedule (step) and its flags: the bundle runs that draw alone, with those flags given."""
    if finding.step is None:
        return cfg
    options = (finding.detail or {}).get("options") if isinstance(finding.detail, dict) else None
    return {**cfg, "schedule": int(finding.step), **({"args": options.split()} if isinstance(options, str) else {})}


def reduce_config(cfg: dict[str, Any]) -> list[dict[str, Any]]:
    """Smaller schedules to try: the given flags with one flag (and its values) left out."""
    args = cfg.get("args") or []
    return [{**cfg, "args": args[:a] + args[b:]} for a, b in flag_spans(args)]


ORACLE = Oracle(name="server-options", config=ServerOptionsConfig, run=report,
                format=lambda rep: format_report(rep.native), replay_of=replay_of, shrink=(("tokens", 2),),
                reduce=reduce_config,
                case_fields=("schedules", "schedule", "tokens", "n_ctx", "kv_unified", "seed", "args"))

