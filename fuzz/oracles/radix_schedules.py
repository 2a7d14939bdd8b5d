"""What a radix schedule is, without a server: clients' operations on a prompt tree, an interleaving of them
(every one, or PCT-sampled), its replay string (Schedule.parse / Schedule.replay), the seeded prompt trees (the
fixed trunk/branches/leaf, or one drawn per schedule), and the smaller schedules a finding shrinks through. Also
the record of one run of a schedule (Run): the engine (radix.py) fills it and its controls (radix_controls.py)
read it, so it sits here, below both."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from fuzz.engine.contract import FINDING, NUMERICS, PASS
from synth.errors import UserError

VERSION = "r1"


DRAWN = "r2"  # a replay string whose fourth field is a drawn prompt tree (parse_tree) instead of the trunk


PROMPTS = ("T", "B0", "B1", "L", "U")


STREAMED = ("complete", "continue", "cancel")


CODES = {"c": "complete", "k": "continue", "x": "cancel", "s": "save", "r": "restore", "e": "erase"}


CANCEL_AFTER = 2  # a disconnecting client goes away after this many streamed tokens


TAIL = 2  # tokens a continue adds after the previous answer


@dataclass(frozen=True)
class Op:
    kind: str  # complete | continue | cancel | save | restore | erase
    prompt: str | None = None  # complete, cancel: one of PROMPTS

    @property
    def code(self) -> str:
        letter = next(k for k, v in CODES.items() if v == self.kind)
        return letter + (self.prompt or "")

    @property
    def points(self) -> tuple[str, ...]:
        """The progress an operation reports, in order (a slot action is done at once)."""
        return ("prompt", "done") if self.kind in STREAMED else ("done",)


@dataclass(frozen=True)
class Step:
    client: int
    waits: tuple[tuple[int, str], ...] = ()  # (client, point): that client's current operation reached point

    @property
    def code(self) -> str:
        return letter(self.client) + "".join(letter(c).lower() + p[0] for c, p in self.waits)


def letter(client: int) -> str:
    return chr(ord("A") + client)


@dataclass(frozen=True)
class Schedule:
    seed: int
    tokens: int  # greedy tokens per completion
    trunk: int  # the trunk's length (branches add trunk // 3, the leaf trunk // 4 more; U is as long as T)
    clients: tuple[tuple[Op, ...], ...]
    script: tuple[Step, ...]
    tree: str = ""  # a drawn prompt tree (draw_tree; prompts named 0, 1, ...); "" the fixed one from `trunk`

    @property
    def replay(self) -> str:
        ops = "/".join(",".join(o.code for o in c) for c in self.clients)
        return ":".join([DRAWN if self.tree else VERSION, str(self.seed), str(self.tokens),
                         self.tree or str(self.trunk), ops, ".".join(s.code for s in self.script)])

    @property
    def prompts(self) -> tuple[str, ...]:
        """The names of the schedule's prompts: T, B0, B1, L, U, or a drawn tree's 0, 1, ..."""
        return tree_names(self.tree)

    @property
    def n_ops(self) -> int:
        return sum(len(c) for c in self.clients)

    @classmethod
    def parse(cls, text: str) -> Schedule:
        """A replay string back into a schedule; a malformed one is a UserError naming what is wrong."""
        def bad(why: str) -> UserError:
            return UserError(f"replay string {text!r}: {why}; write it as {VERSION}:SEED:TOKENS:TRUNK:OPS/OPS:SCRIPT "
                             "(e.g. r1:0:8:24:cT,s/cT:A.Bap.A)")
        parts = text.strip().split(":")
        if len(parts) != 6 or parts[0] not in (VERSION, DRAWN):
            raise bad(f"not six ':'-separated fields starting with {VERSION} (or {DRAWN}: a drawn tree)")
        tree = parts[3] if parts[0] == DRAWN else ""
        try:
            seed, tokens = (int(x) for x in parts[1:3])
            trunk = 0 if tree else int(parts[3])
        except ValueError:
            raise bad("SEED, TOKENS and TRUNK must be integers") from None
        if tokens < 1 or (not tree and trunk < 4):
            raise bad("TOKENS must be at least 1 and TRUNK at least 4")
        try:
            names = tree_names(tree)
        except ValueError as e:
            raise bad(f"TREE {tree!r}: {e}") from None
        clients = parse_clients(parts[4], bad, names)
        steps = []
        for code in filter(None, parts[5].split(".")):
            m = re.fullmatch(r"([A-Z])((?:[a-z][pd])*)", code)
            if not m:
                raise bad(f"step {code!r} is not a client letter followed by waits like 'ap' or 'bd'")
            waits = tuple((ord(w[0]) - ord("a"), "prompt" if w[1] == "p" else "done")
                          for w in re.findall(r"[a-z][pd]", m.group(2)))
            steps.append(Step(ord(m.group(1)) - ord("A"), waits))
        sched = cls(seed, tokens, trunk, tuple(clients), tuple(steps), tree)
        why = sched.problem()
        if why:
            raise bad(why)
        return sched

    def problem(self) -> str | None:
        """Why this is not a schedule that can run, or None."""
        if not 1 <= len(self.clients) <= 26 or any(not c for c in self.clients):
            return "every client needs at least one operation"
        for i, ops in enumerate(self.clients):
            # has: the client has a conversation to continue (run_schedule's `last`); kept: its last save held one
            has, kept, saved = False, False, False
            for o in ops:
                if o.kind == "continue" and not has:
                    return (f"client {letter(i)} continues with nothing to continue (nothing completed"
                            + (", or a restore of a save made before it completed anything)" if saved else ")"))
                if o.kind == "restore" and not saved:
                    return f"client {letter(i)} restores before it saved"
                has = has or o.kind in ("complete", "continue")
                if o.kind == "save":
                    kept, saved = has, True
                elif o.kind == "restore":
                    has = kept
        started = [0] * len(self.clients)
        inflight: list[Op | None] = [None] * len(self.clients)
        for s in self.script:
            if not 0 <= s.client < len(self.clients) or started[s.client] >= len(self.clients[s.client]):
                return f"step {s.code} starts an operation client {letter(s.client)} does not have"
            for c, point in s.waits:
                if c == s.client or not 0 <= c < len(self.clients) or inflight[c] is None \
                        or point not in inflight[c].points:
                    return f"step {s.code} waits for a client with nothing in flight at that point"
            inflight[s.client] = self.clients[s.client][started[s.client]]
            started[s.client] += 1
        if started != [len(c) for c in self.clients]:
            return "the script does not start every operation exactly once"
        return None


@dataclass
class Run:
    """One schedule on a fresh server: what each operation returned, and what the oracle found."""

    schedule: Schedule
    results: list[dict[str, Any]] = field(default_factory=list)  # per operation, in start order
    findings: list[dict[str, Any]] = field(default_factory=list)  # {kind, op, client, message}
    reused: int = 0
    promised: int = 0
    cause: str | None = None  # why its findings are not the prompt cache's (Radix.explain): numerics
    restores: int = 0  # checkpoint restores judged against the prompts (server_checkpoints)
    unjudged: str | None = None  # why the server's checkpoint log could not be judged

    @property
    def key(self) -> tuple[tuple[str, str], ...]:
        return tuple((f["kind"], f["op"]) for f in self.findings)

    def to_dict(self) -> dict[str, Any]:
        status = NUMERICS if self.cause else FINDING if self.findings else PASS
        return {"replay": self.schedule.replay, "status": status, "reused": self.reused, "promised": self.promised,
                "ops": self.results, **({"findings": self.findings} if self.findings else {}),
                "restores": self.restores, **({"unjudged": self.unjudged} if self.unjudged else {}),
                **({"cause": self.cause} if self.cause else {})}


def parse_clients(text: str, bad: Any, names: tuple[str, ...] = PROMPTS) -> tuple[tuple[Op, ...], ...]:
    """OPS/OPS/...: each client's operations, comma-separated, naming the tree's prompts; `bad(why)` makes the
    error."""
    clients = []
    for ops in text.split("/"):
        row = []
        for code in filter(None, ops.split(",")):
            kind = CODES.get(code[:1])
            prompt = code[1:] or None
            if kind is None or (kind in ("complete", "cancel")) != (prompt in names) or \
                    (kind not in ("complete", "cancel") and prompt):
                raise bad(f"operation {code!r} is not one of cP, xP (P in {', '.join(names)}), k, s, r, e")
            row.append(Op(kind, prompt))
        clients.append(tuple(row))
    return tuple(clients)


def parse_plans(text: str) -> list[tuple[tuple[Op, ...], ...]]:
    """PLAN;PLAN;...: each the clients' operations (OPS/OPS) whose interleavings are explored."""
    def bad(why: str) -> UserError:
        return UserError(f"--plan {text!r}: {why}; write each plan as OPS/OPS (e.g. cT,k/cT,cB0), plans "
                         "separated by ';'")
    plans = []
    for part in filter(None, text.split(";")):
        clients = parse_clients(part, bad)
        why = Schedule(0, 1, 4, clients, tuple(next(interleavings(clients), ()))).problem() if all(clients) \
            else "every client needs at least one operation"
        if why:
            raise bad(why)
        plans.append(clients)
    return plans


