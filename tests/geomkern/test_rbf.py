"""rbf_gram, rbf_matmul, median_gamma against sklearn / scipy / numpy oracles."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.spatial.distance import pdist
from sklearn.metrics.pairwise import rbf_kernel

import geomkern as gk
import geomkern.ops.rbf as rbf_mod
from conftest import DEVICES, FLOATS, HALF_TOL, SIZES, TOL, assert_close_rel, backends_for

sizes = st.sampled_from(SIZES)
dims = st.sampled_from((1, 3, 16))
seeds = st.integers(0, 2 ** 32 - 1)


def _points(n, D, gen, dtype=torch.float64, scale=1.0):
    return (torch.randn(n, D, generator=gen, dtype=torch.float64) * scale).to(dtype)


def _gamma(D, gen):
    # gamma * |x - y|^2 ~ O(1) for unit-variance data, times a random factor in [0.1, 3]
    return float(0.1 + 2.9 * torch.rand((), generator=gen, dtype=torch.float64)) / (2.0 * D)


def _np(t):
    return t.detach().cpu().double().numpy()


@pytest.mark.parametrize("backend", backends_for("rbf_gram"), indirect=True)
@settings(max_examples=20)
@given(n=sizes, m=sizes, D=dims, dtype=st.sampled_from(FLOATS), seed=seeds)
def test_rbf_gram_cross_matches_sklearn(n, m, D, dtype, seed, backend):
    gen = torch.Generator().manual_seed(seed)
    X, Y, g = _points(n, D, gen, dtype), _points(m, D, gen, dtype), _gamma(D, gen)
    K = gk.rbf_gram(X, Y, gamma=g)
    assert K.shape == (n, m) and K.dtype == dtype
    assert_close_rel(K, rbf_kernel(_np(X), _np(Y), gamma=g), TOL[dtype], "rbf_gram(X, Y)")


@pytest.mark.parametrize("backend", backends_for("rbf_gram"), indirect=True)
@settings(max_examples=20)
@given(n=sizes, D=dims, dtype=st.sampled_from(FLOATS), seed=seeds)
def test_rbf_gram_symmetric_unit_diag_matches_sklearn(n, D, dtype, seed, backend):
    gen = torch.Generator().manual_seed(seed)
    X, g = _points(n, D, gen, dtype, scale=3.0), _gamma(D, gen) / 9.0
    K = gk.rbf_gram(X, gamma=g)
    assert K.dtype == dtype
    assert torch.equal(K.diagonal(), torch.ones(n, dtype=dtype)), "diagonal is not exactly 1"
    assert torch.equal(K, K.T), "symmetric Gram is not exactly symmetric"
    assert_close_rel(K, rbf_kernel(_np(X), gamma=g), TOL[dtype], "rbf_gram(X)")


@pytest.mark.parametrize("backend", backends_for("rbf_gram"), indirect=True)
@settings(max_examples=20)
@given(n=sizes, D=dims, dtype=st.sampled_from(FLOATS), seed=seeds)
def test_rbf_gram_center_is_HKH(n, D, dtype, seed, backend):
    gen = torch.Generator().manual_seed(seed)
    X, g = _points(n, D, gen, dtype), _gamma(D, gen)
    Kc = gk.rbf_gram(X, gamma=g, center=True)
    K = rbf_kernel(_np(X), gamma=g)
    H = np.eye(n) - np.full((n, n), 1.0 / n)
    ref = H @ K @ H
    if n == 1:  # the centred 1x1 Gram is exactly 0
        assert float(Kc.abs().max()) <= TOL[dtype]
    else:
        # The centring cancels up to |K| / |HKH| digits; the oracle's own scale is the bound's.
        assert_close_rel(Kc, ref, TOL[dtype] * max(1.0, np.linalg.norm(K) / np.linalg.norm(ref)),
                         "rbf_gram(X, center=True)")
    assert_close_rel(Kc.sum(0), np.zeros(n), TOL[dtype] * np.linalg.norm(K), "column sums of HKH")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("symmetric", [True, False])
def test_rbf_gram_half_inputs_return_half(dtype, symmetric, gen):
    X = _points(33, 8, gen, dtype)
    Y = None if symmetric else _points(20, 8, gen, dtype)
    g = 1.0 / 16
    K = gk.rbf_gram(X, Y, gamma=g)
    assert K.dtype == dtype
    assert bool(torch.isfinite(K).all())
    ref = rbf_kernel(_np(X), None if Y is None else _np(Y), gamma=g)
    assert_close_rel(K, ref, HALF_TOL[dtype], f"rbf_gram {dtype}")
    if symmetric:
        assert torch.equal(K.diagonal(), torch.ones(33, dtype=dtype))
        assert torch.equal(K, K.T)
        Kc = gk.rbf_gram(X, gamma=g, center=True)
        assert Kc.dtype == dtype
        H = np.eye(33) - 1.0 / 33
        # centring cancels: bound relative to the uncentred Gram's norm
        assert np.linalg.norm(_np(Kc) - H @ ref @ H) <= HALF_TOL[dtype] * np.linalg.norm(ref)


@pytest.mark.parametrize("device", DEVICES)
def test_rbf_gram_on_device(device, gen):
    X, Y = _points(57, 5, gen), _points(31, 5, gen)
    K = gk.rbf_gram(X.to(device), Y.to(device), gamma=0.2)
    assert K.device.type == device
    assert_close_rel(K, rbf_kernel(_np(X), _np(Y), gamma=0.2), TOL[torch.float64])


@pytest.mark.parametrize("backend", backends_for("rbf_matmul"), indirect=True)
@settings(max_examples=20)
@given(n=sizes, m=sizes, D=dims, p=st.sampled_from((1, 5)), dtype=st.sampled_from(FLOATS),
       seed=seeds)
def test_rbf_matmul_matches_sklearn(n, m, D, p, dtype, seed, backend):
    gen = torch.Generator().manual_seed(seed)
    X, Y, g = _points(n, D, gen, dtype), _points(m, D, gen, dtype), _gamma(D, gen)
    # V >= 0 keeps K @ V free of cancellation, so the norm-wise bound is the op's accuracy.
    V = torch.rand(m, p, generator=gen, dtype=torch.float64).to(dtype)
    out = gk.rbf_matmul(X, Y, V, gamma=g)
    assert out.shape == (n, p) and out.dtype == dtype
    assert_close_rel(out, rbf_kernel(_np(X), _np(Y), gamma=g) @ _np(V), TOL[dtype], "rbf_matmul")


@pytest.mark.parametrize("dtype", FLOATS)
def test_rbf_matmul_signed_V_and_chunk_boundaries(dtype, gen, monkeypatch):
    # A tiny chunk forces the row-chunk loop through many odd-sized pieces (last one partial).
    monkeypatch.setattr(rbf_mod, "_CHUNK_ELEMS", 7 * 33)
    X, Y = _points(257, 4, gen, dtype), _points(33, 4, gen, dtype)
    V = _points(33, 3, gen, dtype)
    out = gk.rbf_matmul(X, Y, V, gamma=0.15)
    K = rbf_kernel(_np(X), _np(Y), gamma=0.15)
    ref = K @ _np(V)
    # signed V: error bound relative to |K| |V| (what roundoff scales with), not |K V|
    bound = TOL[dtype] * np.linalg.norm(K) * np.linalg.norm(_np(V))
    err = np.linalg.norm(_np(out) - ref)
    assert err <= bound, f"|out - K V| = {err:.3e} > {bound:.3e}"


@settings(max_examples=20)
@given(n=st.sampled_from((2, 3, 7, 33, 257)), D=dims, dtype=st.sampled_from(FLOATS), seed=seeds)
def test_median_gamma_matches_numpy_median(n, D, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    X = _points(n, D, gen, dtype)
    d2 = pdist(_np(X), "sqeuclidean")
    ref = 1.0 / np.median(d2)  # numpy interpolates the two middle values for an even count
    # computed in float64 whatever the input dtype, so the float64 bound applies
    assert abs(gk.median_gamma(X) - ref) <= TOL[torch.float64] * ref


def test_median_gamma_even_pair_count_interpolates(gen):
    # n = 4 gives 6 pairs: the median is the mean of the 3rd and 4th smallest distances.
    X = _points(4, 3, gen)
    d2 = np.sort(pdist(_np(X), "sqeuclidean"))
    assert len(d2) % 2 == 0
    assert gk.median_gamma(X) == pytest.approx(2.0 / (d2[2] + d2[3]), rel=1e-12)


def test_median_gamma_subsample_is_seeded_and_plausible(gen):
    X = _points(300, 4, gen)
    a = gk.median_gamma(X, max_points=50, seed=3)
    assert a == gk.median_gamma(X, max_points=50, seed=3)
    d2 = pdist(_np(X), "sqeuclidean")
    # a subset's median pairwise distance lies well inside the full distribution
    assert 1.0 / np.quantile(d2, 0.9) < a < 1.0 / np.quantile(d2, 0.1)
    # the same seeded subset: exact scaling (gamma ~ 1/length^2) and translation invariance
    assert gk.median_gamma(4.0 * X, max_points=50, seed=3) == pytest.approx(a / 16.0, rel=1e-12)
    assert gk.median_gamma(X + 3.0, max_points=50, seed=3) == pytest.approx(a, rel=1e-10)
    # no subsampling at or below max_points
    ref = 1.0 / np.median(d2)
    assert abs(gk.median_gamma(X, max_points=300) - ref) <= TOL[torch.float64] * ref


@pytest.mark.parametrize("n_same", [7, 9])
def test_median_gamma_coincident_points_raise(n_same, gen):
    # 7 coincident of 9 points: 21 of 36 pairs are exactly 0, so the median is 0 (numpy: 1/0).
    x = _points(1, 10, gen, scale=3.0)
    X = torch.cat([x.repeat(n_same, 1), _points(9 - n_same, 10, gen)])
    assert np.median(pdist(_np(X), "sqeuclidean")) == 0.0
    with pytest.raises(ValueError, match="median"):
        gk.median_gamma(X)


def test_median_gamma_far_from_origin(gen):
    # Translation invariance: data centred at 1e4 has the same bandwidth as the same data at 0.
    X = _points(33, 4, gen)
    shift = torch.full((1, 4), 1e4, dtype=torch.float64)
    ref = 1.0 / np.median(pdist(_np(X + shift), "sqeuclidean"))
    assert abs(gk.median_gamma(X + shift) - ref) <= TOL[torch.float64] * ref


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_median_gamma_half_input(dtype, gen):
    X = _points(33, 5, gen, dtype)
    ref = 1.0 / np.median(pdist(_np(X), "sqeuclidean"))
    assert abs(gk.median_gamma(X) - ref) <= 1e-10 * ref


@pytest.mark.slow
def test_rbf_matmul_default_chunking_large(gen):
    """n * m above the reference's 2^24-element chunk: several real chunks."""
    X, Y = _points(4500, 8, gen), _points(4200, 8, gen)
    V = torch.rand(4200, 3, generator=gen, dtype=torch.float64)
    out = gk.rbf_matmul(X, Y, V, gamma=0.05)
    ref = rbf_kernel(_np(X), _np(Y), gamma=0.05) @ _np(V)
    assert_close_rel(out, ref, TOL[torch.float64], "rbf_matmul large")


