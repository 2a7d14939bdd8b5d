"""The hand-off's cell-order excuse: a sliding-window model's restored window in other cells of the ring moves a
continuation only by the order attention sums the cells in — numerics as far as that order can move it, measured on
trusted data only (docs/oracles.md, "Sliding-window exports").

The control (what the same cells in another order move the uninterrupted run, with no export at all) runs on the
build's own llama.cpp worker (TRUSTED) whatever the target. The built-in target's exports are its own llama.cpp's;
any other target's — a mutant, skippy, a user's runtime behind cmd: — are checked before they are read: imported into
llama.cpp and exported again they must hold the same rows, and llama.cpp continuing from the target's hand-off
export must stay within the same bound.
"""

from __future__ import annotations

import itertools
from typing import Any

from fuzz.engine.contract import NUMERICS
from fuzz.engine.fleet import failure_reason
from fuzz.engine.parity import Trace, compare, run_chain
from fuzz.engine.schedule import Step, prompt_tokens
from fuzz.oracles.handoff_state import ORDER_FACTOR, order_verdict, same_cells, with_seq
from targets import Target

TRUSTED = "llama-cpp"
ORDER_FILLERS = tuple(range(1, 17))  # the cell-order control's shifts: a filler sequence's tokens before the sequence


class CellOrderExcuse:
    """What the hand-off oracle (fuzz.oracles.handoff.Handoff) adds to a finding whose restored caches hold the
    uninterrupted run's rows: the excuse, or the reason there is none. Uses its config, fleet, source workers,
    context params and positions per token."""

    def _order_excuse(self, stages, rec: dict[str, Any], row: dict[str, Any], cuts: list[int],
                      cells: dict[str, Any], exports: tuple[bytes, bytes, set[int]], s: int) -> dict[str, Any]:
        """The cell-order excuse, from trusted data only: the control (what the same cells in another order move the
        uninterrupted run) runs on the build's own llama.cpp worker (TRUSTED) whatever the target, and the target's
        move must stay within ORDER_FACTOR × it. Another target's exports are not read as truth: they must import
        into llama.cpp and come back out holding the same rows (`_check_exports`), and llama.cpp continuing from the
        target's hand-off export must stay within the same bound. {status numerics, cause} or {reason}."""
        trusted = self.cfg.target == TRUSTED
        control_on = self.src if trusted else self._trusted_stages(stages)
        control = None if control_on is None else self._order_control(
            stages, control_on, rec["steps"], rec["k"], rec["tokens"], cuts, rec["base"])
        cells["order_control"] = control
        if not trusted:
            cells["control_on"] = TRUSTED
            if control_on is None:
                bad = f"{TRUSTED} could not load the stages"
            elif control is None:
                bad = ""  # (no bound to check against: the control's failure is the reason below)
            else:
                bad = self._check_exports(stages, rec, row, cuts, exports, s, control, cells)
            if bad:
                return {"reason": f"{row['reason']}; the target's exports do not bear out the same cells: {bad}"}
        cause = order_verdict(cells, row["max_abs"], control)
        if cause:
            if not trusted:
                cause["detail"] += (f" (the control measured on {TRUSTED}; the target's exports imported there hold "
                                    f"the same rows, and its continuation from them moves "
                                    f"{cells['exports_checked']['moved']:.2g})")
            return {"status": NUMERICS, "cause": cause}
        return {"reason": row["reason"] + (
            f"; the same cells in another order move the uninterrupted run by {control:.2g}: "
            f"{row['max_abs']:.2g} is more than cell order" if control is not None
            else "; the cell-order control could not run")}

    def _trusted_stages(self, stages) -> list[Target] | None:
        """The build's own llama.cpp worker for each stage, loaded as the target's are; None if one cannot load."""
        if len(self.trusted) < len(stages):
            self.trusted += self.fleet.open(len(stages) - len(self.trusted), spec=TRUSTED, start=True)
        ts = self.trusted[:len(stages)]
        return ts if all(t.load(str(path), **self.params).ok for (path, _), t in zip(stages, ts, strict=True)) \
            else None

    def _check_exports(self, stages, rec: dict[str, Any], row: dict[str, Any], cuts: list[int],
                       exports: tuple[bytes, bytes, set[int]], s: int, control: float, cells: dict[str, Any]) -> str:
        """What an untrusted target's exports claim, checked on llama.cpp (the trusted workers, stages loaded):
        stage s's two exports the cell comparison read (the uninterrupted run's and the restored one's) imported
        and exported again must hold the same rows at the same positions; and every stage's hand-off export
        imported into a fresh llama.cpp context, continued there, must move the uninterrupted run by at most
        ORDER_FACTOR × `control`. '' when both hold (cells['exports_checked'] says what was measured), else why."""
        held, restored, positions = exports
        t = self.trusted[s]
        again = []
        for blob, seq in ((held, 0), (restored, 1)):
            r = t.load(str(stages[s][0]), **self.params)
            r = t.state_set(blob, seq=seq) if r.ok else r
            r = t.state_get(seq) if r.ok else r
            if not r.ok:
                return f"stage {s}'s export does not import into {TRUSTED}: {failure_reason(r.failure)}"
            again.append(r.data["blob"])
        same = same_cells(*again, positions)
        if not same or not same["same"]:
            return f"imported into {TRUSTED}, stage {s}'s exports {(same or {}).get('detail', 'are not that layout')}"
        params = self.busy_params if row["mode"] == "busy" else self.params
        k, steps, tokens = rec["k"], rec["steps"], rec["tokens"]
        ts = self.trusted[:len(stages)]
        for (path, _), d, (full, _) in zip(stages, ts, rec["blobs"], strict=True):
            r = d.load(str(path), **params)
            r = d.state_set(full, seq=1) if r.ok else r
            if not r.ok:
                return f"the hand-off export does not import into {TRUSTED}: {failure_reason(r.failure)}"
        chain, fail = run_chain(ts, [st.n_layer for _, st in stages], with_seq(steps[k:], 1), tokens[k:],
                                n_pos_per_token=self.n_pos)
        if fail:
            return f"{TRUSTED} could not continue from the target's hand-off export: {failure_reason(fail.failure)}"
        moved = compare(Trace(rec["base"].steps[k:], 0.0), chain, steps[k:], cuts)[1]
        cells["exports_checked"] = {"on": TRUSTED, "moved": moved}
        if moved > ORDER_FACTOR * control:
            return (f"{TRUSTED} continuing from the target's hand-off export moves the uninterrupted run by "
                    f"{moved:.2g}, more than {ORDER_FACTOR:g}× the cell-order control {control:.2g}")
        return ""

    def _order_control(self, stages, src: list[Target], steps: list[Step], k: int, tokens: list[list[int]],
                       cuts: list[int], base: Trace) -> float | None:
        """What the placement of a sequence's cells moves the uninterrupted run by, on the same stages, without any
        export: the schedule again with a filler sequence of ORDER_FILLERS tokens decoded first, so its cells sit
        that many cells later (attention meets them in other tiles and order), and once more with the filler removed
        at the hand-off point, so the continuation goes on into the cells it freed — the same positions and rows in
        other cells. The largest |Δlogit| over the continuation; None if a run failed."""
        sizes = [st.n_layer for _, st in stages]
        src = src[:len(stages)]
        worst = 0.0
        for m, freed in itertools.product(ORDER_FILLERS, (False, True)):
            filler = prompt_tokens(self.cfg.seed + 31 + m, m, self.info.n_vocab)
            first = [Step(filler, [1] * m, list(range(m)), "prefill"), *steps[:k]]
            _, fail = run_chain(src, sizes, first, [filler, *tokens[:k]], n_pos_per_token=self.n_pos, reset=True)
            if fail or (freed and any(not s.call("seq_rm", seq=1, p0=-1, p1=-1).ok for s in src)):
                return None
            chain, fail = run_chain(src, sizes, steps[k:], tokens[k:], n_pos_per_token=self.n_pos)
            if fail:
                return None
            worst = max(worst, compare(Trace(base.steps[k:], 0.0), chain, steps[k:], cuts)[1])
        return worst
