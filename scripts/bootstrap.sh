#!/usr/bin/env bash
# Set up .venv with the pinned real llama.cpp (llama-cpp-python built from source) and this project.
# Idempotent: a second run only checks a stamp. The llama.cpp wheel is built once per machine into
# $FAMILY_CERTIFY_CACHE (default ~/.cache/family-certify) and reused by every later setup and clone.
set -euo pipefail

LLAMA_CPP_PYTHON=0.3.36          # vendors llama.cpp b11312, commit 0c1e570
GGUF_PY=0.19.0                   # gguf-py from the same vendored tree (PyPI's 0.19.0 lacks newer archs)

root=$(cd "$(dirname "$0")/.." && pwd)
cache=${FAMILY_CERTIFY_CACHE:-$HOME/.cache/family-certify}
py=${PYTHON:-python3}
venv="$root/.venv"
stamp="$venv/.bootstrap-stamp"
# every other Python package at an exact version (a bump there is a one-line reviewed change, and re-installs)
constraints="$root/constraints.txt"
[ -f "$constraints" ] || { echo "bootstrap: $constraints is missing (it pins every dependency)" >&2; exit 1; }
# the pinned build's CMake options, named (targets/cmake_build.py): a wheel built with others is built again
options=$(PYTHONPATH="$root" "$py" -m targets.cmake_build options)
want="$LLAMA_CPP_PYTHON $options $GGUF_PY $(sha256sum "$root/pyproject.toml" | cut -c1-16) $(sha256sum "$constraints" | cut -c1-16)"

# byte-compile the checkout every time (quick; a no-op when nothing changed): every worker process imports
# targets/, and an environment with PYTHONDONTWRITEBYTECODE would otherwise recompile it at each start
if [ -x "$venv/bin/python" ]; then
  "$venv/bin/python" -m compileall -q "$root/synth" "$root/fuzz" "$root/targets" >/dev/null || true
fi

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi

say() { echo "bootstrap: $*" >&2; }
mkdir -p "$cache/sdist" "$cache/wheels"
sdist="$cache/sdist/llama_cpp_python-$LLAMA_CPP_PYTHON.tar.gz"
# read whole before anything is built from it (a second a run: not when the wheels are cached and nothing is)
readable_sdist() {
  tar -tzf "$sdist" >/dev/null 2>&1 && return
  say "error: $sdist is not a readable sdist (a partial download?): delete it and run make bootstrap again"
  exit 2
}
wheel=$(ls "$cache"/wheels/llama_cpp_python-"$LLAMA_CPP_PYTHON"-*.whl 2>/dev/null | head -1 || true)
built_with=$(cat "$cache/wheels/llama_cpp_python-$LLAMA_CPP_PYTHON.options" 2>/dev/null || true)
build=""; if [ -z "$wheel" ] || [ "$built_with" != "$options" ]; then build=1; fi
# a cached sdist the build needs is checked first: a partial download is named before the venv is made
if [ -n "$build" ] && [ -f "$sdist" ]; then readable_sdist; fi

[ -x "$venv/bin/python" ] || { say "creating $venv"; "$py" -m venv "$venv"; }
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)

if [ ! -f "$sdist" ]; then
  say "downloading llama-cpp-python $LLAMA_CPP_PYTHON sdist"
  "${pip[@]}" download --no-deps --no-binary :all: "llama-cpp-python==$LLAMA_CPP_PYTHON" -d "$cache/sdist"
  [ -z "$build" ] || readable_sdist
fi

build_pid=""
if [ -n "$build" ]; then
  # one CMake build of the vendored tree gives the wheel's libraries and llama-server (targets/cmake_build.py;
  # standard library only, so the system Python runs it before the venv holds anything). It runs in a process
  # group of its own while the venv gets every other pinned package (downloads, not compiling: the two overlap);
  # a bootstrap that stops early stops the build with it.
  say "building llama.cpp's libraries from source for the wheel (first setup only; 2 to 3 minutes on 2 cores; llama-server, the rest of the same build, comes with make server or make test)"
  group=(); if command -v setsid >/dev/null; then group=(setsid); fi  # (macOS has no setsid: the build alone)
  PYTHONPATH="$root" ${group[@]+"${group[@]}"} "$py" -m targets.cmake_build library "$sdist" "$cache" >/dev/null &
  build_pid=$!
  trap 'kill -- -"$build_pid" 2>/dev/null || kill "$build_pid" 2>/dev/null || true' EXIT
fi

# while the build runs: every package constraints.txt pins (it lists them all: the installs below find them there)
"${pip[@]}" install -r "$constraints"

gguf_wheel=$(ls "$cache"/wheels/gguf-"$GGUF_PY"-*.whl 2>/dev/null | head -1 || true)
if [ -z "$gguf_wheel" ]; then
  [ -n "$build" ] || readable_sdist  # (a build needs the sdist: it was read whole above)
  say "building gguf-py $GGUF_PY from the pinned llama.cpp tree"
  tmp=$(mktemp -d)
  tar -xzf "$sdist" -C "$tmp" "llama_cpp_python-$LLAMA_CPP_PYTHON/vendor/llama.cpp/gguf-py"
  "${pip[@]}" wheel --no-deps "$tmp/llama_cpp_python-$LLAMA_CPP_PYTHON/vendor/llama.cpp/gguf-py" -w "$cache/wheels"
  rm -rf "$tmp"
  gguf_wheel=$(ls "$cache"/wheels/gguf-"$GGUF_PY"-*.whl | head -1)
fi

if [ -n "$build_pid" ]; then
  wait "$build_pid" || exit $?  # (its one line above names what failed and the log)
  trap - EXIT
  wheel=$(ls "$cache"/wheels/llama_cpp_python-"$LLAMA_CPP_PYTHON"-*.whl | head -1)
fi

say "installing into $venv"
# their dependencies and the project's are all in constraints.txt, installed above (pip check agrees: the tests
# check it); --force-reinstall: over an earlier install of the same versions too (a rebuilt wheel keeps its version
# number, and pip would call it satisfied)
"${pip[@]}" install --force-reinstall --no-deps "$wheel" "$gguf_wheel"
# compat mode: a path entry to the checkout, so new modules and packages need no reinstall; made by the venv's
# setuptools (pinned), not one pip would fetch into an isolated build environment on every run
"${pip[@]}" install --no-deps --no-build-isolation -e "$root" --config-settings editable_mode=compat
# the worker's native helpers (targets/native.c); workers also build them on first use if missing
"$venv/bin/python" -m targets.native >&2
"$venv/bin/python" -m compileall -q "$root/synth" "$root/fuzz" "$root/targets" >/dev/null
echo "$want" > "$stamp"
say "ready"
