"""CuPy path: ``gk.eigh`` on CUDA tensors through ``cupy.linalg.eigh`` (cuSOLVER; batched
syevj for small matrices), zero-copy both ways through DLPack.

Registered as backend "cupy" when ``cupy`` imports; it serves CUDA tensors only (a CPU tensor
under ``set_backend("cupy")`` uses the reference). Not preferred by ``auto``: no GPU benchmark of
it against torch and geomkern's Jacobi kernel has been recorded yet
(benchmarks/test_eigh_gpu.py measures all three).
"""
from __future__ import annotations

import torch

from ... import _dispatch
from ...ops.eigh import top_eigenpairs

_ERROR = ""
try:
    import cupy
except Exception as exc:  # ImportError, or a CUDA-library error from a broken install
    cupy = None
    _ERROR = (f"cupy could not be imported ({exc}); install the wheel for your CUDA, e.g. "
              "`pip install cupy-cuda12x` (or `pip install geomkern[cupy]`); it runs on CUDA tensors")


def why_not() -> str:
    return _ERROR


def eigh(A, k: int):
    """Same contract as geomkern.ops.eigh.eigh_reference, for CUDA tensors."""
    with cupy.cuda.Device(A.device.index or 0):
        w, V = cupy.linalg.eigh(cupy.from_dlpack(A.detach().contiguous()))
        vals, vecs = torch.from_dlpack(w), torch.from_dlpack(V)
    return top_eigenpairs(vals, vecs, k)


_dispatch.register_backend("cupy", why_not=why_not)
if cupy is not None:
    _dispatch.register("eigh", "cupy", devices=("cuda",))(eigh)
