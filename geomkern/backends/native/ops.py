"""Native (csrc/) implementations, registered with the dispatcher.

``auto_on=("cpu",)`` only where benchmarks/native_preimage_timing.py measured the native kernel
faster than the reference on CPU.
"""
from __future__ import annotations

from ... import _dispatch
from . import _C

# The CPU kernels only beat torch (MKL picks AVX2/AVX-512 at run time) when they were compiled
# for AVX2+FMA or wider: built without AVX/FMA (what GEOMKERN_PORTABLE=1 gives on x86-64) the
# pre-image kernel measured 2.3x (float64) to 3.3x (float32) slower on one core than the
# AVX2/AVX-512 builds, which is slower than the reference, so auto keeps the reference there.
_CPU_FAST = _C.cpu_isa() in ("avx512f", "avx2+fma")
_AUTO_CPU = ("cpu",) if _CPU_FAST else ()


# Fused pre-image loops (csrc/cpu/preimage.cpp): every step in one call, tiles of points kept in
# cache; same signatures and math as geomkern.ops.preimage.{gd,fixed_point}_reference.
# Measured (2-core AMD EPYC with AVX-512, b=5000, S=D=512, 100 steps): faster than the reference
# for both methods in float32 (1.3-1.4x) and float64 (1.5-1.6x) in single-thread CPU time, and
# faster in 2-thread wall time too (numbers in benchmarks/native_preimage_timing.py).
@_dispatch.register("preimage_gd", "native", auto_on=_AUTO_CPU)
def preimage_gd(Z0, B, T, gamma: float, steps: int, lr):
    return _C.preimage_gd(Z0, B, T, float(gamma), int(steps), lr)


@_dispatch.register("preimage_fixed_point", "native", auto_on=_AUTO_CPU)
def preimage_fixed_point(Z0, B, A, gamma: float, steps: int):
    return _C.preimage_fixed_point(Z0, B, A, float(gamma), int(steps))
