"""The family registry: one small module per family, each a Family subclass."""

from __future__ import annotations

from synth.errors import UserError
from synth.families.base import Family
from synth.families.falcon_h1 import FalconH1
from synth.families.granitehybrid import GraniteHybrid
from synth.families.jamba import Jamba
from synth.families.kimi_linear import KimiLinear
from synth.families.lfm2 import Lfm2
from synth.families.llama import Llama
from synth.families.mamba import Mamba
from synth.families.mamba2 import Mamba2
from synth.families.qwen2 import Qwen2
from synth.families.qwen3 import Qwen3
from synth.families.qwen3next import Qwen3Next

FAMILIES: dict[str, Family] = {f.name: f for f in (
    Llama(), Qwen2(), Qwen3(),
    Mamba(), Mamba2(),
    Jamba(), GraniteHybrid(), Lfm2(), FalconH1(), Qwen3Next(), KimiLinear(),
)}

# `synth make hybrid`: the hybrid that can express the most (any A/R pattern, per-layer K/V heads, MoE).
ALIASES = {"hybrid": "granitehybrid"}


def get_family(name: str) -> Family:
    fam = FAMILIES.get(ALIASES.get(name, name))
    if fam is None:
        raise UserError(f"unknown family {name!r}; `synth list` shows the families "
                        f"({', '.join(sorted(FAMILIES))}; alias: hybrid)")
    return fam
