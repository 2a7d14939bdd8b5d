"""synth: tiny, seeded, deterministic GGUF fixtures that the real llama.cpp loads and runs.

Pure Python (gguf-py + numpy). Knows nothing of targets or fuzz.
"""

from synth.errors import UserError
from synth.spec import Knobs, ModelSpec

__all__ = ["Knobs", "ModelSpec", "UserError"]
