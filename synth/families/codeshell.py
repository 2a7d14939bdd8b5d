"""codeshell: CodeShell. llama.cpp builds it with StarCoder2's loader requirements and graph (LayerNorm, full NEOX
RoPE, GELU FFN; attn_output and FFN biases required, Q/K/V biases optional and not emitted), so the fixture is
StarCoder2's under CodeShell's arch string."""

import gguf

from synth.families.starcoder2 import StarCoder2


class CodeShell(StarCoder2):
    name = "codeshell"
    arch = gguf.MODEL_ARCH.CODESHELL
    summary = "CodeShell (tier 3): LayerNorm, NEOX RoPE, GELU, required output biases"
