"""mamba: llama.cpp aborts in llama_decode: ggml/src/ggml-cpu/ops.cpp:5488: GGML_ASSERT(i1 >= 0 && i1 < ne1) failed.

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




def greedy_samplers(ctx, model, seqs):
    """llama-server's chain for a greedy request that ignores end of generation as each sequence's backend sampler
    (llama_set_sampler: sampling in the graph): a logit bias of -inf on every end-of-generation token, top-k 1,
    top-p 0.95, min-p 0.05, temperature 0, dist. The chains, kept while the context lives."""
    vocab = L.llama_model_get_vocab(model)
    n_vocab = L.llama_vocab_n_tokens(vocab)
    eog = [t for t in range(n_vocab) if L.llama_vocab_is_eog(vocab, t)]
    chains = []
    for seq in seqs:
        chain = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
        if eog:
            bias = (L.llama_logit_bias * len(eog))(*[L.llama_logit_bias(t, float("-inf")) for t in eog])
            L.llama_sampler_chain_add(chain, L.llama_sampler_init_logit_bias(n_vocab, len(eog), bias))
        for s in (L.llama_sampler_init_top_k(1), L.llama_sampler_init_top_p(0.95, 1),
                  L.llama_sampler_init_min_p(0.05, 1), L.llama_sampler_init_temp_ext(0.0, 0.0, 1.0),
                  L.llama_sampler_init_dist(0)):
            L.llama_sampler_chain_add(chain, s)
        if not L.llama_set_sampler(ctx, seq, chain):
            cannot(f"llama_set_sampler refused sequence {seq}")
        chains.append(chain)
    return chains

def steps():
    model = load_model()
    ctx = new_context(model, n_ctx=768, n_batch=256, n_ubatch=256, n_seq_max=3, n_rs_seq=0, flash_attn=True, kv_unified=True, n_outputs_max=15, n_outputs_max_per_seq=5)
    chains = greedy_samplers(ctx, model, [1, 2])
    rows = decode(ctx, tokens=[5, 3, 11, 3, 8, 11, 9], pos=[0, 1, 2, 3, 0, 1, 2], seqs=[[0], [0], [0], [0], [2], [2], [2]], outputs=[1, 1, 1, 1, 0, 0, 1])
    rows = decode(ctx, tokens=[10, 4, 4, 4, 9, 5], pos=[0, 1, 2, 3, 4, 5], seqs=[[1], [1], [1], [1], [1], [1]], outputs=[0, 0, 0, 0, 0, 1])
    rows = decode(ctx, tokens=[5, 2, 13, 1, 5, 2, 8, 0, 13], pos=[6, 7, 8, 9, 10, 11, 12, 3, 4], seqs=[[1], [1], [1], [1], [1], [1], [1], [2], [0]], outputs=[0, 0, 0, 0, 0, 0, 1, 1, 1])
    rows = decode(ctx, tokens=[14, 4, 8, 4, 4, 13], pos=[4, 5, 6, 13, 14, 15], seqs=[[2], [2], [2], [1], [1], [1]], outputs=[1, 1, 1, 1, 1, 1])


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
              'rows = decode(ctx, tokens=[14, 4, 8, 4, 4, 13], pos=[4, 5, 6, 13, 14, 15], seqs=[[2], [2], [2], [1], [1], [1]], outputs=[1, 1, 1, 1, 1, 1])')
        sys.exit(1)
    print("fixed: every step ran" if child.returncode == 0 else "cannot run: the steps failed otherwise")
    sys.exit(0 if child.returncode == 0 else 2)
