"""The llama.cpp target: a worker process that speaks targets/PROTOCOL.md over stdin/stdout.

Run as `python -m targets.llama_cpp_worker`. One model and one context at a time. llama.cpp aborts the
process on some bad inputs; that is expected — the client (targets/client.py) turns it into a typed
crash result and restarts the worker.

The worker's ops are here; the protocol loop and the process around it are targets/worker_protocol.py (shared with
the other workers), the build it runs and its libraries targets/worker_build.py, the capture callback
targets/native.py.
"""

from __future__ import annotations

import base64
import ctypes
import os
import re
import time
from pathlib import Path
from typing import Any

from targets import native, state_io, tokenizer
from targets.samplers import free_chains, set_greedy
from targets.worker_build import (
    DEVICE_BACKENDS,
    PINNED_LLAMA_CPP_PYTHON,
    backend_environment,
    build_commit,
    ggml_base,
    ggml_devices,
    llama_bindings,
)
from targets.worker_protocol import CACHE_TYPES, PROTOCOL_VERSION, ROPE_SCALINGS, RequestError, main_with

# Defaults pinned for determinism (notes §9b): fixed batch sizes, flash attention off, one thread.
DEFAULTS = {"n_ctx": 256, "n_batch": 64, "n_ubatch": 64, "n_seq_max": 1, "n_threads": 1, "flash_attn": False,
            "capture": True, "trace": False, "n_rs_seq": 0, "swa_full": False}


