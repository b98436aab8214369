"""Triton RBF kernels: fused Gram matrices (cross, symmetric, and symmetric for many segments in
one launch) and K(X, Y) @ V without storing K. Same math as geomkern.ops.rbf's references:
K_ij = exp(-gamma * max(|x_i|^2 + |y_j|^2 - 2 <x_i, y_j>, 0)).

Each tile is one kernel: the norms are summed from the same (rows, BLOCK_K) slabs that feed the
tiled tl.dot, and exp is the epilogue. tl.dot accumulates in float32 (float64 for float64
inputs); float32 operands use the tensor cores as three TF32 products by default ("tf32x3",
about float32's accuracy), or one ("tf32": about 1e-3 relative error on the dot, so
~gamma * |x|^2 * 1e-3 relative on K), or none ("ieee": FFMA). See geomkern._validate.PRECISIONS.
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from ... import _dispatch
from ...ops.rbf import _gram_check, _matmul_check
from . import _common as C
from ._common import mma  # by name, not C.mma: see mma's docstring


@triton.jit
def _sqdist_tile(X, Y, rm, rn, n_x, n_y, D, Shift, SHIFT: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr,
                 ACC: tl.constexpr):
    """(BLOCK_M, BLOCK_N) squared distances, clamped at 0, between rows rm of X (n_x, D) and rows
    rn of Y (n_y, D) (row-major); rows past n_x / n_y are not loaded. SHIFT: subtract the
    (D,) vector Shift from every row first (distances are translation invariant; near the data's
    mean the |x|^2 + |y|^2 - 2<x, y> expansion loses far less to cancellation)."""
    xy = tl.zeros((BLOCK_M, BLOCK_N), dtype=ACC)
    xx = tl.zeros((BLOCK_M,), dtype=ACC)
    yy = tl.zeros((BLOCK_N,), dtype=ACC)
    rk = tl.arange(0, BLOCK_K)
    x_rows = X + rm.to(tl.int64)[:, None] * D
    y_rows = Y + rn.to(tl.int64)[:, None] * D
    for k0 in range(0, D, BLOCK_K):
        kk = k0 + rk
        x = tl.load(x_rows + kk[None, :], mask=(rm[:, None] < n_x) & (kk[None, :] < D), other=0.0)
        y = tl.load(y_rows + kk[None, :], mask=(rn[:, None] < n_y) & (kk[None, :] < D), other=0.0)
        if SHIFT:
            s = tl.load(Shift + kk, mask=kk < D, other=0.0)
            x = (x.to(ACC) - s[None, :]).to(x.dtype)
            y = (y.to(ACC) - s[None, :]).to(y.dtype)
        xf = x.to(ACC)
        yf = y.to(ACC)
        xx += tl.sum(xf * xf, 1)
        yy += tl.sum(yf * yf, 1)
        xy = mma(x, tl.trans(y), xy, PRECISION)
    return tl.maximum(xx[:, None] + yy[None, :] - 2.0 * xy, 0.0)


@triton.jit
def _cross_gram_kernel(X, Y, Params, K, n_x, n_y, D, BLOCK_M: tl.constexpr,
                       BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr,
                       ACC: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    gamma = tl.load(Params)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    d2 = _sqdist_tile(X, Y, rm, rn, n_x, n_y, D, X, False, BLOCK_M, BLOCK_N, BLOCK_K,
                      PRECISION, ACC)
    k = tl.exp(-gamma * d2)
    mask = (rm[:, None] < n_x) & (rn[None, :] < n_y)
    tl.store(K + rm.to(tl.int64)[:, None] * n_y + rn[None, :], k.to(K.dtype.element_ty), mask=mask)


@triton.jit
def _sym_gram_kernel(X, Starts, Sizes, Shifts, Params, K, RowSums, nmax, D, SHIFT: tl.constexpr,
                     ROW_SUMS: tl.constexpr, BLOCK: tl.constexpr, BLOCK_K: tl.constexpr,
                     PRECISION: tl.constexpr, ACC: tl.constexpr):
    """Tile (i, j), i <= j, of segment c's Gram (rows Starts[c] : Starts[c] + Sizes[c] of X),
    written at [c, i, j] and mirrored to [c, j, i] of the zero-padded K (m, nmax, nmax).
    SHIFT: the segment's points are first moved by -Shifts[c] (D,), e.g. its mean.

    ROW_SUMS: also write RowSums[c, t, r] = sum of row r of K over column tile t (the tile's
    row sums, and its column sums for the mirrored tile): every (t, r) is written exactly once,
    so the row means need no atomics and are deterministic.
    """
    c = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_n = tl.program_id(2)
    if pid_m > pid_n:
        return  # lower tiles are the mirror images of upper ones
    start = tl.load(Starts + c)
    size = tl.load(Sizes + c)
    rm = pid_m * BLOCK + tl.arange(0, BLOCK)
    rn = pid_n * BLOCK + tl.arange(0, BLOCK)
    if pid_n * BLOCK < size:
        gamma = tl.load(Params)
        Xc = X + start * D
        shift = Shifts + c.to(tl.int64) * D
        k = tl.exp(-gamma * _sqdist_tile(Xc, Xc, rm, rn, size, size, D, shift, SHIFT, BLOCK, BLOCK,
                                         BLOCK_K, PRECISION, ACC))
        if pid_m == pid_n:
            # The dot need not be bitwise symmetric within a tile: symmetrise, and set the unit
            # diagonal exactly (exp(0)), whatever the roundoff of |x|^2 + |x|^2 - 2<x, x>.
            k = (k + tl.trans(k)) * 0.5
            k = tl.where(rm[:, None] == rn[None, :], 1.0, k)
        k = tl.where((rm[:, None] < size) & (rn[None, :] < size), k, 0.0)
    else:
        k = tl.zeros((BLOCK, BLOCK), dtype=ACC)  # all padding: no loads
    in_m = rm < nmax
    in_n = rn < nmax
    Kc = K + c.to(tl.int64) * nmax * nmax
    out_ty = K.dtype.element_ty
    tl.store(Kc + rm.to(tl.int64)[:, None] * nmax + rn[None, :], k.to(out_ty),
             mask=in_m[:, None] & in_n[None, :])
    if pid_m != pid_n:
        tl.store(Kc + rn.to(tl.int64)[:, None] * nmax + rm[None, :], tl.trans(k).to(out_ty),
                 mask=in_n[:, None] & in_m[None, :])
    if ROW_SUMS:
        R = RowSums + c.to(tl.int64) * tl.num_programs(2) * nmax
        tl.store(R + pid_n * nmax + rm, tl.sum(k, 1), mask=in_m)
        if pid_m != pid_n:
            tl.store(R + pid_m * nmax + rn, tl.sum(k, 0), mask=in_n)


@triton.jit
def _center_kernel(K, Out, RowMeans, Totals, Sizes, nmax, BLOCK: tl.constexpr):
    """Out[c] = H K[c] H on the leading Sizes[c] rows/columns (zeros elsewhere), from the row
    means r and total mean t of K[c]: K_ij - (r_i + r_j) + t, which keeps K's exact symmetry."""
    c = tl.program_id(0)
    rm = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    rn = tl.program_id(2) * BLOCK + tl.arange(0, BLOCK)
    size = tl.load(Sizes + c)
    valid = (rm[:, None] < size) & (rn[None, :] < size)
    offs = c.to(tl.int64) * nmax * nmax + rm.to(tl.int64)[:, None] * nmax + rn[None, :]
    k = tl.load(K + offs, mask=valid, other=0.0)
    r_i = tl.load(RowMeans + c.to(tl.int64) * nmax + rm, mask=rm < size, other=0.0)
    r_j = tl.load(RowMeans + c.to(tl.int64) * nmax + rn, mask=rn < size, other=0.0)
    kc = tl.where(valid, k - (r_i[:, None] + r_j[None, :]) + tl.load(Totals + c), 0.0)
    tl.store(Out + offs, kc.to(Out.dtype.element_ty),
             mask=(rm[:, None] < nmax) & (rn[None, :] < nmax))


