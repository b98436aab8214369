"""Loader for the CUDA extension ``geomkern._C_cuda`` (csrc/cuda/, built by setup.py only with a
CUDA build of torch and a CUDA toolkit) and the registration of its kernels.

The dispatcher holds one ``native`` implementation per op, so when ``_C_cuda`` is importable every
native op is re-registered as a wrapper that dispatches on the input's device:

* CUDA tensors: the CUDA kernel where there is one (``eigh``: batched Jacobi; ``preimage_gd``: the
  fused loop), the torch reference otherwise (e.g. ``preimage_fixed_point``), as the dispatcher
  does for any op a chosen backend does not implement;
* CPU tensors: the CPU implementation that ``ops.py`` registered, or the reference where there is
  none (``eigh``).

``auto`` never picks these on CUDA (no ``auto_on``): no GPU benchmark has measured them yet
(benchmarks/test_eigh_gpu.py is the one to run). ``set_backend("native")`` uses them.
"""
from __future__ import annotations

import torch

from ... import _dispatch
from ...ops.kpca import sign_fix

_C_cuda = None
_ERROR = ""
try:
    from ... import _C_cuda  # type: ignore[attr-defined,no-redef]
except ImportError as exc:  # not built (CPU-only torch, no CUDA toolkit) or built against another torch
    _ERROR = (
        f"geomkern._C_cuda could not be imported ({exc}); setup.py builds it when torch is a CUDA "
        "build and a CUDA toolkit (nvcc) is found: reinstall with `pip install --no-build-isolation .`"
    )

# Converging takes 6-14 sweeps (host emulation: random matrices up to n = 512, repeated and
# clustered eigenvalues, rank-deficient), so a matrix still short of the tolerance after this many
# is an error, not a slow case.
MAX_SWEEPS = 50


def jacobi_tol(dtype: torch.dtype, n: int) -> float:
    """Stopping tolerance: off(A) <= tol ||A||_F with tol = eps / sqrt(n), eps of the input dtype.

    ||A||_F <= sqrt(n) ||A||_2, so this bounds the off-diagonal remainder by eps ||A||_2: the
    eigenvalues are then exact to the output's rounding and eigenvector i to eps ||A||_2 / gap_i,
    what a backward-stable solver gives. The kernel computes in double, so float32 input stops
    after fewer sweeps than float64 (quadratic convergence: about one sweep less).
    """
    return float(torch.finfo(dtype).eps) / max(n, 1) ** 0.5


def is_available() -> bool:
    return _C_cuda is not None


def load_error() -> str:
    return _ERROR


def eigh(A: torch.Tensor, k: int):
    """Same contract as geomkern.ops.moments.eigh_reference: (..., k) descending, (..., n, k)."""
    w, V, info = _C_cuda.jacobi_eigh(A, jacobi_tol(A.dtype, A.shape[-1]), MAX_SWEEPS)
    failed = info < 0
    if bool(failed.any()):
        raise RuntimeError(
            f"geomkern CUDA eigh (Jacobi) did not converge in {MAX_SWEEPS} sweeps for "
            f"{int(failed.sum())} of {failed.numel()} matrices; use gk.set_backend('reference')"
        )
    return w[..., :k], sign_fix(V[..., :k])


def preimage_gd(Z0, B, T, gamma: float, steps: int, lr):
    return _C_cuda.preimage_gd(Z0, B, T, float(gamma), int(steps), lr)


CUDA_KERNELS = {"eigh": eigh, "preimage_gd": preimage_gd}


def _by_device(op: str, cpu_impl, cuda_impl):
    def impl(*args):
        fn = cuda_impl if args[0].device.type == "cuda" else cpu_impl
        if fn is None:
            fn = _dispatch._REGISTRY[op].impls["reference"]
        return fn(*args)

    impl.__name__ = impl.__qualname__ = f"{op}_native"
    impl.__doc__ = f"native {op}: CUDA kernel or CPU kernel by the input's device (reference where none)"
    return impl


def _register() -> None:
    native_ops = {op for op, entry in _dispatch._REGISTRY.items() if "native" in entry.impls}
    for op in sorted(native_ops | set(CUDA_KERNELS)):
        entry = _dispatch._REGISTRY.get(op)
        cpu_impl = entry.impls.get("native") if entry is not None else None
        # no auto_on: the CPU auto order that ops.py registered stays as it is
        _dispatch.register(op, "native")(_by_device(op, cpu_impl, CUDA_KERNELS.get(op)))


if _C_cuda is not None:
    _register()
