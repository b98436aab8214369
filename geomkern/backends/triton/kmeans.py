"""Triton fused nearest-centre assignment (squared distance + argmin, the distance matrix never
stored), used by the batched K-Means and usable for any nearest-prototype look-up.

kmeans here is geomkern.ops.kmeans.lloyd (the reference's k-means++ init and centre update) with
this kernel as its assignment step.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ... import _dispatch, _validate
from ...ops.kmeans import lloyd
from . import _common as C
from ._common import mma  # by name, not C.mma: see mma's docstring
from .rbf import sm_count


@triton.jit
def _assign_kernel(X, Cen, CC, Labels, n, k, D, BLOCK_M: tl.constexpr, BLOCK_C: tl.constexpr,
                   BLOCK_K: tl.constexpr, PRECISION: tl.constexpr, ACC: tl.constexpr):
    """Labels[g, rows] = argmin_c |X[g, row] - Cen[g, c]|^2 (clamped at 0 like the reference),
    the first index on ties: within a tile by tl.min's left tie-break, across tiles because a
    later tile must be strictly smaller to win. CC: the centres' squared norms (m, k), computed
    by the launcher (k rows: summing them here from register copies spilled the 256-row tile);
    the rows' norms are summed here from the chunks that feed the dot."""
    g = tl.program_id(0).to(tl.int64)
    rm = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    Xg = X + g * n * D
    Cg = Cen + g * k * D
    rk = tl.arange(0, BLOCK_K)
    x_rows = Xg + rm.to(tl.int64)[:, None] * D
    best = tl.full((BLOCK_M,), float("inf"), dtype=ACC)
    best_i = tl.zeros((BLOCK_M,), dtype=tl.int64)
    for c0 in range(0, k, BLOCK_C):
        rc = c0 + tl.arange(0, BLOCK_C)
        c_rows = Cg + rc.to(tl.int64)[:, None] * D
        xy = tl.zeros((BLOCK_M, BLOCK_C), dtype=ACC)
        xx = tl.zeros((BLOCK_M,), dtype=ACC)
        for k0 in range(0, D, BLOCK_K):
            kk = k0 + rk
            x = tl.load(x_rows + kk[None, :], mask=(rm[:, None] < n) & (kk[None, :] < D), other=0.0)
            c = tl.load(c_rows + kk[None, :], mask=(rc[:, None] < k) & (kk[None, :] < D), other=0.0)
            xf = x.to(ACC)
            xx += tl.sum(xf * xf, 1)
            xy = mma(x, tl.trans(c), xy, PRECISION)
        cc = tl.load(CC + g * k + rc, mask=rc < k, other=0.0)
        d2 = tl.maximum(xx[:, None] + cc[None, :] - 2.0 * xy, 0.0)
        d2 = tl.where(rc[None, :] < k, d2, float("inf"))
        tile_min, tile_arg = tl.min(d2, 1, return_indices=True)
        better = tile_min < best
        best = tl.where(better, tile_min, best)
        best_i = tl.where(better, c0 + tile_arg.to(tl.int64), best_i)
    tl.store(Labels + g * n + rm, best_i, mask=rm < n)


# ------------------------------------------------------------------------------------ launchers

def _rows_per_tile(m: int, n: int, k: int, block_c: int, sms: int) -> int:
    """BLOCK_M for the tensor-core assign (the kernel reads its X rows once and all k centres once
    per program, so it is bound by those bytes): the tile whose busiest SM moves the fewest,
    ceil(programs / sms) * (BLOCK_M + k) rows, as scripts/gpu_model.py prices it; ties go to
    the smaller tile. 256-row tiles (k = 64, 10 x 5,000 points: 2 waves of 320 rows against 6 of
    128, model 1.08x the roofline instead of 1.28x) spill in the hot loop at tf32x3 (the operands'
    hi/lo split in registers, 9 local-memory ops per iteration at 8 warps, 15 at 16), so they are
    not offered (docs/history.md §11)."""
    kc = triton.cdiv(k, block_c) * block_c
    best = None
    for bm in (64, 128):
        bm = C.block(n, 16, bm)
        cost = triton.cdiv(m * triton.cdiv(n, bm), sms) * (bm + kc)
        if best is None or cost < best[0]:
            best = (cost, bm)
    return best[1]


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
        dot = C.dot_precision(X.dtype, precision)
        BLOCK_C = C.block(k, 16, 32 if f64 else 64)
        if X.dtype == torch.float32 and dot != "ieee":
            BLOCK_M = _rows_per_tile(m, n, k, BLOCK_C, sm_count(X))
        else:
            BLOCK_M = C.block(n, 16, 32 if f64 else 64)
        acc = C.compute_dtype(X.dtype)
        cc = (Cb.to(acc) ** 2).sum(2)
        C.launch(_assign_kernel)[(m, triton.cdiv(n, BLOCK_M))](
            Xb, Cb, cc, labels, n, k, D, BLOCK_M=BLOCK_M, BLOCK_C=BLOCK_C,
            BLOCK_K=16 if f64 else 32, PRECISION=dot, ACC=C.acc_type(X.dtype),
            num_warps=8 if BLOCK_M >= 256 else 4)
    return labels if batched else labels[0]


def kmeans(X, offsets, k: int, iters: int, seed: int, *, precision: str = C.DEFAULT_PRECISION):
    """Same contract as geomkern.ops.kmeans.kmeans_reference."""
    return lloyd(X, offsets, k, iters, seed, lambda P, Cs: assign(P, Cs, precision))


# --------------------------------------------------------------------------------- registration

_dispatch.register("kmeans", "triton", devices=C.DEVICES)(kmeans)


# the torch operator (operators.py registers it), the assignment step batched: X (m, n, D),
# centers (m, k, D) -> (m, n); the checks that read no values, then the launcher
def assign_op(X: torch.Tensor, centers: torch.Tensor, precision: str) -> torch.Tensor:
    if X.dim() != 3 or centers.dim() != 3:
        raise ValueError(f"kmeans_assign takes batched X (m, n, D) and centers (m, k, D), got "
                         f"{tuple(X.shape)} and {tuple(centers.shape)}")
    precision = _validate.precision(precision)
    X = _validate.tensor_meta("X", X, ndim=3)
    centers = _validate.tensor_meta("centers", centers, ndim=3)
    _validate.same_device_dtype(X=X, centers=centers)
    if centers.shape[0] != X.shape[0] or centers.shape[2] != X.shape[2]:
        raise ValueError(f"centers (m, k, D) must match X (m, n, D) in m and D, got {tuple(centers.shape)} "
                         f"and {tuple(X.shape)}")
    return assign(X, centers, precision)


OPERATORS = {"kmeans_assign": assign_op}
