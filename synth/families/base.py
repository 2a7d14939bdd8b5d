"""The Family base: how a family module declares what it is, which knobs it honours, and its GGUF.

A family module subclasses Family, sets the class attributes, and implements `build` (keys + tensors) and,
where it has constraints beyond the generic ones, `check`. Keys and tensor names come from gguf-py's
constants (gguf.Keys, gguf.MODEL_TENSOR) so a typo is an AttributeError, not a file llama.cpp rejects.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar

import gguf
import numpy as np

from synth.dtype import check_dtype, check_rows, convert
from synth.errors import UserError
from synth.gguf_io import KV, VT
from synth.spec import ATTN, BOTH, FLAG, REC, SPEC_KEY, Knobs, ModelSpec, parse_pattern, periodic_pattern
from synth.tokenizer import WIDE_VOCAB, tokenizer_kv
from synth.weights import Init, make_tensor

K = gguf.Keys.LLM
KA = gguf.Keys.Attention
T = gguf.MODEL_TENSOR

BASE_KNOBS = frozenset({"layers", "embd", "heads", "ff", "vocab"})
PATTERN_KNOBS = frozenset({"period", "offset", "pattern"})
MOE_KNOBS = frozenset({"experts", "experts_used"})

OUTPUT_GAIN = 3.0  # std of logits ≈ OUTPUT_GAIN: clear top-1/top-2 margins over a tiny vocab


class Family:
    name: ClassVar[str]  # CLI name, e.g. "falcon-h1"
    arch: ClassVar[gguf.MODEL_ARCH]
    kind: ClassVar[str]  # "dense" | "recurrent" | "hybrid"
    summary: ClassVar[str] = ""
    knobs: ClassVar[frozenset[str]] = BASE_KNOBS
    per_layer_kv: ClassVar[bool] = False  # honours a per-layer head_count_kv (uneven K/V widths)
    parallel_hybrid: ClassVar[bool] = False  # every layer is attention + recurrent (falcon-h1)
    # defaults for the resolved spec
    n_layer: ClassVar[int] = 4
    n_embd: ClassVar[int] = 32
    n_head: ClassVar[int] = 4
    n_head_kv: ClassVar[int] = 2
    head_dim: ClassVar[int | None] = None  # None: n_embd // n_head
    n_ff: ClassVar[int] = 64
    n_vocab: ClassVar[int] = 64
    period: ClassVar[int] = 4  # hybrids: default attention period
    n_expert: ClassVar[int] = 0
    n_expert_used: ClassVar[int] = 0
    # RoPE over the head: "full" (the whole head dim, which must then be even: ggml's CPU rope aborts on an odd
    # width), "partial" (the family checks its own rotary width) or None (no RoPE). Head dims below 2 abort
    # every attention arch when the context is created (ggml_can_mul_mat).
    rope: ClassVar[str | None] = "full"
    # Why K/V heads always equal the query heads for this arch (then --kv-heads is refused with this reason).
    mha_only: ClassVar[str | None] = None
    n_expert_shared: ClassVar[int] = 0
    n_leading_dense: ClassVar[int] = 0
    q_lora_rank: ClassVar[int] = 0
    kv_lora_rank: ClassVar[int] = 0
    indexer: ClassVar[bool] = False
    indexer_top_k: ClassVar[int] = 0
    sliding_window: ClassVar[int] = 0
    # Stage contract: why this arch cannot take hidden states through batch.embd at all (then no stage but
    # the first can run, and the sweep's control run is unsupported), with the llama.cpp source reference.
    embd_input: ClassVar[str | None] = None
    # Stage contract: (default period, dense_first) if this arch reads its sliding-window layer pattern
    # through llama.cpp's load_swa_pattern (an explicit per-layer array overrides the index rule), so a stage
    # can keep each layer's kind. None: no SWA, or a rule a stage cannot re-express.
    swa_pattern: ClassVar[tuple[int, bool] | None] = None
    # Stage contract (layer-0 trap): the graph sizes every full-attention layer's RoPE from layer 0, so a stage
    # must start on a full (non-SWA) layer; the slicer prepends a pass-through full layer when it would not.
    stage_starts_full: ClassVar[bool] = False
    # Stage contract: why a stage after the first cannot take the residual (an input transform llama.cpp would
    # apply to it again), with the source reference. See stage_refusal for rules that depend on the cut.
    stage_input: ClassVar[str | None] = None
    # Input embeddings are scaled by sqrt(n_embd) for token input only (gemma3/3n/4): a control run that feeds
    # token_embd rows through batch.embd must pre-scale them to equal token input.
    token_scale: ClassVar[bool] = False
    # Stage contract: the graph derives a layer's kind from (layer index % P) with no GGUF override; a stage
    # starting at a gets (a % P) pass-through pads in front so every layer keeps its phase.
    layer_phase: ClassVar[int | None] = None

    def embd_refusal(self, g: Any) -> str | None:
        """Why the model in GGUF g cannot take batch.embd at all (most families: the class attribute)."""
        return self.embd_input

    def swa_layers(self, g: Any, n: int) -> list[bool] | None:
        """Which of the n layers of the model in GGUF g slide, for an arch whose rule is not swa_pattern's index
        rule (then a stage writes them as a per-layer array); None: no rule a stage can re-express."""
        return None

    def stage_missing(self, g: Any, layers: list[int]) -> tuple[list[int], str] | None:
        """Stage contract: a layer kind llama.cpp cannot run a stage of source layers `layers` (of the model in GGUF
        g) without, if the stage lacks it: (the model's layers of that kind, why); the slicer appends a pass-through
        copy of one (output projections zeroed). None: nothing missing (most families)."""
        return None

    def stage_refusal(self, g: Any, a: int, b: int) -> str | None:
        """Why the stage [a, b) of the model in GGUF g cannot compute the same function, or None."""
        return self.stage_input if a > 0 else None

    @property
    def arch_name(self) -> str:
        return gguf.MODEL_ARCH_NAMES[self.arch]

    # ---- knob resolution -------------------------------------------------------------------------
    def natural_offset(self, period: int) -> int:
        """Where the attention layer sits inside each period by default (the family's real phase)."""
        return period - 1

    def supported_flags(self) -> str:
        return " ".join(FLAG[k] for k in FLAG if k in self.knobs) or "(none)"

    def rope_kind(self, spec: ModelSpec) -> str | None:
        """The RoPE kind for this spec (most families: the class attribute)."""
        return self.rope

    def reject(self, knob: str, why: str) -> UserError:
        return UserError(f"family {self.name}: {FLAG.get(knob, knob)} {why}; "
                         f"it supports: {self.supported_flags()}")

    def resolve(self, knobs: Knobs) -> ModelSpec:
        for k in knobs.given():
            if k == "dtype":
                continue  # every family: synth/dtype.py decides tensor by tensor
            if k == "kv_heads" and self.mha_only:
                raise self.reject(k, f"is not something this family can express ({self.mha_only})")
            if k not in self.knobs:
                raise self.reject(k, "is not something this family can express")
        pattern = self._pattern(knobs)
        n_embd = _positive(knobs.embd, self.n_embd, "--embd")
        n_head = _positive(knobs.heads, self.n_head, "--heads")
        head_dim = knobs.head_dim or self.head_dim or n_embd // n_head
        if knobs.head_dim is None and self.head_dim is None and n_embd % n_head:
            raise UserError(f"family {self.name}: --embd {n_embd} is not a multiple of --heads {n_head}")
        kv = self._kv_heads(knobs, pattern, n_head)
        n_expert = knobs.experts if knobs.experts is not None else self.n_expert
        n_used = knobs.experts_used if knobs.experts_used is not None else \
            (min(self.n_expert_used or 2, n_expert) if n_expert else 0)
        if n_expert and not 0 < n_used <= n_expert:
            raise UserError(f"family {self.name}: --experts-used {n_used} must be in 1..--experts {n_expert}")
        spec = ModelSpec(
            family=self.name, pattern=pattern, n_embd=n_embd, n_head=n_head, n_head_kv=kv,
            head_dim=head_dim, n_ff=_positive(knobs.ff, self.n_ff, "--ff"),
            n_vocab=_positive(knobs.vocab, self.n_vocab, "--vocab"),
            n_expert=n_expert, n_expert_used=n_used,
            n_expert_shared=_given(knobs.shared_experts, self.n_expert_shared),
            n_leading_dense=_given(knobs.leading_dense, self.n_leading_dense),
            q_lora_rank=_given(knobs.q_lora_rank, self.q_lora_rank),
            kv_lora_rank=_given(knobs.kv_lora_rank, self.kv_lora_rank),
            indexer=bool(_given(knobs.indexer, self.indexer)),
            indexer_top_k=_given(knobs.indexer_top_k, self.indexer_top_k),
            sliding_window=_given(knobs.sliding_window, self.sliding_window), seed=knobs.seed,
            dtype=check_dtype(knobs.dtype or "f32"),
        )
        check_rows(spec.dtype, spec.n_embd)
        if spec.n_vocab < 4:
            raise UserError(f"family {self.name}: --vocab {spec.n_vocab} is too small; use at least 4")
        self._check_head_dim(spec)
        spec = replace(spec, extra=self.derive(spec))
        self.check(spec)
        return spec

    def _check_head_dim(self, spec: ModelSpec) -> None:
        if not any(c in (ATTN, BOTH) for c in spec.pattern):
            return
        D, rope = spec.head_dim, self.rope_kind(spec)
        if D >= 2 and not (rope == "full" and D % 2):
            return
        need = "even (RoPE rotates pairs of dims; ggml's CPU rope aborts on an odd width)" if D >= 2 \
            else "at least 2 (llama.cpp aborts creating the context)"
        src = f"--head-dim {D}" if D != spec.n_embd // max(spec.n_head, 1) \
            else f"--embd {spec.n_embd} / --heads {spec.n_head}"
        raise UserError(f"family {self.name}: head dim {D} ({src}) must be {need}; use e.g. --embd 32 --heads 4")

    def _pattern(self, knobs: Knobs) -> str:
        if self.kind == "dense":
            # a per-layer --kv-heads list is one entry per layer
            listed = len(knobs.kv_heads) if knobs.kv_heads is not None and len(knobs.kv_heads) > 1 else None
            return ATTN * _positive(knobs.layers if knobs.layers is not None else listed, self.n_layer, "--layers")
        if self.kind == "recurrent":
            return REC * _positive(knobs.layers, self.n_layer, "--layers")
        if self.parallel_hybrid:
            return BOTH * _positive(knobs.layers, self.n_layer, "--layers")
        if knobs.pattern is not None:
            if knobs.period is not None or knobs.offset is not None:
                raise UserError(f"family {self.name}: give either --pattern or --period/--offset, not both")
            pattern = parse_pattern(knobs.pattern)
            if knobs.layers is not None and knobs.layers != len(pattern):
                raise UserError(f"family {self.name}: --pattern has {len(pattern)} layers "
                                f"but --layers is {knobs.layers}")
        elif knobs.period is None and knobs.offset is None and knobs.kv_heads is not None \
                and len(knobs.kv_heads) > 1 and self.per_layer_kv:
            # a per-layer --kv-heads list with zeros is itself the pattern (0 = recurrent layer)
            pattern = "".join(ATTN if h else REC for h in knobs.kv_heads)
            if knobs.layers is not None and knobs.layers != len(pattern):
                raise UserError(f"family {self.name}: --kv-heads has {len(pattern)} entries "
                                f"but --layers is {knobs.layers}")
        else:
            n_layer = _positive(knobs.layers, self.n_layer, "--layers")
            period = _positive(knobs.period, self.period, "--period")
            offset = knobs.offset if knobs.offset is not None else self.natural_offset(period)
            if not 0 <= offset < period:
                raise UserError(f"family {self.name}: --offset {offset} must be in 0..{period - 1} "
                                f"(--period {period})")
            pattern = periodic_pattern(n_layer, period, offset)
        if ATTN not in pattern or REC not in pattern:
            raise UserError(f"family {self.name}: pattern {pattern} needs at least one attention (A) and one "
                            "recurrent (R) layer; llama.cpp aborts on a hybrid with an empty KV or state cache")
        return pattern

    def _kv_heads(self, knobs: Knobs, pattern: str, n_head: int) -> tuple[int, ...]:
        attn = [c in (ATTN, BOTH) for c in pattern]
        if knobs.kv_heads is None:
            vals = [(n_head if self.mha_only else self.n_head_kv) if a else 0 for a in attn]
        elif len(knobs.kv_heads) == 1:
            vals = [knobs.kv_heads[0] if a else 0 for a in attn]
        else:
            if len(knobs.kv_heads) != len(pattern):
                raise UserError(f"family {self.name}: --kv-heads has {len(knobs.kv_heads)} entries "
                                f"for {len(pattern)} layers")
            vals = list(knobs.kv_heads)
            for i, (a, h) in enumerate(zip(attn, vals, strict=True)):
                if a and h == 0 or not a and h != 0:
                    raise UserError(f"family {self.name}: --kv-heads[{i}]={h} disagrees with layer {i} being "
                                    f"{'attention' if a else 'recurrent'} (0 marks recurrent layers)")
        distinct = {h for h, a in zip(vals, attn, strict=True) if a}
        if len(distinct) > 1 and not self.per_layer_kv:
            raise self.reject("kv_heads", f"{','.join(map(str, vals))} varies across layers, but llama.cpp "
                              "sizes every layer of this arch from layer 0 (one value only)")
        for h in distinct:
            if h <= 0 or n_head % h:
                raise UserError(f"family {self.name}: --kv-heads {h} must divide --heads {n_head}")
        return tuple(vals)

    # ---- family hooks ----------------------------------------------------------------------------
    def derive(self, spec: ModelSpec) -> dict[str, int]:
        """Family-specific dims (SSM sizes, ranks, ...) computed from the spec."""
        return {}

    def check(self, spec: ModelSpec) -> None:
        """Raise UserError for a spec this arch cannot load or run."""

    def build(self, spec: ModelSpec, b: Builder) -> None:
        raise NotImplementedError

    # ---- writing ---------------------------------------------------------------------------------
    def to_gguf(self, spec: ModelSpec) -> tuple[dict[str, KV], list[tuple[str, np.ndarray]]]:
        b = Builder(self.arch_name, spec)
        b.u32(K.CONTEXT_LENGTH, spec.n_ctx_train)
        b.u32(K.EMBEDDING_LENGTH, spec.n_embd)
        b.u32(K.BLOCK_COUNT, spec.n_layer)
        b.u32(K.VOCAB_SIZE, spec.n_vocab)
        self.build(spec, b)
        b.kv.update(tokenizer_kv(spec.n_vocab))
        b.kv[SPEC_KEY] = KV(spec.to_json(), VT.STRING)
        tensors = [(name, convert(name, make_tensor(spec.seed, name, ne, init), table_dtype(name, spec), spec.seed))
                   for name, ne, init in b.tensors]
        return b.kv, tensors


def table_dtype(name: str, spec: ModelSpec) -> str:
    """The weight type a tensor is written in: the spec's, but a vocabulary past 16 bits keeps its embedding table
    in f16 (n_vocab rows: the table is most of the file)."""
    if spec.n_vocab > WIDE_VOCAB and spec.dtype == "f32" and name == f"{gguf.TENSOR_NAMES[T.TOKEN_EMBD]}.weight":
        return "f16"
    return spec.dtype


class Builder:
    """Collects one fixture's metadata keys and tensor declarations, in order."""

    def __init__(self, arch: str, spec: ModelSpec):
        self.arch = arch
        self.spec = spec
        self.kv: dict[str, KV] = {}
        self.tensors: list[tuple[str, tuple[int, ...], Init]] = []

    def key(self, template: str) -> str:
        return template.format(arch=self.arch)

    def u32(self, template: str, v: int) -> None:
        self.kv[self.key(template)] = KV(int(v), VT.UINT32)

    def f32(self, template: str, v: float) -> None:
        self.kv[self.key(template)] = KV(float(v), VT.FLOAT32)

    def flag(self, template: str, v: bool) -> None:
        self.kv[self.key(template)] = KV(bool(v), VT.BOOL)

    def u32s(self, template: str, values: list[int] | tuple[int, ...]) -> None:
        self.kv[self.key(template)] = KV([int(x) for x in values], VT.ARRAY, VT.UINT32)

    def i32s(self, template: str, values: list[int] | tuple[int, ...]) -> None:
        self.kv[self.key(template)] = KV([int(x) for x in values], VT.ARRAY, VT.INT32)

    def bools(self, template: str, values: list[bool]) -> None:
        self.kv[self.key(template)] = KV([bool(x) for x in values], VT.ARRAY, VT.BOOL)

    def t(self, tensor: gguf.MODEL_TENSOR, ne: tuple[int, ...], init: Init | None = None, *,
          bid: int | None = None, suffix: str | None = "weight") -> None:
        """Declare a tensor; init defaults to a linear layer scaled by its fan-in (ne[0])."""
        name = gguf.TENSOR_NAMES[tensor].format(bid=bid)
        if suffix:
            name += "." + suffix
        self.tensors.append((name, tuple(int(x) for x in ne), init or Init.std(ne[0] ** -0.5)))


def _given(v, default):
    """The user's value when given (0 included), else the family default."""
    return default if v is None else v


def _positive(v: int | None, default: int, flag: str) -> int:
    v = default if v is None else v
    if v <= 0:
        raise UserError(f"{flag} {v}: must be a positive integer")
    return v
