"""`fuzz report BUNDLE --upstream DIR`: a finding as a llama.cpp maintainer takes it, with nothing of this toolkit in
it — issue.md (the title, the llama.cpp commit, what is wrong, expected against actual with the numbers, the
minimized steps, where it first differs), model.gguf (the shrunk model the bundle holds) and a standalone reproducer
that exits 1 while the defect is present, 0 once fixed, and 2 when it cannot run at all.

A memory finding (a program of decodes, llama_memory_* calls and state copies) becomes repro.py: a short program on
llama-cpp-python's bare `llama_cpp` bindings, llama.cpp's own C API one call per line. Its steps are the calls the
toolkit's run of the bundle made (recorded at the worker protocol, which is that API: targets/PROTOCOL.md), its
reference the same sequence's history decoded alone in a fresh context, and its check the one the finding failed
(the positions the memory reports, or the logits against that reference within the run's tolerance).

An abort of llama.cpp found through the library, by any oracle, becomes the same kind of program: the bundle's case
run once more with every worker's requests logged (targets.worker_protocol.CALL_LOG), and the calls of the worker
that died, from its last context's creation to the call it died in, run in a child process — killed by a signal is
the defect. llama-server aborting as it starts becomes repro.sh: llama-server started on the model with the flags it
aborted under, its /health asked with curl until it answers (fixed) or the process is killed by a signal (the
defect). A wrong answer from llama-server becomes repro.sh too (fuzz/repro/upstream_server.py): the requests the
toolkit sent it, with curl, and the last one's answer against the same prompt's from a server that caches nothing;
llama-server dying during requests becomes one as well, its requests up to the one it died in and then whether the
process is still there. A context made on a stage the run sliced has that stage as the report's model
(stage_of_file). Operations that overlap, a second model of other weights, and calls this writer has no line for (a
decode fed embeddings, a whole context's session file) are refused (exit 2) until their reproducers are written.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

from fuzz.engine.fleet import Fleet
from fuzz.engine.parity import context_params
from fuzz.engine.stages import FixtureStages
from fuzz.oracles.memory import calibrated
from fuzz.oracles.memory_machine import cache_params, run_program
from fuzz.oracles.memory_recompute import Feed, Recompute
from fuzz.repro.bundle import Case, case_on_build, read_bundle
from fuzz.repro.upstream_python import (
    API_NAMES,
    NO_ROOM,
    PRELUDE,
    REFUSED,
    call_line,
    helpers,
    memory_script,
    step_lines,
    step_text,
    title_of,
)
from fuzz.repro.upstream_server import answer_run, answer_script, deaths, died_run, died_script, server_flags
from synth.errors import UserError
from synth.inspect import inspect_file
from synth.stage import SPLIT_FIRST, SPLIT_SECOND, Unsupported
from targets import Target
from targets.worker_protocol import CALL_LOG

FIXES = Path(__file__).resolve().parents[2] / "corpora" / "fixes"  # the fix series written for upstream findings
QUERIES = frozenset({"hello", "info", "seq_pos", "seq_pos_max"})  # calls that read and change nothing: not steps
# the worker's memory operations, each one llama_memory_<op> call: its arguments after the memory, in order
class Recorder:
    """A target whose state-changing calls are kept, in order, as (op, request): what a reproducer replays."""

    def __init__(self, t: Target):
        self.t = t
        self.steps: list[tuple[str, dict[str, Any]]] = []
        self.exported = b""  # the last state exported (what a refused import cut short)

    def load(self, path: str, **params: Any) -> Any:
        self.steps.append(("load", params))
        return self.t.load(path, **params)

    def call(self, op: str, **args: Any) -> Any:
        r = self.t.call(op, **args)
        if op == "state_get" and r.ok and args.get("via", "memory") == "memory":
            self.exported = base64.b64decode(r.data["data"]) if isinstance(r.data.get("data"), str) else \
                bytes(r.data.get("data") or b"")
        if op not in QUERIES:  # (a decode refused for room, as the oracle expected: the reproducer expects it too)
            no_room = op == "decode" and r.failure is not None and r.failure.error_kind == "no_memory_slot"
            refused = op == "state_set" and not r.ok and args.get("via", "memory") == "memory"
            if refused and not self.exported.startswith(base64.b64decode(args.get("data", ""))):
                raise UserError("a refused import of a state other than the last export cut short: no standalone "
                                "reproducer writes it yet")
            self.steps.append((op, {**args, NO_ROOM: True} if no_room else {**args, REFUSED: True} if refused
                               else args))
        return r

    def __getattr__(self, name: str) -> Any:
        return getattr(self.t, name)


def write_upstream(bundle_dir: Path, out: Path) -> Path:
    """The upstream-ready report of the bundle in `out` (created; an existing directory's files replaced)."""
    data = read_bundle(bundle_dir)
    crash = data["fingerprint"].get("status") == "crash" and data.get("target") == "llama-cpp"
    if str(data.get("target", "")).startswith("mutant:"):
        raise UserError(f"{bundle_dir}: found on {data['target']}, a defect this toolkit put in: nothing to report")
    if data["fingerprint"].get("status") == "crash" and data.get("target") == "llama-server":
        run = server_crash_run(bundle_dir)
        if "requests" in run:  # (it died during requests, not as it started)
            return write_report(bundle_dir, data, out, run["requests"], "repro.sh",
                                lambda run, d: died_script(run, died_title(d, run)))
        return write_report(bundle_dir, data, out, run, "repro.sh", server_script)
    if data.get("target") == "llama-server" and data["fingerprint"].get("status") == "finding":
        _, logs, rep = logged_run(bundle_dir)
        same = [f for f in rep.findings if f.fingerprint == data["fingerprint"]] or rep.findings
        if not same:
            raise UserError(f"{bundle_dir}: the finding does not come back on its build: nothing to report")
        try:
            run = answer_run(logs, same[0], rep.llama_cpp_commit)
        except UserError as e:
            raise UserError(f"{bundle_dir}: {e}") from None
        return write_report(bundle_dir, data, out, run, "repro.sh", lambda run, d: answer_script(run, answer_title(d)))
    if data["oracle"] != "memory" and not crash:
        an = "an" if data["oracle"][0] in "aeiou" else "a"
        raise UserError(f"{bundle_dir}: {an} {data['oracle']} finding through the library; `fuzz report --upstream` "
                        "writes standalone reproducers for memory findings, llama.cpp's aborts and llama-server's "
                        "findings so far — replay this one with `fuzz replay`")
    if crash:
        return write_report(bundle_dir, data, out, crash_run(bundle_dir), "repro.py", crash_script)
    return write_report(bundle_dir, data, out, memory_run(bundle_dir), "repro.py", memory_script)


def write_report(bundle_dir: Path, data: dict[str, Any], out: Path, run: dict[str, Any], name: str,
                 script: Any) -> Path:
    """out/: the model, the reproducer `name` (script(run, data)), the fix series if one is written, issue.md."""
    out.mkdir(parents=True, exist_ok=True)
    if run.get("files"):  # (a stage of the model: its own file or split pair)
        for old in out.glob("model*.gguf"):
            old.unlink()
        for file, blob in run["files"].items():
            (out / file).write_bytes(blob)
    else:
        shutil.copyfile(bundle_dir / data["fixture"], out / "model.gguf")
    (out / name).write_text(script(run, data))
    if name.endswith(".sh"):
        (out / name).chmod(0o755)
    run["reproducer"] = name
    fix = fix_of(bundle_dir.resolve().name)
    if fix is not None:
        shutil.rmtree(out / "fix", ignore_errors=True)
        (out / "fix").mkdir()
        for patch in sorted(fix.glob("*.patch")):
            shutil.copyfile(patch, out / "fix" / patch.name)
    (out / "issue.md").write_text(issue(bundle_dir, data, run, fix))
    return out


def fix_of(repro: str) -> Path | None:
    """The fix series (corpora/fixes/<name>/, listed in fixes.toml) of a committed upstream repro, if one is written."""
    import tomllib

    fixes = FIXES / "fixes.toml"
    if not fixes.is_file():
        return None
    table = tomllib.loads(fixes.read_text())
    name = next((k for k, v in table.items() if repro in v.get("repros", [])), None)
    return FIXES / name if name else None


def memory_run(bundle_dir: Path) -> dict[str, Any]:
    """The bundle's program run once more on its build, the machine's calls recorded: the steps, the problem it
    failed, the reference's requests (the failing sequence's history alone) and the tolerance."""
    case, fp = case_on_build(bundle_dir)
    cfg = case.config_object(str(bundle_dir))
    kvu = fp.get("phase") == "unified-kv"
    with Fleet("llama-cpp", cfg.timeout) as fleet:
        t, tr = fleet.open(2)
        recompute = Recompute(tr, case.fixture, context_params(n_seq=1, capture=False, n_rs_seq=cfg.n_rs_seq,
                                                               flash_attn=cfg.flash_attn, **cache_params(cfg)), Feed())
        calibrated(recompute, cfg, inspect_file(str(case.fixture)).n_vocab)
        rec = Recorder(t)
        _, problem, mach = run_program(rec, case.fixture, cfg, kvu, recompute, cfg.program, None)
    if problem is None or problem["check"] not in ("pos", "logits"):
        raise UserError(f"{bundle_dir}: the program " + ("passes on its build: nothing to report" if problem is None
                        else f"fails its {problem['check']} check, which has no standalone reproducer yet"))
    reference = recompute.requests(mach.model.log[problem["seq"]]) if problem["check"] == "logits" else []
    return {"steps": rec.steps, "problem": problem, "reference": reference, "tol": recompute.tol,
            "kv_unified": kvu, "commit": mach.commit}


def crash_run(bundle_dir: Path) -> dict[str, Any]:
    """The bundle's case run once more on its build with every worker's requests logged (CALL_LOG): the calls of the
    worker that died, from the load of its last context to the request it died in, and how it died."""
    case, logs, rep = logged_run(bundle_dir)
    died = [log for log in logs if log and "request" in log[-1]]
    if not died:
        raise UserError(f"{bundle_dir}: no llama.cpp process died running the bundle on its build: nothing to report")
    log = min(died, key=lambda entries: sum("request" in e for e in entries))
    # each request with whether its outcome (the entry after it) was a refusal: a state import the program meant
    # llama.cpp to refuse (a state cut short) is done as one in the reproducer
    calls = [{**e["request"], **({REFUSED: True} if e["request"]["op"] == "state_set" and i + 1 < len(log)
                                 and log[i + 1].get("ok") is False else {})}
             for i, e in enumerate(log) if "request" in e]
    start = max(i for i, r in enumerate(calls) if r["op"] == "load")
    steps = [(r["op"], {k: v for k, v in r.items() if k != "op"}) for r in calls[start:]
             if r["op"] not in QUERIES or r is calls[-1]]
    message = next((f.message for f in rep.findings if f.fingerprint.get("status") == "crash"), "")
    path = steps[0][1].get("path", "")
    stage = stage_of_file(case.fixture, path) if steps[0][0] == "load" and Path(path) != case.fixture else None
    return {"steps": steps, "problem": {"check": "crash", "message": message}, "commit": rep.llama_cpp_commit,
            "model": path if stage else str(case.fixture), **(stage or {})}


def model_file(run: dict[str, Any]) -> str:
    """The file a report's steps load: model.gguf, or a stage's split pair's first part."""
    return next(iter(run.get("files") or {"model.gguf": b""}))


def stage_of_file(fixture: Path, path: str) -> dict[str, Any]:
    """The stage a dying worker's context was made on (a file the run sliced from the fixture in its temporary
    workspace, named by its layers: synth.stage.stage_path), sliced again (synth is byte-deterministic): its layers
    and its files' bytes under the report's names — a stage with shared globals is a split GGUF pair, which llama.cpp
    loads from its first part."""
    m = re.search(rf"\.L(\d{{3}})-(\d{{3}})({re.escape(SPLIT_FIRST)}|\.gguf)$", path)
    if not m:
        raise UserError(f"a context on another file than the model ({Path(path).name}): no standalone reproducer yet")
    a, b = int(m[1]), int(m[2])
    fs = FixtureStages(fixture)
    with fs.workspace(None):
        st = fs.stage(a, b)
        if isinstance(st, Unsupported):
            raise UserError(f"stage {a}:{b} of {fixture} cannot be sliced again: {st}")
        first = st[0]
        files = {"model.gguf": first.read_bytes()} if m[3] != SPLIT_FIRST else {
            f"model{SPLIT_FIRST}": first.read_bytes(),
            f"model{SPLIT_SECOND}": first.with_name(first.name.replace(SPLIT_FIRST, SPLIT_SECOND)).read_bytes()}
    return {"stage": [a, b], "files": files}


def crash_script(run: dict[str, Any], data: dict[str, Any]) -> str:
    """repro.py of an abort: the steps in a child process (this file again); the child killed by a signal is the
    defect, every step done is the fix."""
    body = [f"    {x}" for op, req in run["steps"] for x in step_lines("ctx", op, req, "rows", run["model"])]
    last = call_line("ctx", *run["steps"][-1], "rows")
    # an abort creating a context is fixed as much by a refusal (NULL: an error the caller can report) as by a context
    refusal = run["steps"][-1][0] == "load"
    if refusal:
        body[-1:] = ["    try:", '        with contextlib.redirect_stdout(None):  # (its "cannot run" is the fix)',
                     "        " + body[-1], "    except SystemExit:  # llama_init_from_model returned NULL",
                     "        sys.exit(3)"]
    return "\n".join([
        f'"""{crash_title(data, run)}.', "", f"llama.cpp {run['commit']}, its C API through llama-cpp-python's bare "
        "`llama_cpp` bindings (built from that tree); the model beside this file (model.gguf).",
        "Exits 1 while the defect is present (llama.cpp aborts), 0 once it is fixed, 2 when this program cannot run.",
        '"""', "", *(["import contextlib"] if refusal else []), "import signal", "import subprocess", PRELUDE,
        *([f"MODEL = Path(__file__).with_name({model_file(run)!r})  # a stage of the model, as the run sliced it"]
          if run.get("files") else []),
        *helpers(run["steps"]), "",
        "def steps():", "    model = load_model()", *body, "", "",
        'if __name__ == "__main__":',
        '    if os.environ.get("REPRO_STEPS"):  # the child: the steps, as the toolkit ran them (VERBOSE=1: with',
        "        # llama.cpp's log and ggml's backtrace when it aborts)",
        "        steps()", "        sys.exit(0)",
        '    child = subprocess.run([sys.executable, *(["-S"] if sys.flags.no_site else []), __file__],',
        '                           env={**os.environ, "REPRO_STEPS": "1",',
        '                                **({} if os.environ.get("VERBOSE") else {"GGML_NO_BACKTRACE": "1"})})',
        "    if child.returncode < 0:",
        '        print(f"DEFECT: llama.cpp aborted (signal {signal.Signals(-child.returncode).name}) in: "',
        f"              {last!r})",
        "        sys.exit(1)",
        *(['    if child.returncode == 3:',
           '        print("fixed: llama.cpp refused the context with an error code, no abort")',
           "        sys.exit(0)"] if refusal else []),
        '    print("fixed: every step ran" if child.returncode == 0 else "cannot run: the steps failed otherwise")',
        "    sys.exit(0 if child.returncode == 0 else 2)", ""])


def crash_title(data: dict[str, Any], run: dict[str, Any]) -> str:
    """An abort in one line: the model, the call that aborts, the check that failed."""
    family = data["spec"]["family"] if data.get("spec") else "model"
    op = run["steps"][-1][0]
    what = {"load": "creating a context", "llama-server": "starting llama-server"}.get(
        op, f"in {API_NAMES.get(op, op)}")
    return f"{family}: llama.cpp aborts {what}: {aborted(run['problem']['message'])}"


def died_title(data: dict[str, Any], run: dict[str, Any]) -> str:
    """A llama-server that dies during requests, in one line: the model and the signal."""
    family = data["spec"]["family"] if data.get("spec") else "model"
    message = run["problem"]["message"]
    m = re.search(r"signal (\w+)", message)
    check = f": {aborted(message)}" if "GGML_ASSERT" in message else ""
    return f"{family}: llama-server dies{' of ' + m.group(1) if m else ''} during requests{check}"


def answer_title(data: dict[str, Any]) -> str:
    """A wrong answer in one line: the model, and what llama-server answered otherwise."""
    family = data["spec"]["family"] if data.get("spec") else "model"
    fp = data["fingerprint"]
    return (f"{family}: llama-server answers a request otherwise than the same prompt with nothing cached "
            f"({fp.get('phase')}; {fp.get('cause') or 'cause not localized'})")


def aborted(message: str) -> str:
    """The check llama.cpp printed as it aborted, its file named from the tree's root (not the build's path)."""
    m = re.search(r"((?:ggml|tools|common)/[^\s:]+:\d+: .*)$", message) or re.search(r"(src/[^\s:]+:\d+: .*)$",
                                                                                      message)
    return m.group(1) if m else message


def logged_run(bundle_dir: Path) -> tuple[Case, list[list[dict[str, Any]]], Any]:
    """The bundle's case run once more on its build, every worker's requests and their outcomes logged (CALL_LOG):
    the case, each worker's log, and the run's report."""
    case, _ = case_on_build(bundle_dir)
    with tempfile.TemporaryDirectory(prefix="family-certify-calls-") as d:
        os.environ[CALL_LOG] = d  # (a worker is spawned with it: the idle ones, without it, are not taken)
        try:
            _, rep = case.run()
        finally:
            os.environ.pop(CALL_LOG)
        return case, [[json.loads(x) for x in p.read_text().splitlines()]
                      for p in sorted(Path(d).glob("*.jsonl"))], rep


def server_crash_run(bundle_dir: Path) -> dict[str, Any]:
    """A llama-server that aborts while it starts: the load whose server died by a signal, as the server worker made
    it (targets.llama_server_worker: its DEFAULTS, the flags a start adds)."""
    _, logs, rep = logged_run(bundle_dir)
    died = [(a["request"], error) for _, a, error in deaths(logs) if a["request"].get("op") == "load"]
    if not died:
        during = died_run(logs, rep.llama_cpp_commit)
        if during is None:
            raise UserError(f"{bundle_dir}: llama-server did not die on the bundle's build: nothing to report")
        return {"requests": during}
    req, error = died[0]
    return {"steps": [("llama-server", {"flags": server_flags(req)})],
            "problem": {"check": "crash", "message": error}, "commit": rep.llama_cpp_commit}


def server_script(run: dict[str, Any], data: dict[str, Any]) -> str:
    """repro.sh: llama-server started on the model with the flags that made it abort, and its health asked until it
    answers (fixed: exit 0) or the process is gone (killed by a signal: the defect, exit 1)."""
    flags = " ".join(run["steps"][0][1]["flags"])
    return "\n".join([
        "#!/bin/sh", f"# {crash_title(data, run)}.", "#",
        f"# llama.cpp {run['commit']}: llama-server (LLAMA_SERVER, else the one on PATH) started on the model beside",
        "# this file with the flags below. Exits 1 while the defect is present (llama-server aborts as it starts), 0",
        "# once it is fixed (it answers /health), 2 when it cannot run (no llama-server, no curl, another failure).",
        'server=${LLAMA_SERVER:-llama-server}', 'port=${PORT:-18180}', 'dir=$(cd "$(dirname "$0")" && pwd)',
        'command -v "$server" >/dev/null 2>&1 || { echo "cannot run: no $server (set LLAMA_SERVER)"; exit 2; }',
        'command -v curl >/dev/null 2>&1 || { echo "cannot run: no curl"; exit 2; }',
        'log=$(mktemp)  # what llama-server printed',
        f'GGML_NO_BACKTRACE=1 "$server" -m "$dir/model.gguf" --host 127.0.0.1 --port "$port" {flags} >"$log" 2>&1 &',
        "pid=$!", "i=0",
        "while [ $i -lt 600 ]; do",
        "  if ! kill -0 $pid 2>/dev/null; then",
        "    wait $pid; rc=$?",
        '    if [ $rc -gt 128 ]; then echo "DEFECT: llama-server was killed by signal $((rc - 128)) as it started:'
        ' $(grep -m1 GGML_ASSERT "$log")"; exit 1; fi',
        '    echo "cannot run: llama-server exited ($rc) as it started; see $log"; exit 2',
        "  fi",
        '  if curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1; then',
        '    kill $pid; wait $pid 2>/dev/null; echo "fixed: llama-server started and answers /health"; exit 0',
        "  fi",
        "  sleep 0.1; i=$((i + 1))", "done",
        'kill $pid 2>/dev/null; echo "cannot run: llama-server neither started nor died in 60 s"; exit 2', ""])


def plain(text: str) -> str:
    """A finding's explanation without this toolkit's own words: its controls' names, how it was found."""
    text = re.sub(r"\s*\([^()]*\b(?:control|fuzz|lane|oracle)\b[^()]*\)", "", text)
    # (to the sentence's end: a period before a space, a line's end or the text's, not the one in "llama.cpp")
    return re.sub(r"\s*Found by (?:[^.]|\.(?=\S))*(?:\.|$)", "", text).strip()


def issue(bundle_dir: Path, data: dict[str, Any], run: dict[str, Any], fix: Path | None) -> str:
    """issue.md: what a maintainer reads first."""
    readme = (bundle_dir / "README.md").read_text() if (bundle_dir / "README.md").is_file() else ""
    what = plain(section(readme, "## What it is"))
    cause = plain(section(readme, "## Where it first differs"))
    p = run["problem"]
    last = len(run["steps"])
    where = {"pos": f"After step {last}: `llama_memory_seq_pos_min` / `_max` of sequence {p.get('seq')}.",
             "logits": f"The logits of step {last}'s `llama_decode`, for sequence {p.get('seq')}.",
             "crash": f"Step {last}: llama.cpp aborts the process there.",
             "answer": f"The answer to request {last}."}[p["check"]]
    if cause:
        where += (" What changes one thing and passes (the program's operations counted from 0: each step above but "
                  f"the context's creation, a state copy one operation):\n\n{cause}")
    if run.get("died"):
        expected = "llama-server answers every request (an error response at worst) and goes on running"
        actual = died_title(data, run).split(": ", 1)[1].replace("llama-server dies", "it dies")
    elif p["check"] == "crash":
        expected = "every call returns (a context llama.cpp cannot make or a batch it cannot decode is an error code)"
        actual = f"the process aborts: `{aborted(p['message'])}`"
    elif p["check"] == "answer":
        expected = ("the last request is answered as the same prompt is by a llama-server that caches nothing (one "
                    "slot, `--cache-ram 0`, `cache_prompt: false`); greedy, so token for token")
        actual = f"`{plain(p['message'])}`"
    elif p["check"] == "pos":
        expected = f"sequence {p['seq']} reports positions {p['want']} (pos_min, pos_max; -1: empty)"
        actual = f"it reports {p['got']}"
    else:
        expected = (f"sequence {p['seq']}'s logits equal (within {run['tol']:.3g}) those of its own history decoded "
                    "alone in a fresh context")
        actual = f"max|Δlogit| {p.get('max_abs_dlogit', float('nan')):.3g}"
    info = inspect_file(str(bundle_dir / data["fixture"]))
    model = (f"`model.gguf` beside this file: a {info.arch} model of {info.n_layer} layers, vocabulary "
             f"{info.n_vocab}, random weights, made for this report.")
    if run.get("files"):  # (a stage: the layers [a, b) of that model, as a split runtime's stage holds them)
        a, b = run["stage"]
        pair = " and its second part, `model-00002-of-00002.gguf` (the shared tensors)" if len(run["files"]) > 1 \
            else ""
        model = (f"`{model_file(run)}`{pair} beside this file: layers [{a}, {b}) of a {info.arch} model of "
                 f"{info.n_layer} layers (vocabulary {info.n_vocab}, random weights, made for this report), sliced "
                 "as a split runtime's stage holds them.")
    if run.get("died"):
        flags = " ".join(run["flags"]).replace('"$dir/model.gguf"', "model.gguf")
        steps = [f"{model} Start llama-server on it:", "", f"    llama-server -m model.gguf {flags}",
                 "", f"and send it the {last} requests of repro.sh (each a `POST /completion` or `/embedding` of token "
                 "ids, greedy; those of one round side by side)."]
        where = "llama-server dies during the requests, before it answers them."
        reproduce = ["    LLAMA_SERVER=path/to/llama-server sh repro.sh   # built from the commit above"]
    elif p["check"] == "answer":
        steps = [f"{model} Start llama-server on it:", "", f"    llama-server -m model.gguf {' '.join(run['flags'])}",
                 "", f"and send it the {last} requests of repro.sh in order (each a `POST /completion` of token "
                 "ids, greedy, or a slot action); the last one's answer is compared with the same prompt's from a "
                 "llama-server that caches nothing."]
        reproduce = ["    LLAMA_SERVER=path/to/llama-server sh repro.sh   # built from the commit above"]
    elif run["reproducer"] == "repro.sh":  # llama-server, started with the flags it aborts under
        steps = [f"{model} Start llama-server on it:", "",
                 f"    llama-server -m model.gguf {' '.join(run['steps'][0][1]['flags'])}"]
        where = "llama-server aborts while it starts, before it answers `/health`."
        reproduce = ["    LLAMA_SERVER=path/to/llama-server sh repro.sh   # built from the commit above"]
    else:
        steps = [f"{model} Each step is one call of llama.cpp's C API (through llama-cpp-python's `llama_cpp` "
                 "bindings in repro.py; `decode` fills one `llama_batch`):", "",
                 *[f"{k}. {step_text(op, req)}" for k, (op, req) in enumerate(run["steps"], 1)]]
        reproduce = ["    pip install numpy llama-cpp-python   # built from the commit above", "    python3 repro.py"]
    title = died_title(data, run) if run.get("died") else crash_title(data, run) if p["check"] == "crash" else \
        answer_title(data) if p["check"] == "answer" else title_of(data)
    return "\n".join([
        f"# {title}", "",
        f"llama.cpp commit `{run['commit']}`, CPU backend.", "",
        "## What is wrong", "", what or (died_title(data, run).split(": ", 1)[1] + "." if run.get("died")
                                         else f"llama.cpp aborts: `{aborted(p['message'])}`." if p["check"] == "crash"
                                         else p["message"]), "",
        "## Expected and actual", "", f"Expected: {expected}.", "", f"Actual: {actual}.", "",
        "## Steps (minimized)", "", *steps, "",
        "## Where it first differs", "", where, "",
        "## Reproduce", "", *reproduce,
        "", "Exits 1 while the defect is present, 0 once it is fixed.", "", *fix_section(fix, run["reproducer"])])


def fix_section(fix: Path | None, reproducer: str) -> list[str]:
    """issue.md's fix: the series beside it (fix/) and what its README says of the defect and the change."""
    if fix is None:
        return []
    readme = (fix / "README.md").read_text() if (fix / "README.md").is_file() else ""
    said = [b for b in readme.split("\n\n") if b.startswith(("**The fix**", "**What else it could affect.**"))]
    patches = ", ".join(f"`fix/{p.name}`" for p in sorted(fix.glob("*.patch")))
    return ["## A fix", "", f"{patches} (`git apply` in the llama.cpp tree): with it {reproducer} exits 0.", "",
            *[plain(b.replace("\n", " ")) + "\n" for b in said]]


def section(readme: str, heading: str) -> str:
    """A README section's text (without its heading and the bundle's toolkit commands)."""
    if heading not in readme:
        return ""
    body = readme.split(heading, 1)[1].split("\n## ", 1)[0]
    body = body.split("\n", 1)[1] if "\n" in body else ""
    return body.strip()
