"""minicpm3: MiniCPM3, DeepSeek-style low-rank attention WITHOUT the MLA cache: q through q_lora_rank, K/V
decompressed from kv_lora_rank into full per-head K (nope + shared rope part) and V, so the KV cache holds
H heads of key_length (= E/H + n_rot) and value_length (= E/H); head_count_kv must equal head_count.
Stage contract (hard-wired in the graph, not in the GGUF): inputs are multiplied by 12 after build_inp_embd
(models/minicpm3.cpp:66, 81; embedding input too), both residual branches by 1.4/sqrt(n_layer) where n_layer
is the FILE's block count (minicpm3.cpp:196-198, 220), and the final hidden state by 256/n_embd before the
head (minicpm3.cpp:241-242). A stage file with fewer layers therefore uses a different residual scale."""

import gguf

from synth.errors import UserError
from synth.families import blocks
from synth.families._tier2b import attn_keys, check_rope_pairs, embeddings
from synth.families.base import BASE_KNOBS, KA, Family, T
from synth.spec import ModelSpec


class MiniCPM3(Family):
    name = "minicpm3"
    arch = gguf.MODEL_ARCH.MINICPM3
    kind = "dense"
    summary = "MiniCPM3: low-rank q/kv attention (MHA cache), hard-wired embedding/residual/head scales"
    knobs = BASE_KNOBS | {"q_lora_rank", "kv_lora_rank"}
    mha_only = "K/V are decompressed to one head per query head (models/minicpm3.cpp:145-190)"
    q_lora_rank = 16
    kv_lora_rank = 16

    def derive(self, spec: ModelSpec) -> dict[str, int]:
        nope = spec.n_embd // spec.n_head
        rope = 2 * max(1, nope // 4)
        return {"nope": nope, "n_rot": rope, "k_head": nope + rope, "v_head": nope}

    def check(self, spec: ModelSpec) -> None:
        check_rope_pairs(self, spec, spec.extra["nope"])  # also ggml_rope_set_offset(nope) needs it even
        for knob, v in (("q_lora_rank", spec.q_lora_rank), ("kv_lora_rank", spec.kv_lora_rank)):
            if v <= 0:
                raise UserError(f"family {self.name}: --{knob.replace('_', '-')} {v} must be positive "
                                "(minicpm3 always has the low-rank q and kv projections)")

    def stage_refusal(self, g, a: int, b: int) -> str | None:
        n = int(g.get("block_count", 0))
        if (a, b) == (0, n):
            return None
        return (f"minicpm3 hard-codes its residual scale as 1.4/sqrt(n_layer) of the file (minicpm3.cpp:81): a "
                f"{b - a}-layer stage scales differently from the full model, and the x12 embedding scale "
                "(minicpm3.cpp:66) would hit the residual again")

    def build(self, spec: ModelSpec, b) -> None:
        E, H, x = spec.n_embd, spec.n_head, spec.extra
        ql, kvl, rope, dk, dv = spec.q_lora_rank, spec.kv_lora_rank, x["n_rot"], x["k_head"], x["v_head"]
        attn_keys(b, spec, head_dims=False, rope=rope)
        b.u32(KA.KEY_LENGTH, dk)
        b.u32(KA.VALUE_LENGTH, dv)
        b.u32(KA.Q_LORA_RANK, ql)
        b.u32(KA.KV_LORA_RANK, kvl)
        embeddings(b, spec, embd_std=1.0 / 12.0)  # the graph multiplies by 12
        for i in range(spec.n_layer):
            b.t(T.ATTN_NORM, (E,), blocks.NORM, bid=i)
            b.t(T.ATTN_Q_A_NORM, (ql,), blocks.NORM, bid=i)
            b.t(T.ATTN_KV_A_NORM, (kvl,), blocks.NORM, bid=i)
            b.t(T.ATTN_Q_A, (E, ql), bid=i)
            b.t(T.ATTN_Q_B, (ql, H * dk), bid=i)
            b.t(T.ATTN_KV_A_MQA, (E, kvl + rope), bid=i)
            b.t(T.ATTN_KV_B, (kvl, H * (dk - rope + dv)), bid=i)
            b.t(T.ATTN_OUT, (H * dv, E), bid=i)
            b.t(T.FFN_NORM, (E,), blocks.NORM, bid=i)
            blocks.ffn_dense(b, E, spec.n_ff, i)
