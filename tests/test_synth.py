"""Spec resolution, knob validation and byte-determinism (pure Python, no llama.cpp)."""

import hashlib

import pytest

from synth.errors import UserError
from synth.families import FAMILIES, get_family
from synth.make import resolve, with_head_size, write_fixture
from synth.spec import Knobs, parse_pattern


def digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_same_spec_same_bytes(tmp_path, family):
    a, b, c = tmp_path / "a.gguf", tmp_path / "b.gguf", tmp_path / "c.gguf"
    write_fixture(resolve(family, Knobs(seed=3)), a)
    write_fixture(resolve(family, Knobs(seed=3)), b)
    write_fixture(resolve(family, Knobs(seed=4)), c)
    assert digest(a) == digest(b)
    assert digest(a) != digest(c)


def test_hybrid_alias_and_period():
    spec = resolve("hybrid", Knobs(period=4))
    assert spec.family == "granitehybrid"
    assert spec.pattern == "RRRARRRA"


def test_natural_phase_and_offset():
    assert resolve("qwen3next", Knobs(layers=8, period=4)).pattern == "RRRARRRA"
    assert resolve("jamba", Knobs(layers=8, period=4)).pattern == "RRARRRAR"  # Jamba: offset period/2
    assert resolve("kimi-linear", Knobs(layers=6, period=3, offset=0)).pattern == "ARRARR"


def test_pattern_spellings():
    assert parse_pattern("RRRA RRRA") == parse_pattern("r,r,r,a,r,r,r,a") == "RRRARRRA"
    assert parse_pattern("A R R A") == "ARRA"


def test_kv_heads_list_defines_the_pattern():
    spec = resolve("lfm2", Knobs(kv_heads=(2, 0, 1, 0)))
    assert spec.pattern == "ARAR" and spec.n_head_kv == (2, 0, 1, 0)


def test_qwen3next_expresses_any_pattern_through_its_array():
    fam = get_family("qwen3next")
    kv, _ = fam.to_gguf(resolve("qwen3next", Knobs(pattern="ARRARR")))
    assert kv["qwen3next.attention.recurrent_layers"].value == [False, True, True, False, True, True]
    kv, _ = fam.to_gguf(resolve("qwen3next", Knobs(layers=8, period=2)))
    assert kv["qwen3next.full_attention_interval"].value == 2
    assert "qwen3next.attention.recurrent_layers" not in kv


@pytest.mark.parametrize("family,knobs,words", [
    ("llama", Knobs(period=4), ["llama", "--period", "supports"]),
    ("llama", Knobs(kv_heads=(2, 1, 2, 2)), ["llama", "--kv-heads", "layer 0"]),
    ("qwen3", Knobs(kv_heads=(2, 1)), ["qwen3", "--kv-heads"]),
    ("falcon-h1", Knobs(pattern="ARRA"), ["falcon-h1", "--pattern"]),
    ("mamba", Knobs(heads=4), ["mamba", "--heads"]),
    ("qwen3next", Knobs(layers=4, kv_heads=(1, 0, 2, 0)), ["qwen3next", "--kv-heads"]),
    ("kimi-linear", Knobs(kv_heads=(1,)), ["kimi-linear", "--kv-heads"]),
    ("jamba", Knobs(pattern="RRRR"), ["jamba", "attention"]),
    ("jamba", Knobs(pattern="AAAA"), ["jamba", "recurrent"]),
    ("jamba", Knobs(period=4, offset=4), ["--offset"]),
    ("lfm2", Knobs(pattern="ARRA", kv_heads=(2, 2, 0, 2)), ["--kv-heads", "layer 1"]),
    ("granitehybrid", Knobs(kv_heads=(3, 0)), ["--kv-heads", "divide"]),
    ("qwen3next", Knobs(experts=0), ["qwen3next", "--experts"]),
])
def test_unexpressible_knobs_are_one_line_errors(family, knobs, words):
    with pytest.raises(UserError) as e:
        resolve(family, knobs)
    msg = str(e.value)
    assert "\n" not in msg
    for w in words:
        assert w in msg


def test_unknown_family():
    with pytest.raises(UserError, match="unknown family"):
        get_family("gpt5")


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_tensor_writer_writes_gguf_pys_bytes(tmp_path, family, monkeypatch):
    """write_gguf writes tensor data in one buffered write; gguf-py's own writer must produce the same file."""
    from synth import gguf_io

    spec = resolve(family, Knobs())
    write_fixture(spec, tmp_path / "ours.gguf")
    monkeypatch.setattr(gguf_io, "_write_tensors", lambda w: w.write_tensors_to_file())
    write_fixture(spec, tmp_path / "gguf-py.gguf")
    assert (tmp_path / "ours.gguf").read_bytes() == (tmp_path / "gguf-py.gguf").read_bytes()


