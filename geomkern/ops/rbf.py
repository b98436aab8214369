"""RBF kernel family: Gram matrices, kernel-times-matrix without storing K, median bandwidth.

K_ij = exp(-gamma * max(|x_i|^2 + |y_j|^2 - 2 <x_i, y_j>, 0)).
"""
from __future__ import annotations

import math

import torch

from .. import _dispatch, _library, _validate

# Rows of X per chunk in the matrix-free reference: bounds the live K block to ~64 MiB in fp32.
_CHUNK_ELEMS = 1 << 24


# MKL's float32 GEMM (torch's CPU matmul) gives different bits at 1 and 2 threads when the left
# operand has 5-11 rows (measured with MKL 2024.2: rows 5, 6, 7, 9, 10, 11, any width and depth;
# 1-4, 8 and 12+ rows agree), so a K-Means cluster or a KPCA basis of that size made FedMC's
# results depend on the thread count. Padding such an operand to _MKL_ROWS rows with zeros gives
# the same bits at any thread count (tests/geomkern/test_rbf.py::test_small_row_gemm_is_thread_independent).
# float64 GEMMs vary with the thread count for many more small row counts (measured: 37 of the
# counts 1-60 against 30 columns of depth 7, none against 103 or more columns), so the bitwise
# thread independence that fedsim's runs rely on is a float32 promise.
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


def shift_rows(*tensors: torch.Tensor, by: torch.Tensor | None = None) -> list[torch.Tensor]:
    """Each float32/float64 (rows, D) tensor minus one common shift: the mean of the rows of
    ``by`` (default: of all the tensors), accumulated in the tensors' dtype.

    Distances are translation invariant, so a kernel's result is unchanged in exact arithmetic; in
    floating point |x|^2 + |y|^2 - 2<x, y> cancels by about |x|^2 / |x - y|^2, which the shift
    takes from (offset + spread)^2 / spread^2 to ~1 (DESIGN.md math note 10). Copies (n + m) x D,
    little beside the O(n m D) products. Every backend's distance computation uses it. Cross
    products K(X, Y) shift by Y's mean (``by=Y``): then row i of the result depends on x_i and Y
    only, not on which other rows share the call (a pre-image solver's K(z, B) has the bits of
    ``rbf_gram(x, B)`` at z = x, chunked or not)."""
    src = tensors if by is None else (by,)
    rows = sum(t.shape[0] for t in src)
    if rows == 0:
        return [t.contiguous() for t in tensors]
    shift = sum(t.sum(0) for t in src) / rows
    return [(t - shift).contiguous() for t in tensors]


# Rows per block of the reference Gram. Each block's GEMM output gets its clamp and exp while it
# is still in cache, and the symmetric Gram computes only the blocks from the diagonal on and
# mirrors them: half the GEMM and half the exps of the full matrix. 4,096 x 512 float32 at 2
# threads measured 84 ms against torch cdist + exp's 142 ms on a quiet machine (blocks of 128-512
# rows within 5%), but 1.43x torch's time beside a busy process (an OpenMP barrier per op): the
# CPU default is the native kernel, one parallel region (geomkern/backends/native, history §20). For kpca's Grams (Gram, centring and the
# copy into the bucket of one 1,750-point cluster, D 512, 1 thread, busy machine, minimum of 7
# interleaved): the full GEMM then symmetrise, centre and copy 265 ms; upper-triangle blocks
# straight into the slot 138 ms (128 rows), 144 (256), 147 (384), 171 (512). 256: near the best
# with half the ops of 128 (at 2 threads on a loaded machine every op pays an OpenMP barrier).
GRAM_TILE_ROWS = 256


def _rbf_rows(out: torch.Tensor, Xa: torch.Tensor, Y: torch.Tensor, xa: torch.Tensor,
              yy: torch.Tensor, gamma: float) -> torch.Tensor:
    """out (a rows x m view) <- exp(-gamma * max(|x_a|^2 + |y|^2 - 2 <x_a, y>, 0))."""
    torch.add(xa.unsqueeze(1), yy, out=out)
    if _pads(Xa):
        out.sub_(thread_independent_mm(Xa, Y.T), alpha=2.0)
    else:
        out.addmm_(Xa, Y.T, alpha=-2.0)
    return out.clamp_min_(0.0).mul_(-gamma).exp_()


def _row_blocks(n: int):
    """[a, b) blocks of GRAM_TILE_ROWS rows; a last block of under _MKL_ROWS rows joins the one
    before (so no block takes MKL's thread-dependent small-row GEMM unless n itself is small)."""
    cuts = list(range(0, n, GRAM_TILE_ROWS)) + [n]
    if len(cuts) > 2 and cuts[-1] - cuts[-2] < _MKL_ROWS:
        del cuts[-2]
    return zip(cuts[:-1], cuts[1:])


