"""Triton kernels for batched kernel PCA: segmented Grams of all clusters in one launch, and the
projection of every cluster's components onto basis points with K(X, B) never stored.

The ``kpca`` op here only builds a size bucket's centred Grams (one fused launch instead of
per-cluster torch ops); the bucket loop, the solver choice, the eigen-solves and every
normalisation after them are geomkern.ops.kpca's own, shared by every backend.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ... import _dispatch, _validate
from . import _common as C
from ._common import mma  # by name, not C.mma: see mma's docstring
from .rbf import _sqdist_tile, sm_count, sym_gram, wave_splits


@triton.jit
def _segment_sum_kernel(X, Starts, Ends, Out, D, CHUNK, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
                        ACC: tl.constexpr):
    """Out[j, c, cols] = sum of rows Starts[j] + c CHUNK : min(Ends[j], Starts[j] + (c + 1) CHUNK)
    of X (0 past the segment's end): one program per (segment, column tile, row chunk), each
    summing its rows in a fixed order, so the sums (and the means and Grams built on them) are
    deterministic. Chunks spread a long segment over many programs: one program per segment and
    column tile read 64 MB at 0.3 TB/s on an H100 (GPU session 9: 212 us against the model's 24)."""
    j = tl.program_id(0)
    rd = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    c = tl.program_id(2)
    end = tl.load(Ends + j)
    lo = tl.load(Starts + j) + c * CHUNK
    hi = tl.minimum(end, lo + CHUNK)
    acc = tl.zeros((BLOCK_R, BLOCK_D), dtype=ACC)
    for r0 in range(lo, hi, BLOCK_R):
        rr = r0 + tl.arange(0, BLOCK_R)
        acc += tl.load(X + rr.to(tl.int64)[:, None] * D + rd[None, :],
                       mask=(rr[:, None] < hi) & (rd[None, :] < D), other=0.0).to(ACC)
    tl.store(Out + (j.to(tl.int64) * tl.num_programs(2) + c) * D + rd, tl.sum(acc, 0), mask=rd < D)


@triton.jit
def _projection_kernel(X, Alphas, Offsets, B, Params, Out, D, S, d, SPLITS,
                       BLOCK_A: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_K: tl.constexpr,
                       BLOCK_C: tl.constexpr, PRECISION: tl.constexpr, ACC: tl.constexpr):
    """Out[split, j, cols, s] = sum over this program's row tiles of segment j of
    K(B[s], X[rows]) @ Alphas[rows, cols]: program (j * SPLITS + split) takes the segment's
    BLOCK_A-row tiles split, split + SPLITS, ... (the launcher sums the splits in a fixed order).
    The K tile is built transposed, (BLOCK_S, BLOCK_A), so the second product has the basis
    tile's rows as its M dimension (wgmma's 64-row minimum) and the few components as N."""
    j = tl.program_id(0) // SPLITS
    split = tl.program_id(0) % SPLITS
    rs = tl.program_id(1) * BLOCK_S + tl.arange(0, BLOCK_S)
    rc = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)
    start = tl.load(Offsets + j)
    end = tl.load(Offsets + j + 1)
    gamma = tl.load(Params)
    acc = tl.zeros((BLOCK_S, BLOCK_C), dtype=ACC)
    for a0 in range(start + split * BLOCK_A, end, SPLITS * BLOCK_A):
        ra = a0 + tl.arange(0, BLOCK_A)
        d2 = _sqdist_tile(B, X, rs, ra, S, end, D, X, False, BLOCK_S, BLOCK_A, BLOCK_K,
                          PRECISION, ACC)
        k = tl.where(ra[None, :] < end, tl.exp(-gamma * d2), 0.0)
        # components past d are zero columns of the dot
        a = tl.load(Alphas + ra.to(tl.int64)[:, None] * d + rc[None, :],
                    mask=(ra[:, None] < end) & (rc[None, :] < d), other=0.0)
        acc = mma(k.to(Alphas.dtype.element_ty), a, acc, PRECISION)
    Oj = Out + (split.to(tl.int64) * tl.num_programs(0) // SPLITS + j) * d * S
    tl.store(Oj + rc[None, :] * S + rs[:, None], acc.to(Out.dtype.element_ty),
             mask=(rc[None, :] < d) & (rs[:, None] < S))


# ------------------------------------------------------------------------------------ launchers

# Rows one program of _segment_sum_kernel sums: 256 x 128 float32 (128 KB) per program keeps a
# 30-cluster bucket of up to 2,000 rows at ~4 programs per SM on an H100 (model, not measured).
_SUM_CHUNK = 256


def segment_means(X: torch.Tensor, starts: torch.Tensor, ends: torch.Tensor, nmax: int) -> torch.Tensor:
    """(m, D) means of X's row ranges starts[j]:ends[j] (int64 (m,) on X's device), in float32
    (float64 for float64 X); 0 for an empty range. nmax >= the longest range (the caller knows
    it: no host sync here): each range is summed in row chunks, the chunks then in a fixed order."""
    X = X.contiguous()
    m, D = starts.numel(), X.shape[1]
    acc = C.compute_dtype(X.dtype)
    if not (m and D):
        return C.empty((m, D), acc, X.device)
    chunks = max(1, triton.cdiv(int(nmax), _SUM_CHUNK))
    part = C.empty((m, chunks, D), acc, X.device)
    BLOCK_D = C.block(D, 16, 128)
    C.launch(_segment_sum_kernel)[(m, triton.cdiv(D, BLOCK_D), chunks)](
        X, starts.contiguous(), ends.contiguous(), part, D, _SUM_CHUNK, BLOCK_R=32, BLOCK_D=BLOCK_D,
        ACC=C.acc_type(X.dtype))
    n = (ends - starts).to(acc).clamp_min(1)
    return part.sum(1) / n[:, None]


def segmented_gram(X: torch.Tensor, offsets: torch.Tensor, gamma: float, center: bool = False,
                   precision: str = C.DEFAULT_PRECISION) -> torch.Tensor:
    """RBF Grams of all segments of X in one launch (two with ``center``), zero-padded.

    X: (N, D); offsets: int64 (m+1,) CSR boundaries on X's device (empty segments allowed).
    Returns (m, nmax, nmax) in X's dtype, nmax the largest segment: segment j's Gram (exact unit
    diagonal, exactly symmetric) or its double-centred H K H in the leading n_j x n_j block,
    zeros elsewhere. Each segment is moved to its mean first (as kpca's reference does).
    """
    sizes = offsets[1:] - offsets[:-1]
    nmax = int(sizes.max()) if sizes.numel() else 0  # the output shape: one host sync
    return sym_gram(X, offsets[:-1], sizes, nmax, gamma, center, precision,
                    shifts=segment_means(X, offsets[:-1], offsets[1:], nmax))[0]


def centred_grams(X, off: list, bucket: list, gamma: float, precision: str = C.DEFAULT_PRECISION):
    """Same contract as geomkern.ops.kpca.centred_grams_reference: one fused centred-Gram launch
    for the bucket (each cluster moved to its mean first, as the reference does)."""
    dev = X.device
    sizes = [off[j + 1] - off[j] for j in bucket]
    starts = torch.tensor([off[j] for j in bucket], dtype=torch.int64, device=dev)
    counts = torch.tensor(sizes, dtype=torch.int64, device=dev)
    shifts = segment_means(X, starts, starts + counts, max(sizes))
    Kc, row_means = sym_gram(X, starts, counts, sizes[0], gamma, True, precision, shifts=shifts)
    # K is symmetric: its column means are its row means
    return Kc, [row_means[t, :n].to(X.dtype) for t, n in enumerate(sizes)]


def project_onto_basis(X, alphas, offsets, B, gamma: float, precision: str = C.DEFAULT_PRECISION):
    """betas (m, d, S): betas[j] = alphas[rows of j]^T K(X[rows of j], B), all clusters in one
    launch; an empty segment gives zeros."""
    alphas = alphas.contiguous()
    m, d, S, D = offsets.numel() - 1, alphas.shape[1], B.shape[0], X.shape[1]
    out = C.empty((m, d, S), X.dtype, X.device)
    if out.numel() == 0:
        return out
    # one shift for X and B (math note 10): B's mean (S rows, cheaper than X's), applied to both
    X, B = C.shifted(X, B, by=B)
    f64 = X.dtype == torch.float64
    dot = C.dot_precision(X.dtype, precision)
    if X.dtype == torch.float32 and dot != "ieee":
        # tensor cores: 128 x 128 K tiles over two warpgroups, 32 flops per L2 byte (64 x 64: 16,
        # which the model found L2-bound; docs/history.md §11)
        BLOCK_S, BLOCK_A, BLOCK_K = C.block(S, 16, 128), 128, 32
        warps = 8 if BLOCK_S >= 128 else 4
    else:
        BLOCK_S, BLOCK_A, BLOCK_K = C.block(S, 16, 32 if f64 else 64), 32 if f64 else 64, 16 if f64 else 32
        warps = 4
    BLOCK_C = C.block(d, 16, 64)
    units = m * triton.cdiv(S, BLOCK_S) * triton.cdiv(d, BLOCK_C)
    # split each segment's row tiles over several programs when the grid would leave a partial
    # wave (20 segments x 4 basis tiles = 80 programs on 132 SMs); the average segment size
    # bounds the split (no host sync on the offsets)
    splits = wave_splits(units, triton.cdiv(triton.cdiv(X.shape[0], max(m, 1)), BLOCK_A),
                         sm_count(X))
    part = out if splits == 1 else C.empty((splits, m, d, S), C.compute_dtype(X.dtype), X.device)
    C.launch(_projection_kernel)[(m * splits, triton.cdiv(S, BLOCK_S), triton.cdiv(d, BLOCK_C))](
        X, alphas, offsets, B, C.scalars(X.device, X.dtype, gamma), part, D, S, d, splits,
        BLOCK_A=BLOCK_A, BLOCK_S=BLOCK_S, BLOCK_K=BLOCK_K, BLOCK_C=BLOCK_C,
        PRECISION=dot, ACC=C.acc_type(X.dtype), num_warps=warps)
    if splits > 1:
        out.copy_(part.sum(0))
    return out


# --------------------------------------------------------------------------------- registration

_dispatch.register("kpca", "triton", devices=C.DEVICES)(centred_grams)
# auto on CUDA: 3.54x the torch reference through the public op on an H100 (30 clusters of
# 100-2,000 points, S512, d8; 1.2e-6 relative to float64, the reference 8.6e-7: rbf.py's note)
_dispatch.register("project_onto_basis", "triton", devices=C.DEVICES,
                   auto_on=("cuda",))(project_onto_basis)


def _projection_check(X, alphas, offsets, B, gamma, precision):
    """project_onto_basis's launcher arguments (a fit as its alphas and offsets): the checks that
    read no values."""
    gamma, precision = _validate.gamma(gamma), _validate.precision(precision)
    X = _validate.tensor_meta("X", X, ndim=2)
    B = _validate.tensor_meta("B", B, ndim=2)
    alphas = _validate.tensor_meta("alphas", alphas, ndim=2)
    _validate.offsets_meta(offsets)
    _validate.same_device_dtype(X=X, B=B, alphas=alphas)
    _validate.same_dim("X", X, "B", B)
    if alphas.shape[0] != X.shape[0]:
        raise ValueError(f"alphas must have one row per row of X ({X.shape[0]}), got shape {tuple(alphas.shape)}")
    return X, alphas, offsets, B, gamma, precision


# the torch operator (operators.py registers it): the checks, then the launcher
def project_onto_basis_op(X: torch.Tensor, alphas: torch.Tensor, offsets: torch.Tensor, B: torch.Tensor,
                          gamma: float, precision: str) -> torch.Tensor:
    return project_onto_basis(*_projection_check(X, alphas, offsets, B, gamma, precision))


OPERATORS = {"project_onto_basis": project_onto_basis_op}
