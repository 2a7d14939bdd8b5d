"""`fuzz prefix-cache`: llama-server's prompt (prefix) cache under concurrent inserts — the seed's H1 shape.

A seeded radix of prompts (a trunk, branches off it, a leaf off a branch) is sent in rounds of concurrent
requests, each round holding at least one duplicate pair (two slots inserting the same prefix at once). Every
answer must equal the uncached reference (a one-slot server, cache off): token-exact wherever the reference's
top-2 margin is clear (a near-tie is noted, not judged). After every round every slot must be idle again (a
slot still busy is a leaked record), and at the end a prompt needing most of the context must still fit.
A finding is replayed on a fresh server before it is reported (reproduced or not).

Then one client's conversations that go back (rewind_conversations), one request after another on a one-slot
server, the slot erased between conversations: a prompt, then the same prompt cut back with new tokens after it,
around the tiny fixtures' sliding windows and the server's context checkpoints, where a restore decides what is
reused. Every answer must equal the uncached reference too, and how many prompt tokens each request took from the
cache is recorded: with one client that count is deterministic, so a bump compares it across two builds
(fuzz.certify.bump: a candidate that reuses less broke). Then three clients taking turns on two slots with the host
cache on (fuzz.oracles.conversations), one request at a time: their answers judged and their reuse compared the same
way — which slot a request gets and what the host cache saves and loads back decide it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from fuzz.engine.configs import check_config
from fuzz.engine.contract import CRASH, FINDING, NUMERICS, PASS, Finding, Oracle, Report, make_report
from fuzz.engine.fleet import Fleet, fixture_header, need_server
from fuzz.oracles.conversations import client_conversations, converse, reuse, rewind_conversations
from synth.errors import UserError
from synth.inspect import inspect_file
from targets import Target

NEAR_TIE = 1e-3  # logprob margin below which a greedy pick is not judged
NOISE_FACTOR = 4.0  # one KV cache for all slots: picks are judged where the margin exceeds this × the measured move
EARLIER = "state of an earlier conversation"  # a back-to-back rewind wrong only after another conversation
NUMERICS_CAUSES = ("shared KV cache, not the prompt cache",)  # causes that make a divergence numerics
UNCACHED_TRIES = 8  # runs of a round with the prompt cache off, at most, that may show an answer is not the cache's


@dataclass
class PrefixCacheConfig:
    slots: int = 4
    rounds: int = 4
    tokens: int = 8  # greedy tokens per request (the server's n_predict)
    n_ctx: int = 1024
    cache_ram: int = 64  # MiB of host memory for cached prompts
    kv_unified: bool = False  # one KV cache shared by the slots (--kv-unified), as llama-server has without -np
    seed: int = 0
    target: str = "llama-server"
    timeout: float = 120.0


@dataclass
class ServerFinding:
    kind: str  # diverged | leaked-slot | request-failed | capacity | server-crash
    round: int | None
    message: str
    reproduced: bool | None = None
    prompt: str | None = None  # diverged: the prompt's name
    answer: list[int] | None = None  # diverged: what the server answered
    cause: dict[str, Any] | None = None  # diverged, and not the prompt cache's doing (PrefixCache.explain)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class Schedule:
    prompts: dict[str, list[int]]  # name → tokens
    rounds: list[list[str]]  # each round: prompt names sent at once

    def to_dict(self) -> dict[str, Any]:
        return {"prompts": self.prompts, "rounds": self.rounds}


def build_schedule(n_vocab: int, slots: int, rounds: int, seed: int) -> Schedule:
    rng = np.random.Generator(np.random.PCG64(seed))

    def toks(n: int) -> list[int]:
        return [int(x) for x in rng.integers(0, n_vocab, n)]

    trunk = toks(24)
    prompts = {"trunk": trunk}
    for b in range(3):
        prompts[f"branch{b}"] = trunk + toks(8)
    prompts["leaf"] = prompts["branch0"] + toks(6)
    names = list(prompts)
    plan = []
    for r in range(rounds):
        dup = names[int(rng.integers(0, len(names)))]
        rest = [names[int(i)] for i in rng.integers(0, len(names), max(0, slots + (r % 2) - 2))]
        # the H1 shape: two slots insert the same prompt at once (and on odd rounds one request waits for a slot)
        order = [dup, dup, *rest]
        rng.shuffle(order)
        plan.append(order)
    return Schedule(prompts, plan)


class PrefixCache:
    def __init__(self, fixture: Path, cfg: PrefixCacheConfig):
        check_config(cfg)
        self.fixture = Path(fixture)
        self.cfg = cfg
        self.info = inspect_file(str(self.fixture))
        self.near_tie = NEAR_TIE
        self.noise: dict[str, Any] | None = None  # a unified layout's measured placement move (placement_noise)
        self.cold: dict[tuple[int, ...], dict[str, Any]] = {}  # a rewind prompt → its uncached reference answer

    def run(self) -> dict[str, Any]:
        cfg = self.cfg
        sched = build_schedule(self.info.n_vocab, cfg.slots, cfg.rounds, cfg.seed)
        with Fleet(cfg.target, cfg.timeout) as fleet:
            ref_t, srv = fleet.one(start=True), fleet.one(start=True)
            hello = need_server(srv, "prefix-cache")
            try:
                reference = self._reference(ref_t, sched)
                if cfg.kv_unified:
                    self.measure_noise(srv, sched.prompts, reference)
                findings, rounds = self._schedule(srv, sched, reference)
                rewinds: list[dict[str, Any]] = []
                clients: dict[str, Any] = {}
                if not cfg.kv_unified:  # (one client at a time: where its prompt sits in a KV cache is not judged)
                    rewinds, more = self._rewinds(srv, ref_t)
                    findings += more + self._back_to_back(srv, ref_t, more)
                    clients, more = self._clients(srv, ref_t)
                    findings += more
            except ServerCrash as e:  # loading aborted: a crash under the configuration chosen here, tried twice
                findings = [ServerFinding("server-crash", None, str(e),
                                          reproduced=crashes_loading(srv, self.fixture, e.params))]
                rounds, rewinds, clients = [], [], {}
            else:
                if findings:  # a finding must reproduce on a fresh server before it counts as one
                    again, _ = self._schedule(srv, sched, reference)
                    if any(f.kind.startswith("rewind") for f in findings):
                        again += self._rewinds(srv, ref_t)[1] + self._rewinds(srv, ref_t, erase=False)[1]
                    if any(f.kind.startswith("clients") for f in findings):
                        again += self._clients(srv, ref_t)[1]
                    for f in findings:  # (a crash: wherever the server dies this time)
                        f.reproduced = any(g.kind == f.kind and (f.kind == "server-crash" or
                                                                 (g.round, g.prompt) == (f.round, f.prompt))
                                           for g in again)
                if cfg.kv_unified:  # where a sequence sat may explain a different answer: not the cache
                    self.explain(ref_t, sched, reference, findings)
        numerics = [f for f in findings if f.cause and f.cause["kind"] in NUMERICS_CAUSES]
        findings = [f for f in findings if f not in numerics]
        return {**fixture_header(self.fixture, self.info, target=cfg.target, commit=hello.data.get("llama_cpp_commit")),
                "config": dict(cfg.__dict__),
                "schedule": sched.to_dict(), "rounds": rounds, "rewinds": rewinds, "clients": clients,
                "findings": [f.to_dict() for f in findings],
                "numerics": [f.to_dict() for f in numerics],
                **({"noise": self.noise} if self.noise else {}), "status": FINDING if findings else PASS}

    def explain(self, t: Target, sched: Schedule, cold: dict[str, dict[str, Any]],
                findings: list[ServerFinding]) -> None:
        """A different answer the same round gives with the prompt cache off (on one KV cache for the slots, each
        request computed afresh, up to UNCACHED_TRIES times) is not the cache's doing: where the sequence sat and
        what it was batched with moved it (deepseek3: DSA's indexer keeps tied keys by cell, a known upstream finding,
        corpora/repros/deepseek32-isolation-unified-kv). So is one that leaves the cold answer at or after a step
        where those cache-off answers already leave it (placement decides from there on). The rest stay findings."""
        cfg = self.cfg
        rounds = sorted({f.round for f in findings if f.kind == "diverged" and f.round is not None})
        seen: dict[int, dict[str, set[tuple[int, ...]]]] = {k: {} for k in rounds}
        for k in rounds:
            names = sched.rounds[k]
            wanted = {(str(f.prompt), tuple(f.answer or ())) for f in findings if f.kind == "diverged" and f.round == k}
            for _ in range(UNCACHED_TRIES):  # (until every different answer of the round recurred)
                self._load(t, slots=cfg.slots, cache_ram=0, kv_unified=True)
                reqs = [{"prompt": sched.prompts[n], "n_predict": cfg.tokens, "cache_prompt": False} for n in names]
                r = t.call("complete", requests=reqs, concurrent=True)
                if not r.ok:
                    break
                for n, got in zip(names, r.data["results"], strict=True):
                    if "error" not in got:
                        seen[k].setdefault(n, set()).add(tuple(got["tokens"]))
                if all(a in seen[k].get(n, ()) for n, a in wanted):
                    break
        for f in findings:
            if f.kind != "diverged" or f.round not in seen or f.prompt is None or f.answer is None:
                continue
            ref = cold[f.prompt]
            answers = seen[f.round].get(f.prompt, set())
            k = parted(ref, {"tokens": f.answer})
            moves = [j for j in (parted(ref, {"tokens": list(a)}) for a in answers) if j is not None]
            if tuple(f.answer) in answers:
                f.cause = {"kind": "shared KV cache, not the prompt cache",
                           "detail": f"round {f.round} with the prompt cache off (every request computed afresh, "
                                     f"up to {UNCACHED_TRIES} tries) answers {f.prompt} the same: where the "
                                     f"sequence sits in the one KV cache and what it is batched with moved it"}
            elif k is not None and moves and min(moves) <= k:
                f.cause = {"kind": "shared KV cache, not the prompt cache",
                           "detail": f"round {f.round} with the prompt cache off already leaves the cold answer of "
                                     f"{f.prompt} at step {min(moves)} (this one at step {k}): from there on where "
                                     f"the sequence sits in the one KV cache decides its tokens"}

    def measure_noise(self, t: Target, prompts: dict[str, list[int]], cold: dict[str, Any]) -> None:
        """One KV cache for all slots: answers are judged only where the cold margin clears NOISE_FACTOR × what
        placement moves them (placement_noise); a move that cannot be measured leaves NEAR_TIE."""
        cfg = self.cfg
        self.noise = placement_noise(t, self.fixture, prompts, cold, cfg.tokens, self.info.n_vocab, cfg.seed,
                                     2 * max(160, cfg.n_ctx // max(cfg.slots, 1)))
        self.near_tie = self.noise["near_tie"]

    def _back_to_back(self, t: Target, ref_t: Target, alone: list[ServerFinding]) -> list[ServerFinding]:
        """The rewind conversations again, back to back on the one slot (nothing erased between them: a server
        serving unrelated clients in turn). A wrong answer there in a conversation that answered right from an
        erased slot has its cause: something of the conversation before it."""
        wrong_alone = {f.prompt.split(".")[0].removeprefix("rewind") for f in alone if f.prompt}
        found = self._rewinds(t, ref_t, erase=False)[1]
        for f in found:
            if f.kind == "rewind-diverged" and f.prompt and \
                    f.prompt.split(".")[0].removeprefix("serial") not in wrong_alone:
                f.cause = {"kind": EARLIER, "detail": "the same conversation from an erased slot answers as uncached: "
                           "the slot carried something of the conversation before it (a context checkpoint, a "
                           "cached prompt's state) into this one"}
        return found

    def _rewinds(self, t: Target, ref_t: Target, erase: bool = True) \
            -> tuple[list[dict[str, Any]], list[ServerFinding]]:
        """The rewind conversations on a fresh one-slot server with the host cache on, the slot erased between
        them (or not: back to back), one request after another: per conversation the prompts' lengths, what each
        shares with the one before, and the prompt tokens each took from the cache; findings where an answer is not
        the uncached reference's (each prompt alone on a one-slot server, the cache off)."""
        pass_name = "rewind" if erase else "serial"
        self._load(t, slots=1, cache_ram=self.cfg.cache_ram)
        convs = rewind_conversations(self.info.n_vocab, self.cfg.seed)
        sent, answers, failed = converse(t, convs, [(i, j) for i, c in enumerate(convs) for j in range(len(c))],
                                         self.cfg.tokens, pass_name, erase)
        if failed:
            if "cannot erase" in failed:
                raise UserError(f"{self.fixture}: {failed}")
            return [], [ServerFinding("server-crash", None, f"rewind conversations, {failed}")]
        out = [reuse(sent, answers, [n for n in sent if n.startswith(f"{pass_name}{i}.")]) for i in range(len(convs))]
        return out, self._judge(ref_t, sent, answers, lambda i, j: f"conversation {i}"
                                + ("" if erase else " (back to back)") + f", request {j}",
                                {f"{pass_name}{i}.{j}": (c["lengths"][j], c["shared"][j])
                                 for i, c in enumerate(out) for j in range(len(c["lengths"]))}, "rewind")

    def _clients(self, t: Target, ref_t: Target) -> tuple[dict[str, Any], list[ServerFinding]]:
        """The clients' conversations (client_conversations) taking turns on a fresh two-slot server with the host
        cache on, one request after another: what each request took from the cache and which slot served it; findings
        where an answer is not the uncached reference's."""
        self._load(t, slots=2, cache_ram=self.cfg.cache_ram)
        convs, order = client_conversations(self.info.n_vocab, self.cfg.seed)
        sent, answers, failed = converse(t, convs, order, self.cfg.tokens, "client")
        if failed:
            return {}, [ServerFinding("server-crash", None, f"clients taking turns, {failed}")]
        names = list(sent)
        out = {"name": "clients taking turns on two slots", "order": names, **reuse(sent, answers, names)}
        return out, self._judge(ref_t, sent, answers, lambda i, j: f"clients taking turns, {names[i]}",
                                {n: (out["lengths"][k], out["shared"][k]) for k, n in enumerate(names)}, "clients",
                                by_order=True)

    def _judge(self, ref_t: Target, sent: dict[str, list[int]], answers: dict[str, dict[str, Any]], where,
               sizes: dict[str, tuple[int, int]], kind: str, by_order: bool = False) -> list[ServerFinding]:
        """Every answer against the uncached reference of its prompt (each prompt's once, whichever pass sent it
        first): a KIND-failed or KIND-diverged finding where it is not. where(i, j) names the request: its
        conversation and turn (by_order: its place in the order sent, j unused)."""
        missing = {name: p for name, p in sent.items() if tuple(p) not in self.cold}
        if missing:
            self._load(ref_t, slots=1, cache_ram=0)
            for name, ref in cold_answers(ref_t, self.fixture, missing, self.cfg.tokens).items():
                self.cold[tuple(missing[name])] = ref
        findings = []
        for k, (name, got) in enumerate(answers.items()):
            why = got["error"] if "error" in got else compare(self.cold[tuple(sent[name])], got, self.near_tie)
            if why:
                i, j = (k, 0) if by_order else (int(x) for x in name.lstrip("abcdefghijklmnopqrstuvwxyz")
                                                .split("+")[0].split("."))
                n, shared = sizes[name]
                findings.append(ServerFinding(f"{kind}-failed" if "error" in got else f"{kind}-diverged", None,
                                              f"{where(i, j)} ({n} tokens, {shared} shared with the one before, "
                                              f"{got.get('cache_n')} from the cache): {why}", prompt=name,
                                              answer=got.get("tokens")))
        return findings

    def _load(self, t: Target, **params: Any) -> None:
        load_server(t, self.fixture, n_ctx=self.cfg.n_ctx, **params)

    def _reference(self, t: Target, sched: Schedule) -> dict[str, dict[str, Any]]:
        """Each prompt alone on a one-slot server with the cache off."""
        self._load(t, slots=1, cache_ram=0)
        return cold_answers(t, self.fixture, sched.prompts, self.cfg.tokens)

    def _schedule(self, t: Target, sched: Schedule, reference: dict[str, dict[str, Any]]):
        """One run of every round on a fresh server; findings and a per-round summary."""
        cfg = self.cfg
        self._load(t, slots=cfg.slots, cache_ram=cfg.cache_ram, kv_unified=cfg.kv_unified)
        findings: list[ServerFinding] = []
        rounds = []
        for k, names in enumerate(sched.rounds):
            reqs = [{"prompt": sched.prompts[n], "n_predict": cfg.tokens} for n in names]
            r = t.call("complete", requests=reqs, concurrent=True)
            if not r.ok:
                findings.append(ServerFinding("server-crash", k, r.failure.message))
                return findings, rounds
            reused = []
            for name, got in zip(names, r.data["results"], strict=True):
                if "error" in got:
                    findings.append(ServerFinding("request-failed", k, f"{name}: {got['error']}"))
                    continue
                reused.append(got["cache_n"])
                why = compare(reference[name], got, self.near_tie)
                if why:
                    findings.append(ServerFinding("diverged", k, f"{name} (slot {got['id_slot']}, {got['cache_n']} "
                                                  f"prompt tokens from the cache): {why}", prompt=name,
                                                  answer=got["tokens"]))
            busy = busy_slots(t)
            if busy:
                findings.append(ServerFinding("leaked-slot", k, f"slots {busy} still processing after round {k} "
                                        f"({len(names)} requests, all answered)"))
            rounds.append({"round": k, "prompts": names, "cache_n": reused, "busy_after": busy})
        if not any(f.kind == "leaked-slot" for f in findings):  # a leaked slot already explains a full server
            findings += [ServerFinding("server-crash" if p.died else "capacity", None, f"after the rounds, {p.why}")
                         for p in capacity_problems(t, self.info.n_vocab, cfg.seed)]
        return findings, rounds


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