def sym_gram_into(out: torch.Tensor, Xs: torch.Tensor, gamma: float) -> torch.Tensor:
    """K(Xs, Xs) written into ``out`` (an (n, n) view: no fresh n x n buffer when the caller has
    a slot), from row blocks against the columns from their diagonal on, each mirrored into the
    lower triangle: exactly symmetric with an exact unit diagonal. Xs: already shifted."""
    n = Xs.shape[0]
    sq = (Xs * Xs).sum(1)
    for a, b in _row_blocks(n):
        _rbf_rows(out[a:b, a:], Xs[a:b], Xs[a:], sq[a:b], sq[a:], gamma)
        diag = out[a:b, a:b]
        diag.diagonal().fill_(1.0)  # exp(0) exactly, whatever the GEMM's roundoff
        low = diag.T.tril(-1)
        diag.triu_().add_(low)  # the diagonal block's lower triangle from its upper one
        out[b:, a:b] = out[a:b, b:].T
    return out


def gram_on_shift(X, Y, gamma: float, center: bool, sym, cross) -> torch.Tensor:
    """What every CPU Gram does around its builder: float16/bfloat16 computed in float32, the
    common shift (the rows' mean; Y's mean for K(X, Y)), ``sym(Xs, gamma)`` or ``cross(Xs, Ys,
    gamma)`` for the matrix, the double centring in place, the result in X's dtype."""
    compute = X if X.dtype in _validate.FLOAT_DTYPES else X.float()
    if Y is None:
        K = sym(shift_rows(compute)[0], gamma)
        if center:
            double_center_(K)
    else:
        Yc = Y if Y.dtype in _validate.FLOAT_DTYPES else Y.float()
        K = cross(*shift_rows(compute, Yc, by=Yc), gamma)  # (batch invariance: see shift_rows)
    return K.to(X.dtype)


def _sym_gram(Xs: torch.Tensor, gamma: float) -> torch.Tensor:
    return sym_gram_into(torch.empty(Xs.shape[0], Xs.shape[0], dtype=Xs.dtype, device=Xs.device), Xs, gamma)


def _cross_gram(Xs: torch.Tensor, Ys: torch.Tensor, gamma: float) -> torch.Tensor:
    xx, yy = (Xs * Xs).sum(1), (Ys * Ys).sum(1)
    K = torch.empty(Xs.shape[0], Ys.shape[0], dtype=Xs.dtype, device=Xs.device)
    for a, b in _row_blocks(Xs.shape[0]):
        _rbf_rows(K[a:b], Xs[a:b], Ys, xx[a:b], yy, gamma)
    return K


