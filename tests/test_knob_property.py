"""Any knob combination through the real CLI: either a file the pinned llama.cpp loads and decodes, or exit 2 with
one line and nothing written. Hypothesis draws legal and illegal values alike."""

import contextlib
import io

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from synth.cli import app
from synth.cliutil import run
from synth.families import FAMILIES

pytestmark = pytest.mark.llama

VALUES = {
    "--layers": st.integers(-1, 9), "--period": st.integers(-1, 6), "--offset": st.integers(-1, 5),
    "--embd": st.sampled_from([0, 7, 16, 24, 32, 48, 64]), "--heads": st.integers(0, 8),
    "--head-dim": st.sampled_from([0, 1, 3, 8, 16, 24, 64]), "--ff": st.sampled_from([0, 1, 16, 64]),
    "--vocab": st.sampled_from([2, 16, 64]), "--experts": st.integers(0, 6), "--experts-used": st.integers(0, 6),
    "--shared-experts": st.integers(0, 2), "--leading-dense": st.integers(0, 4),
    "--q-lora-rank": st.sampled_from([0, 8, 16]), "--kv-lora-rank": st.sampled_from([0, 8, 16]),
    "--indexer-top-k": st.integers(0, 8),
    "--dtype": st.sampled_from(["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "mxfp4", "q4_k", "iq4_nl",
                                "iq1_m", "x"]),
    "--pattern": st.text(alphabet="ARX ", min_size=1, max_size=8),
    "--kv-heads": st.lists(st.integers(0, 4), min_size=1, max_size=8).map(lambda v: ",".join(map(str, v))),
}


@st.composite
def argvs(draw):
    family = draw(st.sampled_from(sorted(FAMILIES)))
    flags = draw(st.lists(st.sampled_from(sorted(VALUES)), max_size=4, unique=True))
    argv = [family]
    for f in flags:
        argv += [f, str(draw(VALUES[f]))]
    if draw(st.booleans()):
        argv.append(draw(st.sampled_from(["--indexer", "--no-indexer"])))
    return argv + ["--seed", str(draw(st.integers(0, 9)))]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(argv=argvs())
# found by HYPOTHESIS_PROFILE=explore: a traceback instead of exit 2, or a file llama.cpp aborts on
@example(argv=["kimi-linear", "--kv-lora-rank", "0", "--seed", "0"])
@example(argv=["kimi-linear", "--leading-dense", "0", "--ff", "1", "--seed", "0"])
@example(argv=["gemma4", "--heads", "1", "--seed", "0"])
def test_knobs_make_a_running_file_or_exit_2_before_writing(llama, tmp_path, argv):
    out = tmp_path / "x.gguf"
    out.unlink(missing_ok=True)
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = run(app, "synth", ["make", *argv, "-o", str(out)])
    if rc == 2:
        assert not out.exists(), argv
        lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("synth: error:"), (argv, err.getvalue())
        return
    assert rc == 0, (argv, rc, err.getvalue())
    loaded = llama.load(str(out))
    assert loaded.ok, (argv, loaded.failure)
    gen = llama.generate([1, 2, 3, 4], 4)
    assert gen.ok, (argv, gen.failure)
