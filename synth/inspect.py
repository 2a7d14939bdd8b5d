"""What a GGUF file says about its layers, read from the file alone (ours or a real model).

Per layer: kind (attention / recurrent / both / mlp), mixer, heads, K/V widths and KV-cache row bytes,
FFN kind, indexer. The file-level recurrent/hybrid flags follow llama.cpp's own rule, which is by arch
(llm_arch_is_recurrent / llm_arch_is_hybrid in src/llama-arch.cpp of the pinned b11312).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from synth.errors import UserError
from synth.gguf_io import GGUFFile
from synth.spec import STAGE_KEYS

# Mirrors of the pinned llama.cpp's arch lists (src/llama-arch.cpp). Re-check when the pin moves.
RECURRENT_ARCHS = frozenset({"mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"})
HYBRID_ARCHS = frozenset({
    "jamba", "falcon-h1", "plamo2", "granitehybrid", "lfm2", "lfm2moe", "nemotron_h", "nemotron_h_moe",
    "qwen3next", "kimi-linear", "bailingmoe3", "kimi-k3", "glm5-next", "qwen35", "qwen35moe", "qwen4exp",
    "deepseek4", "minimax-01",
})
PARALLEL_ARCHS = frozenset({"falcon-h1"})  # every layer has attention and SSM
# archs whose attention layers follow full_attention_interval when no per-layer array is present
INTERVAL_ARCHS = frozenset({"qwen3next", "qwen35", "qwen35moe", "qwen4exp", "minimax-01"})
DEFAULT_INTERVAL = 4

KV_CACHE_BYTES = 2  # llama.cpp's default cache type is f16
# Layers from n_layer_kv_from_start on read an earlier layer's KV instead of owning one (llama_hparams::has_kv):
# gemma4 reads attention.shared_kv_layers (gemma4.cpp:9-11); gemma3n hard-codes 20 (gemma3n.cpp:7).
KV_FROM_START_FIXED = {"gemma3n": 20}
KV_SHARING_KEY_ARCHS = frozenset({"gemma4", "gemma4-assistant"})

_BLK = re.compile(r"^blk\.(\d+)\.(.+)$")
MAX_LAYERS = 4096  # a bound for garbage block counts; real models have a few hundred at most
_REC_MARKERS = ("ssm_", "time_mix_", "shortconv.")
_ATTN_MARKERS = ("attn_q.", "attn_k.", "attn_v.", "attn_qkv.", "attn_kv_a_mqa.", "attn_q_a.", "attn_kv.")


@dataclass
class LayerInfo:
    index: int
    kind: str  # attention | recurrent | both | mlp
    mixer: str  # attention | mla | mamba | mamba2 | gated-deltanet | kda | shortconv | rwkv6 | rwkv7 | ...
    n_head: int
    n_head_kv: int
    head_dim_k: int
    head_dim_v: int
    k_width: int  # KV-cache K elements per token (0 on recurrent-only layers)
    v_width: int
    k_row_bytes: int  # at the default f16 cache type
    v_row_bytes: int  # 0 on MLA layers: llama.cpp keeps no V cache there (has_v = !is_mla)
    v_row_bytes_padded: int  # with flash attention off the transposed V cache pads every layer to the widest
    indexer_row_bytes: int  # DSA indexer key cache row (k_idx), on layers that own an indexer
    swa: bool  # attends through a sliding window (its KV lives in llama.cpp's separate SWA cache)
    owns_kv: bool  # False: reads an earlier layer's KV cache (gemma3n/gemma4 KV sharing); its rows are 0
    ffn: str  # dense | moe | none
    n_expert: int
    indexer: bool
    n_tensors: int


@dataclass
class ModelInfo:
    path: str
    arch: str
    n_layer: int
    n_embd: int
    n_vocab: int
    is_recurrent: bool
    is_hybrid: bool
    file_bytes: int
    n_tensors: int
    layers: list[LayerInfo]
    spec: str | None  # the synth spec JSON if this is one of our fixtures
    stage: dict[str, Any] | None = None  # for a stage file: source layers, range, pass-through pads
    tensor_types: dict[str, int] = field(default_factory=dict)  # GGML type → number of tensors

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def source_swa_layers(g: GGUFFile, n: int) -> list[bool] | None:
    """Which layers use the sliding window, by llama.cpp's load_swa_pattern rule for this arch (an explicit
    per-layer array, else the family's period rule); None if the arch has no such rule."""
    from synth.families import family_for_arch  # inspect reads any file; families only add arch rules

    value = g.get("attention.sliding_window_pattern")
    if isinstance(value, list) and len(value) == n:
        return [bool(v) for v in value]
    fam = family_for_arch(g.arch)
    if fam is not None and fam.swa_pattern is None:
        return fam.swa_layers(g, n)
    if fam is None:
        return None
    period, dense_first = fam.swa_pattern
    period = int(value) if value is not None else period
    if dense_first:
        return [period == 0 or i % period != 0 for i in range(n)]
    return [period == 0 or i % period < period - 1 for i in range(n)]


