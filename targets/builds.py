"""llama.cpp builds as an input: which llama.cpp the workers run.

A build is named by a spec:
  pinned         the default: the tree vendored in llama-cpp-python 0.3.36, the bindings installed in .venv
  pypi:VERSION   the tree vendored in that llama-cpp-python sdist on the index, run with that version's own
                 bindings (its llama_cpp package: ctypes declarations written for its own llama.h)
  PATH           a llama.cpp source tree, run with the pinned bindings — so its llama.h must declare what the
                 pinned one does (the structs the bindings pass, the state-format versions): checked, never assumed
and optionally a patch series (`--patches DIR`: every *.patch in name order, applied onto a copy of the tree).

Anything but the bare pinned build is built once, by one CMake build of the tree: the shared libraries the worker
loads and llama-server, cached under $FAMILY_CERTIFY_CACHE/builds/<key>, the key a content hash of the tree, the
patches, the bindings and the build options. A worker runs a build through its environment (Build.env): PYTHONPATH
puts the build's llama_cpp package (its bindings, lib/ holding the built libraries) before the venv's, and
FAMILY_CERTIFY_LLAMA_SERVER names its llama-server. Before anything is built or run, `resolve` refuses (exit 2, one
line) a build whose API the worker cannot drive: a function or struct field the worker calls missing from the
bindings, a header that declares a struct otherwise than the bindings expect, a ggml_tensor laid out otherwise than
the worker's capture helper reads it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from synth.errors import UserError
from targets.backends import check_backend, tree_problem
from targets.client import COVERAGE_ENV
from targets.cmake_build import (
    COVERAGE_MARK,
    BuildError,
    built,
    cmake_options,
    copy_bindings,
    copy_server,
    extract_sdist,
    file_digests,
    say,
    tree_digest,
)
from targets.native import cache_dir
from targets.worker_build import PINNED_LLAMA_CPP_COMMIT as PINNED_COMMIT
from targets.worker_build import PINNED_LLAMA_CPP_PYTHON as PINNED

ENV = "FAMILY_CERTIFY_LLAMA_CPP"  # the build spec, for workflows (the --llama-cpp option wins)
PATCHES_ENV = "FAMILY_CERTIFY_PATCHES"
BACKEND_ENV = "FAMILY_CERTIFY_BACKEND"  # the ggml backend to build with, for workflows (the --backend option wins)
IDENTITY_ENV = "FAMILY_CERTIFY_BUILD"  # set in a worker's environment: the identity of the build it runs
# the structs the bindings pass by value or read fields of, and the constants that version the state format
STRUCTS = ("llama_model_params", "llama_context_params", "llama_batch", "llama_model_quantize_params",
           "llama_sampler_chain_params", "llama_token_data", "llama_token_data_array")
VERSIONS = ("LLAMA_SESSION_VERSION", "LLAMA_STATE_SEQ_VERSION", "LLAMA_DEFAULT_SEED")


@dataclass(frozen=True)
class Build:
    spec: str
    identity: dict[str, Any]
    bindings: Path | None = None  # a directory holding a llama_cpp package with lib/; None: the venv's own
    server: Path | None = None  # its llama-server; None: the pinned one (scripts/build_llama_server.sh)
    seconds: float = 0.0  # how long building it took (0 when it came from the cache)
    architectures: list[str] | None = None  # the model architectures its tree knows (None: the bare pinned build's)

    def arch_names(self) -> list[str]:
        """The model architectures the build's tree knows (src/llama-arch.cpp, patches applied)."""
        if self.architectures is not None:
            return self.architectures
        return parse_arch_names(sdist_files(PINNED, ("src/llama-arch.cpp",))[0].decode("utf-8", "replace"),
                                "the pinned tree")

    @property
    def backend(self) -> str:
        """The ggml backend compiled in beside the CPU one (the identity names it unless it is cpu)."""
        return self.identity.get("backend", "cpu")

    def env(self) -> dict[str, str]:
        """The environment a worker runs this build in."""
        out = {IDENTITY_ENV: json.dumps(self.identity, sort_keys=True)}
        if self.identity.get("coverage"):  # (the worker then exits so that the counts are written: exit_process)
            out[COVERAGE_ENV] = "1"
        if self.bindings is not None:
            # (the environment's own PYTHONPATH, not another active build's)
            base = _ORIGINAL["PYTHONPATH"] if "PYTHONPATH" in _ORIGINAL else os.environ.get("PYTHONPATH")
            out["PYTHONPATH"] = os.pathsep.join(x for x in (str(self.bindings), base) if x)
        if self.server is not None:
            out["FAMILY_CERTIFY_LLAMA_SERVER"] = str(self.server)
        return out


