"""The ggml backend a build compiles in beside the CPU one (--backend), and whether this machine can build and run it.

  cpu      the default: the build everything else is (no extra CMake option; its identity and cache key unchanged)
  blas     OpenBLAS for large matrix products (libopenblas-dev); runs on the CPU, nothing is offloaded
  vulkan   Vulkan (libvulkan-dev, glslc, spirv-headers to build; a Vulkan driver to run: on a machine without a GPU,
           Mesa's software driver, mesa-vulkan-drivers); the worker offloads every layer to the device
  cuda     CUDA (nvcc to build; an NVIDIA driver and device to run)
  metal    Metal (macOS only)

check_backend refuses (UserError: exit 2, one line naming the problem and the fix) a backend whose toolchain or device
is missing, before anything is extracted or built. scripts/install_backend.sh installs the Debian packages.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import re
import shutil
import sys
from pathlib import Path

from synth.errors import UserError
from targets.cmake_build import BACKEND_OPTIONS

BACKENDS = tuple(BACKEND_OPTIONS)
OFFLOADING = ("vulkan", "cuda", "metal")  # backends on a device of their own: the worker offloads every layer there
# the Debian packages each backend needs (scripts/install_backend.sh installs the same)
APT = {"blas": ("libopenblas-dev",),
       "vulkan": ("libvulkan-dev", "glslc", "spirv-headers", "mesa-vulkan-drivers")}
VULKAN_ICDS = ("/usr/share/vulkan/icd.d/*.json", "/etc/vulkan/icd.d/*.json", "/usr/local/share/vulkan/icd.d/*.json")


def fix(backend: str) -> str:
    return (f"install {' '.join(APT[backend])} (scripts/install_backend.sh {backend}) or use --backend cpu")


INCLUDE_DIRS = ("/usr/include", "/usr/include/*", "/usr/include/*/*", "/usr/local/include")
CMAKE_DIRS = ("/usr/share/cmake", "/usr/lib/*/cmake", "/usr/local/share/cmake", "/usr/local/lib/cmake")


def have_header(*names: str) -> bool:
    return any(glob.glob(f"{d}/{n}") for n in names for d in INCLUDE_DIRS)


def cuda_devices() -> tuple[int, str]:
    """(how many CUDA devices the driver reports, why none where it reports none)."""
    try:
        cu = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return 0, "no NVIDIA driver (libcuda.so.1 is not installed)"
    if cu.cuInit(0) != 0:
        return 0, "the NVIDIA driver found no device (cuInit failed)"
    n = ctypes.c_int(0)
    if cu.cuDeviceGetCount(ctypes.byref(n)) != 0 or n.value < 1:
        return 0, "the NVIDIA driver reports no device"
    return n.value, ""


def backend_problem(backend: str) -> str | None:
    """What this machine lacks to build and run the backend, as the one line to print; None if nothing."""
    if backend == "blas":
        if not (ctypes.util.find_library("openblas") and have_header("cblas.h", "openblas/cblas.h")):
            return f"--backend blas: OpenBLAS (its library and cblas.h) is not installed; {fix('blas')}"
    elif backend == "vulkan":
        missing = [what for what, ok in (
            ("glslc", shutil.which("glslc")),
            ("the Vulkan loader and headers", ctypes.util.find_library("vulkan") and have_header("vulkan/vulkan.hpp")),
            ("SPIRV-Headers", any(glob.glob(f"{d}/SPIRV-Headers*") for d in CMAKE_DIRS)),
            ("a Vulkan driver", any(glob.glob(p) for p in VULKAN_ICDS))) if not ok]
        if missing:
            return f"--backend vulkan: {', '.join(missing)} missing; {fix('vulkan')}"
    elif backend == "cuda":
        if not shutil.which("nvcc"):
            return ("--backend cuda: nvcc is not installed (the CUDA toolkit builds the backend); run on a machine "
                    "with the CUDA toolkit and an NVIDIA GPU, or use --backend vulkan, blas or cpu")
        n, why = cuda_devices()
        if not n:
            return (f"--backend cuda: nvcc is installed but there is no CUDA device here: {why}; run on a machine "
                    "with an NVIDIA GPU and its driver, or use --backend vulkan, blas or cpu")
    elif backend == "metal":
        if sys.platform != "darwin":
            return (f"--backend metal: Metal exists only on macOS (this is {sys.platform}); run on a Mac, or use "
                    "--backend vulkan, blas or cpu")
    return None


def vulkan_header_version() -> tuple[int | None, str]:
    """(VK_HEADER_VERSION, the text of vulkan_core.h) of the Vulkan headers the build would compile against."""
    for d in ("/usr/include", "/usr/local/include"):
        f = Path(d) / "vulkan" / "vulkan_core.h"
        if f.is_file():
            text = f.read_text(errors="replace")
            m = re.search(r"#define\s+VK_HEADER_VERSION\s+(\d+)", text)
            return (int(m.group(1)) if m else None), text
    return None, ""


def tree_problem(backend: str, tree: Path) -> str | None:
    """What the tree's backend source needs that this machine's toolchain lacks; None if nothing (checked once the
    tree is at hand, before it is built)."""
    if backend != "vulkan":
        return None
    source = tree / "ggml" / "src" / "ggml-vulkan" / "ggml-vulkan.cpp"
    if not source.is_file():
        return f"--backend vulkan: the tree has no {source.relative_to(tree)}; use a tree with ggml's Vulkan backend"
    version, header = vulkan_header_version()
    # ggml-vulkan creates its instance with VK_EXT_layer_settings' structs, which older headers do not declare
    if "LayerSettingEXT" in source.read_text(errors="replace") and "VK_EXT_layer_settings" not in header:
        return (f"--backend vulkan: the tree's ggml-vulkan uses VK_EXT_layer_settings, which the Vulkan headers here "
                f"(VK_HEADER_VERSION {version}) do not declare; install newer Vulkan headers (libvulkan-dev of "
                "Debian 13, or the Vulkan SDK) or use --backend blas")
    return None


def check_backend(backend: str) -> str:
    """The backend, if it is one this machine can build and run; else UserError (one line: the problem, the fix)."""
    if backend not in BACKENDS:
        raise UserError(f"--backend {backend}: not a backend; use one of {', '.join(BACKENDS)}")
    problem = backend_problem(backend)
    if problem:
        raise UserError(problem)
    return backend