def batch_order(ubatch_logits: bytes, ptrs: list[int], n_vocab: int) -> list[int] | None:
    """For each batch row, the row of the ubatch-ordered captures that holds it: the logits llama.cpp returns per
    batch row matched bit for bit with the logits node's rows as the ubatches computed them. None when they are
    in batch order already (or cannot be matched: the captures stay as computed)."""
    size = 4 * n_vocab
    ub = [ubatch_logits[size * r:size * (r + 1)] for r in range(len(ubatch_logits) // size)]
    want = [ctypes.string_at(p, size) for p in ptrs]
    if ub == want or len(ub) != len(want):
        return None
    free: dict[bytes, list[int]] = {}
    for r, row in enumerate(ub):
        free.setdefault(row, []).append(r)
    order = []
    for row in want:
        if not free.get(row):
            return None
        order.append(free[row].pop(0))
    return order


class LlamaWorker:
    def __init__(self) -> None:
        self.backend = backend_environment()
        L = self.L = llama_bindings()
        self.ggml = ggml_base(L)
        # capture and log callbacks, argmax
        self.native = native.load(self.ggml, L, echo=bool(os.environ.get("FAMILY_CERTIFY_WORKER_LOG")))
        L.llama_log_set(self.native.log_callback, None)
        self.tracer: native.Python | None = None  # the capture callback of contexts loaded with trace=true
        self.capturer: native.Native | native.Python = self.native
        L.llama_backend_init()
        self.model = None
        self.model_key: tuple[Any, ...] | None = None  # the loaded model's file (path, identity, size, mtime), mmap
        self.ctx = None
        self.chains: dict[int, Any] = {}  # the context's backend samplers, by sequence (load's `samplers`)
        self.params: dict[str, Any] = {}
        self.kv_unified = False  # the loaded context's KV layout (one stream for every sequence)
        self.info: dict[str, Any] = {}
        # (the NULL-terminated device list, its name) to offload to: picked at the first load, where a backend
        # without a device is reported as that load's failure
        self.device: tuple[ctypes.Array, str] | None = None
        self.decode_seconds = 0.0  # time llama.cpp spent in llama_decode since the last report
        self.callback_seconds = 0.0  # part of it spent in a Python eval callback (subtracted)
        # a decode's `abort_after`: llama.cpp's abort callback (checked after every graph node) says stop from its
        # N-th call on; set only for that decode
        self.abort_calls, self.abort_after = 0, 0
        self.abort_callback = L.ggml_abort_callback(self._abort_now)

    def _abort_now(self, _data: Any) -> bool:
        self.abort_calls += 1
        return self.abort_calls >= self.abort_after

    def _pick_device(self) -> tuple[ctypes.Array, str]:
        """The first device of the build's backend; none is a load failure (the build cannot run here)."""
        want = DEVICE_BACKENDS[self.backend]
        devs = [d for d in ggml_devices(self.L) if d[1] == want]
        if not devs:
            raise RequestError("load_failed", f"backend {self.backend}: ggml registered no {want} device on this "
                                              "machine (for Vulkan: is a driver installed, mesa-vulkan-drivers "
                                              "without a GPU?)")
        handle, _, name, desc = devs[0]
        return (ctypes.c_void_p * 2)(handle, None), f"{name} ({desc})"

    # ---- ops ---------------------------------------------------------------------------------------
    def op_hello(self, _req: dict) -> dict:
        return {"protocol": PROTOCOL_VERSION, "target": "llama-cpp",
                "llama_cpp_python": self.L.__version__, "llama_cpp_commit": build_commit(),
                "pinned": self.L.__version__ == PINNED_LLAMA_CPP_PYTHON and not os.environ.get("FAMILY_CERTIFY_BUILD"),
                "helpers": self.native.kind, "backend": self.backend, "state_via": list(state_io.VIAS),
                "abort_after": True,
                "system_info": self.L.llama_print_system_info().decode(errors="replace")}

    def op_load(self, req: dict) -> dict:
        """A fresh context on the file's model. The model (weights, vocabulary: read-only once loaded) is kept from
        the previous load when it is the same file, unchanged (its identity, size and mtime) — a hand-off imports
        into many fresh contexts of one stage; its context never is."""
        L = self.L
        path = req.get("path")
        if not path or not Path(path).is_file():
            self._unload()
            raise RequestError("bad_request", f"load: no such file: {path!r}")
        params = {**DEFAULTS, **{k: req[k] for k in DEFAULTS if k in req},
                  **{k: str(req[k]) for k in ("type_k", "type_v") if k in req}}
        bad = [params[k] for k in ("type_k", "type_v") if k in params and params[k] not in CACHE_TYPES]
        if bad:
            self._unload()
            raise RequestError("bad_request", f"load: cache type {bad[0]!r}; one of {', '.join(CACHE_TYPES)}")
        if req.get("rope_scaling", "none") not in ROPE_SCALINGS:
            self._unload()
            raise RequestError("bad_request", f"load: rope_scaling {req['rope_scaling']!r}; one of "
                                              f"{', '.join(ROPE_SCALINGS)}")
        if params["n_batch"] < params["n_seq_max"]:
            self._unload()
            raise RequestError("bad_request", "load: n_batch must be >= n_seq_max (llama.cpp asserts otherwise)")
        st = os.stat(path)
        key = (str(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, req.get("mmap"))
        model_reused = key == self.model_key
        self._unload(keep_model=model_reused)
        self.native.log_clear()
        t0 = time.perf_counter()
        model = self.model
        if model is None:
            if self.backend in DEVICE_BACKENDS and self.device is None:
                self.device = self._pick_device()
            mp = L.llama_model_default_params()
            if "mmap" in req:  # (llama.cpp's default otherwise: auto)
                mp.load_mode = L.LLAMA_LOAD_MODE_MMAP if req["mmap"] else L.LLAMA_LOAD_MODE_NONE
            if self.device:  # every layer (and the output) on the one device, as a runtime on that device runs
                mp.devices = ctypes.cast(self.device[0], ctypes.c_void_p)
                mp.n_gpu_layers = -1
            else:  # the CPU (and BLAS: it takes matrix products from the CPU backend; nothing is offloaded)
                mp.n_gpu_layers = 0
            model = L.llama_model_load_from_file(str(path).encode(), mp)
            if not model:
                raise RequestError("load_failed", "load: " + self._last_error("failed to load model"))
            if self.device:
                self._check_offloaded(L, model)
        cp = L.llama_context_default_params()
        cp.n_ctx = params["n_ctx"]
        cp.n_batch = params["n_batch"]
        cp.n_ubatch = params["n_ubatch"]
        cp.n_seq_max = params["n_seq_max"]
        cp.n_rs_seq = params["n_rs_seq"]  # recurrent-state snapshots per sequence for rollback (archs that have it)
        for k in ("n_outputs_max", "n_outputs_max_per_seq"):  # caps on a batch's output rows (llama.cpp's unless given)
            if k in req:
                setattr(cp, k, int(req[k]))
        cp.n_threads = params["n_threads"]
        cp.n_threads_batch = params["n_threads"]
        cp.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_ENABLED if params["flash_attn"] \
            else L.LLAMA_FLASH_ATTN_TYPE_DISABLED
        cp.kv_unified = self.kv_unified = bool(req.get("kv_unified", params["n_seq_max"] > 1))
        cp.swa_full = bool(params["swa_full"])  # a full-size sliding-window cache (llama-server's --swa-full)
        for k in ("type_k", "type_v"):  # the KV cache's types (llama.cpp: a quantized V needs flash attention)
            if k in params:
                setattr(cp, k, CACHE_TYPES[params[k]])
        if "rope_scaling" in req:  # a context's RoPE scaling (llama-server's --rope-scaling, --rope-scale): yarn turns
            cp.rope_scaling_type = ROPE_SCALINGS[req["rope_scaling"]]  # YaRN's ext factor on (llama.cpp's default)
        if "rope_freq_scale" in req:
            cp.rope_freq_scale = float(req["rope_freq_scale"])
        cp.no_perf = True  # no performance counters: llama_perf_* is never read here
        self.capturer = self.native
        if params["trace"]:  # every node of a layer on request: the Python callback (slow, for localizing)
            self.tracer = self.tracer or native.Python(self.ggml, L)
            self.capturer = self.tracer
        if params["capture"] or params["trace"]:  # the per-node callback costs time in every decode
            cp.cb_eval = self.capturer.callback
            cp.cb_eval_user_data = None
        ctx = L.llama_init_from_model(model, cp)
        if not ctx:
            L.llama_model_free(model)
            self.model = self.model_key = None
            said = [ln.split(": ", 1)[1] for ln in self.native.log_lines() if ln.startswith("llama_init_from_model: ")]
            raise RequestError("load_failed", "load: " + (f"failed to create context: {said[-1]}" if said else
                                                          self._last_error("failed to create context")))
        self.model, self.model_key, self.ctx, self.params = model, key, ctx, params
        self.info = self._model_info()
        try:  # sampling in the graph: the greedy chain on each of these sequences
            seqs = [self._seq({"samplers": s}, "samplers") for s in req.get("samplers", [])]
            self.chains, eog = set_greedy(L, ctx, model, seqs)
        except RequestError:
            self._unload()
            raise
        return {**self.info, "load_seconds": round(time.perf_counter() - t0, 6), "model_reused": model_reused,
                "device": self.device[1] if self.device else "CPU", **({"sampler_eog": eog} if self.chains else {})}

    def _check_offloaded(self, L: Any, model: Any) -> None:
        """Every layer went to the device, as llama.cpp reports it ("offloaded N/M layers to GPU"); else the run
        would certify the CPU while it names the device: a load failure."""
        lines = self.native.log_lines()
        m = next((re.search(r"offloaded (\d+)/(\d+) layers", ln) for ln in reversed(lines)
                  if "offloaded" in ln), None)
        if m is None or m.group(1) != m.group(2):
            L.llama_model_free(model)
            self.model = self.model_key = None
            raise RequestError("load_failed", f"load: backend {self.backend}: not every layer was offloaded to "
                                              f"{self.device[1]} ({m.group(0) if m else 'llama.cpp said nothing'})")

    def op_info(self, _req: dict) -> dict:
        self._need_model()
        return self.info

    def _model_info(self) -> dict:
        L, m = self.L, self.model
        buf = ctypes.create_string_buffer(256)
        L.llama_model_meta_val_str(m, b"general.architecture", buf, 256)
        return {"arch": buf.value.decode(), "n_layer": L.llama_model_n_layer(m), "n_embd": L.llama_model_n_embd(m),
                "n_embd_inp": L.llama_model_n_embd_inp(m),
                "n_vocab": L.llama_vocab_n_tokens(L.llama_model_get_vocab(m)),
                "is_recurrent": bool(L.llama_model_is_recurrent(m)), "is_hybrid": bool(L.llama_model_is_hybrid(m)),
                "rope_type": L.llama_model_rope_type(m), "params": self.params,
                "can_shift": bool(L.llama_memory_can_shift(L.llama_get_memory(self.ctx))) if self.ctx else None,
                "n_rs_seq": int(L.llama_n_rs_seq(self.ctx)) if self.ctx else None,
                "n_ctx_seq": int(L.llama_n_ctx_seq(self.ctx)) if self.ctx else None,
                "n_ctx_train": int(L.llama_model_n_ctx_train(m)),
                "llama_cpp_commit": build_commit()}

    def wire_roundtrip(self, embd: bytes, wire: str) -> bytes:
        from targets.wire import WIRES, roundtrip

        if wire not in WIRES:
            raise RequestError("bad_request", f"decode: wire {wire!r}: use one of {', '.join(WIRES)}")
        try:
            return roundtrip(embd, wire)
        except ValueError as e:
            raise RequestError("bad_request", f"decode: {e}") from None

    def op_decode(self, req: dict) -> dict:
        """One llama_decode of tokens or embeddings, with per-token positions, sequences and outputs."""
        L, ctx = self.L, self._need_ctx()
        info = self.info
        if "tokens" in req:
            tokens = [int(t) for t in req["tokens"]]
            n, embd = len(tokens), None
            if any(not 0 <= t < info["n_vocab"] for t in tokens):
                raise RequestError("bad_request", f"decode: token id out of range 0..{info['n_vocab'] - 1}")
        elif "embd" in req:
            embd = base64.b64decode(req["embd"])
            width = info["n_embd_inp"]
            if not embd or len(embd) % (4 * width):
                raise RequestError("bad_request", f"decode: embd has {len(embd) / 4:g} floats, not a multiple of "
                                   f"n_embd_inp {width}")
            if req.get("wire", "f32") != "f32":  # the rows as they arrive over a split runtime's wire
                embd = self.wire_roundtrip(embd, str(req["wire"]))
            n, tokens = len(embd) // (4 * width), None
        else:
            raise RequestError("bad_request", "decode: give 'tokens' or 'embd'")
        if n == 0 or n > self.params["n_batch"]:
            raise RequestError("bad_request", f"decode: {n} tokens; must be 1..n_batch ({self.params['n_batch']})")
        seq_sets = _seq_sets(req.get("seq", 0), n)  # a token in several sequences: coupled (a shared prefix)
        seqs = [ss[0] for ss in seq_sets]
        if "pos" not in req and any(len(ss) > 1 for ss in seq_sets):
            raise RequestError("bad_request", "decode: a token in several sequences needs its 'pos'")
        if "pos" in req:
            pos = _per_token(req["pos"], n, "pos")
        else:  # continue each sequence from where it is
            mem = L.llama_get_memory(ctx)
            nxt: dict[int, int] = {}
            pos = []
            for s in seqs:
                nxt.setdefault(s, L.llama_memory_seq_pos_max(mem, s) + 1)
                pos.append(nxt[s])
                nxt[s] += 1
        n_pos = int(req.get("n_pos_per_token", 1))  # 4 for M-RoPE archs fed embeddings
        abort_after = int(req.get("abort_after", 0))
        if abort_after < 0:
            raise RequestError("bad_request", f"decode: abort_after {abort_after}: a count of graph nodes, >= 1")
        outputs = req.get("logits", "last")
        if outputs == "last":
            out = [i == n - 1 for i in range(n)]
        elif outputs == "all":
            out = [True] * n
        elif outputs == "none":
            out = [False] * n
        else:
            out = [bool(x) for x in _per_token(outputs, n, "logits")]
        capture = [int(k) for k in req.get("capture", [])]
        beyond = [k for k in capture if k >= native.OUTPUT_SLOT]  # that slot holds the logits node, not a layer
        if beyond:
            raise RequestError("bad_request", f"decode: no tensor l_out-{beyond[0]} in this graph "
                               f"(layers 0..{info['n_layer'] - 1})")
        if capture and not self.params["capture"]:
            raise RequestError("bad_request", "decode: capture needs a context loaded with capture=true")
        # capturing the last layer needs every row to reach it (llama.cpp prunes non-output rows there);
        # capturing earlier layers must not change what the last layer computes
        computed = [True] * n if info["n_layer"] - 1 in capture else out
        trace = req.get("trace")
        if trace is not None and not self.params["trace"]:
            raise RequestError("bad_request", "decode: trace needs a context loaded with trace=true")
        if trace is not None and trace != "all" and not isinstance(trace, int):
            raise RequestError("bad_request", f"decode: trace {trace!r}: a layer index or \"all\"")
        # with several sequences in one batch llama.cpp may order the rows into ubatches otherwise than the batch
        # (split_equal: recurrent and hybrid memory); its logits come back in batch order, the captured rows in
        # ubatch order — the logits node captured too gives the permutation (every row is an output here)
        reorder = bool(capture) and len(set(seqs)) > 1 and all(computed)
        wanted = [*capture, native.OUTPUT_SLOT] if reorder else capture
        if trace is not None:
            self.capturer.begin(wanted, trace=trace)
        else:
            self.capturer.begin(wanted)
        captured: dict[int, tuple[bytes, int]] = {}

        batch = L.llama_batch_init(n if n_pos == 1 else n * n_pos, info["n_embd_inp"] if embd is not None else 0,
                                   max(len(ss) for ss in seq_sets))
        try:
            batch.n_tokens = n
            if embd is not None:
                ctypes.memmove(batch.embd, embd, len(embd))
            for i in range(n):
                if tokens is not None:
                    batch.token[i] = tokens[i]
                batch.pos[i] = pos[i]
                batch.n_seq_id[i] = len(seq_sets[i])
                for j, s in enumerate(seq_sets[i]):
                    batch.seq_id[i][j] = s
                batch.logits[i] = 1 if computed[i] else 0
            if n_pos > 1:  # M-RoPE: section-major p,p,p,0 (notes §2.5)
                for j in range(1, n_pos):
                    for i in range(n):
                        batch.pos[j * n + i] = pos[i] if j < 3 else 0
            t0, cb0 = time.perf_counter(), self.capturer.seconds
            if abort_after:
                self.abort_calls, self.abort_after = 0, abort_after
                L.llama_set_abort_callback(ctx, self.abort_callback, None)
            try:
                rc = L.llama_decode(ctx, batch)
            finally:
                if abort_after:
                    L.llama_set_abort_callback(ctx, ctypes.cast(None, L.ggml_abort_callback), None)
            cb = self.capturer.seconds - cb0
            self.decode_seconds += time.perf_counter() - t0 - cb
            self.callback_seconds += cb
        finally:
            L.llama_batch_free(batch)
            nodes = self.capturer.nodes if trace is not None else []
            captured = self.capturer.end()
        if rc == 1:  # llama.h: no memory slot for the batch; nothing of it was decoded
            raise RequestError("no_memory_slot", "llama_decode returned 1: no memory slot for the batch "
                               f"({n} tokens)")
        if rc == 2:  # llama.h: aborted; the ubatches processed before stay in memory
            raise RequestError("aborted", f"llama_decode returned 2: aborted at the abort callback's call "
                               f"{abort_after} ({self.abort_calls} calls)")
        if rc != 0:
            raise RequestError("decode_failed", f"llama_decode returned {rc}: " + self._last_error(""))
        rows = [i for i in range(n) if out[i]]
        n_vocab = info["n_vocab"]
        if req.get("logits_from") == "buffer":  # llama_get_logits: the output rows contiguous, in the batch's order
            base = ctypes.cast(L.llama_get_logits(ctx), ctypes.c_void_p).value if rows else 0
            ptrs = [base + 4 * n_vocab * k for k in range(len(rows))]
        else:
            ptrs = [ctypes.cast(L.llama_get_logits_ith(ctx, i), ctypes.c_void_p).value for i in rows]
        resp: dict[str, Any] = {"n_tokens": n, "rows": rows, "argmax": [self.native.argmax(p, n_vocab) for p in ptrs],
                                "n_vocab": n_vocab}
        if self.chains:  # each output row's token sampled in the graph (None: its sequence has no sampler)
            resp["sampled"] = [int(L.llama_get_sampled_token_ith(ctx, i)) if seq_sets[i][0] in self.chains else None
                               for i in rows]
        if req.get("return_logits", True) and rows:
            resp["logits"] = b"".join(ctypes.string_at(p, 4 * n_vocab) for p in ptrs)
        if capture:
            every = [ctypes.cast(L.llama_get_logits_ith(ctx, i), ctypes.c_void_p).value for i in range(n)] \
                if reorder else []  # every row computed (reorder), sent back or not
            order = batch_order(captured.get(native.OUTPUT_SLOT, (b"", 0))[0], every, n_vocab) if reorder else None
            resp["captures"] = {}
            for k in capture:
                if k not in captured:
                    raise RequestError("bad_request", f"decode: no tensor l_out-{k} in this graph "
                                       f"(layers 0..{info['n_layer'] - 1})")
                data, width = captured[k]
                if order is not None:
                    rows_ = [data[4 * width * r:4 * width * (r + 1)] for r in range(len(data) // (4 * width))]
                    data = b"".join(rows_[r] for r in order)
                resp["captures"][str(k)] = data
        if trace is not None:
            resp["nodes"] = nodes
        return resp

    def op_script(self, req: dict) -> dict:
        """Several decodes in one round trip. A token may be "argmax@R": the argmax of output row R of the
        previous step (greedy decoding without a round trip per token). Stops at the first failing step.
        reset: clear the memory first (saves the round trip of a separate reset)."""
        steps = req.get("steps")
        if not isinstance(steps, list) or not steps:
            raise RequestError("bad_request", "script: 'steps' must be a non-empty list of decode requests")
        if req.get("reset"):
            self.op_reset({})
        results: list[dict] = []
        prev: dict | None = None
        for k, step in enumerate(steps):
            step = dict(step)
            if "tokens" in step:
                step["tokens"] = [_resolve_token(t, prev, k) for t in step["tokens"]]
            res = self.op_decode(step)
            res["tokens"] = step.get("tokens")
            results.append(res)
            prev = res
        return {"results": results}

    def op_generate(self, req: dict) -> dict:
        """Prefill `prompt` in chunks of `chunk` tokens, then greedy-decode `n_predict` tokens (seq `seq`)."""
        prompt = [int(t) for t in req.get("prompt", [])]
        if not prompt:
            raise RequestError("bad_request", "generate: empty prompt")
        chunk = int(req.get("chunk", self.params.get("n_batch", 64)))
        seq = int(req.get("seq", 0))
        want_logits = bool(req.get("return_logits", True))
        steps: list[bytes] = []
        last = None
        for i in range(0, len(prompt), chunk):
            last = self.op_decode({"tokens": prompt[i:i + chunk], "seq": seq, "logits": "last",
                                   "return_logits": True})
        assert last is not None
        out_tokens: list[int] = []
        for _ in range(int(req.get("n_predict", 0))):
            steps.append(last["logits"])
            tok = last["argmax"][-1]
            out_tokens.append(tok)
            last = self.op_decode({"tokens": [tok], "seq": seq, "logits": "last"})
        resp: dict[str, Any] = {"tokens": out_tokens, "n_vocab": last["n_vocab"]}
        if want_logits and steps:
            resp["logits"] = b"".join(steps)
        return resp

    def op_state_get(self, req: dict) -> dict:
        try:
            data = state_io.state_get(self.L, self._need_ctx(), req)
        except state_io.StateError as e:
            raise RequestError(e.code, f"{e}: {self._last_error('no state')}") from None
        if req.get("path"):
            Path(req["path"]).write_bytes(data)
            return {"size": len(data), "path": req["path"]}
        return {"size": len(data), "data": data}

    def op_state_set(self, req: dict) -> dict:
        try:
            return state_io.state_set(self.L, self._need_ctx(), req, state_io.blob_of(req))
        except state_io.StateError as e:
            raise RequestError(e.code, f"{e}: {self._last_error('state rejected')}") from None

    def op_tokenize(self, req: dict) -> dict:
        """The model's own tokenizer (llama_tokenize): no BOS/EOS added, special-token text not parsed."""
        return {"tokens": tokenizer.tokenize(self.L, self._need_model(), str(req.get("text", "")))}

    def op_detokenize(self, req: dict) -> dict:
        """Token ids back to text (llama_detokenize): special tokens neither removed nor rendered."""
        return {"text": tokenizer.detokenize(self.L, self._need_model(), [int(t) for t in req.get("tokens", [])])}

    def op_seq_rm(self, req: dict) -> dict:
        L, ctx = self.L, self._need_ctx()
        ok = L.llama_memory_seq_rm(L.llama_get_memory(ctx), int(req.get("seq", -1)), int(req.get("p0", -1)),
                                   int(req.get("p1", -1)))
        return {"removed": bool(ok)}

    def op_seq_pos_max(self, req: dict) -> dict:
        L, ctx = self.L, self._need_ctx()
        return {"pos_max": int(L.llama_memory_seq_pos_max(L.llama_get_memory(ctx), int(req.get("seq", 0))))}

    def op_seq_pos(self, req: dict) -> dict:
        """Every asked sequence's [pos_min, pos_max] as the memory reports them ([-1, -1] when empty)."""
        L, ctx = self.L, self._need_ctx()
        mem = L.llama_get_memory(ctx)
        return {"pos": {str(s): [int(L.llama_memory_seq_pos_min(mem, s)), int(L.llama_memory_seq_pos_max(mem, s))]
                        for s in (int(x) for x in req.get("seqs", [0]))}}

    def op_seq_cp(self, req: dict) -> dict:
        L, ctx = self.L, self._need_ctx()
        src, dst = self._seq(req, "src"), self._seq(req, "dst")
        L.llama_memory_seq_cp(L.llama_get_memory(ctx), src, dst, int(req.get("p0", -1)), int(req.get("p1", -1)))
        return {}

    def op_seq_keep(self, req: dict) -> dict:
        L, ctx = self.L, self._need_ctx()
        L.llama_memory_seq_keep(L.llama_get_memory(ctx), self._seq(req, "seq"))
        return {}

    def op_seq_add(self, req: dict) -> dict:
        return self._shift(req, "seq_add", self.L.llama_memory_seq_add, int(req["delta"]))

    def op_seq_div(self, req: dict) -> dict:
        if int(req["d"]) < 1:
            raise RequestError("bad_request", "seq_div: d must be at least 1")
        return self._shift(req, "seq_div", self.L.llama_memory_seq_div, int(req["d"]))

    def _shift(self, req: dict, name: str, call: Any, arg: int) -> dict:
        """seq_add / seq_div, refused where the memory cannot shift positions (llama.cpp asserts in the next decode
        otherwise)."""
        L, ctx = self.L, self._need_ctx()
        mem = L.llama_get_memory(ctx)
        if not L.llama_memory_can_shift(mem):
            raise RequestError("bad_request", f"{name}: this memory cannot shift positions (can_shift false)")
        call(mem, self._seq(req, "seq"), int(req.get("p0", -1)), int(req.get("p1", -1)), arg)
        return {}

    def op_reset(self, _req: dict) -> dict:
        L, ctx = self.L, self._need_ctx()
        L.llama_memory_clear(L.llama_get_memory(ctx), True)
        return {}

    def op_unload(self, _req: dict) -> dict:
        self._unload()
        return {}

    def close(self) -> None:
        """Nothing to release: the process exits without tearing down llama.cpp."""

    # ---- helpers ---------------------------------------------------------------------------------
    def _need_model(self):
        if not self.model:
            raise RequestError("bad_request", "no model loaded; send a 'load' request first")
        return self.model

    def _need_ctx(self):
        self._need_model()
        return self.ctx

    def _seq(self, req: dict, key: str) -> int:
        """A sequence id the context holds (llama.cpp asserts on one past n_seq_max in several memory calls)."""
        s = int(req[key])
        if not 0 <= s < self.params["n_seq_max"]:
            raise RequestError("bad_request",
                               f"{key} {s}: the context holds sequences 0..{self.params['n_seq_max'] - 1}")
        return s

    def _unload(self, *, keep_model: bool = False) -> None:
        if self.ctx:
            self.L.llama_free(self.ctx)
        self.ctx = None
        free_chains(self.L, self.chains)  # (after the context that held them)
        if self.model and not keep_model:
            self.L.llama_model_free(self.model)
            self.model = self.model_key = None
        self.params, self.info = {}, {}

    def _last_error(self, fallback: str) -> str:
        errs = [ln.strip() for ln in self.native.log_lines() if "error" in ln.lower() or "failed" in ln.lower()]
        return errs[0] if errs else fallback


def _resolve_token(t: Any, prev: dict | None, k: int) -> int:
    if isinstance(t, str) and t.startswith("argmax@"):
        if prev is None:
            raise RequestError("bad_request", f"script step {k}: {t} needs a previous step")
        row = int(t[len("argmax@"):])
        if row not in prev["rows"]:
            raise RequestError("bad_request", f"script step {k}: {t}: the previous step has no output row {row}")
        return prev["argmax"][prev["rows"].index(row)]
    return int(t)


def _per_token(v: Any, n: int, what: str) -> list[int]:
    if isinstance(v, list):
        if len(v) != n:
            raise RequestError("bad_request", f"'{what}' has {len(v)} entries for {n} tokens")
        return [int(x) for x in v]
    return [int(v)] * n


def _seq_sets(v: Any, n: int) -> list[list[int]]:
    """`seq` of a decode: one id for every token, or one entry per token — an id, or a list of ids (the token is in
    each of those sequences)."""
    if not isinstance(v, list):
        return [[int(v)]] * n
    if len(v) != n:
        raise RequestError("bad_request", f"'seq' has {len(v)} entries for {n} tokens")
    out = [[int(x) for x in s] if isinstance(s, list) else [int(s)] for s in v]
    if any(not ss or len(set(ss)) != len(ss) for ss in out):
        raise RequestError("bad_request", "decode: a token's sequence ids must be one or more distinct ids")
    return out


def main() -> None:
    main_with(LlamaWorker)


if __name__ == "__main__":
    main()