@functools.cache
def sdist_files(version: str, paths: tuple[str, ...]) -> list[bytes]:
    """Files of the llama.cpp tree a llama-cpp-python sdist vendors (paths relative to the tree), read without
    extracting the rest."""
    want = {f"vendor/llama.cpp/{p}": i for i, p in enumerate(paths)}
    got: dict[int, bytes] = {}
    with tarfile.open(sdist(version)) as tar:
        for m in tar:
            i = want.get(m.name.split("/", 1)[-1])
            if i is not None:
                got[i] = tar.extractfile(m).read()
                if len(got) == len(paths):
                    break
    missing = [p for i, p in enumerate(paths) if i not in got]
    if missing:
        raise UserError(f"llama-cpp-python {version}'s sdist has no vendor/llama.cpp/{missing[0]}")
    return [got[i] for i in range(len(paths))]


def parse_arch_names(llama_arch_cpp: str, where: str) -> list[str]:
    """The architecture names of a llama.cpp tree's src/llama-arch.cpp (LLM_ARCH_NAMES), in its order."""
    names = re.findall(r'\{\s*LLM_ARCH_[A-Z0-9_]+\s*,\s*"([^"]+)"\s*\}', llama_arch_cpp)
    if not names:
        raise UserError(f"{where}: src/llama-arch.cpp names no architecture (LLM_ARCH_NAMES); is it a llama.cpp tree?")
    return [n for n in names if n != "(unknown)"]


def tree_architectures(tree: Path) -> list[str]:
    f = Path(tree) / "src" / "llama-arch.cpp"
    if not f.is_file():
        raise UserError(f"{tree}: no src/llama-arch.cpp; pass the root of a llama.cpp source tree")
    return parse_arch_names(f.read_text(errors="replace"), str(tree))


def identity(llama_cpp_commit: str | None = None) -> dict[str, Any]:
    """The active build's identity (spec, llama-cpp-python version, commit where known, tree and patch-series
    hashes, build options, cache key), with the commit a target reported where it did."""
    out = current_identity()
    return {**out, "llama_cpp_commit": llama_cpp_commit or out.get("llama_cpp_commit")}


def pinned_identity() -> dict[str, Any]:
    return {"spec": "pinned", "llama_cpp_python": PINNED, "llama_cpp_commit": PINNED_COMMIT, "patches": None}


def current_identity() -> dict[str, Any]:
    """The identity of the build this process runs (a worker: from its environment), else the pinned one's."""
    raw = os.environ.get(IDENTITY_ENV)
    return json.loads(raw) if raw else pinned_identity()


_ORIGINAL: dict[str, str | None] = {}  # the variables activate() changed, as they were before


def activate(build: Build) -> Build:
    """Run every worker started from now on (and llama-server) on this build: its environment goes into this
    process's, which workers inherit; activating the pinned build puts the environment back as it was."""
    for k, v in _ORIGINAL.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    _ORIGINAL.clear()
    if build.bindings is None and build.server is None:
        return build
    if build.bindings is not None and not build.bindings.is_dir():  # (workers would load the venv's libllama)
        raise UserError(f"the build {build.identity.get('key')} of {build.spec} is gone from the cache "
                        f"({build.bindings.parent}): resolve it again")
    for k, v in build.env().items():
        _ORIGINAL[k] = os.environ.get(k)
        os.environ[k] = v
    return build


def use(spec: str | None = None, patches: str | Path | None = None, backend: str | None = None,
        coverage: bool = False) -> Build:
    """The command line's --llama-cpp / --patches / --backend (or the environment's): resolved, built if needed,
    activated. coverage: its coverage build (`family-certify coverage`)."""
    return activate(resolve(spec, patches, backend=backend, coverage=coverage))


