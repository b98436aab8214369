"""Builds geomkern._C from csrc/ (C++ with OpenMP on CPU) through torch.utils.cpp_extension, and
geomkern._C_cuda from csrc/cuda/ when torch is a CUDA build and a CUDA toolkit is installed (no GPU
needed to build it).

Both use torch's stable ABI only (csrc/stable.h), as torch 2.10 defines it, and no Python C API:
one build loads into every torch from 2.10 on and every Python from 3.10 on, so the wheel is tagged
cp310-abi3 with or without the CUDA kernels inside. geomkern._C_cuda links the CUDA runtime
statically (cudart_static): it needs the NVIDIA driver and a torch whose CUDA major version is the
toolkit's it was built with (the loader, geomkern/backends/native, checks it), nothing else.

torch must already be installed: build with `pip install --no-build-isolation .` so pip does not
put a fresh (CUDA, multi-GB) torch into an isolated build environment.
"""
import glob
import os
import sys

from setuptools import setup

try:
    from torch.utils.cpp_extension import BuildExtension, CppExtension
except ImportError:
    sys.exit(
        "geomkern's setup.py needs torch installed first (it compiles against it). Install torch, "
        "then build with `pip install --no-build-isolation .`"
    )


def cxx_standard() -> str:
    """C++20 from torch 2.14 on (its headers stop with '#error C++20 or later compatible compiler is
    required'); C++17 below, as the extension has always been built there."""
    import torch

    try:
        major, minor = (int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
    except ValueError:  # an unparsable version (a local source build): the newer standard
        return "-std=c++20"
    return "-std=c++20" if (major, minor) >= (2, 14) else "-std=c++17"


def native_arch(env) -> bool:
    """GEOMKERN_NATIVE_ARCH=1: build for this machine's CPU only (-march=native), one variant of the
    hot kernels. By default the build is portable: baseline x86-64 code plus AVX2+FMA and AVX-512F
    variants of the hot kernels, picked at load (csrc/cpu/isa.h)."""
    if "GEOMKERN_PORTABLE" in env:
        print("geomkern: GEOMKERN_PORTABLE is no longer read: the default build is portable; "
              "GEOMKERN_NATIVE_ARCH=1 builds for this machine's CPU only", file=sys.stderr)
    return env.get("GEOMKERN_NATIVE_ARCH", "0") == "1"


# The stable-ABI version geomkern._C and _C_cuda are compiled for: the oldest torch they load into
# (2.10, which has every stable call the kernels make: parallel_for, the thread count, empty, the C
# shim's GEMMs; for _C_cuda the device guard (2.9) and the C shim's current CUDA stream).
STABLE_ABI_TARGET = "0x020a000000000000"


def cxx_flags(env=os.environ):
    # -ffp-contract=off: GCC fuses a*b+c into an FMA where its unrolling allows, so the pre-image
    # kernel's 1-, 2- and 4-vector tiles (picked by thread count) rounded differently on AVX2
    # (2.4e-7 apart at b = 20); with no contraction every tile width, and every instruction-set
    # variant, gives the same bits.
    # Measured cost: none (gd, b = 1000, S = D = 512, 1 thread: 0.739 s vs 0.736 s, interleaved).
    # -g0: no debug info in the library (the interpreter's CFLAGS carry -g: 31 MB of DWARF in _C)
    flags = ["-O3", "-fopenmp", cxx_standard(), "-ffp-contract=off", "-g0",
             f"-DTORCH_TARGET_VERSION={STABLE_ABI_TARGET}"]
    if native_arch(env):
        flags += ["-march=native", "-DGEOMKERN_NATIVE_ARCH"]
    return flags


# libstdc++ linked as a shared library, whatever the compiler driver does by default. A compiler
# that links it statically (the GPU image's /opt/gcc/bin/g++, GPU session 12: _C_cuda had no
# libstdc++.so.6 in ldd) gives the extension a second copy of the C++ library beside the one torch
# loads; the two copies' locale facets do not match, and the first number formatted by an ostream
# (every TORCH_CHECK message with a size or a value in it) crashed the H100 machine's process with
# SIGSEGV, and on Debian's g++ 12 with -static-libstdc++ printed nothing
# (studies/preimage-throw/). An explicit -lstdc++ comes before the driver's own libraries, so the
# shared library answers every C++ symbol and the static archive adds nothing.
SHARED_LIBSTDCXX = ["-lstdc++"]


# Compute capabilities built when no GPU is visible to ask (a login node, a CI runner, a wheel
# build): Ampere (A100) and Hopper (H100/H200) machine code plus Hopper PTX, which newer GPUs JIT.
# Without a list torch's own arch detection indexes an empty device list and stops with an
# IndexError that names neither geomkern nor a way out.
DEFAULT_CUDA_ARCH_LIST = "8.0;9.0+PTX"


def default_cuda_arch_list(env_value, gpu_visible: bool):
    """The TORCH_CUDA_ARCH_LIST to set, or None to leave torch's choice: only when the user set
    none and no GPU is visible (with a GPU, torch builds for the GPUs it sees)."""
    if env_value or gpu_visible:
        return None
    return DEFAULT_CUDA_ARCH_LIST


def cuda_extensions():
    """geomkern._C_cuda (csrc/cuda/*.cu + csrc/cuda_bindings/) when torch is a CUDA build and a CUDA
    toolkit is found (CUDA_HOME, or nvcc on PATH); no GPU is needed to build it. GEOMKERN_NO_CUDA=1
    skips it (e.g. a toolkit whose major version differs from torch's, which torch refuses)."""
    import torch
    from torch.utils.cpp_extension import CUDA_HOME, CUDAExtension

    if os.environ.get("GEOMKERN_NO_CUDA", "0") == "1":
        print("geomkern: CUDA kernels not built (GEOMKERN_NO_CUDA=1)", file=sys.stderr)
        return []
    if torch.version.cuda is None:
        print("geomkern: CUDA kernels not built (CPU-only torch)", file=sys.stderr)
        return []
    if CUDA_HOME is None:
        print("geomkern: CUDA kernels not built (no CUDA toolkit: set CUDA_HOME or put nvcc on PATH)",
              file=sys.stderr)
        return []
    if not os.path.isfile(os.path.join(CUDA_HOME, "include", "cuda_runtime.h")):
        # torch takes CUDA_HOME from the folder above `nvcc` on PATH: /usr/local for a
        # /usr/local/bin/nvcc link, where the compile then stops on a missing cuda_runtime.h
        print(f"geomkern: CUDA kernels not built: CUDA_HOME={CUDA_HOME} has no include/cuda_runtime.h; "
              "set CUDA_HOME to the CUDA toolkit (e.g. CUDA_HOME=/usr/local/cuda) and build again, "
              "or GEOMKERN_NO_CUDA=1 to say you want none", file=sys.stderr)
        return []
    arch = default_cuda_arch_list(os.environ.get("TORCH_CUDA_ARCH_LIST"), torch.cuda.is_available())
    if arch is not None:
        os.environ["TORCH_CUDA_ARCH_LIST"] = arch
        print(f"geomkern: no GPU visible; building the CUDA kernels for TORCH_CUDA_ARCH_LIST={arch} "
              "(set TORCH_CUDA_ARCH_LIST to choose others, GEOMKERN_NO_CUDA=1 to skip them)",
              file=sys.stderr)
    ext = CUDAExtension(
        "geomkern._C_cuda",
        sorted(glob.glob("csrc/cuda/*.cu") + glob.glob("csrc/cuda_bindings/*.cpp")),
        include_dirs=[os.path.abspath("csrc/cuda")],
        # the same C++ standard and stable-ABI target as _C (torch 2.14's headers need C++20, for
        # nvcc's host pass too); -g0 as for _C. The .cu files include no torch header.
        extra_compile_args={"cxx": ["-O3", "-g0", cxx_standard(), f"-DTORCH_TARGET_VERSION={STABLE_ABI_TARGET}"],
                            "nvcc": ["-O3", cxx_standard()]},
        extra_link_args=SHARED_LIBSTDCXX,
        # _C_cuda.abi3.so, linked without libtorch_python
        py_limited_api=True,
    )
    ext.libraries = cuda_libraries(ext.libraries)
    return [ext]


def cuda_libraries(libraries):
    """The libraries _C_cuda links: torch's (the stable ABI's C shim: torch_cpu, and torch_cuda for
    the current CUDA stream) and the CUDA runtime statically, in place of the libcudart.so, c10_cuda
    and torch_python that CUDAExtension adds. A static runtime makes the library name no
    libcudart.so.N, which would tie it to one CUDA runtime package beside torch."""
    dropped = {"cudart", "c10_cuda", "torch_python"}
    return [lib for lib in libraries if lib not in dropped] + ["cudart_static", "rt", "pthread", "dl"]


# The instruction-set variants of the hot kernels (csrc/cpu/isa.h): every kernel source, a
# csrc/cpu/*.cpp that opens the instruction-set region (#include "simd.h"), is compiled twice more,
# for AVX2+FMA and for AVX-512F, through a generated six-line translation unit in VARIANT_DIR that
# includes it with GEOMKERN_ISA set (empty in a GEOMKERN_NATIVE_ARCH=1 or non-x86 build).
VARIANT_DIR = os.path.join("build", "geomkern_variants")
VARIANTS = {"avx2": (1, "AVX2+FMA"), "avx512f": (2, "AVX-512F")}


def kernel_sources():
    """The csrc/cpu/*.cpp that open the instruction-set region: the ones with a variant per ISA."""
    def opens_region(path):
        with open(path) as f:
            return any(line.strip() == '#include "simd.h"' for line in f)
    return [p for p in sorted(glob.glob("csrc/cpu/*.cpp")) if opens_region(p)]


def variant_sources(out_dir=VARIANT_DIR):
    """Writes the variant translation units of kernel_sources() to out_dir (a file is rewritten
    only when its text changes, so an unchanged one is not recompiled) and returns their paths."""
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for src in kernel_sources():
        stem = os.path.splitext(os.path.basename(src))[0]
        for isa, (number, name) in VARIANTS.items():
            text = (f"// The {name} variant of {src} (csrc/cpu/isa.h), generated by setup.py.\n"
                    f'#include "cpu/isa.h"\n#if GEOMKERN_ISA_VARIANTS\n#define GEOMKERN_ISA {number}\n'
                    f'#include "cpu/{stem}.cpp"\n#endif\n')
            path = os.path.join(out_dir, f"{stem}_{isa}.cpp")
            if not os.path.isfile(path) or open(path).read() != text:
                with open(path, "w") as f:
                    f.write(text)
            paths.append(path)
    return paths


if __name__ == "__main__":  # pip's build backend and `python setup.py` run it as __main__
    cuda = cuda_extensions()
    sources = sorted(glob.glob("csrc/*.cpp") + glob.glob("csrc/cpu/*.cpp")) + variant_sources()
    setup(
        ext_modules=[
            CppExtension(
                "geomkern._C",
                sources,
                include_dirs=[os.path.abspath("csrc")],
                extra_compile_args={"cxx": cxx_flags()},
                extra_link_args=["-fopenmp"] + SHARED_LIBSTDCXX,
                # _C.abi3.so, linked without libtorch_python (torch defines Py_LIMITED_API, 3.10)
                py_limited_api=True,
            )
        ] + cuda,
        cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
        # one wheel, CPU and CUDA, for every Python >= 3.10 and every torch >= 2.10
        options={"bdist_wheel": {"py_limited_api": "cp310"}},
    )
