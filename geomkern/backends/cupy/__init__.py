"""CuPy path: ``gk.eigh`` on CUDA tensors through ``cupy.linalg.eigh`` (cuSOLVER; batched
syevj for small matrices), zero-copy both ways through DLPack.

Registered as backend "cupy" when ``cupy`` imports; it runs on CUDA tensors only (a CPU tensor
under ``set_backend("cupy")`` uses the reference). Not preferred by ``auto``: no GPU benchmark of
it against torch and geomkern's Jacobi kernel has been recorded yet
(benchmarks/test_eigh_gpu.py measures all three).
"""
from __future__ import annotations

from ... import _dispatch

_ERROR = ""
try:
    import cupy
except Exception as exc:  # ImportError, or a CUDA-library error from a broken install
    cupy = None
    _ERROR = (f"cupy could not be imported ({exc}); install the wheel for your CUDA, e.g. "
              "`pip install cupy-cuda12x` (or `pip install geomkern[cupy]`); it runs on CUDA tensors")


def is_available() -> bool:
    return cupy is not None


def load_error() -> str:
    return _ERROR


def eigh(A, k: int):
    """Same contract as geomkern.ops.moments.eigh_reference, for CUDA tensors."""
    import torch

    from ...ops.moments import top_eigenpairs

    with cupy.cuda.Device(A.device.index or 0):
        w, V = cupy.linalg.eigh(cupy.from_dlpack(A.detach().contiguous()))
        vals, vecs = torch.from_dlpack(w), torch.from_dlpack(V)
    return top_eigenpairs(vals, vecs, k)


if cupy is not None:
    _dispatch.register("eigh", "cupy")(eigh)
