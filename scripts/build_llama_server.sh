#!/usr/bin/env bash
# llama-server from the same pinned llama.cpp the worker runs (the sdist bootstrap.sh downloads), for the
# prefix-cache lane: the rest of bootstrap.sh's CMake build of the tree (its libraries are built already), in the same
# build directory, once; then this only checks it is there. Cached in $FAMILY_CERTIFY_CACHE/llama-server-<pin>/. No network: the web UI is left out
# (the lane talks to the HTTP API only).
# Prints the binary's path on stdout.
set -euo pipefail

LLAMA_CPP_PYTHON=0.3.36          # keep in step with scripts/bootstrap.sh
root=$(cd "$(dirname "$0")/.." && pwd)
cache=${FAMILY_CERTIFY_CACHE:-$HOME/.cache/family-certify}
dest="$cache/llama-server-$LLAMA_CPP_PYTHON"
bin="$dest/bin/llama-server"
say() { echo "build_llama_server: $*" >&2; }

options=$(PYTHONPATH="$root" "${PYTHON:-python3}" -m targets.cmake_build options)
if [ -x "$bin" ] && [ "$(cat "$dest/bin/options" 2>/dev/null)" = "$options" ] && "$bin" --version >/dev/null 2>&1; then
  echo "$bin"
  exit 0
fi

sdist="$cache/sdist/llama_cpp_python-$LLAMA_CPP_PYTHON.tar.gz"
if [ ! -f "$sdist" ]; then
  "$root/scripts/bootstrap.sh"  # downloads the sdist (and builds the worker's llama.cpp) first
fi

# the same CMake build that bootstrap.sh ran for the wheel (targets/cmake_build.py), its llama-server target: the
# libraries it compiled are reused (a machine whose wheel came from elsewhere compiles them here)
say "building llama-server from the pinned llama.cpp (first time only; 2 to 4 minutes on 2 cores)"
PYTHONPATH="$root" "${PYTHON:-python3}" -m targets.cmake_build server "$sdist" "$cache" >/dev/null
[ -x "$bin" ] || { say "no $bin after the build"; exit 1; }
say "ready: $bin"
echo "$bin"
