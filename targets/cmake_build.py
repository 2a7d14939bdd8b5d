"""One CMake build of a llama.cpp tree gives everything the toolkit runs of it: the shared libraries the worker's
bindings load and llama-server. Standard library only: scripts/bootstrap.sh runs it before the venv holds anything.

    python -m targets.cmake_build pinned SDIST CACHE    (library, then server: both)
    python -m targets.cmake_build library SDIST CACHE   (what `make demo` needs: the wheel)
    python -m targets.cmake_build server SDIST CACHE    (llama-server, the rest of the same build)
    python -m targets.cmake_build options          (prints options_id(): what the outputs below are marked with)

builds the tree a llama-cpp-python sdist vendors and writes what `pip wheel` of that sdist would have (a wheel of
its llama_cpp package with the built libraries and headers, into CACHE/wheels) and llama-server (into
CACHE/llama-server-VERSION/bin) — from one build instead of two, the library part first. targets/builds.py builds
other trees (and patch series) with the same function.

A tree is synced into a work directory and built there incrementally, so another patch series on the same tree
recompiles a few objects, not the tree. What is recompiled follows the content, not the files' dates: a file whose
bytes differ is rewritten with a fresh modification time (never the source's: a file a series reverts to the
pristine tree would otherwise arrive older than the object compiled from the series before, and ninja would keep
that object), and the work directory records each file's sha256 as its last successful build compiled it. A build
directory without that record (made before it was kept) holds objects of unknown origin and is built afresh.
"""

from __future__ import annotations

import base64
import contextlib
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
import zipfile
from collections.abc import Iterator
from pathlib import Path

# GGML_NATIVE off: a portable build (on x86-64: AVX2, FMA, F16C, BMI2 — no AVX-512, no AMX), the same code on every
# machine that builds or is handed it, instead of one tuned to the builder. The native build on an AMX host (Sapphire
# Rapids) repacks quantized weights for its AMX kernels and crashes in them (SIGSEGV / SIGILL decoding any q8_0,
# q4_0, q4_1 or k-quant fixture; upstream: ggml_backend_amx_mul_mat, ggml-org/llama.cpp#20824), so the battery's
# results depended on the CI runner drawn. A machine-tuned build is certified as a source tree: --llama-cpp TREE.
CMAKE_OPTIONS = ("-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=ON", "-DCMAKE_BUILD_RPATH_USE_ORIGIN=ON",
                 "-DGGML_NATIVE=OFF",
                 "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_TOOLS=ON", "-DLLAMA_BUILD_TESTS=OFF",
                 "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF",
                 "-DLLAMA_OPENSSL=OFF", "-DLLAMA_CURL=OFF")
TARGETS = ("llama", "llama-server")
# what the bindings load (the wheel: ggml and libllama), built first: the rest of the same build (llama.cpp's common
# library, mtmd, llama-server) the first time something needs llama-server, incrementally in the same build directory
LIBRARY = ("llama",)
WHEEL_LIBS = ("libllama.so*", "libggml*.so*")  # the wheel's libraries: the same whichever targets were built
# the ggml backend compiled in beside the CPU one: its CMake options, added to CMAKE_OPTIONS. cpu adds none (the
# build everything else is); blas routes large matrix products to OpenBLAS; the GPU backends need their toolchain
# and a device (targets/backends.py checks both before anything is built)
BACKEND_OPTIONS: dict[str, tuple[str, ...]] = {
    "cpu": (),
    "blas": ("-DGGML_BLAS=ON", "-DGGML_BLAS_VENDOR=OpenBLAS"),
    "vulkan": ("-DGGML_VULKAN=ON",),
    "cuda": ("-DGGML_CUDA=ON",),
    "metal": ("-DGGML_METAL=ON",),
}


