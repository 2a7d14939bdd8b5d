"""A fake skippy: a test double of Mesh-LLM/mesh-llm's split-serving runtime, for contract tests of our skippy
adapter (targets/skippy.py). skippy itself cannot be built here.

It is a fake everywhere — in its version line, its logs and its reports — and it never computes model math
itself: every stage runs the real pinned llama.cpp through our own worker (`targets.open_target("llama-cpp")`),
each stage in its own processes. What it imitates is skippy's *surface*, as read from the public sources
(Mesh-LLM/mesh-llm crates/skippy-cli, skippy-correctness; see docs/skippy.md and targets/skippy.py):

  skippy --version                        one line, a fake version and commit, the real llama.cpp pin
  skippy serve-openai --model-path M ...  the whole model behind skippy's OpenAI routes (/v1/models,
                                          /v1/completions, /health, /readyz) and error-body shape
  skippy serve-binary --config STAGE.json one stage of a split (skippy's StageConfig JSON); stage 0 also serves
                                          the OpenAI routes with --openai-bind-addr. Stages talk to each other
                                          over the fake's own JSON-lines wire, not skippy's binary protocol
  skippy-correctness LANE ...             single-step, chain, split-scan and state-handoff reports in skippy's
                                          report shapes, mismatch and error exits as skippy's

`FAKE_SKIPPY_BUG` re-creates one bug class at a time (common.BUGS), so the adapter's lanes can prove they catch it.
Entry points: `python -m tests.fake_skippy.skippy`, `python -m tests.fake_skippy.correctness`, or the shims in
tests/fake_skippy/bin (named `skippy` and `skippy-correctness`, as the real binaries).
"""
