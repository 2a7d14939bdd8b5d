#!/usr/bin/env bash
# Build llama-server from the same pinned llama.cpp the worker runs (the sdist bootstrap.sh downloads), for the
# prefix-cache lane. Once per machine: the binary is cached in $FAMILY_CERTIFY_CACHE/llama-server-<pin>/ and
# later runs only check it. No network: the web UI is left out (the lane talks to the HTTP API only).
# Prints the binary's path on stdout.
set -euo pipefail

LLAMA_CPP_PYTHON=0.3.36          # keep in step with scripts/bootstrap.sh
root=$(cd "$(dirname "$0")/.." && pwd)
cache=${FAMILY_CERTIFY_CACHE:-$HOME/.cache/family-certify}
dest="$cache/llama-server-$LLAMA_CPP_PYTHON"
bin="$dest/bin/llama-server"
say() { echo "build_llama_server: $*" >&2; }

if [ -x "$bin" ] && "$bin" --version >/dev/null 2>&1; then
  echo "$bin"
  exit 0
fi

sdist="$cache/sdist/llama_cpp_python-$LLAMA_CPP_PYTHON.tar.gz"
if [ ! -f "$sdist" ]; then
  "$root/scripts/bootstrap.sh"  # downloads the sdist (and builds the worker's llama.cpp) first
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
tar -xzf "$sdist" -C "$work" "llama_cpp_python-$LLAMA_CPP_PYTHON/vendor/llama.cpp"
src="$work/llama_cpp_python-$LLAMA_CPP_PYTHON/vendor/llama.cpp"
say "building llama-server from the pinned llama.cpp (first time only; several minutes on 2 cores)"
gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
cmake -S "$src" -B "$work/build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON \
  -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF \
  -DBUILD_SHARED_LIBS=OFF >"$work/configure.log" 2>&1 || { tail -20 "$work/configure.log" >&2; exit 1; }
cmake --build "$work/build" --target llama-server -j "$(nproc)" >"$work/build.log" 2>&1 \
  || { tail -30 "$work/build.log" >&2; exit 1; }
mkdir -p "$dest/bin.tmp"
cp "$work/build/bin/llama-server" "$dest/bin.tmp/"
rm -rf "$dest/bin" && mv "$dest/bin.tmp" "$dest/bin"
say "ready: $bin"
echo "$bin"
