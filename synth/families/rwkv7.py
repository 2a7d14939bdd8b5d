"""rwkv7: RWKV-7 "Goose", every layer recurrent (generalized delta-rule WKV state, no attention, no RoPE).
wkv.head_size must be a multiple of 64: the CPU wkv7 kernel has no remainder loop (smaller heads corrupt memory).
Layer 0's unused value-residual LoRA (time_mix_v1/v2) is sized by the iclr rank, other layers' by their own.
"""

import gguf

from synth.errors import UserError
from synth.families import blocks
from synth.families._tier3 import layer_norm
from synth.families.base import KA, Family, K, T
from synth.spec import ModelSpec
from synth.weights import Init

WKV_HEAD_MULTIPLE = 64

# Value ranges (why, in terms of the graph in src/models/rwkv7-base.cpp):
LERP = Init.span(0.1, 0.9)  # token-shift mix x + (x_prev - x)·lerp: a blend of this and the previous token
# decay w = exp(-0.6065·sigmoid(w0 + LoRA)); w0 in [-4, 1] gives per-channel decay 0.64..0.99, so the state
# both remembers (decoding depends on context) and forgets (it stays bounded)
W0 = Init.span(-4.0, 1.0)
A0 = Init.span(-1.0, 1.0)  # in-context learning rate a = sigmoid(a0 + LoRA) ≈ 0.27..0.73
V0 = Init.span(-1.0, 1.0)  # value-residual mix sigmoid(v0 + LoRA) ≈ 0.27..0.73 toward layer 0's value
K_K = Init.around(1.0, 0.3)  # kk = l2norm(k·k_k): the removal key; positive so it tracks k
K_A = Init.span(0.2, 1.0)  # k ← k·(1 + (a − 1)·k_a): how much the learning rate scales the key
R_K = Init.std(0.1)  # per-channel "bonus" (r·k·r_k summed over a head, ×v); small: it bypasses the group norm
LORA_IN = Init.std(0.5)  # x → low rank (tanh / sigmoid / linear): moderate, so the LoRAs are data dependent
LORA_OUT = Init.std(0.5)  # low rank → E offsets added before a sigmoid: ±1-ish, never saturating


class Rwkv7(Family):
    name = "rwkv7"
    arch = gguf.MODEL_ARCH.RWKV7
    kind = "recurrent"
    summary = "RWKV-7 (all layers recurrent); wkv head size a multiple of 64"
    knobs = frozenset({"layers", "embd", "heads", "head_dim", "ff", "vocab"})
    n_embd = 64  # one wkv head of 64: the smallest legal size
    n_head = 1
    n_ff = 12  # four E×E matrices per layer already take 64 KB at E=64; 12 layers must stay ≤ 1 MB

    def derive(self, spec: ModelSpec) -> dict[str, int]:
        # LoRA ranks: tiny, and value-residual differs from iclr so the layer-0 rule shows in the shapes
        return {"lora_decay": 2, "lora_iclr": 2, "lora_value_res": 1, "lora_gate": 2}

    def check(self, spec: ModelSpec) -> None:
        hs = spec.head_dim
        if hs % WKV_HEAD_MULTIPLE:
            raise UserError(f"family {self.name}: head size {hs} (--head-dim, or --embd/--heads) must be a multiple "
                            f"of {WKV_HEAD_MULTIPLE}: ggml's wkv7 kernel has no remainder loop and corrupts memory; "
                            f"use e.g. --embd 128 --heads 2")
        if spec.n_head * hs != spec.n_embd:
            raise UserError(f"family {self.name}: --heads {spec.n_head} × head size {hs} must equal --embd "
                            f"{spec.n_embd} (the wkv state covers the whole embedding)")

    def build(self, spec: ModelSpec, b) -> None:
        E, F, x = spec.n_embd, spec.n_ff, spec.extra
        ld, li, lv, lg = x["lora_decay"], x["lora_iclr"], x["lora_value_res"], x["lora_gate"]
        b.f32(KA.LAYERNORM_EPS, 1e-5)
        b.u32(gguf.Keys.WKV.HEAD_SIZE, spec.head_dim)
        b.u32(KA.DECAY_LORA_RANK, ld)
        b.u32(KA.ICLR_LORA_RANK, li)
        b.u32(KA.VALUE_RESIDUAL_MIX_LORA_RANK, lv)
        b.u32(KA.GATE_LORA_RANK, lg)  # optional to the loader, but 0 makes time_mix_g1 zero-sized
        b.u32(K.FEED_FORWARD_LENGTH, F)
        b.u32(KA.HEAD_COUNT, 0)  # as the converter writes: RWKV has no attention heads
        blocks.embeddings(b, spec)  # output.weight is required for rwkv7
        layer_norm(b, T.TOKEN_EMBD_NORM, E)  # ln0, applied to the embeddings before layer 0
        b.t(T.OUTPUT_NORM, (E,), blocks.BIAS, suffix="bias")
        for i in range(spec.n_layer):
            layer_norm(b, T.ATTN_NORM, E, i)
            layer_norm(b, T.ATTN_NORM_2, E, i)
            layer_norm(b, T.TIME_MIX_LN, E, i)  # per-head group norm of the wkv output
            b.t(T.TIME_MIX_W0, (E,), W0, bid=i)
            b.t(T.TIME_MIX_W1, (E, ld), LORA_IN, bid=i)
            b.t(T.TIME_MIX_W2, (ld, E), LORA_OUT, bid=i)
            b.t(T.TIME_MIX_A0, (E,), A0, bid=i)
            b.t(T.TIME_MIX_A1, (E, li), LORA_IN, bid=i)
            b.t(T.TIME_MIX_A2, (li, E), LORA_OUT, bid=i)
            rv = li if i == 0 else lv  # layer 0's value LoRA is loaded with the iclr rank (and never used)
            b.t(T.TIME_MIX_V0, (E,), V0, bid=i)
            b.t(T.TIME_MIX_V1, (E, rv), LORA_IN, bid=i)
            b.t(T.TIME_MIX_V2, (rv, E), LORA_OUT, bid=i)
            b.t(T.TIME_MIX_G1, (E, lg), LORA_IN, bid=i)
            b.t(T.TIME_MIX_G2, (lg, E), LORA_OUT, bid=i)
            b.t(T.TIME_MIX_LERP_FUSED, (E, 1, 1, 6), LERP, bid=i)  # r, w, k, v, a, g
            b.t(T.TIME_MIX_K_K, (E,), K_K, bid=i)
            b.t(T.TIME_MIX_K_A, (E,), K_A, bid=i)
            b.t(T.TIME_MIX_R_K, (E,), R_K, bid=i)
            b.t(T.TIME_MIX_KEY, (E, E), bid=i)
            b.t(T.TIME_MIX_VALUE, (E, E), bid=i)
            b.t(T.TIME_MIX_RECEPTANCE, (E, E), bid=i)
            b.t(T.TIME_MIX_OUTPUT, (E, E), bid=i)
            b.t(T.CHANNEL_MIX_LERP_K, (E, 1, 1), LERP, bid=i)
            b.t(T.CHANNEL_MIX_KEY, (E, F), bid=i)
            b.t(T.CHANNEL_MIX_VALUE, (F, E), bid=i)
