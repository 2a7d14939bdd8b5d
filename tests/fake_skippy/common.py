"""What both fake binaries share: the bug switch, the architecture check, stage files, and a stage running in its
own llama.cpp worker (decode, state export and import, the kv_cache's payload rules).

The fake follows skippy's interface as read from the public sources (Mesh-LLM/mesh-llm crates/skippy-cli,
skippy-correctness; see docs/skippy.md): its `Error: <message>` / exit 1 convention for runtime errors,
its `Unsupported: ...` wording for an architecture it refuses, the kv_cache payload kinds. Everything computed
comes from the real llama.cpp in worker processes; nothing here does model math.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from synth.errors import UserError

BUG_ENV = "FAKE_SKIPPY_BUG"
BUGS = {
    "drops-recurrent": "B1: kv_cache payload `auto` resolved by probing only the stage's first layer's tensor names; "
                       "a stage starting on attention restores as resident-kv and loses its recurrent state",
    "truncates-kv": "B5: every KV export (state-handoff's, the kv_cache's records) cut to the first layer's K/V width",
    "loads-dropped": "no architecture check: dropped (tier-3) families load",
    "malformed-report": "skippy-correctness writes a report without `matches`/`status` and exits 0",
    "hangs": "stage 0's /v1/completions never answers; skippy-correctness lanes never write a report",
}

# llama.cpp's arch names of the families family_tiers.toml drops (tier 3): skippy refuses to slice them
DROPPED = frozenset({"gpt2", "bloom", "gptneox", "mpt", "codeshell", "openelm", "refact", "stablelm", "plm", "arcee",
                     "deci", "chatglm", "baichuan", "granitemoe", "smallthinker", "maincoder", "xverse", "starcoder2"})
UNSUPPORTED_ARCH = "runtime-slice execution is not supported for this model architecture yet"

LOAD_MODES = ("runtime-slice", "layer-package", "artifact-slice")
PAYLOADS = ("auto", "resident-kv", "kv-recurrent", "full-state")
HANDOFF_PAYLOADS = ("resident-kv", "full-state", "recurrent-only", "kv-recurrent")
CODECS = ("raw-f32-v1", "f16-rne-v1", "bf16-rne-v1", "s8-row-f32-rne-v1")  # StageConfig activation_codec


class FakeError(Exception):
    """A failure reported the way skippy reports one: `Error: <message>` on stderr, exit 1."""


def bug() -> str | None:
    """The bug class this fake re-creates (FAKE_SKIPPY_BUG), or None for a correct fake."""
    name = os.environ.get(BUG_ENV) or None
    if name is not None and name not in BUGS:
        raise FakeError(f"fake skippy: unknown {BUG_ENV}={name!r}; one of {', '.join(BUGS)}")
    return name


def log(who: str, msg: str) -> None:
    sys.stderr.write(f"fake-skippy {who}: {msg}\n")
    sys.stderr.flush()


def fail(msg: str) -> int:
    """Print skippy's error line; the exit code to return."""
    sys.stderr.write(f"Error: {msg}\n")
    sys.stderr.flush()
    return 1


def hang_forever() -> None:
    log("bug", f"{BUG_ENV}=hangs: never answering")
    while True:
        time.sleep(3600)


def model_arch(path: str | os.PathLike) -> str:
    """general.architecture of a GGUF, or of a layer package's source model."""
    p = Path(path)
    try:
        if p.is_dir():
            from synth.package import read_manifest

            return str(read_manifest(p)["source_model"]["arch"])
        from synth.gguf_io import GGUFFile

        return GGUFFile(p).arch
    except UserError as e:
        raise FakeError(str(e)) from None


def check_arch(path: str | os.PathLike) -> str:
    """Refuse a dropped family as skippy does, before anything is served (unless FAKE_SKIPPY_BUG=loads-dropped)."""
    arch = model_arch(path)
    if arch in DROPPED and bug() != "loads-dropped":
        raise FakeError(f"Unsupported: {UNSUPPORTED_ARCH} ({arch})")
    return arch


# ---- stage files ------------------------------------------------------------------------------------------------

