"""class_moments / pool_moments against numpy.cov(bias=True); eigh against scipy.linalg.eigh."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import geomkern as gk
from geomkern import ggeur
from conftest import DEVICES, FLOATS, SIZES, TOL, assert_close_rel, backends_for, match_signs

seeds = st.integers(0, 2 ** 32 - 1)


def _np(t):
    return t.detach().cpu().double().numpy()


def _class_data(N, D, C, gen, dtype, n_empty):
    """N labelled points; the last ``n_empty`` classes get no sample. Class c is centred at a
    random point with its own anisotropic spread (so the covariances differ)."""
    live = C - n_empty
    y = torch.randint(0, live, (N,), generator=gen)
    centres = 3.0 * torch.randn(C, D, generator=gen, dtype=torch.float64)
    spread = 0.2 + torch.rand(C, D, generator=gen, dtype=torch.float64)
    X = centres[y] + torch.randn(N, D, generator=gen, dtype=torch.float64) * spread[y]
    return X.to(dtype), y


def _np_moments(X64, y, C):
    D = X64.shape[1]
    counts = np.array([(y == c).sum() for c in range(C)])
    means, covs = np.zeros((C, D)), np.zeros((C, D, D))
    for c in range(C):
        if counts[c]:
            Xc = X64[y == c]
            means[c] = Xc.mean(0)
            covs[c] = np.cov(Xc.T, bias=True).reshape(D, D)
    return counts, means, covs


@pytest.mark.parametrize("backend", backends_for("class_moments"), indirect=True)
@settings(max_examples=20)
@given(N=st.sampled_from(SIZES), D=st.sampled_from((1, 7, 33)), C=st.integers(1, 9),
       n_empty=st.integers(0, 2), dtype=st.sampled_from(FLOATS), seed=seeds)
def test_class_moments_match_numpy_cov(N, D, C, n_empty, dtype, seed, backend):
    n_empty = min(n_empty, C - 1)
    gen = torch.Generator().manual_seed(seed)
    X, y = _class_data(N, D, C, gen, dtype, n_empty)
    counts, means, covs = gk.class_moments(X, y, C)
    assert counts.dtype == torch.int64 and counts.shape == (C,)
    assert means.dtype == dtype and means.shape == (C, D) and covs.shape == (C, D, D)
    rc, rm, rS = _np_moments(_np(X), y.numpy(), C)
    assert counts.tolist() == rc.tolist()
    for c in range(C):
        if rc[c] == 0:  # an empty class: count 0, zero mean and covariance
            assert torch.equal(means[c], torch.zeros(D, dtype=dtype))
            assert torch.equal(covs[c], torch.zeros(D, D, dtype=dtype))
            continue
        assert_close_rel(means[c], rm[c], TOL[dtype], f"class {c} mean")
        if rc[c] == 1:  # one sample: its biased covariance is exactly zero
            assert float(covs[c].abs().max()) == 0.0
        else:
            assert_close_rel(covs[c], rS[c], TOL[dtype], f"class {c} covariance")
        assert_close_rel(covs[c], covs[c].T, TOL[dtype], f"class {c} covariance symmetry")


@pytest.mark.parametrize("dtype", FLOATS)
def test_class_moments_single_sample_and_empty_class(dtype, gen):
    X = (5.0 + torch.randn(9, 4, generator=gen, dtype=torch.float64)).to(dtype)
    y = torch.tensor([0, 0, 0, 0, 0, 0, 0, 0, 2])  # class 1 empty, class 2 one sample
    counts, means, covs = gk.class_moments(X, y, 3)
    assert counts.tolist() == [8, 0, 1]
    assert bool(torch.isfinite(means).all()) and bool(torch.isfinite(covs).all())
    assert torch.equal(means[1], torch.zeros(4, dtype=dtype))
    assert torch.equal(covs[1], torch.zeros(4, 4, dtype=dtype))
    assert torch.equal(means[2], X[8])
    assert torch.equal(covs[2], torch.zeros(4, 4, dtype=dtype))
    assert_close_rel(covs[0], np.cov(_np(X[:8]).T, bias=True), TOL[dtype])


def test_class_moments_int32_labels_and_no_samples(gen):
    X, y = _class_data(40, 3, 4, gen, torch.float64, 1)
    a = gk.class_moments(X, y.to(torch.int32), 4)
    b = gk.class_moments(X, y, 4)
    for u, v in zip(a, b):
        assert torch.equal(u, v)
    counts, means, covs = gk.class_moments(X[:0], y[:0], 3)
    assert counts.tolist() == [0, 0, 0]
    assert torch.equal(means, torch.zeros(3, 3, dtype=torch.float64))
    assert torch.equal(covs, torch.zeros(3, 3, 3, dtype=torch.float64))


@pytest.mark.parametrize("device", DEVICES)
def test_class_moments_on_device(device, gen):
    X, y = _class_data(57, 5, 4, gen, torch.float64, 1)
    out = gk.class_moments(X.to(device), y.to(device), 4)
    assert all(t.device.type == device for t in out)
    ref = gk.class_moments(X, y, 4)
    for u, v in zip(out, ref):
        assert_close_rel(u, v, TOL[torch.float64])


@settings(max_examples=20)
@given(K=st.integers(1, 5), D=st.sampled_from((1, 7, 33)), C=st.integers(1, 6),
       dtype=st.sampled_from(FLOATS), seed=seeds)
def test_pool_moments_equal_moments_of_concatenated_data(K, D, C, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    centres = 3.0 * torch.randn(C, D, generator=gen, dtype=torch.float64)
    Xs, ys, stats = [], [], []
    for k in range(K):
        n = int(torch.randint(0, 60, (), generator=gen))  # a client may hold no data at all
        # each client holds a random subset of the classes (so some (client, class) are empty);
        # the last class is held by nobody when C > 1
        held = torch.nonzero(torch.rand(C, generator=gen) < 0.6).squeeze(1)
        held = held[held < max(C - 1, 1)]
        if held.numel() == 0 or n == 0:
            X, y = torch.zeros(0, D, dtype=torch.float64), torch.zeros(0, dtype=torch.int64)
        else:
            y = held[torch.randint(0, held.numel(), (n,), generator=gen)]
            shift = torch.randn(C, D, generator=gen, dtype=torch.float64)  # client-specific
            X = centres[y] + shift[y] + torch.randn(n, D, generator=gen, dtype=torch.float64)
        X = X.to(dtype)
        Xs.append(X)
        ys.append(y)
        stats.append(_np_moments(_np(X), y.numpy(), C))
    counts = torch.tensor(np.stack([s[0] for s in stats]), dtype=torch.int64)
    means = torch.tensor(np.stack([s[1] for s in stats])).to(dtype)
    covs = torch.tensor(np.stack([s[2] for s in stats])).to(dtype)
    pc, pm, pS = gk.pool_moments(counts, means, covs)
    assert pc.shape == (C,) and pm.shape == (C, D) and pS.shape == (C, D, D) and pm.dtype == dtype
    # the oracle: moments of all clients' data put together
    rc, rm, rS = _np_moments(np.concatenate([_np(X) for X in Xs]), torch.cat(ys).numpy(), C)
    assert pc.tolist() == rc.tolist()
    for c in range(C):
        if rc[c] == 0:
            assert torch.equal(pm[c], torch.zeros(D, dtype=dtype))
            assert torch.equal(pS[c], torch.zeros(D, D, dtype=dtype))
            continue
        assert_close_rel(pm[c], rm[c], TOL[dtype], f"pooled mean {c}")
        if rc[c] > 1:
            assert_close_rel(pS[c], rS[c], TOL[dtype], f"pooled covariance {c}")
        else:
            assert float(pS[c].abs().max()) <= TOL[dtype] * float(rm[c].__abs__().max())


def test_pool_moments_of_gk_class_moments(gen):
    """End to end: per-client gk.class_moments pooled == gk.class_moments of the union."""
    Xs, ys = zip(*[_class_data(n, 4, 5, gen, torch.float64, e)
                   for n, e in ((30, 1), (1, 0), (80, 2))])
    stats = [gk.class_moments(X, y, 5) for X, y in zip(Xs, ys)]
    pooled = gk.pool_moments(*(torch.stack(t) for t in zip(*stats)))
    union = gk.class_moments(torch.cat(Xs), torch.cat(ys), 5)
    assert torch.equal(pooled[0], union[0])
    assert_close_rel(pooled[1], union[1], TOL[torch.float64])
    assert_close_rel(pooled[2], union[2], TOL[torch.float64])


# ----- eigh ------------------------------------------------------------------------------------

def _sym_with_spectrum(batch, n, gen, dtype):
    """Random symmetric matrices Q diag(w) Q^T with eigenvalues spaced >= 1/(2n) of the range."""
    Q = torch.linalg.qr(torch.randn(*batch, n, n, generator=gen, dtype=torch.float64)).Q
    base = torch.linspace(-1.0, 2.0, n, dtype=torch.float64)
    w = base + (1.0 / (4 * max(n, 2))) * torch.rand(*batch, n, generator=gen, dtype=torch.float64)
    A = (Q * w.unsqueeze(-2)) @ Q.transpose(-1, -2)
    A = 0.5 * (A + A.transpose(-1, -2))
    return A.to(dtype)


@pytest.mark.parametrize("backend", backends_for("eigh"), indirect=True)
@settings(max_examples=20)
@given(n=st.sampled_from(SIZES), batch=st.sampled_from(((), (3,), (2, 2))),
       k=st.sampled_from((None, 1, 3)), dtype=st.sampled_from(FLOATS), seed=seeds)
def test_eigh_matches_scipy(n, batch, k, dtype, seed, backend):
    gen = torch.Generator().manual_seed(seed)
    k = None if k is None else min(k, n)
    A = _sym_with_spectrum(batch, n, gen, dtype)
    w, V = gk.eigh(A, k=k)
    kk = n if k is None else k
    assert w.shape == (*batch, kk) and V.shape == (*batch, n, kk) and w.dtype == dtype
    assert bool((w[..., :-1] >= w[..., 1:]).all()), "eigenvalues not descending"
    A64 = _np(A).reshape(-1, n, n)
    W, VV = _np(w).reshape(-1, kk), _np(V).reshape(-1, n, kk)
    for b in range(A64.shape[0]):
        rw, rV = scipy.linalg.eigh(A64[b], subset_by_index=[n - kk, n - 1])
        rw, rV = rw[::-1], rV[:, ::-1]
        assert_close_rel(W[b], rw, TOL[dtype], f"eigenvalues[{b}]")
        # A V = V diag(w) and V^T V = I (backward-stable quantities: no eigengap needed)
        scale = 2.25  # |A|_2 = max |w| <= 2 + 1/(4n) by construction
        resid = A64[b] @ VV[b] - VV[b] * W[b]
        assert np.linalg.norm(resid) <= TOL[dtype] * scale * np.sqrt(kk), "A V != V diag(w)"
        assert_close_rel(VV[b].T @ VV[b], np.eye(kk), TOL[dtype], "V^T V")
        # eigenvectors up to sign (the spectrum is spaced; float32 vectors are only as accurate as
        # eps / relative gap, so they are compared in float64 only)
        if dtype == torch.float64:
            s = match_signs(VV[b], rV)
            assert_close_rel(VV[b] * s, rV, TOL[dtype], f"eigenvectors[{b}]")
        # sign convention: each column's largest-|.| entry is positive
        cols = np.arange(kk)
        assert (VV[b][np.abs(VV[b]).argmax(0), cols] > 0).all()


@pytest.mark.parametrize("dtype", FLOATS)
def test_eigh_rank_one(dtype, gen):
    v = torch.randn(9, generator=gen, dtype=torch.float64)
    A = torch.outer(v, v).to(dtype)
    w, V = gk.eigh(A)
    assert bool(torch.isfinite(w).all()) and bool(torch.isfinite(V).all())
    assert_close_rel(w[0], float(v @ v), TOL[dtype])
    assert float(w[1:].abs().max()) <= TOL[dtype] * float(v @ v)
    u = _np(v) / np.linalg.norm(_np(v))
    assert_close_rel(_np(V[:, 0]) * np.sign(_np(V[:, 0]) @ u), u, TOL[dtype])
    assert_close_rel(_np(V).T @ _np(V), np.eye(9), TOL[dtype])
    w2, V2 = gk.eigh(A, k=2)
    assert_close_rel(w2, w[:2], TOL[dtype])


@pytest.mark.parametrize("device", DEVICES)
def test_eigh_on_device(device, gen):
    A = _sym_with_spectrum((2,), 7, gen, torch.float64)
    w, V = gk.eigh(A.to(device), k=3)
    assert w.device.type == device and V.device.type == device
    rw, rV = gk.eigh(A, k=3)
    assert_close_rel(w, rw, TOL[torch.float64])
    assert_close_rel(V, rV, TOL[torch.float64])


def test_cupy_eigh_glue_with_a_numpy_stand_in(monkeypatch, gen):
    """The CuPy path's DLPack round trip, ordering, truncation and sign convention, run on CPU
    with NumPy standing in for CuPy (same from_dlpack / linalg.eigh API). The real CuPy run is
    the GPU-marked test below."""
    import contextlib
    import types

    import geomkern.backends.cupy as cupy_backend

    fake = types.SimpleNamespace(from_dlpack=np.from_dlpack, linalg=types.SimpleNamespace(eigh=np.linalg.eigh),
                                 cuda=types.SimpleNamespace(Device=lambda i: contextlib.nullcontext()))
    monkeypatch.setattr(cupy_backend, "cupy", fake)
    A = _sym_with_spectrum((3,), 11, gen, torch.float64)
    w, V = cupy_backend.eigh(A, 4)
    rw, rV = gk.eigh(A, k=4)
    assert w.shape == (3, 4) and V.shape == (3, 11, 4)
    assert_close_rel(w, rw, TOL[torch.float64])
    assert_close_rel(V, rV, TOL[torch.float64])  # same sign convention, so no sign matching


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", FLOATS)
def test_cupy_eigh_on_cuda_matches_reference(dtype, gen):
    if "cupy" not in gk.available_backends():
        pytest.skip("cupy is not importable here: pip install cupy-cuda12x")
    A = _sym_with_spectrum((5,), 40, gen, dtype)
    with gk.set_backend("cupy"):
        assert gk._dispatch.resolve("eigh", "cuda") == "cupy"
        w, V = gk.eigh(A.cuda(), k=6)
    rw, rV = gk.eigh(A.double(), k=6)
    assert_close_rel(w.cpu().double(), rw, TOL[dtype])
    if dtype == torch.float64:
        assert_close_rel(V.cpu(), rV, TOL[dtype])


def test_pool_moments_refuses_what_class_statistics_refuse():
    """Issue 30: pool_moments took covariances that ClassStatistics refuses (not positive
    semi-definite) and a count of 1e18, with which one client outweighed every other."""
    g = torch.Generator().manual_seed(0)
    means = torch.randn(2, 1, 3, generator=g, dtype=torch.float64)
    covs = torch.eye(3, dtype=torch.float64).expand(2, 1, 3, 3).clone()
    counts = torch.tensor([[3], [5]])
    assert torch.equal(gk.pool_moments(counts, means, covs)[0], torch.tensor([8]))
    with pytest.raises(ValueError, match=r"covs\[1\]\[0\] is not positive semi-definite: it has the eigenvalue -1"):
        gk.pool_moments(counts, means, torch.stack([covs[0], -covs[1]]))
    for big in (torch.tensor([[10 ** 18], [5]]), torch.tensor([[1e18], [5.0]], dtype=torch.float64)):
        with pytest.raises(ValueError, match=r"counts must be <= 2147483647 \(2\^31 - 1"):
            gk.pool_moments(big, means, covs)
    with pytest.raises(ValueError, match="must be <= 2147483647"):
        ggeur.ClassStatistics(torch.tensor([2 ** 31]), means[0], covs[0])