def test_large_tensors_write_the_same_bytes_and_shared_stages_share_their_globals(tmp_path, monkeypatch):
    """Tensors of 1 MiB and more are written from their own memory, the same bytes. A shared stage is a two-file
    split: its layers in its own file, the model's global tensors (embedding, head, output norm) in one file written
    once that every shared stage links to as its second file — each tensor the whole stage's bytes."""
    import numpy as np

    from synth import gguf_io
    from synth.gguf_io import GGUFFile
    from synth.stage import SourceModel, stage_path

    spec = resolve("llama", Knobs(layers=3, vocab=8192, embd=64))  # token_embd and output: 2 MiB of f32 each
    write_fixture(spec, tmp_path / "ours.gguf")
    with monkeypatch.context() as m:
        m.setattr(gguf_io, "_write_tensors", lambda w: w.write_tensors_to_file())
        write_fixture(spec, tmp_path / "gguf-py.gguf")
    assert (tmp_path / "ours.gguf").read_bytes() == (tmp_path / "gguf-py.gguf").read_bytes()
    src = SourceModel(tmp_path / "ours.gguf")
    for a, b in ((0, 1), (1, 3)):
        whole = src.slice(tmp_path / "whole.gguf", a, b) and GGUFFile(tmp_path / "whole.gguf")
        first = stage_path(tmp_path, tmp_path / "ours.gguf", a, b, shared=True)
        st = src.slice(first, a, b, shared=True)
        second = first.with_name(first.name.replace("-00001-of-00002", "-00002-of-00002"))
        assert second.is_symlink() and second.resolve() == (tmp_path / "ours.globals.gguf").resolve()
        assert st.notes[-1] == "shared: output.weight, output_norm.weight, token_embd.weight in ours.globals.gguf " \
                               "(the split's second file)"
        one, two = GGUFFile(first), GGUFFile(second)
        assert (one.kv["split.no"], one.kv["split.count"], one.kv["split.tensors.count"], two.kv["split.no"]) == \
            (0, 2, len(whole.tensors), 1)
        assert set(one.tensors) | set(two.tensors) == set(whole.tensors) and not set(one.tensors) & set(two.tensors)
        assert first.stat().st_size < 400_000  # its layers only: 4 MiB of embedding and head shared
        for name in whole.tensors:
            assert np.array_equal((two if name in two.tensors else one).tensor_data(name), whole.tensor_data(name))
    assert src.shared_bytes == (tmp_path / "ours.globals.gguf").stat().st_size > 4 << 20  # written once


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_our_gguf_reader_reads_what_gguf_py_reads(tmp_path, family):
    """synth.gguf_io parses GGUF itself (gguf-py's reader costs 10+ ms a file); same values, types, tensor bytes."""
    import gguf
    import numpy as np

    from synth.gguf_io import VT, GGUFFile

    path = tmp_path / "f.gguf"
    write_fixture(resolve(family, Knobs(dtype="q4_0")), path)
    ours, theirs = GGUFFile(path), gguf.GGUFReader(path, "r")
    fields = {f.name: f for f in theirs.fields.values() if not f.name.startswith("GGUF.")}
    assert set(ours.kv) == set(fields)
    for name, f in fields.items():
        t0 = f.types[0]
        assert ours.kv_types[name][0] == t0
        if t0 == VT.STRING:
            assert ours.kv[name] == bytes(f.parts[f.data[0]]).decode()
        elif t0 != VT.ARRAY:
            assert ours.kv[name] == f.parts[f.data[0]][0]
        elif f.types[-1] != VT.STRING:
            assert ours.kv[name] == [f.parts[i][0] for i in f.data]
        else:
            assert ours.kv[name] == [bytes(f.parts[i]).decode() for i in f.data]
    assert [t.name for t in ours.reader.tensors] == [t.name for t in theirs.tensors]
    for a, b in zip(ours.reader.tensors, theirs.tensors, strict=True):
        assert (a.shape, a.tensor_type, a.n_bytes) == (tuple(int(x) for x in b.shape), b.tensor_type, int(b.n_bytes))
        assert a.data.shape == b.data.shape and a.data.dtype == b.data.dtype
        assert np.asarray(a.data).tobytes() == np.asarray(b.data).tobytes()


def test_a_truncated_gguf_is_a_one_line_user_error(tmp_path):
    from synth.gguf_io import GGUFFile

    path = tmp_path / "f.gguf"
    write_fixture(resolve("llama", Knobs()), path)
    data = path.read_bytes()
    for cut in (0, 3, 30, 200, len(data) - 10):
        (tmp_path / "t.gguf").write_bytes(data[:cut])
        with pytest.raises(UserError, match="not a readable GGUF file"):
            GGUFFile(tmp_path / "t.gguf")


def test_a_family_widens_its_heads_by_the_first_knob_that_gets_there():
    """Heads 64 wide (what a quantized KV cache needs): by the head size where the family takes one (llama, deepseek2:
    the width unchanged), else two heads of a model twice as wide (qwen2, gpt2: their head size is the width over
    the heads); None for a family without attention heads (mamba)."""
    got = {f: with_head_size(f, Knobs(), 64) for f in ("llama", "deepseek2", "qwen2", "gpt2", "mamba")}
    assert {f: s and (s.head_dim, s.n_head, s.n_embd) for f, s in got.items()} == {
        "llama": (64, 4, 32), "deepseek2": (64, 4, 32), "qwen2": (64, 2, 128), "gpt2": (64, 2, 128), "mamba": None}
    assert resolve("llama").head_dim == 8  # (the default fixture's, which no quantized cache divides)