# A coverage build (`family-certify coverage`) compiles llama.cpp's own sources — COVERAGE_SOURCES, the directories
# libllama, llama-server and its common library are built from — with gcc's --coverage at -O0, so each line's count
# is its own (at -O3 inlined and merged code leaves lines that ran marked unexecuted); ggml stays optimized (the
# lanes' compute is ggml's, and its code is not what the coverage measures). Counts are updated atomically:
# llama-server's HTTP threads and its main loop run the same code. Every library and executable links libgcov.
COVERAGE_SOURCES = ("src", "tools/server", "common")
COVERAGE_FLAGS = ("-O0", "--coverage", "-fprofile-update=atomic")
COVERAGE_MARK = f"coverage: {' '.join(COVERAGE_FLAGS)} on {', '.join(COVERAGE_SOURCES)}"  # in options_id and identity
LAUNCHER = "coverage-cc"  # in a coverage build's work directory: the compiler launcher that adds COVERAGE_FLAGS


def cmake_options(backend: str = "cpu") -> tuple[str, ...]:
    """CMAKE_OPTIONS with the backend's options added (cpu: CMAKE_OPTIONS as they are)."""
    return CMAKE_OPTIONS + BACKEND_OPTIONS[backend]


def coverage_options(work: Path) -> tuple[str, ...]:
    """The CMake options that make the build in `work` a coverage build: its compiler launcher (written into the work
    directory) adds COVERAGE_FLAGS to the compilation of a file under COVERAGE_SOURCES of the synced tree."""
    root = (work / "src").resolve()
    cases = "|".join(f'"$root"/{d}/*' for d in COVERAGE_SOURCES)
    launcher = work / LAUNCHER
    launcher.write_text("#!/bin/sh\n# CMAKE_CXX_COMPILER_LAUNCHER of a coverage build (targets/cmake_build.py): "
                        "ROOT COMPILER ARGS...\nroot=$1; shift\n"
                        f'for a in "$@"; do case "$a" in {cases}) exec "$@" {" ".join(COVERAGE_FLAGS)};; esac; done\n'
                        'exec "$@"\n')
    launcher.chmod(0o755)
    return (f"-DCMAKE_CXX_COMPILER_LAUNCHER={launcher};{root}", "-DCMAKE_SHARED_LINKER_FLAGS=--coverage",
            "-DCMAKE_EXE_LINKER_FLAGS=--coverage")


def options_id(backend: str = "cpu", coverage: bool = False) -> str:
    """A short name for the build's CMake options: the pinned build's outputs carry it (scripts/bootstrap.sh rebuilds
    a cached wheel or llama-server built with other options)."""
    return hashlib.sha256(" ".join(cmake_options(backend) + ((COVERAGE_MARK,) if coverage else ()))
                          .encode()).hexdigest()[:12]


OPTIONS_MARK = "family-certify-options"  # in a build directory: options_id() of its last configure


def forget_other_options(build: Path, backend: str = "cpu", coverage: bool = False) -> bool:
    """A build directory configured with other options (or before they were marked) loses its CMake cache, so the
    next configure starts from CMake's defaults: an option the old cache holds (GGML_AVX2 off, as a native
    configure leaves it) would otherwise outlive the change. True if it was forgotten."""
    mark = build / OPTIONS_MARK
    if (build / "CMakeCache.txt").is_file() and \
            (not mark.is_file() or mark.read_text().strip() != options_id(backend, coverage)):
        (build / "CMakeCache.txt").unlink()
        return True
    return False


class BuildError(Exception):
    """The build of a tree failed; the message names the tree, the step and the log."""


class BadSdist(BuildError):
    """What was to be built is not a readable llama-cpp-python sdist (bad input: exit 2, not a failed build)."""


def say(msg: str) -> None:
    print(f"build: {msg}", file=sys.stderr, flush=True)


BUILT_FROM = "family-certify-built-from.json"  # in a work directory: each source file's sha256, as last compiled


def tracked(rel: str) -> bool:
    """Whether a tree's file is part of its content (.git and a top-level build directory are not)."""
    parts = rel.split("/")
    return parts[0] != "build" and ".git" not in parts


