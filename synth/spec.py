"""What a fixture is: the user's knobs (Knobs) and the fully resolved model (ModelSpec)."""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field, fields

from synth.errors import UserError

# Layer kinds, one character per layer in ModelSpec.pattern.
ATTN = "A"  # attention only
REC = "R"  # recurrent only (SSM, linear attention, short conv, RWKV)
BOTH = "B"  # attention and recurrent in parallel (falcon-h1)

SPEC_KEY = "family_certify.spec"  # GGUF metadata key holding the ModelSpec JSON (provenance only)
STAGE_KEYS = "family_certify.stage"  # prefix of the provenance keys a stage file carries (synth/stage.py)


@dataclass(frozen=True)
class Knob:
    """One knob of the one knob table: its name (the Knobs field, the manifest recipe key, the bundle's and the
    CLI's `--name-with-dashes`), what it means, and the ModelSpec field holding its resolved value (a spec's
    fixture is re-made from those: the shrinker); None where the value is not one spec field (the layer pattern
    knobs, the weight type)."""

    name: str
    help: str
    spec_field: str | None = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


KNOBS: tuple[Knob, ...] = (
    Knob("layers", "number of layers"),
    Knob("period", "hybrids: one attention layer per PERIOD layers"),
    Knob("offset", "hybrids: attention at layers i with i % PERIOD == OFFSET"),
    Knob("pattern", "hybrids: explicit layer kinds, e.g. 'RRRA RRRA'"),
    Knob("kv_heads", "K/V heads: one value, or one per layer ('2,0,1,0')"),
    Knob("embd", "embedding width", "n_embd"),
    Knob("heads", "attention heads", "n_head"),
    Knob("head_dim", "attention head dim", "head_dim"),
    Knob("ff", "feed-forward width", "n_ff"),
    Knob("vocab", "vocabulary size", "n_vocab"),
    Knob("experts", "MoE experts", "n_expert"),
    Knob("experts_used", "MoE experts used per token", "n_expert_used"),
    Knob("shared_experts", "MoE shared experts", "n_expert_shared"),
    Knob("leading_dense", "dense layers before the MoE layers", "n_leading_dense"),
    Knob("q_lora_rank", "MLA: compressed q rank (0 = plain attn_q)", "q_lora_rank"),
    Knob("kv_lora_rank", "MLA: latent KV rank", "kv_lora_rank"),
    Knob("indexer", "DSA indexer tensors", "indexer"),
    Knob("indexer_top_k", "DSA indexer top-k", "indexer_top_k"),
    Knob("sliding_window", "sliding-window attention width in tokens (0: no window)", "sliding_window"),
    Knob("dtype", "weight type of the matmul tensors: f32 (default), f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, mxfp4, "
                  "iq4_nl; q2_k … q6_k, iq1_s, iq1_m, iq2_xxs, iq2_xs, iq2_s, iq3_xxs, iq3_s, iq4_xs with --embd 256"),
)
KNOB = {k.name: k for k in KNOBS}
FLAG = {k.name: k.flag for k in KNOBS}  # CLI spelling of each knob, for messages


@dataclass(frozen=True)
class Knobs:
    """What a user asked for; None means 'the family's default'. Family.resolve turns it into a ModelSpec."""

    layers: int | None = None
    period: int | None = None
    offset: int | None = None
    pattern: str | None = None
    kv_heads: tuple[int, ...] | None = None
    embd: int | None = None
    heads: int | None = None
    head_dim: int | None = None
    ff: int | None = None
    vocab: int | None = None
    experts: int | None = None
    experts_used: int | None = None
    shared_experts: int | None = None
    leading_dense: int | None = None
    q_lora_rank: int | None = None
    kv_lora_rank: int | None = None
    indexer: bool | None = None
    indexer_top_k: int | None = None
    sliding_window: int | None = None
    dtype: str | None = None  # weight type of the matmul tensors (synth/dtype.py); default f32
    seed: int = 0

    def given(self) -> dict[str, object]:
        """The knobs the user set (seed excluded: every family takes a seed)."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.name != "seed" and getattr(self, f.name) is not None}


@dataclass(frozen=True)
class ModelSpec:
    """A fully resolved fixture. Same spec → same GGUF bytes."""

    family: str
    pattern: str  # one of A/R/B per layer
    n_embd: int
    n_head: int
    n_head_kv: tuple[int, ...]  # per layer; 0 on recurrent-only layers
    head_dim: int
    n_ff: int
    n_vocab: int = 64
    n_ctx_train: int = 256
    n_expert: int = 0
    n_expert_used: int = 0
    n_expert_shared: int = 0
    n_ff_exp: int = 0
    n_leading_dense: int = 0
    q_lora_rank: int = 0  # MLA: 0 = no compressed q (attn_q)
    kv_lora_rank: int = 0  # MLA latent KV width
    indexer: bool = False
    indexer_top_k: int = 0
    sliding_window: int = 0  # tokens; 0: no sliding-window attention
    seed: int = 0
    extra: dict[str, int] = field(default_factory=dict)  # family-specific dims (SSM state, ranks, ...)
    dtype: str = "f32"  # weight type of the matmul tensors (synth/dtype.py)

    @property
    def n_layer(self) -> int:
        return len(self.pattern)

    def is_attn(self, i: int) -> bool:
        return self.pattern[i] in (ATTN, BOTH)

    def is_rec(self, i: int) -> bool:
        return self.pattern[i] in (REC, BOTH)

    def to_json(self) -> str:
        d = asdict(self)
        d["n_head_kv"] = list(self.n_head_kv)
        if d["dtype"] == "f32":
            del d["dtype"]  # f32 fixtures keep the bytes they had before dtypes existed
        if not d["sliding_window"]:
            del d["sliding_window"]  # and fixtures without a window the bytes they had before the knob
        return json.dumps(d, sort_keys=True, separators=(",", ":"))

    @staticmethod
    def from_json(text: str) -> ModelSpec:
        d = json.loads(text)
        d["n_head_kv"] = tuple(d["n_head_kv"])
        return ModelSpec(**d)


def parse_pattern(text: str) -> str:
    """'RRRA RRRA', 'A R R A', 'a,r,r,a' → 'RRRARRRA'. A = attention, R = recurrent."""
    s = re.sub(r"[\s,|_/-]+", "", text).upper()
    if not s or set(s) - {ATTN, REC}:
        raise UserError(f"--pattern {text!r}: use the letters A (attention) and R (recurrent), e.g. 'RRRA RRRA'")
    return s


def parse_int_list(text: str, what: str) -> tuple[int, ...]:
    try:
        vals = tuple(int(x) for x in re.split(r"[\s,]+", text.strip()) if x)
    except ValueError:
        raise UserError(f"{what} {text!r}: expected comma-separated integers, e.g. '2,0,1,0'") from None
    if not vals or any(v < 0 for v in vals):
        raise UserError(f"{what} {text!r}: expected non-negative integers, e.g. '2,0,1,0'")
    return vals


def periodic_pattern(n_layer: int, period: int, offset: int) -> str:
    """One attention layer per `period`, at layers i with i % period == offset."""
    return "".join(ATTN if i % period == offset else REC for i in range(n_layer))


if {f.name for f in fields(Knobs)} != set(KNOB) | {"seed"}:  # the table and the dataclass are one vocabulary
    raise AssertionError("synth.spec: KNOBS and Knobs disagree")
