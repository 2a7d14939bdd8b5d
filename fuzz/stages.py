"""A fixture as the oracles see it: its layer kinds (read from the file), its interleave period, and its stages,
each materialized once per layer range (by synth.stage unless a test injects a broken slicer)."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from synth.gguf_io import GGUFFile
from synth.inspect import ModelInfo, inspect_gguf
from synth.stage import SourceModel, StageInfo, Unsupported, embd_input_contract, stage_path

Slicer = Callable[[Path, Path, int, int], StageInfo]  # (source, destination, first, last) → StageInfo
KIND_LETTER = {"attention": "A", "recurrent": "R", "both": "B", "mlp": "M"}


def pattern_period(kinds: str) -> int:
    """Smallest p such that the layer-kind string is p-periodic (1 for uniform models)."""
    n = len(kinds)
    for p in range(1, n + 1):
        if all(kinds[i] == kinds[i % p] for i in range(n)):
            return p
    return n


def stage_ranges(cuts: list[int], n_layer: int) -> list[list[int]]:
    """[[0, c1], [c1, c2], ..., [ck, n_layer]]"""
    bounds = [0, *cuts, n_layer]
    return [[bounds[i], bounds[i + 1]] for i in range(len(bounds) - 1)]


class FixtureStages:
    def __init__(self, fixture: Path, *, slicer: Slicer | None = None, period: int | None = None,
                 shared: bool = True):
        """shared (the oracles' way: they feed stages token ids and embeddings, never text): every stage a split
        GGUF whose second file, the model's global tensors (embedding, head), is one file all stages link to, and
        whose tokenizer is a placeholder (synth.stage.write_stage). shared=False: each stage one self-contained
        GGUF with the model's own tokenizer."""
        self.fixture = Path(fixture)
        self.shared = shared
        self.g = GGUFFile(self.fixture)  # parsed once, for every reader below
        self.info: ModelInfo = inspect_gguf(self.g)
        self.embd_refused = embd_input_contract(self.g)
        self.kinds = "".join(KIND_LETTER[x.kind] for x in self.info.layers)
        self.period = period or pattern_period(self.kinds)
        self.slicer = slicer or self._slice
        self._source: SourceModel | None = None
        self._cache: dict[tuple[int, int], tuple[Path, StageInfo] | Unsupported] = {}
        self.workdir: Path | None = None
        self._stage_bytes = 0  # stage files written so far, without the shared-globals file

    @contextlib.contextmanager
    def workspace(self, workdir: Path | None) -> Iterator[Path]:
        """Where stage files go for the duration: workdir (kept) or a temporary directory (removed)."""
        if workdir is not None:
            workdir.mkdir(parents=True, exist_ok=True)
            self.workdir = workdir
            yield workdir
            return
        with tempfile.TemporaryDirectory(prefix="fuzz-stages-") as d:
            self.workdir = Path(d)
            yield self.workdir

    def _slice(self, src: Path, dst: Path, a: int, b: int) -> StageInfo:
        if self._source is None:
            self._source = SourceModel(self.g if Path(src) == self.fixture else src)
        return self._source.slice(dst, a, b, shared=self.shared)

    @property
    def bytes_written(self) -> int:
        """Bytes of stage files written so far, the shared-globals file (if any) counted once."""
        return self._stage_bytes + (self._source.shared_bytes if self._source is not None else 0)

    def stage(self, a: int, b: int) -> tuple[Path, StageInfo] | Unsupported:
        assert self.workdir is not None, "use FixtureStages.workspace()"
        if (a, b) not in self._cache:
            path = stage_path(self.workdir, self.fixture, a, b, shared=self.shared)
            try:
                self._cache[(a, b)] = (path, self.slicer(self.fixture, path, a, b))
                self._stage_bytes += path.stat().st_size
            except Unsupported as e:
                self._cache[(a, b)] = e
        return self._cache[(a, b)]

    def stages(self, cuts: list[int]) -> list[tuple[Path, StageInfo]] | Unsupported:
        """The chain for a cut set, or the first stage that cannot be expressed (message names the range)."""
        out = []
        for a, b in stage_ranges(cuts, self.info.n_layer):
            st = self.stage(a, b)
            if isinstance(st, Unsupported):
                return Unsupported(f"stage {a}:{b}: {st}")
            out.append(st)
        return out