def gram_reference(X, Y, gamma: float, center: bool, *, precision: str | None = None) -> torch.Tensor:
    return gram_on_shift(X, Y, gamma, center, _sym_gram, _cross_gram)


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
    Xs, Ys = shift_rows(X, Y, by=Y)
    xx, yy = (Xs * Xs).sum(1), (Ys * Ys).sum(1)
    out = torch.empty(X.shape[0], V.shape[1], dtype=X.dtype, device=X.device)
    step = max(_MKL_ROWS, _CHUNK_ELEMS // max(1, Y.shape[0]))
    K = torch.empty(min(step, X.shape[0]), Y.shape[0], dtype=X.dtype, device=X.device)
    for i in range(0, X.shape[0], step):
        rows = _rbf_rows(K[:min(step, X.shape[0] - i)], Xs[i:i + step], Ys, xx[i:i + step], yy, gamma)
        out[i:i + step] = thread_independent_mm(rows, V)
    return out


_dispatch.register("rbf_gram", "reference")(gram_reference)
_dispatch.register("rbf_matmul", "reference")(rbf_matmul_reference)


def _gram_check(X, Y, gamma, center, precision):
    """rbf_gram's arguments, every check that reads no values (the function, the operator and its
    fake run it); returns them normalised."""
    X = _validate.tensor_arg("X", X)
    Y = None if Y is None else _validate.tensor_arg("Y", Y)
    gamma, center, precision = _validate.gamma(gamma), bool(center), _validate.precision(precision)
    X = _validate.tensor_meta("X", X, ndim=2, allow_half=True)
    if Y is not None:
        Y = _validate.tensor_meta("Y", Y, ndim=2, allow_half=True)
        _validate.same_device_dtype(X=X, Y=Y)
        _validate.same_dim("X", X, "Y", Y)
        if center:
            raise ValueError("center=True double-centres a square Gram and needs Y=None; "
                             "centre a cross-Gram with the training Gram's means instead")
    _validate.allocation("the Gram matrix", (X.shape[0], X.shape[0] if Y is None else Y.shape[0]),
                         X.dtype, X.device)
    return X, Y, gamma, center, precision


def _gram_fake(X, Y, gamma, center, precision):
    return X.new_empty(X.shape[0], (X if Y is None else Y).shape[0])


@_library.op("rbf_gram", "(Tensor X, Tensor? Y, float gamma, bool center, str precision) -> Tensor",
             check=_gram_check, fake=_gram_fake)
def _rbf_gram_op(X, Y, gamma, center, precision):
    X = _validate.finite("X", X)
    Y = None if Y is None else _validate.finite("Y", Y)
    return _dispatch.implementation("rbf_gram", X.device.type)(X, Y, gamma, center, precision=precision)


def rbf_gram(X: torch.Tensor, Y: torch.Tensor | None = None, *, gamma: float,
             center: bool = False, precision: str = _validate.DEFAULT_PRECISION) -> torch.Tensor:
    """RBF Gram matrix.

    X: (n, D), Y: (m, D) or None (symmetric case: exact unit diagonal, exactly symmetric).
    center=True returns H K H (double centring), only for Y=None.
    Returns (n, m) in X's dtype; float16/bfloat16 inputs are computed in float32.
    precision: how float32 dots run on tensor-core backends (geomkern._validate.PRECISIONS).
    A torch custom operator (``torch.ops.geomkern.rbf_gram``): traces under torch.compile.
    """
    return _rbf_gram_op(X, Y, gamma, center, precision)


def _matmul_check(X, Y, V, gamma, precision):
    """rbf_matmul's arguments, every check that reads no values; returns them normalised."""
    X, Y, V = (_validate.tensor_arg(n, t) for n, t in (("X", X), ("Y", Y), ("V", V)))
    gamma, precision = _validate.gamma(gamma), _validate.precision(precision)
    X = _validate.tensor_meta("X", X, ndim=2)
    Y = _validate.tensor_meta("Y", Y, ndim=2)
    V = _validate.tensor_meta("V", V, ndim=2)
    _validate.same_device_dtype(X=X, Y=Y, V=V)
    _validate.same_dim("X", X, "Y", Y)
    if V.shape[0] != Y.shape[0]:
        raise ValueError(f"V must have one row per row of Y ({Y.shape[0]}), got shape {tuple(V.shape)}")
    return X, Y, V, gamma, precision


def _matmul_fake(X, Y, V, gamma, precision):
    return X.new_empty(X.shape[0], V.shape[1])


@_library.op("rbf_matmul", "(Tensor X, Tensor Y, Tensor V, float gamma, str precision) -> Tensor",
             check=_matmul_check, fake=_matmul_fake)
def _rbf_matmul_op(X, Y, V, gamma, precision):
    X, Y, V = _validate.finite("X", X), _validate.finite("Y", Y), _validate.finite("V", V)
    return _dispatch.implementation("rbf_matmul", X.device.type)(X, Y, V, gamma, precision=precision)


def rbf_matmul(X: torch.Tensor, Y: torch.Tensor, V: torch.Tensor, *, gamma: float,
               precision: str = _validate.DEFAULT_PRECISION) -> torch.Tensor:
    """K(X, Y) @ V without storing the (n, m) kernel matrix.

    X: (n, D), Y: (m, D), V: (m, p) -> (n, p). precision: as for :func:`rbf_gram`.
    A torch custom operator (``torch.ops.geomkern.rbf_matmul``): traces under torch.compile.
    """
    return _rbf_matmul_op(X, Y, V, gamma, precision)


def median_gamma(X: torch.Tensor, *, max_points: int = 2048, seed: int = 0) -> float:
    """1 / median pairwise squared distance (the median heuristic).

    X: (n, D). Above ``max_points`` rows, a seeded random subset of that size is used (the median
    of ~2M pairs is stable to well under 1%). Raises if all points coincide.
    """
    X = _validate.tensor("X", X, ndim=2, allow_half=True)
    if X.shape[0] < 2:
        raise ValueError(f"median_gamma needs at least 2 rows in X, got {X.shape[0]}")
    max_points = _validate.positive_int("max_points", max_points, minimum=2)
    seed = _validate.positive_int("seed", seed, minimum=0, maximum=_validate.INT64_MAX)
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
    # A Gram of X forms |x|^2 + |y|^2 - 2 <x, y> in X's dtype, which resolves squared distances only
    # down to about eps |x|^2: a median below 100 times that (1 % of it lost to rounding) gives a
    # gamma whose kernel values are rounding noise (issue 44's harness: X = [0, 0, 0, 1, 1.2e-9]
    # took gamma 7e17 and KernelPCA returned 1.6 for 1.52, without an error).
    compute = torch.float64 if X.dtype == torch.float64 else torch.float32  # half inputs: a float32 Gram
    scale = float((Xc - Xc.mean(0)).square().sum(1).max())
    floor = 100 * torch.finfo(compute).eps * scale
    if med < floor:
        raise ValueError(f"median pairwise squared distance of X is {med:.3g}, below what a Gram of X in "
                         f"{str(compute).replace('torch.', '')} resolves at its scale ({floor:.3g} = 100 eps "
                         f"max|x - mean|^2): gamma = 1/median would weigh rounding noise. Pass gamma "
                         "yourself, or drop the near-duplicate rows that make most pairs coincide")
    return gamma
