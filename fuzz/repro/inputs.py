"""`fuzz inputs KIND`: coverage-guided fuzzing (atheris: libFuzzer over Python coverage) of this toolkit's own
input boundary. Whatever the bytes of a GGUF file, a manifest, a repro bundle or a layer package's manifest,
reading them must either work or
raise UserError — which every command turns into exit code 2 and one line. Any other exception is a finding: the
input that raised it is saved, and the command exits 1.

Run `python -m fuzz.repro.inputs KIND [libFuzzer flags] CORPUS_DIR` to drive atheris directly; `fuzz inputs` builds a
seed corpus (fixtures synth makes, the manifest, the committed bundles, a package), runs it in a child process
for a fixed number of runs and seed (same seed, same inputs) or a time budget, and reports.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

from fuzz.engine.progress import Progress
from synth.errors import UserError

ROOT = Path(__file__).resolve().parents[2]
RUN_COUNTER = re.compile(r"^#(\d+)\s")  # libFuzzer's status lines: "#4096	pulse  cov: ..."
KINDS = ("gguf", "manifest", "bundle", "package")


# ---- the checks: one input in, UserError or nothing out -----------------------------------------------------

def check_gguf(data: bytes, tmp: Path) -> None:
    """What `synth inspect` and `synth slice` do with a file: read it, inspect it, cut a stage from it."""
    from synth.inspect import inspect_file
    from synth.stage import SourceModel, Unsupported

    path = tmp / "in.gguf"
    path.write_bytes(data)
    info = inspect_file(str(path))
    try:
        SourceModel(path).slice(tmp / "stage.gguf", 0, max(1, info.n_layer // 2))
    except Unsupported:
        pass  # a stage llama.cpp cannot express: reported as unsupported, not an error


def check_manifest(data: bytes, tmp: Path) -> None:
    """What `family-certify check` does: parse and validate every row, recipes included."""
    from synth.manifest import load_manifest

    path = tmp / "family_tiers.toml"
    path.write_bytes(data)
    for row in load_manifest(path).rows.values():
        row.spec()


def check_bundle(data: bytes, tmp: Path) -> None:
    """What `fuzz replay` does before it runs anything: read and check bundle.json next to its fixture."""
    from fuzz.repro.bundle import load_case

    d = tmp / "bundle"
    d.mkdir(exist_ok=True)
    fixture = tmp / "fixture.gguf"
    if fixture.exists():
        shutil.copyfile(fixture, d / "fixture.gguf")
    (d / "bundle.json").write_bytes(data)
    load_case(d)


def check_package(data: bytes, tmp: Path) -> None:
    """What `synth materialize` does: read model-package.json (beside the package's real files) and assemble the
    stage of its first layers."""
    from synth.package import materialize_stage, read_manifest
    from synth.stage import Unsupported, parse_range

    pkg = tmp / "package"
    (pkg / "model-package.json").write_bytes(data)
    a, b = parse_range("0:1", read_manifest(pkg)["layer_count"])
    try:
        materialize_stage(pkg, a, b, tmp / "stage.gguf")
    except Unsupported:
        pass


CHECKS: dict[str, Callable[[bytes, Path], None]] = {"gguf": check_gguf, "manifest": check_manifest,
                                                    "bundle": check_bundle, "package": check_package}


def resolve_check(kind: str) -> Callable[[bytes, Path], None]:
    """A kind, or module:function (a check of your own, e.g. to test this harness)."""
    if kind in CHECKS:
        return CHECKS[kind]
    mod, _, fn = kind.partition(":")
    if not fn:
        raise UserError(f"unknown input kind {kind!r}; kinds: {', '.join(KINDS)} (or module:function)")
    try:
        return getattr(importlib.import_module(mod), fn)
    except (ImportError, AttributeError) as e:
        raise UserError(f"input check {kind!r} not found ({e})") from None


# ---- seeds ----------------------------------------------------------------------------------------------------

def seed_corpus(kind: str, out: Path, work: Path) -> None:
    """Valid inputs of the kind to start from; for bundles also the fixture each mutated bundle.json sits beside."""
    from synth.make import resolve, write_fixture
    from synth.spec import Knobs

    out.mkdir(parents=True, exist_ok=True)
    small = [("llama", Knobs(layers=2)), ("jamba", Knobs(layers=4, period=2)), ("qwen3", Knobs(layers=2, dtype="q8_0"))]
    if kind == "gguf" or kind not in CHECKS:
        for fam, knobs in small:
            write_fixture(resolve(fam, knobs), out / f"{fam}.gguf")
    elif kind == "manifest":
        shutil.copyfile(ROOT / "family_tiers.toml", out / "family_tiers.toml")
    elif kind == "package":
        from synth.package import write_package

        write_fixture(resolve(*small[1]), work / "model.gguf")
        write_package(work / "model.gguf", work / "package")
        shutil.copyfile(work / "package" / "model-package.json", out / "model-package.json")
    elif kind == "bundle":
        fixture = work / "fixture.gguf"
        write_fixture(resolve(*small[0]), fixture)
        sha = hashlib.sha256(fixture.read_bytes()).hexdigest()
        for i, b in enumerate(sorted((ROOT / "corpora" / "repros").glob("*/bundle.json"))):
            data = json.loads(b.read_text())
            data.update(fixture="fixture.gguf", fixture_sha256=sha)
            (out / f"bundle-{i}.json").write_text(json.dumps(data, indent=1, sort_keys=True))


# ---- running atheris ------------------------------------------------------------------------------------------

def fuzz_inputs(kind: str, *, runs: int, seed: int, out: Path, max_len: int = 65536, seconds: int | None = None,
                timeout: float = 3600) -> tuple[int, list[Path], str]:
    """Run atheris over the kind's seed corpus in a child process, for `runs` inputs or `seconds` (whichever ends
    first): (exit code, crash inputs saved, its output)."""
    resolve_check(kind)
    out = out.resolve()  # the child runs in the checkout
    out.mkdir(parents=True, exist_ok=True)
    before = set(_findings(out))
    with tempfile.TemporaryDirectory(prefix="fuzz-inputs-") as d:
        work, corpus = Path(d), Path(d) / "corpus"
        seed_corpus(kind, corpus, work)
        cmd = [sys.executable, "-m", "fuzz.repro.inputs", kind, f"-runs={runs}", f"-seed={seed}", f"-max_len={max_len}",
               f"-artifact_prefix={out}/", "-print_final_stats=1", str(corpus)]
        if seconds:
            cmd.insert(-1, f"-max_total_time={seconds}")
        rc, log = _run_fuzzer(cmd, runs, timeout=max(timeout, 2 * (seconds or 0)),
                              env={**os.environ, "FAMILY_CERTIFY_INPUTS_WORK": str(work)})
    return rc, [f for f in _findings(out) if f not in before], log


def fuzz_command(kind: str, *, runs: int, seed: int, out: Path, seconds: int | None) -> int:
    """`fuzz inputs`: its arguments checked, the fuzzer run, its verdict printed in one line; the exit code."""
    if kind not in KINDS:
        raise UserError(f"input kind {kind!r}: use one of {', '.join(KINDS)}")
    if runs < 1 or seed < 0 or (seconds is not None and seconds < 1):
        raise UserError(f"--runs {runs} / --seed {seed} / --seconds {seconds}: runs and seconds must be at least 1, "
                        "the seed at least 0")
    rc, crashes, log = fuzz_inputs(kind, runs=runs, seed=seed, out=out, seconds=seconds)
    done = next((ln for ln in reversed(log.splitlines()) if ln.startswith("Done ")), "")
    if crashes:
        what = {"oom": "ran out of memory", "timeout": "took too long", "leak": "leaked memory"}.get(
            crashes[0].name.split("-")[0])
        exc = what or next((ln for ln in log.splitlines() if ln and not ln.startswith(("INFO", "#", " ", "="))
                            and ("Error" in ln or "Exception" in ln)), "an exception")
        print(f"FINDING: {exc}; input saved: {crashes[0]} (replay: python -m fuzz.repro.inputs {kind} {crashes[0]})")
        return 1
    if rc != 0:
        raise UserError(f"the fuzzer stopped with exit code {rc} and no saved input: {log.strip().splitlines()[-1:]}")
    print(f"pass: {kind}: {done or f'{runs} runs'}; every input read or refused in one line")
    return 0


def _run_fuzzer(cmd: list[str], runs: int, *, timeout: float, env: dict[str, str]) -> tuple[int, str]:
    """The child's exit code and output; on a terminal a bar follows libFuzzer's `#N` run counter. A child still
    running after `timeout` seconds is killed (its exit code then says so)."""
    lines: list[str] = []
    with subprocess.Popen(cmd, cwd=str(ROOT), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env=env) as p, Progress(runs, "inputs") as bar:
        watchdog = threading.Timer(timeout, p.kill)
        watchdog.start()
        try:
            bar.working(f"fuzz inputs {cmd[3]}")
            for line in p.stdout:
                lines.append(line)
                m = RUN_COUNTER.match(line)
                if m:
                    bar.at(int(m.group(1)))
            rc = p.wait()
        finally:
            watchdog.cancel()
    return rc, "".join(lines)


def _findings(out: Path) -> list[Path]:
    """Inputs libFuzzer saved: one that raised (crash-), ran out of memory (oom-), time (timeout-) or leaked."""
    return sorted(f for pat in ("crash-*", "oom-*", "timeout-*", "leak-*") for f in out.glob(pat))


def main(argv: list[str]) -> None:
    """The atheris entry: argv[1] is the kind, the rest goes to libFuzzer."""
    import warnings

    import atheris

    kind = argv[1]
    work = Path(os.environ.get("FAMILY_CERTIFY_INPUTS_WORK") or tempfile.mkdtemp(prefix="fuzz-inputs-"))
    custom = [] if kind in CHECKS else [kind.partition(":")[0].split(".")[0]]
    with atheris.instrument_imports(include=["synth", "fuzz", *custom]):  # coverage guides the search
        import fuzz.engine.contract  # noqa: F401
        import fuzz.engine.stages  # noqa: F401
        import synth.families  # noqa: F401
        import synth.inspect  # noqa: F401
        import synth.manifest  # noqa: F401
        import synth.package  # noqa: F401
        import synth.stage  # noqa: F401
    # the oracles the bundle reader names (their config classes) read no input: left uninstrumented (instrumenting
    # them cost every run more than a second at start)
    import fuzz.oracles.registry  # noqa: F401
    with atheris.instrument_imports(include=["synth", "fuzz", *custom]):
        import fuzz.repro.bundle  # noqa: F401
        check = resolve_check(kind)
    warnings.simplefilter("ignore")  # numpy's overflow warnings on garbage values are not findings

    def one(data: bytes) -> None:
        try:
            check(data, work)
        except UserError:
            pass

    atheris.Setup([argv[0], *argv[2:]], one)
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
