"""Deliberately broken files for testing how targets fail (tests may write what synth never would)."""

from pathlib import Path

import numpy as np

from synth.gguf_io import read_all, write_gguf


def rewrite(src: Path, dst: Path, *, tensor=None, drop=None) -> Path:
    """Copy a GGUF, transforming tensors: tensor(name, array) -> array; drop(name) -> bool."""
    g, kv, tensors = read_all(src)
    out = [(n, tensor(n, a) if tensor else a) for n, a in tensors if not (drop and drop(n))]
    write_gguf(dst, g.arch, kv, out)
    return dst


def aborting_at_decode(src: Path, dst: Path) -> Path:
    """An F16 norm vector: loads, then ggml aborts in binary_op at the first decode (notes §7.2)."""
    return rewrite(src, dst, tensor=lambda n, a: a.astype(np.float16) if n == "blk.0.attn_norm.weight" else a)


def segfaulting_at_load(src_mamba2_hybrid: Path, dst: Path) -> Path:
    """A Mamba-2 hybrid without its (loader-optional, graph-required) conv bias (notes §7.1)."""
    return rewrite(src_mamba2_hybrid, dst, drop=lambda n: n.endswith("ssm_conv1d.bias"))


def fragile_reader(data: bytes, tmp: Path) -> None:
    """An input check with a planted bug (fuzz inputs must find it): any GGUF version but 3 is a KeyError instead
    of a one-line error."""
    from synth.errors import UserError

    if data[:4] != b"GGUF":
        raise UserError("no GGUF magic")
    if data[4:8] != (3).to_bytes(4, "little"):
        raise KeyError(f"version {int.from_bytes(data[4:8], 'little')}")


def refusing_reader(data: bytes, tmp: Path) -> None:
    """An input check that refuses everything in one line: never a finding."""
    from synth.errors import UserError

    raise UserError("refused")


def impostor(answer: dict):
    """A healthy HTTP server of someone else's on 127.0.0.1 (any GET or POST gets `answer` as JSON): what a worker
    finds on a port another server took first. (server, asked paths); shut it down with server.shutdown()."""
    import http.server
    import json
    import threading

    asked: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 — http.server's name
            asked.append(self.path)
            body = json.dumps(answer).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_POST = do_GET  # noqa: N815

        def log_message(self, *_args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, asked
