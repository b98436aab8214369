"""CuPy path: ``gk.eigh`` on CUDA tensors through ``cupy.linalg.eigh`` (cuSOLVER; batched
syevj for small matrices), zero-copy both ways through DLPack.

Registered as backend "cupy" when ``cupy`` imports; it serves CUDA tensors only (a CPU tensor
under ``set_backend("cupy")`` uses the reference). Not preferred by ``auto``: it is the fastest
recorded (float32 centred RBF Grams on an H100, results/gpu/eigh_gpu-NVIDIA_H100_80GB_HBM3.json:
0.0080 s against torch.linalg.eigh's 0.88 s for 500 of 100 x 100, 0.13 s against 0.94 s for 64
of 512 x 512), but not at the reference's accuracy. Its float32 eigenvalues were 1.5e-5 and
2.7e-4 off the float64 ones there (GPU session 12 again), where the reference solves float32 in
float64 on CUDA (3-4e-8, scripts/gpu_findings.py's eigh_upcast_cost; geomkern.ops.eigh.full_eigh).
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


def why_not(device_type: str | None = None) -> str:  # the same on every device type it serves
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
