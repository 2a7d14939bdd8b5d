#!/usr/bin/env bash
# The Debian packages a second ggml backend needs to build and run (--backend BACKEND; targets/backends.py names the
# same packages when it refuses one). Idempotent: installs only what is missing, and runs apt-get only then.
#   scripts/install_backend.sh blas      OpenBLAS
#   scripts/install_backend.sh vulkan    the Vulkan loader and headers, glslc, SPIRV-Headers, and Mesa's drivers
#                                        (lavapipe: Vulkan on the CPU, for a machine without a GPU)
# cpu needs nothing; cuda and metal need a machine with their GPU and toolkit, which no package here provides.
set -euo pipefail

case "${1:-}" in
  blas) pkgs=(libopenblas-dev) ;;
  vulkan) pkgs=(libvulkan-dev glslc spirv-headers mesa-vulkan-drivers) ;;
  cpu) exit 0 ;;
  cuda | metal)
    echo "install_backend: $1: no Debian package provides its GPU and toolkit; run on a machine that has them" >&2
    exit 2 ;;
  *)
    echo "usage: scripts/install_backend.sh blas|vulkan" >&2
    exit 2 ;;
esac

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install_backend: $1: ${pkgs[*]} already installed" >&2
  exit 0
fi
sudo=()
[ "$(id -u)" -eq 0 ] || sudo=(sudo)
echo "install_backend: $1: installing ${missing[*]}" >&2
"${sudo[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