@triton.jit
def _rbf_matmul_kernel(X, Y, V, XX, YY, Params, Out, n_x, n_y, D, p, y_chunk,
                       BLOCK_M: tl.constexpr,
                       BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_P: tl.constexpr,
                       X_RESIDENT: tl.constexpr, PRECISION: tl.constexpr, ACC: tl.constexpr):
    """Out[split, rows, cols] = sum over the Y tiles of this program's chunk (rows
    split * y_chunk : (split + 1) * y_chunk of Y) of exp(-gamma d2(X tile, Y tile)) @ V tile,
    flash-attention style: the K tile lives only in registers. The launcher sums the splits (a
    fixed order: deterministic). XX, YY: the rows' squared norms (computed once by the launcher:
    summing them here from register copies of the tiles cost the 128 x 128 kernel its registers
    and spilled). X_RESIDENT: the whole (BLOCK_M, D) X tile is loaded once (D <= BLOCK_D);
    otherwise X is streamed in BLOCK_D chunks with each Y tile."""
    pid_m = tl.program_id(0)
    pid_p = tl.program_id(1)
    pid_s = tl.program_id(2)
    gamma = tl.load(Params)
    n_lo = pid_s * y_chunk
    n_hi = tl.minimum(n_y, n_lo + y_chunk)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rp = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)
    acc = tl.zeros((BLOCK_M, BLOCK_P), dtype=ACC)
    xx = tl.load(XX + rm, mask=rm < n_x, other=0.0)
    if X_RESIDENT:
        rd = tl.arange(0, BLOCK_D)
        x = tl.load(X + rm.to(tl.int64)[:, None] * D + rd[None, :],
                    mask=(rm[:, None] < n_x) & (rd[None, :] < D), other=0.0)
    else:
        x_rows = X + rm.to(tl.int64)[:, None] * D
        rk = tl.arange(0, BLOCK_D)
    for n0 in range(n_lo, n_hi, BLOCK_N):
        rn = n0 + tl.arange(0, BLOCK_N)
        yy = tl.load(YY + rn, mask=rn < n_hi, other=0.0)
        if X_RESIDENT:
            y = tl.load(Y + rn.to(tl.int64)[:, None] * D + rd[None, :],
                        mask=(rn[:, None] < n_hi) & (rd[None, :] < D), other=0.0)
            xy = mma(x, tl.trans(y), tl.zeros((BLOCK_M, BLOCK_N), dtype=ACC), PRECISION)
        else:
            y_rows = Y + rn.to(tl.int64)[:, None] * D
            xy = tl.zeros((BLOCK_M, BLOCK_N), dtype=ACC)
            for k0 in range(0, D, BLOCK_D):
                kk = k0 + rk
                xc = tl.load(x_rows + kk[None, :], mask=(rm[:, None] < n_x) & (kk[None, :] < D),
                             other=0.0)
                yc = tl.load(y_rows + kk[None, :], mask=(rn[:, None] < n_hi) & (kk[None, :] < D),
                             other=0.0)
                xy = mma(xc, tl.trans(yc), xy, PRECISION)
        d2 = tl.maximum(xx[:, None] + yy[None, :] - 2.0 * xy, 0.0)
        k = tl.where(rn[None, :] < n_hi, tl.exp(-gamma * d2), 0.0)
        v = tl.load(V + rn.to(tl.int64)[:, None] * p + rp[None, :],
                    mask=(rn[:, None] < n_hi) & (rp[None, :] < p), other=0.0)
        acc = mma(k.to(V.dtype.element_ty), v, acc, PRECISION)
    Os = Out + pid_s.to(tl.int64) * n_x * p
    tl.store(Os + rm.to(tl.int64)[:, None] * p + rp[None, :], acc.to(Out.dtype.element_ty),
             mask=(rm[:, None] < n_x) & (rp[None, :] < p))


