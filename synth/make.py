"""Spec → GGUF file."""

from __future__ import annotations

import os

from synth.families import get_family
from synth.gguf_io import GGUFFile, write_gguf
from synth.spec import SPEC_KEY, Knobs, ModelSpec


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
