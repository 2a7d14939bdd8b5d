"""Stage materialization: a GGUF holding layers [a, b) of a model, that the pinned llama.cpp loads and that
computes the same function as those layers of the full model.

What the naive slice (copy metadata, renumber blk.i) gets wrong is exactly the set of *stage contracts* a split
runtime must honour (docs/findings.md, "Stage contracts"). This module handles the ones llama.cpp can
express and names the ones it cannot:

- per-layer metadata arrays are sliced (only keys llama.cpp reads per layer; an unrelated array that happens to
  have n_layer entries is left alone);
- hparams derived from the layer index are re-expressed so each layer keeps its kind: leading dense blocks,
  "attention every Nth layer" (full_attention_interval → recurrent_layers array), sliding-window patterns
  (→ per-layer array);
- a stage llama.cpp cannot run (a hybrid stage with no attention layer has a zero-size KV cache; with no
  recurrent layer, a zero-size state cache) gets a pass-through pad layer: a copy of a layer of the missing kind
  whose output projections are zero, so x + 0 = x bit for bit. Pads carry state of their own; the stage records
  which layers are pads;
- input transforms that would be applied a second time to a residual (absolute position embeddings) are
  neutralized where that is exact (zeroed), and reported as unsupported where it is not (an input LayerNorm,
  a hard-coded embedding scale) — see `stage_contract`.

`write_stage` is the one stage writer: `SourceModel.slice` (a model GGUF) and `synth.package.materialize_stage`
(a layer package) both hand it the model as pieces (metadata, global tensors, per-layer tensors), so the two
give byte-identical stages.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from synth.errors import UserError
from synth.gguf_io import KV, VT, GGUFFile, Tensor, read_all, write_gguf, zeros_like
from synth.inspect import HYBRID_ARCHS, INTERVAL_ARCHS, PARALLEL_ARCHS, ModelInfo, inspect_gguf, source_swa_layers
from synth.spec import SPEC_KEY, STAGE_KEYS

# Keys llama.cpp reads per layer (get_key_or_arr / get_arr of length n_layer); suffixes after "{arch}.".
PER_LAYER_KEYS = frozenset({
    "feed_forward_length", "expert_feed_forward_length", "expert_used_count", "attention.head_count",
    "attention.head_count_kv", "attention.sliding_window_pattern", "attention.rope_pattern",
    "attention.recurrent_layers", "attention.indexer.types", "swiglu_clamp_exp", "swiglu_clamp_shexp",
    "attention.compress_ratios",
})

# Tensors whose output is added to the residual: zero them and the layer is a pass-through (x + 0 = x).
OUTPUT_PROJECTIONS = ("attn_output.", "ffn_down.", "ffn_down_exps.", "ffn_down_shexp.", "ssm_out.",
                      "shortconv.out_proj.", "time_mix_output.", "channel_mix_value.", "attn_output_b.")


_BLK = re.compile(r"^blk\.(\d+)\.(.+)$")


@dataclass
class StageInfo:
    """What a stage file is, relative to its source model."""

    source: str
    first: int  # source layers [first, last)
    last: int
    n_layer_source: int
    layers: list[int]  # source layer index of each stage layer (pads repeat their donor)
    pads: list[int] = field(default_factory=list)  # stage indices that are pass-through pads
    notes: list[str] = field(default_factory=list)

    @property
    def n_layer(self) -> int:
        return len(self.layers)

    @property
    def real(self) -> list[int]:
        """Stage indices of the real (non-pad) layers, in order."""
        return [i for i in range(self.n_layer) if i not in self.pads]


class Unsupported(Exception):
    """A stage the pinned llama.cpp cannot express; the message names the contract."""


def parse_range(text: str, n_layer: int) -> tuple[int, int]:
    m = re.fullmatch(r"\s*(\d*)\s*:\s*(\d*)\s*", text)
    if not m:
        raise UserError(f"--layers {text!r}: expected A:B (layers A..B-1), e.g. 0:4")
    a = int(m.group(1)) if m.group(1) else 0
    b = int(m.group(2)) if m.group(2) else n_layer
    if not 0 <= a < b <= n_layer:
        raise UserError(f"--layers {text!r}: need 0 <= A < B <= {n_layer} (the model has {n_layer} layers)")
    return a, b


def embd_input_contract(g: GGUFFile) -> str | None:
    """Why this model cannot take batch.embd at all (declared by its family module), or None."""
    from synth.families import family_for_arch  # stage.py is imported by families' users, not vice versa

    fam = family_for_arch(g.arch)
    return fam.embd_refusal(g) if fam else None


def stage_contract(g: GGUFFile, a: int, b: int) -> str | None:
    """Why the stage [a, b) cannot compute the same function as those layers of the full model, or None.

    Stages after the first take the residual through batch.embd, and llama.cpp applies some input transforms to
    embedding input exactly as to token embeddings, so they would be applied twice. Families declare the rest.
    """
    from synth.families import family_for_arch

    fam = family_for_arch(g.arch)
    if a > 0:
        why = embd_input_contract(g)
        if why:
            return why
        if "token_embd_norm.weight" in g.tensors and g.arch != "lfm2":  # lfm2 stores its *final* norm there
            return "input LayerNorm (token_embd_norm) would be applied to the residual again; llama.cpp has no " \
                   "switch to skip it for embedding input"
    return fam.stage_refusal(g, a, b) if fam else None


def plan_stage(g: GGUFFile, info: ModelInfo, a: int, b: int) -> StageInfo:
    """Which source layers a stage [a, b) holds, including any pass-through pads it needs."""
    from synth.families import family_for_arch

    n = info.n_layer
    layers = list(range(a, b))
    st = StageInfo(source=str(g.path), first=a, last=b, n_layer_source=n, layers=layers)

    def append_pad(donors: list[int], why: str) -> None:
        donor = _pick_donor(g, donors, layers)
        st.layers.append(donor)
        st.pads.append(len(st.layers) - 1)
        st.notes.append(f"stage {a}:{b} has {why}: appended a pass-through copy of layer {donor} "
                        "(output projections zeroed)")

    if g.arch in HYBRID_ARCHS and g.arch not in PARALLEL_ARCHS:
        kinds = [info.layers[i].kind for i in layers]
        for want, why in (("attention", "no attention layer (zero-size KV cache)"),
                          ("recurrent", "no recurrent layer (zero-size state cache)")):
            donors = [i for i in range(n) if info.layers[i].kind == want]
            if want not in kinds:
                if not donors:
                    raise Unsupported(f"stage {a}:{b} has {why} and the model has no {want} layer to pad with")
                append_pad(donors, why)
    fam = family_for_arch(g.arch)
    is_swa = source_swa_layers(g, n) if int(g.get("attention.sliding_window", 0) or 0) > 0 else None
    if is_swa is not None and not any(is_swa[i] for i in layers):
        # llama.cpp sets up an iSWA cache whenever a window is set and asserts it has an SWA layer
        append_pad([i for i in range(n) if is_swa[i]], "no sliding-window layer")
    missing = fam.stage_missing(g, layers) if fam is not None else None
    if missing:
        append_pad(*missing)
    if fam is not None and fam.layer_phase and a % fam.layer_phase:
        k = a % fam.layer_phase  # the k layers before a have the phases the stage's first k slots need
        st.layers[:0] = list(range(a - k, a))
        st.pads = list(range(k)) + [p + k for p in st.pads]
        st.notes.append(f"{g.arch} derives layer kinds from the index mod {fam.layer_phase}: prepended {k} "
                        f"pass-through copies of layers {a - k}..{a - 1} so every layer keeps its phase")
    if fam is not None and fam.stage_starts_full and is_swa is not None and is_swa[a]:
        lead = int(g.get("leading_dense_block_count", 0) or 0)
        donors = [i for i in range(n) if not is_swa[i] and (i < lead or a >= lead)]
        if not donors:
            raise Unsupported(f"stage {a}:{b} starts on a sliding-window layer and the model has no full layer "
                              "to prepend (the graph sizes RoPE from layer 0)")
        st.layers.insert(0, donors[0])  # (a family has either a phase rule or this one, not both)
        st.pads = [0] + [p + 1 for p in st.pads]
        st.notes.append(f"stage {a}:{b} starts on a sliding-window layer, but {g.arch} sizes every full "
                        f"layer's RoPE from layer 0: prepended a pass-through copy of full layer {donors[0]}")
    return st


def _pick_donor(g: GGUFFile, donors: list[int], layers: list[int]) -> int:
    """A donor that keeps leading dense blocks a prefix once appended: a MoE donor if the stage has MoE layers."""
    lead = int(g.get("leading_dense_block_count", 0) or 0)
    if lead and any(i >= lead for i in layers):
        donors = [d for d in donors if d >= lead] or donors
    return donors[0]


Tensors = list[tuple[str, Tensor]]
LayerTensors = Callable[[int], Tensors]  # source layer index → its tensors, names without the `blk.N.` prefix


def split_tensors(tensors: Tensors) -> tuple[Tensors, dict[int, Tensors]]:
    """A model's tensors as (global tensors, each block's tensors), both in source order.

    Block tensors are keyed by their layer index and named without the `blk.N.` prefix. This is the one place
    that decides which tensors belong to a layer (used by slicing and by layer packages alike)."""
    by_layer: dict[int, Tensors] = {}
    globals_: Tensors = []
    for name, arr in tensors:
        m = _BLK.match(name)
        if m:
            by_layer.setdefault(int(m.group(1)), []).append((m.group(2), arr))
        else:
            globals_.append((name, arr))
    return globals_, by_layer


def write_stage(g: GGUFFile, info: ModelInfo, kv: dict[str, KV], globals_: Tensors, layer_tensors: LayerTensors,
                dst: str | os.PathLike, a: int, b: int, *, shared: Path | None = None) -> StageInfo:
    """Write the stage [a, b) of a model given as pieces, wherever they came from (one GGUF or a layer package).

    g describes the whole model (arch, metadata values, every tensor's name); kv is its writable metadata;
    globals_ its non-block tensors in source order; layer_tensors(i) the tensors of source layer i, called only
    for the layers the stage holds (pads included). Raises Unsupported for a stage llama.cpp cannot express.

    shared: the stage is written as the first file of a two-file split GGUF (llama.cpp loads a model's tensors from
    every file of its split): its layers and what it changes of the model in dst, named `…-00001-of-00002.gguf`,
    and the model's unchanged global tensors (token embedding, head, output norm, …) in `shared`, one file every
    such stage of the model links to as its `…-00002-of-00002.gguf` (write it with write_shared_globals). A real
    model's embedding is 100+ MB that every stage file repeated otherwise — twice for a tied head.
    Every such stage's tokenizer is also a placeholder of the same size (placeholder_vocab): a real vocabulary is
    most of a load (≈0.2 s for 262144 tokens), and tokens arrive as ids."""
    n = info.n_layer
    if not 0 <= a < b <= n:
        raise UserError(f"layers {a}:{b} out of range for {g.path} ({n} layers)")
    why = stage_contract(g, a, b)
    if why:
        raise Unsupported(why)
    st = plan_stage(g, info, a, b)
    new_kv = _stage_metadata(g, kv, st)
    new_tensors = _stage_tensors(globals_, layer_tensors, st, neutralize_positions=a > 0)
    if shared is not None:
        dst = Path(dst)
        if not dst.name.endswith(SPLIT_FIRST):
            raise ValueError(f"{dst}: a stage with shared globals is a split's first file, named *{SPLIT_FIRST}")
        kept = shared_globals(globals_)
        n_tensors = len(new_tensors)
        new_tensors = [(name, arr) for name, arr in new_tensors if name not in kept]
        new_kv = {**placeholder_vocab(g.arch, new_kv), "split.no": KV(0, VT.UINT16), "split.count": KV(2, VT.UINT16),
                  "split.tensors.count": KV(n_tensors, VT.INT32)}
        second = dst.with_name(dst.name[:-len(SPLIT_FIRST)] + SPLIT_SECOND)
        second.unlink(missing_ok=True)
        second.symlink_to(os.path.relpath(shared, dst.parent))
        st.notes.append(f"shared: {', '.join(sorted(kept))} in {Path(shared).name} (the split's second file)")
    write_gguf(dst, g.arch, new_kv, new_tensors)
    return st


SPLIT_FIRST, SPLIT_SECOND = "-00001-of-00002.gguf", "-00002-of-00002.gguf"


def shared_globals(globals_: Tensors) -> dict[str, Tensor]:
    """The global tensors every stage holds unchanged (all but the position embedding, zeroed after the first)."""
    return {name: arr for name, arr in globals_ if name != "position_embd.weight"}


def write_shared_globals(g: GGUFFile, globals_: Tensors, dst: str | os.PathLike) -> int:
    """The second file of every shared-globals stage's split (write_stage): the model's shared global tensors."""
    return write_gguf(dst, g.arch, {"split.no": KV(1, VT.UINT16)}, list(shared_globals(globals_).items()))


class SourceModel:
    """A model read once, to cut many stages from."""

    def __init__(self, src: str | os.PathLike | GGUFFile):
        self.g, self.kv, self.tensors = read_all(src)
        self.info = inspect_gguf(self.g)
        self.globals, self.by_layer = split_tensors(self.tensors)
        self._shared: dict[Path, int] = {}  # shared-globals files written, and their bytes
        self._lock = threading.Lock()

    def slice(self, dst: str | os.PathLike, a: int, b: int, *, shared: bool = False) -> StageInfo:
        """Write the stage [a, b) to dst; shared: its global tensors in one file beside it that every shared stage
        of this model in that directory links to (see write_stage; dst is then named by stage_path(shared=True)).
        Raises Unsupported for a stage llama.cpp cannot express."""
        path = None
        if shared:
            path = Path(dst).parent / f"{self.g.path.stem}.globals.gguf"
            with self._lock:
                if path not in self._shared:
                    self._shared[path] = write_shared_globals(self.g, self.globals, path)
        return write_stage(self.g, self.info, self.kv, self.globals, lambda i: self.by_layer.get(i, []), dst, a, b,
                           shared=path)

    @property
    def shared_bytes(self) -> int:
        """Bytes of the shared-globals files written so far."""
        return sum(self._shared.values())


def slice_model(src: str | os.PathLike, dst: str | os.PathLike, a: int, b: int) -> StageInfo:
    """Write the stage [a, b) of src to dst. Raises Unsupported for a stage llama.cpp cannot express."""
    return SourceModel(src).slice(dst, a, b)


def _stage_metadata(g: GGUFFile, kv: dict[str, KV], st: StageInfo) -> dict[str, KV]:
    arch, n, src = g.arch, st.n_layer_source, st.layers
    out: dict[str, KV] = {}
    for key, v in kv.items():
        if key == SPEC_KEY or key.startswith(STAGE_KEYS):
            continue  # the full model's spec does not describe a stage
        suffix = key[len(arch) + 1:] if key.startswith(arch + ".") else None
        if suffix in PER_LAYER_KEYS and isinstance(v.value, list) and len(v.value) == n:
            out[key] = KV([v.value[i] for i in src], v.type, v.sub_type)
        else:
            out[key] = v
    out[f"{arch}.block_count"] = KV(st.n_layer, VT.UINT32)

    # build_inp_embd applies embedding_scale to embedding input too (llama-graph.cpp): 0 disables it exactly
    scale_key = f"{arch}.embedding_scale"
    if st.first > 0 and scale_key in kv:
        out[scale_key] = KV(0.0, VT.FLOAT32)

    # leading dense blocks: source layers < lead are dense; the stage's dense layers must be a prefix
    lead_key = f"{arch}.leading_dense_block_count"
    if lead_key in kv:
        lead = int(kv[lead_key].value)
        dense = [i < lead for i in src]
        k = sum(dense)
        if dense != [True] * k + [False] * (len(src) - k):
            raise Unsupported(f"leading dense blocks ({lead}) cannot be expressed for source layers {src}")
        out[lead_key] = KV(k, VT.UINT32)

    # glm-dsa: a "shared" indexer layer reuses the top-k of the previous full layer (a sideband); llama.cpp
    # asserts that a stage's layer 0 is full. A sliding-window layer without an indexer (dots3note) takes no top-k.
    types = out.get(f"{arch}.attention.indexer.types")
    is_swa = source_swa_layers(g, n) if int(g.get("attention.sliding_window", 0) or 0) > 0 else None
    swa_first = bool(is_swa and is_swa[src[0]])
    if types is not None and isinstance(types.value, list) and types.value and not types.value[0] and not swa_first:
        raise Unsupported(f"stage starts on layer {src[0]}, a shared indexer layer: its top-k comes from an earlier "
                          "full layer (a sideband llama.cpp cannot take as stage input)")

    # "attention every Nth layer" is relative to the layer index: write the per-layer array instead
    rec_key = f"{arch}.attention.recurrent_layers"
    if arch in INTERVAL_ARCHS and rec_key not in kv:
        interval = int(g.get("full_attention_interval", 4))
        out[rec_key] = KV([(i + 1) % interval != 0 for i in src], VT.ARRAY, VT.BOOL)
        out.pop(f"{arch}.full_attention_interval", None)

    # sliding-window layers follow the layer index unless given per layer: write the per-layer array
    swa_key = f"{arch}.attention.sliding_window_pattern"
    if int(g.get("attention.sliding_window", 0) or 0) > 0:
        is_swa = source_swa_layers(g, n)
        if is_swa is None:
            raise Unsupported("sliding-window layers follow a rule of this arch's layer index that a stage cannot "
                              "re-express (no per-layer sliding_window_pattern in llama.cpp for it)")
        out[swa_key] = KV([is_swa[i] for i in src], VT.ARRAY, VT.BOOL)  # pads keep their donor's kind

    out[f"{STAGE_KEYS}.source_layers"] = KV(list(src), VT.ARRAY, VT.INT32)
    out[f"{STAGE_KEYS}.range"] = KV([st.first, st.last], VT.ARRAY, VT.INT32)
    out[f"{STAGE_KEYS}.n_layer_source"] = KV(n, VT.UINT32)
    if st.pads:
        out[f"{STAGE_KEYS}.pad_layers"] = KV(list(st.pads), VT.ARRAY, VT.INT32)
    return out


def placeholder_vocab(arch: str, kv: dict[str, KV]) -> dict[str, KV]:
    """The metadata with its tokenizer replaced by llama.cpp's `none` one of the same size ({arch}.vocab_size: that
    many placeholder tokens): the same model to a caller that passes token ids — the vocabulary's size shapes the
    embedding and the head, its strings nothing a decode computes — without parsing a vocabulary at every load."""
    tokens = kv.get("tokenizer.ggml.tokens")
    size = kv.get(f"{arch}.vocab_size")
    n = len(tokens.value) if tokens is not None else int(size.value) if size is not None else None
    if n is None:
        return kv  # no vocabulary to replace
    out = {k: v for k, v in kv.items() if not k.startswith("tokenizer.")}
    out["tokenizer.ggml.model"] = KV("none", VT.STRING)
    out[f"{arch}.vocab_size"] = KV(n, VT.UINT32)
    return out


def _stage_tensors(globals_: Tensors, layer_tensors: LayerTensors, st: StageInfo, *,
                   neutralize_positions: bool) -> Tensors:
    out: Tensors = []
    for name, arr in globals_:
        if neutralize_positions and name == "position_embd.weight":
            # the residual already carries the positions: adding them again would double them
            arr = zeros_like(arr)
        out.append((name, arr))
    for j, i in enumerate(st.layers):
        pad = j in st.pads
        for rest, arr in layer_tensors(i):
            if pad and rest.startswith(OUTPUT_PROJECTIONS) and not rest.endswith(".scale"):
                arr = zeros_like(arr)
            out.append((f"blk.{j}.{rest}", arr))
    return out


def stage_path(workdir: Path, source: Path, a: int, b: int, *, shared: bool = False) -> Path:
    """Where a stage file goes: shared, the first file of its split (SourceModel.slice)."""
    return workdir / f"{source.stem}.L{a:03d}-{b:03d}{SPLIT_FIRST if shared else '.gguf'}"