# ---- exploration ---------------------------------------------------------------------------------------
def interleavings(clients: tuple[tuple[Op, ...], ...]) -> Iterator[tuple[Step, ...]]:
    """Every interleaving of the clients' operations, each exactly once (lazy waits: before each start, how far
    each other in-flight operation must have got)."""
    k = len(clients)

    def rec(nxt: tuple[int, ...], seen: tuple[int, ...], steps: tuple[Step, ...]) -> Iterator[tuple[Step, ...]]:
        # nxt[c]: c's next operation; seen[c]: points observed of c's in-flight operation (-1: none in flight)
        if all(nxt[c] == len(clients[c]) for c in range(k)):
            yield steps
            return
        for c in range(k):
            if nxt[c] == len(clients[c]):
                continue
            others = [d for d in range(k) if d != c and seen[d] >= 0]
            ranges = [range(seen[d], len(clients[d][nxt[d] - 1].points) + 1) for d in others]
            for levels in itertools.product(*ranges):
                new = list(seen)
                waits = []
                for d, lv in zip(others, levels, strict=True):
                    pts = clients[d][nxt[d] - 1].points
                    if lv > seen[d]:
                        waits.append((d, pts[lv - 1]))
                    new[d] = -1 if lv == len(pts) else lv
                new[c] = 0
                yield from rec(tuple(x + (i == c) for i, x in enumerate(nxt)), tuple(new),
                               (*steps, Step(c, tuple(waits))))

    yield from rec((0,) * k, (-1,) * k, ())


