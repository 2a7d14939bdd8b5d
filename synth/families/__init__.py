"""The family registry. Every module in this package that defines a Family subclass with a `name` is a
family; adding a family is adding a module (base and blocks hold shared machinery)."""

from __future__ import annotations

import importlib
import pkgutil

from synth.errors import UserError
from synth.families.base import Family

_SHARED = {"base", "blocks"}


def _discover() -> dict[str, Family]:
    found: dict[str, Family] = {}
    for m in pkgutil.iter_modules(__path__):
        if m.name in _SHARED or m.name.startswith("_"):
            continue
        mod = importlib.import_module(f"{__name__}.{m.name}")
        for obj in vars(mod).values():
            if isinstance(obj, type) and issubclass(obj, Family) and obj.__module__ == mod.__name__ \
                    and "name" in vars(obj):
                if obj.name in found:
                    raise RuntimeError(f"two family modules define {obj.name!r}")
                found[obj.name] = obj()
    return dict(sorted(found.items()))


FAMILIES: dict[str, Family] = _discover()

# `synth make hybrid`: the hybrid that can express the most (any A/R pattern, per-layer K/V heads, MoE).
ALIASES = {"hybrid": "granitehybrid"}


def family_for_arch(arch: str) -> Family | None:
    """The family module that declares this llama.cpp arch (for per-arch stage contracts)."""
    return next((f for f in FAMILIES.values() if f.arch_name == arch), None)


def get_family(name: str) -> Family:
    fam = FAMILIES.get(ALIASES.get(name, name))
    if fam is None:
        raise UserError(f"unknown family {name!r}; `synth list` shows the families "
                        f"({', '.join(sorted(FAMILIES))}; alias: hybrid)")
    return fam
