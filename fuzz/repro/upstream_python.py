"""The standalone Python reproducer's text: the prelude every one starts with (llama.cpp's C API through
llama-cpp-python's bare `llama_cpp` bindings), the helpers a program's steps need, one line per recorded call, and a
memory finding's whole script; and a finding's one-line title."""

from __future__ import annotations

import base64
import json
from typing import Any

from synth.errors import UserError
from targets.worker_protocol import CACHE_TYPES

MEMORY_CALLS = {"seq_rm": ("seq", "p0", "p1"), "seq_cp": ("src", "dst", "p0", "p1"), "seq_keep": ("seq",),
                "seq_add": ("seq", "p0", "p1", "delta"), "seq_div": ("seq", "p0", "p1", "d")}
CONTEXT_KEYS = ("n_ctx", "n_batch", "n_ubatch", "n_seq_max", "n_rs_seq", "flash_attn", "kv_unified")
WORKER_DEFAULTS = {"n_ctx": 256, "n_batch": 64, "n_ubatch": 64, "n_seq_max": 1, "n_rs_seq": 0, "flash_attn": False}

PRELUDE = '''import os
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
'''


TYPED_HELPER = '''

# ggml.h's enum ggml_type (the bindings do not name every one)
GGML_TYPES = ''' + repr(CACHE_TYPES)


def changes(req: dict[str, Any]) -> str:
    """A load's llama_context_params beyond the plain ones (KV cache types, a full-size window cache, a RoPE
    scaling) as new_context's keyword arguments (", type_k=GGML_TYPES['q8_0'], ..."; "" when none)."""
    out = [f"{k}=GGML_TYPES[{req.get(k, 'f16')!r}]" for k in ("type_k", "type_v")] if typed(req) else []
    if req.get("swa_full"):
        out.append("swa_full=True")
    if req.get("rope_scaling"):
        out.append(f"rope_scaling_type=L.LLAMA_ROPE_SCALING_TYPE_{str(req['rope_scaling']).upper()}")
    if req.get("rope_freq_scale"):
        out.append(f"rope_freq_scale={float(req['rope_freq_scale'])!r}")
    out += [f"{k}={int(req[k])}" for k in ("n_outputs_max", "n_outputs_max_per_seq") if req.get(k)]
    return "".join(f", {x}" for x in out)


def typed(req: dict[str, Any]) -> bool:
    """A load whose KV cache types are not llama.cpp's default."""
    return any(req.get(k, "f16") != "f16" for k in ("type_k", "type_v"))


