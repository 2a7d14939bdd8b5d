"""A test's adversary, run behind cmd: — the llama.cpp worker whose exports lie: every full sequence export it
sends has the first cache's K rows zeroed (a runtime whose wire format drops what it should carry), but an import
of a blob it sent restores the true state it kept. Its own hand-offs therefore look as clean as llama.cpp's, and
its claim that the restored caches hold the same rows holds for its own blobs. Only a check that does not trust its
exports — llama.cpp continuing from them — shows the lie."""

import base64
import hashlib
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from targets.kvstate import HEADER, cache_layers  # noqa: E402
from targets.mutants import Mutant, main_with, sequence_blob  # noqa: E402


def zero_k_rows(full: bytes) -> bytes:
    layers, _ = cache_layers(full, HEADER)
    b = bytearray(full)
    for layer in layers:
        off, cells, row = layer["k"]
        b[off:off + cells * row] = bytes(cells * row)
    return bytes(b)


# the true states it kept, by the sha256 of the blob it sent: shared by all its processes (a hand-off imports into
# another worker than the one that exported)
KEPT = Path(os.environ.get("STASHED_EXPORTS_DIR") or Path(tempfile.gettempdir()) / "stashed-exports")


class StashedExports(Mutant):
    def op_state_get(self, req: dict) -> dict:
        out = super().op_state_get(req)
        if sequence_blob(req) and "data" in out:
            sent = zero_k_rows(out["data"])
            KEPT.mkdir(parents=True, exist_ok=True)
            (KEPT / hashlib.sha256(sent).hexdigest()).write_bytes(out["data"])
            out["data"] = sent
        return out

    def op_state_set(self, req: dict) -> dict:
        kept = KEPT / hashlib.sha256(base64.b64decode(req.get("data", ""))).hexdigest()
        if kept.is_file():
            req = {**req, "data": base64.b64encode(kept.read_bytes()).decode()}
        return super().op_state_set(req)


if __name__ == "__main__":
    main_with(StashedExports)