def script_of(clients: tuple[tuple[Op, ...], ...], events: list[tuple[int, int]]) -> tuple[Step, ...]:
    """A total order of events — (client, i): i = 0 its next start, i ≥ 1 its current operation's i-th point —
    as the lazy script it is the same execution as."""
    k = len(clients)
    nxt, seen, told = [0] * k, [-1] * k, [-1] * k  # told: points already in an emitted step
    steps = []
    for c, i in events:
        if i == 0:
            waits = []
            for d in range(k):
                if d != c and seen[d] > told[d] and seen[d] > 0:
                    waits.append((d, clients[d][nxt[d] - 1].points[seen[d] - 1]))
            for d in range(k):
                if d != c and seen[d] >= 0:
                    told[d] = seen[d]
            steps.append(Step(c, tuple(waits)))
            nxt[c] += 1
            seen[c] = told[c] = 0
        else:
            seen[c] = i
    return tuple(steps)


def pct_events(clients: tuple[tuple[Op, ...], ...], rng: np.random.Generator, depth: int = 3) \
        -> list[tuple[int, int]]:
    """PCT-style: random client priorities, the highest-priority client with an event left takes the next one,
    and at depth-1 random points the running client drops to the lowest priority."""
    k = len(clients)
    chains = [[(c, i) for op in ops for i in range(len(op.points) + 1)] for c, ops in enumerate(clients)]
    total = sum(len(ch) for ch in chains)
    prio = [float(x) for x in rng.permutation(k)]
    change = set(int(x) for x in rng.choice(max(total, 1), size=min(depth - 1, total), replace=False))
    pos = [0] * k
    events = []
    for n in range(total):
        c = max((c for c in range(k) if pos[c] < len(chains[c])), key=lambda c: prio[c])
        events.append(chains[c][pos[c]])
        pos[c] += 1
        if n in change:
            prio[c] = min(prio) - 1
    return events


def random_clients(rng: np.random.Generator, n_clients: int, n_ops: int, prompts: tuple[str, ...] = PROMPTS,
                   children: dict[str, list[str]] | None = None) -> tuple[tuple[Op, ...], ...]:
    """Seeded operations per client on these prompts; client B's first operation completes client A's first prompt
    (the H1 pair: two slots inserting one prefix) half of the time. With a drawn tree's `children`, a client whose
    last prompt has some goes on to one of them half of the time (a conversation walking the tree on its slot, as
    the server's checkpoints of the last prompt are there to serve)."""
    clients = []
    for c in range(n_clients):
        ops: list[Op] = []
        for j in range(n_ops):
            done = any(o.kind in ("complete", "continue") for o in ops)
            saved = any(o.kind == "save" for o in ops)
            choices = ["complete"] * 4 + ["cancel"] + (["continue", "continue", "save"] if done else []) \
                + (["restore", "restore", "erase"] if saved else [])
            kind = choices[int(rng.integers(len(choices)))] if j else "complete"
            prompt = prompts[int(rng.integers(len(prompts)))] if kind in ("complete", "cancel") else None
            if c > 0 and j == 0 and clients[0][0].prompt and rng.random() < 0.5:
                prompt = clients[0][0].prompt
            last = next((o.prompt for o in reversed(ops) if o.prompt), None)
            if prompt and children and children.get(last) and rng.random() < 0.5:
                prompt = children[last][int(rng.integers(len(children[last])))]
            ops.append(Op(kind, prompt))
        clients.append(tuple(ops))
    return tuple(clients)


