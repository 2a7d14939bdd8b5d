"""A second ggml backend as a build option (--backend, targets/backends.py): one build per tree and backend, cached
under a key the backend's CMake options enter (cpu: the key and identity every build had before); a backend this
machine cannot build or run refused in one line with exit 2 before anything is built; the worker offloading every
layer to the backend's device. Building one takes minutes: that lane is slow (docs/backends.md)."""

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_builds import one_line_exit_2

from fuzz.certify.schemas import validate
from targets import backends, builds
from targets.cmake_build import BACKEND_OPTIONS, CMAKE_OPTIONS, cmake_options, options_id

from conftest import ROOT, run_cli


def test_cpu_adds_no_option_and_keeps_the_options_id():
    """The marks on the pinned wheel and llama-server (scripts/bootstrap.sh) and the CMake cache of the cpu work
    directories are options_id(): cpu's must be the one CMAKE_OPTIONS alone give, or everything rebuilds."""
    assert cmake_options() == cmake_options("cpu") == CMAKE_OPTIONS
    assert options_id("cpu") == hashlib.sha256(" ".join(CMAKE_OPTIONS).encode()).hexdigest()[:12]
    ids = {b: options_id(b) for b in BACKEND_OPTIONS}
    assert len(set(ids.values())) == len(ids), ids
    assert "-DGGML_VULKAN=ON" in cmake_options("vulkan") and "-DGGML_BLAS=ON" in cmake_options("blas")


@pytest.fixture
def no_build(monkeypatch):
    """Resolving goes as far as the cache: every backend passes the machine check, every entry counts as built."""
    monkeypatch.setattr(builds, "check_backend", lambda b: b)
    monkeypatch.setattr(builds, "tree_problem", lambda backend, tree: None)
    monkeypatch.setattr(builds, "cached_build", lambda dest, tree: True)
    monkeypatch.setattr(builds, "_RESOLVED", {})
    monkeypatch.delenv(builds.BACKEND_ENV, raising=False)


def test_a_backend_enters_the_identity_and_the_cache_key_and_cpu_keeps_both(no_build):
    cpu = builds.resolve("pypi:" + builds.PINNED, from_env=False)
    # the key as it was computed before backends were options: the same fields, CMAKE_OPTIONS alone
    old = hashlib.sha256(json.dumps({"tree_sha256": cpu.identity["tree_sha256"], "bindings_sha256": None,
                                     "options": list(CMAKE_OPTIONS), "llama_cpp_python": builds.PINNED},
                                    sort_keys=True).encode()).hexdigest()[:16]
    assert cpu.identity["key"] == old and "backend" not in cpu.identity and cpu.backend == "cpu"
    assert cpu.identity["options"] == list(CMAKE_OPTIONS)
    keys = {"cpu": old}
    for b in ("blas", "vulkan"):
        got = builds.resolve("pinned", from_env=False, backend=b)
        assert got.backend == b and got.identity["backend"] == b
        assert got.identity["tree_sha256"] == cpu.identity["tree_sha256"]  # the pinned sdist's tree, like pypi:
        assert got.identity["options"] == list(cmake_options(b))
        assert got.bindings == builds.cache_dir() / "builds" / got.identity["key"] / "py"
        assert json.loads(got.env()[builds.IDENTITY_ENV])["backend"] == b  # how the worker learns it
        keys[b] = got.identity["key"]
    assert len(set(keys.values())) == 3, keys


def test_the_environment_names_the_backend_unless_the_option_does(no_build, monkeypatch):
    monkeypatch.setenv(builds.BACKEND_ENV, "blas")
    assert builds.resolve("pinned").backend == "blas"
    assert builds.resolve("pinned", backend="vulkan").backend == "vulkan"
    # a bundle's recorded build: the environment's backend does not apply
    assert builds.resolve("pinned", from_env=False) == builds.Build("pinned", builds.pinned_identity())


def test_the_bare_pinned_build_is_still_the_venvs_install(monkeypatch):
    monkeypatch.delenv(builds.BACKEND_ENV, raising=False)
    for b in (None, "cpu"):
        got = builds.resolve("pinned", from_env=False, backend=b)
        assert got.bindings is None and got.backend == "cpu" and got.identity == builds.pinned_identity()


def test_a_recorded_backend_is_rebuilt_on_replay(no_build, monkeypatch, tmp_path):
    from fuzz.repro.bundle import use_recorded_build

    seen = []
    monkeypatch.setattr(builds, "activate", lambda b: seen.append(b) or b)
    use_recorded_build({"spec": "pinned", "patches": None, "backend": "vulkan"}, tmp_path)
    assert seen[-1].backend == "vulkan"


