"""Native pre-image kernels: the fused CPU loops (csrc/cpu/preimage.cpp, preimage_span.cpp) and
the CUDA gradient descent (csrc/cuda/preimage.cu)."""
from __future__ import annotations

import torch

from ._common import fast_cpu


def span_form(B: torch.Tensor) -> bool:
    """Whether the CPU pre-image iterates in span(z0, B): S <= D (one S x S product per step
    against two S x D ones; at S = D half the flops)."""
    return B.shape[0] <= B.shape[1]


def kernels(C, C_cuda) -> dict[str, dict[str, object]]:
    """op -> {device type: implementation} for the extensions given (None: not built)."""
    table: dict[str, dict[str, object]] = {}
    if C is not None:
        # Fused pre-image loops (csrc/cpu/preimage.cpp): every step in one call, tiles of points
        # kept in cache; the math of geomkern.ops.preimage.{gd,fixed_point}_reference.
        # (precision: no tensor cores here, float32/float64 FMA whatever is asked)
        # Where S <= D both iterate in span(z0, B) (csrc/cpu/preimage_span.cpp): one S x S
        # product per step instead of two S x D ones (docs/history.md §8, §15); above, the
        # direct form, whose two products then cost less.
        def preimage_gd(Z0, B, T, gamma, steps, lr, precision=None):
            f = C.preimage_gd_span if span_form(B) else C.preimage_gd
            return f(Z0, B, T, float(gamma), int(steps), lr)

        def preimage_fixed_point(Z0, B, A, gamma, steps, precision=None):
            f = C.preimage_fixed_point_span if span_form(B) else C.preimage_fixed_point
            return f(Z0, B, A, float(gamma), int(steps))

        table["preimage_gd"] = {"cpu": preimage_gd}
        table["preimage_fixed_point"] = {"cpu": preimage_fixed_point}
    if C_cuda is not None:
        def preimage_gd_cuda(Z0, B, T, gamma, steps, lr, precision=None):  # csrc/cuda/preimage.cu
            S, D = B.shape
            points = C_cuda.preimage_gd_points(S, D, Z0.dtype == torch.float64, Z0.device.index or 0)
            if points <= 0:  # said here, before the library's own check (see cuda_ops.cpp)
                why = ("the CUDA pre-image kernel keeps 8 points' iterate and weights (8 (S + D) "
                       f"elements) in shared memory, which S = {S}, D = {D} in {Z0.dtype} exceed on "
                       "this device" if points == 0 else
                       "geomkern CUDA pre-image: could not query the device's shared memory")
                raise RuntimeError(why + "; use backend 'triton' or 'reference' for this problem")
            return C_cuda.preimage_gd(Z0, B, T, float(gamma), int(steps), lr)

        table.setdefault("preimage_gd", {})["cuda"] = preimage_gd_cuda
    return table


def auto(C) -> dict[str, tuple[str, ...]]:
    """device type -> ops of this family auto prefers native for (measured wins only).

    With AVX-512 (2-core AMD EPYC, b = 5000, S = D = 512, 100 steps) both methods measured
    1.3-1.6x faster than the reference (studies/native-preimage/native_preimage_timing.py; since
    issue 20 in span(z0, B) where S <= D, benchmarks/test_cpu_floor.py), on AVX2+FMA or wider only
    (_common.fast_cpu). The CUDA kernel is not preferred."""
    return {"cpu": ("preimage_gd", "preimage_fixed_point") if fast_cpu(C) else ()}
