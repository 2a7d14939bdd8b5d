"""The fake `skippy-correctness` binary: `python -m tests.fake_skippy.correctness LANE ...`.

A test double of skippy's correctness harness (Mesh-LLM/mesh-llm skippy-correctness, as read from the public
sources; see docs/skippy.md): the lanes single-step, chain, split-scan and state-handoff with skippy's
flags, report shapes (printed pretty to stdout and written to --report-out) and exits — a mismatch is
`Error: staged execution did not match full-model baseline` and exit 1 unless --allow-mismatch, any other error
`Error: <message>` and exit 1, bad arguments argparse's exit 2.

Unlike skippy, the fake does not start `serve-binary` children (its --stage-server-bin and bind-address flags are
accepted and ignored): each stage runs in its own llama.cpp worker process, driven from here. The full-model
baseline and every stage are the real llama.cpp (tests/fake_skippy/common.py); stages are cut by synth.stage.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import shutil
import signal
import sys
from pathlib import Path
from typing import Any

from tests.fake_skippy.common import (
    HANDOFF_PAYLOADS,
    FakeError,
    Params,
    StageFile,
    StageWorker,
    bug,
    check_arch,
    close_workers,
    fail,
    hang_forever,
    write_report,
)

MISMATCH = "staged execution did not match full-model baseline"


class Run:
    """One lane's workers and stage files, taken down when the lane ends."""

    def __init__(self, args: argparse.Namespace):
        from tests.fake_skippy.common import workdir

        self.args = args
        self.model = str(args.model)
        n_batch = args.n_batch or 64
        self.params = Params(n_ctx=args.ctx_size, n_batch=n_batch, n_ubatch=args.n_ubatch or n_batch,
                             flash_attn=args.flash_attn == "enabled", timeout=max(float(args.startup_timeout_secs), 60))
        self.dir = workdir()
        self.workers: list[StageWorker] = []
        self._source: Any = None

    def close(self) -> None:
        close_workers(self.workers)
        shutil.rmtree(self.dir, ignore_errors=True)

    def worker(self, name: str) -> StageWorker:
        w = StageWorker(name, self.params)
        self.workers.append(w)
        return w

    @property
    def source(self) -> Any:
        if self._source is None:
            from synth.errors import UserError
            from synth.stage import SourceModel

            try:
                self._source = SourceModel(self.model)
            except UserError as e:
                raise FakeError(str(e)) from None
        return self._source

    @property
    def n_layer(self) -> int:
        return int(self.source.info.n_layer)

    @property
    def layer_end(self) -> int:
        end = self.args.layer_end if self.args.layer_end is not None else self.n_layer
        if not 0 < end <= self.n_layer:
            raise FakeError(f"--layer-end {end} is outside 1..{self.n_layer} (the model has {self.n_layer} layers)")
        return end

    def stage(self, a: int, b: int) -> StageFile:
        from tests.fake_skippy.common import stage_file

        return stage_file("runtime-slice", self.model, a, b, self.dir, self.source)

    def load_stage(self, w: StageWorker, a: int, b: int, *, last: bool) -> StageFile:
        sf = self.stage(a, b)
        w.load(sf.path, last=last, sf=sf)
        return sf

    def tokens(self, w: StageWorker) -> list[int]:
        toks = w.tokenize(self.args.prompt)
        if not toks:
            raise FakeError(f"prompt {self.args.prompt!r} has no tokens in the model's vocabulary")
        if len(toks) + 1 > self.params.n_ctx:
            raise FakeError(f"prompt has {len(toks)} tokens; --ctx-size {self.params.n_ctx} is too small")
        return toks

    def identity(self) -> dict[str, Any]:
        return {"model_id": self.args.model_id or Path(self.model).stem, "path": self.model}

    def stage_model(self, i: int, a: int, b: int) -> dict[str, Any]:
        # runtime-slice stages load the full model and keep [a, b): its path is the model's
        return {"stage_index": i, "layer_start": a, "layer_end": b, "load_mode": "runtime-slice",
                "model_path": self.model}

    def split(self, k: int) -> int:
        if not 0 < k < self.layer_end:
            raise FakeError(f"split layer {k} is outside 1..{self.layer_end - 1}")
        return k


def parse_splits(text: str) -> list[int]:
    """`A,B,...`, or a range `A..B` (B excluded, as skippy's Rust-style ranges) / `A..=B` (B included)."""
    m = re.fullmatch(r"\s*(\d+)\s*\.\.(=?)\s*(\d+)\s*", text)
    if m:
        a, b = int(m.group(1)), int(m.group(3)) + (1 if m.group(2) else 0)
        return list(range(a, b))
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise FakeError(f"--splits {text!r}: expected A,B,... or A..B") from None


