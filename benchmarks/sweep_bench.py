"""Every-cut sweep, 32 decode tokens: wall time and its ratio to the time llama.cpp itself spent in llama_decode
(summed over every worker), with what else the wall holds: model loads (llama.cpp's load + context creation,
summed over workers) and stage files written (time, bytes).

  default       a 12-layer hybrid fixture (qwen3next, period 4): goal ratio <= 1.25x, wall <= 15 s on 2 cores
  --real PATH   any GGUF (a user's model): goal ratio <= 1.3x
  --real-size   a synthetic fixture at a real model's size, made here (gemma3: 18 layers, n_embd 768 — q4_k
                blocks are 256 wide —, vocab 262144, q4_k: 240 MB, near gemma-3-270m's shape): goal ratio <= 1.3x

Each repeat is a whole sweep (workers started and stopped) with its ratio measured in that run; the
median over the repeats is the figure (one run of the default takes a third of a second, so a stray process on the
machine moves a single figure a lot).

Run: .venv/bin/python benchmarks/sweep_bench.py [--family qwen3next] [--layers 12] [--period 4] [--repeat 5]
     .venv/bin/python benchmarks/sweep_bench.py --real-size --repeat 1 [--tokens 8]
     .venv/bin/python benchmarks/sweep_bench.py --real model.gguf --repeat 1
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

from fuzz.oracles.sweep import Sweep
from fuzz.oracles.sweep_report import SweepConfig
from synth.make import resolve, write_fixture
from synth.spec import Knobs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--family", default="qwen3next")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--period", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--real", type=Path, help="sweep this GGUF instead of a synthetic fixture")
    ap.add_argument("--real-size", action="store_true", help="a synthetic fixture at a real model's size")
    args = ap.parse_args()
    runs = []
    goal = 1.3 if args.real or args.real_size else 1.25
    with tempfile.TemporaryDirectory() as d:
        path = args.real or Path(d) / "bench.gguf"
        t0 = time.perf_counter()
        if args.real_size:
            write_fixture(resolve("gemma3", Knobs(layers=18, embd=768, vocab=262144, dtype="q4_k")), path)
        elif not args.real:
            write_fixture(resolve(args.family, Knobs(layers=args.layers, period=args.period)), path)
        made = time.perf_counter() - t0
        if not args.real:
            print(f"fixture made in {made:.1f} s: {path.stat().st_size / 1e6:.1f} MB")
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            rep = Sweep(path, SweepConfig(cuts="all", tokens=args.tokens, workdir=Path(d) / "stages")).run()
            wall = time.perf_counter() - t0
            tm = rep.timing
            runs.append((wall / tm["llama_decode_s"], wall, tm))
            shutil.rmtree(Path(d) / "stages", ignore_errors=True)
            if rep.summary["pass"] != len(rep.results):
                raise SystemExit(f"the sweep did not pass: {rep.summary}")
    print(f"fixture: {rep.arch}, {rep.n_layer} layers {rep.kinds}; {len(rep.results)} cut sets x "
          f"(prefill {rep.config['prompt_len']} tokens in chunks of {rep.config['chunk']}, {args.tokens} decode "
          f"steps, batched {rep.config['n_seq']} seqs) on {rep.config['workers']} workers; summary {rep.summary}")
    for ratio, wall, tm in runs:
        print(f"  run: wall {wall:.2f} s, llama_decode {tm['llama_decode_s']:.2f} s, ratio {ratio:.2f}x; model "
              f"loads {tm['load_s']:.2f} s (summed over workers); stage files {tm['stage_write_s']:.2f} s, "
              f"{tm['stage_bytes'] / 1e6:.1f} MB")
    ratio, wall, tm = sorted(runs, key=lambda r: r[0])[len(runs) // 2]
    print(f"median run: wall {wall:.2f} s" + ("" if goal > 1.25 else " (goal <= 15 s)")
          + f"; llama_decode {tm['llama_decode_s']:.2f} s; ratio {ratio:.2f}x (goal <= {goal}x)")


if __name__ == "__main__":
    main()
