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
from geomkern.backends import native
from _oracle import DEVICES, FLOATS, HALF_TOL, SIZES, TOL, assert_close_rel, entries, table

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


# ------------------------------------------------- the oracle table: every backend, one problem set
# rbf_gram (symmetric, centred, cross) on every backend that has it here, on the same rounded
# inputs, against sklearn's float64 rbf_kernel (H K H for the centred Gram). Fresh seed per case.
# "unit": N(0, 1) rows, gamma = [0.1, 3] / 2D; "scaled": 3 N(0, 1), gamma / 9 (the symmetric
# test's); "offset": N(0, 1) + 3 rows, gamma = 0.7 / D (the native test's: the kernels compute
# after a common shift, so the offset must not cost digits).
# Tolerance: TOL (1e-5 float32, 1e-10 float64) everywhere; float16 / bfloat16 (Triton only) HALF_TOL;
# the centred Gram cancels up to |K| / |HKH| digits, so the public op's (reference, native) bound is
# TOL * max(1, |K| / |HKH|), Triton's kernel keeps its plain TOL.
GRAM_SYMMETRIC = ([("unit", n, n, D) for n in SIZES for D in (1, 3, 16)]
                  + [("scaled", n, n, D) for n in SIZES for D in (1, 3, 16)]
                  + [("unit", n, n, 3 if n == 257 else 10) for n in SIZES]
                  + [("offset", n, n, D) for n, D in ((1, 1), (5, 2), (129, 3), (300, 33), (1100, 5))])
GRAM_CROSS = ([("unit", n, m, D) for n in SIZES for m in SIZES for D in (1, 3, 16)]
              + [("unit", n, m, D) for n, m, D in ((1, 1, 1), (7, 33, 3), (33, 7, 17), (257, 5, 40))]
              + [("offset", n, m, D) for n, m, D in ((1, 1, 1), (5, 3, 2), (129, 1025, 3), (300, 7, 33),
                                                     (1100, 1031, 5))])
GRAM_ROWS = ([pytest.param("symmetric", *r, id="sym-%s-n%d-m%d-D%d" % r) for r in dict.fromkeys(GRAM_SYMMETRIC)]
             + [pytest.param("centred", *r, id="centred-%s-n%d-m%d-D%d" % r)
                for r in dict.fromkeys(GRAM_SYMMETRIC)]
             + [pytest.param("cross", *r, id="cross-%s-n%d-m%d-D%d" % r) for r in dict.fromkeys(GRAM_CROSS)])
ALL_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


def _gram_inputs(data, n, m, D, seed):
    """(X, Y, gamma) in float64: the rows every backend gets (rounded to its dtype)."""
    gen = torch.Generator().manual_seed(seed)
    scale, shift = {"unit": (1.0, 0.0), "scaled": (3.0, 0.0), "offset": (1.0, 3.0)}[data]
    X = torch.randn(n, D, generator=gen, dtype=torch.float64) * scale + shift
    Y = torch.randn(m, D, generator=gen, dtype=torch.float64) * scale + shift
    g = 0.7 / D if data == "offset" else _gamma(D, gen) / (9.0 if data == "scaled" else 1.0)
    return X, Y, g


def _triton_gram(device, X, Y, g, center):
    """Triton's rbf_gram with every buffer its launcher allocates poisoned (NaN); picklable, so
    it runs in the interpreter worker for CPU tensors."""
    from geomkern.backends.triton import _common
    from geomkern.backends.triton import rbf as trbf

    orig = _common.empty
    _common.empty = lambda shape, dtype, dev: orig(shape, dtype, dev).fill_(float("nan"))
    try:
        out = trbf.rbf_gram(X.to(device), None if Y is None else Y.to(device), g, center, "ieee")
        return out.cpu()
    finally:
        _common.empty = orig