@dataclass
class StageFile:
    """A stage's GGUF as the fake loads it: layers [layer_start, layer_end) of the source model."""

    path: Path
    layer_start: int
    layer_end: int
    pads: list[int] = field(default_factory=list)  # stage indices of pass-through pad layers

    def first_layer(self, n_layer: int) -> int:
        """The stage index holding source layer layer_start (prepended pads come before it)."""
        return next((j for j in range(n_layer) if j not in self.pads), 0)


def workdir() -> Path:
    return Path(tempfile.mkdtemp(prefix="fake-skippy-"))


def stage_file(load_mode: str, model_path: str | os.PathLike, a: int, b: int, into: Path,
               source: Any = None) -> StageFile:
    """Materialize (or find) the stage [a, b): runtime-slice cuts the full model itself (synth.stage: the slicer our
    sweep oracle certifies), layer-package assembles it from a `synth package` directory, artifact-slice is given
    the stage file. A stage the slicer cannot express is skippy's `Unsupported: ...`."""
    from synth.stage import SourceModel, Unsupported

    dst = into / f"stage-L{a:03d}-{b:03d}.gguf"
    try:
        if load_mode == "runtime-slice":
            if Path(model_path).is_dir():
                raise FakeError(f"runtime-slice needs model_path to be a GGUF file, not a directory: {model_path}")
            st = (source or SourceModel(model_path)).slice(dst, a, b)
            return StageFile(dst, a, b, list(st.pads))
        if load_mode == "layer-package":
            from synth.package import materialize_stage

            if not Path(model_path).is_dir():
                raise FakeError("layer-package load mode requires model_path to point at a package directory")
            st = materialize_stage(model_path, a, b, dst)
            return StageFile(dst, a, b, list(st.pads))
        if load_mode == "artifact-slice":
            from synth.gguf_io import GGUFFile
            from synth.spec import STAGE_KEYS

            g = GGUFFile(model_path)
            pads = g.kv.get(f"{STAGE_KEYS}.pad_layers") or []
            return StageFile(Path(model_path), a, b, [int(x) for x in pads])
    except Unsupported as e:
        raise FakeError(f"Unsupported: {e}") from None
    except UserError as e:
        raise FakeError(str(e)) from None
    raise FakeError(f"unknown load_mode {load_mode!r}; one of {', '.join(LOAD_MODES)}")


def stage_first_layer_looks_recurrent(sf: StageFile, n_layer: int) -> bool:
    """B1's probe (targets.mutants.first_layer_looks_recurrent: only the first layer's tensor names decide), aimed
    at the stage's first layer: stage files renumber their layers blk.0.., so it is blk.0 unless pads come first."""
    from targets.mutants import RECURRENT_NAME_PROBE, first_layer_looks_recurrent

    j = sf.first_layer(n_layer)
    if j == 0:
        return first_layer_looks_recurrent(str(sf.path))
    from synth.gguf_io import GGUFFile

    names = [n for n in GGUFFile(sf.path).tensors if n.startswith(f"blk.{j}.")]
    return any(p in n for n in names for p in RECURRENT_NAME_PROBE)


def codec_roundtrip(rows: np.ndarray, codec: str) -> np.ndarray:
    """Boundary rows as a stage receives them through skippy's activation codec. f16 / bf16: targets.wire's
    round-to-nearest-even conversions (the ones our worker's `wire` decodes use). s8-row-f32-rne-v1 (the fake's
    reading of skippy's 8-bit codec): per row, an f32 scale max|x| / 127 and int8 values rounded to nearest even."""
    if codec == "raw-f32-v1":
        return rows
    if codec in ("f16-rne-v1", "bf16-rne-v1"):
        from targets.wire import roundtrip_rows

        return roundtrip_rows(rows.astype(np.float32), codec.split("-")[0], np).reshape(rows.shape)
    if codec == "s8-row-f32-rne-v1":
        x = rows.astype(np.float32)
        d = np.abs(x).max(axis=1, keepdims=True) / np.float32(127)
        with np.errstate(divide="ignore", invalid="ignore"):
            q = np.where(d == 0, np.float32(0), np.clip(np.rint(x / d), -127, 127))
        return (q.astype(np.float32) * d).astype(np.float32)
    raise FakeError(f"unknown activation_codec {codec!r}; one of {', '.join(CODECS)}")


# ---- a stage in its own worker ----------------------------------------------------------------------------------

