"""CI compile check for the CUDA C++ kernels (csrc/cuda/*.cu), no GPU needed.

Every .cu is compiled with ``nvcc -arch=sm_90 -std=c++17 -Xcompiler -Wall -c`` (errors fail,
warnings are allowed and shown), and tests/cuda_host/launch_check.cu, which calls every launcher
of csrc/cuda/kernels.h for float and double, is compiled and linked against those objects: a
launcher whose declaration and definition disagree, or a missing instantiation, fails to link.
The executable is not run (it needs a GPU). Skipped only when nvcc is not on PATH.

The torch-facing glue (csrc/cuda_bindings/) needs torch's CUDA headers; its syntax check against
the installed torch headers is slow (~1 min) and opt-in (--runslow).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CUDA_DIR = ROOT / "csrc" / "cuda"
SOURCES = sorted(CUDA_DIR.glob("*.cu"))
NVCC = shutil.which("nvcc")
FLAGS = ["-arch=sm_90", "-std=c++17", "-Xcompiler", "-Wall"]

pytestmark = pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH (no CUDA toolkit here)")


def _run(cmd: list[str], timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def objects(tmp_path_factory):
    """Compile every csrc/cuda/*.cu once: {source name: (object path, CompletedProcess)}."""
    out = tmp_path_factory.mktemp("nvcc")
    results = {}
    for src in SOURCES:
        obj = out / (src.stem + ".o")
        results[src.name] = (obj, _run([NVCC, *FLAGS, "-c", str(src), "-o", str(obj)]))
    return results


def test_there_are_cuda_sources():
    assert [p.name for p in SOURCES] and all(p.stat().st_size > 0 for p in SOURCES), (
        f"no CUDA sources under {CUDA_DIR}: this check would pass vacuously")
    assert {"eigh.cu", "preimage.cu"} <= {p.name for p in SOURCES}


@pytest.mark.xdist_group("nvcc-objects")
@pytest.mark.parametrize("name", [p.name for p in SOURCES])
def test_cu_compiles(objects, name):
    obj, proc = objects[name]
    if proc.stderr.strip():
        print(proc.stderr)  # warnings are allowed; shown with -s or on failure
    assert proc.returncode == 0, f"nvcc failed on csrc/cuda/{name}:\n{proc.stderr}"
    assert obj.exists() and obj.stat().st_size > 0


@pytest.mark.xdist_group("nvcc-objects")
def test_launchers_link(objects, tmp_path):
    failed = [name for name, (_, proc) in objects.items() if proc.returncode != 0]
    assert not failed, f"not linked: {failed} did not compile"
    exe = tmp_path / "launch_check"
    proc = _run([NVCC, *FLAGS, "-I", str(CUDA_DIR), str(ROOT / "tests" / "cuda_host" / "launch_check.cu"),
                 *(str(obj) for obj, _ in objects.values()), "-o", str(exe)])
    assert proc.returncode == 0, f"launch_check.cu did not compile/link:\n{proc.stderr}"
    assert exe.exists() and os.access(exe, os.X_OK)


@pytest.mark.slow
def test_bindings_compile_against_torch_headers(tmp_path):
    """Syntax of csrc/cuda_bindings/*.cpp against the installed torch's headers and the CUDA
    toolkit's runtime headers (a CPU-only torch wheel ships c10/cuda headers but not the generated
    c10/cuda/impl/cuda_cmake_macros.h: a one-line stand-in is supplied then)."""
    torch = pytest.importorskip("torch")
    from torch.utils.cpp_extension import include_paths

    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler on PATH")
    homes = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), Path(NVCC).resolve().parents[1],
             "/usr/local/cuda"]
    found = [Path(h) / "include" for h in homes if h and (Path(h) / "include" / "cuda_runtime_api.h").exists()]
    if not found:
        pytest.skip(f"cuda_runtime_api.h not found under any of {homes}")
    cuda_include = found[0]
    incs = list(include_paths())
    if not any((Path(p) / "c10/cuda/impl/cuda_cmake_macros.h").exists() for p in incs):
        stub = tmp_path / "stub" / "c10" / "cuda" / "impl"
        stub.mkdir(parents=True)
        (stub / "cuda_cmake_macros.h").write_text("#define C10_CUDA_BUILD_SHARED_LIBS\n")
        incs.append(str(tmp_path / "stub"))
    flags = [f"-I{p}" for p in incs + [str(cuda_include), sysconfig.get_paths()["include"], str(CUDA_DIR)]]
    for src in sorted((ROOT / "csrc" / "cuda_bindings").glob("*.cpp")):
        proc = _run([cxx, "-fsyntax-only", "-std=c++20", "-DTORCH_EXTENSION_NAME=_C_cuda", *flags, str(src)])
        assert proc.returncode == 0, f"{src.name} does not compile against torch {torch.__version__}:\n{proc.stderr}"
