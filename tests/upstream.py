"""Rebuild upstream llama.cpp's own random fixtures (tests/test-llama-archs.cpp, pinned b11312) from the
recorded keys and tensor shapes in data/upstream-arch-shapes.json.gz (a copy of the shared reference).

The dump leaves out the token list and shortens long arrays; the rebuild uses synth's tiny tokenizer and
expands shortened arrays from their recorded head. Tensor data is zeros: enough to load and to classify.
"""

from __future__ import annotations

import gzip
import json
from functools import lru_cache
from pathlib import Path

import numpy as np

from synth.gguf_io import KV, VT, write_gguf
from synth.tokenizer import tokenizer_kv

DATA = Path(__file__).parent / "data" / "upstream-arch-shapes.json.gz"
SCALAR = {"UINT32": VT.UINT32, "FLOAT32": VT.FLOAT32, "BOOL": VT.BOOL, "STRING": VT.STRING,
          "INT32": VT.INT32, "UINT64": VT.UINT64}


@lru_cache(maxsize=1)
def shapes() -> dict:
    with gzip.open(DATA, "rt") as f:
        return json.load(f)


def n_params(name: str) -> int:
    x = shapes()[name]
    return sum(int(np.prod(t["ne"])) for t in x["tensors"].values()) + \
        sum(int(np.prod(t["ne"])) for layer in x["layers"].values() for t in layer.values())


def write_upstream_fixture(name: str, path: Path) -> str:
    """Write upstream fixture `name` (e.g. 'jamba-dense') to path; returns its arch."""
    x = shapes()[name]
    arch = x["arch"]
    kv: dict[str, KV] = {}
    for key, v in x["kv"].items():
        t, val = v["type"], v["value"]
        if key == "general.architecture" or key.startswith("tokenizer."):
            continue
        if t.startswith("ARRAY["):
            sub = t[len("ARRAY["):-1]
            if isinstance(val, dict):
                val = [val["head"][0]] * val["array_len"]
            if sub not in SCALAR or not val:
                continue  # empty nested arrays carry nothing llama.cpp needs
            kv[key] = KV(val, VT.ARRAY, SCALAR[sub])
        else:
            kv[key] = KV(val, SCALAR[t])
    kv.update(tokenizer_kv(int(x["kv"][f"{arch}.vocab_size"]["value"])))
    tensors = [(n, np.zeros(tuple(reversed(t["ne"])), np.float32)) for n, t in x["tensors"].items()]
    for i, layer in x["layers"].items():
        tensors += [(f"blk.{i}.{n}", np.zeros(tuple(reversed(t["ne"])), np.float32)) for n, t in layer.items()]
    write_gguf(path, arch, kv, tensors)
    return arch