@dataclass
class Params:
    n_ctx: int = 512
    n_batch: int = 64
    n_ubatch: int = 64
    flash_attn: bool = False
    timeout: float = 120.0
    codec: str = "raw-f32-v1"  # how this stage receives boundary rows


class StageWorker:
    """One stage (or the whole model) in its own llama.cpp worker process.

    A stage holding layer 0 takes tokens; later stages take the previous stage's boundary rows as embeddings.
    A stage that is not last captures its last stage layer (pads included: they pass the residual through) and
    hands those rows on; the last stage gives the argmax of its last row."""

    def __init__(self, name: str, params: Params):
        from targets import open_target

        self.name = name
        self.params = params
        self.target = open_target("llama-cpp", timeout=params.timeout)
        self.target.start()  # spawn now: several workers start in parallel while the first loads
        self.info: dict[str, Any] = {}
        self.sf: StageFile | None = None
        self.last = True
        self.n_recurrent = 0

    def load(self, path: str | os.PathLike, *, last: bool, sf: StageFile | None = None) -> dict[str, Any]:
        from synth.inspect import inspect_file

        p = self.params
        r = self.target.load(str(path), n_ctx=p.n_ctx, n_batch=p.n_batch, n_ubatch=min(p.n_ubatch, p.n_batch),
                             flash_attn=p.flash_attn, capture=not last)
        self._ok(r, "load")
        self.info, self.sf, self.last = r.data, sf, last
        self.n_recurrent = sum(x.kind in ("recurrent", "both") for x in inspect_file(str(path)).layers)
        return self.info

    def close(self) -> None:
        self.target.client.request_close()

    def _ok(self, r: Any, what: str) -> Any:
        if not r.ok:
            raise FakeError(f"{self.name}: {what} failed: {r.failure.message}")
        return r.data

    # ---- tokens --------------------------------------------------------------------------------------------
    def tokenize(self, text: str) -> list[int]:
        return [int(t) for t in self._ok(self.target.call("tokenize", text=text), "tokenize")["tokens"]]

    def detokenize(self, tokens: list[int]) -> str:
        return str(self._ok(self.target.call("detokenize", tokens=list(tokens)), "detokenize")["text"])

    # ---- decoding ------------------------------------------------------------------------------------------
    @property
    def n_embd(self) -> int:
        return int(self.info["n_embd"])

    @property
    def n_layer(self) -> int:
        return int(self.info["n_layer"])

    def reset(self) -> None:
        self._ok(self.target.reset(), "reset")

    def decode(self, pos0: int, *, tokens: list[int] | None = None, rows: np.ndarray | None = None,
               logits: bool = False) -> Any:
        """Decode a batch at positions pos0.. (split into n_batch chunks if larger): the boundary rows (n × n_embd)
        of a stage that is not last, the argmax of the last row of the last stage (logits: with that row's
        logits, as (argmax, row))."""
        from fuzz.engine.parity import pos_per_token

        n = len(tokens) if tokens is not None else len(rows)
        out: list[np.ndarray] = []
        result: Any = None
        for i in range(0, n, self.params.n_batch):
            j = min(n, i + self.params.n_batch)
            kw: dict[str, Any] = {"pos": list(range(pos0 + i, pos0 + j))}
            if tokens is not None:
                kw["tokens"] = tokens[i:j]
            else:
                kw["embd"] = codec_roundtrip(rows[i:j], self.params.codec)
                kw["n_pos_per_token"] = pos_per_token(self.info)
            if self.last:
                data = self._ok(self.target.decode(logits="last", **kw), "decode")
                result = (int(data["argmax"][-1]), data["logits"][-1]) if logits else int(data["argmax"][-1])
            else:
                r = self.target.decode(logits="none", capture=[self.n_layer - 1], **kw)
                out.append(self._ok(r, "decode")["captures"][self.n_layer - 1])
        return result if self.last else np.concatenate(out) if out else np.zeros((0, self.n_embd), np.float32)

    # ---- state ---------------------------------------------------------------------------------------------
    def export_state(self, *, partial: bool = False, exported: bool = True) -> bytes:
        """Sequence 0's state (state_get). exported: it leaves the stage (a hand-off, a cache record), where
        FAKE_SKIPPY_BUG=truncates-kv cuts every layer's K/V rows to the first layer's width (B5)."""
        blob = bytes(self._ok(self.target.state_get(0, partial=partial), "state_get")["blob"])
        if exported and not partial and bug() == "truncates-kv":
            from targets.mutants import uniform_kv_rows

            blob = uniform_kv_rows(blob)
        return blob

    def import_state(self, blob: bytes, kind: str) -> None:
        """Import a payload into sequence 0. full-state / kv-recurrent: the whole state. recurrent-only: the partial
        (recurrent / SWA) state alone. resident-kv: skippy's KV-only payload ("dense models only"): the whole state
        goes in, then the recurrent state is lost — its data zeroed, as targets.mutants.B1FirstLayerProbe does."""
        if kind == "recurrent-only":
            self._ok(self.target.state_set(blob, 0, partial=True), "state_set")
            return
        self._ok(self.target.state_set(blob, 0), "state_set")
        if kind == "resident-kv" and self.n_recurrent:
            from targets.mutants import zero_recurrent_data

            part = self.export_state(partial=True, exported=False)
            self._ok(self.target.state_set(zero_recurrent_data(part, self.n_recurrent), 0, partial=True),
                     "state_set")

    def resolve_payload(self, payload: str) -> str:
        """The kv_cache payload a stage restores with. `auto`: from what the loaded stage is (llama.cpp's
        is_recurrent / is_hybrid) — or, with FAKE_SKIPPY_BUG=drops-recurrent, from its first layer's tensor names."""
        if payload != "auto":
            return payload
        if bug() == "drops-recurrent":
            assert self.sf is not None
            return "kv-recurrent" if stage_first_layer_looks_recurrent(self.sf, self.n_layer) else "resident-kv"
        return "full-state" if self.info.get("is_recurrent") or self.info.get("is_hybrid") else "resident-kv"


