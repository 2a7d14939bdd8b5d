"""Why a chain across two backends moves further than the two backends' unsplit runs differ from each other.

Stage 0 on the base build, stage 1 on the candidate build (the cross-build lane's chain, split where that lane
splits it), one prefill batch: the first layer of stage 1 is traced in the chain and in both unsplit runs, and for
each graph node of that layer the largest difference of the chain from each unsplit run (and of the two unsplit
runs from each other) is printed, with the row it is in. Then, for the layer's K and V (which the KV cache stores
as f16), how many values round to another f16 in the chain than in each unsplit run, the tokens they belong to and
the largest jump: a difference of 1e-7 in a value next to a rounding midpoint becomes one f16 step in the cache.

Run: .venv/bin/python scripts/cross_backend_trace.py minimax-m2 --candidate-backend blas [--rows 40]
(both builds cached or built first; docs/backends.md says what it showed for minimax-m2)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fuzz.certify.bump import chain_cuts  # noqa: E402
from fuzz.engine.fixtures import fixture_path  # noqa: E402
from fuzz.engine.schedule import prompt_tokens  # noqa: E402
from fuzz.engine.stages import FixtureStages  # noqa: E402
from synth.errors import UserError  # noqa: E402
from targets import builds, open_target  # noqa: E402

GGML_TYPE_F32 = 0


def layer_nodes(reply_nodes: list[dict], layer: int) -> dict[str, dict]:
    """One layer's f32 nodes by name without the layer suffix; of a name given to several nodes, the last in
    execution order (llama.cpp names each step of Kcur "Kcur": the last is the roped K the cache stores)."""
    out: dict[str, dict] = {}
    for n in reply_nodes:
        name, _, k = n["name"].rpartition("-")
        if k == str(layer) and n["type"] == GGML_TYPE_F32:
            out[name] = n
    return out


def values(node: dict) -> np.ndarray:
    return np.frombuffer(node["data"], "<f4")


def row_of(node: dict, index: int, rows: int) -> int | str:
    """The batch row (token) a flat index of a node's values is in: its second or third dimension is the batch."""
    ne = node["ne"]
    if ne[2] == rows:
        return index // (ne[0] * ne[1])
    if ne[1] == rows:
        return index // ne[0] % rows
    return "?"


def f16_flips(chain: np.ndarray, ref: np.ndarray, per_token: int) -> tuple[int, list[int], float]:
    """Values that round to another f16 in one than in the other: (how many, their tokens, the largest jump)."""
    a, b = chain.astype(np.float16), ref.astype(np.float16)
    at = np.nonzero(a != b)[0]
    jump = float(np.abs(a.astype(np.float32) - b.astype(np.float32)).max()) if len(at) else 0.0
    return len(at), sorted({int(i) // per_token for i in at}), jump


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("fixture", help="a family or row name, or a GGUF path")
    ap.add_argument("--base-backend", default="cpu", help="stage 0's build (the pinned tree on this backend)")
    ap.add_argument("--candidate-backend", default="blas", help="stage 1's build")
    ap.add_argument("--rows", type=int, default=40, help="the prefill batch (BLAS takes a product from 32 rows)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    try:
        path = fixture_path(args.fixture)
        envs = {side: builds.resolve("pinned", from_env=False, backend=b).env()
                for side, b in (("base", args.base_backend), ("candidate", args.candidate_backend))}
    except UserError as e:
        sys.exit(f"cross_backend_trace: {e}")
    st = FixtureStages(Path(path), shared=False)
    with st.workspace(None):
        cuts = chain_cuts(st)  # where the cross-build lane's chains split it
        if cuts is None:
            sys.exit(f"cross_backend_trace: {args.fixture}: its stage contracts allow no two-stage split")
        (stage0, _), (stage1, _) = st.stages(cuts)
        layer = cuts[0]
        prompt = prompt_tokens(args.seed + 101, args.rows, st.info.n_vocab)
        unsplit: dict[str, dict[str, dict]] = {}
        boundary = None
        for side in ("base", "candidate"):  # each build's unsplit run, the layer traced
            with open_target("llama-cpp", env=envs[side]) as t:
                t.load(str(path), trace=True)
                r = t.decode(prompt, logits="all", capture=[layer - 1], trace=layer)
                unsplit[side] = layer_nodes(r.data["nodes"], layer)
                if side == "base":
                    boundary = r.data["captures"][layer - 1]  # what stage 0 on the base build sends (bit-exact)
        with open_target("llama-cpp", env=envs["base"]) as t:  # (stage 0 alone gives the same rows: checked)
            t.load(str(stage0), capture=True)
            sent = t.decode(prompt, logits="none", capture=[layer - 1]).data["captures"][layer - 1]
            assert np.array_equal(sent, boundary), "stage 0 does not send what the unsplit run computes"
        with open_target("llama-cpp", env=envs["candidate"]) as t:
            t.load(str(stage1), trace=True)
            chain = layer_nodes(t.decode(embd=boundary, logits="all", trace=0).data["nodes"], 0)
    print(f"{args.fixture}: cut {cuts}, {args.rows} rows; layer {layer} (stage 1's first) traced; stage 0 on "
          f"{args.base_backend}, stage 1 on {args.candidate_backend}")
    print(f"{'node':30s} {'chain vs base':>22s} {'chain vs candidate':>22s} {'base vs candidate':>18s}")
    for name, n in chain.items():
        b, c = unsplit["base"].get(name), unsplit["candidate"].get(name)
        if b is None or c is None or not (len(values(n)) == len(values(b)) == len(values(c))):
            continue
        cols = []
        for x, y in ((n, b), (n, c)):
            d = np.abs(values(x) - values(y))
            cols.append(f"{d.max():.1e} (row {row_of(n, int(d.argmax()), args.rows) if d.max() else '-'})")
        print(f"{name:30s} {cols[0]:>22s} {cols[1]:>22s} {np.abs(values(b) - values(c)).max():18.1e}")
    for name in ("Kcur", "Vcur"):
        if name not in chain:
            continue
        per_token = chain[name]["ne"][0] * chain[name]["ne"][1]
        for label, x, y in (("chain vs base", chain, unsplit["base"]), ("chain vs candidate", chain,
                                                                        unsplit["candidate"]),
                            ("base vs candidate", unsplit["base"], unsplit["candidate"])):
            n, tokens, jump = f16_flips(values(x[name]), values(y[name]), per_token)
            print(f"{name} {label}: {n} values round to another f16 (tokens {tokens}), largest jump {jump:.1e}")


if __name__ == "__main__":
    main()
