"""class_moments / pool_moments against numpy.cov(bias=True) (eigh: tests/geomkern/test_eigh.py)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import geomkern as gk
from geomkern import ggeur
from _oracle import DEVICES, FLOATS, SIZES, TOL, assert_close_rel, entries

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


@pytest.mark.parametrize("backend", entries("class_moments"), indirect=True)
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