def close_workers(workers: list[StageWorker], timeout: float = 3.0) -> None:
    """Ask every worker to exit, then wait (killing any that does not)."""
    for w in workers:
        w.close()
    for w in workers:
        w.target.client.wait_closed(timeout)


# ---- the kv_cache ---------------------------------------------------------------------------------------------

@dataclass
class KvCacheConfig:
    """StageConfig.kv_cache (skippy's spellings and defaults)."""

    mode: str = "auto"  # disabled | auto | record | lookup-record
    payload: str = "auto"  # auto | resident-kv | kv-recurrent | full-state
    max_entries: int = 64
    max_bytes: int = 0  # 0: no limit
    min_tokens: int = 64

    @property
    def records(self) -> bool:
        # `auto` is off in the fake: skippy's automatic policy is not part of what the adapter drives
        return self.mode in ("record", "lookup-record")

    @property
    def looks_up(self) -> bool:
        return self.mode == "lookup-record"


class KvCache:
    """Recorded sequence states keyed by the token ids they hold, least recently used evicted first."""

    def __init__(self, cfg: KvCacheConfig):
        self.cfg = cfg
        self.entries: OrderedDict[tuple[int, ...], bytes] = OrderedDict()

    def put(self, key: list[int], blob: bytes) -> None:
        k = tuple(key)
        if self.cfg.max_bytes and len(blob) > self.cfg.max_bytes:
            return
        self.entries[k] = blob
        self.entries.move_to_end(k)
        while len(self.entries) > max(self.cfg.max_entries, 0) or (
                self.cfg.max_bytes and sum(map(len, self.entries.values())) > self.cfg.max_bytes):
            self.entries.popitem(last=False)

    def get(self, key: list[int]) -> bytes | None:
        k = tuple(key)
        if k in self.entries:
            self.entries.move_to_end(k)
            return self.entries[k]
        return None

    def longest_prefix(self, tokens: list[int]) -> list[int] | None:
        """The longest recorded key that is a proper prefix of tokens and at least min_tokens long."""
        best: tuple[int, ...] | None = None
        for k in self.entries:
            if self.cfg.min_tokens <= len(k) < len(tokens) and tuple(tokens[:len(k)]) == k \
                    and (best is None or len(k) > len(best)):
                best = k
        return list(best) if best is not None else None


# ---- reports ----------------------------------------------------------------------------------------------------

def write_report(report: dict[str, Any], path: str | os.PathLike) -> str:
    """The report printed pretty (skippy prints it to stdout and writes it to --report-out, parents created)."""
    import json

    text = json.dumps(report, indent=2)
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text + "\n")
    return text
