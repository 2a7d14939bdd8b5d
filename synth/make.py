"""Spec → GGUF file."""

from __future__ import annotations

import dataclasses
import os

from synth.errors import UserError
from synth.families import get_family
from synth.gguf_io import GGUFFile, write_gguf
from synth.spec import SPEC_KEY, Knobs, ModelSpec

# how a family's attention heads are made `width` wide, in order: its head size; one head as wide as the model; two,
# the model twice as wide (families whose head size is the width over the heads)
WIDER_HEADS = (lambda w: {"head_dim": w}, lambda w: {"embd": w, "heads": 1}, lambda w: {"embd": 2 * w, "heads": 2})


def resolve(family: str, knobs: Knobs | None = None) -> ModelSpec:
    return get_family(family).resolve(knobs or Knobs())


def write_fixture(spec: ModelSpec, path: str | os.PathLike) -> int:
    """Write the fixture for spec to path; returns its size in bytes."""
    fam = get_family(spec.family)
    kv, tensors = fam.to_gguf(spec)
    return write_gguf(path, fam.arch_name, kv, tensors)


def spec_of(path: str | os.PathLike) -> ModelSpec | None:
    """The spec a fixture was written from (its provenance key), or None: a GGUF synth did not write."""
    text = GGUFFile(path).kv.get(SPEC_KEY)
    return ModelSpec.from_json(text) if isinstance(text, str) else None


def with_head_size(family: str, knobs: Knobs, width: int) -> ModelSpec | None:
    """The family's spec with every attention head `width` wide (what llama.cpp's quantized KV cache needs: a head
    a whole number of its blocks, and the rotation of a quantized cache 64), by the first of WIDER_HEADS the family
    takes whose fixture has heads that wide; None when none does."""
    fam = get_family(family)
    for way in WIDER_HEADS:
        if not set(way(width)) <= fam.knobs:
            continue
        try:
            spec = fam.resolve(dataclasses.replace(knobs, **way(width)))
        except UserError:
            continue
        if spec.head_dim == width:
            return spec
    return None
