"""RBF kernel family: Gram matrices, kernel-times-matrix without storing K, median bandwidth.

K_ij = exp(-gamma * max(|x_i|^2 + |y_j|^2 - 2 <x_i, y_j>, 0)).
"""
from __future__ import annotations

import math

import torch

from .. import _dispatch, _validate

# Rows of X per chunk in the matrix-free reference: bounds the live K block to ~64 MiB in fp32.
_CHUNK_ELEMS = 1 << 24


# MKL's float32 GEMM (torch's CPU matmul) gives different bits at 1 and 2 threads when the left
# operand has 5-11 rows (measured with MKL 2024.2: rows 5, 6, 7, 9, 10, 11, any width and depth;
# 1-4, 8 and 12+ rows agree), so a K-Means cluster or a KPCA basis of that size made FedMC's
# results depend on the thread count. Padding such an operand to _MKL_ROWS rows with zeros gives
# the same bits at any thread count (tests/test_rbf.py::test_small_row_gemm_is_thread_independent).
_MKL_ROWS = 12


def _pads(A: torch.Tensor) -> bool:
    """Whether A, as a GEMM's left operand, takes MKL's thread-dependent kernel (see _MKL_ROWS)."""
    return A.device.type == "cpu" and A.dtype == torch.float32 and 4 < A.shape[0] < _MKL_ROWS