def per_layer(value: Any, n: int, default: int = 0) -> list[int]:
    if value is None:
        return [default] * n
    if isinstance(value, list):
        return [int(v) for v in value] + [default] * (n - len(value))
    return [int(value)] * n


def inspect_file(path: str) -> ModelInfo:
    return inspect_gguf(GGUFFile(path))


def inspect_gguf(g: GGUFFile) -> ModelInfo:
    arch = g.arch
    n_layer = int(g.get("block_count", 0))
    if not 0 <= n_layer <= MAX_LAYERS:
        raise UserError(f"{g.path}: {arch}.block_count = {n_layer} is not a layer count (0..{MAX_LAYERS}); "
                        "regenerate the file or check the download")
    n_embd = int(g.get("embedding_length", 0))
    tokens = g.get("tokenizer.ggml.tokens")
    n_vocab = len(tokens) if isinstance(tokens, list) else int(g.get("vocab_size", 0))

    by_layer: dict[int, list[str]] = {i: [] for i in range(n_layer)}
    for name in g.tensors:
        m = _BLK.match(name)
        if m and int(m.group(1)) in by_layer:
            by_layer[int(m.group(1))].append(m.group(2))

    n_head = per_layer(g.get("attention.head_count"), n_layer)
    n_head_kv_raw = g.get("attention.head_count_kv")
    n_head_kv = per_layer(n_head_kv_raw, n_layer, default=0) if n_head_kv_raw is not None else list(n_head)
    kinds = _layer_kinds(g, arch, n_layer, by_layer, n_head_kv_raw)

    mla = g.get("attention.key_length_mla") is not None
    h0 = n_head[0] if n_head and n_head[0] else 0
    dk = int(g.get("attention.key_length", n_embd // h0 if h0 else 0))
    dv = int(g.get("attention.value_length", n_embd // h0 if h0 else 0))
    n_expert = int(g.get("expert_count", 0) or 0)
    idx_dim = int(g.get("attention.indexer.key_length", 0) or 0)
    swa = source_swa_layers(g, n_layer) if int(g.get("attention.sliding_window", 0) or 0) > 0 else None
    dk_swa = int(g.get("attention.key_length_swa", dk) or dk)  # n_embd_head_k(il): SWA layers' own head dims
    dv_swa = int(g.get("attention.value_length_swa", dv) or dv)
    kv_from = KV_FROM_START_FIXED.get(arch, n_layer)
    if arch in KV_SHARING_KEY_ARCHS:
        kv_from = n_layer - int(g.get("attention.shared_kv_layers", 0) or 0)

    layers = []
    for i in range(n_layer):
        names = by_layer[i]
        kind = kinds[i]
        has_attn = kind in ("attention", "both")
        kv = n_head_kv[i] if has_attn else 0
        if has_attn and kv == 0:  # e.g. falcon-h1 writes a scalar; MLA caches one latent head
            kv = 1 if mla else n_head[i]
        is_swa = bool(swa and swa[i] and has_attn)
        dki, dvi = (dk_swa, dv_swa) if is_swa else (dk, dv)
        owns = has_attn and i < kv_from
        kw, vw = (dki * kv, 0 if mla else dvi * kv) if owns else (0, 0)
        moe = any(n.startswith(("ffn_gate_inp.", "ffn_up_exps.", "ffn_gate_up_exps.", "ffn_down_exps."))
                  for n in names)
        dense = any(n.startswith(("ffn_up.", "ffn_down.", "channel_mix_key.")) for n in names)
        layers.append(LayerInfo(
            index=i, kind=kind, mixer=_mixer(kind, names, mla), n_head=n_head[i], n_head_kv=kv,
            head_dim_k=dki if has_attn else 0, head_dim_v=dvi if has_attn else 0,
            k_width=kw, v_width=vw, k_row_bytes=kw * KV_CACHE_BYTES, v_row_bytes=vw * KV_CACHE_BYTES,
            v_row_bytes_padded=0, indexer_row_bytes=0, swa=is_swa, owns_kv=owns,
            ffn="moe" if moe else "dense" if dense else "none", n_expert=n_expert if moe else 0,
            indexer=any(n.startswith("indexer.") for n in names), n_tensors=len(names),
        ))
    v_max = max((x.v_row_bytes for x in layers), default=0)
    for x in layers:
        if x.v_row_bytes:
            x.v_row_bytes_padded = v_max
        if x.indexer:
            x.indexer_row_bytes = idx_dim * KV_CACHE_BYTES
    spec = g.kv.get("family_certify.spec")
    stage = None
    if f"{STAGE_KEYS}.source_layers" in g.kv:
        stage = {k: g.kv.get(f"{STAGE_KEYS}.{k}") for k in ("range", "source_layers", "n_layer_source")}
        stage["pad_layers"] = g.kv.get(f"{STAGE_KEYS}.pad_layers", [])
    return ModelInfo(
        path=str(g.path), arch=arch, n_layer=n_layer, n_embd=n_embd, n_vocab=n_vocab,
        is_recurrent=arch in RECURRENT_ARCHS, is_hybrid=arch in HYBRID_ARCHS,
        file_bytes=g.path.stat().st_size, n_tensors=len(g.tensors), layers=layers,
        spec=spec if isinstance(spec, str) else None, stage=stage,
        tensor_types=dict(sorted(Counter(t.type for t in g.tensors.values()).items())),
    )


def _layer_kinds(g: GGUFFile, arch: str, n: int, by_layer: dict[int, list[str]], kv_raw: Any) -> list[str]:
    def has(i: int, prefixes: tuple[str, ...]) -> bool:
        return any(t.startswith(p) for t in by_layer[i] for p in prefixes)

    def not_recurrent(i: int) -> str:
        return "attention" if has(i, _ATTN_MARKERS) or not has(i, ("ffn_",)) else "mlp"

    if arch in RECURRENT_ARCHS:
        return ["recurrent"] * n
    if arch in PARALLEL_ARCHS:
        return ["both"] * n
    rec_layers = g.get("attention.recurrent_layers")
    if isinstance(rec_layers, list) and len(rec_layers) == n:
        return ["recurrent" if r else not_recurrent(i) for i, r in enumerate(rec_layers)]
    if arch in INTERVAL_ARCHS:
        interval = int(g.get("full_attention_interval", DEFAULT_INTERVAL))
        return ["attention" if (i + 1) % interval == 0 else "recurrent" for i in range(n)]
    if arch in HYBRID_ARCHS and isinstance(kv_raw, list):
        return ["recurrent" if kv == 0 and has(i, _REC_MARKERS) else
                not_recurrent(i) for i, kv in enumerate(per_layer(kv_raw, n))]
    return ["recurrent" if has(i, _REC_MARKERS) else not_recurrent(i) for i in range(n)]


def _mixer(kind: str, names: list[str], mla: bool) -> str:
    def has(p: str) -> bool:
        return any(t.startswith(p) for t in names)

    if kind in ("attention", "mlp"):
        return "mla" if kind == "attention" and (mla or has("attn_kv_a_mqa.")) else kind
    if has("time_mix_w0."):
        return "rwkv7"
    if has("time_mix_"):
        return "rwkv6"
    if has("shortconv."):
        return "shortconv"
    if has("ssm_f_a."):
        return "kda"
    if has("ssm_ba.") or has("ssm_alpha.") or has("ssm_beta."):
        return "gated-deltanet"
    if has("ssm_x."):
        return "mamba"
    if has("ssm_in."):
        return "mamba2"
    return "recurrent"


def format_table(info: ModelInfo) -> str:
    lines = [f"{info.path}: arch {info.arch}, {info.n_layer} layers, n_embd {info.n_embd}, vocab {info.n_vocab}, "
             f"{info.file_bytes} bytes, recurrent={info.is_recurrent} hybrid={info.is_hybrid}",
             "tensor types: " + ", ".join(f"{k} ×{v}" for k, v in info.tensor_types.items()),
             *([f"stage: source layers {info.stage['range'][0]}:{info.stage['range'][1]} of "
                f"{info.stage['n_layer_source']}; its layers hold source layers {info.stage['source_layers']}; "
                f"pass-through pads at stage layers {info.stage['pad_layers'] or 'none'}"] if info.stage else []),
             f"{'layer':>5}  {'kind':<9} {'mixer':<14} {'heads':>5} {'kv':>3} {'k_dim':>5} {'v_dim':>5} "
             f"{'k_row_B':>7} {'v_row_B':>7}  {'ffn':<5} indexer(row_B)"]
    for x in info.layers:
        ffn = f"moe{x.n_expert}" if x.ffn == "moe" else x.ffn
        lines.append(f"{x.index:>5}  {x.kind:<9} {x.mixer:<14} {x.n_head:>5} {x.n_head_kv:>3} {x.head_dim_k:>5} "
                     f"{x.head_dim_v:>5} {x.k_row_bytes:>7} {x.v_row_bytes:>7}  {ffn:<5} "
                     f"{f'yes({x.indexer_row_bytes})' if x.indexer else '-'}")
    return "\n".join(lines)
