"""`fuzz memory`: llama.cpp's memory operations in any order, each sequence checked against its own history.

A split runtime or a server does not follow a script: it decodes batches holding several sequences, forks a
sequence (seq_cp), rolls one back or cuts out its middle (seq_rm), keeps one (seq_keep), shifts positions
(seq_add / seq_div), moves a sequence's state to another id or another context (state get / set), and goes on
after an import the context refused. This oracle draws such programs — seeded, any operation after any other,
over several live sequences — and runs them on a real context, keeping a model of what every sequence holds:

- its cells' positions, so after every operation each sequence's [seq_pos_min, seq_pos_max] is what the memory
  must report (exact for a plain KV cache; a recurrent or hybrid memory reports its one state cell as both; a
  sliding-window cache may have dropped cells below the window, so there pos_min only has to lie between);
- its log: what a fresh context must be given to hold the same — its tokens decoded at their positions, then any
  removal, shift or division that is not a truncation (a truncation of a log of decodes is the shorter decodes:
  a rolled-back sequence must equal a recompute of the tokens it kept, recurrent state included).

After every decode, each decoded sequence's logits must equal its log replayed alone in a fresh context (one
sequence, the same chunks), within the tolerance (`tol_spread` of the logits' spread, or more where the batch-shape
control moves more): the machine's batches hold other sequences' tokens and its cells sit elsewhere, and upstream
promises no bits across batch shapes (the isolation lane measures that numerics at most ~1e-2 on every fixture; a
lost or foreign cell moves logits by ~1). A refused operation (seq_rm of a recurrent
sequence it cannot roll back, an import of a truncated blob) must change nothing but what it names: the other
sequences are checked as before, and every program ends with a decode of every live sequence.

Programs come from a seed (`engine` seeded: the lanes, campaigns) or from Hypothesis (`engine` hypothesis: a
RuleBasedStateMachine with one rule per operation, the same drawer choosing the arguments, Hypothesis shrinking).
A finding is run again from a fresh context (it must reproduce), shortened (runs of operations deleted, decodes
joined, sequences and tokens dropped while the same check still fails at the end: a bundle replays the program
exactly) and explained by controls that each change one thing (explain, memory_controls.py): rollbacks done as
recomputes, a decode elsewhere after one operation, the program without the other sequences and with other tokens for
them, the other KV layout, an f32 K cache for a shift. A difference the other sequences' mere presence explains (their
data provably not reaching it), or a shifted key's second f16 rounding within a bound measured on the program's own
history, is numerics.
"""

from __future__ import annotations

import contextlib
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from fuzz.engine.case_oracle import CaseOracle, finding_of
from fuzz.engine.contract import (
    CRASH,
    FAILING,
    FINDING,
    NUMERICS,
    PASS,
    UNSUPPORTED,
    Finding,
    Oracle,
    Report,
    fingerprint,
)
from fuzz.engine.fleet import Fleet, fixture_header
from fuzz.engine.parity import (
    context_params,
    pos_per_token,
)
from fuzz.engine.stages import FixtureStages
from fuzz.oracles.memory_controls import cache_name, cache_type, explain, layout, quantized
from fuzz.oracles.memory_machine import cache_params, hung, hypothesis_program, run_program
from fuzz.oracles.memory_model import (
    ROPE_SCALINGS,
    MemoryConfig,
    check_program,
    format_step,
    op_name,
)
from fuzz.oracles.memory_recompute import Feed, Recompute
from synth.errors import UserError
from synth.inspect import inspect_file
from synth.stage import Unsupported
from targets import Target

# what a finding failed, its `where`: logits, pos (the positions a sequence reports), refusal (an operation refused,
# or accepted, against the API), tokens (a state file gave back other tokens than were saved with it), crash (the
# target aborted or hung)
MINIMIZE_RUNS = 150  # programs tried while shortening one finding (each from a fresh context; recomputes cached)


def same_problem(a: dict[str, Any] | None, b: dict[str, Any] | None) -> bool:
    return a is not None and b is not None and a["check"] == b["check"] and a["op"] == b["op"]


