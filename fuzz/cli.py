"""`fuzz`: run fixtures through a target and compare."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from fuzz.engine.contract import TOL_SPREAD, describe
from fuzz.engine.fixtures import fixture_path, flash_attn_list, int_list, parse_tokens, prompt_fields
from fuzz.engine.schedule import PHASES
from fuzz.oracles import determinism as det
from fuzz.oracles import isolation as iso
from fuzz.oracles import prefix_cache as pc
from fuzz.oracles import radix as rx
from fuzz.oracles import sampling as smp
from fuzz.oracles.handoff_state import MODES as HANDOFF_MODES
from fuzz.oracles.handoff_state import HandoffConfig
from fuzz.oracles.memory_configs import capacity_config, pressure_config
from fuzz.oracles.memory_model import MemoryConfig
from fuzz.oracles.registry import get_oracle
from fuzz.oracles.server_options import ServerOptionsConfig
from fuzz.oracles.sweep_report import SweepConfig
from fuzz.repro import bundle as bd
from fuzz.repro.oracle_command import current_build_label, run_oracle, use_build
from synth.cliutil import new_app, run
from synth.errors import UserError
from targets import TARGETS_HELP, open_target

app = new_app("The differential engine: run fixtures through real targets and compare.")
Opt = typer.Option

DEFAULT_PROMPT = "1,7,3,12,5,9,2,30,4,11,6,21,8,17,10,25"

# options every oracle command takes
FixtureArg = Annotated[str, typer.Argument(help="a .gguf file or a family name")]
TargetOpt = Annotated[str, Opt(help=TARGETS_HELP)]
ReportOpt = Annotated[Path | None, Opt(help="write the JSON report here")]
KeepOpt = Annotated[Path | None, Opt(help="keep stage files in this directory (a sweep's are two-file splits "
                                          "whose second file, the model's embedding and head, all stages share, "
                                          "their tokenizer a placeholder of its size; `synth stage` makes whole "
                                          "ones)")]
TimeoutOpt = Annotated[float, Opt(help="per-call timeout, seconds")]
SeedOpt = Annotated[int, Opt(help="prompt seed")]
StagesOpt = Annotated[int, Opt(help="stages per chain (with --cuts all|period)")]
PeriodOpt = Annotated[int | None, Opt(help="interleave period for --cuts period (default: from the file)")]
PromptOpt = Annotated[str | None, Opt(help="the prompt's token ids, e.g. 1,7,3 (default: --prompt-len tokens drawn "
                                          "from --seed)")]
BundleOpt = Annotated[Path | None, Opt(help="shrink each finding into a repro bundle under this directory")]
KvUnifiedOpt = Annotated[bool, Opt(help="one KV cache shared by the slots (--kv-unified: llama-server's layout when "
                                        "-np is not given), instead of one per slot")]
FlashAttnOpt = Annotated[str, Opt(help="flash attention: off, on or off,on")]
TolOpt = Annotated[float, Opt(help="an absolute least tolerance of max |Δlogit| (0: none; the spread's decides)")]
TolSpreadOpt = Annotated[float, Opt(help="the least tolerance as a fraction of the model's logits' spread (their "
                                         "standard deviation): 0.03 is 0.1 on the fixtures")]
LlamaCppOpt = Annotated[str | None, Opt("--llama-cpp", help="the llama.cpp build to run: pinned (default), "
                                        "pypi:VERSION (the tree a llama-cpp-python sdist vendors, with its own "
                                        "bindings) or a source tree's path; built once and cached "
                                        "[env: FAMILY_CERTIFY_LLAMA_CPP]")]
PatchesOpt = Annotated[Path | None, Opt(help="apply this patch series (*.patch, in name order) onto the build's tree "
                                             "[env: FAMILY_CERTIFY_PATCHES]")]
BackendOpt = Annotated[str | None, Opt(help="the ggml backend the build compiles in: cpu (default), blas, vulkan, "
                                            "cuda or metal; one build per tree and backend, cached; on vulkan, cuda "
                                            "and metal every layer runs on the device [env: FAMILY_CERTIFY_BACKEND]")]


@app.command("run")
def run_cmd(
    fixture: FixtureArg,
    tokens: Annotated[int, Opt(help="greedy tokens to decode")] = 32,
    prompt: Annotated[str, Opt(help="prompt token ids")] = DEFAULT_PROMPT,
    chunk: Annotated[int, Opt(help="prefill chunk size")] = 64,
    target: TargetOpt = "llama-cpp",
    llama_cpp: LlamaCppOpt = None,
    patches: PatchesOpt = None,
    backend: BackendOpt = None,
) -> int:
    """Load FIXTURE in the target and greedy-decode; print what llama.cpp reports."""
    use_build(llama_cpp, patches, backend)
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
              f"{current_build_label(d['llama_cpp_commit'])}")
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
    fixture: FixtureArg,
    cuts: Annotated[str, Opt(help="all | period | cut sets like '3;5;2,6' | planner:CMD (the sets that `CMD MODEL "
                                  "STAGES` prints)")] = "all",
    stages: StagesOpt = 2,
    tokens: Annotated[int, Opt(help="greedy decode steps")] = 32,
    period: PeriodOpt = None,
    prompt_len: Annotated[int, Opt(help="prompt tokens")] = 24,
    prompt: PromptOpt = None,
    chunk: Annotated[int, Opt(help="prefill chunk size")] = 7,
    n_seq: Annotated[int, Opt("--n-seq", "--seqs", help="sequences in the batched-decode phase")] = 3,
    n_ubatch: Annotated[int, Opt(help="llama.cpp's ubatch rows (n_batch 64): below --chunk, every batch of hidden "
                                      "states splits into ubatches inside each stage")] = 64,
    phases: Annotated[str, Opt(help="comma list of prefill,decode,batched")] = ",".join(PHASES),
    target: TargetOpt = "llama-cpp",
    llama_cpp: LlamaCppOpt = None,
    patches: PatchesOpt = None,
    backend: BackendOpt = None,
    report: ReportOpt = None,
    keep: KeepOpt = None,
    timeout: TimeoutOpt = 120.0,
    seed: SeedOpt = 0,
    bundle: BundleOpt = None,
    wire: Annotated[str, Opt(help="the hidden states cross each boundary as f32 (bit-exact with the full model), "
                                  "or f16 | bf16 | q8_0: each stage after a boundary bit-exact with the same stage "
                                  "fed the reference conversion, tokens vs the unsplit model gated (f16) or "
                                  "measured (bf16, q8_0); prefill and decode phases")] = "f32",
) -> int:
    """Full model vs K-stage chain at every cut: token-exact and bit-exact, localized on divergence."""
    if wire != "f32":
        from fuzz.oracles.wire import WIRES, WireConfig

        if wire not in WIRES:
            raise UserError(f"--wire {wire!r}: use one of {', '.join(WIRES)}")
        cfg = WireConfig(wire=wire, cuts=cuts, stages=stages, tokens=tokens, **prompt_fields(prompt, prompt_len),
                         chunk=chunk, period=period, target=target, timeout=timeout, seed=seed, workdir=keep)
        return run_oracle("wire", fixture, cfg, report, bundle, (llama_cpp, patches, backend))
    ph = tuple(p.strip() for p in phases.split(",") if p.strip())
    if not ph or set(ph) - set(PHASES):
        raise UserError(f"--phases {phases!r}: choose from {','.join(PHASES)}")
    for name, v in (("--tokens", tokens), ("--prompt-len", prompt_len), ("--chunk", chunk), ("--n-seq", n_seq)):
        if v < 1:
            raise UserError(f"{name} {v}: must be at least 1")
    cfg = SweepConfig(cuts=cuts, stages=stages, tokens=tokens, **prompt_fields(prompt, prompt_len), chunk=chunk,
                      n_seq=n_seq, n_ubatch=n_ubatch, phases=ph, period=period, target=target, timeout=timeout,
                      seed=seed, workdir=keep)
    return run_oracle("sweep", fixture, cfg, report, bundle, (llama_cpp, patches, backend))


@app.command("replay")
def replay_cmd(
    bundle: Annotated[Path, typer.Argument(help="a directory written by an oracle's --bundle")],
    target: Annotated[str | None, Opt(help="replay against another target (default: the recorded one)")] = None,
    llama_cpp: Annotated[str | None, Opt("--llama-cpp", help="replay on another build (pinned, pypi:VERSION, a "
                                                             "tree; default: the one the bundle records)")] = None,
    patches: PatchesOpt = None,
) -> int:
    """Re-run a repro bundle: exit 1 while its finding reproduces (same fingerprint), 0 once it no longer does (and
    then what this run saw instead, in the oracle's own words)."""
    ok, fp, rep = bd.replay(bundle, target, build=None if llama_cpp is None and patches is None else
                            {"spec": llama_cpp or "pinned", "patches": {"dir": str(patches)} if patches else None})
    if not ok:
        print(get_oracle(rep.oracle).format(rep))
    print(f"{'REPRODUCED' if ok else 'not reproduced'}: {describe(fp)}"
          + (f" with target {target}" if target else "") + f" on {current_build_label(rep.llama_cpp_commit)}")
    return 1 if ok else 0


@app.command("report")
def report_cmd(
    bundle: Annotated[Path, typer.Argument(help="a directory written by an oracle's --bundle")],
    upstream: Annotated[Path, Opt(help="write the upstream-ready report here: issue.md, model.gguf and a "
                                       "standalone reproducer (exit 1 while the defect is present, 0 once fixed)")],
) -> int:
    """A bundle's finding as a llama.cpp maintainer takes it, needing nothing of this toolkit (memory findings: a
    Python program on llama-cpp-python's bare `llama_cpp` bindings)."""
    from fuzz.repro.upstream import write_upstream

    out = write_upstream(bundle, upstream)
    print(f"upstream report: {out} ({', '.join(sorted(p.name for p in out.iterdir()))}: issue.md says how to run it)")
    return 0


@app.command("handoff")
def handoff_cmd(
    fixture: FixtureArg,
    cuts: Annotated[str, Opt(help="period | all | none (the unsplit model) | cut sets like '3;5;2,6' | "
                                  "planner:CMD")] = "period",
    stages: StagesOpt = 2,
    tokens: Annotated[int, Opt(help="greedy decode steps after the prompt")] = 4,
    period: PeriodOpt = None,
    prompt_len: Annotated[int, Opt(help="prompt tokens (every offset in it is a hand-off point)")] = 12,
    prompt: PromptOpt = None,
    chunk: Annotated[int, Opt(help="prefill chunk size")] = 5,
    modes: Annotated[str, Opt(help="full (into a fresh context), partial (a rollback), busy (into a context where "
                                   "another sequence is live)")] = ",".join(HANDOFF_MODES),
    n_ubatch: Annotated[int, Opt(help="llama.cpp's ubatch rows (n_batch 64)")] = 64,
    target: TargetOpt = "llama-cpp",
    llama_cpp: LlamaCppOpt = None,
    patches: PatchesOpt = None,
    backend: BackendOpt = None,
    report: ReportOpt = None,
    keep: KeepOpt = None,
    timeout: TimeoutOpt = 120.0,
    seed: SeedOpt = 0,
    bundle: BundleOpt = None,
) -> int:
    """Export each stage's state at every prompt offset, import it into a fresh context and another sequence
    (and roll back partial state); continuations must equal the uninterrupted run, and state bytes must hold
    what each stage holds (recurrent state included when the stage's first layer is attention: B1)."""
    ms = tuple(m.strip() for m in modes.split(",") if m.strip())
    if not ms or set(ms) - set(HANDOFF_MODES):
        raise UserError(f"--modes {modes!r}: choose from {','.join(HANDOFF_MODES)}")
    given = prompt_fields(prompt, prompt_len)
    if given["prompt_len"] < 3 or chunk < 1 or tokens < 1:
        raise UserError("--prompt-len (or --prompt) must be at least 3 tokens (two hand-off offsets), --chunk and "
                        "--tokens at least 1")
    cfg = HandoffConfig(cuts=cuts, stages=stages, tokens=tokens, **given, chunk=chunk, modes=ms,
                           n_ubatch=n_ubatch, period=period, target=target, timeout=timeout, seed=seed, workdir=keep)
    return run_oracle("handoff", fixture, cfg, report, bundle, (llama_cpp, patches, backend))


@app.command("determinism")
def determinism_cmd(
    fixture: FixtureArg,
    cuts: Annotated[str, Opt(help="none (full model only) | period | all | cut sets like '3;5'")] = "none",
    stages: StagesOpt = 2,
    threads: Annotated[str, Opt(help="n_threads values")] = "1,2",
    ubatch: Annotated[str, Opt(help="n_ubatch values (<= 64)")] = "1,7,64",
    chunks: Annotated[str, Opt(help="prefill chunk sizes")] = "64,7",
    flash_attn: FlashAttnOpt = "off,on",
    repeats: Annotated[int, Opt(help="runs per schedule")] = 3,
    tokens: Annotated[int, Opt(help="greedy decode steps")] = 16,
    prompt_len: Annotated[int, Opt(help="prompt tokens")] = 24,
    prompt: PromptOpt = None,
    period: PeriodOpt = None,
    target: TargetOpt = "llama-cpp",
    llama_cpp: LlamaCppOpt = None,
    patches: PatchesOpt = None,
    backend: BackendOpt = None,
    report: ReportOpt = None,
    keep: KeepOpt = None,
    timeout: TimeoutOpt = 120.0,
    seed: SeedOpt = 0,
    bundle: BundleOpt = None,
) -> int:
    """Repeated runs x threads x ubatch x chunking x flash attention: same-schedule and threads-only pairs must be
    bit-exact; other schedule pairs are reported under the explicit upstream policy."""
    ub = int_list(ubatch, "--ubatch")
    if max(ub) > 64:
        raise UserError(f"--ubatch {ubatch}: n_ubatch cannot exceed n_batch (64)")
    cfg = det.DeterminismConfig(threads=int_list(threads, "--threads"), ubatch=ub, chunks=int_list(chunks, "--chunks"),
                                flash_attn=flash_attn_list(flash_attn), repeats=repeats, tokens=tokens,
                                **prompt_fields(prompt, prompt_len), cuts=cuts,
                                stages=stages, period=period, target=target, timeout=timeout, seed=seed, workdir=keep)
    return run_oracle("determinism", fixture, cfg, report, bundle, (llama_cpp, patches, backend))


@app.command("isolation")
def isolation_cmd(
    fixture: FixtureArg,
    n_seq: Annotated[int, Opt(help="sequences per batch")] = 4,
    prompt_len: Annotated[int, Opt(help="prompt tokens of sequence 0 (sequence i has 3 i more)")] = 12,
    tokens: Annotated[int, Opt(help="decode steps")] = 6,
    tol: TolOpt = 0.0,
    tol_spread: TolSpreadOpt = TOL_SPREAD,
    noise_factor: Annotated[float, Opt(help="the tolerance is this many times the model's own batch-shape "
                                            "numerics, measured on each sequence alone (0: the least only)")] = 4.0,
    flash_attn: FlashAttnOpt = "off,on",
    target: TargetOpt = "llama-cpp",
    llama_cpp: LlamaCppOpt = None,
    patches: PatchesOpt = None,
    backend: BackendOpt = None,
    report: ReportOpt = None,
    timeout: TimeoutOpt = 120.0,
    seed: SeedOpt = 0,
    bundle: BundleOpt = None,
) -> int:
    """Each sequence alone vs all in one batch (KV cache unified and per sequence, flash attention off and on): a
    sequence's logits must not depend on the others in its batch; a context that cannot hold N sequences is a
    finding too."""
    cfg = iso.IsolationConfig(n_seq=n_seq, prompt_len=prompt_len, tokens=tokens, tol=tol, tol_spread=tol_spread,
                              noise_factor=noise_factor, flash_attn=flash_attn_list(flash_attn), target=target,
                              timeout=timeout, seed=seed)
    return run_oracle("isolation", fixture, cfg, report, bundle, (llama_cpp, patches, backend))


@app.command("sampling")
def sampling_cmd(
    fixture: FixtureArg,
    programs: Annotated[int, Opt(help="programs drawn, each on a fresh context")] = 4,
    program: Annotated[int, Opt(help="run only this drawn program (a finding names it)")] = -1,
    steps: Annotated[int, Opt(help="batches a program decodes")] = 16,
    n_seq: Annotated[int, Opt(help="sequences of the context")] = 3,
    target: TargetOpt = "llama-cpp",
    llama_cpp: LlamaCppOpt = None,
    patches: PatchesOpt = None,
    backend: BackendOpt = None,
    report: ReportOpt = None,
    timeout: TimeoutOpt = 120.0,
    seed: SeedOpt = 0,
    bundle: BundleOpt = None,
) -> int:
    """Sampling in the graph (backend samplers) on several sequences whose batches verify drafts: every token
    sampled in the graph equals the greedy pick of the same batches on a context without samplers."""
    if programs < 1 or steps < 1 or n_seq < 2:
        raise UserError("--programs and --steps must be at least 1, --n-seq at least 2 (sequences batched together)")
    cfg = smp.SamplingConfig(programs=programs, program=program, steps=steps, n_seq=n_seq, target=target,
                             timeout=timeout, seed=seed)
    return run_oracle("sampling", fixture, cfg, report, bundle, (llama_cpp, patches, backend))


def rope_params(rope: str) -> dict[str, Any]:
    """--rope SCALING[:FREQ_SCALE] as MemoryConfig's fields."""
    scaling, _, scale = rope.partition(":")
    try:
        return {"rope_scaling": scaling, "rope_freq_scale": float(scale) if scale else 0.0}
    except ValueError:
        raise UserError(f"--rope {rope!r}: write it as SCALING[:FREQ_SCALE], e.g. yarn:0.5") from None


@app.command("memory")
def memory_cmd(
    fixture: FixtureArg,
    programs: Annotated[int, Opt(help="programs drawn per KV layout")] = 8,
    steps: Annotated[int, Opt(help="operations per program (the last decodes every live sequence)")] = 16,
    n_seq: Annotated[int, Opt(help="sequences in the context")] = 3,
    n_rs_seq: Annotated[int, Opt(help="recurrent-state snapshots per sequence (rollback), where the arch has "
                                      "them")] = 4,
    tol: TolOpt = 0.0,
    tol_spread: TolSpreadOpt = TOL_SPREAD,
    noise_factor: Annotated[float, Opt(help="the tolerance is this many times the model's own batch-shape move, "
                                            "measured once (0: the least only)")] = 4.0,
    program: Annotated[Path | None, Opt(help="run this program (a JSON list of operations, as a report's "
                                             "finding records it) instead of drawing")] = None,
    engine: Annotated[str, Opt(help="seeded: --programs drawn from --seed; hypothesis: a Hypothesis state machine "
                                    "of up to --programs examples, shrunk by Hypothesis")] = "seeded",
    stage: Annotated[str, Opt(help="A:B: a stage's context (layers [A, B), sliced from the model) instead of the "
                                   "model's; past the first stage its decodes feed rows, not token ids")] = "",
    pressure: Annotated[bool, Opt("--pressure", help="run the program under memory pressure instead (three "
                                                     "sequences interleaved in a 256-cell cache, one removed, "
                                                     "another's state imported into its scattered cells: upstream "
                                                     "17527's shape)")] = False,
    fill: Annotated[bool, Opt("--fill", help="drawn programs fill their KV streams (256 cells) with long decodes, "
                                             "then ask for more than is left (refused whole)")] = False,
    cache_types: Annotated[str, Opt(help="the KV cache's types, K[,V]: f16 (llama.cpp's default), q8_0, q4_0, ... "
                                         "(a quantized V needs --flash-attn; a head a whole number of its blocks)")]
    = "f16",
    rope: Annotated[str, Opt(help="the context's RoPE scaling, SCALING[:FREQ_SCALE]: yarn:0.5 (YaRN, its ext "
                             "factor on, frequencies scaled by 0.5; llama-server's --rope-scaling, --rope-freq-scale), "
                             "linear:0.5, none")] = "",
    swa_full: Annotated[bool, Opt("--swa-full", help="a sliding-window model's window cache full-size (its cells "
                                                     "past the window kept), as llama-server's --swa-full")] = False,
    flash_attn: Annotated[bool, Opt("--flash-attn/--no-flash-attn",
                                    help="flash attention in the contexts (llama-server's default on the CPU); a "
                                         "MoE routing near-tie it makes is numerics, not a finding")] = False,
    aborts: Annotated[bool, Opt("--aborts", help="drawn programs cancel decodes too (llama.cpp's abort callback "
                                                 "stops a decode after a drawn number of graph nodes): each "
                                                 "sequence must hold what its reported positions say")] = False,
    target: TargetOpt = "llama-cpp",
    llama_cpp: LlamaCppOpt = None,
    patches: PatchesOpt = None,
    backend: BackendOpt = None,
    report: ReportOpt = None,
    timeout: TimeoutOpt = 120.0,
    seed: SeedOpt = 0,
    bundle: BundleOpt = None,
) -> int:
    """Seeded programs of memory operations (mixed decodes, seq_rm/cp/keep/add/div, state export and import into
    the same or a fresh context, a refused import) over several sequences: after each, every sequence's positions
    as the model says, and every decoded sequence's logits as its own history recomputed alone."""
    given = None
    if program is not None:
        try:
            given = json.loads(program.read_text())
        except (OSError, ValueError) as e:
            raise UserError(f"--program {program}: not a readable JSON list of operations ({e}); write it as a "
                            "report's finding records it (detail.program)") from None
    k, _, v = cache_types.partition(",")
    common = dict(n_rs_seq=n_rs_seq, tol=tol, tol_spread=tol_spread, noise_factor=noise_factor, target=target,
                  timeout=timeout, seed=seed,
                  flash_attn=flash_attn, type_k="" if k == "f16" else k, type_v="" if (v or "f16") == "f16" else v,
                  swa_full=swa_full, aborts=aborts, **rope_params(rope))
    cfg = (capacity_config if fill else MemoryConfig)(programs=programs, steps=steps, n_seq=n_seq, program=given,
                                                      engine=engine, stage=stage, **common)
    if pressure:
        if given is not None or stage:
            raise UserError("--pressure runs its own program on the model: drop --program and --stage")
        from synth.inspect import inspect_file

        cfg = pressure_config(inspect_file(str(fixture_path(fixture))).n_vocab, **common)
    return run_oracle("memory", fixture, cfg, report, bundle, (llama_cpp, patches, backend))


@app.command("prefix-cache")
def prefix_cache_cmd(
    fixture: FixtureArg,
    slots: Annotated[int, Opt(help="llama-server slots (-np)")] = 4,
    rounds: Annotated[int, Opt(help="rounds of concurrent requests")] = 4,
    tokens: Annotated[int, Opt(help="greedy tokens per request")] = 8,
    n_ctx: Annotated[int, Opt(help="server context (all slots)")] = 1024,
    target: Annotated[str, Opt(help="llama-server, or mutant:server-dup-leak")] = "llama-server",
    kv_unified: KvUnifiedOpt = False,
    llama_cpp: LlamaCppOpt = None,
    patches: PatchesOpt = None,
    backend: BackendOpt = None,
    report: ReportOpt = None,
    timeout: TimeoutOpt = 120.0,
    seed: SeedOpt = 0,
    bundle: BundleOpt = None,
) -> int:
    """llama-server's prompt cache under concurrent inserts (the H1 shape: two slots inserting the same prompt at
    once, every round): answers equal the uncached reference, every slot idle after each round, the context
    still usable at the end. Needs llama-server built from the pinned source (scripts/build_llama_server.sh)."""
    if slots < 2 or rounds < 1 or tokens < 1:
        raise UserError("--slots must be at least 2 (concurrent inserts), --rounds and --tokens at least 1")
    if n_ctx // slots < 64:
        raise UserError(f"--n-ctx {n_ctx} leaves {n_ctx // slots} cells per slot; give each slot at least 64")
    cfg = pc.PrefixCacheConfig(slots=slots, rounds=rounds, tokens=tokens, n_ctx=n_ctx, target=target,
                               kv_unified=kv_unified, timeout=timeout, seed=seed)
    return run_oracle("prefix-cache", fixture, cfg, report, bundle, (llama_cpp, patches, backend))


@app.command("server-options")
def server_options_cmd(
    fixture: FixtureArg,
    schedules: Annotated[int, Opt(help="option sets drawn, each on a fresh server")] = 8,
    schedule: Annotated[int, Opt(help="run only this drawn schedule (a finding names it)")] = -1,
    tokens: Annotated[int, Opt(help="greedy tokens per request")] = 12,
    n_ctx: Annotated[int, Opt(help="server context (all slots)")] = 1024,
    target: Annotated[str, Opt(help="llama-server, or a program speaking its protocol (cmd:...)")] = "llama-server",
    kv_unified: KvUnifiedOpt = False,
    llama_cpp: LlamaCppOpt = None,
    patches: PatchesOpt = None,
    backend: BackendOpt = None,
    report: ReportOpt = None,
    timeout: TimeoutOpt = 120.0,
    seed: SeedOpt = 0,
    bundle: BundleOpt = None,
) -> int:
    """llama-server under options drawn per schedule (speculative decoding, n_cmpl, checkpoints, idle slots,
    --swa-full, embeddings beside completions): every answer equals the uncached reference, every embedding the same
    prompt's alone; every slot idle after each round."""
    if schedules < 1 or n_ctx < 256:
        raise UserError("--schedules must be at least 1 and --n-ctx at least 256 (three slots of a second turn)")
    cfg = ServerOptionsConfig(schedules=schedules, schedule=schedule, tokens=tokens, n_ctx=n_ctx, target=target,
                              kv_unified=kv_unified, timeout=timeout, seed=seed)
    return run_oracle("server-options", fixture, cfg, report, bundle, (llama_cpp, patches, backend))


@app.command("radix")
def radix_cmd(
    fixture: FixtureArg,
    clients: Annotated[int, Opt(help="concurrent clients (one slot each)")] = 2,
    ops: Annotated[int, Opt(help="operations per client")] = 2,
    exhaustive: Annotated[bool, Opt("--exhaustive/--pct", help="every interleaving of each schedule once, or "
                                    "PCT-style randomized priorities")] = True,
    budget: Annotated[float, Opt(help="seconds of exploration (0: no time limit; --schedules or --plan bound "
                                      "it)")] = 20.0,
    replay: Annotated[str, Opt(help="run exactly this schedule (a replay string, e.g. r1:0:8:24:cT,s/cT:A.Bap.A)")]
        = "",
    plan: Annotated[str, Opt(help="explore the interleavings of exactly these clients' operations (OPS/OPS, plans "
                                  "separated by ';', e.g. cT,k/cT,cB0) instead of random ones")] = "",
    limit: Annotated[int, Opt(help="schedules per plan (a seeded sample of its interleavings); 0: the budget "
                                   "decides")] = 0,
    tokens: Annotated[int, Opt(help="greedy tokens per completion")] = 8,
    trunk: Annotated[int, Opt(help="tokens of the prompt tree's trunk")] = 24,
    tree: Annotated[str, Opt(help="fixed: one prompt tree (T, B0, B1, L, U) from the trunk; drawn: a prompt tree "
                                  "drawn per schedule (3-6 prompts, cut anywhere, at or just before a prompt's end, "
                                  "around the sliding window)")] = "fixed",
    schedules: Annotated[int, Opt(help="stop after this many schedules (0: when the budget is spent)")] = 0,
    target: Annotated[str, Opt(help="llama-server, or mutant:radix-dup-leak / mutant:radix-replace-live-borrower")]
        = "llama-server",
    kv_unified: KvUnifiedOpt = False,
    cache_ram: Annotated[int, Opt(help="MiB of host prompt cache (--cache-ram); 0: off, where a slot's checkpoints "
                                       "stay its own")] = 64,
    keep_going: Annotated[bool, Opt(help="go on past a finding: every schedule explored, each kind of finding "
                                         "reproduced and reported once, later schedules with it counted")] = False,
    llama_cpp: LlamaCppOpt = None,
    patches: PatchesOpt = None,
    backend: BackendOpt = None,
    report: ReportOpt = None,
    timeout: TimeoutOpt = 60.0,
    seed: SeedOpt = 0,
    bundle: BundleOpt = None,
) -> int:
    """llama-server's prompt cache under concurrent schedules: clients completing, continuing, disconnecting,
    saving, restoring and erasing their slots on one prompt tree, every interleaving explored (or PCT-sampled)
    within the budget. Answers equal the cold run, reuse what the schedule made reusable, slots free, /metrics
    consistent, context still usable; a finding is replayed twice more, then shrunk and bundled with its string."""
    cfg = rx.RadixConfig(clients=clients, ops=ops, mode="exhaustive" if exhaustive else "pct", budget=budget,
                         tokens=tokens, trunk=trunk, replay=replay, plan=plan, limit=limit, tree=tree,
                         schedules=schedules, target=target, kv_unified=kv_unified, cache_ram=cache_ram,
                         keep_going=keep_going, timeout=timeout, seed=seed)
    return run_oracle("radix", fixture, cfg, report, bundle, (llama_cpp, patches, backend))


@app.command("skippy")
def skippy_cmd(
    fixture: FixtureArg,
    target: Annotated[str, Opt(help="skippy:CONFIG.toml (targets/skippy.py describes the config)")],
    check: Annotated[list[str] | None, Opt(help="checks to run (repeatable): load, serve, prefix, repeat, concurrent, "
                                                "single-step, chain, split-scan, state-handoff (default: all)")] = None,
    cuts: Annotated[str, Opt(help="half, thirds, all, period, or cut lists like '3;5;2,6'")] = "half",
    period: PeriodOpt = None,
    tokens: Annotated[int, Opt(help="max_tokens per completion")] = 8,
    prompt_len: Annotated[int, Opt(help="letters per prompt (a and b)")] = 24,
    seed: SeedOpt = 0,
    report: ReportOpt = None,
    bundle: BundleOpt = None,
) -> int:
    """skippy's split serving vs its unsplit serving, and skippy-correctness's own lanes, on the fixture's cut sets
    (fuzz/oracles/skippy.py); every case one of the users' outcomes."""
    from fuzz.oracles.skippy import CHECKS, SkippyRunConfig

    cfg = SkippyRunConfig(checks=tuple(check) if check else CHECKS, cuts=cuts, period=period, tokens=tokens,
                          prompt_len=prompt_len, seed=seed, target=target)
    return run_oracle("skippy", fixture, cfg, report, bundle)


@app.command("campaign")
def campaign_cmd(
    budget: Annotated[str, Opt(help="how long: 90s, 10m, 1h30m")] = "10m",
    out: Annotated[Path, Opt(help="the campaign's directory (state, bundles/, summary.md); rerun to resume")] =
        Path("campaign"),
    family: Annotated[list[str] | None, Opt(help="only these families (repeatable)")] = None,
    oracle: Annotated[list[str] | None, Opt(help="only these oracles (repeatable; default: all)")] = None,
    target: Annotated[str, Opt(help="llama-cpp, or a mutant (to see a campaign find it)")] = "llama-cpp",
    shard: Annotated[str, Opt(help="I/N: this job's share of the campaign (cases i with i % N == I)")] = "0/1",
    seed: Annotated[int, Opt(help="the campaign's seed: case i is a function of (seed, i)")] = 0,
    cases: Annotated[int, Opt(help="stop after this many more cases, even within the budget (0: the budget "
                                   "decides)")] = 0,
    llama_cpp: LlamaCppOpt = None,
    patches: PatchesOpt = None,
    backend: BackendOpt = None,
) -> int:
    """Random legal specs × oracles × their configurations until the budget is spent; each finding reproduced,
    deduplicated by family and fingerprint, shrunk and bundled once; resumable (same --out) and shardable. Exit 1
    while the campaign holds a finding."""
    from fuzz.repro import campaign as cp
    from targets.llama_server_worker import NO_SERVER, server_binary

    seconds = cp.parse_budget(budget)
    if cases < 0:
        raise UserError(f"--cases {cases}: must be 0 or more")
    oracles = oracle
    if not oracles and server_binary(build=True) is None:
        oracles = [o for o in cp.ORACLES if o != "radix"]
        print(f"skipped: radix ({NO_SERVER})")
    use_build(llama_cpp, patches, backend)
    c = cp.Campaign(out, families=family, oracles=oracles, target=target, seed=seed, shard=cp.parse_shard(shard))
    st = c.run(seconds, cases)
    print(cp.summary_text(st), end="")
    print(f"wrote {out}/summary.md, {out}/{cp.STATE}")
    return cp.exit_code(st)


@app.command("campaign-merge")
def campaign_merge_cmd(
    out: Annotated[Path, typer.Argument(help="the merged campaign's directory")],
    dirs: Annotated[list[Path], typer.Argument(help="shards' campaign directories")],
) -> int:
    """Shards of one campaign (`fuzz campaign --shard I/N`) as one directory: counts summed, each finding once."""
    from fuzz.repro import campaign as cp
    st = cp.merge(out, dirs)
    print(cp.summary_text(st), end="")
    return cp.exit_code(st)


@app.command("inputs")
def inputs_cmd(
    kind: Annotated[str, typer.Argument(help="gguf, manifest, bundle or package: which input of this toolkit to fuzz")],
    runs: Annotated[int, Opt(help="inputs to try")] = 20000,
    seed: Annotated[int, Opt(help="libFuzzer seed (same seed, same inputs)")] = 1,
    out: Annotated[Path, Opt(help="where inputs that raise something other than a one-line error go")] =
        Path("fuzz-inputs"),
    seconds: Annotated[int | None, Opt(help="stop after this long, even before --runs")] = None,
) -> int:
    """Coverage-guided fuzzing (atheris) of what this toolkit reads: whatever the bytes of a GGUF file, a manifest,
    a repro bundle or a layer package's manifest, reading them must work or end as one line and exit 2 — anything
    else is a finding."""
    from fuzz.repro import inputs
    return inputs.fuzz_command(kind, runs=runs, seed=seed, out=out, seconds=seconds)


def main(argv: list[str] | None = None) -> None:
    sys.exit(run(app, "fuzz", argv))
