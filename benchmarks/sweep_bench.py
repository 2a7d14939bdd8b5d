"""Every-cut sweep of a 12-layer hybrid, 32 decode tokens: wall time and its ratio to the time llama.cpp
itself spent in llama_decode (summed over every worker). Goals: ratio ≤ 1.5×, wall ≤ 15 s on 2 cores.

Run: .venv/bin/python benchmarks/sweep_bench.py [--family qwen3next] [--layers 12] [--period 4]
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
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "bench.gguf"
        write_fixture(resolve(args.family, Knobs(layers=args.layers, period=args.period)), path)
        t0 = time.perf_counter()
        rep = Sweep(path, SweepConfig(cuts="all", tokens=args.tokens)).run()
        wall = time.perf_counter() - t0
    t = rep.timing
    print(f"fixture: {args.family}, {rep.n_layer} layers {rep.kinds}; {len(rep.results)} cut sets x "
          f"(prefill {rep.config['prompt_len']} tokens in chunks of {rep.config['chunk']}, {args.tokens} decode "
          f"steps, batched {rep.config['n_seq']} seqs); summary {rep.summary}")
    print(f"wall {wall:.2f} s (goal <= 15 s); llama_decode {t['llama_decode_s']:.2f} s; "
          f"ratio {wall / t['llama_decode_s']:.2f}x (goal <= 1.5x)")


if __name__ == "__main__":
    main()