# ---- sources ---------------------------------------------------------------------------------------------
def sdist(version: str) -> Path:
    """The llama-cpp-python sdist of that version, from the cache or the index."""
    if not re.fullmatch(r"\d+\.\d+\.\d+\w*", version):
        raise UserError(f"--llama-cpp pypi:{version}: not a version (e.g. pypi:0.3.35)")
    d = cache_dir() / "sdist"
    out = d / f"llama_cpp_python-{version}.tar.gz"
    if out.is_file():
        return out
    d.mkdir(parents=True, exist_ok=True)
    say(f"downloading llama-cpp-python {version} (sdist)")
    r = subprocess.run([sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "-q", "--no-deps",
                        "--no-binary", ":all:", f"llama-cpp-python=={version}", "-d", str(d)],
                       capture_output=True, text=True)
    if r.returncode != 0 or not out.is_file():
        last = (r.stderr.strip().splitlines() or ["no sdist"])[-1]
        raise UserError(f"--llama-cpp pypi:{version}: cannot download llama-cpp-python {version} ({last}); "
                        "pick a version the index has (pip index versions llama-cpp-python)")
    return out


def sdist_tree(version: str) -> tuple[Path, Path, str]:
    """(the vendored llama.cpp tree, the llama_cpp bindings, the tree's digest) of a llama-cpp-python sdist,
    extracted once into the cache — keyed on the archive's sha256 — and checked against the digests recorded when it
    was extracted at every use: one edited since is extracted again. Read only: a build that patches it works on a
    copy. (Extracting 76 MB of sdist costs about 2 s a resolve; hashing the tree a quarter of that.)"""
    archive = sdist(version)
    h = hashlib.sha256()
    with archive.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    root = cache_dir() / "builds" / f"work-sdist-{version}-{h.hexdigest()[:16]}"
    got = _extracted(root)
    if got is not None:
        return got
    shutil.rmtree(root, ignore_errors=True)  # edited, or half there: extracted again
    tmp = root.with_name(f"{root.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        src, py = extract_sdist(archive, tmp)
    except BuildError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise UserError(str(e)) from None
    tree = tree_hash(src)
    (tmp / "digests.json").write_text(json.dumps({"src": src.relative_to(tmp).as_posix(), "tree": tree,
                                                  "bindings": py.relative_to(tmp).as_posix(),
                                                  "bindings_tree": tree_hash(py)}) + "\n")
    try:
        os.rename(tmp, root)
    except OSError:  # another process put it there first: theirs (checked the same way) is used
        shutil.rmtree(tmp, ignore_errors=True)
        got = _extracted(root)
        if got is None:
            raise UserError(f"{root}: not the extracted sdist it should be, and it cannot be replaced; remove it") \
                from None
        return got
    return root / src.relative_to(tmp), root / py.relative_to(tmp), tree


def _extracted(root: Path) -> tuple[Path, Path, str] | None:
    """An sdist's extraction in the cache, if every file is as recorded when it was extracted."""
    try:
        rec = json.loads((root / "digests.json").read_text())
        src, py = root / rec["src"], root / rec["bindings"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if src.is_dir() and py.is_dir() and tree_hash(src) == rec["tree"] and tree_hash(py) == rec["bindings_tree"]:
        return src, py, rec["tree"]
    return None


def venv_bindings() -> Path:
    """The pinned bindings package installed in this environment (its python files are what a tree build runs)."""
    import importlib.util

    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        raise UserError("llama_cpp is not installed: run `make bootstrap` first")
    return Path(list(spec.submodule_search_locations)[0])


def pinned_headers() -> Path:
    """The directory holding the pinned llama.h and ggml.h (installed beside the pinned bindings)."""
    inc = venv_bindings().parent / "include"
    if not (inc / "llama.h").is_file():
        raise UserError(f"{inc}/llama.h is missing: the pinned llama-cpp-python install is incomplete; rerun "
                        "`make bootstrap`")
    return inc


def check_tree(tree: Path, what: str) -> None:
    for rel in ("CMakeLists.txt", "include/llama.h", "ggml/include/ggml.h"):
        if not (tree / rel).is_file():
            raise UserError(f"--llama-cpp {what}: {tree} is not a llama.cpp source tree ({rel} is missing)")


def patch_series(patches: Path) -> list[Path]:
    """The series' *.patch files in name order (checked before anything is extracted or built)."""
    if not patches.is_dir():
        raise UserError(f"--patches {patches}: not a directory of *.patch files")
    series = sorted(patches.glob("*.patch"))
    if not series:
        raise UserError(f"--patches {patches}: no *.patch files in it")
    return series


def apply_patches(tree: Path, series: list[Path]) -> list[tuple[str, str]]:
    """Every patch of the series, in order, onto `tree` (a copy); [(name, sha256)]. A patch that does not apply is
    bad input: exit 2, naming it."""
    out = []
    for p in series:
        r = subprocess.run(["git", "apply", "--whitespace=nowarn", "-p1", str(p.resolve())], cwd=tree,
                           capture_output=True, text=True)
        if r.returncode != 0:
            why = (r.stderr.strip().splitlines() or ["git apply failed"])[0]
            raise UserError(f"--patches: {p.name} does not apply to the tree ({why}); rebase it onto that tree "
                            "or drop it from the series")
        out.append((p.name, hashlib.sha256(p.read_bytes()).hexdigest()))
    return out


def tree_hash(root: Path) -> str:
    """sha256 over every file's path and bytes (sorted; .git and build directories left out)."""
    return tree_digest(file_digests(root))


# ---- the API the worker needs ------------------------------------------------------------------------------
def struct_body(header: str, name: str) -> str | None:
    """A struct's member declarations (up to its matching brace), comments and whitespace normalized away; None if
    it is not declared."""
    text = re.sub(r"//[^\n]*|/\*.*?\*/", "", header, flags=re.S)
    m = re.search(r"struct\s+" + re.escape(name) + r"\s*\{", text)
    if not m:
        return None
    depth, i = 1, m.end()
    while depth and i < len(text):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        i += 1
    return " ".join(text[m.end():i - 1].split())


def define(header: str, name: str) -> str | None:
    m = re.search(r"#define\s+" + re.escape(name) + r"\s+(\S+)", header)
    return m.group(1) if m else None


def header_changes(tree: Path, reference: Path, pinned: Path | None = None) -> list[str]:
    """What the tree's llama.h / ggml.h declare otherwise than the headers the run depends on: the llama.h structs
    and state versions against `reference` (what the bindings were written for), struct ggml_tensor against the
    pinned ggml.h (`pinned`, default: the reference; the worker's capture helper is compiled for it). [] when
    nothing."""
    mine = (tree / "include" / "llama.h").read_text(errors="replace")
    ref = (reference / "llama.h").read_text(errors="replace")
    out = []
    for s in STRUCTS:
        a, b = struct_body(mine, s), struct_body(ref, s)
        if a != b:
            out.append(f"struct {s} " + ("is not declared" if a is None else
                                         "changed (the bindings would pass it in the old layout)"))
    for d in VERSIONS:
        a, b = define(mine, d), define(ref, d)
        if a != b:
            out.append(f"{d} {b} → {a}")
    g_mine = (tree / "ggml" / "include" / "ggml.h").read_text(errors="replace")
    g_ref = ((pinned or reference) / "ggml.h").read_text(errors="replace")
    if struct_body(g_mine, "ggml_tensor") != struct_body(g_ref, "ggml_tensor"):
        out.append("struct ggml_tensor changed (the worker's capture helper reads its fields)")
    return out


def worker_needs() -> tuple[set[str], set[str]]:
    """The llama.cpp functions the worker and its mutants call through the bindings, and the fields of
    llama_model_params / llama_context_params they set: read from their code."""
    here = Path(__file__).parent
    text = "".join((here / f).read_text() for f in ("llama_cpp_worker.py", "mutants.py", "kvstate.py", "state_io.py"))
    funcs = set(re.findall(r"\bL\.(llama_\w+)\s*\(", text))
    fields = set(re.findall(r"\b(?:cp|mp)\.(\w+)\s*=", text))
    return funcs, fields


def bindings_problems(package: Path) -> list[str]:
    """What the worker needs that these bindings (a llama_cpp package's llama_cpp.py) do not declare."""
    text = (package / "llama_cpp.py").read_text(errors="replace")
    funcs, fields = worker_needs()
    declared = set(re.findall(r"^def (llama_\w+)\s*\(", text, re.M))
    out = [f"{f}()" for f in sorted(funcs - declared)]
    members = set()
    for cls in ("llama_model_params", "llama_context_params"):
        m = re.search(r"^class " + cls + r"\(ctypes\.Structure\):(.*?)(?=^\S)", text, re.S | re.M)
        members |= set(re.findall(r'\(\s*"(\w+)"\s*,', m.group(1))) if m else set()
    out += [f"field {f}" for f in sorted(fields - members)]
    return out


# ---- resolving a spec into a build -------------------------------------------------------------------------
def requested(spec: str | None = None, patches: str | Path | None = None, *, from_env: bool = True) \
        -> tuple[str, Path | None]:
    """The spec and patch series asked for: the options, else (from_env) the environment, else pinned."""
    if os.environ.get("LLAMA_CPP_LIB_PATH"):
        raise UserError(f"LLAMA_CPP_LIB_PATH={os.environ['LLAMA_CPP_LIB_PATH']} would make the bindings load another "
                        "libllama, whose struct layouts nothing here can check (and the capture helper would still "
                        "read the pinned ggml); unset it and pass that build's source tree as --llama-cpp TREE")
    spec = spec or (os.environ.get(ENV) if from_env else None) or "pinned"
    patches = patches or (os.environ.get(PATCHES_ENV) if from_env else None) or None
    return spec, Path(patches) if patches else None


_RESOLVED: dict[tuple[str, str | None, str], Build] = {}  # per process: extracting and hashing take seconds


def resolve(spec: str | None = None, patches: str | Path | None = None, *, from_env: bool = True,
            backend: str | None = None, coverage: bool = False, fresh: bool = False) -> Build:
    """The build a spec names, built now if it is not cached. Bad input (no such version or tree, a patch that does
    not apply, an API the worker cannot drive, a backend this machine cannot build or run) raises UserError before
    anything is built. A bundle's recorded build is resolved with from_env False: the environment's patch series
    and backend must not apply to it. coverage: the build's coverage build (COVERAGE_SOURCES compiled with gcc's
    --coverage: never the bare pinned install). fresh: compiled now even if cached (its objects, not the cache
    entry's, are what the work directory then holds: a mutant's object compared with the pristine one)."""
    spec, series = requested(spec, patches, from_env=from_env)
    backend = check_backend(backend or (os.environ.get(BACKEND_ENV) if from_env else None) or "cpu")
    if spec == "pinned" and series is None and backend == "cpu" and not coverage:
        return Build("pinned", pinned_identity())
    # (a tree or patch edited mid-run: not expected)
    memo = (spec, str(series.resolve()) if series else None, backend, coverage)
    known = _RESOLVED.get(memo)
    if known and not fresh and (known.bindings is None or known.bindings.is_dir()):  # (a cache entry removed since:
        return known                                                                # a mutant's, once it ran)
    _RESOLVED[memo] = b = _resolve(spec, series, backend, coverage, fresh)
    return b


def _resolve(spec: str, series: Path | None, backend: str = "cpu", coverage: bool = False,
             fresh: bool = False) -> Build:
    files = patch_series(series) if series else []
    with tempfile.TemporaryDirectory(prefix="family-certify-build-") as tmp:
        work = Path(tmp)
        if spec == "pinned" or spec.startswith("pypi:"):
            version = PINNED if spec == "pinned" else spec[len("pypi:"):]
            src, py, verified = sdist_tree(version)
            if files:  # patched on a copy; the cached tree stays the sdist's
                top = work / "src" / src.parent.parent.name
                shutil.copytree(src.parent.parent, top, symlinks=True)
                src, py = top / src.relative_to(src.parent.parent), top / py.relative_to(src.parent.parent)
                verified = None
            identity = {"spec": spec, "llama_cpp_python": version,
                        "llama_cpp_commit": PINNED_COMMIT if version == PINNED else None}
            own_bindings = True
            base = f"pypi-{version}"
        else:
            given = Path(spec).expanduser()
            check_tree(given, spec)
            src = work / "src" / "llama.cpp"
            shutil.copytree(given, src, ignore=shutil.ignore_patterns(".git", "build", "build-*"), symlinks=True)
            py = venv_bindings()
            verified = None
            identity = {"spec": str(given.resolve()), "llama_cpp_python": None, "llama_cpp_commit": git_commit(given)}
            own_bindings = False
            base = "tree-" + hashlib.sha256(str(given.resolve()).encode()).hexdigest()[:12]
        check_tree(src, spec)
        # the headers the bindings were written for: the pinned ones for a tree run with the pinned bindings,
        # else the unpatched tree's own
        ref = work / "ref"
        ref.mkdir()
        for h in (src / "include" / "llama.h", src / "ggml" / "include" / "ggml.h"):
            shutil.copy(h, ref / h.name)
        applied = apply_patches(src, files)
        problem = tree_problem(backend, src)
        if problem:
            raise UserError(problem)
        identity["patches"] = ({"dir": str(series.resolve()), "files": [n for n, _ in applied],
                                "sha256": hashlib.sha256(json.dumps(applied).encode()).hexdigest()}
                               if series else None)
        # the API: the bindings must declare what the worker calls, and the (patched) tree must declare the structs
        # and versions the bindings were written for
        problems = bindings_problems(py) + header_changes(src, ref if own_bindings else pinned_headers(),
                                                          pinned_headers())
        if problems:
            raise UserError(f"--llama-cpp {spec}{' with ' + str(series) if series else ''}: the worker cannot drive "
                            f"this build's API: {', '.join(problems[:6])}"
                            + (f" (and {len(problems) - 6} more)" if len(problems) > 6 else "")
                            + "; use a tree whose llama.h matches its bindings (pypi:VERSION runs a version's own)")
        identity["tree_sha256"] = verified or tree_hash(src)  # (an unpatched sdist's: hashed by sdist_tree)
        archs = tree_architectures(src)
        identity["bindings_sha256"] = tree_hash(py) if not own_bindings else None
        identity["options"] = list(cmake_options(backend)) + ([COVERAGE_MARK] if coverage else [])
        if backend != "cpu":  # (a cpu build's identity and key stay what they were before backends were options)
            identity["backend"] = backend
        key = hashlib.sha256(json.dumps({k: identity[k] for k in ("tree_sha256", "bindings_sha256", "options",
                                                                  "llama_cpp_python")}, sort_keys=True)
                             .encode()).hexdigest()[:16]
        identity["key"] = key
        # a backend (and a coverage build) builds in its own work directory: other options in the cpu one would make
        # it configure afresh
        work_dir = cache_dir() / "builds" / (f"work-{base}" + (f"-{backend}" if backend != "cpu" else "")
                                             + ("-coverage" if coverage else ""))
        if coverage:  # where its objects, notes (.gcno) and the sources they were compiled from are
            identity["coverage"] = {"work": str(work_dir)}
        dest = cache_dir() / "builds" / key
        if not fresh and cached_build(dest, identity["tree_sha256"]):
            return Build(spec, identity, dest / "py", dest / "bin" / "llama-server", architectures=archs)
        label = spec + (f" + {', '.join(n for n, _ in applied)}" if applied else "") \
            + (f" ({backend})" if backend != "cpu" else "") + (" (coverage)" if coverage else "")
        seconds, built_from = cmake_build(src, py, dest, label, work_dir, backend, coverage)
        if built_from != identity["tree_sha256"]:  # (the tree hashed above is the tree synced and compiled)
            shutil.rmtree(dest, ignore_errors=True)
            raise UserError(f"--llama-cpp {label}: the build was compiled from another tree ({built_from[:12]}, "
                            f"not {identity['tree_sha256'][:12]}); build again")
        (dest / "identity.json").write_text(json.dumps({**identity, "built_from": built_from}, indent=1,
                                                       sort_keys=True) + "\n")
        return Build(spec, identity, dest / "py", dest / "bin" / "llama-server", seconds=seconds, architectures=archs)


def cached_build(dest: Path, tree: str) -> bool:
    """Whether the cache entry holds a build verified to be compiled from this tree's content (its identity records
    the digest the work directory's build compiled: an entry made before that was recorded is built again)."""
    try:
        return json.loads((dest / "identity.json").read_text()).get("built_from") == tree
    except (OSError, ValueError):
        return False


def git_commit(tree: Path) -> str | None:
    r = subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else None


def cmake_build(src: Path, bindings: Path, dest: Path, spec: str, work: Path, backend: str = "cpu",
                coverage: bool = False) -> tuple[float, str]:
    """One CMake build of the tree (targets/cmake_build.py: synced into `work`, built incrementally there) installed
    as a worker runs it: dest/py/llama_cpp (the bindings' python files, lib/ the libraries) and dest/bin
    (llama-server, the libraries beside it for its $ORIGIN rpath). Returns the seconds it took and the digest of the
    tree it was compiled from."""
    t0 = time.perf_counter()
    stage = dest.with_name(dest.name + f".{os.getpid()}.tmp")
    try:
        with built(src, work, spec, backend, coverage) as (out, built_from):
            shutil.rmtree(stage, ignore_errors=True)
            stage.mkdir(parents=True)
            copy_bindings(bindings, out, stage / "py" / "llama_cpp")
            copy_server(out, stage / "bin")
    except BuildError as e:
        shutil.rmtree(stage, ignore_errors=True)
        raise UserError(f"--llama-cpp {e}") from None
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(stage, dest)
    seconds = time.perf_counter() - t0
    say(f"{spec} built in {seconds:.0f} s: {dest}")
    return seconds, built_from
