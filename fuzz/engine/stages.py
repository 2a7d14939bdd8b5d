"""A fixture as the oracles see it: its layer kinds (read from the file), its interleave period, and its stages,
each materialized once per layer range (by synth.stage unless a test injects a broken slicer)."""

from __future__ import annotations

import contextlib
import itertools
import os
import shlex
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from synth.errors import UserError
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


PLANNER = "planner:"  # --cuts planner:CMD: the cut sets a runtime's topology planner chooses for the model


def planner_cuts(command: str, model: str | os.PathLike, n_layer: int, stages: int) -> list[list[int]]:
    """The cut sets a planner command chooses: `CMD MODEL.gguf STAGES` prints one cut set per line (the layers at
    which stages 2..K start, comma-separated; '#' lines are comments). A planner that fails or prints something
    else is bad input."""
    argv = [*shlex.split(command), str(model), str(stages)]
    if not argv[:-2]:
        raise UserError("--cuts planner:CMD: name the planner command, e.g. planner:'plan-split --json'")
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise UserError(f"--cuts planner:{command}: no such program {argv[0]!r}; put it on PATH or give its path") \
            from None
    except subprocess.TimeoutExpired:
        raise UserError(f"--cuts planner:{command}: no answer within 120 s for {model} ({stages} stages)") from None
    last = (done.stderr.strip().splitlines() or [""])[-1]
    if done.returncode != 0:
        raise UserError(f"--cuts planner:{command}: exited {done.returncode} for {Path(model).name} ({stages} "
                        f"stages): {last or 'no message'}")
    lines = [ln.strip() for ln in done.stdout.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    if not lines:
        raise UserError(f"--cuts planner:{command}: chose no cut set for {Path(model).name} ({stages} stages)")
    try:
        sets = cut_sets(";".join(lines), n_layer, stages, 1)
    except UserError:
        raise UserError(f"--cuts planner:{command}: printed {' | '.join(lines)[:80]!r} for {Path(model).name}, not "
                        f"cut sets in 1..{n_layer - 1} (one per line, cuts comma-separated, e.g. '12' or '8,16')") \
            from None
    wrong = [cs for cs in sets if len(cs) != stages - 1]
    if wrong:
        raise UserError(f"--cuts planner:{command}: chose {','.join(map(str, wrong[0]))} for {stages} stages; a "
                        f"set of {stages - 1} cut(s) was expected")
    return sets


def cut_sets(spec: str, n_layer: int, stages: int, period: int, model: str | os.PathLike | None = None) \
        -> list[list[int]]:
    """The cut sets a spec names for a model of n_layer layers: all, period (every cut offset modulo the interleave
    period), none, explicit lists ('3;5;2,6'), or planner:CMD (what CMD chooses for `model`)."""
    if spec.startswith(PLANNER):
        if model is None:
            raise UserError(f"--cuts {spec}: a planner needs the model's file")
        return planner_cuts(spec[len(PLANNER):], model, n_layer, stages)
    if n_layer < 2:
        raise UserError(f"the model has {n_layer} layer; a split needs at least 2")
    if stages < 2 or stages > n_layer:
        raise UserError(f"--stages {stages}: must be in 2..{n_layer} (the model has {n_layer} layers)")
    singles = list(range(1, n_layer))
    if spec == "none":
        return [[]]  # one stage: the whole model (state hand-off and determinism of the unsplit model)
    if spec == "all":
        pool = singles
    elif spec == "period":
        # every cut offset modulo the interleave period: the first cut with each residue
        seen: dict[int, int] = {}
        for c in singles:
            seen.setdefault(c % period, c)
        pool = sorted(seen.values())
    else:
        sets = []
        for part in spec.split(";"):
            try:
                cs = sorted(int(x) for x in part.replace(" ", "").split(",") if x)
            except ValueError:
                raise UserError(f"--cuts {spec!r}: expected all, period, or cut lists like '3;5;2,6'") from None
            if not cs or any(not 0 < c < n_layer for c in cs) or len(set(cs)) != len(cs):
                raise UserError(f"--cuts {spec!r}: each cut must be in 1..{n_layer - 1}, distinct within a set")
            sets.append(cs)
        return sets
    sets = [[c] for c in pool] if stages == 2 else \
        [list(cs) for cs in itertools.combinations(pool if spec == "period" else singles, stages - 1)]
    if not sets:
        raise UserError(f"--cuts {spec} --stages {stages}: no cut sets (only {len(pool)} cut offset(s) with period "
                        f"{period}); use fewer --stages or --cuts all")
    return sets