def minimize(t: Target, fixture: Path, cfg: MemoryConfig, kv_unified: bool, recompute: Recompute,
             program: list[dict[str, Any]], problem: dict[str, Any]) -> list[dict[str, Any]]:
    """The program with whole runs of operations deleted (halves, then quarters, ... single ones), decodes in a row
    joined, then each decode's sequences dropped and their tokens cut to one, while the same check still fails at
    its last operation."""
    runs = 0

    def keeps(cand: list[dict[str, Any]]) -> bool:
        nonlocal runs, program, problem
        if runs >= MINIMIZE_RUNS:
            return False
        runs += 1
        try:
            done, got, _ = run_program(t, fixture, cfg, kv_unified, recompute, cand, None)
        except UserError:  # a shorter program outside the preconditions is no reproduction
            return False
        if same_problem(got, problem) and (len(done) < len(program) or done == cand):
            program, problem = done, got
            return True
        return False

    size = max(1, len(program) // 2)
    while size >= 1 and runs < MINIMIZE_RUNS:
        i, shrunk = 0, False
        while i + size < len(program):  # the failing (last) operation stays
            if keeps(program[:i] + program[i + size:]):
                shrunk = True
            else:
                i += size
        if not shrunk:
            size //= 2
    i = 0
    while i + 1 < len(program):  # two decodes in a row as one batch (a sequence's tokens joined)
        a, b = program[i], program[i + 1]
        if a["op"] == b["op"] == "decode" and i + 1 < len(program) - 1:
            toks: dict[int, list[int]] = {}
            for seq, tokens in a["parts"] + b["parts"]:
                toks.setdefault(seq, []).extend(tokens)
            if keeps(program[:i] + [{"op": "decode", "parts": [[q, x] for q, x in toks.items()]}] + program[i + 2:]):
                continue
        i += 1
    for i in range(len(program)):  # each decode: fewer sequences, then one token each
        j = 0
        while i < len(program) and program[i]["op"] == "decode" and j < len(program[i]["parts"]):
            parts = program[i]["parts"]
            fewer = [{"op": "decode", "parts": parts[:j] + parts[j + 1:]}] if len(parts) > 1 else []
            if fewer and keeps(program[:i] + fewer + program[i + 1:]):
                continue
            if len(parts[j][1]) > 1 and keeps(program[:i] + [{"op": "decode", "parts": [
                    *parts[:j], [parts[j][0], parts[j][1][:1]], *parts[j + 1:]]}] + program[i + 1:]):
                continue
            j += 1
    return program


# ---- the oracle ----------------------------------------------------------------------------------------------
def refused_cache(t: Target, fixture: Path, cfg: MemoryConfig, params: dict[str, Any]) -> str | None:
    """Why llama.cpp refuses a context with the config's KV cache types on this model (a head size their block does
    not divide, different K and V types on an MLA cache, ...), or None: it takes them (or none were asked)."""
    if not cache_params(cfg):
        return None
    r = t.load(str(fixture), **params)
    if r.ok or r.failure is None or r.failure.kind != "error" or r.failure.error_kind != "load_failed":
        return None  # (a crash or another failure: the machine's own load meets it and says so)
    return f"llama.cpp refuses {cache_name(cfg)} here: {r.failure.message}"


def stage_of(stack: contextlib.ExitStack, fixture: Path, stage: str, n_layer: int, t: Target,
             params: dict[str, Any]) -> tuple[Path, Feed, str | None]:
    """The file the machine runs (the model, or the stage A:B sliced from it for the run), what its decodes feed it,
    and why a stage cannot be expressed (None when it can)."""
    if not stage:
        return fixture, Feed(), None
    m = re.fullmatch(r"\s*(\d+)\s*:\s*(\d+)\s*", stage)
    if not m or not 0 <= int(m.group(1)) < int(m.group(2)) <= n_layer:
        raise UserError(f"--stage {stage!r}: write it as A:B with 0 <= A < B <= {n_layer} (layers [A, B))")
    a, b = int(m.group(1)), int(m.group(2))
    fs = FixtureStages(fixture)
    stack.enter_context(fs.workspace(None))
    st = fs.stage(a, b)
    if isinstance(st, Unsupported):
        return fixture, Feed(), f"stage {a}:{b}: {st}"
    path = st[0]
    if a == 0:
        return path, Feed(), None
    r = t.load(str(path), **params)
    if not r.ok:
        raise UserError(f"{fixture}: stage {a}:{b} does not load: {r.failure.message if r.failure else r.data}")
    return path, Feed(width=int(r.data["n_embd_inp"]), n_pos=pos_per_token(r.data)), None


def calibrated(recompute: Recompute, cfg: MemoryConfig, n_vocab: int,
               tolerance: dict[str, float] | None = None) -> dict[str, float]:
    """The recompute's tolerance and whether the model's own shifts are faithful, from the model's batch-shape and
    shift moves (measured on the recompute's fresh contexts unless `tolerance` already holds them: once per run)."""
    if not tolerance:
        move, spread = recompute.batch_shape_move(n_vocab)
        tolerance = {"batch_shape": move, "spread": spread,
                     "tolerance": max(cfg.tol, cfg.tol_spread * spread, cfg.noise_factor * move)}
        shift = recompute.shift_move(n_vocab)
        if shift is not None:
            tolerance["shift"] = shift
        if recompute.rope_type is not None:
            tolerance["rope_type"] = recompute.rope_type
    recompute.tol = tolerance["tolerance"]
    recompute.faithful_shifts = shifts_faithful(tolerance, cfg.noise_factor, cfg.type_k)
    return tolerance


def shifts_faithful(noise: dict[str, float], noise_factor: float, type_k: str) -> bool:
    """Whether a shift must equal decoding the same tokens at the new positions (the recompute then decodes them
    there; otherwise it replays the shift). A model whose positions are rotary (its rope type, as the target reports
    it, not LLAMA_ROPE_TYPE_NONE): a rotation by the shift is the whole of what the new positions change, so a shift
    that moves it is llama.cpp's to answer for, not excused by measuring it; a model without rotary positions (gpt2's
    absolute embeddings, ALiBi, recurrent state) and a target that does not say fall back to the measured move (its
    own shift within the tolerance). A shift of a quantized K cache quantizes the rotated keys again, which keys
    decoded at the new positions never are: replayed there (an f16 one rounds them again: the shift-rounding
    control)."""
    if quantized(type_k) or "shift" not in noise:
        return False
    return noise.get("rope_type", -1) >= 0 or noise_factor * noise["shift"] <= noise["tolerance"]


class Memory(CaseOracle[tuple[bool, int] | None]):
    """On the skeleton (fuzz.engine.case_oracle): its cases are the drawn programs, KV layout by layout (given one,
    or Hypothesis' shortest failing one, per layout), yielded while the layout can still run one: a program that
    cannot load a context ends its layout, one that hangs the run (each program more would wait out the timeout).
    A program's row says what it ran; a finding is run again from a fresh context (it must reproduce), then
    shortened and explained by the controls (memory_controls) — a crash too (the cache-type control)."""

    name = "memory"
    unit = "programs"
    sections = ("noise",)

    def __init__(self, fixture: Path, cfg: MemoryConfig):
        super().__init__(fixture, cfg)
        if cfg.n_seq < 2:
            raise UserError("--n-seq must be at least 2 (the operations move cells between sequences)")
        if cfg.engine not in ("seeded", "hypothesis"):
            raise UserError(f"--engine {cfg.engine!r}: seeded or hypothesis")
        if cfg.rope_scaling not in ("", *ROPE_SCALINGS) or cfg.rope_freq_scale < 0:
            raise UserError(f"--rope {cfg.rope_scaling}:{cfg.rope_freq_scale:g}: a scaling of "
                            f"{', '.join(ROPE_SCALINGS)} and a positive frequency scale (yarn:0.5)")
        self.program = check_program(cfg.program, cfg.n_seq) if cfg.program is not None else None
        self.info = inspect_file(str(self.fixture))
        self.tolerance: dict[str, float] = {}
        self.recomputes: dict[bool, Recompute] = {}
        self.stopped: set[bool] = set()  # layouts with nothing more to run: no context in them
        self.hang = False  # a program hung: nothing more runs (each program more would wait out the timeout)

    # ---- the skeleton's parts ---------------------------------------------------------------------------------
    def open(self, fleet: Fleet) -> None:
        cfg = self.cfg
        self.t, self.tr = fleet.open(2)
        self.ref_params = context_params(n_seq=1, capture=False, n_rs_seq=cfg.n_rs_seq, flash_attn=cfg.flash_attn,
                                         **cache_params(cfg))
        self.model, self.feed, why = stage_of(self.scope, self.fixture, cfg.stage, self.info.n_layer, self.tr,
                                              self.ref_params)
        self.why = why or refused_cache(self.tr, self.model, cfg, self.ref_params)

    def cases(self) -> Iterator[tuple[bool, int] | None]:
        cfg = self.cfg
        if self.why:
            yield None
            return
        for kvu in cfg.kv_unified:
            for k in range(self.per_layout):
                if self.hang:
                    return
                if kvu in self.stopped:
                    break
                yield kvu, k

    @property
    def per_layout(self) -> int:
        """Programs per KV layout: the drawn ones, or one (the given program, Hypothesis' shortest failing one)."""
        return 1 if self.program is not None or self.cfg.engine == "hypothesis" else self.cfg.programs

    def total(self, cases: Any) -> int:
        return len(self.cfg.kv_unified) * self.per_layout

    def identity(self, case: tuple[bool, int] | None) -> dict[str, Any]:
        return {} if case is None else {"kv_unified": case[0], "program": case[1]}

    def recompute(self, kvu: bool) -> Recompute:
        """The layout's reference (a fresh one-sequence context), its tolerance measured once per run."""
        if kvu not in self.recomputes:
            r = self.recomputes[kvu] = Recompute(self.tr, self.model, self.ref_params, self.feed)
            self.tolerance = calibrated(r, self.cfg, self.info.n_vocab, self.tolerance)
        return self.recomputes[kvu]

    def observe(self, case: tuple[bool, int] | None) -> dict[str, Any]:
        """The program (drawn from the seed, the given one, or Hypothesis' shortest failing one) in a fresh
        context, up to the first check it fails."""
        if case is None:
            return {"unsupported": self.why}
        kvu, k = case
        cfg = self.cfg
        given = self.program
        if given is None and cfg.engine == "hypothesis":
            given, row = hypothesis_program(self.t, self.model, cfg, kvu, self.recompute(kvu))
            if given is None:
                return {"examples": row}
        rng = np.random.default_rng([cfg.seed, k, int(kvu)])
        done, problem, mach = run_program(self.t, self.model, cfg, kvu, self.recompute(kvu), given, rng)
        self.commit = mach.commit
        return {"done": done, "problem": problem, "mach": mach}

    def judge(self, case: tuple[bool, int] | None, seen: dict[str, Any]) -> list[dict[str, Any]]:
        if "unsupported" in seen:
            return [{"status": UNSUPPORTED, "reason": seen["unsupported"], "kv_unified": None, "program": None,
                     "steps": 0, "checks": 0, "max_abs_dlogit": 0.0, "ops": {}, "refused": {}}]
        if "examples" in seen:
            return [seen["examples"]]
        kvu, k = case
        done, problem, mach = seen["done"], seen["problem"], seen["mach"]
        return [{"kv_unified": kvu, "program": k, "steps": len(done), "checks": mach.checks,
                 "max_abs_dlogit": mach.worst, "ops": dict(Counter(op_name(op) for op in done)),
                 "refused": dict(mach.refused),
                 "status": PASS if not problem else CRASH if problem["check"] == "crash" else FINDING}]

    def again(self, case: tuple[bool, int], seen: dict[str, Any], bad: list[dict[str, Any]]) -> None:
        """The operations as they ran (drawn under the model the machine kept, refusals included), from a fresh
        context: the same check must fail at the same operation."""
        kvu, _ = case
        seen["again"] = run_program(self.t, self.model, self.cfg, kvu, self.recompute(kvu), seen["done"], None,
                                    check=False)[1]
        for r in bad:
            r["reproduced"] = same_problem(seen["again"], seen["problem"])

    def explain_all(self, case: tuple[bool, int], seen: dict[str, Any], bad: list[dict[str, Any]]) -> None:
        """A drawn program that reproduced is shortened (a hang is not: each try would wait out the timeout; a given
        one, a bundle's, runs exactly as given); the controls say why it fails (a crash: the cache-type control),
        and numerics where they explain it. No context in this layout ends the layout; a hang ends the run."""
        (row,) = bad
        kvu, k = case
        cfg, recompute = self.cfg, self.recompute(kvu)
        done, problem, mach = seen["done"], seen["problem"], seen["mach"]
        hang = hung(problem)
        short = minimize(self.t, self.model, cfg, kvu, recompute, done, problem) if same_problem(
            seen["again"], problem) and self.program is None and not hang else done
        _, last, ran = run_program(self.t, self.model, cfg, kvu, recompute, short, None, check=False) \
            if not hang else (None, None, mach)
        final = last or problem
        crash = problem["check"] == "crash"
        cause = explain(self.t, self.model, cfg, kvu, recompute, short, final, mach.mem, ran.rows, ran.model.log) \
            if mach.mem and not crash else cache_type(self.t, self.model, cfg, kvu, recompute, short) \
            if crash and not hang else None
        if cause and cause.get("numerics"):  # explained as numerics: listed, not a finding
            row["status"] = NUMERICS
        row["finding"] = {**final, "kv_unified": kvu, "program": k, "status": row["status"],
                          "memory": mach.mem.name if mach.mem else None, "cause": cause,
                          "reproduced": row["reproduced"], "steps": short, "drawn_steps": len(done)}
        if problem["op"] == "load":
            self.stopped.add(kvu)
        self.hang = self.hang or hang

    def finding(self, row: dict[str, Any]) -> Finding:
        return memory_finding(row["finding"])

    def message(self, row: dict[str, Any]) -> str:
        return row["finding"]["message"]

    def timing(self, wall: float) -> dict[str, float]:
        return {"seconds": round(wall, 3)}

    def record(self, results: list[dict[str, Any]]) -> dict[str, Any]:
        return {**fixture_header(self.fixture, self.info, target=self.cfg.target, commit=self.commit),
                "config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.cfg.__dict__.items()},
                "findings": [r["finding"] for r in results if r["status"] in FAILING],
                "numerics": [r["finding"] for r in results if r["status"] == NUMERICS],
                "noise": self.tolerance if not self.why else {}}


def run(fixture: Path, cfg: MemoryConfig) -> dict[str, Any]:
    return Memory(Path(fixture), cfg).run()


def memory_finding(f: dict[str, Any]) -> Finding:
    """The contract's Finding; its fingerprint adds the operation that failed and the kinds of operation its shortest
    program needs — what tells one memory bug from another (a seq_keep that keeps a stream, a shift lost by an
    export) where the check and the layout alone would not."""
    out = finding_of("memory", f, f["message"], phase=layout(f["kv_unified"]), where=f["check"],
                     step=len(f["steps"]) - 1, seq=None,
                     detail={"program": f["steps"], "index": f["program"], "seq": f.get("seq"), "op": f["op"],
                             "drawn_steps": f["drawn_steps"],
                             **{k: f[k] for k in ("got", "want", "max_abs_dlogit", "failure") if k in f}})
    # (a coupled decode is a decode: the check that failed is the same, one token in several sequences or not)
    out.fingerprint = {**fingerprint(out, ""), "op": "decode" if f["op"] == "coupled" else f["op"],
                       "ops": sorted({op_name(op) for op in f["steps"]}), "memory": f.get("memory")}
    if f.get("cause") and f["cause"].get("op"):
        out.fingerprint["cause_op"] = f["cause"]["op"]
    if f.get("cause") and f["cause"].get("then"):
        out.fingerprint["cause_then"] = f["cause"]["then"]
    return out


def report(fixture: Path, cfg: MemoryConfig) -> Report:
    return Memory(Path(fixture), cfg).report()


def format_report(rep: dict[str, Any]) -> str:
    cfg = rep["config"]
    lines = [f"memory {rep['fixture']}: arch {rep['arch']}, {cfg['n_seq']} sequences, "
             + (f"the given program of {len(cfg['program'])} operations" if cfg["program"] else
                f"a Hypothesis state machine, up to {cfg['programs']} examples of {cfg['steps']} operations per KV "
                "layout" if cfg.get("engine") == "hypothesis" else
                f"{cfg['programs']} programs × {cfg['steps']} operations per KV layout")
             + (f", stage {cfg['stage']}" if cfg.get("stage") else "")
             + (", flash attention" if cfg.get("flash_attn") else "")
             + (f", RoPE scaling {cfg['rope_scaling']}" if cfg.get("rope_scaling") else "")
             + (f", frequency scale {cfg['rope_freq_scale']:g}" if cfg.get("rope_freq_scale") else "")
             + f", tolerance {rep.get('noise', {}).get('tolerance', cfg['tol']):.2g}: max({cfg.get('tol_spread', 0):g} "
             f"× the logits' spread {rep.get('noise', {}).get('spread', 0):.2g}, {cfg.get('noise_factor', 0):g} × the "
             f"batch-shape move {rep.get('noise', {}).get('batch_shape', 0):.2g})"]
    noise = rep.get("noise") or {}
    if "shift" in noise:
        faithful = shifts_faithful(noise, cfg.get("noise_factor", 0), cfg.get("type_k") or "")
        lines.append(f"  a whole-sequence shift moves the model by {noise['shift']:.2g} against its tokens decoded at "
                     "the new positions: " + ("shifted sequences are recomputed there" if faithful else
                                              "shifts are replayed in the recompute (checked for consistency only: "
                                              + ("a quantized K cache's shift quantizes the keys again)"
                                                 if quantized(cfg.get("type_k") or "") else
                                                 "its positions are not rotary)")))
    lines += [f"  unsupported: {r['reason']}" for r in rep["results"] if r["status"] == UNSUPPORTED]
    for kvu in cfg["kv_unified"]:
        rows = [r for r in rep["results"] if r["kv_unified"] == kvu]
        if not rows:
            continue
        ops = sum((Counter(r["ops"]) for r in rows), Counter())
        refused = sum((Counter(r["refused"]) for r in rows), Counter())
        bad = [r for r in rows if r["status"] != PASS]
        lines.append(f"  {layout(kvu):<10} {sum(r.get('examples', 1) for r in rows)} programs, "
                     f"{sum(r['steps'] for r in rows)} operations "
                     f"({', '.join(f'{k} {v}' for k, v in sorted(ops.items()))}), "
                     f"{sum(r['checks'] for r in rows)} logits checks, worst max|Δlogit| "
                     f"{max(r['max_abs_dlogit'] for r in rows):.2e}"
                     + (f"; refused: {', '.join(f'{k} {v}' for k, v in sorted(refused.items()))}" if refused else "")
                     + (f" — {len(bad)} failing" if bad else ": pass"))
    for f in rep.get("numerics", ()):
        lines.append(f"  NUMERICS ({layout(f['kv_unified'])}): {f['message']} after {len(f['steps'])} operations: "
                     f"{f['cause']['kind']}: {f['cause']['detail']}")
    for f in rep["findings"]:
        lines.append(f"  FINDING ({layout(f['kv_unified'])}, {f['check']}): {f['message']}; "
                     f"reproduced={f['reproduced']}; {len(f['steps'])} operations (drawn: {f['drawn_steps']}):")
        lines += [f"    {i}. {format_step(op)}" for i, op in enumerate(f["steps"])]
        lines.append(f"    cause: {f['cause']['kind']}: {f['cause']['detail']}" if f.get("cause") else
                     "    cause: none of the controls (rollback recomputed, deferred work settled, the other layout) "
                     "makes it pass")
    return "\n".join(lines)


def replay_of(config: dict[str, Any], f: Finding) -> dict[str, Any]:
    """The config that runs exactly the finding's (shortened) program, in its KV layout."""
    return {**config, "program": f.detail["program"], "kv_unified": [f.phase == "unified-kv"], "programs": 1}


def reduce_config(config: dict[str, Any]) -> list[dict[str, Any]]:
    """The program with one operation fewer (any but the last, which fails)."""
    p = config.get("program") or []
    return [{**config, "program": p[:i] + p[i + 1:]} for i in range(len(p) - 1)]


ORACLE = Oracle(name="memory", config=MemoryConfig, run=report, format=lambda rep: format_report(rep.native),
                replay_of=replay_of, reduce=reduce_config,
                case_fields=("programs", "steps", "n_seq", "max_len", "context", "n_rs_seq", "kv_unified", "tol",
                             "tol_spread", "noise_factor", "program", "engine", "stage", "seed", "flash_attn", "fill",
                             "type_k", "type_v", "swa_full", "rope_scaling", "rope_freq_scale"),
                # llama.cpp's memory classes serve every family: a bug is the check, the operation and its cause
                known_key=("status", "where", "op", "cause", "cause_op", "cause_then"))
