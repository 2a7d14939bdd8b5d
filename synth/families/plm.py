"""plm: PLM-1.8B, RMSNorm transformer with MLA-style compressed K/V (kv_a_mqa → norm → kv_b) cached as full
K/V heads (head_count_kv = head_count), RoPE on each head's last n_rot dims, ReLU² FFN, head tied to token_embd.
Upstream's own random-fixture test skips plm ("TODO tensor shapes").
"""

import gguf

from synth.families import _tier3 as t3
from synth.families import blocks
from synth.families.base import BASE_KNOBS, KA, Family, K, T
from synth.spec import ModelSpec


class Plm(Family):
    name = "plm"
    arch = gguf.MODEL_ARCH.PLM
    kind = "dense"
    rope = "partial"  # RoPE on the last dims after an even un-rotated part; check() holds the rule
    mha_only = "K/V are decompressed per query head and cached that way: head_count_kv is always head_count"
    summary = "PLM (tier 3): compressed K/V (MLA-like, full K/V heads), ReLU² FFN, tied head"
    knobs = BASE_KNOBS | {"kv_lora_rank"}
    kv_lora_rank = 16

    def derive(self, spec: ModelSpec) -> dict[str, int]:
        return {"n_rot": t3.partial_rot(spec.head_dim)}

    def check(self, spec: ModelSpec) -> None:
        D = spec.head_dim
        if D < 4 or D % 2:  # RoPE starts at the offset D - n_rot, which ggml requires to be even (n_rot is)
            raise self.reject("heads", f"{spec.n_head} leaves a head dim of {D}; plm needs an even head dim ≥ 4 "
                              "(RoPE on the last dims, offset by an even un-rotated part)")
        if spec.kv_lora_rank <= 0:
            raise self.reject("kv_lora_rank", f"{spec.kv_lora_rank}: plm compresses K/V, the rank must be > 0")

    def build(self, spec: ModelSpec, b) -> None:
        E, F, H, D = spec.n_embd, spec.n_ff, spec.n_head, spec.head_dim
        kvl, rot = spec.kv_lora_rank, spec.extra["n_rot"]
        b.f32(KA.LAYERNORM_RMS_EPS, 1e-6)
        b.u32(KA.HEAD_COUNT, H)
        b.u32(KA.HEAD_COUNT_KV, H)
        b.u32(KA.KV_LORA_RANK, kvl)
        b.u32(gguf.Keys.Rope.DIMENSION_COUNT, rot)
        b.u32(K.FEED_FORWARD_LENGTH, F)
        t3.tied_embeddings(b, spec)
        for i in range(spec.n_layer):
            b.t(T.ATTN_NORM, (E,), blocks.NORM, bid=i)
            b.t(T.ATTN_Q, (E, H * D), bid=i)
            b.t(T.ATTN_KV_A_MQA, (E, kvl + rot), bid=i)  # compressed K/V, then the shared RoPE key
            b.t(T.ATTN_KV_A_NORM, (kvl,), blocks.NORM, bid=i)
            b.t(T.ATTN_KV_B, (kvl, H * (D - rot + D)), bid=i)  # per head: un-rotated K part, then V
            b.t(T.ATTN_OUT, (H * D, E), t3.residual_proj(H * D), bid=i)
            b.t(T.FFN_NORM, (E,), blocks.NORM, bid=i)
            b.t(T.FFN_UP, (E, F), bid=i)
            b.t(T.FFN_DOWN, (F, E), t3.residual_proj(F), bid=i)
