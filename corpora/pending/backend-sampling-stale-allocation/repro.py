"""llama: llama_decode aborts in ggml_compute_forward_set_rows (GGML_ASSERT(i1 >= 0 && i1 < ne1)) with backend
samplers on two sequences, each sampling four outputs of one batch.

llama.cpp 0c1e57098bba43ac29e6e3b677cdceebdd22334f, its C API through llama-cpp-python's bare `llama_cpp` bindings
(built from that tree); the model beside this file (model.gguf). Sequences 0 and 1 each get llama-server's greedy
chain as backend sampler (logit bias -inf on the end-of-generation token, top-k 1, top-p 0.95, min-p 0.05,
temperature 0, dist), then one batch: four tokens of sequence 1, then four of sequence 0, every one an output (two
drafts verified at once). The sampled tokens must be the greedy picks of a context without samplers.
Exits 1 while the defect is present, 0 once it is fixed, 2 when this program cannot run.
"""

import os
import subprocess
import sys
from pathlib import Path

import llama_cpp as L

MODEL = Path(__file__).with_name("model.gguf")
QUIET = L.llama_log_callback(lambda level, text, user_data: None)
if not os.environ.get("VERBOSE"):  # llama.cpp's own log: VERBOSE=1 shows it
    L.llama_log_set(QUIET, None)
BATCH = [(1, p) for p in range(4)] + [(0, p) for p in range(4)]  # (sequence, position), every token an output


def cannot(why):
    """The reproducer itself could not run (not the defect): exit 2."""
    print(f"cannot run: {why}")
    sys.exit(2)


def context(model, samplers):
    cp = L.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max = 768, 256, 256, 3
    cp.n_outputs_max, cp.n_outputs_max_per_seq = 15, 5  # (llama-server's with three slots and drafts of four)
    cp.n_threads = cp.n_threads_batch = 1
    ctx = L.llama_init_from_model(model, cp)
    if not ctx:
        cannot("llama_init_from_model failed")
    vocab = L.llama_model_get_vocab(model)
    n_vocab = L.llama_vocab_n_tokens(vocab)
    eog = [t for t in range(n_vocab) if L.llama_vocab_is_eog(vocab, t)]
    keep = []
    for seq in samplers:
        chain = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
        bias = (L.llama_logit_bias * len(eog))(*[L.llama_logit_bias(t, float("-inf")) for t in eog])
        for s in (L.llama_sampler_init_logit_bias(n_vocab, len(eog), bias), L.llama_sampler_init_top_k(1),
                  L.llama_sampler_init_top_p(0.95, 1), L.llama_sampler_init_min_p(0.05, 1),
                  L.llama_sampler_init_temp_ext(0.0, 0.0, 1.0), L.llama_sampler_init_dist(0)):
            L.llama_sampler_chain_add(chain, s)
        if not L.llama_set_sampler(ctx, seq, chain):
            cannot(f"llama_set_sampler refused sequence {seq}")
        keep.append(chain)
    return ctx, n_vocab, set(eog), keep


def decode(ctx, n_vocab):
    batch = L.llama_batch_init(len(BATCH), 0, 1)
    batch.n_tokens = len(BATCH)
    for i, (seq, pos) in enumerate(BATCH):
        batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = (7 * seq + 3 * pos + 1) % n_vocab, pos, 1, 1
        batch.seq_id[i][0] = seq
    rc = L.llama_decode(ctx, batch)
    L.llama_batch_free(batch)
    if rc != 0:
        cannot(f"llama_decode returned {rc}")


def run():
    """In a process of its own (the defect aborts it): print the sampled tokens and the greedy picks."""
    L.llama_backend_init()
    mp = L.llama_model_default_params()
    mp.n_gpu_layers = 0  # the CPU, as the finding was made
    model = L.llama_model_load_from_file(str(MODEL).encode(), mp)
    if not model:
        cannot(f"llama_model_load_from_file({MODEL}) failed")
    ctx, n_vocab, eog, keep = context(model, [0, 1])
    decode(ctx, n_vocab)
    sampled = [L.llama_get_sampled_token_ith(ctx, i) for i in range(len(BATCH))]
    plain, _, _, _ = context(model, [])
    decode(plain, n_vocab)
    greedy = []
    for i in range(len(BATCH)):
        row = L.llama_get_logits_ith(plain, i)
        greedy.append(max((t for t in range(n_vocab) if t not in eog), key=lambda t: row[t]))
    print(" ".join(map(str, sampled)))
    print(" ".join(map(str, greedy)))


if __name__ == "__main__":
    if sys.argv[1:] == ["run"]:
        run()
        sys.exit(0)
    r = subprocess.run([sys.executable, *(["-S"] if sys.flags.no_site else []), __file__, "run"], capture_output=True,
                       text=True, env={**os.environ, "GGML_NO_BACKTRACE": "1"})
    if r.returncode < 0:
        said = [line for line in r.stderr.splitlines() if "GGML_ASSERT" in line or "error" in line.lower()]
        print(f"DEFECT: llama_decode died of signal {-r.returncode}: {said[-1] if said else 'no message'}")
        sys.exit(1)
    if r.returncode != 0:
        print(r.stdout.strip() or r.stderr.strip()[-500:])
        sys.exit(2)
    sampled, greedy = r.stdout.strip().splitlines()[-2:]
    if sampled != greedy:
        print(f"DEFECT: the backend samplers picked [{sampled}], the greedy picks are [{greedy}]")
        sys.exit(1)
    print(f"fixed: one batch of both sequences' four outputs sampled in the graph: [{sampled}], the greedy picks")
    sys.exit(0)