# ------------------------------------------------------------------------------------ launchers

# Rows of X kept whole in the rbf_matmul tile up to this D; above it X is streamed in chunks.
_RESIDENT_D = 128


def _tiles(n: int, D: int, dtype: torch.dtype, dot: str) -> tuple[int, int, int]:
    """(square tile edge, K-chunk, num_warps) for Gram tiles. float32 on the tensor cores (tf32,
    tf32x3): 128x128x32 over two warpgroups (wgmma's 64 rows each): half the L2 bytes per flop of
    64x64, which the model (scripts/gpu_model.py) finds L2-bound; FFMA ("ieee", half types'
    fallback) 64x64x32 on 4 warps; float64 32x32x16 (twice the bytes per element)."""
    if dtype == torch.float64:
        return C.block(n, 16, 32), C.block(D, 16, 16), 4
    if dtype == torch.float32 and dot != "ieee":
        return C.block(n, 16, 128), C.block(D, 16, 32), 8 if n > 64 else 4
    return C.block(n, 16, 64), C.block(D, 16, 32), 4


def sym_gram(X: torch.Tensor, starts: torch.Tensor, sizes: torch.Tensor, nmax: int, gamma: float,
             center: bool, precision: str = C.DEFAULT_PRECISION, shifts: torch.Tensor | None = None):
    """Symmetric RBF Grams of m row segments of X in one launch (two with ``center``).

    X: (N, D); starts, sizes: int64 (m,) on X's device (segment c = rows starts[c] : starts[c] +
    sizes[c]); nmax >= max(sizes); shifts: optional (m, D), subtracted from segment c's points
    first (the Gram is unchanged in exact arithmetic, its roundoff shrinks near the mean).
    Returns (K, row_means): K (m, nmax, nmax) in X's dtype, zero outside each segment's leading
    sizes[c] x sizes[c] block, exactly symmetric with an exact unit diagonal (center=False) or
    double-centred H K H (center=True); row_means (m, nmax) of the uncentred K in float32/float64
    (zeros past each size), or None when not centring.
    """
    X = X.contiguous()
    dev, dtype = X.device, X.dtype
    m, D = starts.numel(), X.shape[1]
    acc = C.compute_dtype(dtype)
    dot = C.dot_precision(dtype, precision)
    BLOCK, BLOCK_K, warps = _tiles(nmax, D, dtype, dot)
    nt = triton.cdiv(nmax, BLOCK)
    out = C.empty((m, nmax, nmax), dtype, dev)
    # Centring is done on the float32/float64 Gram, then rounded once to the output dtype.
    raw = out if not center or dtype == acc else C.empty((m, nmax, nmax), acc, dev)
    row_sums = C.empty((m, nt, nmax), acc, dev) if center else raw
    if m == 0 or nmax == 0:
        return out, (C.empty((m, nmax), acc, dev).zero_() if center else None)
    params = C.scalars(dev, dtype, gamma)
    C.launch(_sym_gram_kernel)[(m, nt, nt)](
        C.dot_operands(X), starts, sizes, X if shifts is None else shifts.contiguous(), params, raw,
        row_sums, nmax, D, SHIFT=shifts is not None, ROW_SUMS=center,
        BLOCK=BLOCK, BLOCK_K=BLOCK_K, PRECISION=dot, ACC=C.acc_type(dtype), num_warps=warps)
    if not center:
        return out, None
    n = sizes.to(acc).clamp_min(1)
    row_means = row_sums.sum(1) / n[:, None]
    totals = row_means.sum(1) / n
    C.launch(_center_kernel)[(m, nt, nt)](raw, out, row_means, totals, sizes, nmax, BLOCK=BLOCK,
                                num_warps=warps)
    return out, row_means


