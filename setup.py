"""Builds geomkern._C from csrc/ (C++ with OpenMP on CPU) through torch.utils.cpp_extension.

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


def cxx_flags():
    flags = ["-O3", "-fopenmp", "-std=c++17"]
    # A source build targets the machine it runs on; GEOMKERN_PORTABLE=1 for a redistributable build.
    if os.environ.get("GEOMKERN_PORTABLE", "0") != "1":
        flags.append("-march=native")
    return flags


sources = sorted(glob.glob("csrc/*.cpp") + glob.glob("csrc/cpu/*.cpp"))
setup(
    ext_modules=[
        CppExtension(
            "geomkern._C",
            sources,
            include_dirs=[os.path.abspath("csrc")],
            extra_compile_args={"cxx": cxx_flags()},
            extra_link_args=["-fopenmp"],
        )
    ],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)
