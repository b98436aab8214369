"""Batched symmetric eigen-decomposition, the ``eigh`` family: the public op, its validation and
its torch reference, and the output convention every backend follows (top k, descending, each
eigenvector's largest-magnitude entry positive). Fast paths of the same name: the CUDA Jacobi
kernel (csrc/cuda/eigh.cu, registered by geomkern/backends/native) and CuPy
(geomkern/backends/cupy)."""
from __future__ import annotations

from contextlib import contextmanager

import torch

from .. import _dispatch, _validate


@contextmanager
def thread_independent(device: torch.device | str):
    """Run a CPU LAPACK eigensolver on one thread, so its result does not depend on the caller's
    thread count: MKL's threaded syevd splits its reductions by thread count from n = 128 on (the
    eigenvalues of a 384 x 384 covariance differed by 8e-8 between 1 and 2 threads, and the
    eigenvectors of clustered eigenvalues by O(1)), which made a fedsim run's GGEUR and FedMC
    samples, and so its results, depend on --threads. A no-op on other devices."""
    if torch.device(device).type != "cpu" or torch.get_num_threads() == 1:
        yield
        return
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def sign_fix(U: torch.Tensor) -> torch.Tensor:
    """Flip columns of (..., n, d) so each column's largest-|.| entry is positive (first on ties)."""
    idx = U.abs().argmax(dim=-2, keepdim=True)
    s = torch.sign(torch.gather(U, -2, idx))
    return U * torch.where(s == 0, torch.ones_like(s), s)


def top_eigenpairs(vals: torch.Tensor, vecs: torch.Tensor, k: int):
    """Ascending eigh output -> the top k, descending, in the public sign convention."""
    return vals.flip(-1)[..., :k], sign_fix(vecs.flip(-1)[..., :k])


def full_eigh(A: torch.Tensor):
    """torch.linalg.eigh (ascending) as geomkern's solves call it: on one thread on CPU
    (:func:`thread_independent`), and float32 on CUDA solved in float64 and rounded back. torch's
    float32 CUDA eigh (cuSOLVER) was ~100x less accurate than LAPACK's on an H100 (GPU session
    9, scripts/gpu_findings.py): the top eigenvalue of a 70 x 70 centred RBF Gram 1.5-1.9e-5
    off the float64 one, against 1-5e-7 from the CPU's float32 solve of the same matrix."""
    if A.is_cuda and A.dtype == torch.float32:
        vals, vecs = torch.linalg.eigh(A.double())
        return vals.float(), vecs.float()
    with thread_independent(A.device):
        return torch.linalg.eigh(A)


def eigh_reference(A, k):
    vals, vecs = full_eigh(A)
    return top_eigenpairs(vals, vecs, k)


_dispatch.register("eigh", "reference")(eigh_reference)


def eigh(A: torch.Tensor, *, k: int | None = None):
    """Batched symmetric eigen-decomposition.

    A: (..., n, n) symmetric. Returns eigenvalues (..., k) descending and eigenvectors (..., n, k)
    (columns; each column's largest-|.| entry positive). k defaults to n.
    """
    A = _validate.tensor("A", A, ndim=tuple(range(2, 8)))
    _validate.symmetric("A", A)
    n = A.shape[-1]
    k = n if k is None else _validate.positive_int("k", k)
    if k > n:
        raise ValueError(f"k={k} is larger than the matrix size n={n}")
    return _dispatch.implementation("eigh", A.device.type)(A, k)