def thread_independent_mm(A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """A @ B with the same bits at any CPU thread count (see _MKL_ROWS)."""
    if not _pads(A):
        return A @ B
    return (torch.cat([A, A.new_zeros(_MKL_ROWS - A.shape[0], A.shape[1])]) @ B)[:A.shape[0]]


def _sqdist(X: torch.Tensor, Y: torch.Tensor) -> torch.Tensor:
    """Pairwise squared distances via the GEMM expansion, clamped at 0 (roundoff can go negative)."""
    xx = (X * X).sum(1, keepdim=True)
    yy = (Y * Y).sum(1)
    d2 = torch.empty(X.shape[0], Y.shape[0], dtype=X.dtype, device=X.device)
    torch.add(xx, yy, out=d2)
    if _pads(X):
        return d2.sub_(thread_independent_mm(X, Y.T), alpha=2.0).clamp_min_(0.0)
    return d2.addmm_(X, Y.T, alpha=-2.0).clamp_min_(0.0)  # = addmm(xx + yy, ...), one buffer less


def gram_reference(X, Y, gamma: float, center: bool, *, precision: str | None = None) -> torch.Tensor:
    compute = X if X.dtype in _validate.FLOAT_DTYPES else X.float()
    # in place where possible: every fresh n x n buffer costs page faults (n = 1,750 float32:
    # 34 ms -> 25 ms for the same bits, benchmarks/NOTES.md)
    if Y is None:
        K = _sqdist(compute, compute).mul_(-gamma).exp_()
        K.diagonal().fill_(1.0)  # exp(0) exactly, whatever the GEMM's roundoff
        K = (K + K.T).mul_(0.5)  # exactly symmetric
        if center:
            K = double_center(K)
    else:
        Yc = Y if Y.dtype in _validate.FLOAT_DTYPES else Y.float()
        K = _sqdist(compute, Yc).mul_(-gamma).exp_()
    return K.to(X.dtype)


def double_center(K: torch.Tensor) -> torch.Tensor:
    """H K H with H = I - 11^T/n, for a symmetric (..., n, n) K (a new tensor)."""
    return double_center_(K.clone())


def double_center_(K: torch.Tensor) -> torch.Tensor:
    """:func:`double_center` in place: ((K - col means) - row means) + overall mean."""
    col = K.mean(-2, keepdim=True)
    row = K.mean(-1, keepdim=True)
    # the mean of the n row means, not one reduction over all n^2 entries: torch splits a reduction
    # of more than 32768 elements by thread count, so its rounding (and a run's results) depended on it
    mean = row.mean(-2, keepdim=True)
    return K.sub_(col).sub_(row).add_(mean)


def rbf_matmul_reference(X, Y, V, gamma: float, *, precision: str | None = None) -> torch.Tensor:
    out = torch.empty(X.shape[0], V.shape[1], dtype=X.dtype, device=X.device)
    step = max(1, _CHUNK_ELEMS // max(1, Y.shape[0]))
    for i in range(0, X.shape[0], step):
        K = _sqdist(X[i:i + step], Y).mul_(-gamma).exp_()
        torch.mm(K, V, out=out[i:i + step])
    return out


_dispatch.register("rbf_gram", "reference")(gram_reference)
_dispatch.register("rbf_matmul", "reference")(rbf_matmul_reference)


def rbf_gram(X: torch.Tensor, Y: torch.Tensor | None = None, *, gamma: float,
             center: bool = False, precision: str = _validate.DEFAULT_PRECISION) -> torch.Tensor:
    """RBF Gram matrix.

    X: (n, D), Y: (m, D) or None (symmetric case: exact unit diagonal, exactly symmetric).
    center=True returns H K H (double centring), only for Y=None.
    Returns (n, m) in X's dtype; float16/bfloat16 inputs are computed in float32.
    precision: how float32 dots run on tensor-core backends (geomkern._validate.PRECISIONS).
    """
    X = _validate.tensor("X", X, ndim=2, allow_half=True)
    if Y is not None:
        Y = _validate.tensor("Y", Y, ndim=2, allow_half=True)
        _validate.same_device_dtype(X=X, Y=Y)
        _validate.same_dim("X", X, "Y", Y)
        if center:
            raise ValueError("center=True double-centres a square Gram and needs Y=None; "
                             "centre a cross-Gram with the training Gram's means instead")
    g = _validate.gamma(gamma)
    _validate.allocation("the Gram matrix", (X.shape[0], X.shape[0] if Y is None else Y.shape[0]),
                         X.dtype, X.device)
    p = _validate.precision(precision)
    return _dispatch.implementation("rbf_gram", X.device.type)(X, Y, g, bool(center), precision=p)


def rbf_matmul(X: torch.Tensor, Y: torch.Tensor, V: torch.Tensor, *, gamma: float,
               precision: str = _validate.DEFAULT_PRECISION) -> torch.Tensor:
    """K(X, Y) @ V without storing the (n, m) kernel matrix.

    X: (n, D), Y: (m, D), V: (m, p) -> (n, p). precision: as for :func:`rbf_gram`.
    """
    X = _validate.tensor("X", X, ndim=2)
    Y = _validate.tensor("Y", Y, ndim=2)
    V = _validate.tensor("V", V, ndim=2)
    _validate.same_device_dtype(X=X, Y=Y, V=V)
    _validate.same_dim("X", X, "Y", Y)
    if V.shape[0] != Y.shape[0]:
        raise ValueError(f"V must have one row per row of Y ({Y.shape[0]}), got shape {tuple(V.shape)}")
    g = _validate.gamma(gamma)
    p = _validate.precision(precision)
    return _dispatch.implementation("rbf_matmul", X.device.type)(X, Y, V, g, precision=p)


def median_gamma(X: torch.Tensor, *, max_points: int = 2048, seed: int = 0) -> float:
    """1 / median pairwise squared distance (the median heuristic).

    X: (n, D). Above ``max_points`` rows, a seeded random subset of that size is used (the median
    of ~2M pairs is stable to well under 1%). Raises if all points coincide.
    """
    X = _validate.tensor("X", X, ndim=2, allow_half=True)
    if X.shape[0] < 2:
        raise ValueError(f"median_gamma needs at least 2 rows in X, got {X.shape[0]}")
    max_points = _validate.positive_int("max_points", max_points, minimum=2)
    Xc = X.double()
    if Xc.shape[0] > max_points:
        gen = torch.Generator().manual_seed(int(seed))
        idx = torch.randperm(Xc.shape[0], generator=gen)[:max_points].to(X.device)
        Xc = Xc[idx]
    # Direct differences, not the GEMM expansion: coincident points must give exactly 0 (the
    # expansion leaves ~eps |x|^2 of roundoff, which made 1/median huge instead of raising).
    d2 = torch.pdist(Xc).square()
    med = float(torch.quantile(d2, 0.5)) if d2.numel() <= (1 << 24) else float(d2.median())
    if med <= 0:
        raise ValueError("median pairwise squared distance of X is 0 (more than half the pairs "
                         "coincide); pass an explicit gamma instead")
    gamma = 1.0 / med
    if not (math.isfinite(gamma) and gamma > 0 and math.isfinite(med)):
        raise ValueError(f"median pairwise squared distance of X is {med:.3g}, whose inverse is not a "
                         "usable gamma; rescale X (gamma scales by 1/factor^2) or pass gamma yourself")
    return gamma