def file_digests(root: Path) -> dict[str, str]:
    """Each file's sha256 under root by its relative path (a symlink: of its target's name; what is not `tracked`
    left out)."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if not tracked(rel) or not (p.is_file() or p.is_symlink()):
            continue
        data = os.readlink(p).encode() if p.is_symlink() else p.read_bytes()
        out[rel] = hashlib.sha256(data).hexdigest()
    return out


def tree_digest(files: dict[str, str]) -> str:
    """One sha256 over every file's path and content digest (file_digests), sorted: a tree's content."""
    h = hashlib.sha256()
    for rel in sorted(files):
        h.update(rel.encode() + b"\0")
        h.update(bytes.fromhex(files[rel]))
    return h.hexdigest()


def sync_tree(src: Path, dst: Path, *, stale: set[str] = frozenset(), newer_than: int = 0) -> int:
    """Make `dst` hold exactly `src`'s files, rewriting only those whose bytes differ from dst's or that are `stale`
    (relative paths whose content differs from what the build last compiled); a file rewritten gets a modification
    time of now and after `newer_than` (ns), so the build recompiles what depends on it — never the source's own
    time. Unchanged files keep theirs: another patch series on the same tree costs a few objects. Returns how many
    files were written or removed."""
    changed = 0
    want = {p.relative_to(src) for p in src.rglob("*") if p.is_file() or p.is_symlink()}
    for rel in sorted(want):
        a, b = src / rel, dst / rel
        if b.is_file() and not b.is_symlink() and not a.is_symlink() and rel.as_posix() not in stale \
                and a.read_bytes() == b.read_bytes():
            continue
        b.parent.mkdir(parents=True, exist_ok=True)
        if b.is_symlink() or b.exists():
            b.unlink()
        if a.is_symlink():
            os.symlink(os.readlink(a), b)
        else:
            shutil.copyfile(a, b)
            shutil.copymode(a, b)
        now = max(time.time_ns(), newer_than + 1_000_000)
        os.utime(b, ns=(now, now), follow_symlinks=False)
        changed += 1
    for p in sorted(dst.rglob("*"), reverse=True):
        rel = p.relative_to(dst)
        if (p.is_file() or p.is_symlink()) and rel not in want:
            p.unlink()
            changed += 1
    return changed


def read_built_from(work: Path) -> dict[str, str] | None:
    """The record of what the work directory's build last compiled (path → sha256), or None."""
    try:
        data = json.loads((work / BUILT_FROM).read_text())
    except (OSError, ValueError):
        return None
    return data.get("files") if isinstance(data, dict) and isinstance(data.get("files"), dict) else None


@contextlib.contextmanager
def built(src: Path, work: Path, label: str, backend: str = "cpu", coverage: bool = False,
          targets: tuple[str, ...] = TARGETS) -> Iterator[tuple[Path, str]]:
    """The tree built: `src` synced into work/src, configured and compiled in work/build (both kept for the next
    build of this tree); yields the directory holding the libraries and llama-server and the content digest of the
    tree they were verified to be compiled from (tree_digest), under the work directory's lock (one build at a time
    in it, and nobody rebuilds it while the caller copies the outputs)."""
    import fcntl

    t0 = time.perf_counter()
    work.mkdir(parents=True, exist_ok=True)
    with (work / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        build = work / "build"
        compiled = read_built_from(work)
        if compiled is None and build.exists():  # objects whose sources nothing recorded: not reused
            say(f"{build}: no record of what it was compiled from; building afresh")
            shutil.rmtree(build)
        record = work / BUILT_FROM
        stamp = record.stat().st_mtime_ns if record.is_file() else 0
        want = file_digests(src)
        stale = set() if compiled is None else {rel for rel, h in want.items() if compiled.get(rel) != h}
        changed = sync_tree(src, work / "src", stale=stale, newer_than=stamp)
        gen = ["-G", "Ninja"] if shutil.which("ninja") else []
        forget_other_options(build, backend, coverage)
        options = cmake_options(backend) + (coverage_options(work) if coverage else ())
        fresh = not (build / "CMakeCache.txt").is_file()
        what = "llama.cpp's libraries and llama-server" if "llama-server" in targets else "llama.cpp's libraries"
        say(f"building {label}: {what}, one CMake build "
            + ("(several minutes on 2 cores)" if fresh else f"(incremental: {changed} files changed)"))
        steps = [("configure", ["cmake", "-S", str(work / "src"), "-B", str(build), *gen, *options]),
                 ("compile", ["cmake", "--build", str(build), "--target", *targets, "-j", str(os.cpu_count() or 2)])]
        for what, argv in steps:
            log = work / f"{what}.log"
            with log.open("w") as f:
                r = subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT)
            if r.returncode != 0:
                tail = log.read_text(errors="replace").strip().splitlines()[-12:]
                raise BuildError(f"{label}: the build failed ({what}; log {log}): " + " | ".join(tail)[-600:])
            say(f"{what} done ({time.perf_counter() - t0:.0f} s)")
            if what == "configure":
                (build / OPTIONS_MARK).write_text(options_id(backend, coverage) + "\n")
        # what was compiled is what was asked for: the synced tree still holds exactly src's content
        got = file_digests(work / "src")
        if got != want:
            odd = sorted(set(got.items()) ^ set(want.items()))[0][0]
            raise BuildError(f"{label}: {work / 'src'} changed during the build ({odd}); build again")
        tmp = record.with_name(record.name + ".tmp")
        tmp.write_text(json.dumps({"digest": tree_digest(want), "files": want}, sort_keys=True) + "\n")
        os.replace(tmp, record)
        yield build / "bin", tree_digest(want)


