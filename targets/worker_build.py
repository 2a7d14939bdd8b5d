"""The build a llama.cpp worker runs, as the worker process finds it: the pinned llama-cpp-python and llama.cpp
commit, or another build's commit and ggml backend (its identity, FAMILY_CERTIFY_BUILD); the devices ggml registered;
and its libraries loaded — the bindings without the package's high-level API, libggml-base for the capture callback.

Apart from the worker's ops (targets/llama_cpp_worker.py): the llama-server worker reports the same build and runs
on the same device, and the build cache (targets/builds.py) reads the same pins, without the llama.cpp worker.
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import os
import re
import sys
import types
from pathlib import Path
from typing import Any

PINNED_LLAMA_CPP_PYTHON = "0.3.36"
PINNED_LLAMA_CPP_COMMIT = "0c1e57098bba43ac29e6e3b677cdceebdd22334f"  # build b11312, vendored by 0.3.36


def build_commit() -> str | None:
    """The llama.cpp commit of the build this worker runs: the pinned one, or what the build's identity says
    (targets/builds.py puts it in FAMILY_CERTIFY_BUILD; None where the tree does not say)."""
    raw = os.environ.get("FAMILY_CERTIFY_BUILD")
    return json.loads(raw).get("llama_cpp_commit") if raw else PINNED_LLAMA_CPP_COMMIT


def build_backend() -> str:
    """The ggml backend the build this worker runs was compiled with (its identity names it unless it is cpu)."""
    raw = os.environ.get("FAMILY_CERTIFY_BUILD")
    return json.loads(raw).get("backend", "cpu") if raw else "cpu"


def backend_environment() -> str:
    """The build's backend, with what this process (and a llama-server it starts) needs in the environment to run on
    its device."""
    backend = build_backend()
    if backend == "vulkan":
        # ggml's Vulkan backend skips a CPU-type device (Mesa's lavapipe, a machine without a GPU) unless it is
        # named: the first device the Vulkan loader lists, unless the user chose (GGML_VK_VISIBLE_DEVICES)
        os.environ.setdefault("GGML_VK_VISIBLE_DEVICES", "0")
    return backend


# backends on a device of their own (targets/backends.py OFFLOADING), by the name ggml registers them under: the
# worker offloads every layer to one device of it, as a runtime serving on that device does
DEVICE_BACKENDS = {"vulkan": "Vulkan", "cuda": "CUDA", "metal": "MTL"}
GGML_DEV_CPU = 0  # enum ggml_backend_dev_type: CPU, GPU, IGPU, ACCEL


def ggml_devices(L: Any) -> list[tuple[int, str, str, str]]:
    """The devices ggml registered in this process: (handle, backend name, device name, description)."""
    g = ctypes.CDLL(str(Path(L.__file__).parent / "lib" / "libggml.so"))
    g.ggml_backend_dev_count.restype = ctypes.c_size_t
    g.ggml_backend_dev_get.restype = ctypes.c_void_p
    g.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
    for f in ("ggml_backend_dev_name", "ggml_backend_dev_description", "ggml_backend_reg_name"):
        getattr(g, f).restype = ctypes.c_char_p
        getattr(g, f).argtypes = [ctypes.c_void_p]
    g.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
    g.ggml_backend_dev_backend_reg.restype = ctypes.c_void_p
    g.ggml_backend_dev_backend_reg.argtypes = [ctypes.c_void_p]
    out = []
    for i in range(g.ggml_backend_dev_count()):
        d = g.ggml_backend_dev_get(i)
        if g.ggml_backend_dev_type(d) == GGML_DEV_CPU:
            continue
        out.append((d, g.ggml_backend_reg_name(g.ggml_backend_dev_backend_reg(d)).decode(),
                    g.ggml_backend_dev_name(d).decode(), g.ggml_backend_dev_description(d).decode()))
    return out


def llama_bindings() -> Any:
    """llama-cpp-python's ctypes bindings (llama_cpp.llama_cpp) with its version as __version__.

    `import llama_cpp` also imports the high-level API (jinja2, chat formats): 0.15 s more per worker start,
    for nothing the worker uses. Unless the package is already imported, the bindings are loaded without
    running the package's __init__."""
    if "llama_cpp" not in sys.modules:
        spec = importlib.util.find_spec("llama_cpp")
        if spec is None or not spec.submodule_search_locations:
            raise ImportError("llama_cpp is not installed (run scripts/bootstrap.sh)")
        pkg = types.ModuleType("llama_cpp")
        pkg.__path__ = list(spec.submodule_search_locations)
        pkg.__spec__ = spec
        init = Path(spec.origin or "").read_text(errors="replace") if spec.origin else ""
        m = re.search(r'^__version__\s*=\s*["\']([^"\']+)', init, re.M)
        pkg.__version__ = m.group(1) if m else "unknown"
        sys.modules["llama_cpp"] = pkg
    import llama_cpp.llama_cpp as bindings

    bindings.__version__ = sys.modules["llama_cpp"].__version__
    return bindings


def ggml_base(L: Any) -> ctypes.CDLL:
    """libggml-base beside the bindings' libllama, with the few functions the capture callback uses."""
    ggml = ctypes.CDLL(str(Path(L.__file__).parent / "lib" / "libggml-base.so"))
    ggml.ggml_get_name.restype = ctypes.c_char_p
    ggml.ggml_get_name.argtypes = [ctypes.c_void_p]
    ggml.ggml_nbytes.restype = ctypes.c_size_t
    ggml.ggml_nbytes.argtypes = [ctypes.c_void_p]
    ggml.ggml_op_desc.restype = ctypes.c_char_p  # for traced nodes: "MUL_MAT", "ROPE", "SOFT_MAX", ...
    ggml.ggml_op_desc.argtypes = [ctypes.c_void_p]
    ggml.ggml_backend_tensor_get.restype = None
    ggml.ggml_backend_tensor_get.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t]
    return ggml
