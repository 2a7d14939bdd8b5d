"""`skippy` oracle: skippy's split serving against its own unsplit serving, through its binaries (targets/skippy.py).

Per cut set, skippy's stages (`serve-binary`, StageConfigs written here, downstream first) answer greedy
/v1/completions that must equal the unsplit model's (`serve-openai --model-path`) on the same prompt — text and token
count, skippy's API giving no token ids — and skippy's own correctness lanes run on the same fixture and cuts, their
JSON reports read into this contract. The checks:

  load           the unsplit model loads (serve-openai) and answers 32 tokens
  serve          the split's answers equal the unsplit model's, prompt by prompt
  wire           the same with the activations crossing each boundary in a codec (StageConfig activation_codec):
                 f16 gated, bf16 and the 8-bit codec measured
  prefix         stages with kv_cache lookup-record (payload auto): a prompt, the prompt extended, the prompt again —
                 each equal to the uncached answer (a restore that loses state diverges: B1, B5)
  repeat         the same request again on the same stages: the same answer (determinism)
  concurrent     distinct prompts at once through the stages' lanes: each as alone (isolation)
  single-step    skippy-correctness single-step --split-layer C for each single cut
  chain          skippy-correctness chain --splits A,B for each two-cut set
  split-scan     skippy-correctness split-scan over the cut sets' cuts (one run)
  state-handoff  skippy-correctness state-handoff of each stage, for the payload kinds its layers need

Every case ends in one of the users' outcomes (pass, mismatch, unsupported, model-invalid, timeout, harness,
runtime-error; scripts/lib/family-outcome.sh), kept in the case and mapped to this contract's statuses — a harness
outcome (a malformed report) is never a pass. A failing case is run once more on fresh processes before it is
reported (reproduced or not). Model ids are neutral (`fixture-<sha>`): no name can rescue a family.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fuzz.engine.case_oracle import CaseOracle, finding_of
from fuzz.engine.contract import (
    CRASH,
    FINDING,
    NUMERICS,
    PASS,
    TIMEOUT,
    UNSUPPORTED,
    Finding,
    Oracle,
    Report,
    select,
)
from fuzz.engine.fleet import Fleet, fixture_header
from fuzz.engine.stages import KIND_LETTER, cut_sets, pattern_period
from fuzz.oracles.wire import (
    NEAR_TIE,  # a gated flip where the unsplit model's top-2 margin is below this is not judged
)
from synth.errors import UserError
from synth.inspect import inspect_file
from targets import Target, open_target

CHECKS = ("load", "serve", "wire", "prefix", "repeat", "concurrent", "single-step", "chain", "split-scan",
          "state-handoff")
HTTP_CHECKS = ("serve", "wire", "prefix", "repeat", "concurrent")
# our wire names → skippy's activation codecs; f16 is a gate (the users' battery: f32 and f16 hard gates), the
# others are measured (s8-row is skippy's 8-bit codec: per-row scales, not q8_0's blocks of 32)
CODEC_OF = {"f16": "f16-rne-v1", "bf16": "bf16-rne-v1", "q8_0": "s8-row-f32-rne-v1"}
GATED = ("f16",)
PAYLOADS = ("resident-kv", "recurrent-only", "kv-recurrent", "full-state")  # skippy-correctness --state-payload-kind
STATUS_OF = {"pass": PASS, "mismatch": FINDING, "model-invalid": FINDING, "harness": FINDING,
             "unsupported": UNSUPPORTED, "timeout": TIMEOUT, "runtime-error": CRASH}


@dataclass
class SkippyRunConfig:
    checks: tuple[str, ...] = CHECKS
    cuts: str = "half"  # half (L/2), thirds (the users' chain), all, period, or cut lists "3;5;2,6"
    period: int | None = None
    tokens: int = 8  # max_tokens per completion
    prompt_len: int = 24  # letters of a prompt (skippy reads text; our fixtures' tokenizer reads a, b and ab)
    prompts: int = 2
    prefix: int = 4  # state-handoff --prefix-token-count; kv_cache min_tokens
    wires: tuple[str, ...] = tuple(CODEC_OF)  # the wire check's codecs
    payloads: tuple[str, ...] = PAYLOADS  # the state-handoff check's payload kinds (where a stage needs them)
    seed: int = 0
    target: str = ""
    timeout: float = 900.0  # per worker call, at least the config's own timeouts (they stop skippy first) + a minute


def plan_cuts(spec: str, n_layer: int, period: int) -> list[list[int]]:
    if spec == "half":
        return [[max(1, n_layer // 2)]]
    if spec == "thirds":
        a, b = max(1, n_layer // 3), max(2, 2 * n_layer // 3)
        return [[a, b]] if 0 < a < b < n_layer else [[max(1, n_layer // 2)]]
    return cut_sets(spec, n_layer, 2, period)


def prompts_for(seed: int, n: int, letters: int) -> list[str]:
    rng = np.random.Generator(np.random.PCG64(seed))
    return ["".join("ab"[int(x)] for x in rng.integers(0, 2, letters)) for _ in range(n)]


def payload_kinds(kinds: str) -> list[str]:
    """The state-handoff payloads a stage of these layer kinds needs: its own kind, and the whole state."""
    recurrent = any(k in "RB" for k in kinds)
    attention = any(k in "AB" for k in kinds)
    own = "kv-recurrent" if recurrent and attention else "recurrent-only" if recurrent else "resident-kv"
    return [own, "full-state"] if attention or recurrent else ["full-state"]


class Skippy(CaseOracle[dict[str, Any]]):
    name, sections = "skippy", ("skippy",)

    def __init__(self, fixture: Path, cfg: SkippyRunConfig):
        super().__init__(fixture, cfg)
        if not cfg.target.startswith("skippy:"):
            raise UserError(f"--target {cfg.target!r}: the skippy oracle drives skippy: use --target skippy:CONFIG")
        self.info = info = inspect_file(str(fixture))
        self.n_layer, self.n_embd = info.n_layer, info.n_embd
        self.kinds = "".join(KIND_LETTER[x.kind] for x in info.layers)
        self.sha = hashlib.sha256(self.fixture.read_bytes()).hexdigest()
        self.model_id = f"fixture-{self.sha[:12]}"  # neutral: no family name in it
        self.prompts = prompts_for(cfg.seed, max(cfg.prompts, 3 if "concurrent" in cfg.checks else 1),
                                   cfg.prompt_len)
        self.ext = prompts_for(cfg.seed + 1, 1, max(4, cfg.prompt_len // 2))[0]
        self.sets = plan_cuts(cfg.cuts, self.n_layer, cfg.period or pattern_period(self.kinds))
        self.refs: dict[str, dict[str, Any]] = {}
        self.ident: dict[str, Any] = {}
        self.load_failure: str | None = None

    # ---- running ------------------------------------------------------------------------------------------
    def fleet_timeout(self) -> float:
        """A call starts several processes (each up to skippy's `ready`) or one correctness lane: the worker answers
        after skippy's own timeouts have stopped it."""
        from targets.skippy import read_config

        own = read_config(self.cfg.target[len("skippy:"):]).timeouts
        return max(self.cfg.timeout, own["lane"] + own["request"] + 4 * own["ready"] + 60)

    def open(self, fleet: Fleet) -> None:
        self.t = fleet.one()
        hello = self.t.hello()
        self.ident = hello.data.get("skippy", {}) if hello.ok else {}
        self.commit = self.ident.get("llama_cpp")

    def cases(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for check in self.cfg.checks:
            if check == "load":
                out.append({"check": check, "cuts": []})
            elif check == "wire":
                out += [{"check": check, "cuts": cs, "wire": w} for cs in self.sets for w in self.cfg.wires]
            elif check in HTTP_CHECKS:
                out += [{"check": check, "cuts": cs} for cs in self.sets]
            elif check == "single-step":
                out += [{"check": check, "cuts": cs} for cs in self.sets if len(cs) == 1]
            elif check == "chain":
                out += [{"check": check, "cuts": cs} for cs in self.sets if len(cs) == 2]
            elif check == "split-scan":
                singles = sorted({c for cs in self.sets for c in cs})
                out.append({"check": check, "cuts": singles})
            elif check == "state-handoff":
                for cs in self.sets:
                    bounds = [0, *cs, self.n_layer]
                    for i in range(len(bounds) - 1):
                        for kind in [k for k in payload_kinds(self.kinds[bounds[i]:bounds[i + 1]])
                                     if k in self.cfg.payloads]:
                            out.append({"check": check, "cuts": cs, "stage": i, "payload": kind,
                                        "layers": [bounds[i], bounds[i + 1]]})
        return out

    def identity(self, case: dict[str, Any]) -> dict[str, Any]:
        return case

    def observe(self, case: dict[str, Any]) -> dict[str, Any]:
        """The case through skippy: its users' outcome and what it saw (never a Failure: a call that failed is an
        outcome, timeout or runtime-error)."""
        t0 = time.perf_counter()
        run = self.load_case if case["check"] == "load" else self.http_case if case["check"] in HTTP_CHECKS \
            else self.lane_case
        return {**run(self.t, case), "seconds": round(time.perf_counter() - t0, 2)}

    def judge(self, case: dict[str, Any], seen: dict[str, Any]) -> list[dict[str, Any]]:
        """The outcome in this contract's statuses; a flip the unsplit model's near-tie excuses is numerics."""
        res = {**case, **seen, "status": NUMERICS if "near_tie" in seen else STATUS_OF[seen["outcome"]]}
        if res["status"] == UNSUPPORTED:
            res["reason"] = res.get("note", "")
        return [res]

    def same(self, row: dict[str, Any], again: list[dict[str, Any]]) -> bool:
        return any(a["status"] == row["status"] and a.get("outcome") == row["outcome"] for a in again)

    def again(self, case: dict[str, Any], seen: Any, bad: list[dict[str, Any]]) -> None:
        self.t.call("keep_logs")  # the first run's logs stay where its result names them
        super().again(case, seen, bad)  # on fresh processes

    def message(self, r: dict[str, Any]) -> str:
        return f"skippy {r['check']}" + (f" stage {r['stage']} ({r['payload']})" if "stage" in r else "") + \
            (f" {r['wire']}" if "wire" in r else "") + \
            f" at cuts {','.join(map(str, r['cuts']))}: {r['outcome']}" + (f": {r['note']}" if r.get("note") else "")

    def finding(self, r: dict[str, Any]) -> Finding:
        """Placed by its check (phase) and its payload or wire (where); its cause the outcome, or the near-tie."""
        if "near_tie" in r:
            tie = r["near_tie"]
            cause = {"kind": "near-tie", "detail": f"the unsplit model's top-2 margin at step {tie['step']} is "
                                                   f"{tie['margin']:.1e} (< {NEAR_TIE:g}): a flip there is not judged"}
        else:
            cause = {"kind": r["outcome"], "detail": r.get("note", "")}
        return finding_of(self.name, r, self.message(r), phase=r["check"], where=r.get("payload") or r.get("wire"),
                          cause=cause)

    def record(self, results: list[dict[str, Any]]) -> dict[str, Any]:
        return {**fixture_header(self.fixture, self.info, target=self.cfg.target, commit=self.commit),
                "config": {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self.cfg).items()},
                "skippy": {**self.ident, "model_id": self.model_id, "fixture_sha256": self.sha}}

    def reference(self, t: Target, prompt: str) -> dict[str, Any]:
        """The unsplit model's answer (serve-openai), once per prompt."""
        if prompt not in self.refs:
            if self.load_failure is None and not self.refs:
                r = t.load(str(self.fixture), model_id=self.model_id)
                if not r.ok:
                    self.load_failure = r.failure.message
            if self.load_failure is not None:
                return {"error": f"the unsplit reference did not load: {self.load_failure}",
                        "outcome": outcome_of_failure(self.load_failure)}
            r = t.call("complete", via="reference", requests=[{"prompt": prompt, "max_tokens": self.cfg.tokens}])
            got = r.data["results"][0] if r.ok else {"error": r.failure.message,
                                                     "outcome": outcome_of_failure(r.failure.message)}
            if "error" in got:  # not kept: a reproduction asks again
                return got
            self.refs[prompt] = got
        return self.refs[prompt]

    def load_case(self, t: Target, _case: dict[str, Any]) -> dict[str, Any]:
        r = t.load(str(self.fixture), model_id=self.model_id)
        if not r.ok:
            return {"outcome": outcome_of_failure(r.failure.message), "note": r.failure.message}
        got = t.call("complete", via="reference", requests=[{"prompt": self.prompts[0], "max_tokens": 32}])
        if not got.ok:
            return {"outcome": outcome_of_failure(got.failure.message), "note": got.failure.message}
        ans = got.data["results"][0]
        if "error" in ans:
            return {"outcome": ans["outcome"], "note": ans["error"]}
        ok = bool(ans["text"]) and (ans.get("completion_tokens") or 0) >= 1
        return {"outcome": "pass" if ok else "mismatch", "answers": [ans],
                "note": "" if ok else f"the unsplit model answered {ans['text']!r} ({ans.get('completion_tokens')} "
                                      f"tokens) to a 32-token request"}

    def http_case(self, t: Target, case: dict[str, Any]) -> dict[str, Any]:
        check, cuts = case["check"], case["cuts"]
        kv = {"mode": "lookup-record", "payload": "auto", "min_tokens": self.cfg.prefix} if check == "prefix" else None
        asks: list[tuple[str, str]] = []  # (label, prompt) in the order sent
        p0 = self.prompts[0]
        if check in ("serve", "wire"):
            asks = [(f"prompt {i}", p) for i, p in enumerate(self.prompts[:max(1, self.cfg.prompts)])]
        elif check == "prefix":
            asks = [("warm", p0), ("extended", p0 + self.ext), ("again", p0)]
        elif check == "repeat":
            asks = [("first", p0), ("second", p0), ("third", p0)]
        else:  # concurrent: every prompt at once
            asks = [(f"prompt {i}", p) for i, p in enumerate(self.prompts)]
        refs = [self.reference(t, p) for _, p in asks]
        bad_ref = next((r for r in refs if "error" in r), None)
        if bad_ref is not None:
            return {"outcome": bad_ref["outcome"], "note": bad_ref["error"]}
        r = t.call("split", path=str(self.fixture), cuts=cuts, n_layer=self.n_layer, model_id=self.model_id,
                   **({"kv_cache": kv} if kv else {}),
                   **({"activation_codec": CODEC_OF[case["wire"]]} if check == "wire" else {}))
        if not r.ok:
            return {"outcome": outcome_of_failure(r.failure.message), "note": r.failure.message}
        logs = r.data.get("logs", [])
        if check == "concurrent":
            got = t.call("complete", via="split", concurrent=True,
                         requests=[{"prompt": p, "max_tokens": self.cfg.tokens} for _, p in asks])
            answers = got.data["results"] if got.ok else None
        else:
            answers = []
            for _, p in asks:  # one after another: the prefix check's order is its point
                got = t.call("complete", via="split", requests=[{"prompt": p, "max_tokens": self.cfg.tokens}])
                if not got.ok:
                    answers = None
                    break
                answers.append(got.data["results"][0])
        if answers is None:
            return {"outcome": outcome_of_failure(got.failure.message), "note": got.failure.message, "logs": logs}
        judged = []
        for (label, _), ref, ans in zip(asks, refs, answers, strict=True):
            if "error" in ans:
                return {"outcome": ans["outcome"], "note": f"{label}: {ans['error']}", "logs": logs}
            judged.append({"ask": label, "text": ans["text"], "reference": ref["text"],
                           "completion_tokens": ans.get("completion_tokens"), "cached_tokens": ans.get("cached_tokens"),
                           "same": ans["text"] == ref["text"]
                           and ans.get("completion_tokens") == ref.get("completion_tokens")})
        if check == "repeat":  # against the split's own first answer too (a drifting split that starts right)
            for j in judged[1:]:
                j["same"] = j["same"] and j["text"] == judged[0]["text"]
        first = next((j for j in judged if not j["same"]), None)
        out: dict[str, Any] = {"answers": judged, "logs": logs}
        if check == "prefix":
            out["cached_tokens"] = [j["cached_tokens"] for j in judged]
        if check == "wire":
            out["agreement"] = sum(j["same"] for j in judged) / len(judged)
            if case["wire"] not in GATED:  # measured, not promised
                return {**out, "outcome": "pass", "note": f"{case['wire']} measured: {out['agreement']:.0%} of "
                                                          f"answers as unsplit"}
        if first is None:
            return {**out, "outcome": "pass", "note": ""}
        def first_difference(j: dict[str, Any]) -> int:
            return next((i for i, (a, b) in enumerate(zip(j["text"], j["reference"], strict=False)) if a != b),
                        min(len(j["text"]), len(j["reference"])))

        at = first_difference(first)
        if check == "wire":  # a gate with near-ties excused, as our own wire oracle's (skippy gives no logprobs)
            ties = [near_tie(self.fixture, dict(asks)[j["ask"]], j["reference"], first_difference(j), self.cfg.tokens)
                    for j in judged if not j["same"]]
            if all(x is not None and x["margin"] < NEAR_TIE for x in ties):  # every flip, not only the first
                out["near_tie"] = ties[0]
        return {**out, "outcome": "mismatch", "position": at,
                "note": f"{first['ask']}: the split answered {first['text'][:40]!r}, the unsplit model "
                        f"{first['reference'][:40]!r} (first difference at character {at}"
                        + (f"; {first['cached_tokens']} prompt tokens restored from the cache" if first[
                            "cached_tokens"] else "") + ")"}

    def lane_case(self, t: Target, case: dict[str, Any]) -> dict[str, Any]:
        check, cuts = case["check"], case["cuts"]
        args = ["--layer-end", str(self.n_layer), "--prompt", self.prompts[0]]
        if check == "single-step":
            args += ["--split-layer", str(cuts[0])]
        elif check == "chain":
            args += ["--splits", ",".join(map(str, cuts))]
        elif check == "split-scan":
            args += ["--splits", ",".join(map(str, cuts))]
        else:
            a, b = case["layers"]
            args += ["--state-layer-start", str(a), "--state-layer-end", str(b), "--state-stage-index",
                     str(case["stage"]), "--state-payload-kind", case["payload"], "--prefix-token-count",
                     str(self.cfg.prefix), "--cache-hit-repeats", "2", "--activation-width", str(self.n_embd)]
        r = t.call("correctness", lane=check, path=str(self.fixture), model_id=self.model_id, args=args)
        if not r.ok:
            return {"outcome": outcome_of_failure(r.failure.message), "note": r.failure.message}
        d = r.data
        out = {"outcome": d["outcome"], "note": d.get("note", ""), "exit_code": d["exit_code"], "logs": [d["log"]]}
        rep = d.get("report")
        if isinstance(rep, dict):
            out["report"] = summarize(check, rep)
        return out


def near_tie(fixture: Path, prompt: str, reference: str, at: int, tokens: int) -> dict[str, Any] | None:
    """The unsplit model's own top-1/top-2 logit margin at the step whose text holds character `at`, from the
    pinned llama.cpp (an extra opinion on the reference: skippy's API gives no logprobs) — None unless llama.cpp's
    greedy answer is skippy's unsplit answer, so the margin is of the step skippy took."""
    with open_target("llama-cpp") as t:
        if not t.load(str(fixture)).ok:
            return None
        toks = t.call("tokenize", text=prompt)
        g = t.generate(toks.data["tokens"], tokens) if toks.ok else None
        if g is None or not g.ok or t.call("detokenize", tokens=g.data["tokens"]).data.get("text") != reference:
            return None
        done = 0
        for step, tok in enumerate(g.data["tokens"]):
            done += len(t.call("detokenize", tokens=[tok]).data["text"])
            if done > at:
                top = np.sort(g.data["logits"][step])[::-1]
                return {"step": step, "token": int(tok), "margin": float(top[0] - top[1])}
    return None


def lane_config(row: Any, lane: str, target: str) -> SkippyRunConfig | None:
    """What a manifest lane runs through skippy (None: not driven through skippy yet). Hybrids sweep their cut
    offsets modulo the period where the lane is about boundaries; the rest cut at L/2 like the users' runner."""
    n = row.spec().n_layer
    hybrid = "boundary-sweep" in row.lanes
    edges = "period" if hybrid else "half"
    every = ";".join([*map(str, range(1, n)), *(",".join(map(str, cs)) for cs in plan_cuts("thirds", n, 1)
                                                 if len(cs) == 2)])
    plans = {"load": ("half", ("load",)), "parity": (every, ("serve", "single-step", "chain", "split-scan")),
             "boundary-sweep": ("period", ("serve", "single-step")), "fixed-split": ("half", ("serve", "single-step")),
             "dtype": ("half", ("serve",)), "isolation": ("half", ("concurrent",)), "wire": (edges, ("wire",)),
             "handoff": (edges, ("state-handoff",)), "determinism": ("half", ("repeat",)),
             "prefix-cache": (edges, ("prefix",))}
    if lane not in plans:
        return None
    cuts, checks = plans[lane]
    wires = tuple(w for w in row.wires if w in CODEC_OF) or tuple(CODEC_OF)
    return SkippyRunConfig(checks=checks, cuts=cuts, period=row.sweep_period, target=target, wires=wires)


def outcome_of_failure(message: str) -> str:
    """A worker call that failed: skippy's words decide the outcome (a hung call the engine killed: timeout)."""
    from targets.skippy import classify

    return classify("", message)


def summarize(check: str, rep: dict[str, Any]) -> dict[str, Any]:
    """The keys of a skippy-correctness report a reader of ours needs (the whole report stays in its log dir)."""
    keep = ("mode", "status", "matches", "mismatch_count", "split_count", "predicted_token_matches",
            "roundtrip_state_matches", "cache_hit_matches", "source_predicted_token", "restored_predicted_token",
            "state_payload_kind", "state_bytes", "predicted_token")
    out = {k: rep[k] for k in keep if k in rep}
    for side in ("baseline", "split"):
        if isinstance(rep.get(side), dict) and "predicted_token" in rep[side]:
            out[f"{side}_predicted_token"] = rep[side]["predicted_token"]
    if isinstance(rep.get("payload_digest"), dict):
        out["payload_digest"] = {k: rep["payload_digest"].get(k) for k in ("payload_kind", "kv_bytes",
                                                                            "recurrent_bytes", "total_bytes")}
    if check == "split-scan" and isinstance(rep.get("results"), list):
        out["mismatched_splits"] = [r.get("split", {}).get("boundary", {}).get("layer_end")
                                    for r in rep["results"] if isinstance(r, dict) and r.get("matches") is False]
    return out


def report(fixture: Path, cfg: SkippyRunConfig) -> Report:
    return Skippy(fixture, cfg).report()


def format_report(rep: Report) -> str:
    lines = [f"{rep.fixture}: {rep.arch}, {rep.n_layer} layers ({rep.kinds}), skippy "
             f"{rep.extra.get('skippy', {}).get('version_line') or '(no version line)'}"]
    for r in rep.results:
        lines.append(f"  {r['check']:<14} cuts {','.join(map(str, r['cuts'])):<8}"
                     + (f" stage {r['stage']} {r['payload']:<14}" if "stage" in r else "")
                     + f" {r['outcome']:<13} {r.get('note', '')}"[:200]
                     + (f" — numerics: the unsplit model's top-2 margin there is {r['near_tie']['margin']:.1e}"
                        if "near_tie" in r else ""))
    lines.append(f"{len(rep.findings)} findings")
    return "\n".join(lines)


def lane_detail(rep: Report) -> str:
    """One line for a lane: cases per outcome, and the first finding."""
    counts: dict[str, int] = {}
    for r in rep.results:
        word = "near-tie flip (numerics)" if r["status"] == NUMERICS else r["outcome"]
        counts[word] = counts.get(word, 0) + 1
    checks = ", ".join(dict.fromkeys(r["check"] for r in rep.results))
    why = next((r.get("note") for r in rep.results if r["outcome"] == "unsupported"), "")
    prefix = [c or 0 for r in rep.results if r["check"] == "prefix" for c in r.get("cached_tokens", ())]
    return (f"skippy {checks}: {len(rep.results)} cases, " + ", ".join(f"{v} {k}" for k, v in counts.items())
            + (f"; {sum(prefix)} prompt tokens restored from skippy's kv_cache" if prefix else "")
            + (f"; unsupported: {why}" if why and not rep.findings else "")
            + (f"; first: {rep.findings[0].message}" if rep.findings else ""))


def narrow(config: dict[str, Any], f: Finding) -> dict[str, Any]:
    """Only the finding's check, and its wire or payload kind."""
    out = select("checks", lambda g: g.phase)(config, f)
    key = {"wire": "wires", "state-handoff": "payloads"}.get(str(f.phase))
    return select(key, lambda g: g.where)(out, f) if key else out


ORACLE = Oracle(name="skippy", config=SkippyRunConfig, run=report, format=format_report, per_cut=True,
                narrow=narrow, shrink=(("tokens", 1), ("prompt_len", 4)),
                case_fields=("checks", "tokens", "prompt_len", "prompts", "prefix", "wires", "payloads", "seed"))