def copy_bindings(bindings: Path, out: Path, pkg: Path, *, leave: tuple[str, ...] = ("server",),
                  libs: tuple[str, ...] = ("lib*.so*",)) -> None:
    """A llama_cpp package as the worker loads it: the bindings' python files (but `leave`: the OpenAI server
    subpackage, which no worker imports), lib/ the built libraries (those matching `libs`)."""
    shutil.copytree(bindings, pkg, ignore=shutil.ignore_patterns("lib", "__pycache__", *leave))
    (pkg / "lib").mkdir()
    for lib in sorted({x for pattern in libs for x in out.glob(pattern)}):
        shutil.copy2(lib, pkg / "lib" / lib.name, follow_symlinks=False)


def copy_server(out: Path, dest: Path) -> None:
    """llama-server with the libraries beside it (its $ORIGIN rpath finds them there)."""
    dest.mkdir(parents=True)
    for lib in sorted(out.glob("lib*.so*")):
        shutil.copy2(lib, dest / lib.name, follow_symlinks=False)
    shutil.copy2(out / "llama-server", dest / "llama-server")


# ---- the pinned build: the wheel and llama-server bootstrap.sh installs --------------------------------------
def extract_sdist(path: Path, into: Path) -> tuple[Path, Path]:
    """(its vendored llama.cpp tree, its llama_cpp bindings package) of a llama-cpp-python sdist, extracted under
    `into` (with its PKG-INFO beside them)."""
    try:
        with tarfile.open(path) as tar:
            members = [m for m in tar.getmembers()
                       if (re.match(r"[^/]+/(vendor/llama\.cpp|llama_cpp)/", m.name + "/") and "/.git" not in m.name)
                       or re.fullmatch(r"[^/]+/PKG-INFO", m.name)]
            tar.extractall(into, members=members, filter="data")
        (top,) = {m.name.split("/")[0] for m in members}
    except (tarfile.TarError, EOFError, ValueError) as e:  # (ValueError: no llama.cpp tree in it, or two tops)
        why = str(e).splitlines()[0] if str(e) else "no vendored llama.cpp tree in it"
        raise BadSdist(f"{path}: not a readable llama-cpp-python sdist ({why}); delete it (a partial download?) "
                       "and run again: it is downloaded afresh") from None
    return into / top / "vendor" / "llama.cpp", into / top / "llama_cpp"



def wheel_tag() -> str:
    import sysconfig

    return "py3-none-" + re.sub(r"[-.]", "_", sysconfig.get_platform())


