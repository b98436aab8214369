"""Native backend: the compiled extensions ``geomkern._C`` (csrc/cpu, C++/OpenMP; built by
setup.py) and ``geomkern._C_cuda`` (csrc/cuda, built only with a CUDA build of torch and nvcc).

:func:`kernels` is the one place that says which compiled kernel serves which op on which device
(the native CPU/CUDA pair); an op a device has no kernel for runs on the reference there, as for
any backend. ``auto`` prefers a native kernel only where a recorded benchmark measured it faster:
the CPU pre-image loops (benchmarks/native_preimage_timing.py; since issue 20 in span(z0, B) where
S <= D, benchmarks/test_cpu_floor.py) when built for AVX2+FMA or wider; the CPU rbf_matmul and
kmeans kernels serve ``gk.set_backend("native")`` only (auto_devices says why);
no CUDA kernel yet (no GPU benchmark has run; benchmarks/test_eigh_gpu.py is the one to run).
"""
from __future__ import annotations

import torch

from ... import _dispatch
from ...ops.eigh import sign_fix

_C = _C_cuda = None
_ERROR = _CUDA_ERROR = ""
try:
    from ... import _C  # type: ignore[attr-defined,no-redef]
except ImportError as exc:  # not built, or built against another torch
    _ERROR = (
        f"geomkern._C could not be imported ({exc}); it is built by setup.py: reinstall from the "
        "source tree with `pip install --no-build-isolation .` (needs a C++ compiler and torch "
        "installed first)"
    )
try:
    from ... import _C_cuda  # type: ignore[attr-defined,no-redef]
except ImportError as exc:  # not built (CPU-only torch, no CUDA toolkit) or built against another torch
    _CUDA_ERROR = (
        f"geomkern._C_cuda could not be imported ({exc}); setup.py builds it when torch is a CUDA "
        "build and a CUDA toolkit (nvcc) is found: reinstall with `pip install --no-build-isolation .`"
    )


def why_not() -> str:
    return _ERROR


def cuda_why_not() -> str:
    """"" when the CUDA kernels (geomkern._C_cuda) are built and importable, else why not."""
    return _CUDA_ERROR


# Converging takes 6-14 sweeps (host emulation: random matrices up to n = 512, repeated and
# clustered eigenvalues, rank-deficient), so a matrix still short of the tolerance after this many
# is an error, not a slow case.
MAX_SWEEPS = 50


def eigh_tol(dtype: torch.dtype, n: int) -> float:
    """Stopping tolerance of the CUDA Jacobi eigh: off(A) <= tol ||A||_F, tol = eps / sqrt(n).

    ||A||_F <= sqrt(n) ||A||_2, so this bounds the off-diagonal remainder by eps ||A||_2: the
    eigenvalues are then exact to the output's rounding and eigenvector i to eps ||A||_2 / gap_i,
    what a backward-stable solver gives. The kernel computes in double, so float32 input stops
    after fewer sweeps than float64 (quadratic convergence: about one sweep less).
    """
    return float(torch.finfo(dtype).eps) / max(n, 1) ** 0.5


def span_form(B: torch.Tensor) -> bool:
    """Whether the CPU pre-image iterates in span(z0, B): S <= D (one S x S product per step
    against two S x D ones; at S = D half the flops)."""
    return B.shape[0] <= B.shape[1]


