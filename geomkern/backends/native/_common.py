"""What the native families share: whether the loaded CPU kernels are a build auto may prefer."""
from __future__ import annotations


def fast_cpu(C) -> bool:
    """Whether auto may prefer geomkern._C's CPU kernels: on its AVX2+FMA or AVX-512F variant only.

    The CPU kernels only beat torch (MKL picks AVX2/AVX-512 at run time) there: the baseline
    x86-64 variant of the pre-image kernel measured 2.3x (float64) to 3.3x (float32) slower on one
    core than the AVX2/AVX-512 builds, slower than the reference. C None (not loaded): the order of
    a fast build, so that auto's fallback from kernels it would have used is reported (see the
    package notes)."""
    return C is None or C.cpu_isa() in ("avx512f", "avx2+fma")