@pytest.mark.parametrize("prog,args", [("family-certify", ["build"]), ("fuzz", ["sweep", "qwen3"]),
                                       ("fuzz", ["run", "llama"]), ("family-certify", ["run", "qwen3"]),
                                       ("family-certify", ["scan", "qwen3"]), ("family-certify", ["mutants"]),
                                       ("family-certify", ["bump", "qwen3", "--candidate-backend"]),
                                       ("family-certify", ["bump", "qwen3", "--candidate-backend", "cpu",
                                                           "--base-backend"])])
def test_a_name_that_is_no_backend_is_refused(prog, args):
    flag = [] if args[-1].endswith("-backend") else ["--backend"]
    line = one_line_exit_2(run_cli(prog, *args, *flag, "opencl"))
    assert "--backend opencl: not a backend" in line and "cpu, blas, vulkan, cuda, metal" in line


@pytest.mark.skipif(backends.cuda_devices()[0] > 0, reason="skipped: this machine has a CUDA device")
def test_cuda_without_a_device_is_refused_in_one_line():
    line = one_line_exit_2(run_cli("family-certify", "build", "--backend", "cuda"))
    assert line.startswith("family-certify: error: --backend cuda: ") and "or use --backend vulkan, blas or cpu" in line
    assert ("nvcc is not installed" in line) != ("no CUDA device here" in line)


@pytest.mark.skipif(sys.platform == "darwin", reason="skipped: Metal is there on macOS")
def test_metal_off_macos_is_refused_in_one_line():
    line = one_line_exit_2(run_cli("family-certify", "build", "--backend", "metal"))
    assert "--backend metal: Metal exists only on macOS" in line


def test_vulkan_without_its_tools_is_refused_naming_the_packages():
    """PATH without glslc (the system's bin directories left out): refused before the sdist is even opened."""
    env = {**os.environ, "PATH": str(ROOT / ".venv" / "bin")}
    r = subprocess.run([str(ROOT / ".venv" / "bin" / "family-certify"), "build", "--backend", "vulkan"],
                       capture_output=True, text=True, env=env, timeout=120)
    line = one_line_exit_2(r)
    assert "--backend vulkan: glslc" in line and "missing" in line
    assert "libvulkan-dev glslc spirv-headers mesa-vulkan-drivers" in line
    assert "scripts/install_backend.sh vulkan" in line


def test_each_check_names_what_is_missing(monkeypatch):
    monkeypatch.setattr(backends.ctypes.util, "find_library", lambda name: None)
    assert "OpenBLAS" in backends.backend_problem("blas") and "libopenblas-dev" in backends.backend_problem("blas")
    assert "the Vulkan loader and headers" in backends.backend_problem("vulkan")
    assert backends.backend_problem("cpu") is None
    monkeypatch.setattr(backends.shutil, "which", lambda name: None)
    assert "nvcc is not installed" in backends.backend_problem("cuda")


def test_a_tree_whose_vulkan_source_needs_newer_headers_is_refused_before_it_is_built(tmp_path, monkeypatch):
    """The pinned tree's ggml-vulkan creates its instance with VK_EXT_layer_settings' structs: Vulkan headers that do
    not declare them (Debian 12's, VK_HEADER_VERSION 239) fail its compile minutes in; refused up front instead."""
    src = tmp_path / "ggml" / "src" / "ggml-vulkan"
    src.mkdir(parents=True)
    (src / "ggml-vulkan.cpp").write_text("std::vector<vk::LayerSettingEXT> settings;\n")
    monkeypatch.setattr(backends, "vulkan_header_version", lambda: (239, "#define VK_HEADER_VERSION 239\n"))
    line = backends.tree_problem("vulkan", tmp_path)
    assert "VK_EXT_layer_settings" in line and "VK_HEADER_VERSION 239" in line and "--backend blas" in line
    assert backends.tree_problem("blas", tmp_path) is None
    monkeypatch.setattr(backends, "vulkan_header_version", lambda: (300, "#define VK_EXT_layer_settings 1\n"))
    assert backends.tree_problem("vulkan", tmp_path) is None
    (src / "ggml-vulkan.cpp").write_text("vk::InstanceCreateInfo info;\n")  # a tree that does not use them
    monkeypatch.setattr(backends, "vulkan_header_version", lambda: (239, ""))
    assert backends.tree_problem("vulkan", tmp_path) is None