def crashes_loading(t: Target, fixture: Path, params: dict[str, Any]) -> bool:
    """Whether llama-server aborts loading the model again under the same parameters."""
    try:
        load_server(t, fixture, **params)
    except ServerCrash:
        return True
    return False


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
    out = []
    for s in r.data["slots"]:
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


def format_report(rep: dict[str, Any]) -> str:
    lines = [f"prefix-cache {rep['fixture']}: arch {rep['arch']}, {rep['config']['slots']} slots, "
             f"{len(rep['rounds'])} rounds of concurrent requests (duplicate pairs in every round)"]
    for r in rep["rounds"]:
        lines.append(f"  round {r['round']}: {', '.join(r['prompts'])}; prompt tokens from the cache {r['cache_n']}"
                     + (f"; BUSY after: {r['busy_after']}" if r["busy_after"] else ""))
    if rep.get("rewinds"):
        lines.append(f"  {len(rep['rewinds'])} rewind conversations (one client, one slot): prompt tokens from the "
                     f"cache {sum(sum(c['cache_n']) for c in rep['rewinds'])}")
    if rep.get("clients"):
        c = rep["clients"]
        lines.append(f"  {len(c['order'])} requests of clients taking turns on two slots: prompt tokens from the "
                     f"cache {c['cache_n']}")
    if rep.get("noise"):
        lines.append(noise_line(rep["noise"]))
    for f in rep["findings"]:
        where = f"round {f['round']}, " if f["round"] is not None else ""
        lines.append(f"  FINDING {f['kind']} ({where}reproduced={f['reproduced']}): {f['message']}")
    for f in rep.get("numerics", ()):
        lines.append(f"  numerics, not the cache (round {f['round']}): {f['message']}; {f['cause']['detail']}")
    lines.append(f"{rep['status']}: {len(rep['findings'])} findings")
    return "\n".join(lines)