def _gram_runs(dtype, kind, data, n, m, D, entry):
    """The cases of the table that run: half inputs only through Triton's kernel (the public op's:
    test_rbf_gram_half_inputs_return_half); in Triton's interpreter no bfloat16 (its tl.dot is
    wrong there), at most 257 rows, and over 257 x 5 entries float32 only (time). Every case runs
    on a GPU (triton-cuda)."""
    if dtype in (torch.float16, torch.bfloat16) and not entry.startswith("triton"):
        return False
    if entry == "triton-cpu":
        return dtype != torch.bfloat16 and max(n, m) <= 257 and (n * m <= 257 * 5 or dtype == torch.float32)
    return True


@pytest.mark.parametrize("dtype,kind,data,n,m,D,entry", table(
    ALL_DTYPES, (5, GRAM_ROWS), entries("rbf_gram", names=("reference", "native", "triton-cpu", "triton-cuda")),
    keep=_gram_runs))
def test_rbf_gram_matches_float64_on_every_backend(entry, kind, data, n, m, D, dtype, request, seed):
    """Shape and dtype; the symmetric Gram exactly symmetric with a unit diagonal; the centred one
    exactly symmetric from Triton's kernel, with columns summing to 0 from the public op; values
    within the bound of the oracle."""
    half = dtype in (torch.float16, torch.bfloat16)
    X, Y, g = _gram_inputs(data, n, m, D, seed)
    # the native kernel's (offset) rows keep their oracle on the unrounded float64 inputs (float32 /
    # float64, as that test ran them); elsewhere the oracle sees the rounded inputs
    exact = data == "offset" and dtype in FLOATS
    X64 = X if exact else X.to(dtype).double()
    Y64 = None if kind != "cross" else Y if exact else Y.to(dtype).double()
    X, Y = X.to(dtype), (Y.to(dtype) if kind == "cross" else None)
    center = kind == "centred"
    if entry.startswith("triton"):
        K = request.getfixturevalue("triton_run")(_triton_gram, "cuda" if entry == "triton-cuda" else "cpu",
                                                  X, Y, g, center)
    else:
        with gk.set_backend(entry):
            K = gk.rbf_gram(X, Y, gamma=g, center=center)
    where = f"{entry} seed={seed} {kind} {data} n={n} m={m} D={D} {dtype}"
    Kx = rbf_kernel(X64.numpy(), None if Y64 is None else Y64.numpy(), gamma=g)
    assert K.shape == Kx.shape and K.dtype == dtype, where
    tol = HALF_TOL[dtype] if half else TOL[dtype]
    if kind == "cross":
        assert_close_rel(K, Kx, tol, where)
        return
    if kind == "symmetric" or entry.startswith("triton"):  # the public op's H K H: symmetric to rounding
        assert torch.equal(K, K.T), f"{where}: the symmetric Gram is not exactly symmetric"
    if kind == "symmetric":
        assert torch.equal(K.diagonal(), torch.ones(n, dtype=dtype)), f"{where}: diagonal is not exactly 1"
        assert_close_rel(K, Kx, tol, where)
        return
    H = np.eye(n) - np.full((n, n), 1.0 / n)
    ref = H @ Kx @ H
    if n == 1:  # the centred 1x1 Gram is exactly 0
        assert float(K.abs().max()) <= tol, where
    elif entry.startswith("triton"):
        assert_close_rel(K, ref, tol, where)
    else:
        assert_close_rel(K, ref, tol * max(1.0, np.linalg.norm(Kx) / np.linalg.norm(ref)), where)
    if not entry.startswith("triton"):
        assert_close_rel(K.sum(0), np.zeros(n), tol * np.linalg.norm(Kx), f"{where}: column sums")