def test_the_installer_knows_the_packages_the_check_names():
    text = (ROOT / "scripts" / "install_backend.sh").read_text()
    for b, pkgs in backends.APT.items():
        assert f"{b}) pkgs=({' '.join(pkgs)})" in text
    r = subprocess.run(["bash", str(ROOT / "scripts" / "install_backend.sh"), "cuda"], capture_output=True, text=True)
    assert r.returncode == 2 and "no Debian package" in r.stderr


def test_the_schemas_name_every_backend_but_cpu():
    """A report's build names its backend unless it is cpu (every report before backends existed still validates)."""
    from fuzz.certify.schemas import BUILD

    assert BUILD["properties"]["backend"]["enum"] == [b for b in BACKEND_OPTIONS if b != "cpu"]
    assert "backend" not in BUILD["required"]


def test_the_worker_sets_what_offloading_needs_and_the_api_check_covers_it():
    """n_gpu_layers and devices are set through the bindings: the API check (bindings_problems) reads them from the
    worker's code, so a build whose bindings lack them is refused like any other missing field."""
    _, fields = builds.worker_needs()
    assert {"n_gpu_layers", "devices"} <= fields


# ---- the second backend, built and run (slow) ----------------------------------------------------------------
# the one that builds and runs on a 2-core machine without a GPU (docs/backends.md): Vulkan does not build against
# Debian 12's Vulkan headers, BLAS does
SECOND = "blas"


@pytest.mark.slow
@pytest.mark.llama
def test_a_fixtures_parity_sweep_runs_on_the_second_backend(tmp_path):
    """The pinned tree built with the second backend (scripts/install_backend.sh installs its packages; minutes the
    first time, cached after); a fixture's parity sweep on it at every cut, in batches of 32 tokens: BLAS takes a
    matrix product only when both sides are at least 32 wide."""
    problem = backends.backend_problem(SECOND)
    if problem:
        pytest.skip(f"skipped: {problem}")
    r = run_cli("family-certify", "build", "--backend", SECOND, "--json", timeout=7200)
    assert r.returncode == 0, r.stderr[-2000:]
    ident = json.loads(r.stdout)
    assert ident["backend"] == SECOND and set(BACKEND_OPTIONS[SECOND]) <= set(ident["options"])
    lib = Path(ident["path"]) / "py" / "llama_cpp" / "lib"
    assert list(lib.glob(f"libggml-{SECOND}.so*")), sorted(p.name for p in lib.iterdir())
    fixture = tmp_path / "q.gguf"  # n_embd 32: wide enough for BLAS
    subprocess.run([str(ROOT / ".venv" / "bin" / "synth"), "make", "qwen3", "--layers", "4", "-o", str(fixture)],
                   check=True, capture_output=True)
    report = tmp_path / "sweep.json"
    r = run_cli("fuzz", "sweep", str(fixture), "--backend", SECOND, "--tokens", "8", "--prompt-len", "40",
                "--chunk", "32", "--report", str(report), timeout=3600)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-2000:])
    rep = json.loads(report.read_text())
    validate(rep, "report")
    assert rep["build"]["backend"] == SECOND and rep["build"]["key"] == ident["key"], rep["build"]
    assert rep["status"] == "pass" and rep["results"], rep["status"]


@pytest.mark.slow
@pytest.mark.llama
def test_a_backend_build_is_certified_against_the_cpu_build_with_chains_mixing_both(tmp_path):
    """`family-certify bump --candidate-backend B`: the gate's lanes on the CPU build and on B, and the cross-build
    lane between them — the same prompt unsplit on both, the prompt's state exported on one and imported on the
    other, and chains whose stage 0 runs on one backend and stage 1 on the other, both ways, in prefill chunks of 7
    and as one prefill batch of 40 rows (the batch BLAS computes). Every lane unchanged; the state hand-offs (a
    prompt of 16) bit-exact; the chains bit-exact in small chunks and within their policy in the wide batch
    (docs/backends.md: measured on every tier-1 row)."""
    problem = backends.backend_problem(SECOND)
    if problem:
        pytest.skip(f"skipped: {problem}")
    r = run_cli("family-certify", "bump", "qwen3next", "jamba", "--job", "gate", "--candidate-backend", SECOND,
                "--out", str(tmp_path / "out"), timeout=7200)
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-2000:])
    rep = json.loads((tmp_path / "out" / "report.json").read_text())
    validate(rep, "bump")
    assert rep["candidate"]["backend"] == SECOND and rep["base"].get("backend", "cpu") == "cpu"
    assert {x["verdict"] for x in rep["results"]} == {"unchanged"}
    cross = {x["row"]: x for x in rep["results"] if x["lane"] == "cross-build"}
    assert set(cross) == {"qwen3next", "jamba"}
    for x in cross.values():
        chains = x["mixed_chains"]["chains"]  # prefill chunks of 7, then one batch of 40 (BLAS takes 32 rows on)
        assert set(chains) == {"base → candidate", "candidate → base", "base → candidate (one batch of 40)",
                               "candidate → base (one batch of 40)"}
        # small batches never reach BLAS: bit-exact; the batch of 40 does: the backends' own unsplit runs differ
        # there, and a chain crosses within CROSS_FACTOR times that spread with the same greedy choices
        assert {k: c["status"] for k, c in chains.items() if "batch of 40" not in k} == \
            {"base → candidate": "crosses", "candidate → base": "crosses"}, chains
        assert {c["status"] for k, c in chains.items() if "batch of 40" in k} <= {"crosses", "crosses (numerics)"}
        assert {s["status"] for s in x["states"].values()} == {"crosses"}, x["states"]


