"""Triton fused nearest-centre assignment (squared distance + argmin, the distance matrix never
stored), used by the batched K-Means and usable for any nearest-prototype look-up.

kmeans here is geomkern.ops.kmeans.lloyd (the reference's k-means++ init and centre update) with
this kernel as its assignment step.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ... import _dispatch
from ...ops.kmeans import lloyd
from . import _common as C
from .rbf import _sqdist_tile


@triton.jit
def _assign_kernel(X, Cen, Labels, n, k, D, BLOCK_M: tl.constexpr, BLOCK_C: tl.constexpr,
                   BLOCK_K: tl.constexpr, PRECISION: tl.constexpr, ACC: tl.constexpr):
    """Labels[g, rows] = argmin_c |X[g, row] - Cen[g, c]|^2 (clamped at 0 like the reference),
    the first index on ties: within a tile by tl.min's left tie-break, across tiles because a
    later tile must be strictly smaller to win."""
    g = tl.program_id(0).to(tl.int64)
    rm = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    Xg = X + g * n * D
    Cg = Cen + g * k * D
    best = tl.full((BLOCK_M,), float("inf"), dtype=ACC)
    best_i = tl.zeros((BLOCK_M,), dtype=tl.int64)
    for c0 in range(0, k, BLOCK_C):
        rc = c0 + tl.arange(0, BLOCK_C)
        d2 = _sqdist_tile(Xg, Cg, rm, rc, n, k, D, X, False, BLOCK_M, BLOCK_C, BLOCK_K, PRECISION,
                          ACC)
        d2 = tl.where(rc[None, :] < k, d2, float("inf"))
        tile_min, tile_arg = tl.min(d2, 1, return_indices=True)
        better = tile_min < best
        best = tl.where(better, tile_min, best)
        best_i = tl.where(better, c0 + tile_arg.to(tl.int64), best_i)
    tl.store(Labels + g * n + rm, best_i, mask=rm < n)


# ------------------------------------------------------------------------------------ launchers

def assign(X: torch.Tensor, centers: torch.Tensor, precision: str = C.DEFAULT_PRECISION) -> torch.Tensor:
    """Index of the nearest centre (squared Euclidean, first on ties) for every point.

    X: (n, D) with centers: (k, D) -> (n,) int64; or batched X: (m, n, D) with centers:
    (m, k, D) -> (m, n).
    """
    batched = X.dim() == 3
    Xb = (X if batched else X.unsqueeze(0)).contiguous()
    Cb = (centers if batched else centers.unsqueeze(0)).contiguous()
    m, n, D = Xb.shape
    k = Cb.shape[1]
    if k == 0:
        raise ValueError("assign needs at least one centre")
    labels = C.empty((m, n), torch.int64, X.device)
    if labels.numel():
        f64 = X.dtype == torch.float64
        BLOCK_M = C.block(n, 16, 32 if f64 else 64)
        _assign_kernel[(m, triton.cdiv(n, BLOCK_M))](
            Xb, Cb, labels, n, k, D, BLOCK_M=BLOCK_M, BLOCK_C=C.block(k, 16, 32 if f64 else 64),
            BLOCK_K=16 if f64 else 32, PRECISION=C.dot_precision(X.dtype, precision),
            ACC=C.acc_type(X.dtype))
    return labels if batched else labels[0]


def kmeans(X, offsets, k: int, iters: int, seed: int, *, precision: str = C.DEFAULT_PRECISION):
    """Same contract as geomkern.ops.kmeans.kmeans_reference."""
    return lloyd(X, offsets, k, iters, seed, lambda P, Cs: assign(P, Cs, precision))


# --------------------------------------------------------------------------------- registration

_dispatch.register("kmeans", "triton", devices=C.DEVICES)(kmeans)