# ---- lanes ------------------------------------------------------------------------------------------------------

def baseline(run: Run, full: StageWorker) -> tuple[list[int], dict[str, Any]]:
    full.load(run.model, last=True)
    toks = run.tokens(full)
    return toks, {"token_id": toks[-1], "predicted_token": full.decode(0, tokens=toks)}


def chain_predict(stages: list[StageWorker], toks: list[int]) -> int:
    """The prompt through stages in order (each stage's boundary rows feed the next); the last one's argmax."""
    x: Any = stages[0].decode(0, tokens=toks)
    for w in stages[1:]:
        x = w.decode(0, rows=x)
    return int(x)


def single_step_report(run: Run, base: dict[str, Any], toks: list[int], k: int, s0: StageWorker,
                       s1: StageWorker) -> dict[str, Any]:
    end = run.layer_end
    run.load_stage(s0, 0, k, last=False)
    run.load_stage(s1, k, end, last=True)
    pred = chain_predict([s0, s1], toks)
    width = s0.n_embd
    matches = pred == base["predicted_token"]
    return {"mode": "single-step", "status": "pass" if matches else "fail", "model_identity": run.identity(),
            "matches": matches, "baseline": base,
            "split": {"token_id": toks[-1], "predicted_token": pred, "activation_width": width,
                      "boundary": {"producer_stage_index": 0, "layer_start": 0, "layer_end": k,
                                   "token_count": len(toks), "payload_bytes": len(toks) * width * 4,
                                   "wire_payload_bytes": len(toks) * width * 4}},
            "stage_models": [run.stage_model(0, 0, k), run.stage_model(1, k, end)]}


def single_step(run: Run) -> dict[str, Any]:
    k = run.split(run.args.split_layer)
    full, s0, s1 = run.worker("full model"), run.worker("stage 0"), run.worker("stage 1")
    toks, base = baseline(run, full)
    return single_step_report(run, base, toks, k, s0, s1)


def split_scan(run: Run) -> dict[str, Any]:
    splits = [run.split(k) for k in parse_splits(run.args.splits)]
    if not splits:
        raise FakeError("--splits names no split layer")
    full, s0, s1 = run.worker("full model"), run.worker("stage 0"), run.worker("stage 1")
    toks, base = baseline(run, full)
    results = [single_step_report(run, base, toks, k, s0, s1) for k in splits]
    bad = sum(not r["matches"] for r in results)
    return {"mode": "split-scan", "status": "pass" if bad == 0 else "fail", "model_identity": run.identity(),
            "baseline": base, "split_count": len(results), "mismatch_count": bad, "results": results}


def chain(run: Run) -> dict[str, Any]:
    splits = parse_splits(run.args.splits)
    if len(splits) != 2 or not splits[0] < splits[1]:
        raise FakeError(f"chain requires exactly two increasing --splits, got {run.args.splits!r}")
    a, b = (run.split(k) for k in splits)
    end = run.layer_end
    full = run.worker("full model")
    stages = [run.worker(f"stage {i}") for i in range(3)]
    toks, base = baseline(run, full)
    ranges = [(0, a), (a, b), (b, end)]
    for i, (w, (lo, hi)) in enumerate(zip(stages, ranges, strict=True)):
        run.load_stage(w, lo, hi, last=i == 2)
    pred = chain_predict(stages, toks)
    matches = pred == base["predicted_token"]
    return {"mode": "chain", "status": "pass" if matches else "fail", "model_identity": run.identity(),
            "matches": matches, "baseline": base, "token_id": toks[-1], "predicted_token": pred,
            "activation_width": stages[0].n_embd,
            "stages": [{"stage_index": i, "layer_start": lo, "layer_end": hi, "forwarded_over_binary": True,
                        "returned_predicted_token": pred} for i, (lo, hi) in enumerate(ranges)],
            "stage_models": [run.stage_model(i, lo, hi) for i, (lo, hi) in enumerate(ranges)]}


