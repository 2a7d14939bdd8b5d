"""rwkv6: RWKV-6 "Finch", every layer recurrent (data-dependent decay WKV state, no attention, no RoPE).
Default wkv head size 32 (E=32): at E=64 six E×E matrices per layer make 12 layers 1.2 MB. CPU wkv6 takes any
head size (remainder loop); CUDA only 64 or 128 (use --embd 64). output.weight and ln0 are required.
"""

import gguf

from synth.errors import UserError
from synth.families import blocks
from synth.families._tier3 import layer_norm
from synth.families.base import KA, Family, K, T
from synth.spec import ModelSpec
from synth.weights import Init

# Value ranges (why, in terms of the graph in src/models/rwkv6-base.cpp):
LERP = Init.span(0.1, 0.9)  # token-shift mix x + (x_prev - x)·lerp: a blend of this and the previous token
LORA_IN = Init.std(0.3)  # x → time_mix_w1 → tanh: moderate, so the data-dependent lerps/decay vary per token
LORA_OUT = Init.std(0.1)  # tanh → offsets of the lerps (±0.1-ish around LERP) and of the log-log decay
# decay w = exp(-exp(time_mix_decay + LoRA)); [-4, 0] gives w ≈ 0.37..0.98 per channel: long and short memory,
# always < 1 so the state stays bounded
DECAY = Init.span(-4.0, 0.0)
FIRST = Init.span(0.0, 1.0)  # "u" bonus for the current token's k·v (time_faaaa)


class Rwkv6(Family):
    name = "rwkv6"
    arch = gguf.MODEL_ARCH.RWKV6
    kind = "recurrent"
    summary = "RWKV-6 (all layers recurrent); data-dependent decay and token shift"
    knobs = frozenset({"layers", "embd", "heads", "head_dim", "ff", "vocab"})
    n_embd = 32
    n_head = 1

    def derive(self, spec: ModelSpec) -> dict[str, int]:
        return {"time_mix_extra_dim": 4, "time_decay_extra_dim": 8}

    def check(self, spec: ModelSpec) -> None:
        if spec.n_head * spec.head_dim != spec.n_embd:
            raise UserError(f"family {self.name}: --heads {spec.n_head} × head size {spec.head_dim} must equal "
                            f"--embd {spec.n_embd} (the wkv state covers the whole embedding)")

    def build(self, spec: ModelSpec, b) -> None:
        E, F, hs, x = spec.n_embd, spec.n_ff, spec.head_dim, spec.extra
        tm, td = x["time_mix_extra_dim"], x["time_decay_extra_dim"]
        b.f32(KA.LAYERNORM_EPS, 1e-5)
        b.u32(gguf.Keys.WKV.HEAD_SIZE, hs)
        b.u32(K.TIME_MIX_EXTRA_DIM, tm)
        b.u32(K.TIME_DECAY_EXTRA_DIM, td)
        b.u32(K.FEED_FORWARD_LENGTH, F)
        b.u32(KA.HEAD_COUNT, 0)  # as the converter writes; head_count_kv then defaults to 0 (no K/V sharing)
        blocks.embeddings(b, spec)  # output.weight is required for rwkv6
        layer_norm(b, T.TOKEN_EMBD_NORM, E)  # ln0, applied to the embeddings before layer 0
        b.t(T.OUTPUT_NORM, (E,), blocks.BIAS, suffix="bias")
        for i in range(spec.n_layer):
            layer_norm(b, T.ATTN_NORM, E, i)
            layer_norm(b, T.ATTN_NORM_2, E, i)
            b.t(T.TIME_MIX_W1, (E, 5 * tm), LORA_IN, bid=i)
            b.t(T.TIME_MIX_W2, (tm, E, 5), LORA_OUT, bid=i)
            b.t(T.TIME_MIX_LERP_X, (E, 1, 1), LERP, bid=i)
            b.t(T.TIME_MIX_LERP_FUSED, (E, 1, 1, 5), LERP, bid=i)  # w, k, v, r, g
            b.t(T.TIME_MIX_FIRST, (hs, E // hs), FIRST, bid=i)
            b.t(T.TIME_MIX_DECAY, (E,), DECAY, bid=i)
            b.t(T.TIME_MIX_DECAY_W1, (E, td), LORA_IN, bid=i)
            b.t(T.TIME_MIX_DECAY_W2, (td, E), LORA_OUT, bid=i)
            b.t(T.TIME_MIX_KEY, (E, E), bid=i)
            b.t(T.TIME_MIX_VALUE, (E, E), bid=i)
            b.t(T.TIME_MIX_RECEPTANCE, (E, E), bid=i)
            b.t(T.TIME_MIX_GATE, (E, E), bid=i)
            layer_norm(b, T.TIME_MIX_LN, E, i)  # per-head group norm of the wkv output
            b.t(T.TIME_MIX_OUTPUT, (E, E), bid=i)
            b.t(T.CHANNEL_MIX_LERP_K, (E, 1, 1), LERP, bid=i)
            b.t(T.CHANNEL_MIX_LERP_R, (E, 1, 1), LERP, bid=i)
            b.t(T.CHANNEL_MIX_KEY, (E, F), bid=i)
            b.t(T.CHANNEL_MIX_VALUE, (F, E), bid=i)
            b.t(T.CHANNEL_MIX_RECEPTANCE, (E, E), bid=i)
