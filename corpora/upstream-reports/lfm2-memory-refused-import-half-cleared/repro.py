"""lfm2: wrong positions reported after llama_decode, refused_import (a unified KV cache).

llama.cpp 0c1e57098bba43ac29e6e3b677cdceebdd22334f, its C API through llama-cpp-python's bare `llama_cpp` bindings (built from that tree); the model beside this file (model.gguf).
Exits 1 while the defect is present, 0 once it is fixed, 2 when this program cannot run.
"""

import os
import sys
from pathlib import Path

import llama_cpp as L

MODEL = Path(__file__).with_name("model.gguf")
QUIET = L.llama_log_callback(lambda level, text, user_data: None)
if not os.environ.get("VERBOSE"):  # llama.cpp's own log: VERBOSE=1 shows it
    L.llama_log_set(QUIET, None)


def cannot(why):
    """The reproducer itself could not run (not the defect): exit 2."""
    print(f"cannot run: {why}")
    sys.exit(2)


def load_model():
    L.llama_backend_init()
    mp = L.llama_model_default_params()
    mp.n_gpu_layers = 0  # the CPU, as the finding was made
    model = L.llama_model_load_from_file(str(MODEL).encode(), mp)
    return model or cannot(f"llama_model_load_from_file({MODEL}) failed")


def new_context(model, n_ctx, n_batch, n_ubatch, n_seq_max, n_rs_seq, flash_attn, kv_unified, **changed):
    """A context; `changed`: llama_context_params fields set otherwise than llama.cpp's defaults."""
    cp = L.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max, cp.n_rs_seq = n_ctx, n_batch, n_ubatch, n_seq_max, n_rs_seq
    cp.n_threads = cp.n_threads_batch = 1
    cp.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn else L.LLAMA_FLASH_ATTN_TYPE_DISABLED
    cp.kv_unified = kv_unified
    for field, value in changed.items():
        setattr(cp, field, value)
    ctx = L.llama_init_from_model(model, cp)
    return ctx or cannot("llama_init_from_model failed" + (f" with {changed}" if changed else ""))


def decode(ctx, tokens, pos, seqs, outputs):
    """One llama_decode: token i at pos[i] in the sequences seqs[i], logits asked where outputs[i]; each output's
    logits, by sequence."""
    n = len(tokens)
    batch = L.llama_batch_init(n, 0, max(len(s) for s in seqs))
    batch.n_tokens = n
    for i in range(n):
        batch.token[i], batch.pos[i], batch.logits[i], batch.n_seq_id[i] = tokens[i], pos[i], outputs[i], len(seqs[i])
        for j, s in enumerate(seqs[i]):
            batch.seq_id[i][j] = s
    rc = L.llama_decode(ctx, batch)
    L.llama_batch_free(batch)
    if rc != 0:
        cannot(f"llama_decode returned {rc}")
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(L.llama_get_model(ctx)))
    rows = {}
    for i in range(n):
        if outputs[i]:
            p = L.llama_get_logits_ith(ctx, i)
            for s in seqs[i]:
                rows[s] = [p[k] for k in range(n_vocab)]
    return rows


def export_seq(ctx, seq):
    size = L.llama_state_seq_get_size_ext(ctx, seq, 0)
    buf = (L.ctypes.c_uint8 * max(size, 1))()
    return buf, L.llama_state_seq_get_data_ext(ctx, buf, size, seq, 0)


def import_seq(ctx, seq, blob):
    buf, size = blob
    if L.llama_state_seq_set_data_ext(ctx, buf, size, seq, 0) == 0:
        cannot(f"llama_state_seq_set_data_ext into sequence {seq} read nothing")


def positions(ctx, seq):
    mem = L.llama_get_memory(ctx)
    return L.llama_memory_seq_pos_min(mem, seq), L.llama_memory_seq_pos_max(mem, seq)




def refused_import(ctx, seq, blob, size):
    """The first `size` bytes of an export imported into sequence seq: a state cut short, which llama.cpp refuses
    (what the program did; whether it refuses is not this reproducer's check)."""
    buf, _ = blob
    L.llama_state_seq_set_data_ext(ctx, buf, size, seq, 0)

model = load_model()
# the steps, as the memory program ran them
ctx = new_context(model, n_ctx=1024, n_batch=64, n_ubatch=64, n_seq_max=4, n_rs_seq=4, flash_attn=False, kv_unified=True)
rows = decode(ctx, tokens=[58, 10, 9, 17, 11, 12, 34, 3, 63, 22], pos=[0, 0, 1, 2, 3, 4, 5, 6, 7, 8], seqs=[[0], [2], [2], [2], [2], [2], [2], [2], [2], [2]], outputs=[1, 0, 0, 0, 0, 0, 0, 0, 0, 1])
blob = export_seq(ctx, 2)
refused_import(ctx, 0, blob, size=276)

# the check: sequence 0's positions as the memory reports them
got = positions(ctx, 0)
if tuple(got) != (-1, -1) and (got[1] != 0 or not 0 <= got[0] <= 0):
    print(f"DEFECT: sequence 0 reports positions {list(got)}, expected [0, 0] (what it held) or [-1, -1] (nothing)")
    sys.exit(1)
print(f"fixed: sequence 0 reports positions {list(got)}")
sys.exit(0)
