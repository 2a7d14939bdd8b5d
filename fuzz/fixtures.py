"""Turning a command-line FIXTURE argument (a .gguf path or a family name) into a file."""

from __future__ import annotations

from pathlib import Path

from synth.errors import UserError
from synth.families import ALIASES, FAMILIES
from synth.make import resolve, write_fixture
from synth.spec import Knobs

WORKDIR = Path("build") / "fixtures"


def fixture_path(arg: str, workdir: Path = WORKDIR) -> Path:
    """A path to an existing GGUF, or a family name: its default fixture is made under workdir."""
    p = Path(arg)
    if p.suffix == ".gguf" or p.exists():
        if not p.is_file():
            raise UserError(f"{arg}: no such fixture file; give a .gguf path or a family name (`synth list`)")
        return p
    if arg in FAMILIES or arg in ALIASES:
        spec = resolve(arg, Knobs())
        out = workdir / f"{spec.family}.gguf"
        write_fixture(spec, out)
        return out
    raise UserError(f"{arg!r} is neither a .gguf file nor a family; see `synth list`")


def parse_tokens(text: str) -> list[int]:
    try:
        toks = [int(x) for x in text.replace(",", " ").split()]
    except ValueError:
        raise UserError(f"--prompt {text!r}: expected token ids, e.g. '1,7,3,12'") from None
    if not toks:
        raise UserError("--prompt is empty; give token ids, e.g. '1,7,3,12'")
    return toks