def state_handoff(run: Run) -> dict[str, Any]:
    """The stage [a, b) hands its state over: a source context prefills the first N prompt tokens and exports its
    state; a fresh restore context (another worker process) imports it, prefills the rest and predicts — through
    the stages [b, L) — the token the source predicts going on without a hand-off. Then R cache hits: import again,
    each must predict the same."""
    args = run.args
    end = run.layer_end
    a = args.state_layer_start
    b = args.state_layer_end if args.state_layer_end is not None else end
    if not 0 <= a < b <= end:
        raise FakeError(f"state layers {a}..{b} are outside 0..{end}")
    kind = args.state_payload_kind
    up = run.worker("upstream stage") if a > 0 else None
    src, dst = run.worker("source stage"), run.worker("restore stage")
    down = run.worker("downstream stage") if b < end else None
    sf = run.load_stage(src, a, b, last=down is None)
    dst.load(sf.path, last=down is None, sf=sf)
    if up is not None:
        run.load_stage(up, 0, a, last=False)
    if down is not None:
        run.load_stage(down, b, end, last=True)
    width = src.n_embd
    if args.activation_width is not None and args.activation_width != width:
        raise FakeError(f"--activation-width {args.activation_width} does not match the model's activation width "
                        f"{width}")
    toks = run.tokens(src)
    n = len(toks)
    pre = args.prefix_token_count if args.prefix_token_count is not None else n - 1
    if not 0 < pre < n:
        raise FakeError(f"--prefix-token-count {pre} must be in 1..{n - 1} (the prompt has {n} tokens)")

    def inputs(lo: int, hi: int) -> dict[str, Any]:
        if up is None:
            return {"tokens": toks[lo:hi]}
        return {"rows": up.decode(lo, tokens=toks[lo:hi])}

    head, tail = inputs(0, pre), inputs(pre, n)  # the stage's input, as its upstream computes it for each part

    def suffix(w: StageWorker) -> tuple[Any, bytes]:
        """The stage's output for the rest of the prompt, and its bits (boundary rows, or the last row's logits)."""
        out = w.decode(pre, logits=True, **tail)
        return (out[0], out[1].tobytes()) if down is None else (out, out.tobytes())

    def finish(stage_head: Any, stage_tail: Any) -> int:
        """The prediction after the stage's output for the prompt: through [b, L) if the stage is not last."""
        if down is None:
            return int(stage_tail)
        down.reset()
        down.decode(0, rows=stage_head)
        return int(down.decode(pre, rows=stage_tail))

    partial = kind == "recurrent-only"
    src.reset()
    src_head = src.decode(0, **head)
    blob = src.export_state(partial=partial)
    full_bytes = len(src.export_state(exported=False))
    partial_bytes = len(src.export_state(partial=True, exported=False))
    src_tail, src_bits = suffix(src)
    src_pred = finish(src_head, src_tail)

    def restore() -> tuple[int | None, bool, bytes | None, str | None]:
        """(prediction, whether the stage's output bits equal the source's, the re-exported state, an error)."""
        try:
            dst.reset()
            dst.import_state(blob, kind)
            again = dst.export_state(partial=partial, exported=False)
            out, bits = suffix(dst)
            return finish(src_head, out), bits == src_bits, again, None
        except FakeError as e:  # e.g. a payload without the KV: llama.cpp refuses the positions that follow
            return None, False, None, str(e)

    restored, output_ok, again, error = restore()
    hits = [restore()[:2] for _ in range(max(args.cache_hit_repeats, 0))]
    pred_ok = restored == src_pred
    roundtrip_ok = again == blob
    hits_ok = all(h == src_pred and same for h, same in hits)
    # restored_output_matches: the stage's own output after the import, bit for bit (the fake's reading of
    # skippy's optional field of that name): a hand-off that moves no predicted token still shows here
    matches = pred_ok and roundtrip_ok and output_ok and hits_ok
    stage_index = args.state_stage_index if args.state_stage_index is not None else (0 if a == 0 else 1)
    models = ([run.stage_model(0, 0, a)] if a > 0 else []) + [run.stage_model(stage_index, a, b)] + \
        ([run.stage_model(stage_index + 1, b, end)] if b < end else [])
    report = {"mode": "state-handoff", "status": "pass" if matches else "fail", "model_identity": run.identity(),
              "matches": matches, "predicted_token_matches": pred_ok, "roundtrip_state_matches": roundtrip_ok,
              "restored_output_matches": output_ok, "cache_hit_matches": hits_ok, "stage_index": stage_index,
              "layer_start": a, "layer_end": b,
              "state_payload_kind": kind, "source_predicted_token": src_pred, "restored_predicted_token": restored,
              "prompt_token_count": n, "requested_prefix_token_count": pre, "activation_width": width,
              "state_bytes": len(blob),
              # kv_bytes / recurrent_bytes: the fake's approximation — the sizes of the whole and of the partial
              # (recurrent / SWA) sequence state llama.cpp exports, not skippy's own split of the payload
              "payload_digest": {"payload_kind": kind, "payload_sha256": hashlib.sha256(blob).hexdigest(),
                                 "total_bytes": len(blob), "kv_bytes": full_bytes, "recurrent_bytes": partial_bytes},
              "cache_hit_repeats": args.cache_hit_repeats, "stage_models": models}
    if error:
        report["restore_error"] = error
    return report


