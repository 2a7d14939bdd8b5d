"""`fuzz handoff`: state crossing a stage boundary must be complete (the B1 class).

For a cut set and every token offset t of the prompt (and a few decode steps), each stage of the chain:
- full: runs to t, exports its sequence state, which is imported into a FRESH context under a DIFFERENT
  sequence id; prefill and decode continue there;
- partial: runs to t, saves its partial state (recurrent / SWA only), runs on past t, rolls back (restores
  the partial state, removes KV positions >= t) and continues — what a prefix cache does for hybrids;
- busy (at the first, middle and last offset): as full, but into a context where another sequence is live (a
  split runtime's stage context serves several): that sequence has prefilled its own prompt and decoded a token
  when the state is imported beside it, and both go on decoding, one step each in turn; then the imported one is
  rolled back to t (partial state restored, positions >= t removed) and goes on again. The imported sequence must
  equal its uninterrupted run both times, and the live one its own (positions and bits unchanged by the import and
  the rollback). One KV stream per sequence (kv_unified off), so neither's cells move: bit-exact is promised.
Every continuation must equal an uninterrupted run of the same schedule, token-exact and bit-exact (the
uninterrupted run splits its prefill chunks at t too: llama.cpp does not promise bit-exactness across batch
shapes). The state bytes the target exports are checked against what the stage holds: a stage with any
recurrent layer must carry recurrent bytes — also when its FIRST layer is attention (the B1 shape) — and a stage
with attention layers must carry KV bytes for exactly its positions.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any, NamedTuple

from fuzz.engine.case_oracle import CaseOracle
from fuzz.engine.contract import (
    CRASH,
    FINDING,
    NUMERICS,
    PASS,
    TIMEOUT,
    UNSUPPORTED,
    Oracle,
    Report,
    select,
)
from fuzz.engine.fleet import Fleet, failure_reason, failure_status, fixture_header, load_full
from fuzz.engine.parity import (
    Trace,
    compare,
    context_params,
    describe_node,
    first_differing_graph_node,
    pos_per_token,
    run_chain,
    run_script,
    script_steps,
)
from fuzz.engine.schedule import Step, main_prompt, prompt_tokens, sequential_steps
from fuzz.engine.stages import FixtureStages, cut_sets, stage_ranges
from fuzz.oracles.handoff_order import CellOrderExcuse
from fuzz.oracles.handoff_state import (
    CELL_META,
    HandoffConfig,
    HandoffResult,
    StageBytes,
    format_report,
    same_cells,
    split_schedule,
    with_seq,
)
from synth.errors import UserError
from synth.inspect import inspect_file
from synth.stage import StageInfo, Unsupported
from targets import Failure, Target
from targets.target import script_request

BUSY_SEQ = 0  # the live sequence of a busy hand-off (the imported one is 1)


class Neighbour(NamedTuple):
    """The live sequence of busy hand-offs (BUSY_SEQ): its uninterrupted run on the full model (boundaries
    captured), its steps and greedy tokens, and how many of its steps run before the import."""

    base: Trace
    steps: list[Step]
    tokens: list[list[int]]
    before: int


def roll_back(stages: list[Target], blobs: list[tuple[bytes, bytes]], seq: int, t: int) -> Failure | None:
    """Every stage's sequence `seq` back to offset t: its partial state (recurrent / SWA) restored, its positions
    >= t removed. The first failure, or None."""
    for s, (_, part) in zip(stages, blobs, strict=True):
        r = s.state_set(part, seq=seq, partial=True) if part else None
        if r is not None and not r.ok:
            return r.failure
        r = s.seq_rm(seq, t, -1)
        if not r.ok:
            return r.failure
    return None


class Handoff(CellOrderExcuse, CaseOracle[list[int]]):
    name, unit = "handoff", "cut sets"

    def __init__(self, fixture: Path, cfg: HandoffConfig):
        super().__init__(fixture, cfg)
        if any(not 0 < t < cfg.prompt_len for t in cfg.offsets):
            raise UserError(f"--offsets {','.join(map(str, cfg.offsets))}: each must be in 1..{cfg.prompt_len - 1} "
                            "(inside the prompt)")
        self.st = FixtureStages(self.fixture, period=cfg.period)
        self.info = self.st.info
        self.decode_seconds = 0.0
        self.sets = cut_sets(cfg.cuts, self.info.n_layer, cfg.stages, self.st.period, self.fixture)

    def open(self, fleet: Fleet) -> None:
        self.scope.enter_context(self.st.workspace(self.cfg.workdir))
        k = max(len(s) for s in self.sets) + 1
        self.ref, self.src, self.dst = fleet.one(start=True), fleet.open(k, start=True), fleet.open(k, start=True)
        self.fleet, self.trusted = fleet, []  # (the trusted workers start when an untrusted target needs them)
        # busy hand-offs export from contexts laid out as the busy one (a state carries its KV stream count)
        self.busy_src = fleet.open(k, start=True) if "busy" in self.cfg.modes else []
        loaded = load_full(self.ref, self.fixture, **self.params)
        self.commit = loaded.data.get("llama_cpp_commit")
        self.n_pos = pos_per_token(loaded.data)

    def cases(self) -> list[list[int]]:
        return self.sets

    def identity(self, cuts: list[int]) -> dict[str, Any]:
        return {"cuts": cuts, "stages": stage_ranges(cuts, self.info.n_layer)}

    def observe(self, cuts: list[int]) -> dict[str, Any]:
        """Every hand-off of the cut set, offset by offset, mode by mode, with what each must equal; it stops at
        the first one that is not as promised (the judge's own verdict, _verdict), and at a failed call."""
        cfg = self.cfg
        stages = self.st.stages(cuts)
        if isinstance(stages, Unsupported):
            return {"unsupported": str(stages)}
        src, dst = self.src[:len(stages)], self.dst[:len(stages)]
        seen: dict[str, Any] = {"stages": stages, "records": [], "offsets": 0, "bytes": [], "empties": [],
                                "busy_failure": None}
        for (path, _), t in zip(stages, src, strict=True):
            r = t.load(str(path), **self.params)
            if not r.ok:
                return {**seen, "failed": {"failure": r.failure}}
        seen["bytes"] = [self._stage_bytes(path, st) for path, st in stages]
        seen["empties"] = [self._empty_state(t) for t in src]
        prompt = main_prompt(cfg, self.info.n_vocab)
        offsets, busy_at = self._offsets(), self._busy_offsets()
        neighbour = seen["neighbour"] = self._neighbour(self.ref, cuts) if "busy" in cfg.modes else None
        if isinstance(neighbour, Failure):
            return {**seen, "failed": {"failure": neighbour}}
        # a busy context that cannot be made is a finding of its own, after the other modes ran at every offset
        for (path, _), t in zip(stages, self.busy_src, strict=False):
            r = t.load(str(path), **self.busy_params)
            if not r.ok:
                seen["busy_failure"] = r.failure
                seen["busy_reproduced"] = not t.load(str(path), **self.busy_params).ok  # (a fresh worker)
                break
        probe, kv_first = self._result(cuts, seen), {}  # the verdict so far, hand-off by hand-off
        for t in offsets:
            seen["offsets"] += 1
            steps, k = split_schedule(prompt, t, cfg.chunk, cfg.tokens)
            base = run_script(self.ref, script_steps(steps, capture=[c - 1 for c in cuts]), reset=True)
            if isinstance(base, Failure):
                return {**seen, "failed": {"failure": base}}
            self.decode_seconds += base.decode_seconds
            tokens = [so.tokens for so in base.steps]
            shared: dict[str, Any] = {}  # the source stages' export at t, for the full and partial modes
            for mode in cfg.modes:
                if mode == "busy" and (seen["busy_failure"] is not None or t not in busy_at):
                    continue
                out = self._handoff(mode, stages, src, dst, steps, k, t, tokens, neighbour, shared)
                if isinstance(out, Failure):
                    return {**seen, "failed": {"failure": out, "mode": mode, "t": t}}
                chain, blobs, live, rolled = out
                want = Trace(base.steps[k:], 0.0)
                # what must equal what: the continuation, and for busy hand-offs the continuation after the rollback
                # to t, and the live sequence beside them (its own uninterrupted run)
                checks = [("continuation", want, chain, steps[k:], 0)]
                if rolled is not None:
                    m = neighbour.before
                    checks += [("rollback", want, rolled, steps[k:], 3),
                               ("live", Trace(neighbour.base.steps[m:], 0.0), live, neighbour.steps[m:], 2)]
                seen["records"].append({"t": t, "mode": mode, "checks": checks, "blobs": blobs, "steps": steps,
                                        "k": k, "tokens": tokens, "base": base})
                if self._verdict(cuts, seen["records"][-1], probe, seen["empties"], kv_first):
                    return seen
        return seen

    def judge(self, cuts: list[int], seen: dict[str, Any]) -> list[dict[str, Any]]:
        """Each hand-off's continuation (and a busy one's rollback and live neighbour) against its uninterrupted
        run, bit-exact; a full export's bytes against what its stages hold; a failed call; a busy context that
        cannot be made."""
        if "unsupported" in seen:
            return [HandoffResult(cuts=cuts, stages=stage_ranges(cuts, self.info.n_layer), status=UNSUPPORTED,
                                  reason=seen["unsupported"]).to_dict()]
        res = self._result(cuts, seen)
        kv_first: dict[int, tuple[int, int]] = {}
        for rec in seen["records"]:
            if self._verdict(cuts, rec, res, seen["empties"], kv_first):
                return [res.to_dict()]
        failed = seen.get("failed")
        if failed:
            res.status, res.reason = failure_status(failed["failure"]), failure_reason(failed["failure"])
            if "mode" in failed:
                res.mode, res.offset = failed["mode"], failed["t"]
                res.reason = f"{failed['mode']} hand-off at t={failed['t']}: {res.reason}"
            return [res.to_dict()]
        if seen["busy_failure"] is not None:
            f = seen["busy_failure"]
            res.status, res.mode, res.reproduced = failure_status(f), "busy", seen["busy_reproduced"]
            res.reason = f"creating the busy context (2 sequences, one KV stream each): {failure_reason(f)}"
        return [res.to_dict()]

    def _result(self, cuts: list[int], seen: dict[str, Any]) -> HandoffResult:
        """A cut set's result before any verdict: its offsets and a copy of its stages' bytes (the bytes check fills
        in what it finds)."""
        return HandoffResult(cuts=cuts, stages=stage_ranges(cuts, self.info.n_layer), status=PASS,
                             offsets=seen["offsets"], bytes=[StageBytes(**b.__dict__) for b in seen["bytes"]])

    def _verdict(self, cuts: list[int], rec: dict[str, Any], res: HandoffResult, empties,
                 kv_first: dict[int, tuple[int, int]]) -> bool:
        """One hand-off, in order, against what it must equal and (a full one) its export's bytes; True, with the
        finding in res, when it is not as promised. kv_first carries the first offset's KV bytes to later ones."""
        mode, t = rec["mode"], rec["t"]
        found = self._diverged(cuts, rec, res)
        if found is not None:
            what, div = found
            res.status, res.mode, res.offset = FINDING, mode, t
            res.stage, res.where, res.position = div.stage, div.where, div.position
            at = f"stage {div.stage} {div.where} differs from"
            res.reason = {
                "continuation": f"{mode} hand-off at t={t}: {at} the uninterrupted run at position {div.position}",
                "rollback": f"busy rollback to t={t}: {at} the uninterrupted run at position {div.position}",
                "live": f"busy hand-off at t={t}: the live sequence {BUSY_SEQ} beside the import changes: "
                        f"{at} its own uninterrupted run at position {div.position}"}[what]
            return True
        if mode == "full":  # (busy exports the same bytes: checked once)
            bad = self._check_bytes(res, rec["blobs"], empties, t, kv_first)
            if bad:
                res.status, res.mode, res.offset, res.reason = FINDING, "bytes", t, bad
                return True
        return False

    @staticmethod
    def _diverged(cuts: list[int], rec: dict[str, Any], res: HandoffResult | None = None):
        """The first of a hand-off's checks whose run differs from what it must equal: (which, the divergence), or
        None; res.max_abs grows by what each check moved."""
        for what, want, got, steps, _ in rec["checks"]:
            div, worst = compare(want, got, steps, cuts)
            if res is not None:
                res.max_abs = max(res.max_abs, worst)
            if div is not None:
                return what, div
        return None

    def _record(self, seen: dict[str, Any], row: dict[str, Any]) -> dict[str, Any]:
        return next(r for r in seen["records"] if r["t"] == row["offset"] and r["mode"] == row["mode"])

    def again(self, cuts: list[int], seen: dict[str, Any], bad: list[dict[str, Any]]) -> None:
        """A divergence: the same hand-off once more (fresh exports), which must differ the same way. (A failed
        call is not run again; a busy context that cannot be made was tried twice while observing.)"""
        for row in bad:
            if row["status"] != FINDING or row["mode"] == "bytes":
                continue
            rec = self._record(seen, row)
            what, _ = self._diverged(cuts, rec)
            check = next(c for c in rec["checks"] if c[0] == what)
            stages = seen["stages"]
            again = self._handoff(row["mode"], stages, self.src[:len(stages)], self.dst[:len(stages)], rec["steps"],
                                  rec["k"], rec["t"], rec["tokens"], seen.get("neighbour"))
            row["reproduced"] = not isinstance(again, Failure) and \
                compare(check[1], again[check[4]], check[3], cuts)[0] is not None

    def explain(self, cuts: list[int], seen: dict[str, Any], row: dict[str, Any]) -> dict[str, Any]:
        """A reproduced continuation that differs: its first differing graph node in the stage; where every row
        was restored, only elsewhere in the ring, numerics as far as the same cells in another order move the
        uninterrupted run (`_order_excuse`)."""
        if row["mode"] == "bytes" or not row.get("reproduced"):
            return {}
        rec = self._record(seen, row)
        what, div = self._diverged(cuts, rec)
        if what != "continuation":
            return {}
        stages, mode, k = seen["stages"], row["mode"], rec["k"]
        node = self._localize_node("full" if mode == "busy" else mode, stages[div.stage], div.stage, cuts,
                                   rec["steps"], k, k + div.step, rec["t"], rec["tokens"], rec["base"],
                                   self.dst[div.stage])
        exports = (node or {}).pop("exports", None)
        out: dict[str, Any] = {"node": node} if node is not None else {}
        cells = (node or {}).get("cells")
        if cells and not cells["same"]:
            out["reason"] = f"{row['reason']}; {cells['detail']}"
        if cells and cells["same"]:
            out |= self._order_excuse(stages, rec, row, cuts, cells, exports, div.stage)
        return out

    def message(self, r: dict[str, Any]) -> str:
        what = f"cuts {','.join(map(str, r['cuts'])) or 'none'}: {r.get('reason') or r['status']}"
        what += f"; first node {describe_node(r['node'])}" if describe_node(r.get("node")) else ""
        return what + (f"; numerics: {r['cause']['detail']}" if r.get("cause") else "")

    def record(self, results: list[dict[str, Any]]) -> dict[str, Any]:
        cfg = self.cfg
        return {**fixture_header(self.fixture, self.info, target=cfg.target, commit=self.commit),
                "config": {"cuts": cfg.cuts, "stages": cfg.stages, "period": self.st.period, "modes": list(cfg.modes),
                           "prompt_len": cfg.prompt_len, "prompt": list(cfg.prompt), "chunk": cfg.chunk,
                           "n_ubatch": cfg.n_ubatch,
                           "offsets": list(cfg.offsets), "busy_offsets": self._busy_offsets(),
                           "tokens": cfg.tokens, "decode_offsets": cfg.decode_offsets, "seed": cfg.seed},
                "summary": {s: sum(r["status"] == s for r in results) for s in (PASS, FINDING, NUMERICS, UNSUPPORTED,
                                                                                CRASH, TIMEOUT)}}

    def timing(self, wall: float) -> dict[str, float]:
        return {"llama_decode_s": round(self.decode_seconds, 3)}

    @property
    def params(self) -> dict[str, Any]:
        return context_params(n_seq=2, n_ubatch=self.cfg.n_ubatch)

    @property
    def busy_params(self) -> dict[str, Any]:
        """A context serving two sequences, each in its own KV stream (its cells start at 0, as alone). (Two:
        Kimi-Linear aborts on three or more per-sequence streams, the upstream finding in corpora/repros.)"""
        return context_params(n_seq=2, n_ctx=512, n_ubatch=self.cfg.n_ubatch, kv_unified=False)

    def _busy_offsets(self) -> list[int]:
        """Where busy hand-offs run: the first, middle and last offset (the live neighbour, not the offset, is what
        they add)."""
        offsets = self._offsets()
        return sorted({offsets[0], offsets[len(offsets) // 2], offsets[-1]}) if "busy" in self.cfg.modes else []

    def _offsets(self) -> list[int]:
        P = self.cfg.prompt_len
        prompt = list(self.cfg.offsets) or list(range(1, P))
        return prompt + list(range(P, P + min(self.cfg.decode_offsets, self.cfg.tokens)))

    def _neighbour(self, ref: Target, cuts: list[int]) -> Neighbour | Failure:
        """The live sequence of busy hand-offs: its own prompt and decode steps (as sequence BUSY_SEQ), its
        uninterrupted run on the full model (boundaries captured), its greedy tokens, and how many of its steps run
        before the import (its prefill and one decode step)."""
        cfg = self.cfg
        prompt = prompt_tokens(cfg.seed + 55, cfg.prompt_len + 3, self.info.n_vocab)
        n_decode = cfg.tokens + cfg.decode_offsets + 2
        steps = sequential_steps(prompt, cfg.chunk, n_decode)
        base = run_script(ref, script_steps(steps, capture=[c - 1 for c in cuts]), reset=True)
        if isinstance(base, Failure):
            return base
        self.decode_seconds += base.decode_seconds
        return Neighbour(base, with_seq(steps, BUSY_SEQ), [so.tokens for so in base.steps], len(steps) - n_decode + 1)

    def _export(self, src: list[Target], sizes: list[int], steps: list[Step], k: int,
                tokens: list[list[int]]) -> list[tuple[bytes, bytes]] | Failure:
        """The source stages run from empty to the hand-off point (step k), then each stage's sequence state
        exported: (full, partial) per stage."""
        before, fail = run_chain(src, sizes, steps[:k], tokens[:k], n_pos_per_token=self.n_pos, reset=True)
        if fail:
            return fail.failure
        self.decode_seconds += sum(tr.decode_seconds for tr in before)
        blobs: list[tuple[bytes, bytes]] = []
        for s in src:
            full, part = s.state_get(0), s.state_get(0, partial=True)
            if not (full.ok and part.ok):
                return (full.failure or part.failure)
            blobs.append((full.data["blob"], part.data["blob"]))
        return blobs

    def _handoff(self, mode: str, stages, src: list[Target], dst: list[Target], steps: list[Step], k: int, t: int,
                 tokens: list[list[int]], neighbour: Neighbour | None = None, shared: dict[str, Any] | None = None):
        """One hand-off: (the continuation's chain, the exported blobs, and for busy ones the live neighbour's chain
        and the continuation's chain again after a rollback to t; else None, None). shared: the full and partial
        modes at one offset export the same state from the same contexts — full only reads the bytes, leaving the
        source stages at t for partial — so the first to run keeps its export there for the other."""
        sizes = [st.n_layer for _, st in stages]
        if mode == "busy":
            src = self.busy_src[:len(stages)]
            blobs = self._export(src, sizes, steps, k, tokens)
        else:
            blobs = (shared or {}).get("blobs") or self._export(src, sizes, steps, k, tokens)
        if isinstance(blobs, Failure):
            return blobs
        if mode != "busy" and shared is not None:
            shared["blobs"] = blobs
        if mode == "full":
            after_steps = with_seq(steps[k:], 1)
            for (path, _), d, (full, _) in zip(stages, dst, blobs, strict=True):
                r = d.load(str(path), **self.params)  # a fresh context
                if r.ok:
                    r = d.state_set(full, seq=1)
                if not r.ok:
                    return r.failure
            chain, fail = run_chain(dst, sizes, after_steps, tokens[k:], n_pos_per_token=self.n_pos)
        elif mode == "busy":
            n_steps, n_tokens, m = neighbour.steps, neighbour.tokens, neighbour.before
            for (path, _), d in zip(stages, dst, strict=True):
                r = d.load(str(path), **self.busy_params)
                if not r.ok:
                    return r.failure
            _, fail = run_chain(dst, sizes, n_steps[:m], n_tokens[:m], n_pos_per_token=self.n_pos)  # it is live
            if fail:
                return fail.failure
            for d, (full, _) in zip(dst, blobs, strict=True):
                r = d.state_set(full, seq=1)
                if not r.ok:
                    return r.failure
            # then both go on, one step each in turn; then the imported one is rolled back to t (its partial state
            # restored, its positions >= t removed) and goes on again, the live one still beside it
            mine = list(zip(with_seq(steps[k:], 1), tokens[k:], strict=True))
            theirs = list(zip(n_steps[m:], n_tokens[m:], strict=True))
            half = (len(theirs) + 1) // 2
            first = self._in_turn(dst, sizes, mine, theirs[:half])
            if isinstance(first, Failure):
                return first
            failed = roll_back(dst, blobs, 1, t)
            if failed:
                return failed
            again = self._in_turn(dst, sizes, mine, theirs[half:])
            if isinstance(again, Failure):
                return again
            live = [Trace(x.steps + y.steps, 0.0) for x, y in zip(first[1], again[1], strict=True)]
            return first[0], blobs, live, again[0]
        else:
            _, fail = run_chain(src, sizes, steps[k:], tokens[k:], n_pos_per_token=self.n_pos)  # run on past t ...
            if fail:
                return fail.failure
            failed = roll_back(src, blobs, 0, t)  # ... then roll back to t
            if failed:
                return failed
            chain, fail = run_chain(src, sizes, steps[k:], tokens[k:], n_pos_per_token=self.n_pos)
        if fail:
            return fail.failure
        self.decode_seconds += sum(tr.decode_seconds for tr in chain)
        return chain, blobs, None, None

    def _in_turn(self, dst: list[Target], sizes: list[int], mine, theirs):
        """Two sequences' (step, tokens) lists through the chain, one step each in turn: their chains apart."""
        turns = []
        for i in range(max(len(mine), len(theirs))):
            turns += [("a", mine[i])] if i < len(mine) else []
            turns += [("b", theirs[i])] if i < len(theirs) else []
        both, fail = run_chain(dst, sizes, [st for _, (st, _) in turns], [tk for _, (_, tk) in turns],
                               n_pos_per_token=self.n_pos)
        if fail:
            return fail.failure
        self.decode_seconds += sum(tr.decode_seconds for tr in both)
        pick = [[i for i, (who, _) in enumerate(turns) if who == w] for w in ("a", "b")]
        return tuple([Trace([tr.steps[i] for i in idx], tr.decode_seconds) for tr in both] for idx in pick)

    def _localize_node(self, mode: str, stage, s: int, cuts: list[int], steps: list[Step], k: int, at: int,
                       offset: int, tokens: list[list[int]], base: Trace, t: Target) -> dict[str, Any]:
        """Stage s alone, fed the uninterrupted run's inputs, once straight through and once handed off at step k
        — full: state exported from seq 0, imported into a fresh context as seq 1; partial: run on past the
        offset, rolled back to it (partial state restored, later cells removed), run again — every graph node
        traced at step `at`: the same graph both times, so the first node whose bits differ is where the restored
        state goes wrong (e.g. the cache view it is read through)."""
        path, st = stage
        loaded = {"path": str(path), **self.params, "trace": True}

        def reqs(lo: int, hi: int, seq: int, *, trace: bool = True) -> list[dict[str, Any]]:
            part = with_seq(steps[lo:hi], seq)
            if s == 0:
                out = script_steps(part, tokens=tokens[lo:hi])
            else:
                out = script_steps(part, embd=[base.steps[i].captures[cuts[s - 1] - 1] for i in range(lo, hi)],
                                   n_pos_per_token=self.n_pos)
            if trace:
                out[-1]["trace"] = "all"
            return out

        straight = t.pipeline([("load", loaded), script_request(reqs(0, at + 1, 0), reset=True)])
        if len(straight) < 2 or not straight[-1].ok:
            return {"kind": "untraced", "detail": "the straight run failed"}
        r = t.pipeline([("load", loaded), script_request(reqs(0, k, 0, trace=False), reset=True)])
        blob = t.state_get(0, partial=mode == "partial") if len(r) == 2 and r[-1].ok else None
        if blob is None or not blob.ok:
            return {"kind": "untraced", "detail": "the export failed"}
        data = base64.b64encode(blob.data["blob"]).decode()
        if mode == "full":
            calls = [("load", loaded), ("state_set", {"seq": 1, "data": data}), script_request(reqs(k, at + 1, 1))]
        else:
            calls = [script_request(reqs(k, len(steps), 0, trace=False)),
                     ("state_set", {"seq": 0, "data": data, "partial": True}),
                     ("seq_rm", {"seq": 0, "p0": offset, "p1": -1}), script_request(reqs(k, at + 1, 0))]
        handed = t.pipeline(calls)
        if len(handed) < len(calls) or not handed[-1].ok:
            return {"kind": "untraced", "detail": "the handed-off run failed"}
        cells, exports = None, None
        if mode == "full" and any(x.swa for x in inspect_file(str(path)).layers):
            # what both caches hold just before the step that differs: the same rows at the same positions
            # (wherever the cells sit) leave only the order attention sums them in
            before = t.pipeline([("load", loaded), script_request(reqs(0, at, 0, trace=False), reset=True)])
            held = t.state_get(0) if len(before) == 2 and before[-1].ok else None
            calls = [("load", loaded), ("state_set", {"seq": 1, "data": data})]
            calls += [script_request(reqs(k, at, 1, trace=False))] if at > k else []
            again = t.pipeline(calls)
            restored = t.state_get(1) if len(again) == len(calls) and again[-1].ok else None
            if held is not None and held.ok and restored is not None and restored.ok:
                positions = {p for st in steps[:at] for p in st.pos}
                cells = same_cells(held.data["blob"], restored.data["blob"], positions)
                exports = (held.data["blob"], restored.data["blob"], positions)
        a, b = straight[-1].data["results"][-1].get("nodes"), handed[-1].data["results"][-1].get("nodes")
        if not a or not b:
            return {"kind": "untraced", "detail": "the target returned no graph nodes (protocol `trace`)"}
        found = first_differing_graph_node(a, b, unset=("inp_embd",) if s == 0 else ("inp_tokens",))
        if found is None:
            return {"kind": "none", "detail": f"all {len(b)} graph nodes of stage {s} are bit-identical at step {at}"}
        return found | {"step": at} | ({"cells": cells, "exports": exports} if cells else {})

    def _empty_state(self, t: Target) -> tuple[int, int]:
        t.reset()
        full, part = t.state_get(0), t.state_get(0, partial=True)
        return len(full.data.get("blob", b"")), len(part.data.get("blob", b""))

    def _stage_bytes(self, path: Path, st: StageInfo) -> StageBytes:
        layers = inspect_file(str(path)).layers
        rec = sum(x.kind in ("recurrent", "both") for x in layers)
        att = [x for x in layers if x.kind in ("attention", "both") and not x.swa]
        return StageBytes(range=[st.first, st.last], first_layer=layers[0].kind, recurrent_layers=rec,
                          attention_layers=len(att), swa_layers=sum(x.swa for x in layers),
                          kv_row_bytes=sum(x.k_row_bytes + x.v_row_bytes + x.indexer_row_bytes for x in att),
                          pads=st.pads)

    def _check_bytes(self, res: HandoffResult, blobs, empties, t: int, kv_first: dict[int, tuple[int, int]]) -> str:
        """The exported state must hold what the stage holds."""
        for s, ((full, part), (e_full, e_part), sb) in enumerate(zip(blobs, empties, res.bytes, strict=True)):
            if part == full and not ((sb.recurrent_layers or sb.swa_layers) and sb.attention_layers):
                # a plain KV cache (or a recurrent-only one) ignores PARTIAL_ONLY: everything is one kind
                total = len(full) - e_full
                rec, kv = (total, 0) if sb.recurrent_layers else (0, total)
            else:
                rec = len(part) - e_part
                kv = (len(full) - len(part)) - (e_full - e_part)
            sb.recurrent_bytes = rec
            if (sb.recurrent_layers or sb.swa_layers) and rec <= 0:
                return (f"stage {s} ({sb.range[0]}:{sb.range[1]}, first layer {sb.first_layer}) has "
                        f"{sb.recurrent_layers} recurrent and {sb.swa_layers} sliding-window layer(s) but exported no "
                        f"partial (recurrent/SWA) state at t={t}")
            # the non-partial bytes grow by the same amount for every position (plus constant per-layer headers)
            if s not in kv_first:
                kv_first[s] = (t, kv)
                continue
            per = (kv - kv_first[s][1]) / (t - kv_first[s][0])
            if sb.attention_layers:
                if sb.kv_bytes_per_token is not None and per != sb.kv_bytes_per_token:
                    return (f"stage {s} exported KV bytes that do not grow by the same amount per position "
                            f"({sb.kv_bytes_per_token:g} then {per:g} at t={t})")
                sb.kv_bytes_per_token = per
                if per < sb.kv_row_bytes:
                    return (f"stage {s} exports {per:g} KV bytes per position, less than the {sb.kv_row_bytes} bytes "
                            "its attention layers' K/V (and indexer) rows need")
            elif per > CELL_META:
                # no full-attention layer: no K/V rows, but a sliding-window model's base cache (llama.cpp's iSWA
                # pair) still writes each cell's metadata with no layer at all — position, sequence count, one
                # sequence id: CELL_META bytes a position
                return (f"stage {s} has no full-attention layer but its non-partial export grows by {per:g} bytes "
                        f"per position at t={t}, more than a KV cell's metadata ({CELL_META} B): rows it cannot "
                        "have")
            if sb.attention_layers and sb.kv_bytes_per_token is None and t == self._offsets()[-1]:
                return f"stage {s}: a single hand-off offset cannot show KV bytes per position; use a longer prompt"
        return ""


def report(fixture: Path, cfg: HandoffConfig) -> Report:
    return Handoff(fixture, cfg).report()


ORACLE = Oracle(name="handoff", config=HandoffConfig, run=report, format=lambda rep: format_report(rep.native),
                per_cut=True, narrow=select("modes", lambda f: f.phase), shrink=(("tokens", 1), ("prompt_len", 3)),
                case_fields=("tokens", "prompt_len", "prompt", "chunk", "n_ubatch", "offsets", "modes", "seed"))
