"""Frames (targets/PROTOCOL.md): a reply's bytes raw after its line, or base64 in it from a worker that does not
know frames; the engine reads both the same, through a real pipe, pipelined, larger than the pipe's buffer."""

import shlex
import sys

from targets import as_bytes, open_target

from conftest import ROOT

ECHO = """
import os
from targets.llama_cpp_worker import main_with

class Echo:
    def op_hello(self, req):
        return {"frames": bool(os.environ.get("FAMILY_CERTIFY_FRAMES"))}

    def op_blobs(self, req):
        n = int(req["n"])
        return {"big": bytes(range(256)) * (n // 256) + b"\\n" * (n % 256), "nested": [{"x": b"\\n{}"}, "text"],
                "empty": b"", "n": n}

    def close(self):
        pass

main_with(Echo, llama=False)
"""


def echo_target(frames: bool):
    prog = f"{shlex.quote(sys.executable)} -c {shlex.quote(ECHO)}"
    return open_target(f"cmd:{prog}" if frames else f"cmd:env -u FAMILY_CERTIFY_FRAMES {prog}",
                       env={"PYTHONPATH": str(ROOT)})


def test_frames_and_base64_read_the_same_through_a_pipe_and_in_a_pipeline():
    sizes = [3, 9 << 20, 0, 70_000]  # 9 MiB: more than a pipe holds, so the worker blocks mid-frame
    got = {}
    for frames in (True, False):
        with echo_target(frames) as t:
            assert t.hello().data["frames"] is frames
            replies = t.client.calls([("blobs", {"n": n}) for n in sizes])
            assert [r.ok for r in replies] == [True] * 4
            assert t.call("blobs", n=5).data["n"] == 5  # the stream is clean after the pipeline
            big = replies[1].data["big"]
            assert isinstance(big, bytes) is frames and isinstance(big, str) is not frames
            assert "$frames" not in replies[1].data
            got[frames] = [{"big": as_bytes(r.data["big"]), "x": as_bytes(r.data["nested"][0]["x"]),
                            "text": r.data["nested"][1], "empty": as_bytes(r.data["empty"])} for r in replies]
    assert got[True] == got[False]
    assert [len(g["big"]) for g in got[True]] == sizes and got[True][1]["big"][:3] == b"\x00\x01\x02"
    assert got[True][0]["x"] == b"\n{}" and got[True][0]["empty"] == b""


def test_a_reply_whose_frames_do_not_all_come_is_a_timeout_and_the_worker_is_replaced():
    """A worker that announces 10 bytes of frames and sends 3, then hangs: the call times out (the worker killed),
    it does not block on the missing bytes; the next call gets a fresh worker."""
    prog = ("import json, sys, time\n"
            "req = json.loads(sys.stdin.readline())\n"
            "sys.stdout.buffer.write(json.dumps({'id': req['id'], 'ok': True, 'x': {'$frame': 0},"
            " '$frames': [10]}).encode() + b'\\nabc')\n"
            "sys.stdout.flush()\n"
            "time.sleep(60)\n")
    with open_target(f"cmd:{shlex.quote(sys.executable)} -c {shlex.quote(prog)}", timeout=1.0) as t:
        r = t.hello()
        assert not r.ok and r.failure.kind == "timeout" and "did not finish its answer to 'hello'" in r.failure.message
        assert t.hello().failure.kind == "timeout" and t.restarts == 1