LANES = {"single-step": single_step, "chain": chain, "split-scan": split_scan, "state-handoff": state_handoff}


# ---- CLI --------------------------------------------------------------------------------------------------------

def _runtime_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", "--model-path", dest="model", required=True)
    p.add_argument("--model-id")
    p.add_argument("--stage-model")
    p.add_argument("--stage-load-mode", default="runtime-slice",
                   choices=("runtime-slice", "artifact-slice", "layer-package"))
    p.add_argument("--layer-end", type=int)
    p.add_argument("--ctx-size", type=int, default=128)
    p.add_argument("--n-gpu-layers", type=int, default=0)
    p.add_argument("--n-batch", type=int)
    p.add_argument("--n-ubatch", type=int)
    p.add_argument("--prompt", default="Hello")
    p.add_argument("--flash-attn", default="auto", choices=("auto", "disabled", "enabled"))
    p.add_argument("--stage-server-bin")
    p.add_argument("--child-logs", action="store_true")
    p.add_argument("--startup-timeout-secs", type=float, default=60)
    p.add_argument("--max-inflight", type=int, default=4)
    p.add_argument("--report-out", required=True)
    p.add_argument("--allow-mismatch", action="store_true")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="skippy-correctness",
                                description="a FAKE skippy-correctness (test double) over the real llama.cpp")
    sub = p.add_subparsers(dest="lane", required=True)
    ss = sub.add_parser("single-step")
    _runtime_args(ss)
    ss.add_argument("--split-layer", type=int, required=True)
    ss.add_argument("--stage1-bind-addr")
    ss.add_argument("--require-native-mtp-draft", action="store_true")
    ch = sub.add_parser("chain")
    _runtime_args(ch)
    ch.add_argument("--splits", required=True)
    ch.add_argument("--stage1-bind-addr")
    ch.add_argument("--stage2-bind-addr")
    sc = sub.add_parser("split-scan")
    _runtime_args(sc)
    sc.add_argument("--splits", required=True)
    sc.add_argument("--stage1-bind-addr")
    sh = sub.add_parser("state-handoff")
    _runtime_args(sh)
    sh.add_argument("--source-bind-addr")
    sh.add_argument("--restore-bind-addr")
    sh.add_argument("--activation-width", type=int)
    sh.add_argument("--state-layer-start", type=int, default=0)
    sh.add_argument("--state-layer-end", type=int)
    sh.add_argument("--state-stage-index", type=int)
    sh.add_argument("--state-payload-kind", default="full-state", choices=HANDOFF_PAYLOADS)
    sh.add_argument("--prefix-token-count", type=int)
    sh.add_argument("--cache-hit-repeats", type=int, default=1)
    sh.add_argument("--runtime-lane-count", type=int)
    for flag in ("--borrow-resident-hits", "--cache-decoded-result-hits", "--skip-suffix-prefill-check",
                 "--synthetic-input-activation", "--binary-control"):
        sh.add_argument(flag, action="store_true")
    return p


class _Stop(BaseException):
    """SIGTERM / SIGINT."""


def _on_signal(signum: int, _frame: Any) -> None:
    raise _Stop(signum)


def matched(report: dict[str, Any]) -> bool:
    return report["mismatch_count"] == 0 if report["mode"] == "split-scan" else bool(report["matches"])


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    run: Run | None = None
    try:
        if args.stage_load_mode != "runtime-slice":
            raise FakeError(f"the fake skippy-correctness runs --stage-load-mode runtime-slice only, not "
                            f"{args.stage_load_mode}")
        check_arch(args.model)
        if bug() == "hangs":
            hang_forever()
        run = Run(args)
        report = LANES[args.lane](run)
    except FakeError as e:
        return fail(str(e))
    except _Stop:
        return fail("interrupted")
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if run is not None:
            run.close()
    if bug() == "malformed-report":  # the promised fields left out, and a clean exit
        report = {k: v for k, v in report.items() if k not in ("matches", "status", "mismatch_count")}
        print(write_report(report, args.report_out))
        return 0
    print(write_report(report, args.report_out))
    if not matched(report) and not args.allow_mismatch:
        return fail(MISMATCH)
    return 0


if __name__ == "__main__":
    sys.exit(main())