@pytest.mark.slow
@pytest.mark.llama
def test_an_async_read_racing_a_clear_is_caught_by_the_determinism_lane_on_the_second_backend():
    problem = backends.backend_problem(SECOND)
    if problem:
        pytest.skip(f"skipped: {problem}")
    r = run_cli("family-certify", "mutants", "--mutant", "stale-output-rows", "--backend", SECOND, timeout=7200)
    assert r.returncode == 0 and "1 mutants: 1 caught, 0 escaped" in r.stdout, (r.stdout[-2000:], r.stderr[-2000:])


def test_llama_server_runs_every_layer_on_the_backends_first_device_or_refuses_the_load():
    """The llama-server worker's offload (the lanes' servers run on the device a runtime would serve from): the flags
    from the binary's --list-devices, as llama.cpp prints it; none on cpu and blas; a device backend with no device
    listed, or a server that did not offload every layer, is a load failure naming why."""
    from targets.llama_cpp_worker import RequestError
    from targets.llama_server_worker import offload_args, offload_problem

    listing = ("Available devices:\n  Vulkan0: llvmpipe (LLVM 15.0.7, 256 bits) (7927 MiB, 7927 MiB free)\n"
               "  Vulkan1: Intel(R) Graphics (ADL GT2) (8192 MiB, 8192 MiB free)\n")
    assert offload_args("vulkan", listing) == ["-ngl", "all", "--device", "Vulkan0"]
    assert offload_args("cuda", "Available devices:\n  CUDA0: NVIDIA L4 (22478 MiB, 22192 MiB free)\n") == \
        ["-ngl", "all", "--device", "CUDA0"]
    assert offload_args("metal", "Available devices:\n  MTL0: Apple M2 (10922 MiB, 10922 MiB free)\n")[-1] == "MTL0"
    assert offload_args("cpu", listing) == [] and offload_args("blas", "") == []
    with pytest.raises(RequestError, match=r"backend cuda: llama-server lists no CUDA device .*said: Vulkan1: Intel"):
        offload_args("cuda", listing)
    with pytest.raises(RequestError, match=r"lists no Vulkan device .*said: \(none\)"):
        offload_args("vulkan", "Available devices:\n  (none)\n")
    assert offload_problem("vulkan", "load_tensors: offloaded 7/7 layers to GPU") is None
    assert offload_problem("vulkan", "load_tensors: offloaded 5/7 layers to GPU") == \
        "backend vulkan: llama-server did not offload every layer (offloaded 5/7 layers)"
    assert "it said nothing" in offload_problem("cuda", None)
    assert offload_problem("cpu", None) is None and offload_problem("blas", "offloaded 0/7 layers") is None


@pytest.mark.llama
def test_the_cross_backend_trace_finds_nothing_between_a_build_and_itself():
    """scripts/cross_backend_trace.py (how docs/backends.md explains minimax-m2's chain) on one backend: the chain's
    first stage-1 layer is bit-exact with the unsplit run node by node, and no cached K or V value rounds apart."""
    r = subprocess.run([sys.executable, "scripts/cross_backend_trace.py", "minimax-m2", "--base-backend", "cpu",
                        "--candidate-backend", "cpu"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("minimax-m2: cut [1], 40 rows; layer 1")
    nodes = [ln.split() for ln in lines[2:] if "values round" not in ln]
    assert {"kq", "kqv_out", "ffn_moe_out", "l_out"} <= {n[0] for n in nodes}
    assert all(n[1] == "0.0e+00" and n[4] == "0.0e+00" and n[-1] == "0.0e+00" for n in nodes), r.stdout
    flips = [ln for ln in lines if "values round" in ln]
    assert len(flips) == 6 and all(": 0 values round to another f16" in ln for ln in flips), r.stdout
