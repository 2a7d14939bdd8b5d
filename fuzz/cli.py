"""`fuzz`: run fixtures through a target and compare."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from fuzz.fixtures import fixture_path, parse_tokens
from fuzz.schedule import PHASES
from fuzz.sweep import Sweep, SweepConfig, format_report
from synth.cliutil import new_app, run
from synth.errors import UserError
from targets import TARGETS_HELP, open_target

app = new_app("The differential engine: run fixtures through real targets and compare.")
Opt = typer.Option

DEFAULT_PROMPT = "1,7,3,12,5,9,2,30,4,11,6,21,8,17,10,25"


@app.command("run")
def run_cmd(
    fixture: Annotated[str, typer.Argument(help="a .gguf file or a family name")],
    tokens: Annotated[int, Opt(help="greedy tokens to decode")] = 32,
    prompt: Annotated[str, Opt(help="prompt token ids")] = DEFAULT_PROMPT,
    chunk: Annotated[int, Opt(help="prefill chunk size")] = 64,
    target: Annotated[str, Opt(help=TARGETS_HELP)] = "llama-cpp",
) -> int:
    """Load FIXTURE in the target and greedy-decode; print what llama.cpp reports."""
    path = fixture_path(fixture)
    toks = parse_tokens(prompt)
    with open_target(target) as t:
        loaded = t.load(str(path))
        if not loaded.ok:
            if loaded.failure.kind == "error" and loaded.failure.error_kind in ("load_failed", "bad_request"):
                raise UserError(f"{path}: {loaded.failure.message}")
            print(f"FAIL {path}: {loaded.failure.message}")
            return 1
        d = loaded.data
        print(f"loaded {path} in {target}: arch {d['arch']}, {d['n_layer']} layers, n_embd {d['n_embd']}, "
              f"vocab {d['n_vocab']}, recurrent={d['is_recurrent']} hybrid={d['is_hybrid']}, "
              f"llama.cpp {d['llama_cpp_commit'][:9]}")
        out = t.generate(toks, tokens, chunk=chunk)
        if not out.ok:
            print(f"FAIL decode: {out.failure.message}")
            return 1
        logits = out.data["logits"]
        top2 = [sorted(row)[-2:] for row in logits]
        margin = min(b - a for a, b in top2) if top2 else 0.0
        print(f"prompt {len(toks)} tokens (prefill chunks of {chunk}) -> greedy {len(out.data['tokens'])} tokens: "
              f"{' '.join(map(str, out.data['tokens']))}")
        print(f"distinct tokens {len(set(out.data['tokens']))}, min top-1/top-2 margin {margin:.4f}")
    return 0


@app.command("sweep")
def sweep_cmd(
    fixture: Annotated[str, typer.Argument(help="a .gguf file or a family name")],
    cuts: Annotated[str, Opt(help="all | period | cut sets like '3;5;2,6'")] = "all",
    stages: Annotated[int, Opt(help="stages per chain (with --cuts all|period)")] = 2,
    tokens: Annotated[int, Opt(help="greedy decode steps")] = 32,
    period: Annotated[int | None, Opt(help="interleave period for --cuts period (default: from the file)")] = None,
    prompt_len: Annotated[int, Opt(help="prompt tokens")] = 24,
    chunk: Annotated[int, Opt(help="prefill chunk size")] = 7,
    seqs: Annotated[int, Opt(help="sequences in the batched-decode phase")] = 3,
    phases: Annotated[str, Opt(help="comma list of prefill,decode,batched")] = ",".join(PHASES),
    target: Annotated[str, Opt(help=TARGETS_HELP)] = "llama-cpp",
    report: Annotated[Path | None, Opt(help="write the JSON report here")] = None,
    keep: Annotated[Path | None, Opt(help="keep stage files in this directory")] = None,
    timeout: Annotated[float, Opt(help="per-call timeout, seconds")] = 120.0,
    seed: Annotated[int, Opt(help="prompt seed")] = 0,
) -> int:
    """Full model vs K-stage chain at every cut: token-exact and bit-exact, localized on divergence."""
    ph = tuple(p.strip() for p in phases.split(",") if p.strip())
    if not ph or set(ph) - set(PHASES):
        raise UserError(f"--phases {phases!r}: choose from {','.join(PHASES)}")
    for name, v in (("--tokens", tokens), ("--prompt-len", prompt_len), ("--chunk", chunk), ("--seqs", seqs)):
        if v < 1:
            raise UserError(f"{name} {v}: must be at least 1")
    cfg = SweepConfig(cuts=cuts, stages=stages, tokens=tokens, prompt_len=prompt_len, chunk=chunk, n_seq=seqs,
                      phases=ph, period=period, target=target, timeout=timeout, seed=seed, workdir=keep)
    rep = Sweep(fixture_path(fixture), cfg).run()
    print(format_report(rep))
    if report:
        report.parent.mkdir(parents=True, exist_ok=True)
        report.write_text(json.dumps(rep.to_dict(), indent=2))
    return rep.exit_code


def main(argv: list[str] | None = None) -> None:
    sys.exit(run(app, "fuzz", argv))
