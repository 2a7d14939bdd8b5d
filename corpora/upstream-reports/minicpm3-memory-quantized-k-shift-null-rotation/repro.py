"""minicpm3: llama.cpp aborts in llama_decode: decode: crash: llama-cpp crashed (signal SIGSEGV) during 'decode'.

llama.cpp 0c1e57098bba43ac29e6e3b677cdceebdd22334f, its C API through llama-cpp-python's bare `llama_cpp` bindings (built from that tree); the model beside this file (model.gguf).
Exits 1 while the defect is present (llama.cpp aborts), 0 once it is fixed, 2 when this program cannot run.
"""

import signal
import subprocess
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



# ggml.h's enum ggml_type (the bindings do not name every one)
GGML_TYPES = {'f32': 0, 'f16': 1, 'bf16': 30, 'q8_0': 8, 'q4_0': 2, 'q4_1': 3, 'iq4_nl': 20, 'q5_0': 6, 'q5_1': 7}



def refused_shift():
    """llama_memory_can_shift says this memory cannot shift positions: no shift is asked of it (llama.cpp would abort
    at the next decode), and nothing wrong follows from a shift it refuses."""
    print("fixed: llama_memory_can_shift is false: the memory refuses to shift positions")
    sys.exit(0)



def save_seq_file(ctx, seq, tokens):
    """Sequence seq's state and its tokens written to a file (llama_state_seq_save_file); the file's path."""
    import tempfile

    path = os.path.join(tempfile.mkdtemp(prefix="repro-state-"), "state.bin")
    toks = (L.ctypes.c_int32 * max(len(tokens), 1))(*tokens)
    if L.llama_state_seq_save_file(ctx, path.encode(), seq, toks, len(tokens)) == 0:
        cannot(f"llama_state_seq_save_file of sequence {seq} wrote nothing")
    return path


def load_seq_file(ctx, seq, path):
    """A state file read into sequence seq (llama_state_seq_load_file)."""
    out, n = (L.ctypes.c_int32 * 65536)(), L.ctypes.c_size_t(0)
    if L.llama_state_seq_load_file(ctx, path.encode(), seq, out, 65536, L.ctypes.byref(n)) == 0:
        cannot(f"llama_state_seq_load_file into sequence {seq} read nothing")



def refused_import(ctx, seq, blob, size):
    """The first `size` bytes of an export imported into sequence seq: a state cut short, which llama.cpp refuses
    (what the program did; whether it refuses is not this reproducer's check)."""
    buf, _ = blob
    L.llama_state_seq_set_data_ext(ctx, buf, size, seq, 0)

def steps():
    model = load_model()
    ctx = new_context(model, n_ctx=1024, n_batch=64, n_ubatch=64, n_seq_max=4, n_rs_seq=4, flash_attn=True, kv_unified=True, type_k=GGML_TYPES['q8_0'], type_v=GGML_TYPES['q8_0'])
    rows = decode(ctx, tokens=[50, 21, 30, 62, 9, 38], pos=[0, 1, 2, 3, 4, 5], seqs=[[0, 1, 2], [0, 1, 2], [0, 1, 2], [0, 1, 2], [0, 1, 2], [0, 1, 2]], outputs=[0, 0, 0, 0, 0, 1])
    rows = decode(ctx, tokens=[45, 2, 46, 12, 10, 6], pos=[6, 7, 8, 9, 10, 11], seqs=[[0, 2], [0, 2], [0, 2], [0, 2], [0, 2], [0, 2]], outputs=[0, 0, 0, 0, 0, 1])
    state_file = save_seq_file(ctx, 0, tokens=[50, 21, 30, 62, 9, 38, 45, 2, 46, 12, 10, 6])
    load_seq_file(ctx, 2, state_file)
    blob = export_seq(ctx, 0)
    refused_import(ctx, 1, blob, size=1116)
    L.llama_memory_seq_rm(L.llama_get_memory(ctx), 1, -1, -1)
    if not L.llama_memory_can_shift(L.llama_get_memory(ctx)):
        refused_shift()
    L.llama_memory_seq_add(L.llama_get_memory(ctx), 0, 10, -1, 6)
    rows = decode(ctx, tokens=[26], pos=[18], seqs=[[0]], outputs=[1])


if __name__ == "__main__":
    if os.environ.get("REPRO_STEPS"):  # the child: the steps, as the toolkit ran them (VERBOSE=1: with
        # llama.cpp's log and ggml's backtrace when it aborts)
        steps()
        sys.exit(0)
    child = subprocess.run([sys.executable, *(["-S"] if sys.flags.no_site else []), __file__],
                           env={**os.environ, "REPRO_STEPS": "1",
                                **({} if os.environ.get("VERBOSE") else {"GGML_NO_BACKTRACE": "1"})})
    if child.returncode < 0:
        print(f"DEFECT: llama.cpp aborted (signal {signal.Signals(-child.returncode).name}) in: "
              'rows = decode(ctx, tokens=[26], pos=[18], seqs=[[0]], outputs=[1])')
        sys.exit(1)
    print("fixed: every step ran" if child.returncode == 0 else "cannot run: the steps failed otherwise")
    sys.exit(0 if child.returncode == 0 else 2)
