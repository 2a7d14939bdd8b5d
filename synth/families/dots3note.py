"""dots3note: rednote dots3-note = DeepSeek-V3.2-style absorbed MLA + MoE, where full-attention layers carry the DSA
lightning indexer (top-k sparse attention) and sliding-window layers run plain MLA with a geometry of their own
(head count, kv_lora_rank_swa, key/value_length_mla_swa), every layer with a head-wise sigmoid output gate
(attn_gate [E, heads]) and an RMS norm on the shared RoPE key (attn_k_norm [rope]). The memory is
llama_kv_cache_dsa_iswa (llama-model.cpp create_memory): the DSA cache (MLA K + indexer keys) for the full layers,
a window-sized cache for the sliding ones.

Every key is read without a default (models/dots3note.cpp load_arch_hparams): the per-layer
`sliding_window_pattern` and `indexer.types` arrays (written as the converter does: indexer on exactly the full
layers), rope.freq_base_swa, the SWA MLA geometry, the expert keys. Layer i is full iff i % 4 == 0 (so layer 0 is
full; the pattern is carried per layer, a stage slices it). A stage needs a layer of each kind: llama.cpp sets
up both caches whatever the layers, and the slicer pads a stage that lacks a sliding one."""

from dataclasses import replace

import gguf

from synth.errors import UserError
from synth.families import _tier1 as t1
from synth.families import blocks
from synth.families.base import KA, K, T
from synth.spec import ModelSpec

SLIDING_WINDOW = 4  # tokens; smaller than a test prompt, so the SWA layers really mask
FULL_PERIOD = 4  # layer i is full attention (with the indexer) iff i % FULL_PERIOD == 0
ROPE_BASE, ROPE_BASE_SWA = 10000.0, 1000.0  # distinct, so a layer given the other kind's RoPE shows


def full_layers(n_layer: int) -> list[bool]:
    return [i % FULL_PERIOD == 0 for i in range(n_layer)]


class Dots3Note(t1.MlaIndexerFamily):
    name = "dots3note"
    arch = gguf.MODEL_ARCH.DOTS3NOTE
    summary = "dots3-note: MLA + DSA indexer on full layers, SWA layers with their own MLA geometry, gated heads"

    def derive(self, spec: ModelSpec) -> dict[str, int]:
        # SWA layers: twice the heads over half the latent rank, a nope part as wide as the full head (same RoPE)
        x = super().derive(spec)
        return x | {"n_head_swa": 2 * spec.n_head, "kv_lora_swa": max(1, spec.kv_lora_rank // 2),
                    "k_mla_swa": x["n_rot"] + spec.head_dim, "v_mla_swa": spec.head_dim}

    def check(self, spec: ModelSpec) -> None:
        if not spec.indexer:
            raise UserError(f"family {self.name}: --no-indexer is not expressible: dots3note's full-attention layers "
                            "always run the indexer (dots3note.cpp graph, `if (!is_swa)`); drop --no-indexer")
        if spec.n_layer < 2:
            raise UserError(f"family {self.name}: --layers {spec.n_layer} leaves no sliding-window layer (layer 0 is "
                            "full) and llama.cpp's iSWA cache needs one; use --layers >= 2")
        t1.check_mla(self, spec, q_lora_required=True)
        t1.check_indexer(self, spec)
        t1.check_moe_lead(self, spec)

    def stage_missing(self, g, layers: list[int]) -> tuple[list[int], str] | None:
        """A stage of sliding-window layers only gets a full one: llama.cpp turns on the (empty) indexer cache's
        Hadamard rotation whatever its layers (llama-kv-cache.cpp:326-329), and build_input_k_rot's
        `while (n_embd_head_k_all % nrot == 0) nrot *= 2` then runs on 0 until nrot overflows to 0: SIGFPE."""
        swa = g.get("attention.sliding_window_pattern")
        if not isinstance(swa, list) or not all(swa[i] for i in layers):
            return None
        return [i for i, s in enumerate(swa) if not s], "no full-attention layer (an empty indexer cache: SIGFPE)"

    def swa_geometry(self, spec: ModelSpec) -> ModelSpec:
        """The spec as the sliding-window layers see it (their heads, latent rank and MLA head dims)."""
        x = spec.extra
        return replace(spec, n_head=x["n_head_swa"], kv_lora_rank=x["kv_lora_swa"],
                       extra=x | {"k_mla": x["k_mla_swa"], "v_mla": x["v_mla_swa"]})

    def build(self, spec: ModelSpec, b) -> None:
        E, x = spec.n_embd, spec.extra
        fe = x["n_ff_exp"]
        full = full_layers(spec.n_layer)
        swa = self.swa_geometry(spec)
        t1.mla_keys(b, spec)
        b.u32s(KA.HEAD_COUNT, [spec.n_head if f else swa.n_head for f in full])  # two layer kinds, two counts
        b.u32(KA.KV_LORA_RANK_SWA, swa.kv_lora_rank)
        b.u32(KA.KEY_LENGTH_SWA, swa.kv_lora_rank + x["n_rot"])  # the SWA cache row: latent + RoPE key
        b.u32(KA.VALUE_LENGTH_SWA, swa.kv_lora_rank)
        b.u32(KA.KEY_LENGTH_MLA_SWA, x["k_mla_swa"])
        b.u32(KA.VALUE_LENGTH_MLA_SWA, x["v_mla_swa"])
        b.u32(KA.SLIDING_WINDOW, SLIDING_WINDOW)
        b.bools(KA.SLIDING_WINDOW_PATTERN, [not f for f in full])
        b.f32(gguf.Keys.Rope.FREQ_BASE, ROPE_BASE)
        b.f32(gguf.Keys.Rope.FREQ_BASE_SWA, ROPE_BASE_SWA)
        t1.moe_keys(b, spec, fe)
        b.u32(K.EXPERT_GATING_FUNC, t1.GATING_SIGMOID)
        t1.indexer_keys(b, spec)
        b.bools(t1.KI.TYPES, full)  # the converter: an indexer on exactly the full layers
        blocks.embeddings(b, spec)
        for i in range(spec.n_layer):
            geo = spec if full[i] else swa
            b.t(T.ATTN_NORM, (E,), blocks.NORM, bid=i)
            t1.mla_attention(b, geo, i)
            b.t(T.ATTN_K_NORM, (x["n_rot"],), blocks.NORM, bid=i)  # on the shared RoPE key, before RoPE
            b.t(T.ATTN_GATE, (E, geo.n_head), bid=i)  # one sigmoid gate per head
            b.t(T.FFN_NORM, (E,), blocks.NORM, bid=i)
            if full[i]:
                t1.indexer(b, spec, i)
            t1.ffn_lead_or_moe(b, spec, i, fe, probs_bias=True)