# ---- the prompt tree and the cold reference ------------------------------------------------------------
def parse_tree(tree: str) -> list[tuple[int | None, int | None, int]]:
    """A drawn tree's prompts, in order: `N` a root of N tokens; `J+N` prompt J's tokens then N more; `J@C+N` its
    first C tokens then N more (J an earlier prompt). As (parent, cut, fresh); ValueError naming what is wrong."""
    out: list[tuple[int | None, int | None, int]] = []
    for item in tree.split("_"):
        m = re.fullmatch(r"(\d+)|(\d+)(?:@(\d+))?\+(\d+)", item)
        if not m:
            raise ValueError(f"{item!r} is not N, J+N or J@C+N")
        if m.group(1):
            out.append((None, None, int(m.group(1))))
            continue
        j, cut, n = int(m.group(2)), m.group(3), int(m.group(4))
        if j >= len(out):
            raise ValueError(f"{item!r} extends prompt {j}, which is not an earlier one")
        out.append((j, None if cut is None else int(cut), n))
    if not out or len(out) > 10 or any(n < 1 and p is None for p, _, n in out):
        raise ValueError("1 to 10 prompts, each root at least 1 token")
    return out


def tree_names(tree: str) -> tuple[str, ...]:
    """The prompts' names: a drawn tree's 0, 1, ...; the fixed tree's T, B0, B1, L, U ("")."""
    return tuple(str(i) for i in range(len(parse_tree(tree)))) if tree else PROMPTS


def tree_children(tree: str) -> dict[str, list[str]] | None:
    """A drawn tree's prompts by the prompt each extends (None for the fixed tree)."""
    if not tree:
        return None
    out: dict[str, list[str]] = {}
    for i, (parent, _, _) in enumerate(parse_tree(tree)):
        if parent is not None:
            out.setdefault(str(parent), []).append(str(i))
    return out


def tree_prompts(n_vocab: int, seed: int, tree: str) -> dict[str, list[int]]:
    """A drawn tree's prompts (named 0, 1, ...) and the `tail` a continue adds, from the seed."""
    rng = np.random.Generator(np.random.PCG64(seed))
    out: dict[str, list[int]] = {}
    for i, (parent, cut, n) in enumerate(parse_tree(tree)):
        head = [] if parent is None else out[str(parent)][:cut]
        out[str(i)] = head + [int(x) for x in rng.integers(0, n_vocab, n)]
    out["tail"] = [int(x) for x in rng.integers(0, n_vocab, TAIL)]
    return out


CHECKPOINT_OFFSET = 4  # llama-server takes a context checkpoint this many tokens before a prompt's end (PR 20288)


def draw_tree(rng: np.random.Generator, window: int = 0, longest: int = 80, aim: bool = False) -> str:
    """A prompt tree for one schedule (parse_tree's form): 3 to 6 prompts, each a new root now and then, else an
    earlier prompt cut anywhere, at its end, just before its end (what a checkpoint taken at the end of that prompt
    must roll back across), at or around the checkpoint llama-server took CHECKPOINT_OFFSET tokens before its end,
    or around the sliding window (`window`: cells a server's SWA cache may have dropped); then new tokens, or now
    and then none (a retry, a regenerate, a scoring request: a prompt the cache may cover whole).
    aim: the cuts also fall where another earlier prompt left its checkpoint (a conversation that went back inside
    one prompt and forward again past where another left one), and with a window a root is now and then as long as
    puts its checkpoint at the window's edge (where a server restores a checkpoint instead of the cells it
    holds) — for a server whose checkpoints stay with their slot (no host prompt cache moving them)."""
    lengths: list[int] = []
    items: list[str] = []
    k = CHECKPOINT_OFFSET
    for i in range(int(rng.integers(3, 7))):
        if i == 0 or rng.random() < 0.15:
            n = int(rng.integers(6, 29))
            if aim and window and rng.random() < 0.3:
                n = max(2, window + k + int(rng.integers(0, 2)))
            items.append(str(n))
            lengths.append(n)
            continue
        j = int(rng.integers(0, i))
        size = lengths[j]
        other = lengths[int(rng.integers(0, i))] - k if aim else 0  # where an earlier prompt had its checkpoint
        anywhere = int(rng.integers(1, size)) if size > 1 else 1  # (a 1-token prompt has no cut inside it)
        points = [size, size - 1, size - 2, size - k + 1, size - k, size - k - 1, anywhere] + \
            [w for w in (window - 1, window, window + 1, 2 * window) if window and 0 < w < size] + \
            [other] * 2 * (0 < other < size)
        cut = min(max(1, points[int(rng.integers(len(points)))]), size)
        n = 0 if rng.random() < 0.2 else min(int(rng.integers(1, 13)), max(1, longest - cut))
        items.append(f"{j}+{n}" if cut == size else f"{j}@{cut}+{n}")
        lengths.append(cut + n)
    return "_".join(items)


