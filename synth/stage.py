"""Stage materialization: a GGUF holding layers [a, b) of a model, that the pinned llama.cpp loads and that
computes the same function as those layers of the full model.

What the naive slice (copy metadata, renumber blk.i) gets wrong is exactly the set of *stage contracts* a split
runtime must honour (../shared/reference/stage-slicing-baseline.md). This module handles the ones llama.cpp can
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
  a hard-coded embedding scale) — see `stage_input_contract`.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from synth.errors import UserError
from synth.gguf_io import KV, VT, GGUFFile, read_all, write_gguf
from synth.inspect import HYBRID_ARCHS, INTERVAL_ARCHS, PARALLEL_ARCHS, ModelInfo, inspect_gguf
from synth.spec import SPEC_KEY

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

STAGE_KEYS = "family_certify.stage"  # prefix of the provenance keys a stage carries

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


def embd_input_contract(arch: str) -> str | None:
    """Why this arch cannot take batch.embd at all (declared by its family module), or None."""
    from synth.families import family_for_arch  # stage.py is imported by families' users, not vice versa

    fam = family_for_arch(arch)
    return fam.embd_input if fam else None


def source_swa_layers(g: GGUFFile, n: int) -> list[bool] | None:
    """Which source layers use the sliding window, by llama.cpp's load_swa_pattern rule for this arch."""
    from synth.families import family_for_arch

    value = g.get("attention.sliding_window_pattern")
    if isinstance(value, list) and len(value) == n:
        return [bool(v) for v in value]
    fam = family_for_arch(g.arch)
    if fam is None or fam.swa_pattern is None:
        return None
    period, dense_first = fam.swa_pattern
    period = int(value) if value is not None else period
    if dense_first:
        return [period == 0 or i % period != 0 for i in range(n)]
    return [period == 0 or i % period < period - 1 for i in range(n)]


def stage_input_contract(g: GGUFFile) -> str | None:
    """Why a stage that does not start at layer 0 cannot take the residual as input, or None if it can.

    llama.cpp applies some input transforms to batch.embd exactly as to token embeddings, so a stage fed the
    residual would apply them twice.
    """
    why = embd_input_contract(g.arch)
    if why:
        return why
    if "token_embd_norm.weight" in g.tensors and g.arch != "lfm2":  # lfm2 stores its *final* norm there
        return "input LayerNorm (token_embd_norm) would be applied to the residual again; llama.cpp has no " \
               "switch to skip it for embedding input"
    return None


def plan_stage(g: GGUFFile, info: ModelInfo, a: int, b: int) -> StageInfo:
    """Which source layers a stage [a, b) holds, including any pass-through pads it needs."""
    from synth.families import family_for_arch

    n = info.n_layer
    layers = list(range(a, b))
    st = StageInfo(source=str(g.path), first=a, last=b, n_layer_source=n, layers=layers)
    if g.arch in HYBRID_ARCHS and g.arch not in PARALLEL_ARCHS:
        kinds = [info.layers[i].kind for i in layers]
        for want, why in (("attention", "no attention layer (zero-size KV cache)"),
                          ("recurrent", "no recurrent layer (zero-size state cache)")):
            if want in kinds:
                continue
            donors = [i for i in range(n) if info.layers[i].kind == want]
            if not donors:
                raise Unsupported(f"stage {a}:{b} has {why} and the model has no {want} layer to pad with")
            donor = _pick_donor(g, donors, layers)
            st.layers.append(donor)
            st.pads.append(len(st.layers) - 1)
            st.notes.append(f"stage {a}:{b} has {why}: appended a pass-through copy of layer {donor} "
                            "(output projections zeroed)")
    fam = family_for_arch(g.arch)
    if fam is not None and fam.stage_starts_full and int(g.get("attention.sliding_window", 0) or 0) > 0:
        is_swa = source_swa_layers(g, n)
        if is_swa is not None and is_swa[a]:
            lead = int(g.get("leading_dense_block_count", 0) or 0)
            donors = [i for i in range(n) if not is_swa[i] and (i < lead or a >= lead)]
            if not donors:
                raise Unsupported(f"stage {a}:{b} starts on a sliding-window layer and the model has no full layer "
                                  "to prepend (the graph sizes RoPE from layer 0)")
            st.layers.insert(0, donors[0])
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