def helpers(steps: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """The prelude's additions these steps need (each only where used: the other reports' scripts unchanged)."""
    return [*([TYPED_HELPER] if any(op == "load" and typed(req) for op, req in steps) else []),
            *([NO_ROOM_HELPER] if any(req.get(NO_ROOM) for _, req in steps) else []),
            *([ABORT_HELPER] if any(req.get("abort_after") for _, req in steps) else []),
            *([SHIFT_HELPER] if any(op in SHIFTS for op, _ in steps) else []),
            *([FILE_HELPER] if any(op.startswith("state_") and req.get("via") == "file" for op, req in steps)
              else []),
            *([REFUSED_HELPER] if any(req.get(REFUSED) for _, req in steps) else []),
            *([SAMPLERS_HELPER] if any(op == "load" and req.get("samplers") for op, req in steps) else [])]


SAMPLERS_HELPER = '''


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
    return chains'''


REFUSED = "refused"  # a recorded state import llama.cpp refused, as the program meant it to (a state cut short)
REFUSED_HELPER = '''


def refused_import(ctx, seq, blob, size):
    """The first `size` bytes of an export imported into sequence seq: a state cut short, which llama.cpp refuses
    (what the program did; whether it refuses is not this reproducer's check)."""
    buf, _ = blob
    L.llama_state_seq_set_data_ext(ctx, buf, size, seq, 0)'''
FILE_HELPER = '''


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
        cannot(f"llama_state_seq_load_file into sequence {seq} read nothing")'''


SHIFTS = ("seq_add", "seq_div")
SHIFT_HELPER = '''


def refused_shift():
    """llama_memory_can_shift says this memory cannot shift positions: no shift is asked of it (llama.cpp would abort
    at the next decode), and nothing wrong follows from a shift it refuses."""
    print("fixed: llama_memory_can_shift is false: the memory refuses to shift positions")
    sys.exit(0)'''


def step_text(op: str, req: dict[str, Any]) -> str:
    """A recorded step as issue.md lists it: its call, and a context's backend samplers with it."""
    text = f"`{call_line('ctx', op, req, 'rows')}`"
    if op == "load" and req.get("samplers"):
        text += (f", then `chains = greedy_samplers(ctx, model, {[int(x) for x in req['samplers']]})` (each of these "
                 "sequences gets llama-server's chain for a greedy request as its backend sampler, llama_set_sampler)")
    return text


def step_lines(ctx: str, op: str, req: dict[str, Any], rows: str, model: str | None = None) -> list[str]:
    """A recorded step's lines in the script: its call (call_line), a shift only where the memory says it can."""
    line = call_line(ctx, op, req, rows, model)
    if op == "load" and req.get("samplers"):
        return [line, f"chains = greedy_samplers({ctx}, model, {[int(x) for x in req['samplers']]})"]
    if op in SHIFTS:
        return [f"if not L.llama_memory_can_shift(L.llama_get_memory({ctx})):", "    refused_shift()", line]
    return [line]


NO_ROOM = "refused_for_room"  # a recorded decode the memory refused for room, as it must (llama_decode returned 1)
NO_ROOM_HELPER = '''

def refused_for_room(ctx, tokens, pos, seqs):
    """A decode the cache has no room for: llama_decode must return 1 and decode none of it."""
    n = len(tokens)
    batch = L.llama_batch_init(n, 0, max(len(s) for s in seqs))
    batch.n_tokens = n
    for i in range(n):
        batch.token[i], batch.pos[i], batch.logits[i], batch.n_seq_id[i] = tokens[i], pos[i], 0, len(seqs[i])
        for j, s in enumerate(seqs[i]):
            batch.seq_id[i][j] = s
    rc = L.llama_decode(ctx, batch)
    L.llama_batch_free(batch)
    if rc != 1:
        cannot(f"a decode of {n} tokens with no room in the cache returned {rc}, not 1")'''


ABORT_HELPER = '''


def aborted_decode(ctx, tokens, pos, seqs, abort_after):
    """A decode the caller cancels: the abort callback, which llama.cpp calls after every graph node it computes,
    answers stop from its abort_after-th call on; llama_decode must return 2 (aborted). llama.h: the ubatches it
    finished stay in memory, and llama_memory_seq_pos_min/max say what each sequence holds."""
    calls = [0]

    @L.ggml_abort_callback
    def stop(_data):
        calls[0] += 1
        return calls[0] >= abort_after

    n = len(tokens)
    batch = L.llama_batch_init(n, 0, max(len(s) for s in seqs))
    batch.n_tokens = n
    for i in range(n):
        batch.token[i], batch.pos[i], batch.logits[i], batch.n_seq_id[i] = tokens[i], pos[i], i == n - 1, len(seqs[i])
        for j, s in enumerate(seqs[i]):
            batch.seq_id[i][j] = s
    L.llama_set_abort_callback(ctx, stop, None)
    rc = L.llama_decode(ctx, batch)
    L.llama_set_abort_callback(ctx, L.ctypes.cast(None, L.ggml_abort_callback), None)
    L.llama_batch_free(batch)
    if rc != 2:
        cannot(f"a decode aborted at the abort callback's call {abort_after} returned {rc}, not 2")'''


def call_line(ctx: str, op: str, req: dict[str, Any], rows: str, model: str | None = None) -> str:
    """One recorded call as a line of the reproducer (ctx: the context's variable; rows: where a decode's go; model:
    the file a load must be of, when the calls were logged with their paths)."""
    mem = f"L.llama_get_memory({ctx})"
    if op == "load":
        if model is not None and req.get("path") != model:
            raise UserError("a context on another file than the model (a stage sliced from it): no standalone "
                            "reproducer yet")
        p = {**WORKER_DEFAULTS, **req}
        p.setdefault("kv_unified", p["n_seq_max"] > 1)
        args = ", ".join(f"{k}={p[k]!r}" for k in CONTEXT_KEYS)
        return f"{ctx} = new_context(model, {args}{changes(req)})"
    if op == "decode":
        if "tokens" not in req:
            raise UserError("a decode fed embeddings (a stage past the first): no standalone reproducer yet")
        n = len(req["tokens"])
        seqs = token_seqs(req)
        out = req.get("logits", "last")
        outs = [i == n - 1 for i in range(n)] if out == "last" else [True] * n if out == "all" \
            else [False] * n if out == "none" else [bool(x) for x in out]
        if req.get(NO_ROOM):
            return f"refused_for_room({ctx}, tokens={req['tokens']}, pos={req['pos']}, seqs={seqs})"
        if req.get("abort_after"):
            return (f"aborted_decode({ctx}, tokens={req['tokens']}, pos={req['pos']}, seqs={seqs}, "
                    f"abort_after={req['abort_after']})")
        return (f"{rows} = decode({ctx}, tokens={req['tokens']}, pos={req['pos']}, seqs={seqs}, "
                f"outputs={[int(o) for o in outs]})")
    if op in MEMORY_CALLS:  # (a position or sequence not given: -1, the API's "all")
        return f"L.llama_memory_{op}({mem}, " + ", ".join(str(req.get(k, -1)) for k in MEMORY_CALLS[op]) + ")"
    if op == "reset":
        return f"L.llama_memory_clear({mem}, True)"
    if op == "state_get" and req.get("via", "memory") == "memory" and not req.get("partial"):
        return f"blob = export_seq({ctx}, {req.get('seq', 0)})"
    if op == "state_set" and req.get("via", "memory") == "memory" and not req.get("partial") and req.get(REFUSED) \
            and "data" in req:
        return f"refused_import({ctx}, {req.get('seq', 0)}, blob, size={len(base64.b64decode(req['data']))})"
    if op == "state_set" and req.get("via", "memory") == "memory" and not req.get("partial") and not req.get(REFUSED):
        return f"import_seq({ctx}, {req.get('seq', 0)}, blob)"
    if op == "state_get" and req.get("via") == "file":
        return f"state_file = save_seq_file({ctx}, {req.get('seq', 0)}, tokens={list(req.get('tokens') or [])})"
    if op == "state_set" and req.get("via") == "file" and not req.get(REFUSED):
        return f"load_seq_file({ctx}, {req.get('seq', 0)}, state_file)"
    raise UserError(f"a {op} call {json.dumps({k: v for k, v in req.items() if k != 'data'})[:80]}: no standalone "
                    "reproducer writes it yet")


def memory_script(run: dict[str, Any], data: dict[str, Any]) -> str:
    """repro.py: the prelude, the recorded steps, the reference, the failed check."""
    p = run["problem"]
    lines = [f'"""{title_of(data)}.', "", f"llama.cpp {run['commit']}, its C API through llama-cpp-python's bare "
             "`llama_cpp` bindings (built from that tree); the model beside this file (model.gguf).",
             "Exits 1 while the defect is present, 0 once it is fixed, 2 when this program cannot run.", '"""', "",
             PRELUDE, *helpers(run["steps"] + run["reference"]), "",
             "model = load_model()", "# the steps, as the memory program ran them"]
    going_on = after_abort(run)
    if going_on is not None:  # (the steps up to the aborted decode; then where the sequence says it ends)
        return "\n".join(lines + continued(run, *going_on))
    lines += [x for op, req in run["steps"] for x in step_lines("ctx", op, req, "rows")]
    if p["check"] == "pos":
        want_min, want_max = p["want"]
        lo, hi = want_min if isinstance(want_min, list) else (want_min, want_min)
        said = f"[{lo}, {want_max}]" if lo == hi else f"[{lo}..{hi}, {want_max}]"
        empty = p.get("or_empty")  # (a refused import: what the sequence held, or nothing)
        said += " (what it held) or [-1, -1] (nothing)" if empty else ""
        lines += ["", f"# the check: sequence {p['seq']}'s positions as the memory reports them",
                  f"got = positions(ctx, {p['seq']})",
                  f"if tuple(got) != (-1, -1) and (got[1] != {want_max} or not {lo} <= got[0] <= {hi}):" if empty else
                  f"if got[1] != {want_max} or not {lo} <= got[0] <= {hi}:",
                  f'    print(f"DEFECT: sequence {p["seq"]} reports positions {{list(got)}}, expected {said}")',
                  "    sys.exit(1)",
                  f'print(f"fixed: sequence {p["seq"]} reports positions {{list(got)}}")', "sys.exit(0)", ""]
        return "\n".join(lines)
    q = p["seq"]
    lines += ["", f"# the reference: sequence {q}'s history decoded alone in a fresh context"]
    lines += [call_line("ref", op, req, "ref_rows") for op, req in run["reference"]]
    lines += ["", f"# the check: sequence {q}'s logits against the reference's",
              f"d = max(abs(a - b) for a, b in zip(rows[{q}], ref_rows[0]))",
              f"if d > {run['tol']:.6g}:",
              f'    print(f"DEFECT: sequence {q}\'s logits differ from the same history decoded alone: max|Δlogit| '
              f'{{d:.3g}} > {run["tol"]:.6g}")',
              "    sys.exit(1)",
              f'print(f"fixed: sequence {q}\'s logits match the same history decoded alone (max|Δlogit| {{d:.3g}})")',
              "sys.exit(0)", ""]
    return "\n".join(lines)


def after_abort(run: dict[str, Any]) -> tuple[int, list[list[int]]] | None:
    """Where a logits finding goes on after an aborted decode: (the aborted step's index, the failing sequence's
    [position, token] before the last decode), when the program ends with the aborted decode and then one decode of
    that sequence alone, and its history is decodes only. None otherwise. llama.h says to ask the memory what each
    sequence holds after an aborted decode: its reproducer goes on from there, not from where the pinned build said."""
    steps, q = run["steps"], run["problem"].get("seq")
    aborted = [i for i, (op, req) in enumerate(steps) if op == "decode" and req.get("abort_after")]
    if run["problem"]["check"] != "logits" or not aborted or aborted[-1] != len(steps) - 2:
        return None
    last = steps[-1][1]
    if steps[-1][0] != "decode" or "tokens" not in last or not isinstance(last.get("pos"), list) \
            or any(ss != [q] for ss in token_seqs(last)):
        return None
    if any(op not in ("load", "decode") for op, _ in [*steps, *run["reference"]]):
        return None
    held = [[p, t] for op, req in steps[:-1] if op == "decode"
            for p, t, ss in zip(req.get("pos") or [], req["tokens"], token_seqs(req), strict=False) if q in ss]
    return aborted[-1], held


def token_seqs(req: dict[str, Any]) -> list[list[int]]:
    """A recorded decode's sequences, one list of ids per token (its `seq`: one id for every token, or per token an
    id or a list of ids)."""
    seq = req.get("seq", 0)
    if not isinstance(seq, list):
        return [[int(seq)]] * len(req["tokens"])
    return [[int(x) for x in s] if isinstance(s, list) else [int(s)] for s in seq]


def continued(run: dict[str, Any], aborted: int, history: list[list[int]]) -> list[str]:
    """The reproducer's steps to the aborted decode, then the failing sequence one decode further from where the
    memory says it ends, against what it says it holds decoded alone (after_abort)."""
    q, tol = run["problem"]["seq"], run["tol"]
    nxt = run["steps"][-1][1]["tokens"]
    ref_load = call_line("ref", *run["reference"][0], "ref_rows")
    return [*(x for op, req in run["steps"][:aborted + 1] for x in step_lines("ctx", op, req, "rows")), "",
            f"# what sequence {q} holds now, as llama.cpp reports it (llama.h: after an aborted decode, ask)",
            f"end = positions(ctx, {q})[1]",
            f"held = [(p, t) for p, t in {history} if p <= end]  # its tokens so far, at their positions",
            f"nxt = {nxt}",
            "pos = list(range(end + 1, end + 1 + len(nxt)))",
            f"rows = decode(ctx, tokens=nxt, pos=pos, seqs=[[{q}]] * len(nxt), "
            "outputs=[0] * (len(nxt) - 1) + [1])", "",
            f"# the reference: what sequence {q} says it holds, and the same tokens, decoded alone in a fresh context",
            ref_load,
            "ref_rows = decode(ref, tokens=[t for _, t in held] + nxt, pos=[p for p, _ in held] + pos, "
            "seqs=[[0]] * (len(held) + len(nxt)), outputs=[0] * (len(held) + len(nxt) - 1) + [1])", "",
            f"# the check: sequence {q}'s logits against the reference's",
            f"d = max(abs(a - b) for a, b in zip(rows[{q}], ref_rows[0]))",
            f"if d > {tol:.6g}:",
            f'    print(f"DEFECT: sequence {q} does not hold what its positions say: its logits differ from '
            f'those tokens decoded alone: max|Δlogit| {{d:.3g}} > {tol:.6g}")',
            "    sys.exit(1)",
            f'print(f"fixed: sequence {q} holds what its positions say (max|Δlogit| {{d:.3g}} against them decoded '
            'alone)")', "sys.exit(0)", ""]


# a memory program's operations as llama.cpp's API names them
API_NAMES = {"decode": "llama_decode", "coupled": "llama_decode of tokens in several sequences",
             "rm": "llama_memory_seq_rm", "cp": "llama_memory_seq_cp", "keep": "llama_memory_seq_keep",
             "add": "llama_memory_seq_add", "div": "llama_memory_seq_div",
             "copy_state": "a sequence's state copied (llama_state_seq_get_data / set_data)",
             "reload": "the state moved into a fresh context",
             "decode aborted": "a llama_decode aborted by its abort callback",
             "coupled aborted": "a llama_decode of tokens in several sequences aborted by its abort callback"}


def title_of(data: dict[str, Any]) -> str:
    """The finding in one line: what came out wrong, after which calls, in which KV layout."""
    fp = data["fingerprint"]
    layout = "one KV stream per sequence" if fp.get("phase") == "per-seq-kv" else "a unified KV cache"
    program = [op["op"] + (" aborted" if op.get("abort") else "")
               for op in (data.get("config") or {}).get("program") or []]
    ops = ", ".join(API_NAMES.get(o, o) for o in dict.fromkeys(program or fp.get("ops") or []))
    what = "wrong positions reported" if fp.get("where") == "pos" else "wrong logits"
    return f"{data['spec']['family'] if data.get('spec') else 'model'}: {what} after {ops} ({layout})"
