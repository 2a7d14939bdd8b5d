"""`fuzz prefix-cache`: llama-server's prompt (prefix) cache under concurrent inserts — the seed's H1 shape.

A seeded radix of prompts (a trunk, branches off it, a leaf off a branch) is sent in rounds of concurrent
requests, each round holding at least one duplicate pair (two slots inserting the same prefix at once). Every
answer must equal the uncached reference (a one-slot server, cache off): token-exact wherever the reference's
top-2 margin is clear (a near-tie is noted, not judged). After every round every slot must be idle again (a
slot still busy is a leaked record), and at the end a prompt needing most of the context must still fit.
A finding is replayed on a fresh server before it is reported (reproduced or not), then told apart from the
model's own numerics by controls run uncached on the same server (explain, explain_shapes): the same round with the
prompt cache off (what a request is batched with moves its answer), and the prompt alone at other batch shapes (a
quantized model's kernels round a one-row batch otherwise than a many-row one, and a cached prompt is computed in
pieces). No bound calibrated on the fixtures decides it; the model under test shows its own.

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
from typing import Any

import numpy as np

from fuzz.engine.configs import check_config
from fuzz.engine.contract import CRASH, FINDING, NUMERICS, PASS, Finding, Oracle, Report, make_report
from fuzz.engine.fleet import Fleet, fixture_header, need_server
from fuzz.oracles.conversations import client_conversations, converse, reuse, rewind_conversations
from fuzz.oracles.server_answers import (
    NEAR_TIE,
    UNCACHED_TRIES,
    ServerCrash,
    busy_slots,
    capacity_problems,
    cold_answers,
    compare,
    crashes_loading,
    load_server,
    noise_line,
    numerics_step,
    placement_noise,
)
from synth.errors import UserError
from synth.inspect import inspect_file
from targets import Target

EARLIER = "state of an earlier conversation"  # a back-to-back rewind wrong only after another conversation
PLACEMENT = "shared KV cache, not the prompt cache"  # one KV cache for all slots: where a sequence sits moved it
BATCHING = "batching, not the prompt cache"  # what a request was batched with, or in what pieces, moved it
NUMERICS_CAUSES = (PLACEMENT, BATCHING)  # causes that make a divergence numerics
# the batch shapes a diverged prompt is computed at uncached: every ubatch up to 16, and 32. A quantized model's
# answers move with the ubatch's size in no order a smaller set covers (Gemma 3 270M Q4_K_M: 4, 6, 12 and 32 each
# move a prompt 1, 7 and 16 do not), and a cached prompt's pieces have any size
SHAPE_UBATCHES = (*range(1, 17), 32)


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
    tokens: list[int] | None = None  # diverged: the prompt sent
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
                self.explain(ref_t, sched, reference, findings)  # (not the cache: batching, placement)
                self.explain_shapes(ref_t, findings)
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
        """A different answer the same round gives with the prompt cache off (each request computed afresh, in the
        same KV layout, up to UNCACHED_TRIES times) is not the cache's doing: what the request was batched with moved
        it, and on one KV cache for the slots where the sequence sat (deepseek3: DSA's indexer keeps tied keys by cell,
        a known upstream finding, corpora/repros/deepseek32-isolation-unified-kv). So is one that leaves the cold
        answer at or after a step where those cache-off answers already leave it (numerics decide from there on)."""
        cfg = self.cfg
        rounds = sorted({f.round for f in findings if f.kind == "diverged" and f.round is not None})
        seen: dict[int, dict[str, set[tuple[int, ...]]]] = {k: {} for k in rounds}
        for k in rounds:
            names = sched.rounds[k]
            wanted = {(str(f.prompt), tuple(f.answer or ())) for f in findings if f.kind == "diverged" and f.round == k}
            for _ in range(UNCACHED_TRIES):  # (until every different answer of the round recurred)
                self._load(t, slots=cfg.slots, cache_ram=0, kv_unified=cfg.kv_unified)
                reqs = [{"prompt": sched.prompts[n], "n_predict": cfg.tokens, "cache_prompt": False} for n in names]
                r = t.call("complete", requests=reqs, concurrent=True)
                if not r.ok:
                    break
                for n, got in zip(names, r.data["results"], strict=True):
                    if "error" not in got:
                        seen[k].setdefault(n, set()).add(tuple(got["tokens"]))
                if all(a in seen[k].get(n, ()) for n, a in wanted):
                    break
        where = "where the sequence sits in the one KV cache and what it is batched with" if cfg.kv_unified else \
            "what the request is batched with"
        for f in findings:
            if f.kind != "diverged" or f.round not in seen or f.prompt is None or f.answer is None:
                continue
            why = numerics_step(cold[f.prompt], f.answer, [list(a) for a in seen[f.round].get(f.prompt, ())])
            if why:
                f.cause = {"kind": PLACEMENT if cfg.kv_unified else BATCHING,
                           "detail": f"round {f.round} with the prompt cache off (every request computed afresh, up "
                                     f"to {UNCACHED_TRIES} tries) gives {f.prompt} {why}: {where} moved it"}

    def explain_shapes(self, t: Target, findings: list[ServerFinding]) -> None:
        """A different answer the model's own kernels give the prompt uncached at another batch shape is not the
        cache's doing either: a cached prompt is computed in pieces (its prefix in an earlier request, with the tokens
        that request generated one at a time), the uncached reference in one ubatch, and a quantized model's kernels
        round a batch of one size otherwise than one of another (Gemma 3 270M Q4_K_M answers 13 of 60 rewind prompts
        otherwise at ubatch 1 or 7 than in one). Each diverged prompt not yet explained is computed once per
        SHAPE_UBATCHES on a one-slot server, the cache off; its finding is numerics where its answer is one of those,
        or they already leave the reference at or before its step. On the fixtures no shape moves a clear pick:
        nothing is excused there."""
        todo = [f for f in findings if f.kind.endswith("diverged") and f.cause is None and f.tokens is not None
                and f.answer is not None and tuple(f.tokens) in self.cold]
        if not todo:
            return
        prompts = {str(i): f.tokens for i, f in enumerate(todo)}
        shaped: dict[int, dict[str, Any]] = {}
        try:
            for ub in SHAPE_UBATCHES:
                self._load(t, slots=1, cache_ram=0, n_ubatch=ub)
                shaped[ub] = cold_answers(t, self.fixture, prompts, self.cfg.tokens)
        except (ServerCrash, UserError):  # (a shape the server cannot run excuses nothing)
            return
        for i, f in enumerate(todo):
            ref = self.cold[tuple(f.tokens)]
            whys = ((ub, numerics_step(ref, f.answer or [], [shaped[ub][str(i)]["tokens"]])) for ub in SHAPE_UBATCHES)
            shape, why = next(((ub, w) for ub, w in whys if w), (0, None))
            if why:
                f.cause = {"kind": BATCHING,
                           "detail": f"the prompt alone with the cache off at ubatch {shape} gives {why}: the "
                                     f"model's kernels round "
                                     f"by batch shape, and a cached prompt is computed in other pieces than the "
                                     f"uncached reference"}

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
                                              answer=got.get("tokens"), tokens=sent[name]))
        return findings

    def _load(self, t: Target, **params: Any) -> None:
        load_server(t, self.fixture, n_ctx=self.cfg.n_ctx, **params)

    def _reference(self, t: Target, sched: Schedule) -> dict[str, dict[str, Any]]:
        """Each prompt alone on a one-slot server with the cache off."""
        self._load(t, slots=1, cache_ram=0)
        answers = cold_answers(t, self.fixture, sched.prompts, self.cfg.tokens)
        self.cold.update({tuple(sched.prompts[n]): a for n, a in answers.items()})
        return answers

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
                                                  answer=got["tokens"], tokens=sched.prompts[name]))
            busy = busy_slots(t)
            if busy:
                findings.append(ServerFinding("leaked-slot", k, f"slots {busy} still processing after round {k} "
                                        f"({len(names)} requests, all answered)"))
            rounds.append({"round": k, "prompts": names, "cache_n": reused, "busy_after": busy})
        if not any(f.kind == "leaked-slot" for f in findings):  # a leaked slot already explains a full server
            findings += [ServerFinding("server-crash" if p.died else "capacity", None, f"after the rounds, {p.why}")
                         for p in capacity_problems(t, self.info.n_vocab, cfg.seed)]
        return findings, rounds


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
        where = "" if f["round"] is None else f" (round {f['round']})"
        lines.append(f"  numerics, not the cache{where}: {f['message']}; {f['cause']['detail']}")
    lines.append(f"{rep['status']}: {len(rep['findings'])} findings")
    return "\n".join(lines)




# ---- the oracle contract ---------------------------------------------------------------------------------
def report(fixture: Path, cfg: PrefixCacheConfig) -> Report:
    pc = PrefixCache(fixture, cfg)
    data = pc.run()
    found = {f["round"] for f in data["findings"]}
    explained = {f["round"] for f in data["numerics"]}
    results = [{**r, "status": FINDING if r["round"] in found else NUMERICS if r["round"] in explained else PASS}
               for r in data["rounds"]]
    def said(f: dict[str, Any]) -> str:
        return f"{f['kind']}" + (f" in round {f['round']}" if f["round"] is not None else "") + f": {f['message']}" \
            + (f"; cause: {f['cause']['kind']}" if f.get("cause") else "")

    findings = [Finding(oracle="prefix-cache", status=CRASH if f["kind"] == "server-crash" else FINDING,
                        phase=f["kind"], step=f["round"], reproduced=f["reproduced"], detail=f, cause=f["cause"],
                        message=said(f)) for f in data["findings"]]
    numerics = [Finding(oracle="prefix-cache", status=NUMERICS, phase=f["kind"], step=f["round"],
                        reproduced=f["reproduced"], cause=f["cause"], detail=f, message=said(f))
                for f in data["numerics"]]
    return make_report("prefix-cache", fixture, data, results=results, findings=findings, numerics=numerics,
                       extra=("schedule", "noise", "rewinds", "clients"))


ORACLE = Oracle(name="prefix-cache", config=PrefixCacheConfig, run=report, format=lambda rep: format_report(rep.native),
                shrink=(("rounds", 1), ("tokens", 1), ("slots", 2)),
                case_fields=("slots", "rounds", "tokens", "n_ctx", "kv_unified", "seed"),
                known_key=("status", "phase", "cause"))