def rbf_gram(X, Y, gamma: float, center: bool, precision: str = C.DEFAULT_PRECISION) -> torch.Tensor:
    """K(X, Y) (n, m), or the symmetric K(X, X) (exact unit diagonal, exactly symmetric; only the
    tiles i <= j are computed) when Y is None, double-centred with ``center``. Output in X's
    dtype; float16/bfloat16 inputs accumulate in float32."""
    dev = X.device
    if Y is None:
        n = X.shape[0]
        starts = torch.zeros(1, dtype=torch.int64, device=dev)
        sizes = torch.full((1,), n, dtype=torch.int64, device=dev)
        # shifted by the rows' mean first (math note 10): the kernel's SHIFT loads would add
        # instructions to its hot loop, a copy costs one pass over X
        return sym_gram(C.shifted(X)[0], starts, sizes, n, gamma, center, precision)[0][0]
    n, m, D = X.shape[0], Y.shape[0], X.shape[1]
    out = C.empty((n, m), X.dtype, dev)
    if n == 0 or m == 0:
        return out
    X, Y = C.shifted(X, Y, by=Y)  # Y's mean: each row of X's result independent of the batch
    dot = C.dot_precision(X.dtype, precision)
    BLOCK, BLOCK_K, warps = _tiles(max(n, m), D, X.dtype, dot)
    C.launch(_cross_gram_kernel)[(triton.cdiv(n, BLOCK), triton.cdiv(m, BLOCK))](
        C.dot_operands(X), C.dot_operands(Y), C.scalars(dev, X.dtype, gamma), out, n, m, D,
        BLOCK_M=BLOCK, BLOCK_N=BLOCK, BLOCK_K=BLOCK_K, PRECISION=dot, ACC=C.acc_type(X.dtype),
        num_warps=warps)
    return out