def write_wheel(pkg: Path, headers: list[Path], metadata: str, version: str, out_dir: Path) -> Path:
    """A wheel of the llama_cpp package (its python files and lib/), the headers in include/ (where pip's build of
    the sdist puts them), and the sdist's metadata: what `pip install` takes without compiling anything."""
    dist = f"llama_cpp_python-{version}.dist-info"
    files: list[tuple[str, bytes, int]] = []
    for p in sorted(pkg.rglob("*")):
        if p.is_symlink():  # libfoo.so -> libfoo.so.0: a wheel has no links; the loader needs the names
            files.append((f"llama_cpp/{p.relative_to(pkg).as_posix()}", p.resolve().read_bytes(), 0o755))
        elif p.is_file():
            files.append((f"llama_cpp/{p.relative_to(pkg).as_posix()}", p.read_bytes(),
                          0o755 if ".so" in p.name else 0o644))
    files += [(f"include/{h.name}", h.read_bytes(), 0o644) for h in headers]
    files += [(f"{dist}/METADATA", metadata.encode(), 0o644),
              (f"{dist}/WHEEL", f"Wheel-Version: 1.0\nGenerator: family-certify\nRoot-Is-Purelib: false\n"
                                f"Tag: {wheel_tag()}\n".encode(), 0o644),
              (f"{dist}/top_level.txt", b"llama_cpp\n", 0o644)]
    record = "".join(f"{name},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()}"
                     f",{len(data)}\n" for name, data, _ in files) + f"{dist}/RECORD,,\n"
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / f"llama_cpp_python-{version}-{wheel_tag()}.whl"
    tmp = out.with_name(out.name + f".{os.getpid()}.tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data, mode in [*files, (f"{dist}/RECORD", record.encode(), 0o644)]:
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = (0o100000 | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
    os.replace(tmp, out)
    return out


def pinned(sdist: Path, cache: Path, *, server: bool = True, wheel: bool = True) -> tuple[Path | None, Path | None]:
    """The sdist's tree built: its wheel (CACHE/wheels: ggml and libllama, what the bindings load) and, with `server`,
    llama-server (CACHE/llama-server-VERSION/bin) from the same build — without it only the libraries are compiled,
    and llama-server is compiled later in the same build directory, incrementally (`server` then, wheel False)."""
    version = re.fullmatch(r"llama_cpp_python-(.+)\.tar\.gz", sdist.name)[1]
    t0 = time.perf_counter()
    made: Path | None = None
    with tempfile.TemporaryDirectory(prefix="family-certify-build-") as tmp:
        src, bindings = extract_sdist(sdist, Path(tmp))
        top = bindings.parent
        headers = [src / "include" / "llama.h", *sorted((src / "ggml" / "include").glob("*.h"))]
        with built(src, cache / "builds" / f"work-pypi-{version}", f"llama-cpp-python {version}",
                   targets=TARGETS if server else LIBRARY) as (out, _):
            if wheel:
                pkg = Path(tmp) / "wheel" / "llama_cpp"
                copy_bindings(bindings, out, pkg, leave=(), libs=WHEEL_LIBS)  # the python files as pip's wheel has
                made = write_wheel(pkg, headers, (top / "PKG-INFO").read_text(), version, cache / "wheels")
                (cache / "wheels" / f"llama_cpp_python-{version}.options").write_text(options_id() + "\n")
            dest = cache / f"llama-server-{version}"
            if server:
                shutil.rmtree(dest / "bin.tmp", ignore_errors=True)
                copy_server(out, dest / "bin.tmp")
                (dest / "bin.tmp" / "options").write_text(options_id() + "\n")
                shutil.rmtree(dest / "bin", ignore_errors=True)
                os.replace(dest / "bin.tmp", dest / "bin")
    parts = " and ".join(x for x, on in (("wheel", wheel), ("llama-server", server)) if on)
    say(f"llama-cpp-python {version}: {parts} in {time.perf_counter() - t0:.0f} s")
    return made, dest / "bin" / "llama-server" if server else None


def main(argv: list[str]) -> int:
    if argv == ["options"]:
        print(options_id())
        return 0
    parts = {"pinned": (True, True), "library": (False, True), "server": (True, False)}  # (server, wheel)
    if len(argv) != 3 or argv[0] not in parts:
        print("usage: python -m targets.cmake_build pinned|library|server SDIST CACHE | options", file=sys.stderr)
        return 2
    server, wheel = parts[argv[0]]
    try:
        made = pinned(Path(argv[1]), Path(argv[2]), server=server, wheel=wheel)
    except BuildError as e:
        print(f"build: error: {e}", file=sys.stderr)
        return 2 if isinstance(e, BadSdist) else 1
    for path in made:
        if path is not None:
            print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