def prompt_tree(n_vocab: int, seed: int, trunk: int) -> dict[str, list[int]]:
    rng = np.random.Generator(np.random.PCG64(seed))

    def toks(n: int) -> list[int]:
        return [int(x) for x in rng.integers(0, n_vocab, n)]

    t = toks(trunk)
    p = {"T": t, "B0": t + toks(trunk // 3), "B1": t + toks(trunk // 3)}
    p["L"] = p["B0"] + toks(max(1, trunk // 4))
    p["U"] = toks(trunk)
    p["tail"] = toks(TAIL)
    return p


# ---- shrinking -----------------------------------------------------------------------------------------
def smaller(sched: Schedule) -> Iterator[Schedule]:
    """Candidates one step smaller: a shorter trunk and fewer tokens first (one run each, and they rarely lose a
    finding), then a client fewer, an operation fewer. Each is a valid schedule (the same script with the removed
    operation's start and waits dropped), each distinct."""
    def without(c: int, j: int | None) -> Schedule | None:
        clients, script = [], []
        idx = [0] * len(sched.clients)
        for s in sched.script:  # the op each step starts
            keep = not (s.client == c and (j is None or idx[c] == j))
            idx[s.client] += 1
            if keep:
                script.append(s)
        for i, ops in enumerate(sched.clients):
            if i == c:
                ops = () if j is None else ops[:j] + ops[j + 1:]
            clients.append(ops)
        # renumber: drop waits on removed ops (by replaying who is in flight), then remove an empty client
        if not clients[c]:
            clients.pop(c)
            script = [Step(s.client - (s.client > c), tuple((d - (d > c), p) for d, p in s.waits if d != c))
                      for s in script]
        out = replace(sched, clients=tuple(clients), script=tuple(_fix_waits(tuple(clients), script)))
        return out if out.clients and out.problem() is None else None

    if sched.trunk > 4 and not sched.tree:
        yield replace(sched, trunk=max(4, sched.trunk // 2))
    if sched.tokens > CANCEL_AFTER + 1:
        yield replace(sched, tokens=max(CANCEL_AFTER + 1, sched.tokens // 2))
    seen = set()
    for c, ops in enumerate(sched.clients):
        for j in (None, *range(len(ops))):  # the whole client, then each of its operations
            cand = without(c, j) if j is not None or len(sched.clients) > 1 else None
            if cand and cand.replay not in seen:
                seen.add(cand.replay)
                yield cand


def _fix_waits(clients: tuple[tuple[Op, ...], ...], script: list[Step]) -> list[Step]:
    """Waits kept only where their client still has something in flight with that point."""
    inflight: list[Op | None] = [None] * len(clients)
    idx = [0] * len(clients)
    out = []
    for s in script:
        if s.client >= len(clients) or idx[s.client] >= len(clients[s.client]):
            return script  # not a valid script any more: problem() says so
        out.append(Step(s.client, tuple((d, p) for d, p in s.waits
                                        if inflight[d] is not None and p in inflight[d].points and d != s.client)))
        inflight[s.client] = clients[s.client][idx[s.client]]
        idx[s.client] += 1
    return out


def config_for(config: dict[str, Any], sched: Schedule) -> dict[str, Any]:
    """A case config that runs exactly this schedule, its other fields saying the same as the string."""
    return {**config, "replay": sched.replay, "clients": len(sched.clients),
            "ops": max(len(c) for c in sched.clients), "tokens": sched.tokens, "trunk": sched.trunk or 24,
            "seed": sched.seed, "plan": "", "limit": 0, "tree": "drawn" if sched.tree else "fixed", "schedules": 0}


def reduce_config(config: dict[str, Any]) -> list[dict[str, Any]]:
    if not config.get("replay"):
        return []
    return [config_for(config, s) for s in smaller(Schedule.parse(config["replay"]))]
