"""Native eigh: the batched Jacobi eigensolver on CUDA (csrc/cuda/eigh.cu); no CPU kernel.

Not preferred by auto: the recorded H100 comparison (results/gpu/eigh_gpu-NVIDIA_H100_80GB_HBM3.json)
has it behind cupy on 500 matrices of 100 x 100 and behind torch on 64 of 512 x 512."""
from __future__ import annotations

import torch

from ...ops.eigh import sign_fix

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


def kernels(C, C_cuda) -> dict[str, dict[str, object]]:
    """op -> {device type: implementation} for the extensions given (None: not built)."""
    if C_cuda is None:
        return {}

    def eigh(A: torch.Tensor, k: int):  # batched Jacobi (csrc/cuda/eigh.cu)
        w, V, info = C_cuda.eigh(A, eigh_tol(A.dtype, A.shape[-1]), MAX_SWEEPS)
        failed = info < 0
        if bool(failed.any()):
            raise RuntimeError(
                f"geomkern CUDA eigh (Jacobi) did not converge in {MAX_SWEEPS} sweeps for "
                f"{int(failed.sum())} of {failed.numel()} matrices; use gk.set_backend('reference')")
        return w[..., :k], sign_fix(V[..., :k])  # the kernel sorts descending

    return {"eigh": {"cuda": eigh}}


def auto(C) -> dict[str, tuple[str, ...]]:
    """device type -> ops of this family auto prefers native for: none (see the module notes)."""
    return {}
