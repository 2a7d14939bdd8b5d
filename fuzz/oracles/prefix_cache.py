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

from fuzz.engine.case_oracle import CaseOracle, finding_of
from fuzz.engine.contract import CRASH, FAILING, FINDING, NUMERICS, PASS, Finding, Oracle, Report
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


class PrefixCache(CaseOracle[str]):
    """On the skeleton (fuzz.engine.case_oracle): its cases are the passes — the concurrent rounds, then (one KV cache
    per slot) the rewind conversations from an erased slot, the same back to back, and the clients taking turns —
    each on a fresh server. A result row per request (its answer against the uncached reference) and per check of the
    server after a pass (slots idle, a prompt filling most of a slot still fits). A pass with a finding is run again
    on a fresh server before its findings are explained together (one control for several)."""

    name = "prefix-cache"
    unit = "passes"
    sections = ("schedule", "rounds", "noise", "rewinds", "clients")

    def __init__(self, fixture: Path, cfg: PrefixCacheConfig):
        super().__init__(fixture, cfg)
        self.info = inspect_file(str(self.fixture))
        self.sched = build_schedule(self.info.n_vocab, cfg.slots, cfg.rounds, cfg.seed)
        self.near_tie = NEAR_TIE
        self.noise: dict[str, Any] | None = None  # a unified layout's measured placement move (placement_noise)
        self.cold: dict[tuple[int, ...], dict[str, Any]] = {}  # a prompt sent → its uncached reference answer
        self.reference: dict[str, dict[str, Any]] | None = None  # the rounds' prompts' uncached answers, by name
        self.passes: dict[str, Any] = {}  # each pass's record (its first run): rounds, rewinds, clients
        self.wrong_alone: set[int] = set()  # the rewind conversations answered wrong from an erased slot

    # ---- the skeleton's parts ---------------------------------------------------------------------------------
    def open(self, fleet: Fleet) -> None:
        self.ref_t, self.srv = fleet.one(start=True), fleet.one(start=True)
        self.commit = need_server(self.srv, "prefix-cache").data.get("llama_cpp_commit")

    def cases(self) -> list[str]:
        # (one client at a time: where its prompt sits in a KV cache is not judged)
        return ["rounds"] if self.cfg.kv_unified else ["rounds", "rewinds", "serial", "clients"]

    def identity(self, case: str) -> dict[str, Any]:
        return {"pass": case}

    def observe(self, case: str) -> dict[str, Any]:
        """The pass on a fresh server: what was sent and answered, and the server's state after it; or the load
        that aborted (a crash under the configuration chosen here)."""
        try:
            if case == "rounds":
                if self.reference is None:
                    self.reference = self._reference(self.ref_t, self.sched)
                    if self.cfg.kv_unified:
                        self.measure_noise(self.srv, self.sched.prompts, self.reference)
                return self._schedule(self.srv, self.sched)
            if case == "clients":
                return self._clients(self.srv)
            return self._rewinds(self.srv, erase=case == "rewinds")
        except ServerCrash as e:
            return {"crash": str(e)}

    def judge(self, case: str, seen: dict[str, Any]) -> list[dict[str, Any]]:
        """Every answer against the uncached reference of its prompt (a near-tie is not judged); after the rounds,
        every slot idle and able to take a prompt filling most of its context. A conversation answered right from an
        erased slot but wrong back to back has its cause: something of the conversation before it."""
        if "crash" in seen:
            return [{"pass": case, "check": "load", "status": CRASH, "phase": "server-crash", "message": seen["crash"]}]
        rows = [self._judged(case, seen, got) for got in seen["answers"]]
        if case == "rewinds":
            self.wrong_alone = {r["conversation"] for r in rows if r["status"] != PASS}
        for r in rows:
            if case == "serial" and r.get("phase") == "rewind-diverged" and r["conversation"] not in self.wrong_alone:
                r["cause"] = {"kind": EARLIER, "detail": "the same conversation from an erased slot answers as "
                              "uncached: the slot carried something of the conversation before it (a context "
                              "checkpoint, a cached prompt's state) into this one"}
        for k, busy in seen.get("busy", {}).items():
            rows.append({"pass": case, "round": k, "check": "slots idle", **(
                {"status": FINDING, "phase": "leaked-slot", "message": f"slots {busy} still processing after round "
                 f"{k} ({len(self.sched.rounds[k])} requests, all answered)"} if busy else {"status": PASS})})
        rows += [{"pass": case, "check": "capacity", "status": CRASH if p.died else FINDING,
                  "phase": "server-crash" if p.died else "capacity", "message": f"after the rounds, {p.why}"}
                 for p in seen.get("capacity", [])]
        if seen.get("failed"):
            rows.append({"pass": case, "round": seen.get("round"), "status": CRASH, "phase": "server-crash",
                         "message": seen["failed"]})
        return rows

    def _judged(self, case: str, seen: dict[str, Any], got: dict[str, Any]) -> dict[str, Any]:
        """One request's row: its answer against its prompt's uncached reference."""
        name, tokens, answer = got["name"], got["tokens"], got["answer"]
        at = {"pass": case, "prompt": name, **{k: got[k] for k in ("round", "conversation") if k in got},
              "cache_n": answer.get("cache_n")}
        why = answer["error"] if "error" in answer else compare(self.cold[tuple(tokens)], answer, self.near_tie)
        if not why:
            return {**at, "status": PASS}
        kind = {"rounds": "", "clients": "clients-"}.get(case, "rewind-")
        if case == "rounds":
            said = f"{name}: {why}" if "error" in answer else f"{name} (slot {answer['id_slot']}, " \
                f"{answer['cache_n']} prompt tokens from the cache): {why}"
        else:
            n, shared = seen["sizes"][name]
            said = f"{got['where']} ({n} tokens, {shared} shared with the one before, {answer.get('cache_n')} from " \
                   f"the cache): {why}"
        failed = "error" in answer
        phase = f"{kind}failed" if failed and kind else "request-failed" if failed else f"{kind}diverged"
        return {**at, "status": FINDING, "phase": phase, "message": said,
                **({} if failed else {"answer": answer["tokens"], "tokens": tokens})}

    def same(self, row: dict[str, Any], again: list[dict[str, Any]]) -> bool:
        """A finding came back on a fresh server: the same kind, for the same request (a crash: wherever the
        server dies this time)."""
        return any(a["status"] in FAILING and a.get("phase") == row["phase"] and
                   (row["phase"] == "server-crash" or (a.get("round"), a.get("prompt")) ==
                    (row.get("round"), row.get("prompt"))) for a in again)

    def explain_all(self, case: str, seen: dict[str, Any], bad: list[dict[str, Any]]) -> None:
        """Not the prompt cache's doing: what a request was batched with or where it sat (the same round with the
        cache off), or the model's kernels at another batch shape (the prompt alone, uncached): numerics."""
        findings = [r for r in bad if r["status"] == FINDING]
        if case == "rounds":
            self.explain_rounds(self.ref_t, findings)
        self.explain_shapes(self.ref_t, findings)
        for r in findings:
            if r.get("cause") and r["cause"]["kind"] in NUMERICS_CAUSES:
                r["status"] = NUMERICS

    def done(self, rows: list[dict[str, Any]]) -> bool:
        """A server that aborts loading the model (under the configuration chosen here) ends the run."""
        return any(r.get("check") == "load" for r in rows)

    def message(self, r: dict[str, Any]) -> str:
        return f"{r['phase']}" + (f" in round {r['round']}" if r.get("round") is not None else "") + \
            f": {r['message']}" + (f"; cause: {r['cause']['kind']}" if r.get("cause") else "")

    def finding(self, row: dict[str, Any]) -> Finding:
        return finding_of(self.name, row, self.message(row), step=row.get("round"))

    def record(self, results: list[dict[str, Any]]) -> dict[str, Any]:
        findings = [r for r in results if r["status"] in FAILING]
        return {**fixture_header(self.fixture, self.info, target=self.cfg.target, commit=self.commit),
                "config": dict(self.cfg.__dict__), "schedule": self.sched.to_dict(),
                "rounds": self.passes.get("rounds", []), "rewinds": self.passes.get("rewinds", []),
                "clients": self.passes.get("clients", {}), "findings": findings,
                "numerics": [r for r in results if r["status"] == NUMERICS],
                **({"noise": self.noise} if self.noise else {}), "status": FINDING if findings else PASS}

    # ---- controls -------------------------------------------------------------------------------------------
    def explain_rounds(self, t: Target, findings: list[dict[str, Any]]) -> None:
        """A different answer the same round gives with the prompt cache off (each request computed afresh, in the
        same KV layout, up to UNCACHED_TRIES times) is not the cache's doing: what the request was batched with moved
        it, and on one KV cache for the slots where the sequence sat (deepseek3: DSA's indexer keeps tied keys by cell,
        a known upstream finding, corpora/repros/deepseek32-isolation-unified-kv). So is one that leaves the cold
        answer at or after a step where those cache-off answers already leave it (numerics decide from there on)."""
        cfg, sched, cold = self.cfg, self.sched, self.reference or {}
        diverged = [f for f in findings if f["phase"] == "diverged" and f.get("round") is not None]
        seen: dict[int, dict[str, set[tuple[int, ...]]]] = {k: {} for k in sorted({f["round"] for f in diverged})}
        for k in seen:
            names = sched.rounds[k]
            wanted = {(f["prompt"], tuple(f.get("answer") or ())) for f in diverged if f["round"] == k}
            for _ in range(UNCACHED_TRIES):  # (until every different answer of the round recurred)
                try:
                    self._load(t, slots=cfg.slots, cache_ram=0, kv_unified=cfg.kv_unified)
                except ServerCrash:  # (a control the server cannot run excuses nothing)
                    break
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
        for f in diverged:
            if f.get("answer") is None:
                continue
            controls = [list(a) for a in seen[f["round"]].get(f["prompt"], ())]
            why = numerics_step(cold[f["prompt"]], f["answer"], controls)
            if why:
                f["cause"] = {"kind": PLACEMENT if cfg.kv_unified else BATCHING,
                              "detail": f"round {f['round']} with the prompt cache off (every request computed afresh, "
                                        f"up to {UNCACHED_TRIES} tries) gives {f['prompt']} {why}: {where} moved it"}

    def explain_shapes(self, t: Target, findings: list[dict[str, Any]]) -> None:
        """A different answer the model's own kernels give the prompt uncached at another batch shape is not the
        cache's doing either: a cached prompt is computed in pieces (its prefix in an earlier request, with the tokens
        that request generated one at a time), the uncached reference in one ubatch, and a quantized model's kernels
        round a batch of one size otherwise than one of another (Gemma 3 270M Q4_K_M answers 13 of 60 rewind prompts
        otherwise at ubatch 1 or 7 than in one). Each diverged prompt not yet explained is computed once per
        SHAPE_UBATCHES on a one-slot server, the cache off; its finding is numerics where its answer is one of those,
        or they already leave the reference at or before its step. On the fixtures no shape moves a clear pick:
        nothing is excused there."""
        todo = [f for f in findings if f["phase"].endswith("diverged") and not f.get("cause")
                and f.get("tokens") is not None and f.get("answer") is not None and tuple(f["tokens"]) in self.cold]
        if not todo:
            return
        prompts = {str(i): f["tokens"] for i, f in enumerate(todo)}
        shaped: dict[int, dict[str, Any]] = {}
        try:
            for ub in SHAPE_UBATCHES:
                self._load(t, slots=1, cache_ram=0, n_ubatch=ub)
                shaped[ub] = cold_answers(t, self.fixture, prompts, self.cfg.tokens)
        except (ServerCrash, UserError):  # (a shape the server cannot run excuses nothing)
            return
        for i, f in enumerate(todo):
            ref = self.cold[tuple(f["tokens"])]
            whys = ((ub, numerics_step(ref, f["answer"], [shaped[ub][str(i)]["tokens"]])) for ub in SHAPE_UBATCHES)
            shape, why = next(((ub, w) for ub, w in whys if w), (0, None))
            if why:
                f["cause"] = {"kind": BATCHING,
                              "detail": f"the prompt alone with the cache off at ubatch {shape} gives {why}: the "
                                        f"model's kernels round by batch shape, and a cached prompt is computed in "
                                        f"other pieces than the uncached reference"}

    def measure_noise(self, t: Target, prompts: dict[str, list[int]], cold: dict[str, Any]) -> None:
        """One KV cache for all slots: answers are judged only where the cold margin clears NOISE_FACTOR × what
        placement moves them (placement_noise); a move that cannot be measured leaves NEAR_TIE."""
        cfg = self.cfg
        self.noise = placement_noise(t, self.fixture, prompts, cold, cfg.tokens, self.info.n_vocab, cfg.seed,
                                     2 * max(160, cfg.n_ctx // max(cfg.slots, 1)))
        self.near_tie = self.noise["near_tie"]

    # ---- the passes -----------------------------------------------------------------------------------------
    def _rewinds(self, t: Target, erase: bool = True) -> dict[str, Any]:
        """The rewind conversations on a fresh one-slot server with the host cache on, the slot erased between
        them (or not: back to back), one request after another: per conversation the prompts' lengths, what each
        shares with the one before, and the prompt tokens each took from the cache."""
        pass_name = "rewind" if erase else "serial"
        self._load(t, slots=1, cache_ram=self.cfg.cache_ram)
        convs = rewind_conversations(self.info.n_vocab, self.cfg.seed)
        sent, answers, failed = converse(t, convs, [(i, j) for i, c in enumerate(convs) for j in range(len(c))],
                                         self.cfg.tokens, pass_name, erase)
        if failed:
            if "cannot erase" in failed:
                raise UserError(f"{self.fixture}: {failed}")
            return {"answers": [], "failed": f"rewind conversations, {failed}"}
        out = [reuse(sent, answers, [n for n in sent if n.startswith(f"{pass_name}{i}.")]) for i in range(len(convs))]
        if erase:
            self.passes.setdefault("rewinds", out)
        self._cold(sent)
        sizes = {f"{pass_name}{i}.{j}": (c["lengths"][j], c["shared"][j]) for i, c in enumerate(out)
                 for j in range(len(c["lengths"]))}

        def turn(name: str) -> tuple[int, int]:
            i, j = name.removeprefix(pass_name).split("+")[0].split(".")
            return int(i), int(j)

        return {"sizes": sizes, "answers": [
            {"name": n, "tokens": sent[n], "answer": got, "conversation": turn(n)[0],
             "where": f"conversation {turn(n)[0]}" + ("" if erase else " (back to back)") + f", request {turn(n)[1]}"}
            for n, got in answers.items()]}

    def _clients(self, t: Target) -> dict[str, Any]:
        """The clients' conversations (client_conversations) taking turns on a fresh two-slot server with the host
        cache on, one request after another, then again with idle slots not cached (--no-cache-idle-slots: only a
        slot taken over for a new task saves its prompt to the host cache): what each request took from the cache
        and which slot served it, both runs in one record (a bump compares them request by request)."""
        convs, order = client_conversations(self.info.n_vocab, self.cfg.seed)
        out: dict[str, Any] = {"name": "clients taking turns on two slots", "order": [], "lengths": [],
                               "shared": [], "cache_n": [], "slots": []}
        answered: dict[str, tuple[list[int], dict[str, Any]]] = {}
        for prefix, args in (("client", []), ("idle-uncached client", ["--no-cache-idle-slots"])):
            self._load(t, slots=2, cache_ram=self.cfg.cache_ram, args=args)
            sent, answers, failed = converse(t, convs, order, self.cfg.tokens, prefix)
            if failed:
                return {"answers": [], "failed": f"clients taking turns, {failed}"}
            names = list(sent)
            for k, v in reuse(sent, answers, names).items():
                out[k] += v
            out["order"] += names
            answered.update({n: (sent[n], answers[n]) for n in names})
            self._cold(sent)
        self.passes.setdefault("clients", out)
        return {"sizes": {n: (out["lengths"][k], out["shared"][k]) for k, n in enumerate(out["order"])},
                "answers": [{"name": n, "tokens": p, "answer": got, "where": f"clients taking turns, {n}"}
                            for n, (p, got) in answered.items()]}

    def _cold(self, sent: dict[str, list[int]]) -> None:
        """The uncached reference of every prompt sent not yet answered uncached (each prompt's once, whichever
        pass sent it first)."""
        missing = {name: p for name, p in sent.items() if tuple(p) not in self.cold}
        if missing:
            self._load(self.ref_t, slots=1, cache_ram=0)
            for name, ref in cold_answers(self.ref_t, self.fixture, missing, self.cfg.tokens).items():
                self.cold[tuple(missing[name])] = ref

    def _load(self, t: Target, **params: Any) -> None:
        load_server(t, self.fixture, n_ctx=self.cfg.n_ctx, **params)

    def _reference(self, t: Target, sched: Schedule) -> dict[str, dict[str, Any]]:
        """Each prompt alone on a one-slot server with the cache off."""
        self._load(t, slots=1, cache_ram=0)
        answers = cold_answers(t, self.fixture, sched.prompts, self.cfg.tokens)
        self.cold.update({tuple(sched.prompts[n]): a for n, a in answers.items()})
        return answers

    def _schedule(self, t: Target, sched: Schedule) -> dict[str, Any]:
        """One run of every round on a fresh server: each request's answer, the slots still busy after each round,
        and (no slot left busy) what the capacity probe found."""
        cfg = self.cfg
        self._load(t, slots=cfg.slots, cache_ram=cfg.cache_ram, kv_unified=cfg.kv_unified)
        seen: dict[str, Any] = {"answers": [], "busy": {}}
        rounds = self.passes.setdefault("rounds", [])
        keep = not rounds  # (the pass's record is its first run's)
        for k, names in enumerate(sched.rounds):
            reqs = [{"prompt": sched.prompts[n], "n_predict": cfg.tokens} for n in names]
            r = t.call("complete", requests=reqs, concurrent=True)
            if not r.ok:
                return {**seen, "round": k, "failed": r.failure.message}
            seen["answers"] += [{"name": n, "tokens": sched.prompts[n], "answer": got, "round": k}
                                for n, got in zip(names, r.data["results"], strict=True)]
            busy = seen["busy"][k] = busy_slots(t)
            if keep:
                rounds.append({"round": k, "prompts": names, "busy_after": busy,
                               "cache_n": [got["cache_n"] for got in r.data["results"] if "error" not in got]})
        if not any(seen["busy"].values()):  # a leaked slot already explains a full server
            seen["capacity"] = capacity_problems(t, self.info.n_vocab, cfg.seed)
        return seen


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
        where = f"round {f['round']}, " if f.get("round") is not None else ""
        lines.append(f"  FINDING {f['phase']} ({where}reproduced={f.get('reproduced')}): {f['message']}")
    for f in rep.get("numerics", ()):
        where = "" if f.get("round") is None else f" (round {f['round']})"
        lines.append(f"  numerics, not the cache{where}: {f['message']}; {f['cause']['detail']}")
    lines.append(f"{rep['status']}: {len(rep['findings'])} findings")
    return "\n".join(lines)


# ---- the oracle contract ---------------------------------------------------------------------------------
def report(fixture: Path, cfg: PrefixCacheConfig) -> Report:
    return PrefixCache(fixture, cfg).report()


ORACLE = Oracle(name="prefix-cache", config=PrefixCacheConfig, run=report, format=lambda rep: format_report(rep.native),
                shrink=(("rounds", 1), ("tokens", 1), ("slots", 2)),
                case_fields=("slots", "rounds", "tokens", "n_ctx", "kv_unified", "seed"),
                known_key=("status", "phase", "cause"))
