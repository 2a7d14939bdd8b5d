"""Turning a command-line FIXTURE argument (a .gguf path or a family name) into a file."""

from __future__ import annotations

from pathlib import Path

from synth.errors import UserError
from synth.families import ALIASES, FAMILIES
from synth.make import resolve, write_fixture
from synth.manifest import default_manifest_path, load_manifest
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


def parse_tokens(text: str) -> list[int]:
    try:
        toks = [int(x) for x in text.replace(",", " ").split()]
    except ValueError:
        raise UserError(f"--prompt {text!r}: expected token ids, e.g. '1,7,3,12'") from None
    if not toks:
        raise UserError("--prompt is empty; give token ids, e.g. '1,7,3,12'")
    return toks
