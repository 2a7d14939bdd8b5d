"""The worker's native helpers (targets/native.c) against their Python twins, numpy, and each other."""

import numpy as np
import pytest

from targets import native, open_target
from targets.llama_cpp_worker import ggml_base, llama_bindings

pytestmark = pytest.mark.llama


@pytest.fixture(scope="module")
def both():
    L = llama_bindings()
    ggml = ggml_base(L)
    lib = native.native_library()
    assert lib is not None, "the test machine has a C compiler (it built llama.cpp)"
    return [native.Native(lib, ggml, L),
            native.Python(ggml, L)]


@pytest.mark.parametrize("case", ["random", "ties", "nan-late", "nan-first", "all-equal", "neg-inf", "one"])
def test_argmax_is_numpys(both, case):
    rng = np.random.default_rng(7)
    x = rng.standard_normal(1000).astype(np.float32)
    if case == "ties":
        x[[10, 500, 900]] = x.max() + 1
    elif case == "nan-late":
        x[[600, 800]] = np.nan
    elif case == "nan-first":
        x[0] = np.nan
    elif case == "all-equal":
        x[:] = 3.0
    elif case == "neg-inf":
        x[:] = -np.inf
        x[5] = -1e30
    elif case == "one":
        x = x[:1]
    for impl in both:
        assert impl.argmax(x.ctypes.data, x.size) == int(np.argmax(x)), impl.kind


def test_the_library_is_built_once_and_a_missing_compiler_falls_back(tmp_path, monkeypatch):
    monkeypatch.setenv("FAMILY_CERTIFY_CACHE", str(tmp_path))
    first = native.native_library()
    assert first is not None and first.is_file() and first.parent.parent == tmp_path
    stamp = first.stat().st_mtime_ns
    monkeypatch.setenv("CC", "false")  # already built: no compiler needed
    assert native.native_library() == first and first.stat().st_mtime_ns == stamp
    first.unlink()
    assert native.native_library() is None  # a compiler that fails: the worker uses the Python helpers


def test_native_and_python_workers_return_the_same_bytes(fixtures):
    path = str(fixtures("qwen3next", layers=8, period=4))
    out = []
    for env in ({}, {"FAMILY_CERTIFY_NO_NATIVE": "1"}):
        with open_target(env=env) as t:
            kind = t.hello().data["helpers"]
            assert t.load(path, n_seq_max=2).ok
            one = t.decode([3, 1, 4, 1, 5], seq=[0, 0, 1, 1, 1], pos=[0, 1, 0, 1, 2], logits="all",
                           capture=[0, 3, 7])
            assert t.reset().ok
            two = t.script([{"tokens": [2, 7], "seq": [0, 1], "pos": [0, 0], "logits": "all", "capture": [7]},
                            {"tokens": ["argmax@1"], "seq": 1, "pos": [1], "logits": "all", "capture": [2]},
                            {"tokens": ["argmax@0"], "seq": 1, "pos": [2], "logits": "all", "capture": [5, 7]}])
            assert one.ok and two.ok
            out.append((kind, one.data, two.data["results"]))
    (k1, a1, s1), (k2, a2, s2) = out
    assert (k1, k2) == ("native", "python")
    assert a1["argmax"] == a2["argmax"] == [int(i) for i in np.argmax(a1["logits"], axis=1)]
    assert a1["logits"].tobytes() == a2["logits"].tobytes()
    assert {k: v.tobytes() for k, v in a1["captures"].items()} == {k: v.tobytes() for k, v in a2["captures"].items()}
    assert a1["captures"][7].shape == (5, 32)
    for r1, r2 in zip(s1, s2, strict=True):
        assert r1["tokens"] == r2["tokens"] and r1["logits"].tobytes() == r2["logits"].tobytes()
        assert {k: v.tobytes() for k, v in r1["captures"].items()} == \
            {k: v.tobytes() for k, v in r2["captures"].items()}


def test_native_capture_of_a_layer_the_graph_lacks_is_a_bad_request(fixtures, llama):
    assert llama.load(str(fixtures("llama"))).ok
    r = llama.decode([1, 2], capture=[4095])
    assert not r.ok and r.failure.error_kind == "bad_request" and "l_out-4095" in r.failure.message
    r = llama.decode([1, 2], capture=[4096])
    assert not r.ok and r.failure.error_kind == "bad_request"
    assert llama.decode([1, 2], capture=[0]).ok  # and the worker carries on



def test_both_logs_give_the_same_load_error(fixtures, tmp_path):
    """A load failure's message comes from llama.cpp's log, kept in C or in Python: the same line."""
    bad = tmp_path / "trunc.gguf"
    bad.write_bytes(fixtures("llama").read_bytes()[:300])
    messages = []
    for env in ({}, {"FAMILY_CERTIFY_NO_NATIVE": "1"}):
        with open_target(env=env) as t:
            r = t.load(str(bad))
            assert not r.ok and r.failure.error_kind == "load_failed"
            messages.append(r.failure.message)
    assert messages[0] == messages[1] and "gguf_init_from_reader" in messages[0]  # a line from the log