def test_small_row_gemm_is_thread_independent(gen):
    """MKL's float32 GEMM takes a thread-dependent kernel for left operands of 5-11 rows
    (rbf._MKL_ROWS); geomkern's distances and projections give the same bits at 1 and 2 threads
    for every row count, and the padded product equals the plain one to roundoff."""
    from geomkern.ops.kpca import projection_reference

    B = torch.randn(64, 160, generator=gen)
    before = torch.get_num_threads()
    try:
        for m in range(1, 14):
            X = torch.randn(m, 160, generator=gen)
            alphas = torch.randn(m, m, generator=gen)  # m components of one cluster: d rows in the projection
            offsets = torch.tensor([0, m])
            got = {}
            for t in (1, 2):
                torch.set_num_threads(t)
                got[t] = (rbf_mod._sqdist(X, B), rbf_mod.thread_independent_mm(X, B.T),
                          projection_reference(X, alphas, offsets, B, 0.01))
            for a, b in zip(got[1], got[2]):
                assert torch.equal(a, b), m
            assert_close_rel(got[1][1], X.double() @ B.T.double(), 1e-5)
    finally:
        torch.set_num_threads(before)


_PEAK_SCRIPT = r"""
import sys, torch, geomkern as gk
def hwm():  # peak resident set so far, bytes
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
n, D, p = 6000, 64, 8
g = torch.Generator().manual_seed(0)
X, Y, V = torch.randn(n, D, generator=g), torch.randn(n, D, generator=g), torch.randn(n, p, generator=g)
gk.rbf_matmul(X[:300], Y[:300], V[:300], gamma=0.1)  # libraries and thread pools up, a small call
before = hwm()
gk.rbf_matmul(X, Y, V, gamma=0.1)
print(gk.resolve("rbf_matmul", "cpu"), hwm() - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_default_rbf_matmul_never_holds_the_kernel_matrix():
    """The default CPU rbf_matmul (auto) runs in O((n + m)(D + p)) memory plus a fixed tile
    budget: at n = m = 6,000 its peak grows by well under the 137 MiB a float32 K would take
    (fresh process, peak resident set before and after the call)."""
    out = subprocess.run([sys.executable, "-c", _PEAK_SCRIPT], capture_output=True, text=True,
                         timeout=300, check=True).stdout.split()
    backend, grown = out[0], int(out[1])
    full_k = 6000 * 6000 * 4
    assert grown < full_k / 4, f"rbf_matmul ({backend}) grew the peak by {grown / 2**20:.0f} MiB"
