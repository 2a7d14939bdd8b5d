"""A stand-in for a split runtime's topology planner, for tests of `--cuts planner:CMD`: given a GGUF and a stage
count it prints one cut set, the layer ranges as equal as whole layers allow (the first stages take the extra
layer), as a planner that balances layers would. `--avoid N` (repeatable) moves a cut off layer N, as a runtime
that forbids some boundaries does.

    python tests/data/balanced_planner.py MODEL.gguf STAGES
"""

from __future__ import annotations

import argparse

from gguf import GGUFReader


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--avoid", type=int, action="append", default=[])
    ap.add_argument("model")
    ap.add_argument("stages", type=int)
    args = ap.parse_args()
    reader = GGUFReader(args.model)
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    n = int(reader.fields[f"{arch}.block_count"].parts[-1][0])
    size, extra = divmod(n, args.stages)
    cuts, at = [], 0
    for s in range(args.stages - 1):
        at += size + (s < extra)
        while at in args.avoid and at + 1 < n:
            at += 1
        cuts.append(at)
    print(",".join(map(str, cuts)))


if __name__ == "__main__":
    main()
