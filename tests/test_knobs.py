"""One knob table (synth.spec.KNOBS): the Knobs dataclass, `synth make`'s options, the manifest's recipe keys,
the refusal messages and the shrinker's re-made fixtures all read it, so a knob is added in one place."""

import inspect
from dataclasses import fields

import pytest

from fuzz.repro.bundle import Case, _smaller_model
from synth.cli import make
from synth.families import get_family
from synth.make import write_fixture
from synth.manifest import RECIPE_KNOBS
from synth.spec import FLAG, KNOB, KNOBS, Knobs, ModelSpec


def test_the_cli_the_manifest_and_the_dataclass_speak_the_table():
    options = set(inspect.signature(make).parameters) - {"family", "row", "manifest", "out", "seed", "as_json"}
    assert options == set(KNOB)
    assert {f.name for f in fields(Knobs)} == set(KNOB) | {"seed"}
    assert RECIPE_KNOBS == set(KNOB) | {"seed"}
    assert FLAG["q_lora_rank"] == "--q-lora-rank" and all(FLAG[k.name] == k.flag for k in KNOBS)
    assert {k.spec_field for k in KNOBS if k.spec_field} <= {f.name for f in fields(ModelSpec)}


def test_a_fixture_re_made_with_one_layer_fewer_keeps_every_other_knob(tmp_path):
    spec = get_family("deepseek2").resolve(Knobs(layers=4, q_lora_rank=8, kv_lora_rank=16, experts=4, embd=48))
    case = Case("sweep", tmp_path / "x.gguf", [2], {}, "llama-cpp")
    write_fixture(spec, case.fixture)
    made = _smaller_model(case, spec, tmp_path / "y.gguf", drop_first=1)
    assert made is not None
    new_case, new, _ = made
    assert new_case.cuts == [1] and new.n_layer == 3
    for k in KNOBS:
        if k.spec_field:
            assert getattr(new, k.spec_field) == getattr(spec, k.spec_field), k.name
    # a width halved: that knob alone changes (MLA's head dim is its own: it stays)
    _, narrow, what = _smaller_model(case, spec, tmp_path / "z.gguf", embd=24)
    assert what == "embd 24" and narrow.n_embd == 24 and narrow.head_dim == spec.head_dim == 16
    assert [getattr(narrow, k.spec_field) == getattr(spec, k.spec_field) for k in KNOBS if k.spec_field] == \
        [k.name != "embd" for k in KNOBS if k.spec_field]
    llama = get_family("llama").resolve(Knobs(layers=2, embd=32, heads=4))
    write_fixture(llama, tmp_path / "u.gguf")
    _, half, _ = _smaller_model(Case("sweep", tmp_path / "u.gguf", [1], {}, "llama-cpp"), llama, tmp_path / "v.gguf",
                                embd=16)
    assert (half.n_embd, half.head_dim) == (16, 4)  # a derived head dim follows the width
    assert _smaller_model(case, spec, tmp_path / "w.gguf", drop_first=2) is None  # the cut would leave the model


@pytest.mark.parametrize("knob", [k.name for k in KNOBS if k.name not in get_family("mamba").knobs | {"dtype"}])
def test_a_knob_a_family_cannot_express_is_refused_naming_its_flag(knob):
    fam = get_family("mamba")
    value = {"pattern": "RA", "kv_heads": (1,), "indexer": True}.get(knob, 2)
    with pytest.raises(Exception) as e:
        fam.resolve(Knobs(**{knob: value}))
    assert FLAG[knob] in str(e.value) and "it supports:" in str(e.value)


def test_uneven_kv_widths_survive_a_dropped_layer(tmp_path):
    """B5 needs uneven K/V widths: a dense family that has them (laguna) keeps them when the shrinker drops a layer."""
    spec = get_family("laguna").resolve(Knobs(layers=4, kv_heads=(1, 2, 4, 2)))
    _, new, _ = _smaller_model(Case("handoff", tmp_path / "x.gguf", [2], {}, "llama-cpp"), spec,
                               tmp_path / "y.gguf", drop_first=1)
    assert new.n_head_kv == (2, 4, 2)
