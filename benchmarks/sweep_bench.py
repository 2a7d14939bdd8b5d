"""Every-cut sweep of a 12-layer hybrid, 32 decode tokens: wall time and its ratio to the time llama.cpp
itself spent in llama_decode (summed over every worker). Goals: ratio ≤ 1.5×, wall ≤ 15 s on 2 cores.

Each repeat is a whole sweep (workers started and stopped) with its ratio measured in that run; the
median over the repeats is the figure (one run takes a third of a second, so a stray process on the
machine moves a single figure a lot).

Run: .venv/bin/python benchmarks/sweep_bench.py [--family qwen3next] [--layers 12] [--period 4] [--repeat 5]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from fuzz.sweep import Sweep, SweepConfig
from synth.make import resolve, write_fixture
from synth.spec import Knobs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--family", default="qwen3next")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--period", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    runs = []
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "bench.gguf"
        write_fixture(resolve(args.family, Knobs(layers=args.layers, period=args.period)), path)
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            rep = Sweep(path, SweepConfig(cuts="all", tokens=args.tokens)).run()
            wall = time.perf_counter() - t0
            decode = rep.timing["llama_decode_s"]
            runs.append((wall / decode, wall, decode))
            if rep.summary["pass"] != len(rep.results):
                raise SystemExit(f"the sweep did not pass: {rep.summary}")
    print(f"fixture: {args.family}, {rep.n_layer} layers {rep.kinds}; {len(rep.results)} cut sets x "
          f"(prefill {rep.config['prompt_len']} tokens in chunks of {rep.config['chunk']}, {args.tokens} decode "
          f"steps, batched {rep.config['n_seq']} seqs) on {rep.config['workers']} workers; summary {rep.summary}")
    for ratio, wall, decode in runs:
        print(f"  run: wall {wall:.2f} s, llama_decode {decode:.2f} s, ratio {ratio:.2f}x")
    ratio, wall, decode = sorted(runs)[len(runs) // 2]
    print(f"median run: wall {wall:.2f} s (goal <= 15 s); llama_decode {decode:.2f} s; "
          f"ratio {ratio:.2f}x (goal <= 1.5x)")


if __name__ == "__main__":
    main()