def kernels(C=None, C_cuda=None) -> dict[str, dict[str, object]]:
    """op -> {device type: implementation} for the given extension modules (None: not built).

    Each implementation has the signature of the op's reference (geomkern/ops/<family>.py)."""
    table: dict[str, dict[str, object]] = {}
    if C is not None:
        # Fused pre-image loops (csrc/cpu/preimage.cpp): every step in one call, tiles of points
        # kept in cache; the math of geomkern.ops.preimage.{gd,fixed_point}_reference.
        # (precision: no tensor cores here, float32/float64 FMA whatever is asked)
        # Where S <= D both iterate in span(z0, B) (csrc/cpu/preimage_span.cpp): one S x S
        # product per step instead of two S x D ones (benchmarks/NOTES.md §13); above, the
        # direct form, whose two products then cost less.
        def preimage_gd(Z0, B, T, gamma, steps, lr, precision=None):
            f = C.preimage_gd_span if span_form(B) else C.preimage_gd
            return f(Z0, B, T, float(gamma), int(steps), lr)

        def preimage_fixed_point(Z0, B, A, gamma, steps, precision=None):
            f = C.preimage_fixed_point_span if span_form(B) else C.preimage_fixed_point
            return f(Z0, B, A, float(gamma), int(steps))

        def kmeans(X, offsets, k, iters, seed, precision=None):
            # greedy k-means++ and Lloyd per set in C++, threads over sets, each set stopping
            # on its own (csrc/cpu/kmeans.cpp); its own random stream, so other starting
            # centres than the reference's for the same seed (equally good: tests/test_cpu_native.py)
            off = offsets.cpu()
            centres = C.kmeanspp(X, off, int(k), int(seed) & (2 ** 63 - 1))
            labels, centres, _ = C.kmeans_lloyd(X, off, centres, int(iters))
            return labels, centres

        table["preimage_gd"] = {"cpu": preimage_gd}
        table["preimage_fixed_point"] = {"cpu": preimage_fixed_point}
        table["kmeans"] = {"cpu": kmeans}
        # K(X, Y) V in row-block tiles, K never stored (csrc/cpu/rbf.cpp)
        table["rbf_matmul"] = {"cpu": lambda X, Y, V, gamma, precision=None:
                               C.rbf_matmul(X, Y, V, float(gamma))}
    if C_cuda is not None:
        def eigh(A: torch.Tensor, k: int):  # batched Jacobi (csrc/cuda/eigh.cu)
            w, V, info = C_cuda.eigh(A, eigh_tol(A.dtype, A.shape[-1]), MAX_SWEEPS)
            failed = info < 0
            if bool(failed.any()):
                raise RuntimeError(
                    f"geomkern CUDA eigh (Jacobi) did not converge in {MAX_SWEEPS} sweeps for "
                    f"{int(failed.sum())} of {failed.numel()} matrices; use gk.set_backend('reference')")
            return w[..., :k], sign_fix(V[..., :k])  # the kernel sorts descending

        table.setdefault("eigh", {})["cuda"] = eigh
        table.setdefault("preimage_gd", {})["cuda"] = lambda Z0, B, T, gamma, steps, lr, precision=None: \
            C_cuda.preimage_gd(Z0, B, T, float(gamma), int(steps), lr)
    return table


def auto_devices(C) -> dict[str, tuple[str, ...]]:
    """device type -> ops on which auto prefers the native kernel (measured wins only).

    The CPU kernels only beat torch (MKL picks AVX2/AVX-512 at run time) when compiled for
    AVX2+FMA or wider: built without (GEOMKERN_PORTABLE=1 on x86-64) the pre-image kernel measured
    2.3x (float64) to 3.3x (float32) slower on one core than the AVX2/AVX-512 builds, slower than
    the reference. With AVX-512 (2-core AMD EPYC, b = 5000, S = D = 512, 100 steps) both methods
    measured 1.3-1.6x faster than the reference."""
    fast_cpu = C is not None and C.cpu_isa() in ("avx512f", "avx2+fma")
    # Measured faster but not auto (benchmarks/NOTES.md §15c): rbf_matmul (tiles, K never
    # stored; 1.33x the torch reference at 8,192² x 512): its rows' sums run in tile order, so
    # the rows of K V for identical points are not bitwise equal and the matrix-free kpca of an
    # all-identical cluster (H K H = 0) no longer converges (tests/test_kpca.py,
    # test_kpca_identical_points[matrix_free]); kmeans (5-20x the reference): its k-means++
    # draws another random stream, so auto would change the centres FedMC's basis selection
    # picks for a seed. Both run under gk.set_backend("native").
    return {"cpu": ("preimage_gd", "preimage_fixed_point") if fast_cpu else ()}


def register(C, C_cuda) -> None:
    auto = auto_devices(C)
    for op, per_device in kernels(C, C_cuda).items():
        for dev, fn in per_device.items():
            on = (dev,) if op in auto.get(dev, ()) else ()
            _dispatch.register(op, "native", devices=(dev,), auto_on=on)(fn)


_dispatch.register_backend("native", why_not=why_not)
register(_C, _C_cuda)