def sm_count(t: torch.Tensor) -> int:
    """Multiprocessors of t's GPU; an H100 SXM's 132 where there is none (the interpreter, the
    sm_90 compile report): the count the grids below are shaped for."""
    if t.is_cuda and torch.cuda.is_available():
        return torch.cuda.get_device_properties(t.device).multi_processor_count
    return 132


def wave_splits(units: int, max_splits: int, sms: int, tolerance: float = 1.05) -> int:
    """How many ways to split each of ``units`` equal programs (a reduction split, summed after)
    so the grid fills whole waves on ``sms`` SMs: the smallest split count whose wave
    quantisation ceil(g / sms) / (g / sms), g = units * split, is within ``tolerance``, else the
    best one up to ``max_splits`` (scripts/gpu_model.py prices a launch by this makespan)."""
    best_q, best = None, 1
    for s in range(1, max(1, max_splits) + 1):
        g = units * s
        q = -(-g // sms) / (g / sms)
        if q <= tolerance:
            return s
        if best_q is None or q < best_q - 1e-9:
            best_q, best = q, s
    return best


# rbf_matmul tiles, float32 on the tensor cores: 128 x 128 K tiles over two warpgroups. At D > 128
# (X streamed with each Y tile) 64 x 64 moved 16 flops per L2 byte, 128 x 128 moves 32: the
# model had the 64 x 64 kernel L2-bound at 1.85x its dot time (sm90 report, docs/history.md §11).
_MATMUL_TC = (128, 128, 8)
# Each split's Y chunk keeps at least this many BLOCK_N tiles (the partial outputs stay a few
# percent of the traffic).
_MIN_TILES_PER_SPLIT = 8


def rbf_matmul(X, Y, V, gamma: float, precision: str = C.DEFAULT_PRECISION) -> torch.Tensor:
    """K(X, Y) @ V (n, p) for X (n, D), Y (m, D), V (m, p); K is never stored. Y is split into
    chunks over a third grid axis when the row tiles alone would leave SMs idle (a partial
    wave); the chunks' partial products are summed in a fixed order."""
    V = V.contiguous()
    n, m, D, p = X.shape[0], Y.shape[0], X.shape[1], V.shape[1]
    out = C.empty((n, p), X.dtype, X.device)
    if n == 0 or p == 0:
        return out
    if m == 0:
        return out.zero_()
    X, Y = C.shifted(X, Y, by=Y)  # Y's mean: each row of X's result independent of the batch
    f64 = X.dtype == torch.float64
    dot = C.dot_precision(X.dtype, precision)
    resident = D <= _RESIDENT_D
    if X.dtype == torch.float32 and dot != "ieee":
        bm, bn, warps = _MATMUL_TC
        # the tensor-core kernel streams X in BLOCK_D chunks at every D: a resident (128, 128) X
        # tile at tf32x3 needs 270 KB of shared memory, and a resident (128, 64) one spilled in
        # the hot loop under triton 3.8 (255 registers, 6-10 local-memory operations per Y tile);
        # streamed, it does not spill, at the same modelled time (sm_90 compile report)
        resident = False
        BLOCK_M, BLOCK_N = C.block(n, 16, bm), C.block(m, 16, bn)
        warps = warps if BLOCK_M >= 128 and BLOCK_N >= 64 else 4
    else:
        BLOCK_M, BLOCK_N = C.block(n, 16, 32 if f64 else 64), C.block(m, 16, 32 if f64 else 64)
        warps = 8 if (resident and not f64) else 4
    # streamed X/Y chunks: 16 wide for float64 and for the split tf32x3 (with each K step's own
    # accumulator, _common.mma, 32-wide chunks spilled in the hot loop under triton 3.6: 255
    # registers, 520 bytes; at 16 none does under 3.6, 3.8 or 3.9, at the same modelled time, sm_90
    # compile report; the H100 figures of docs/gpu-model.md were measured with 32, not since)
    BLOCK_D = (C.block(D, 16, _RESIDENT_D) if resident
               else 16 if f64 or dot == "tf32x3split" else 32)
    BLOCK_P = C.block(p, 16, 32 if f64 else 64)
    units = triton.cdiv(n, BLOCK_M) * triton.cdiv(p, BLOCK_P)
    y_tiles = triton.cdiv(m, BLOCK_N)
    splits = wave_splits(units, y_tiles // _MIN_TILES_PER_SPLIT, sm_count(X))
    y_chunk = triton.cdiv(y_tiles, splits) * BLOCK_N
    splits = triton.cdiv(m, y_chunk)
    part = out if splits == 1 else C.empty((splits, n, p), C.compute_dtype(X.dtype), X.device)
    acc = C.compute_dtype(X.dtype)
    xx, yy = (X.to(acc) ** 2).sum(1), (Y.to(acc) ** 2).sum(1)
    C.launch(_rbf_matmul_kernel)[(triton.cdiv(n, BLOCK_M), triton.cdiv(p, BLOCK_P), splits)](
        X, Y, V, xx, yy, C.scalars(X.device, X.dtype, gamma), part, n, m, D, p, y_chunk, BLOCK_M=BLOCK_M,
        BLOCK_N=BLOCK_N, BLOCK_D=BLOCK_D, BLOCK_P=BLOCK_P, X_RESIDENT=resident,
        PRECISION=dot, ACC=C.acc_type(X.dtype), num_warps=warps)
    if splits > 1:
        out.copy_(part.sum(0))
    return out


# --------------------------------------------------------------------------------- registration

# auto on CUDA: measured on an H100 through the public ops (scripts/tf32x3_schemes.py, the GPU
# session of 2026-11-26, float32, same inputs, interleaved): rbf_gram 2.43x (symmetric 4096 x
# D512) and 1.32x (cross) the torch reference, rbf_matmul 4.96x (20,000^2 x D64, p16), at 1.3e-7
# and 6.4e-7 relative to float64 (the reference: 7.7e-8, 1.4e-7); on an offset cloud 1.1e-7
# against the reference's 1.2e-4 (the common shift). The interpreter's CPU registration is for
# tests only: never auto there.
_dispatch.register("rbf_gram", "triton", devices=C.DEVICES, auto_on=("cuda",))(rbf_gram)
_dispatch.register("rbf_matmul", "triton", devices=C.DEVICES, auto_on=("cuda",))(rbf_matmul)


# the torch operators (operators.py registers them): the public ops' checks, then the launcher
def rbf_gram_op(X: torch.Tensor, Y: Optional[torch.Tensor], gamma: float, center: bool,
                precision: str) -> torch.Tensor:
    return rbf_gram(*_gram_check(X, Y, gamma, center, precision))


def rbf_matmul_op(X: torch.Tensor, Y: torch.Tensor, V: torch.Tensor, gamma: float,
                  precision: str) -> torch.Tensor:
    return rbf_matmul(*_matmul_check(X, Y, V, gamma, precision))


OPERATORS = {"rbf_gram": rbf_gram_op, "rbf_matmul": rbf_matmul_op}
