"""`fuzz radix`: llama-server's prompt cache under concurrent operation schedules, as data, explored systematically.

A schedule is K clients, each a short list of operations on one seeded prompt tree — T (the trunk), B0 and B1
(branches off T), L (a leaf off B0), U (unrelated to all of them), or a tree drawn for the schedule (draw_tree:
prompts 0, 1, ... cut anywhere from each other, at or just before a prompt's end, around the sliding window) — and
an interleaving. Client i always runs on
slot i. Operations: `cP` complete prompt P with the cache on; `k` continue (the client's last completed prompt, its
answer and two more tokens: a second turn; after a restore, the conversation as it was saved); `xP` stream P and
disconnect after two tokens; `s`, `r`, `e` save, restore, erase the client's slot (llama-server's /slots actions).

The interleaving says when each operation arrives relative to the others' progress: a step `B` starts client B's
next operation now; `Bap` starts it once client A's current operation has streamed its first token (its prompt is
processed); `Bad` once A's current operation is done. A client's own next operation always waits for its previous
one. Steps are lazy (a wait appears only right before the start it orders), so two different scripts are two
different executions, and `interleavings()` yields every one of a schedule's exactly once.

The replay string holds everything: `r1:SEED:TOKENS:TRUNK:OPS/OPS:SCRIPT`, e.g. `r1:0:8:24:cT,s/cT:A.Bap.A` —
client A completes T and saves its slot, client B completes T once A's T has its first token, then A saves.
`fuzz radix --replay STRING FIXTURE` runs exactly that on a fresh server.

The oracle, per schedule on a fresh server: every answer token-exact with the cold run of its prompt (a one-slot
server with the cache off; near-ties as in prefix-cache); a disconnected stream's tokens a prefix of it; prompt
tokens reused at least what the schedule made reusable (REUSE_POLICY); afterwards every slot idle, the server's
/metrics consistent with what was sent, and every slot still able to take a prompt filling most of its context.
A finding is replayed from its string twice more on fresh servers before it is reported, and shrunk (fewer
clients, fewer operations, a shorter trunk, fewer tokens) under a fixed fingerprint.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fuzz.engine.case_oracle import CaseOracle
from fuzz.engine.contract import CRASH, FAILING, FINDING, NUMERICS, PASS, TIMEOUT, Finding, Oracle, Report
from fuzz.engine.fleet import Fleet, fixture_header, need_server
from fuzz.engine.progress import Progress
from fuzz.oracles.conversations import shared_prefix
from fuzz.oracles.radix_controls import explain as controls_explain
from fuzz.oracles.radix_schedules import (
    CANCEL_AFTER,
    STREAMED,
    Run,
    Schedule,
    Step,
    config_for,
    draw_tree,
    interleavings,
    letter,
    parse_plans,
    pct_events,
    prompt_tree,
    random_clients,
    reduce_config,
    script_of,
    tree_children,
    tree_names,
    tree_prompts,
)
from fuzz.oracles.server_answers import (
    NEAR_TIE,
    ServerCrash,
    busy_slots,
    capacity_problems,
    cold_answers,
    compare,
    load_server,
    noise_line,
    placement_noise,
)
from fuzz.oracles.server_checkpoints import judge_restores, metrics_problem, stale_message
from synth.errors import UserError
from synth.gguf_io import GGUFFile
from synth.inspect import inspect_file
from targets import Target

N_CTX_PER_SLOT = 160  # cells asked per slot (-c); llama.cpp pads each to 256, and the capacity probe reads that
# family-certify's prefix-cache lane: the H1 pair and a second turn; save, disconnect, restore, continue; a prompt
# moved into the host cache by an unrelated one and asked for again on its slot and on another
LANE_PLANS = "cT,k/cT,cB0;cT,s,cU,r,k/xB0;cT,cU,cT/cU,cT"
REUSE_POLICY = ("prompt tokens the server must take from its cache, per request, from what the client's own slot "
                "holds (its last prompt and answer, or what a restore reported restoring): on a model with only "
                "full attention, the common prefix (all but one token of an exact repeat); on any model without "
                "sliding-window layers, all of the slot's tokens when the prompt extends all of them (a second "
                "turn, a restore then continue); on sliding-window models nothing is promised (llama-server "
                "re-processes unless --swa-full). Reuse through the host prompt cache (--cache-ram) is counted, "
                "not promised. With a unified KV cache (--kv-unified, llama-server's layout when -np is not "
                "given) a completion that starts saves every idle slot to the host cache and clears it "
                "(--cache-idle-slots, on by default): nothing is promised from a slot's own tokens when another "
                "client's completion may have started between what filled the slot and this request — starts the "
                "schedule does not order by a wait reach the server in either order.")


@dataclass
class RadixConfig:
    clients: int = 2
    ops: int = 2
    mode: str = "exhaustive"  # exhaustive | pct
    budget: float = 20.0  # seconds of exploration; 0: no time limit (schedules, or the plans and limit, bound it)
    tokens: int = 8
    trunk: int = 24
    replay: str = ""  # one schedule's replay string: run exactly that
    plan: str = ""  # OPS/OPS[;OPS/OPS]: explore the interleavings of exactly these clients (else random ones)
    limit: int = 0  # schedules per plan (a seeded sample of its interleavings); 0: as many as the budget allows
    cache_ram: int = 64
    kv_unified: bool = False  # one KV cache shared by the slots (--kv-unified), as llama-server has without -np
    tree: str = "fixed"  # fixed: T, B0, B1, L, U from the trunk; drawn: a prompt tree drawn per schedule (draw_tree)
    schedules: int = 0  # stop after this many schedules (0: when the budget is spent)
    seed: int = 0
    target: str = "llama-server"
    timeout: float = 60.0
    # go on past a finding: every schedule is explored and each kind of finding reported once (a later schedule
    # with the same kinds is counted, not replayed), so one finding — an upstream bug already named — does not
    # end the exploration of the rest
    keep_going: bool = False


def drawn_trees(schedules: int, *, target: str = "llama-server", kv_unified: bool = False, tokens: int = 6,
                seed: int = 0, cache_ram: int = 64) -> RadixConfig:
    """The radix engine on prompt trees drawn per schedule (draw_tree, aimed at the slots' checkpoints): two random
    clients of three operations, PCT interleavings, counted (no time limit), going on past a finding — the lanes'
    and the campaign's drawn surface, with the host prompt cache on (cache_ram MiB: one slot's state and checkpoints
    handed to another) or off (0: a slot's checkpoints stay its own)."""
    return RadixConfig(tree="drawn", mode="pct", clients=2, ops=3, limit=2, schedules=schedules, budget=0.0,
                       tokens=tokens, target=target, kv_unified=kv_unified, seed=seed, cache_ram=cache_ram,
                       keep_going=True)


class Radix(CaseOracle[Schedule]):
    """On the skeleton (fuzz.engine.case_oracle): its cases are schedules, yielded as the exploration draws them
    until the budget, the schedule count or the plans end it. A schedule's run is its one row; a finding is run
    twice more from its replay string alone and reported only if all three agree (`reproduce_only`); with
    keep_going a later schedule with the findings of one already found is counted, not replayed or listed."""

    name = "radix"
    unit = "schedules"
    reproduce_only = True
    sections = ("explored", "again", "flaky", "reuse_policy", "noise")

    def __init__(self, fixture: Path, cfg: RadixConfig):
        super().__init__(fixture, cfg)
        if cfg.mode not in ("exhaustive", "pct"):
            raise UserError(f"--mode {cfg.mode!r}: use exhaustive or pct")
        if cfg.plan:
            parse_plans(cfg.plan)
        if not cfg.budget and not (cfg.schedules or cfg.plan or cfg.replay):
            raise UserError("--budget 0 (no time limit) needs --schedules N or --plan: nothing else ends the "
                            "exploration")
        if cfg.tree not in ("fixed", "drawn") or (cfg.tree == "drawn" and cfg.plan):
            raise UserError(f"--tree {cfg.tree!r}: fixed or drawn (a plan names the fixed tree's prompts)")
        self.info = inspect_file(str(self.fixture))
        self.fixed = Schedule.parse(cfg.replay) if cfg.replay else None
        kinds = {x.kind for x in self.info.layers}
        self.swa = any(x.swa for x in self.info.layers)
        gguf = GGUFFile(str(self.fixture))
        self.window = int(gguf.get("attention.sliding_window", 0) or 0) if self.swa else 0
        self.top_k = int(gguf.get("attention.indexer.top_k", 0) or 0)  # attention keeps each query's top-k keys (DSA)
        experts, used = (int(gguf.get(k, 0) or 0) for k in ("expert_count", "expert_used_count"))
        self.experts = (used, experts) if 0 < used < experts else None  # a router picks each token's top experts
        self.full_attention_only = not self.swa and kinds <= {"attention", "mlp"}
        self.refs: dict[tuple[int, int, int], dict[str, Any]] = {}  # (seed, tokens, trunk) → cold answers
        self.ref_t: Target | None = None
        self.srv: Target | None = None
        self.near_tie = NEAR_TIE
        self.noise: dict[str, Any] | None = None  # a unified layout's measured placement move (placement_noise)
        self.logged = False  # the server says which checkpoints it restores (the target's load: log_checkpoints)
        self.unlogged: str | None = None  # why its log cannot be judged (then not asked again in this run)

        self.unit = "schedules" if not cfg.budget else "s"  # (progress counts seconds under a time budget)
        self.explored = 0
        self.found: set[tuple[tuple[str, str], ...]] = set()  # the keys of the findings reported so far
        self.seen_again: list[str] = []  # keep_going: later schedules with the findings of one found (not replayed)

    # ---- the skeleton's parts ---------------------------------------------------------------------------------
    def open(self, fleet: Fleet) -> None:
        self.ref_t = fleet.one(spec="llama-server", start=True)  # (a mutant's reference is the real one)
        self.srv = fleet.one(start=True)
        self.commit = need_server(self.srv, "radix").data.get("llama_cpp_commit")
        self.t0 = time.perf_counter()

    def cases(self) -> Iterator[Schedule]:
        return self.schedules()

    def total(self, cases: Any) -> int:
        return 0 if self.fixed else self.cfg.schedules if not self.cfg.budget else int(self.cfg.budget)

    def checked(self, cases: Iterable[Schedule], progress: Progress) -> Iterator[tuple[Schedule, Any, list]]:
        """Schedules one after another until the replay, the schedule count or the time budget ends them (progress
        counts schedules, or seconds under a budget)."""
        cfg = self.cfg
        counted = not cfg.budget  # no time limit: the schedule count or the plans bound the exploration
        for sched in cases:
            self.explored += 1
            yield sched, *self.check(sched)
            progress.at(self.explored if counted else int(time.perf_counter() - self.t0))
            progress.working(f"{self.explored} schedules, {sched.replay}")
            if self.fixed or (not counted and time.perf_counter() - self.t0 > cfg.budget) \
                    or self.explored == cfg.schedules:
                return

    def observe(self, sched: Schedule) -> Run:
        return self.run_schedule(sched)

    def judge(self, sched: Schedule, run: Run) -> list[dict[str, Any]]:
        """The schedule's run as its row: its first finding's kind decides its status (the server died: crash; an
        operation hung: timeout)."""
        row = run.to_dict()
        if run.findings:
            kind = run.findings[0]["kind"]
            row["status"] = CRASH if kind == "server-crash" else TIMEOUT if kind == "hung" else FINDING
        return [row]

    def again(self, sched: Schedule, run: Run, bad: list[dict[str, Any]]) -> None:
        """Twice more from its replay string alone, on fresh servers: reproduced when all three runs find the same
        (kinds and operations). With keep_going, findings already found are counted, not replayed."""
        (row,) = bad
        if run.key in self.found:
            row["seen_before"] = True
            self.seen_again.append(sched.replay)
            return
        reruns = [self.run_schedule(Schedule.parse(sched.replay)) for _ in range(2)]
        row["reproduced"] = all(a.key == run.key for a in reruns)
        if not row["reproduced"]:
            row.update(first=run.findings, again=[a.findings for a in reruns])

    def explain(self, sched: Schedule, run: Run, row: dict[str, Any]) -> dict[str, Any]:
        """Why a reproduced divergence is not the prompt cache's (radix_controls): numerics, with its cause."""
        if row.get("seen_before"):
            return {}
        try:
            cause = controls_explain(self, run)
        except _Stop:  # a control's server aborted: nothing explained
            cause = None
        return {"cause": cause, "status": NUMERICS} if cause else {}

    def done(self, rows: list[dict[str, Any]]) -> bool:
        """A reproduced finding no control explains is found: the run ends there (keep_going: its kind is
        remembered and the exploration goes on). A finding that did not come back left no row (`flaky`)."""
        row = rows[0] if rows else {"status": PASS}
        if row["status"] not in FAILING or row.get("seen_before"):
            return False
        self.found.add(tuple((f["kind"], f["op"]) for f in row["findings"]))
        return not self.cfg.keep_going

    def listed(self, row: dict[str, Any]) -> bool:
        return not row.get("seen_before")

    def message(self, row: dict[str, Any]) -> str:
        x = row["findings"][0]
        return f"{x['kind']}: {x['message']} (replay {row['replay']})"

    def finding(self, row: dict[str, Any]) -> Finding:
        x = row["findings"][0]
        where = x["op"] if x["op"] != "-" else "schedule"  # the operation kind, or the whole schedule
        status = row["status"]
        return Finding(oracle="radix", status=status, phase=x["kind"], where=where,
                       reproduced=True if status != NUMERICS else row.get("reproduced", True),
                       message=self.message(row), fingerprint={"oracle": "radix", "status": status,
                                                               "phase": x["kind"], "where": where},
                       cause={"kind": "not the prompt cache", "detail": row["cause"]} if row.get("cause") else None,
                       detail={"replay": row["replay"], "findings": row["findings"]})

    def timing(self, wall: float) -> dict[str, float]:
        return {"seconds": round(wall, 3)}

    def record(self, results: list[dict[str, Any]]) -> dict[str, Any]:
        found = [r for r in results if r["status"] in FAILING and not r.get("seen_before")]
        return {**fixture_header(self.fixture, self.info, target=self.cfg.target, commit=self.commit),
                "config": dict(self.cfg.__dict__), "explored": self.explored, "runs": results,
                "finding": found[0] if found else None, "found": found, "again": self.seen_again,
                "flaky": [{"replay": r["replay"], "first": r["first"], "again": r["again"]} for r in self.unreproduced],
                "numerics": [{"replay": r["replay"], "findings": r["findings"], "cause": r["cause"]}
                             for r in results if r["status"] == NUMERICS],
                "reuse_policy": REUSE_POLICY, **({"noise": self.noise} if self.noise else {}),
                "status": FINDING if found else PASS}

    def schedules(self) -> Iterator[Schedule]:
        cfg = self.cfg
        if self.fixed:
            yield self.fixed
            return
        rng = np.random.Generator(np.random.PCG64(cfg.seed))
        seen: set[str] = set()
        drawn = cfg.tree == "drawn"
        trees = (draw_tree(rng, self.window, aim=True) if drawn else "" for _ in range(10_000))
        plans = ((t, c) for t, c in zip(trees, parse_plans(cfg.plan), strict=False)) if cfg.plan else \
            ((t, random_clients(rng, cfg.clients, cfg.ops, tree_names(t), tree_children(t))) for t in trees)
        for tree, clients in plans:
            if cfg.mode == "pct":
                scripts: Iterator[tuple[Step, ...]] = (script_of(clients, pct_events(clients, rng))
                                                       for _ in range(cfg.limit or 8))
            elif cfg.limit:  # a seeded sample of the interleavings, each at most once
                every = list(itertools.islice(interleavings(clients), 100_000))
                scripts = iter([every[i] for i in rng.permutation(len(every))[:cfg.limit]])
            else:
                scripts = interleavings(clients)
            for script in scripts:
                s = Schedule(cfg.seed, cfg.tokens, 0 if tree else cfg.trunk, clients, script, tree)
                if s.replay not in seen:
                    seen.add(s.replay)
                    yield s

    # ---- one schedule ---------------------------------------------------------------------------------
    def reference(self, sched: Schedule) -> dict[str, Any]:
        """The cold answers of the schedule's prompts, on a one-slot server with the cache off (continues are
        added as they are needed: `grow`)."""
        key = (sched.seed, sched.tokens, sched.trunk, sched.tree)
        if key not in self.refs:
            tree = tree_prompts(self.info.n_vocab, sched.seed, sched.tree) if sched.tree else \
                prompt_tree(self.info.n_vocab, sched.seed, sched.trunk)
            if not self.refs:
                self.serve(self.ref_t, slots=1, cache_ram=0)
            prompts = {n: tree[n] for n in sched.prompts}
            answers = cold_answers(self.ref_t, self.fixture, prompts, sched.tokens)
            self.refs[key] = {"prompts": prompts, "answers": answers, "tail": tree["tail"], "tokens": sched.tokens}
            if self.cfg.kv_unified and self.noise is None:  # (on the server each schedule reloads anyway)
                try:
                    self.noise = placement_noise(self.srv, self.fixture, prompts, answers, sched.tokens,
                                                 self.info.n_vocab, sched.seed, 2 * N_CTX_PER_SLOT)
                except ServerCrash as e:
                    raise _Stop("server_crash", str(e)) from None
                self.near_tie = self.noise["near_tie"]
        return self.refs[key]

    def grow(self, ref: dict[str, Any], name: str) -> None:
        """A continue of X is X, X's cold answer and two more tokens: its prompt and cold answer, once."""
        if name in ref["prompts"]:
            return
        if not name.endswith("+"):  # (Schedule.problem refuses a continue with nothing to continue)
            raise UserError(f"radix: {name!r} is neither a prompt of the tree nor a continue of one")
        self.grow(ref, name[:-1])
        prompt = ref["prompts"][name[:-1]] + ref["answers"][name[:-1]]["tokens"] + ref["tail"]
        ref["prompts"][name] = prompt
        ref["answers"].update(cold_answers(self.ref_t, self.fixture, {name: prompt}, ref["tokens"]))

    def serve(self, t: Target, **params: Any) -> dict[str, Any]:
        """A server that refuses the model is bad input; one that aborts loading it is a crash finding."""
        try:
            return load_server(t, self.fixture, n_ctx=N_CTX_PER_SLOT * params["slots"], **params)
        except ServerCrash as e:
            raise _Stop("server_crash", str(e)) from None

    def run_schedule(self, sched: Schedule, uncached: bool = False, kv_unified: bool | None = None) -> Run:
        """One run of the schedule on a fresh server. uncached: every request with the prompt cache off (computed
        afresh; slots and host cache act as always): what the same run answers without the cache's reuse.
        kv_unified: the KV layout, if not the lane's."""
        t = self.srv
        k = len(sched.clients)
        run = Run(sched)
        nxt = [0] * k
        current: list[str | None] = [None] * k
        last: list[str | None] = [None] * k  # each client's conversation: its last complete/continue's prompt
        kept: list[str | None] = [None] * k  # ... as it was at the client's last save (a restore goes back to it)
        ops: dict[str, dict[str, Any]] = {}
        ref: dict[str, Any] = {}
        try:
            ref = self.reference(sched)  # (a one-slot server that aborts loading: a crash finding too)
            self.logged = self.serve(t, slots=k, cache_ram=self.cfg.cache_ram, log_checkpoints=True,
                                     kv_unified=self.cfg.kv_unified if kv_unified is None else kv_unified
                                     ).get("log_checkpoints", False)
            for n, step in enumerate(sched.script):
                for c, point in step.waits:
                    self._await(current[c], point, ops, n)
                c = step.client
                if current[c] is not None:
                    self._await(current[c], "done", ops, n)
                op = sched.clients[c][nxt[c]]
                name = f"{letter(c)}{nxt[c]}"
                prompt = op.prompt if op.kind in ("complete", "cancel") else \
                    (f"{last[c]}+" if op.kind == "continue" else None)
                if op.kind in ("complete", "continue"):
                    last[c] = prompt
                elif op.kind == "save":
                    kept[c] = last[c]
                elif op.kind == "restore":
                    last[c] = kept[c]
                req = {"name": name, "kind": "complete" if op.kind == "continue" else op.kind, "slot": c,
                       "n_predict": sched.tokens if op.kind != "cancel" else sched.tokens + 24,
                       "after": CANCEL_AFTER, "file": f"client-{letter(c)}"}
                if prompt:
                    self.grow(ref, prompt)
                    req["prompt"] = ref["prompts"][prompt]
                    if uncached:
                        req["cache_prompt"] = False
                r = t.call("submit", **req)
                if not r.ok:
                    raise _Stop(r.failure.error_kind, r.failure.message)
                ops[name] = {"op": op, "client": c, "prompt": prompt, "step": n}
                current[c] = name
                nxt[c] += 1
            for name in current:
                if name is not None:
                    self._await(name, "done", ops, len(sched.script))
        except _Stop as e:
            run.findings.append({"kind": "server-crash" if e.kind == "server_crash" else
                                 "hung" if e.kind in ("op_timeout", "timeout") else "request-failed",
                                 "op": "-", "client": None, "message": e.message})
            return run
        self._judge(run, ops, ref)
        if not any(f["kind"] in ("server-crash", "request-failed") for f in run.findings):
            self._restores(run, ops, ref)  # (first: another prompt's state is why an answer diverged)
        if not run.findings:
            self._after(run, ops, ref)
        return run

    def _restores(self, run: Run, ops: dict[str, dict[str, Any]], ref: dict[str, Any]) -> None:
        """Every context checkpoint the server restored was made from the same first tokens as the prompt it
        served (server_checkpoints: the server's log against the prompts each slot was sent, in order)."""
        if not self.logged or self.unlogged:
            run.unjudged = self.unlogged or "the server does not say which checkpoints it restores (no trace log)"
            return
        sent: dict[int, list[tuple[str, list[int]]]] = {}
        for name, o in sorted(ops.items(), key=lambda kv: kv[1]["step"]):
            if o["op"].kind in STREAMED:
                sent.setdefault(o["client"], []).append((name, ref["prompts"][o["prompt"]]))
        r = self.srv.call("checkpoints", prompts=sum(map(len, sent.values())), timeout=5.0)
        if not (r.ok and r.data["complete"]):
            run.unjudged = self.unlogged = "the server's log did not say it began every prompt"
            return
        v = judge_restores(r.data["events"], sent, shared=self.cfg.cache_ram > 0)
        run.restores, run.unjudged = v.restores, v.unjudged
        stale = [{"kind": "stale-checkpoint", "op": ops[x["prompt"]]["op"].kind, "client": x["slot"],
                  "message": stale_message({**x, "prompt": f"{x['prompt']} ({ops[x['prompt']]['op'].code})",
                                            "source": f"{x['source']}'s prompt"})} for x in v.stale]
        run.findings[:0] = stale

    def _await(self, name: str | None, point: str, ops: dict[str, dict[str, Any]], step: int) -> None:
        """Wait for operation `name` to reach `point`. `known` (its first await): the step from which on the server
        had it — an operation started before that step may have reached the server before or after it."""
        if name is None:
            return
        ops[name].setdefault("known", step)
        if "result" in ops[name]:
            return
        r = self.srv.call("await", name=name, point=point, timeout=self.cfg.timeout / 2)
        if not r.ok:
            raise _Stop(r.failure.error_kind, f"{name} ({ops[name]['op'].code}): {r.failure.message}")
        if "result" in r.data:
            ops[name]["result"] = r.data["result"]

    def _judge(self, run: Run, ops: dict[str, dict[str, Any]], ref: dict[str, Any]) -> None:
        """Answers against the cold run; reuse against what the client's slot held."""
        held: dict[int, list[int] | None] = {}
        since: dict[int, dict[str, Any]] = {}  # the operation that put held[c] in client c's slot
        saved: dict[int, list[int] | None] = {}
        died = [(name, o) for name, o in sorted(ops.items(), key=lambda kv: kv[1]["step"])
                if o["result"].get("server_crash")]
        if died:  # the server aborted: one crash, whichever way each operation in flight saw it go
            name, o = died[0]
            run.findings.append({"kind": "server-crash", "op": o["op"].kind, "client": o["client"],
                                 "message": f"{name} ({o['op'].code}, slot {o['client']}): {o['result']['error']}"})
            return
        for name, o in sorted(ops.items(), key=lambda kv: kv[1]["step"]):
            op, c, got = o["op"], o["client"], o["result"]
            where = f"{name} ({op.code}{'=' + o['prompt'] if op.kind == 'continue' else ''}, slot {c})"
            run.results.append({"op": name, "code": op.code, **{k: v for k, v in got.items() if k != "top"}})
            if "error" in got:
                run.findings.append({"kind": "request-failed", "op": op.kind, "client": c,
                                     "message": f"{where}: {got['error']}"})
                continue
            if op.kind in STREAMED:
                want = ref["answers"][o["prompt"]]
                prompt = ref["prompts"][o["prompt"]]
                if op.kind == "cancel":  # judged as far as it streamed
                    n = min(len(got["tokens"]), len(want["tokens"]))
                    want, got = {**want, "tokens": want["tokens"][:n]}, {**got, "tokens": got["tokens"][:n]}
                why = compare(want, got, self.near_tie)
                if why:
                    run.findings.append({"kind": "diverged", "op": op.kind, "client": c, "prompt": o["prompt"],
                                         "tokens": got["tokens"],
                                         "message": f"{where}: {why} (cold run: {want['tokens']})"})
                if op.kind != "cancel":
                    if self.cfg.kv_unified and held.get(c) and cleared(o, since[c], ops):
                        held[c] = None
                    floor = self.floor(held.get(c, []), prompt)
                    run.reused += got["cache_n"]
                    run.promised += floor
                    if got["cache_n"] < floor:
                        source = "a restore" if o.get("restored") else "its last answer"
                        run.findings.append({"kind": "no-reuse", "op": op.kind, "client": c, "message":
                                             f"{where}: {got['cache_n']} prompt tokens from the cache, but the "
                                             f"slot held {len(held[c])} tokens (from {source}) of which this "
                                             f"{len(prompt)}-token prompt extends {floor}"})
                held[c], since[c] = (None if op.kind == "cancel" else prompt + want["tokens"][:-1]), o
            elif op.kind == "save":
                saved[c] = held.get(c, [])
            elif op.kind == "restore":
                back = saved.get(c)
                held[c] = back if back is not None and got["n_tokens"] == len(back) else None
                since[c] = o
                for later in ops.values():  # the next operation on this slot reads restored tokens
                    if later["client"] == c and later["step"] > o["step"]:
                        later["restored"] = True
                        break
            elif op.kind == "erase":
                held[c] = []

    def floor(self, held: list[int] | None, prompt: list[int]) -> int:
        """REUSE_POLICY: prompt tokens the server must reuse from the slot's own tokens."""
        if not held or self.swa:
            return 0
        lcp = shared_prefix(held, prompt)
        if self.full_attention_only:
            return min(lcp, len(prompt) - 1)
        return len(held) if lcp == len(held) and len(prompt) > len(held) else 0

    def _after(self, run: Run, ops: dict[str, dict[str, Any]], ref: dict[str, Any]) -> None:
        """Slots idle, /metrics consistent with what was sent, every slot still able to take a long prompt."""
        t = self.srv
        busy: list[int] = []
        cancels = any(o["op"].kind == "cancel" for o in ops.values())
        for _ in range(50 if cancels else 10):  # a disconnect is noticed at the server's next token: a moment
            busy = busy_slots(t)
            if not busy:
                break
            time.sleep(0.02)
        if busy:
            run.findings.append({"kind": "leaked-slot", "op": "-", "client": None, "message":
                                 f"slots {busy} still processing after every operation of the schedule finished"})
            return
        m = t.call("metrics")
        if m.ok:
            msg = metrics_problem(m.data["metrics"], ops, ref)
            if msg:
                run.findings.append({"kind": "metrics", "op": "-", "client": None, "message": msg})
        run.findings += [{"kind": "server-crash" if p.died else "capacity", "op": "-", "client": p.slot,
                          "message": f"after the schedule, {p.why}"}
                         for p in capacity_problems(t, self.info.n_vocab, run.schedule.seed)]


def cleared(z: dict[str, Any], x: dict[str, Any], ops: dict[str, dict[str, Any]]) -> bool:
    """With one KV cache for all slots: may another client's completion have started on the server after x (the
    operation that filled z's slot: its last completion, or a restore) and before z? Its start saved z's idle slot
    to the host cache and cleared it. Two starts reach the server in either order unless the script waited for the
    first (`known`: the step from which on the engine knew the server had it) before starting the second, so a
    start is harmless only if the server surely had it before x, or surely had z before it."""
    return any(y["client"] != z["client"] and y["op"].kind in STREAMED
               and not y["known"] <= x["step"] and not z["known"] <= y["step"]
               for y in ops.values())


class _Stop(Exception):
    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind, self.message = kind, message


def format_report(rep: dict[str, Any]) -> str:
    cfg = rep["config"]
    what = f"replay {cfg['replay']}" if cfg["replay"] else f"{cfg['mode']}, " + (
        f"plans {cfg['plan']}" if cfg["plan"] else f"{cfg['clients']} clients × {cfg['ops']} operations") + (
        f", {cfg['limit']} schedules per plan" if cfg["limit"] else "") + (
        f", budget {cfg['budget']:g} s" if cfg["budget"] else "")
    reused = sum(r["reused"] for r in rep["runs"])
    promised = sum(r["promised"] for r in rep["runs"])
    restores = sum(r.get("restores", 0) for r in rep["runs"])
    unjudged = sum(1 for r in rep["runs"] if r.get("unjudged"))
    lines = [f"radix {rep['fixture']}: arch {rep['arch']}, {what}: {rep['explored']} schedules in "
             f"{rep['timing']['seconds']:.1f} s; prompt tokens from the cache {reused} (promised {promised}); "
             f"checkpoint restores judged {restores}" + (f" ({unjudged} schedules' logs unjudged)" if unjudged else "")]
    if rep.get("noise"):
        lines.append(noise_line(rep["noise"]))
    for fl in rep["flaky"]:
        lines.append(f"  not reproduced (not reported): {fl['replay']}: {fl['first'][0]['message']}")
    for x in rep.get("numerics", []):
        lines.append(f"  numerics (not reported): {x['replay']}: {x['findings'][0]['message']}: {x['cause']}")
    found = rep.get("found") or ([rep["finding"]] if rep["finding"] else [])
    for f in found:
        lines.append(f"  FINDING (reproduced 3 of 3 runs) {f['replay']}")
        for x in f["findings"]:
            lines.append(f"    {x['kind']}: {x['message']}")
    if rep.get("again"):
        lines.append(f"  the same findings again in {len(rep['again'])} more schedules (not replayed)")
    lines.append(f"{rep['status']}: {len(found)} findings")
    return "\n".join(lines)


# ---- the oracle contract ---------------------------------------------------------------------------------
def report(fixture: Path, cfg: RadixConfig) -> Report:
    return Radix(fixture, cfg).report()


def replay_of(config: dict[str, Any], f: Finding) -> dict[str, Any]:
    """The config that runs exactly the finding's schedule."""
    return config_for(config, Schedule.parse(f.detail["replay"])) if f.detail.get("replay") else config


# A replay runs a bundle's schedule up to three times: a disconnecting client (`x`) races the server, which may
# finish the whole answer before it notices, and the state the slot keeps then differs (the laguna bundle's
# finding needs the disconnect noticed within 13 tokens, which a loaded machine sometimes does not).
ORACLE = Oracle(name="radix", config=RadixConfig, run=report, format=lambda rep: format_report(rep.native),
                replay_of=replay_of, reduce=reduce_config, replay_runs=3,
                case_fields=("clients", "ops", "mode", "budget", "tokens", "trunk", "replay", "plan", "limit",
                             "cache_ram", "kv_unified", "tree", "schedules", "seed", "keep_going"))
