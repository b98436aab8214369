"""Every invalid input at the public boundary raises a clear ValueError/TypeError naming the
argument; non-contiguous inputs are handled (same result as contiguous), never rejected."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import geomkern as gk
from geomkern import _validate
from geomkern.ops import kmeans as kmeans_mod

F64 = torch.float64


def _x(n=12, D=3, seed=0, dtype=F64):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, D, generator=g, dtype=F64).to(dtype)


def _fit(X=None, sizes=(6, 6), d=2):
    X = _x() if X is None else X
    return gk.kpca(X, torch.tensor(np.cumsum((0,) + tuple(sizes))), n_components=d, gamma=0.5)


def _with(X, value, at=(1, 1)):
    X = X.clone()
    X[at] = value
    return X


OFF = torch.tensor([0, 6, 12])

# Ops taking a data matrix X (n, D) as their first argument, as callables of X.
X_OPS = {
    "rbf_gram": lambda X: gk.rbf_gram(X, gamma=0.5),
    "rbf_gram_xy": lambda X: gk.rbf_gram(X, _x(4), gamma=0.5),
    "rbf_matmul": lambda X: gk.rbf_matmul(X, _x(5), _x(5, 2), gamma=0.5),
    "median_gamma": lambda X: gk.median_gamma(X),
    "kpca": lambda X: gk.kpca(X, OFF, n_components=2, gamma=0.5),
    "class_moments": lambda X: gk.class_moments(X, torch.zeros(12, dtype=torch.int64), 2),
    "kmeans": lambda X: gk.kmeans(X, 2),
}


# ----- X itself: NaN/Inf, rank, dtype, type ---------------------------------------------------

@pytest.mark.parametrize("op", sorted(X_OPS))
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_nonfinite_X_rejected(op, bad):
    with pytest.raises(ValueError, match=r"X contains 1 NaN/Inf"):
        X_OPS[op](_with(_x(), bad))


@pytest.mark.parametrize("op", sorted(X_OPS))
@pytest.mark.parametrize("shape", [(12,), (2, 6, 3), ()])
def test_wrong_rank_X_rejected(op, shape):
    with pytest.raises(ValueError, match=r"X must have rank 2"):
        X_OPS[op](torch.zeros(shape, dtype=F64))


@pytest.mark.parametrize("op", sorted(X_OPS))
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool, torch.complex64])
def test_integer_or_non_real_dtype_X_rejected(op, dtype):
    with pytest.raises(TypeError, match=r"X has dtype"):
        X_OPS[op](torch.ones(12, 3, dtype=dtype))


@pytest.mark.parametrize("op", sorted(X_OPS))
@pytest.mark.parametrize("value", [np.ones((12, 3)), [[1.0, 2.0, 3.0]] * 12, None, 3.0])
def test_non_tensor_X_rejected(op, value):
    with pytest.raises(TypeError, match=r"X must be a torch.Tensor"):
        X_OPS[op](value)


@pytest.mark.parametrize("op", ["rbf_matmul", "kpca", "kmeans"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_X_rejected_where_not_supported(op, dtype):
    with pytest.raises(TypeError, match=r"X has dtype"):
        X_OPS[op](_x(dtype=dtype))


@pytest.mark.parametrize("op", ["rbf_gram", "rbf_matmul", "kpca", "kmeans"])
def test_empty_X_rejected(op):
    with pytest.raises(ValueError, match=r"X is empty"):
        X_OPS[op](torch.zeros(0, 3, dtype=F64))


# ----- second operands: Y, V, B, Z, Z0, targets, proj -------------------------------------------

def test_rbf_gram_Y_checks():
    X = _x()
    with pytest.raises(ValueError, match=r"Y contains 1 NaN/Inf"):
        gk.rbf_gram(X, _with(_x(4), math.nan), gamma=0.5)
    with pytest.raises(ValueError, match=r"feature dimension mismatch: X has D=3 but Y has D=4"):
        gk.rbf_gram(X, _x(4, 4), gamma=0.5)
    with pytest.raises(TypeError, match=r"Y has dtype torch.float64 but X has torch.float32"):
        gk.rbf_gram(X.float(), _x(4), gamma=0.5)
    with pytest.raises(TypeError, match=r"Y has dtype torch.float16 but X has torch.bfloat16"):
        gk.rbf_gram(X.bfloat16(), _x(4).half(), gamma=0.5)
    with pytest.raises(ValueError, match=r"Y must have rank 2"):
        gk.rbf_gram(X, torch.zeros(3, dtype=F64), gamma=0.5)
    with pytest.raises(TypeError, match=r"Y must be a torch.Tensor"):
        gk.rbf_gram(X, np.ones((4, 3)), gamma=0.5)
    with pytest.raises(ValueError, match=r"center=True .* needs Y=None"):
        gk.rbf_gram(X, _x(4), gamma=0.5, center=True)


def test_rbf_matmul_operand_checks():
    X, Y, V = _x(), _x(5), _x(5, 2)
    with pytest.raises(ValueError, match=r"feature dimension mismatch: X has D=3 but Y has D=4"):
        gk.rbf_matmul(X, _x(5, 4), V, gamma=0.5)
    with pytest.raises(ValueError, match=r"V must have one row per row of Y \(5\)"):
        gk.rbf_matmul(X, Y, _x(6, 2), gamma=0.5)
    with pytest.raises(TypeError, match=r"Y has dtype torch.float64 but X has torch.float32"):
        gk.rbf_matmul(X.float(), Y, V, gamma=0.5)
    with pytest.raises(TypeError, match=r"V has dtype torch.float32 but X has torch.float64"):
        gk.rbf_matmul(X, Y, V.float(), gamma=0.5)
    with pytest.raises(ValueError, match=r"V contains 1 NaN/Inf"):
        gk.rbf_matmul(X, Y, _with(V, math.inf), gamma=0.5)
    with pytest.raises(ValueError, match=r"V must have rank 2"):
        gk.rbf_matmul(X, Y, torch.zeros(5, dtype=F64), gamma=0.5)


def test_projection_and_transform_operand_checks():
    X, fit = _x(), _fit()
    with pytest.raises(ValueError, match=r"feature dimension mismatch: X has D=3 but B has D=5"):
        gk.project_onto_basis(X, fit, _x(4, 5), gamma=0.5)
    with pytest.raises(ValueError, match=r"B contains 1 NaN/Inf"):
        gk.project_onto_basis(X, fit, _with(_x(4), math.nan), gamma=0.5)
    with pytest.raises(TypeError, match=r"B has dtype torch.float32 but X has torch.float64"):
        gk.project_onto_basis(X, fit, _x(4).float(), gamma=0.5)
    with pytest.raises(TypeError, match=r"fit must be the KPCAFit"):
        gk.project_onto_basis(X, {"alphas": fit.alphas}, _x(4), gamma=0.5)
    with pytest.raises(ValueError, match=r"X has 11 rows but fit was computed on 12"):
        gk.project_onto_basis(X[:11], fit, _x(4), gamma=0.5)
    with pytest.raises(TypeError, match=r"fit.alphas has dtype torch.float64 but X has"):
        gk.project_onto_basis(X.float(), fit, _x(4).float(), gamma=0.5)
    with pytest.raises(ValueError, match=r"feature dimension mismatch: Z has D=2 but X has D=3"):
        gk.kpca_transform(_x(4, 2), X, fit, gamma=0.5, segment=0)
    with pytest.raises(ValueError, match=r"Z contains 1 NaN/Inf"):
        gk.kpca_transform(_with(_x(4), math.nan), X, fit, gamma=0.5, segment=0)
    with pytest.raises(ValueError, match=r"segment ids must lie in \[0, 2\)"):
        gk.kpca_transform(_x(4), X, fit, gamma=0.5, segment=2)
    with pytest.raises(ValueError, match=r"segment ids must lie in \[0, 2\)"):
        gk.kpca_transform(_x(4), X, fit, gamma=0.5, segment=torch.tensor([0, 1, -1, 0]))
    with pytest.raises(ValueError, match=r"segment must be an int or an int64 tensor of shape"):
        gk.kpca_transform(_x(4), X, fit, gamma=0.5, segment=torch.tensor([0, 1]))
    with pytest.raises(TypeError, match=r"segment must be an int or an int64 tensor"):
        gk.kpca_transform(_x(4), X, fit, gamma=0.5, segment=True)


def test_preimage_operand_checks():
    Z0, B = _x(4), _x(9)
    T = torch.rand(4, 9, dtype=F64)
    with pytest.raises(ValueError, match=r"feature dimension mismatch: Z0 has D=3 but B has D=2"):
        gk.preimage(Z0, _x(9, 2), T, gamma=0.5)
    with pytest.raises(ValueError, match=r"Z0 contains 1 NaN/Inf"):
        gk.preimage(_with(Z0, math.nan), B, T, gamma=0.5)
    with pytest.raises(ValueError, match=r"targets contains 1 NaN/Inf"):
        gk.preimage(Z0, B, _with(T, math.inf), gamma=0.5)
    with pytest.raises(TypeError, match=r"targets has dtype torch.float32 but Z0 has"):
        gk.preimage(Z0, B, T.float(), gamma=0.5)
    with pytest.raises(ValueError, match=r"targets must have one row per row of Z0 \(4\)"):
        gk.preimage(Z0, B, T[:3], gamma=0.5)
    with pytest.raises(ValueError, match=r"targets must have one column per basis point \(S=9\)"):
        gk.preimage(Z0, B, T[:, :8], gamma=0.5)
    with pytest.raises(ValueError, match=r"method='newton' is not supported"):
        gk.preimage(Z0, B, T, gamma=0.5, method="newton")
    with pytest.raises(ValueError, match=r"method='coordinates' needs proj"):
        gk.preimage(Z0, B, T[:, :2], gamma=0.5, method="coordinates")
    with pytest.raises(ValueError, match=r"proj must have shape \(2, 9\) or \(4, 2, 9\)"):
        gk.preimage(Z0, B, T[:, :2], gamma=0.5, method="coordinates",
                    proj=torch.ones(3, 9, dtype=F64))
    with pytest.raises(ValueError, match=r"proj must have shape"):
        gk.preimage(Z0, B, T[:, :2], gamma=0.5, method="coordinates",
                    proj=torch.ones(5, 2, 9, dtype=F64))
    with pytest.raises(ValueError, match=r"proj contains 1 NaN/Inf"):
        gk.preimage(Z0, B, T[:, :2], gamma=0.5, method="coordinates",
                    proj=_with(torch.ones(2, 9, dtype=F64), math.nan))
    with pytest.raises(TypeError, match=r"proj has dtype torch.float32 but Z0 has"):
        gk.preimage(Z0, B, T[:, :2], gamma=0.5, method="coordinates", proj=torch.ones(2, 9))
    with pytest.raises(ValueError, match=r"proj is only used by method='coordinates'"):
        gk.preimage(Z0, B, T, gamma=0.5, proj=torch.ones(2, 9, dtype=F64))
    with pytest.raises(ValueError, match=r"lr must be a finite number > 0"):
        gk.preimage(Z0, B, T, gamma=0.5, lr=-1.0)
    with pytest.raises(ValueError, match=r"lr must be > 0"):
        gk.preimage(Z0, B, T, gamma=0.5, lr=torch.tensor([1.0, 0.0, 1.0, 1.0], dtype=F64))
    with pytest.raises(ValueError, match=r"lr must be a scalar or have shape \(4,\)"):
        gk.preimage(Z0, B, T, gamma=0.5, lr=torch.ones(3, dtype=F64))
    with pytest.raises(ValueError, match=r"lr is only used by method='gd'"):
        gk.preimage(Z0, B, T, gamma=0.5, method="fixed_point", lr=0.1)
    with pytest.raises(ValueError, match=r"ridge must be a finite number > 0"):
        gk.preimage(Z0, B, T, gamma=0.5, method="fixed_point", ridge=0.0)
    with pytest.raises(ValueError, match=r"steps must be >= 0"):
        gk.preimage(Z0, B, T, gamma=0.5, steps=-1)
    with pytest.raises(TypeError, match=r"steps must be an integer"):
        gk.preimage(Z0, B, T, gamma=0.5, steps=10.0)


# ----- gamma -----------------------------------------------------------------------------------

GAMMA_OPS = {
    "rbf_gram": lambda g: gk.rbf_gram(_x(), gamma=g),
    "rbf_matmul": lambda g: gk.rbf_matmul(_x(), _x(5), _x(5, 2), gamma=g),
    "kpca": lambda g: gk.kpca(_x(), OFF, n_components=2, gamma=g),
    "kpca_transform": lambda g: gk.kpca_transform(_x(3), _x(), _fit(), gamma=g, segment=0),
    "project_onto_basis": lambda g: gk.project_onto_basis(_x(), _fit(), _x(4), gamma=g),
    "preimage": lambda g: gk.preimage(_x(4), _x(9), torch.rand(4, 9, dtype=F64), gamma=g),
}


@pytest.mark.parametrize("op", sorted(GAMMA_OPS))
@pytest.mark.parametrize("g", [0.0, -1.0, math.nan, math.inf, torch.tensor(-0.5)])
def test_gamma_not_positive_finite_rejected(op, g):
    with pytest.raises(ValueError, match=r"gamma must be a finite number > 0"):
        GAMMA_OPS[op](g)


@pytest.mark.parametrize("op", sorted(GAMMA_OPS))
@pytest.mark.parametrize("g", [True, False, "0.5", None, 1 + 0j])
def test_gamma_wrong_type_rejected(op, g):
    with pytest.raises(TypeError, match=r"gamma must be a positive number"):
        GAMMA_OPS[op](g)


@pytest.mark.parametrize("op", sorted(GAMMA_OPS))
def test_gamma_non_scalar_tensor_rejected(op):
    with pytest.raises(ValueError, match=r"gamma must be a scalar"):
        GAMMA_OPS[op](torch.tensor([0.5, 0.5]))


def test_gamma_accepts_int_numpy_and_scalar_tensor():
    ref = gk.rbf_gram(_x(), gamma=2.0)
    for g in (2, np.float64(2.0), np.int64(2), torch.tensor(2.0), torch.tensor([2.0])):
        assert torch.equal(gk.rbf_gram(_x(), gamma=g), ref)


# ----- offsets (kpca and kmeans) ---------------------------------------------------------------

SEG_OPS = {
    "kpca": lambda X, off: gk.kpca(X, off, n_components=2, gamma=0.5),
    "kmeans": lambda X, off: gk.kmeans(X, 2, offsets=off),
}


@pytest.mark.parametrize("op", sorted(SEG_OPS))
@pytest.mark.parametrize("off,exc,msg", [
    ([0, 6, 12], TypeError, r"offsets must be an int64 torch.Tensor"),
    (np.array([0, 6, 12]), TypeError, r"offsets must be an int64 torch.Tensor"),
    (torch.tensor([0, 6, 12], dtype=torch.int32), TypeError, r"offsets must have dtype int64"),
    (torch.tensor([0.0, 6.0, 12.0]), TypeError, r"offsets must have dtype int64"),
    (torch.tensor([12]), ValueError, r"offsets must be 1-D with m\+1 >= 2 entries"),
    (torch.tensor([], dtype=torch.int64), ValueError, r"offsets must be 1-D with m\+1 >= 2"),
    (torch.tensor([[0, 12]]), ValueError, r"offsets must be 1-D"),
    (torch.tensor([1, 6, 12]), ValueError, r"offsets\[0\] must be 0"),
    (torch.tensor([0, 6, 11]), ValueError, r"offsets\[-1\] must equal the number of rows of X \(12"),
    (torch.tensor([0, 6, 13]), ValueError, r"offsets\[-1\] must equal the number of rows of X"),
    (torch.tensor([0, 8, 4, 12]), ValueError, r"offsets must be non-decreasing"),
    (torch.tensor([0, 6, 6, 12]), ValueError, r"segment 1 is empty \(offsets\[1\] == offsets\[2\]"),
    (torch.tensor([0, 0, 12]), ValueError, r"segment 0 is empty"),
])
def test_bad_offsets_rejected(op, off, exc, msg):
    with pytest.raises(exc, match=msg):
        SEG_OPS[op](_x(), off)


def test_n_components_checks():
    X = _x()
    with pytest.raises(ValueError, match=r"n_components=3 is larger than cluster 1's size 2"):
        gk.kpca(X, torch.tensor([0, 10, 12]), n_components=3, gamma=0.5)
    with pytest.raises(ValueError, match=r"n_components=13 is larger than cluster 0's size 12"):
        gk.kpca(X, torch.tensor([0, 12]), n_components=13, gamma=0.5)
    with pytest.raises(ValueError, match=r"n_components must be >= 1"):
        gk.kpca(X, OFF, n_components=0, gamma=0.5)
    with pytest.raises(TypeError, match=r"n_components must be an integer"):
        gk.kpca(X, OFF, n_components=True, gamma=0.5)
    with pytest.raises(TypeError, match=r"n_components must be an integer"):
        gk.kpca(X, OFF, n_components=2.0, gamma=0.5)
    with pytest.raises(ValueError, match=r"solver='arpack' is not supported"):
        gk.kpca(X, OFF, n_components=2, gamma=0.5, solver="arpack")


# ----- kmeans ----------------------------------------------------------------------------------

def test_kmeans_checks():
    X = _x()
    with pytest.raises(ValueError, match=r"k=13 is larger than the number of points \(X has 12\)"):
        gk.kmeans(X, 13)
    with pytest.raises(ValueError, match=r"k=4 is larger than the number of points \(segment 1 has 3"):
        gk.kmeans(X, 4, offsets=torch.tensor([0, 9, 12]))
    with pytest.raises(ValueError, match=r"k must be >= 1"):
        gk.kmeans(X, 0)
    with pytest.raises(TypeError, match=r"k must be an integer"):
        gk.kmeans(X, 2.5)
    with pytest.raises(TypeError, match=r"k must be an integer"):
        gk.kmeans(X, True)
    with pytest.raises(ValueError, match=r"iters must be >= 0"):
        gk.kmeans(X, 2, iters=-1)
    with pytest.raises(ValueError, match=r"seed must be >= 0"):
        gk.kmeans(X, 2, seed=-3)
    with pytest.raises(TypeError, match=r"seed must be an integer"):
        gk.kmeans(X, 2, seed="1")


# ----- class_moments / pool_moments ------------------------------------------------------------

def test_class_moments_label_checks():
    X = _x()
    y = torch.arange(12) % 3
    with pytest.raises(ValueError, match=r"y values must lie in \[0, n_classes=3\), got range \[0, 3"):
        gk.class_moments(X, torch.where(y == 2, 3, y), 3)
    with pytest.raises(ValueError, match=r"y values must lie in \[0, n_classes=3\), got range \[-1,"):
        gk.class_moments(X, torch.where(y == 2, -1, y), 3)
    with pytest.raises(TypeError, match=r"y must hold integer class ids"):
        gk.class_moments(X, y.double(), 3)
    with pytest.raises(TypeError, match=r"y must hold integer class ids"):
        gk.class_moments(X, y == 1, 3)
    with pytest.raises(TypeError, match=r"y must be an integer torch.Tensor"):
        gk.class_moments(X, y.tolist(), 3)
    with pytest.raises(ValueError, match=r"y must have shape \(12,\)"):
        gk.class_moments(X, y[:11], 3)
    with pytest.raises(ValueError, match=r"y must have shape \(12,\)"):
        gk.class_moments(X, y.view(3, 4), 3)
    with pytest.raises(ValueError, match=r"n_classes must be >= 1"):
        gk.class_moments(X, y, 0)
    with pytest.raises(TypeError, match=r"n_classes must be an integer"):
        gk.class_moments(X, y, 3.0)


def test_pool_moments_checks():
    counts = torch.ones(2, 3, dtype=torch.int64)
    means, covs = torch.zeros(2, 3, 4, dtype=F64), torch.zeros(2, 3, 4, 4, dtype=F64)
    with pytest.raises(ValueError, match=r"counts must be a \(K, C\) tensor"):
        gk.pool_moments(counts.tolist(), means, covs)
    with pytest.raises(ValueError, match=r"counts must be a \(K, C\) tensor"):
        gk.pool_moments(counts[0], means, covs)
    with pytest.raises(ValueError, match=r"shapes disagree"):
        gk.pool_moments(torch.ones(2, 4, dtype=torch.int64), means, covs)
    with pytest.raises(ValueError, match=r"shapes disagree"):
        gk.pool_moments(counts, means, covs[..., :3])
    with pytest.raises(ValueError, match=r"counts must be >= 0"):
        gk.pool_moments(-counts, means, covs)
    with pytest.raises(ValueError, match=r"counts contains NaN/Inf"):
        gk.pool_moments(torch.full((2, 3), math.nan), means, covs)
    with pytest.raises(ValueError, match=r"means contains 1 NaN/Inf"):
        gk.pool_moments(counts, _with(means, math.nan, (0, 0, 0)), covs)
    with pytest.raises(ValueError, match=r"covs contains 1 NaN/Inf"):
        gk.pool_moments(counts, means, _with(covs, math.inf, (0, 0, 0, 0)))
    with pytest.raises(ValueError, match=r"means must have rank 3"):
        gk.pool_moments(counts, means[0], covs)
    with pytest.raises(TypeError, match=r"covs has dtype torch.float32 but means has"):
        gk.pool_moments(counts, means, covs.float())


# ----- eigh ------------------------------------------------------------------------------------

def test_eigh_checks():
    A = torch.eye(5, dtype=F64) + 0.1
    with pytest.raises(ValueError, match=r"A is not symmetric"):
        gk.eigh(_with(A, 1.0, (0, 4)))
    with pytest.raises(ValueError, match=r"A is not symmetric"):
        gk.eigh(torch.stack([A, _with(A, 0.5, (2, 1))]))
    with pytest.raises(ValueError, match=r"k=6 is larger than the matrix size n=5"):
        gk.eigh(A, k=6)
    with pytest.raises(ValueError, match=r"k must be >= 1"):
        gk.eigh(A, k=0)
    with pytest.raises(ValueError, match=r"A must be square"):
        gk.eigh(torch.zeros(5, 4, dtype=F64))
    with pytest.raises(ValueError, match=r"A must have rank"):
        gk.eigh(torch.zeros(5, dtype=F64))
    with pytest.raises(ValueError, match=r"A contains 1 NaN/Inf"):
        gk.eigh(_with(A, math.nan, (2, 2)))
    with pytest.raises(TypeError, match=r"A has dtype"):
        gk.eigh(torch.eye(5, dtype=torch.int64))
    with pytest.raises(TypeError, match=r"A must be a torch.Tensor"):
        gk.eigh(np.eye(5))
    # roundoff-level asymmetry (what a GEMM leaves) is accepted
    B = _x(5, 5)
    C = B @ B.T
    C = C + 1e-15 * torch.triu(torch.ones_like(C), 1)
    gk.eigh(C)


# ----- backend selection -----------------------------------------------------------------------

def test_set_backend_checks():
    before = gk.get_backend()
    with pytest.raises(ValueError, match=r"backend='fastest' is not a geomkern backend"):
        gk.set_backend("fastest")
    with pytest.raises(RuntimeError, match=r"backend 'triton' is not available"):
        gk.set_backend("triton")
    with pytest.raises(TypeError, match=r"backend must be a string"):
        gk.set_backend(None)
    assert gk.get_backend() == before, "a rejected set_backend changed the backend"


# ----- devices ---------------------------------------------------------------------------------

@pytest.mark.gpu
def test_mixed_devices_rejected():
    X = _x()
    with pytest.raises(ValueError, match=r"Y is on cuda:0 but X is on cpu"):
        gk.rbf_gram(X, _x(4).cuda(), gamma=0.5)
    with pytest.raises(ValueError, match=r"B is on cuda:0 but X is on cpu"):
        gk.project_onto_basis(X, _fit(), _x(4).cuda(), gamma=0.5)
    with pytest.raises(ValueError, match=r"y is on cuda:0 but X is on cpu"):
        gk.class_moments(X, torch.zeros(12, dtype=torch.int64).cuda(), 2)
    with pytest.raises(ValueError, match=r"B is on cuda:0 but Z0 is on cpu"):
        gk.preimage(_x(4), _x(9).cuda(), torch.rand(4, 9, dtype=F64), gamma=0.5)


# ----- non-contiguous inputs are handled, not rejected -----------------------------------------

def _noncontig(X):
    """Same values as X, as a transposed view and as a strided slice (both non-contiguous)."""
    Xt = X.T.contiguous().T
    wide = torch.zeros(X.shape[0], 2 * X.shape[1], dtype=X.dtype)
    wide[:, ::2] = X
    Xs = wide[:, ::2]
    assert not Xt.is_contiguous() and not Xs.is_contiguous()
    assert torch.equal(Xt, X) and torch.equal(Xs, X)
    return Xt, Xs


def _same(a, b):
    if isinstance(a, (tuple, list)):
        assert len(a) == len(b)
        for u, v in zip(a, b):
            _same(u, v)
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b)
    elif isinstance(a, gk.KPCAFit):
        for name in ("eigenvalues", "variances", "alphas", "mean_projection", "offsets"):
            assert torch.equal(getattr(a, name), getattr(b, name)), name
    else:
        assert a == b


_T4 = torch.rand(4, 8, dtype=F64)
_P = torch.randn(2, 8, dtype=F64)

NC_CASES = {
    "rbf_gram": lambda X: gk.rbf_gram(X, gamma=0.5, center=True),
    "rbf_gram_xy": lambda X: gk.rbf_gram(X[:5], X[5:], gamma=0.5),
    "rbf_matmul": lambda X: gk.rbf_matmul(X, X[:5], X[:5, :2], gamma=0.5),
    "median_gamma": lambda X: gk.median_gamma(X),
    "kpca": lambda X: gk.kpca(X, OFF, n_components=2, gamma=0.5),
    "kpca_transform": lambda X: gk.kpca_transform(X[:4], X, _fit(X), gamma=0.5, segment=1),
    "project_onto_basis": lambda X: gk.project_onto_basis(X, _fit(X), X[:4], gamma=0.5),
    "preimage_gd": lambda X: gk.preimage(X[:4], X[4:], _T4, gamma=0.5, steps=5),
    "preimage_fixed_point": lambda X: gk.preimage(X[:4], X[4:], _T4, gamma=0.5, steps=5,
                                                  method="fixed_point"),
    "preimage_coordinates": lambda X: gk.preimage(X[:4], X[4:], _T4[:, :2], gamma=0.5,
                                                  method="coordinates", steps=5, proj=_P),
    "class_moments": lambda X: gk.class_moments(X, torch.arange(12) % 3, 3),
    "kmeans": lambda X: gk.kmeans(X, 3, offsets=OFF),
}


@pytest.mark.parametrize("op", sorted(NC_CASES))
def test_non_contiguous_inputs_handled(op):
    X = _x(12, 3, seed=7)
    ref = NC_CASES[op](X)
    for Xn in _noncontig(X):
        _same(NC_CASES[op](Xn), ref)


def test_non_contiguous_eigh_input_handled():
    M = _x(6, 6, seed=4)
    A = torch.stack([M + M.T, M.T @ M])  # exactly symmetric, so A^T is the same matrix
    At = A.transpose(-1, -2)
    assert not At.is_contiguous() and torch.equal(At, A)
    _same(gk.eigh(At, k=3), gk.eigh(A, k=3))
    _same(gk.eigh(A[:, ::2, ::2]), gk.eigh(A[:, ::2, ::2].contiguous()))


def test_non_contiguous_second_operands_handled():
    X, Y, V = _x(12, 3, seed=1), _x(6, 3, seed=2), _x(6, 2, seed=3)
    Yt, Ys = _noncontig(Y)
    Vt, Vs = _noncontig(V)
    ref = gk.rbf_matmul(X, Y, V, gamma=0.3)
    assert torch.equal(gk.rbf_matmul(X, Yt, Vs, gamma=0.3), ref)
    assert torch.equal(gk.rbf_matmul(X, Ys, Vt, gamma=0.3), ref)
    fit = _fit(X)
    ref = gk.project_onto_basis(X, fit, Y, gamma=0.5)
    assert torch.equal(gk.project_onto_basis(X, fit, Yt, gamma=0.5), ref)
    y = torch.arange(24) % 3
    ref = gk.class_moments(X, y[::2].contiguous(), 3)
    _same(gk.class_moments(X, y[::2], 3), ref)
    counts, means, covs = (torch.stack([t, t]) for t in ref)
    pooled = gk.pool_moments(counts, means, covs)
    _same(gk.pool_moments(counts.T.contiguous().T, means.transpose(0, 1).contiguous()
                          .transpose(0, 1), covs.transpose(-1, -2).contiguous()
                          .transpose(-1, -2)), pooled)


# ----- the shared test helpers fail when they should --------------------------------------------

def test_assert_close_rel_reports_and_fails():
    from _oracle import assert_close_rel, match_signs, rel_error
    ref = np.array([[1.0, 2.0], [3.0, 4.0]])
    assert_close_rel(ref * (1 + 1e-12), ref, 1e-10)
    with pytest.raises(AssertionError, match=r"relative error .* first at \(1, 0\)"):
        assert_close_rel(ref + np.array([[0.0, 0.0], [1e-3, 0.0]]), ref, 1e-10)
    with pytest.raises(AssertionError, match=r"NaN/Inf mismatch at 1 position"):
        assert_close_rel(np.where(ref == 2.0, np.nan, ref), ref, 1e-10)
    with pytest.raises(AssertionError, match=r"shape"):
        assert_close_rel(ref[0], ref, 1e-10)
    assert rel_error(np.zeros(3), np.zeros(3)) == 0.0
    with pytest.raises(AssertionError):
        assert_close_rel(np.full(3, 1e-3), np.zeros(3), 1e-10)
    assert match_signs(-ref, ref).tolist() == [-1.0, -1.0]


# ------------------------------------------------------------------------------------------------
# Folded from test_refusals.py:
# geomkern refuses what it cannot compute (never returns NaN for finite input): overflow-scale
# values, non-finite solver parameters, gradients it would drop, a fit used with another gamma or X,
# outputs larger than the machine, and K-Means memory that grows with the data.

F32, F64 = torch.float32, torch.float64


def _ops(X):
    """Every public op that takes a data matrix, as a one-argument call."""
    B = X[:3].clone()
    off = torch.tensor([0, 4, X.shape[0]])
    return {
        "rbf_gram": lambda: gk.rbf_gram(X, gamma=1.0),
        "rbf_matmul": lambda: gk.rbf_matmul(X, X, X[:, :1], gamma=1.0),
        "median_gamma": lambda: gk.median_gamma(X),
        "kpca": lambda: gk.kpca(X, off, n_components=1, gamma=1.0),
        "kmeans": lambda: gk.kmeans(X, 2),
        "class_moments": lambda: gk.class_moments(X, torch.arange(X.shape[0]) % 2, 2),
        "preimage": lambda: gk.preimage(X[:2], B, torch.rand(2, 3, dtype=X.dtype), gamma=1.0),
        "preimage_loss": lambda: gk.preimage_loss(X[:2], B, torch.rand(2, 3, dtype=X.dtype), gamma=1.0),
    }


@pytest.mark.parametrize("dtype", [F32, F64], ids=["f32", "f64"])
@pytest.mark.parametrize("op", list(_ops(torch.zeros(8, 3))))
def test_overflow_scale_input_is_refused_not_nan(op, dtype, gen):
    X = torch.randn(8, 3, generator=gen, dtype=F64)
    big = math.sqrt(torch.finfo(dtype).max) * 0.9  # |x|^2 alone is finite, sums of them are not
    X[1] = big
    X[2] = -big
    with pytest.raises(ValueError, match=r"(X|Z0|Z) has values up to .* overflow"):
        _ops(X.to(dtype))[op]()


@pytest.mark.parametrize("dtype", [F32, F64], ids=["f32", "f64"])
def test_large_but_safe_values_still_compute(dtype, gen):
    # just below the refusal bound the Gram is finite: the bound is not stricter than it must be
    D = 3
    limit = math.sqrt(torch.finfo(dtype).max / (4 * D))
    X = (torch.rand(6, D, generator=gen, dtype=F64) * 2 - 1).to(dtype) * (0.5 * limit)
    K = gk.rbf_gram(X, gamma=1.0 / (0.5 * limit) ** 2)
    assert bool(torch.isfinite(K).all())


def test_old_code_returned_nan_here():
    # the case this guards: float32 rows of 1e20 made |x|^2 + |y|^2 - 2<x, y> = inf - inf
    X = torch.full((4, 3), 1e20)
    X[1] *= -1
    with pytest.raises(ValueError, match="overflow float32"):
        gk.rbf_gram(X, gamma=1.0)
    assert bool(torch.isfinite(gk.rbf_gram(X.double(), gamma=1e-40)).all())  # float64 is fine


def test_median_gamma_never_returns_nan_or_inf():
    X = torch.tensor([[0.0], [1e-170], [2e-170]], dtype=F64)  # median squared distance 1e-340 -> 0
    with pytest.raises(ValueError, match="median pairwise squared distance"):
        gk.median_gamma(X)
    g = gk.median_gamma(torch.tensor([[0.0], [1.0], [3.0]]))
    assert math.isfinite(g) and g > 0


@pytest.mark.parametrize("bad", [math.inf, math.nan, -1.0, 0.0, True, "0.1"])
def test_preimage_rejects_bad_lr_and_ridge(bad, gen):
    Z0, B = torch.randn(2, 3, generator=gen), torch.randn(4, 3, generator=gen)
    T = torch.rand(2, 4, generator=gen)
    err = TypeError if isinstance(bad, (bool, str)) else ValueError
    with pytest.raises(err, match="lr"):
        gk.preimage(Z0, B, T, gamma=1.0, lr=bad)
    with pytest.raises(err, match="ridge"):
        gk.preimage(Z0, B, T, gamma=1.0, method="fixed_point", ridge=bad)
    with pytest.raises(ValueError, match="lr contains 1 NaN/Inf"):
        gk.preimage(Z0, B, T, gamma=1.0, lr=torch.tensor([0.1, math.inf]))


def test_preimage_loss_validates_like_preimage(gen):
    Z, B, T = torch.randn(2, 3, generator=gen), torch.randn(4, 3, generator=gen), torch.rand(2, 4)
    with pytest.raises(ValueError, match="gamma must be a finite number > 0"):
        gk.preimage_loss(Z, B, T, gamma=-1.0)
    with pytest.raises(ValueError, match="targets must have one column per basis point"):
        gk.preimage_loss(Z, B, T[:, :3], gamma=1.0)
    with pytest.raises(ValueError, match="Z contains 1 NaN/Inf"):
        gk.preimage_loss(torch.tensor([[math.nan, 0, 0], [0, 0, 0.0]]), B, T, gamma=1.0)
    with pytest.raises(ValueError, match="proj must have shape"):
        gk.preimage_loss(Z, B, T[:, :2], gamma=1.0, proj=torch.ones(3, 4))
    loss = gk.preimage_loss(Z, B, T, gamma=1.0)
    assert torch.allclose(loss, ((gk.rbf_gram(Z, B, gamma=1.0) - T) ** 2).sum(1))


@pytest.mark.parametrize("op", list(_ops(torch.zeros(8, 3))))
def test_requires_grad_is_refused_with_the_fix(op, gen):
    X = torch.randn(8, 3, generator=gen, requires_grad=True)
    with pytest.raises(ValueError, match=r"requires grad.*\.detach\(\)"):
        _ops(X)[op]()


def test_fit_refuses_another_gamma_or_another_x(gen):
    X = torch.randn(20, 3, generator=gen, dtype=F64)
    off = torch.tensor([0, 9, 20])
    fit = gk.kpca(X, off, n_components=2, gamma=0.5)
    B, Z = torch.randn(4, 3, dtype=F64), torch.randn(2, 3, dtype=F64)
    gk.project_onto_basis(X, fit, B, gamma=0.5)
    gk.kpca_transform(Z, X, fit, gamma=0.5, segment=0)
    with pytest.raises(ValueError, match="fitted with gamma=0.5|computed with gamma=0.5"):
        gk.project_onto_basis(X, fit, B, gamma=0.25)
    with pytest.raises(ValueError, match="computed with gamma=0.5"):
        gk.kpca_transform(Z, X, fit, gamma=0.25, segment=0)
    other = X.clone()
    other[5, 1] += 1e-9
    with pytest.raises(ValueError, match="X differs from the X that gk.kpca was fitted on"):
        gk.project_onto_basis(other, fit, B, gamma=0.5)
    with pytest.raises(ValueError, match="X differs"):
        gk.kpca_transform(Z, X.flip(0), fit, gamma=0.5, segment=0)  # same values, other order


def test_outputs_larger_than_the_machine_are_refused_before_allocating(monkeypatch):
    monkeypatch.setattr(_validate, "_physical_memory", lambda device: 1 << 20)  # a 1 MiB machine
    X = torch.randn(600, 2)  # 600^2 float32 = 1.37 MiB
    with pytest.raises(ValueError, match=r"the Gram matrix would need 1\.4 MiB \(\(600, 600\) float32\) but cpu has 1\.0 MiB"):
        gk.rbf_gram(X, gamma=1.0)
    gk.rbf_gram(X[:500], gamma=1.0)  # 0.95 MiB fits
    with pytest.raises(ValueError, match="the class covariances would need"):
        gk.class_moments(torch.randn(10, 400), torch.zeros(10, dtype=torch.int64), 3)


def test_kmeans_padding_grows_with_the_data_not_segments_times_largest(monkeypatch, gen):
    sizes = [2000] + [10] * 200  # one large segment and many small ones
    X = torch.randn(sum(sizes), 4, generator=gen)
    off = torch.tensor([0] + torch.tensor(sizes).cumsum(0).tolist())
    padded = []
    real_pad = kmeans_mod._pad

    def spy(*args):
        Xp, mask, s = real_pad(*args)
        padded.append(Xp.numel())
        return Xp, mask, s

    monkeypatch.setattr(kmeans_mod, "_pad", spy)
    labels, centers = gk.kmeans(X, 3, offsets=off, iters=5)
    assert labels.shape == (X.shape[0],) and centers.shape == (len(sizes), 3, 4)
    assert sum(padded) <= 2 * X.numel(), f"padded {sum(padded)} elements for {X.numel()} of data"
    # the old single padded batch: 201 segments x 2000 rows
    assert len(sizes) * max(sizes) * 4 > 50 * X.numel()
    # every segment's labels are its own cluster ids and every centre a mean of its points
    o = off.tolist()
    for j in (0, 1, 200):
        lj = labels[o[j]:o[j + 1]]
        assert int(lj.max()) < 3
        for c in lj.unique().tolist():
            assert torch.allclose(centers[j, c], X[o[j]:o[j + 1]][lj == c].mean(0), atol=1e-5)