class SourceModel:
    """A model read once, to cut many stages from."""

    def __init__(self, path: str | os.PathLike):
        self.g, self.kv, self.tensors = read_all(path)
        self.info = inspect_gguf(self.g)

    def slice(self, dst: str | os.PathLike, a: int, b: int) -> StageInfo:
        """Write the stage [a, b) to dst. Raises Unsupported for a stage llama.cpp cannot express."""
        g = self.g
        n = self.info.n_layer
        if not 0 <= a < b <= n:
            raise UserError(f"layers {a}:{b} out of range for {g.path} ({n} layers)")
        if a > 0:
            why = stage_input_contract(g)
            if why:
                raise Unsupported(why)
        st = plan_stage(g, self.info, a, b)
        new_kv = _stage_metadata(g, self.kv, st)
        new_tensors = _stage_tensors(self.tensors, st, neutralize_positions=a > 0)
        write_gguf(dst, g.arch, new_kv, new_tensors)
        return st


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
    # asserts that a stage's layer 0 is full
    types = out.get(f"{arch}.attention.indexer.types")
    if types is not None and isinstance(types.value, list) and types.value and not types.value[0]:
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
        stage_swa = [is_swa[i] for i in src]
        if any(stage_swa):
            out[swa_key] = KV(stage_swa, VT.ARRAY, VT.BOOL)
        else:  # llama.cpp asserts is_swa_any() when a window is set; these layers are full attention anyway
            out.pop(f"{arch}.attention.sliding_window", None)
            out.pop(swa_key, None)

    out[f"{STAGE_KEYS}.source_layers"] = KV(list(src), VT.ARRAY, VT.INT32)
    out[f"{STAGE_KEYS}.range"] = KV([st.first, st.last], VT.ARRAY, VT.INT32)
    out[f"{STAGE_KEYS}.n_layer_source"] = KV(n, VT.UINT32)
    if st.pads:
        out[f"{STAGE_KEYS}.pad_layers"] = KV(list(st.pads), VT.ARRAY, VT.INT32)
    return out


def _stage_tensors(tensors: list[tuple[str, np.ndarray]], st: StageInfo, *,
                   neutralize_positions: bool) -> list[tuple[str, np.ndarray]]:
    by_layer: dict[int, list[tuple[str, np.ndarray]]] = {}
    globals_: list[tuple[str, np.ndarray]] = []
    for name, arr in tensors:
        m = _BLK.match(name)
        if m:
            by_layer.setdefault(int(m.group(1)), []).append((m.group(2), arr))
        elif neutralize_positions and name == "position_embd.weight":
            # the residual already carries the positions: adding them again would double them
            globals_.append((name, np.zeros_like(arr)))
        else:
            globals_.append((name, arr))
    out = list(globals_)
    for j, i in enumerate(st.layers):
        pad = j in st.pads
        for rest, arr in by_layer.get(i, []):
            if pad and rest.startswith(OUTPUT_PROJECTIONS) and not rest.endswith(".scale"):
                arr = np.zeros_like(arr)
            out.append((f"blk.{j}.{rest}", arr))
    return out


def read_stage_info(path: str | os.PathLike) -> dict[str, Any] | None:
    g = GGUFFile(path)
    src = g.kv.get(f"{STAGE_KEYS}.source_layers")
    if src is None:
        return None
    return {"source_layers": src, "range": g.kv.get(f"{STAGE_KEYS}.range"),
            "pad_layers": g.kv.get(f"{STAGE_KEYS}.pad_layers", []),
            "n_layer_source": g.kv.get(f"{STAGE_KEYS}.n_layer_source")}


def stage_path(workdir: Path, source: Path, a: int, b: int) -> Path:
    return workdir / f"{source.stem}.L{a:03d}-{b:03d}.gguf"
