"""Turning command-line arguments into what the oracles take: a FIXTURE (a .gguf path, a manifest row or a family
name) into a file, token ids, lists of integers and flash-attention settings."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from synth.errors import UserError
from synth.families import ALIASES, FAMILIES
from synth.make import resolve, with_head_size, write_fixture
from synth.manifest import Row, default_manifest_path, load_manifest
from synth.spec import Knobs

WORKDIR = Path("build") / "fixtures"


def fixture_path(arg: str, workdir: Path = WORKDIR) -> Path:
    """A path to an existing GGUF; or a manifest row or family name: the fixture its manifest recipe describes
    (a family with no row: its defaults), made under workdir."""
    p = Path(arg)
    if p.suffix == ".gguf" or p.exists():
        if not p.is_file():
            raise UserError(f"{arg}: no such fixture file; give a .gguf path, a manifest row or a family name")
        return p
    rows = load_manifest().rows if default_manifest_path().is_file() else {}
    row = rows.get(arg) or next((r for r in rows.values() if r.recipe.get("family") == arg and r.runnable), None)
    if row is not None and row.runnable:
        spec, name = row.spec(), row.key
    elif arg in FAMILIES or arg in ALIASES:
        spec = resolve(arg, Knobs())
        name = spec.family
    else:
        raise UserError(f"{arg!r} is neither a .gguf file, a manifest row nor a family; see `family-certify check` "
                        "and `synth list`")
    out = workdir / f"{name}.gguf"
    write_fixture(spec, out)
    return out


QUANT_HEAD = 64  # a head a whole number of every quantized cache type's blocks, and what its rotation needs
FIXTURE_MAX = 1 << 20  # synth's fixtures stay within a megabyte


def quant_head_fixture(row: Row, workdir: Path = WORKDIR) -> Path | None:
    """The row's fixture with every attention head QUANT_HEAD wide, made under workdir: what a quantized KV cache
    runs on (llama.cpp needs a head a whole number of the type's blocks; its fixtures' heads are 8 or 16 wide).
    None when the family cannot widen its heads, or only past FIXTURE_MAX (then with two layers too, where the
    family takes that and keeps an attention layer: a model twice as wide is four times the weights)."""
    out = workdir / f"{row.key}-heads{QUANT_HEAD}.gguf"
    out.parent.mkdir(parents=True, exist_ok=True)
    for knobs in (row.knobs(), dataclasses.replace(row.knobs(), layers=2)):
        try:
            spec = with_head_size(str(row.recipe["family"]), knobs, QUANT_HEAD)
        except UserError:
            spec = None
        if spec is not None and any(spec.is_attn(i) for i in range(spec.n_layer)) and \
                write_fixture(spec, out) <= FIXTURE_MAX:
            return out
    return None


def parse_tokens(text: str) -> list[int]:
    try:
        toks = [int(x) for x in text.replace(",", " ").split()]
    except ValueError:
        raise UserError(f"--prompt {text!r}: expected token ids, e.g. '1,7,3,12'") from None
    if not toks:
        raise UserError("--prompt is empty; give token ids, e.g. '1,7,3,12'")
    return toks


def prompt_fields(prompt: str | None, prompt_len: int) -> dict[str, object]:
    """--prompt (token ids) and --prompt-len as an oracle config's fields: a given prompt sets the length."""
    toks = tuple(parse_tokens(prompt)) if prompt is not None else ()
    return {"prompt": toks, "prompt_len": len(toks) if toks else prompt_len}


def int_list(text: str, flag: str) -> tuple[int, ...]:
    try:
        vals = tuple(int(x) for x in text.replace(" ", "").split(",") if x)
    except ValueError:
        raise UserError(f"{flag} {text!r}: expected comma-separated integers, e.g. 1,2") from None
    if not vals or any(v < 1 for v in vals):
        raise UserError(f"{flag} {text!r}: expected positive integers, e.g. 1,2")
    return vals


def flash_attn_list(text: str) -> tuple[bool, ...]:
    """--flash-attn off,on → (False, True)."""
    fa = tuple(x.strip() for x in text.split(",") if x.strip())
    if not fa or set(fa) - {"off", "on"}:
        raise UserError(f"--flash-attn {text!r}: use off, on or off,on")
    return tuple(x == "on" for x in fa)