# rbf_matmul (K(X, Y) @ V) on every backend that has it here, the same way. "positive": V >= 0, so
# K @ V is free of cancellation and the norm-wise TOL is the op's accuracy (rows: every size pair
# of SIZES, D in {1, 3, 16}, p in {1, 5}; and the native kernel's tiles of 128 rows and 1,024
# columns around every edge, Y shifted by 0.5, gamma = 0.7 / D). "signed": V ~ N(0, 1) mixes
# signs, so every entry is bounded by TOL * (K(X, Y) @ |V|) instead (the Triton tests' rows:
# D = 200 > 128 streams X in chunks).
MATMUL_ROWS = ([("positive", n, m, D, p) for n in SIZES for m in SIZES for D in (1, 3, 16) for p in (1, 5)]
               + [("positive-shifted", n, m, D, p) for n, m, D, p in
                  ((1, 1, 1, 1), (129, 7, 3, 5), (127, 1025, 17, 1), (257, 1031, 5, 2), (300, 64, 33, 5))]
               + [("signed", n, m, D, p) for n, m, p, D in
                  ((1, 1, 1, 1), (7, 33, 3, 5), (33, 7, 17, 200), (257, 40, 2, 9))])


def _triton_matmul(device, X, Y, V, g):
    """Triton's rbf_matmul with its launcher's buffers poisoned (NaN); picklable (interpreter worker)."""
    from geomkern.backends.triton import _common
    from geomkern.backends.triton import rbf as trbf

    orig = _common.empty
    _common.empty = lambda shape, dtype, dev: orig(shape, dtype, dev).fill_(float("nan"))
    try:
        return trbf.rbf_matmul(X.to(device), Y.to(device), V.to(device), g, "ieee").cpu()
    finally:
        _common.empty = orig


def _matmul_runs(dtype, data, n, m, D, p, entry):
    """Triton's interpreter takes at most 257 x 257 entries in float32 and 257 x 40 in float64
    (time); every case runs on a GPU (triton-cuda)."""
    return entry != "triton-cpu" or n * m <= (257 * 257 if dtype == torch.float32 else 257 * 40)


@pytest.mark.parametrize("dtype,data,n,m,D,p,entry", table(
    FLOATS, (5, [pytest.param(*r, id="%s-n%d-m%d-D%d-p%d" % r) for r in MATMUL_ROWS]),
    entries("rbf_matmul", names=("reference", "native", "native-direct", "triton-cpu", "triton-cuda")),
    keep=_matmul_runs))
def test_rbf_matmul_matches_float64_on_every_backend(entry, data, n, m, D, p, dtype, request, seed):
    gen = torch.Generator().manual_seed(seed)
    X = torch.randn(n, D, generator=gen, dtype=torch.float64)
    Y = torch.randn(m, D, generator=gen, dtype=torch.float64) + (0.5 if data == "positive-shifted" else 0.0)
    V = (torch.randn if data == "signed" else torch.rand)(m, p, generator=gen, dtype=torch.float64)
    g = 0.7 / D if data == "positive-shifted" else _gamma(D, gen)
    # the native kernel's rows keep their oracle on the unrounded float64 inputs (stricter in float32)
    X64, Y64 = (X, Y) if data == "positive-shifted" else (X.to(dtype).double(), Y.to(dtype).double())
    X, Y, V = X.to(dtype), Y.to(dtype), V.to(dtype)
    if entry.startswith("triton"):
        out = request.getfixturevalue("triton_run")(_triton_matmul, "cuda" if entry == "triton-cuda" else "cpu",
                                                    X, Y, V, g)
    elif entry == "native-direct":
        out = native._C.rbf_matmul(X, Y, V, g)
    else:
        with gk.set_backend(entry):
            out = gk.rbf_matmul(X, Y, V, gamma=g)
    where = f"{entry} seed={seed} {data} n={n} m={m} D={D} p={p} {dtype}"
    assert out.shape == (n, p) and out.dtype == dtype, where
    K = rbf_kernel(X64.numpy(), Y64.numpy(), gamma=g)
    if data != "signed":
        assert_close_rel(out, K @ _np(V), TOL[dtype], where)
        return
    err = np.abs(_np(out) - K @ _np(V))
    scale = np.maximum(K @ np.abs(_np(V)), 1e-300)
    assert (err <= TOL[dtype] * scale).all(), f"{where}: off by {float((err / scale).max()):.3e} of K |V|"


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