def noise_line(noise: dict[str, Any]) -> str:
    """What a unified layout's placement moves answers by, and the margin below which picks are not judged."""
    move = "not measured" if noise["placement"] is None else f"{noise['placement']:.2g}"
    return (f"  one KV cache for all slots: placement moves answers by {move} ({noise['how']}); picks at margins "
            f"below {noise['near_tie']:.2g} not judged")




# ---- the oracle contract ---------------------------------------------------------------------------------
def report(fixture: Path, cfg: PrefixCacheConfig) -> Report:
    pc = PrefixCache(fixture, cfg)
    data = pc.run()
    found = {f["round"] for f in data["findings"]}
    explained = {f["round"] for f in data["numerics"]}
    results = [{**r, "status": FINDING if r["round"] in found else NUMERICS if r["round"] in explained else PASS}
               for r in data["rounds"]]
    findings = [Finding(oracle="prefix-cache", status=CRASH if f["kind"] == "server-crash" else FINDING,
                        phase=f["kind"], step=f["round"], reproduced=f["reproduced"], detail=f, cause=f["cause"],
                        message=f"{f['kind']}" + (f" in round {f['round']}" if f["round"] is not None else "")
                        + f": {f['message']}" + (f"; cause: {f['cause']['kind']}" if f.get("cause") else ""))
                for f in data["findings"]]
    numerics = [Finding(oracle="prefix-cache", status=NUMERICS, phase=f["kind"], step=f["round"],
                        reproduced=f["reproduced"], cause=f["cause"], detail=f,
                        message=f"{f['kind']} in round {f['round']}: {f['message']}; cause: {f['cause']['kind']}")
                for f in data["numerics"]]
    return make_report("prefix-cache", fixture, data, results=results, findings=findings, numerics=numerics,
                       extra=("schedule", "noise", "rewinds", "clients"))


ORACLE = Oracle(name="prefix-cache", config=PrefixCacheConfig, run=report, format=lambda rep: format_report(rep.native),
                shrink=(("rounds", 1), ("tokens", 1), ("slots", 2)),
                case_fields=("slots", "rounds", "tokens", "n_ctx", "kv_unified", "seed"),
                known_key=("status", "phase", "cause"))
