"""geomkern.ggeur against independent NumPy oracles and derived statistical bounds.

Fresh random inputs every run through the shared ``seed`` fixture (tests/conftest.py): it is
printed (pytest shows it for a failing test) and replayed with ``--seed=<n>``.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from _ggeur_clients import client_statistics
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from geomkern import ggeur, pool_moments
from geomkern.ggeur import ClassStatistics, GlobalGeometry
from geomkern.ops.moments import pool_moments_by_class

DTYPES = [torch.float32, torch.float64]


def _clients(rng, *, C, D, sizes, spectrum=None, offset=3.0):
    """Per-client (X, y) float64 arrays. Each client is its own domain (shifted class means), so
    the between-client term of Eq. 4 matters. ``sizes[k][c]`` = samples of class c on client k."""
    basis = np.linalg.qr(rng.standard_normal((D, D)))[0]
    spec = spectrum if spectrum is not None else 0.8 ** np.arange(D)
    class_means = offset + rng.standard_normal((C, D))
    out = []
    for row in sizes:
        shift = 0.3 * rng.standard_normal(D)
        Xs, ys = [], []
        for c, n in enumerate(row):
            Z = rng.standard_normal((n, D)) * np.sqrt(spec)
            Xs.append(class_means[c] + shift + Z @ basis.T)
            ys.append(np.full(n, c))
        out.append((np.concatenate(Xs), np.concatenate(ys).astype(np.int64)))
    return out


def _t(a, dtype):
    return torch.from_numpy(np.ascontiguousarray(a)).to(dtype)


def _stats(clients, C, dtype):
    return [ggeur.local_statistics(_t(X, dtype), torch.from_numpy(y), C) for X, y in clients]


def _oracle(clients, C, D):
    """Counts, means and biased covariances of the concatenated data of all clients (float64)."""
    X = np.concatenate([X for X, _ in clients])
    y = np.concatenate([y for _, y in clients])
    counts = np.bincount(y, minlength=C)
    means, covs = np.zeros((C, D)), np.zeros((C, D, D))
    for c in range(C):
        if counts[c]:
            means[c] = X[y == c].mean(0)
            covs[c] = np.cov(X[y == c], rowvar=False, bias=True)
    return counts, means, covs


# Independent hold pattern: class 0 on one client with one sample, class C-1 on nobody, the rest
# on a random subset of clients (every client misses some classes).
def _sizes(rng, n_clients, C):
    sizes = rng.integers(2, 40, size=(n_clients, C)) * (rng.random((n_clients, C)) < 0.6)
    sizes[:, 0] = 0
    sizes[rng.integers(n_clients), 0] = 1
    sizes[:, C - 1] = 0
    return sizes


# float64: pooling + eigh round-off is ~1e-15 relative; the 1e-10 bound leaves 1e5 of margin.
# float32: moments accumulate <= ~40 terms per client (unit round-off 6e-8, data offset 3 vs
# spread 1) and eigh adds ~D * eps: ~1e-5; 5e-5 leaves margin yet fails for any formula error.
TOL = {torch.float64: 1e-10, torch.float32: 5e-5}


@pytest.mark.parametrize("dtype", DTYPES)
def test_aggregate_equals_pooled_numpy_covariance(seed, dtype):
    rng = np.random.default_rng(seed)
    C, D, K = 9, 33, 5
    clients = _clients(rng, C=C, D=D, sizes=_sizes(rng, K, C))
    counts, means, covs = _oracle(clients, C, D)
    geo = ggeur.aggregate(_stats(clients, C, dtype))

    assert geo.counts.dtype == torch.int64 and geo.counts.tolist() == counts.tolist()
    assert geo.eigenvalues.dtype == dtype and geo.eigenvectors.shape == (C, D, D)
    for name in ("means", "eigenvalues", "eigenvectors"):
        assert bool(torch.isfinite(getattr(geo, name)).all()), name
    pooled = geo.covariances().double().numpy()
    gm = geo.means.double().numpy()
    for c in range(C):
        if counts[c] >= 2:
            err = np.linalg.norm(pooled[c] - covs[c]) / np.linalg.norm(covs[c])
            assert err <= TOL[dtype], (c, err, seed)
            assert np.linalg.norm(gm[c] - means[c]) / np.linalg.norm(means[c]) <= TOL[dtype], (c, seed)
        else:  # one sample: zero covariance; nobody: zero everything, no NaN
            assert np.abs(pooled[c]).max() == 0.0 and float(geo.eigenvalues[c].abs().max()) == 0.0
            assert np.allclose(gm[c], means[c], rtol=TOL[dtype], atol=0), (c, seed)


@pytest.mark.parametrize("dtype", DTYPES)
def test_eigendecomposition_of_pooled_covariance(seed, dtype):
    """Eigenpairs against the NumPy pooled covariance: A V = V diag(lambda), V^T V = I,
    eigenvalues equal numpy's eigvalsh, descending, >= 0."""
    rng = np.random.default_rng(seed)
    C, D = 6, 20
    clients = _clients(rng, C=C, D=D, sizes=rng.integers(15, 60, size=(3, C)))
    _, _, covs = _oracle(clients, C, D)
    geo = ggeur.aggregate(_stats(clients, C, dtype))
    ev, V = geo.eigenvalues.double().numpy(), geo.eigenvectors.double().numpy()
    tol = TOL[dtype]
    for c in range(C):
        A = covs[c]
        scale = np.linalg.norm(A, 2)
        assert np.all(np.diff(ev[c]) <= 0) and np.all(ev[c] >= 0)
        ref = np.clip(np.linalg.eigvalsh(A)[::-1], 0, None)
        assert np.abs(ev[c] - ref).max() <= tol * scale, (c, seed)
        assert np.abs(V[c].T @ V[c] - np.eye(D)).max() <= 10 * tol, (c, seed)
        resid = np.linalg.norm(A @ V[c] - V[c] * ev[c]) / np.linalg.norm(A)
        assert resid <= tol, (c, resid, seed)


def test_aggregate_single_client_is_its_own_statistics(seed):
    rng = np.random.default_rng(seed)
    clients = _clients(rng, C=4, D=10, sizes=[[5, 12, 0, 30]])
    (s,) = _stats(clients, 4, torch.float64)
    counts, means, covs = _oracle(clients, 4, 10)  # local_statistics itself against NumPy
    assert s.counts.tolist() == counts.tolist()
    np.testing.assert_allclose(s.means.numpy(), means, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(s.covs.numpy(), covs, rtol=0, atol=1e-12 * np.abs(covs).max())
    geo = ggeur.aggregate([s])
    assert torch.equal(geo.counts, s.counts)
    torch.testing.assert_close(geo.means, s.means, rtol=1e-12, atol=0)
    torch.testing.assert_close(geo.covariances(), s.covs, rtol=0, atol=1e-12 * float(s.covs.abs().max()))


def test_aggregate_n_components_keeps_top_eigenpairs(seed):
    rng = np.random.default_rng(seed)
    clients = _clients(rng, C=3, D=16, sizes=rng.integers(20, 40, size=(2, 3)))
    stats = _stats(clients, 3, torch.float64)
    full, top = ggeur.aggregate(stats), ggeur.aggregate(stats, n_components=4)
    assert top.eigenvalues.shape == (3, 4) and top.eigenvectors.shape == (3, 16, 4)
    torch.testing.assert_close(top.eigenvalues, full.eigenvalues[:, :4], rtol=1e-12, atol=0)
    torch.testing.assert_close(top.eigenvectors, full.eigenvectors[:, :, :4], rtol=0, atol=1e-10)
    assert top.nbytes() < full.nbytes()


def test_statistics_and_geometry_roundtrip_through_safetensors(seed):
    rng = np.random.default_rng(seed)
    C, D = 5, 7
    clients = _clients(rng, C=C, D=D, sizes=rng.integers(0, 9, size=(2, C)))
    stats = _stats(clients, C, torch.float64)
    s = stats[0]
    assert s.nbytes() == 8 * C + 8 * C * D + 8 * C * D * D
    s2 = ClassStatistics.from_dict(st_load(st_save(s.to_dict())))
    for k in ("counts", "means", "covs"):
        assert torch.equal(getattr(s, k), getattr(s2, k))
    geo = ggeur.aggregate(stats)
    assert geo.nbytes() == 8 * C + 8 * C * D + 8 * C * D + 8 * C * D * D
    g2 = GlobalGeometry.from_dict(st_load(st_save(geo.to_dict())))
    for k in ("counts", "means", "eigenvalues", "eigenvectors"):
        assert torch.equal(getattr(geo, k), getattr(g2, k))
    g32 = geo.to(dtype=torch.float32)
    assert g32.counts.dtype == torch.int64 and g32.eigenvectors.dtype == torch.float32
    assert g32.nbytes() == 8 * C + 4 * (C * D + C * D + C * D * D)
    with pytest.raises(ValueError, match="missing \\['covs'\\]"):
        ClassStatistics.from_dict({"counts": s.counts, "means": s.means})
    with pytest.raises(TypeError, match="dict"):
        GlobalGeometry.from_dict([geo.counts])


def test_statistics_and_geometry_save_load_in_the_exchange_format(tmp_path, seed):
    """The containers' own files (geomkern.exchange: safetensors + JSON metadata), validated on
    load like a construction."""
    from safetensors.torch import save_file

    rng = np.random.default_rng(seed)
    C, D = 4, 6
    stats = _stats(_clients(rng, C=C, D=D, sizes=rng.integers(1, 9, size=(2, C))), C, torch.float64)
    geo = ggeur.aggregate(stats)
    for obj in (stats[0], geo):
        path = tmp_path / f"{type(obj).__name__}.safetensors"
        obj.save(path)
        back = type(obj).load(path)
        for k, v in obj.to_dict().items():
            assert torch.equal(getattr(back, k), v), k
    with pytest.raises(ValueError, match="holds a class_statistics, expected a global_geometry"):
        GlobalGeometry.load(tmp_path / "ClassStatistics.safetensors")
    bad = {k: v.clone() for k, v in stats[0].to_dict().items()}
    bad["counts"][0] = -1
    save_file(bad, str(tmp_path / "neg.safetensors"), metadata={"format": "geomkern.ggeur", "version": "1",
                                                                "kind": "class_statistics"})
    with pytest.raises(ValueError, match="counts must be >= 0"):
        ClassStatistics.load(tmp_path / "neg.safetensors")
    with pytest.raises(ValueError, match="not a geomkern.ggeur file"):
        save_file(stats[0].to_dict(), str(tmp_path / "plain.safetensors"))
        ClassStatistics.load(tmp_path / "plain.safetensors")


def _one_class_geometry(rng, D, dtype, spectrum):
    clients = _clients(rng, C=2, D=D, sizes=[[400, 300], [500, 200]], spectrum=spectrum)
    return ggeur.aggregate(_stats(clients, 2, dtype))


def _lm_bound(weights, n, t):
    """Laurent-Massart: for Q = sum_j a_j chi2_1, P(Q >= sum a + 2 |a|_2 sqrt(t) + 2 |a|_inf t)
    <= exp(-t). Returns that threshold divided by n."""
    a = np.asarray(weights, dtype=np.float64)
    return (a.sum() + 2 * np.linalg.norm(a) * math.sqrt(t) + 2 * a.max() * t) / n


@pytest.mark.parametrize("noise", ["sqrt", "paper"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_augment_noise_covariance_matches_eigenbasis(seed, dtype, noise):
    """Empirical second moment of d = x' - x over n draws vs T = V diag(s^2) V^T.

    Bound (derived): in T's eigenbasis (eigenvalues mu = s^2) the entries of S = d^T d / n are,
    for Gaussian d and large n, independent normals with Var(S_aa) = 2 mu_a^2 / n and
    Var(S_ab) = mu_a mu_b / n, so n ||S - T||_F^2 = sum_j a_j chi2_1 with weights 2 mu_a^2
    (diagonal) and 2 mu_a mu_b (each pair a < b; the Frobenius norm counts (a,b) and (b,a)).
    Laurent-Massart with t = 20 bounds it with probability >= 1 - 2e-9. With n = 50,000 and the
    decaying spectrum used here the bound is ~3-4% of ||T||_F; the test also checks that a 10%
    error in variance or the other noise mode would violate it (so the test can fail).
    """
    rng = np.random.default_rng(seed)
    D, n = 12, 50_000
    geo = _one_class_geometry(rng, D, dtype, spectrum=0.6 ** np.arange(D))
    x = geo.means[1:2] + 0.1  # any point of class 1; the noise does not depend on it
    g = torch.Generator().manual_seed(seed)
    X_new, y_new = ggeur.augment(x, torch.tensor([1]), geo, n_per_sample=n, generator=g, noise=noise)
    assert X_new.shape == (n, D) and X_new.dtype == dtype and y_new.tolist() == [1] * n
    d = (X_new - x).double().numpy()

    lam = geo.eigenvalues[1].double().numpy()
    V = geo.eigenvectors[1].double().numpy()
    s = np.sqrt(lam) if noise == "sqrt" else lam
    mu = s**2
    T = (V * mu) @ V.T
    S = d.T @ d / n
    iu = np.triu_indices(D, 1)
    weights = np.concatenate([2 * mu**2, 2 * np.outer(mu, mu)[iu]])
    bound = math.sqrt(_lm_bound(weights, n, t=20.0))
    err = np.linalg.norm(S - T)
    print(f"noise={noise} {dtype}: ||S-T||_F/||T||_F = {err / np.linalg.norm(T):.4f}, "
          f"bound {bound / np.linalg.norm(T):.4f}")
    assert bound / np.linalg.norm(T) < 0.05  # the design keeps the derived bound under 5%
    assert err <= bound, (err, bound, seed)
    # mean of d: n |mean|^2 = sum mu_a chi2_1
    assert np.linalg.norm(d.mean(0)) <= math.sqrt(_lm_bound(mu, n, t=20.0)), seed
    # sensitivity: a 10% variance error, or the other noise mode, is far outside the bound
    assert np.linalg.norm(S - 1.1 * T) > bound
    other = (V * (lam**2 if noise == "sqrt" else lam)) @ V.T
    assert np.linalg.norm(S - other) > 3 * bound


@pytest.mark.parametrize("dtype", DTYPES)
def test_augment_reproducible_with_seeded_generator(seed, dtype):
    rng = np.random.default_rng(seed)
    clients = _clients(rng, C=3, D=8, sizes=[[10, 20, 5], [7, 0, 9]])
    geo = ggeur.aggregate(_stats(clients, 3, dtype))
    X, y = _t(clients[0][0], dtype), torch.from_numpy(clients[0][1])

    def run(gen):
        return ggeur.augment(X, y, geo, n_per_sample=2, generator=gen)

    a, ya = run(torch.Generator().manual_seed(seed))
    b, yb = run(torch.Generator().manual_seed(seed))
    c, _ = run(torch.Generator().manual_seed(seed + 1))
    assert torch.equal(a, b) and torch.equal(ya, yb)
    assert not torch.allclose(a, c)
    g = torch.Generator().manual_seed(seed)
    first, second = run(g)[0], run(g)[0]  # the generator's state advances
    assert torch.equal(first, a) and not torch.allclose(first, second)
    u, v = run(None)[0], run(None)[0]  # None: fresh, randomly seeded
    assert not torch.allclose(u, v)


def _identity_geometry(C, D, dtype, counts=None, eigenvalues=None):
    ev = torch.zeros(C, D, dtype=dtype) if eigenvalues is None else eigenvalues
    cnt = torch.ones(C, dtype=torch.int64) if counts is None else counts
    return GlobalGeometry(cnt, torch.zeros(C, D, dtype=dtype), ev,
                          torch.eye(D, dtype=dtype).expand(C, D, D).clone())


def _expected_sources(y, n_new):
    """The documented order: grouped by class ascending, class c's row j from its (j mod n_c)-th
    local sample in X order."""
    src = []
    for c, m in enumerate(n_new):
        rows = np.nonzero(y == c)[0]
        src.extend(rows[np.arange(m) % len(rows)] if m else [])
    return np.asarray(src, dtype=np.int64)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode,value", [("n_per_sample", 0), ("n_per_sample", 1), ("n_per_sample", 3),
                                        ("target_per_class", 0), ("target_per_class", 6),
                                        ("target_per_class", 23)])
def test_augment_counts_and_source_order(seed, dtype, mode, value):
    """Zero eigenvalues make x' = x exactly, so the rows reveal which sample each came from."""
    rng = np.random.default_rng(seed)
    C, D = 5, 4
    local = np.array([3, 0, 1, 8, 11])  # class 1 absent locally
    y = rng.permutation(np.repeat(np.arange(C), local))
    X = torch.from_numpy(rng.standard_normal((len(y), D))).to(dtype)
    geo = _identity_geometry(C, D, dtype)
    X_new, y_new = ggeur.augment(X, torch.from_numpy(y), geo, generator=torch.Generator().manual_seed(seed),
                                 **{mode: value})
    if mode == "n_per_sample":
        n_new = local * value
    else:
        n_new = np.where(local > 0, np.maximum(value - local, 0), 0)
    assert X_new.shape == (n_new.sum(), D) and X_new.dtype == dtype
    assert y_new.dtype == torch.int64 and y_new.tolist() == np.repeat(np.arange(C), n_new).tolist()
    assert torch.equal(X_new, X[torch.from_numpy(_expected_sources(y, n_new))])


@pytest.mark.parametrize("dtype", DTYPES)
def test_augment_uses_each_class_geometry(seed, dtype):
    """Class c's covariance lives on coordinate block c: its noise must stay there."""
    rng = np.random.default_rng(seed)
    C, B = 3, 4
    D = C * B
    ev = torch.zeros(C, D, dtype=dtype)
    V = torch.zeros(C, D, D, dtype=dtype)
    for c in range(C):
        block = list(range(c * B, (c + 1) * B))
        rest = [i for i in range(D) if i not in block]
        V[c] = torch.eye(D, dtype=dtype)[:, block + rest]
        ev[c, :B] = torch.from_numpy(np.sort(rng.uniform(0.5, 2.0, B))[::-1].copy())
    geo = GlobalGeometry(torch.ones(C, dtype=torch.int64), torch.zeros(C, D, dtype=dtype), ev, V)
    y = rng.integers(0, C, 40)
    y[:C] = np.arange(C)
    X = torch.from_numpy(rng.standard_normal((40, D))).to(dtype)
    X_new, y_new = ggeur.augment(X, torch.from_numpy(y), geo, n_per_sample=2,
                                 generator=torch.Generator().manual_seed(seed))
    d = X_new - X[torch.from_numpy(_expected_sources(y, np.bincount(y, minlength=C) * 2))]
    for c in range(C):
        rows = d[y_new == c]
        inside = rows[:, c * B:(c + 1) * B]
        outside = torch.cat([rows[:, :c * B], rows[:, (c + 1) * B:]], 1)
        assert float(outside.abs().max()) == 0.0, (c, seed)
        assert bool((inside.abs() > 0).all()), (c, seed)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rank_deficient_class_noise_stays_in_data_span(seed, dtype):
    """5 + 3 samples of class 0 in D = 64 (rank 7), 2 of class 1 (rank 1), class 2 on nobody:
    finite output, exactly 7 / 1 / 0 nonzero eigenvalues, and the noise lies in the span of the
    class's centred samples (NumPy QR oracle) = the span of the nonzero-eigenvalue eigenvectors."""
    rng = np.random.default_rng(seed)
    D, C = 64, 3
    clients = _clients(rng, C=C, D=D, sizes=[[5, 2, 0], [3, 0, 0]])
    stats = _stats(clients, C, dtype)
    geo = ggeur.aggregate(stats)
    for name in ("means", "eigenvalues", "eigenvectors"):
        assert bool(torch.isfinite(getattr(geo, name)).all()), name
    assert (geo.eigenvalues > 0).sum(1).tolist() == [7, 1, 0]

    Xa, ya = _t(clients[0][0], dtype), torch.from_numpy(clients[0][1])
    for noise in ("sqrt", "paper"):
        X_new, y_new = ggeur.augment(Xa, ya, geo, n_per_sample=50, noise=noise,
                                     generator=torch.Generator().manual_seed(seed))
        assert bool(torch.isfinite(X_new).all())
        src = torch.from_numpy(_expected_sources(clients[0][1], np.array([250, 100, 0])))
        d = (X_new - Xa[src]).double().numpy()
        # float64: round-off ~1e-15; float32: eigenvectors of a float32 eigh carry ~1e-6 of
        # their norm outside the true span (eps * ||Sigma|| / gap); 1e-4 keeps 100x margin.
        tol = 1e-10 if dtype == torch.float64 else 1e-4
        for c, r in ((0, 7), (1, 1)):
            allX = np.concatenate([X[y == c] for X, y in clients])
            Q = np.linalg.qr((allX - allX.mean(0)).T)[0][:, :r]  # span of the centred samples
            dc = d[y_new.numpy() == c]
            off_span = np.linalg.norm(dc - (dc @ Q) @ Q.T) / np.linalg.norm(dc)
            assert off_span <= tol, (noise, c, off_span, seed)
            Vr = geo.eigenvectors[c, :, :r].double().numpy()
            assert np.linalg.norm(dc - (dc @ Vr) @ Vr.T) / np.linalg.norm(dc) <= tol


@pytest.mark.parametrize("dtype", DTYPES)
def test_n_components_limits_noise_to_top_eigenvectors(seed, dtype):
    rng = np.random.default_rng(seed)
    clients = _clients(rng, C=2, D=16, sizes=[[30, 40], [50, 20]])
    stats = _stats(clients, 2, dtype)
    full, top = ggeur.aggregate(stats), ggeur.aggregate(stats, n_components=3)
    X, y = _t(clients[1][0], dtype), torch.from_numpy(clients[1][1])
    a, _ = ggeur.augment(X, y, full, n_per_sample=4, n_components=3,
                         generator=torch.Generator().manual_seed(seed))
    b, _ = ggeur.augment(X, y, top, n_per_sample=4, generator=torch.Generator().manual_seed(seed))
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(a, b, rtol=tol, atol=tol * float(X.abs().max()))
    src = torch.from_numpy(_expected_sources(clients[1][1], np.array([200, 80])))
    d = (a - X[src]).double()
    for c in range(2):
        V3 = full.eigenvectors[c, :, :3].double()
        dc = d[:200] if c == 0 else d[200:]
        assert float((dc - dc @ V3 @ V3.T).norm() / dc.norm()) <= 10 * tol, (c, seed)


@pytest.mark.parametrize("dtype", DTYPES)
def test_augment_prototypes_is_the_same_sampler(seed, dtype):
    rng = np.random.default_rng(seed)
    C, D = 4, 10
    clients = _clients(rng, C=C, D=D, sizes=[[6, 0, 9, 4], [0, 7, 8, 0], [5, 5, 0, 3]])
    stats = _stats(clients, C, dtype)
    geo = ggeur.aggregate(stats)
    P, labels = ggeur.prototypes(stats, exclude=0)
    assert labels.tolist() == [1, 2, 0, 1, 3]
    torch.testing.assert_close(P, torch.cat([stats[1].means[[1, 2]], stats[2].means[[0, 1, 3]]]),
                               rtol=0, atol=0)
    Xp, yp = ggeur.augment_prototypes(P, labels, geo, n_per_prototype=3,
                                      generator=torch.Generator().manual_seed(seed))
    assert Xp.dtype == dtype and yp.tolist() == [0] * 3 + [1] * 6 + [2] * 3 + [3] * 3
    Xa, ya = ggeur.augment(P, labels, geo, n_per_sample=3, generator=torch.Generator().manual_seed(seed))
    assert torch.equal(Xp, Xa) and torch.equal(yp, ya)
    assert not torch.equal(Xp, P[torch.from_numpy(_expected_sources(labels.numpy(), np.array([3, 6, 3, 3])))])
    all_P, all_labels = ggeur.prototypes(stats)
    assert all_labels.tolist() == [0, 2, 3, 1, 2, 0, 1, 3]
    assert ggeur.augment_prototypes(P, labels, geo, n_per_prototype=0, generator=None)[0].shape == (0, D)


def test_empty_local_data(seed):
    rng = np.random.default_rng(seed)
    clients = _clients(rng, C=3, D=6, sizes=[[4, 5, 6]])
    geo = ggeur.aggregate(_stats(clients, 3, torch.float64))
    X = torch.zeros(0, 6, dtype=torch.float64)
    y = torch.zeros(0, dtype=torch.int64)
    for kw in ({"n_per_sample": 5}, {"target_per_class": 10}):
        X_new, y_new = ggeur.augment(X, y, geo, generator=None, **kw)
        assert X_new.shape == (0, 6) and y_new.shape == (0,)
    s = ggeur.local_statistics(X, y, 3)
    assert s.counts.tolist() == [0, 0, 0] and bool(torch.isfinite(s.covs).all())


# ---------------------------------------------------------------- invalid input, clear errors

def _setup():
    rng = np.random.default_rng(0)
    clients = _clients(rng, C=3, D=5, sizes=[[4, 5, 0], [3, 0, 0]])
    stats = _stats(clients, 3, torch.float64)
    geo = ggeur.aggregate(stats)
    X, y = _t(clients[0][0], torch.float64), torch.from_numpy(clients[0][1])
    return stats, geo, X, y


def _augment_cases():
    stats, geo, X, y = _setup()
    g = torch.Generator().manual_seed(0)
    one = dict(n_per_sample=1, generator=g)
    aug, protos = ggeur.augment, ggeur.augment_prototypes
    nan = X.clone().fill_(float("nan"))
    return {
        "X not a tensor": (lambda: aug(X.numpy(), y, geo, **one), TypeError, "X must be a torch.Tensor"),
        "X rank 1": (lambda: aug(X[0], y, geo, **one), ValueError, "X must have rank 2"),
        "X integer": (lambda: aug(X.long(), y, geo, **one), TypeError, "X has dtype"),
        "X NaN": (lambda: aug(nan, y, geo, **one), ValueError, "X contains"),
        "D mismatch": (lambda: aug(X[:, :4], y, geo, **one), ValueError, "X has D=4"),
        "dtype mismatch": (lambda: aug(X.float(), y, geo, **one), ValueError, "geometry.to"),
        "y length": (lambda: aug(X, y[:-1], geo, **one), ValueError, "y must have shape"),
        "y float": (lambda: aug(X, y.double(), geo, **one), TypeError, "y must hold integer"),
        "y out of range": (lambda: aug(X, y + 3, geo, **one), ValueError, "y values must lie in"),
        "y negative": (lambda: aug(X, y - 1, geo, **one), ValueError, "y values must lie in"),
        "geometry type": (lambda: aug(X, y, stats[0], **one), TypeError,
                          "geometry must be a GlobalGeometry"),
        "both counts": (lambda: aug(X, y, geo, n_per_sample=1, target_per_class=9, generator=g),
                        ValueError, "exactly one of n_per_sample"),
        "neither count": (lambda: aug(X, y, geo, generator=g), ValueError,
                          "exactly one of n_per_sample"),
        "negative n_per_sample": (lambda: aug(X, y, geo, n_per_sample=-1, generator=g), ValueError,
                                  "n_per_sample must be >= 0"),
        "float n_per_sample": (lambda: aug(X, y, geo, n_per_sample=1.5, generator=g), TypeError,
                               "n_per_sample must be an integer"),
        "negative target": (lambda: aug(X, y, geo, target_per_class=-3, generator=g), ValueError,
                            "target_per_class must be >= 0"),
        "unknown noise": (lambda: aug(X, y, geo, **one, noise="lambda"), ValueError, "noise='lambda'"),
        "n_components 0": (lambda: aug(X, y, geo, **one, n_components=0), ValueError,
                           "n_components must be >= 1"),
        "n_components > K": (lambda: aug(X, y, geo, **one, n_components=6), ValueError,
                             "n_components=6 is larger"),
        "generator type": (lambda: aug(X, y, geo, n_per_sample=1, generator=0), TypeError,
                           "generator must be a torch.Generator"),
        "class not in geometry": (lambda: aug(X, torch.full_like(y, 2), geo, **one), ValueError,
                                  "class 2 has local samples but count 0"),
        "prototypes rank": (lambda: protos(X[0], y[:1], geo, n_per_prototype=1, generator=g),
                            ValueError, "prototypes must have rank 2"),
        "prototype labels range": (lambda: protos(X, y + 3, geo, n_per_prototype=1, generator=g),
                                   ValueError, "labels values must lie in"),
        "negative n_per_prototype": (lambda: protos(X, y, geo, n_per_prototype=-2, generator=g),
                                     ValueError, "n_per_prototype must be >= 0"),
        "prototype class not in geometry": (
            lambda: protos(X[:1], torch.tensor([2]), geo, n_per_prototype=1, generator=g),
            ValueError, "class 2 has prototypes but count 0"),
    }


def _aggregate_cases():
    stats, geo, X, y = _setup()
    s = stats[0]
    other_C = ggeur.local_statistics(X, y, 4)
    other_D = ggeur.local_statistics(X[:, :4], y, 3)
    other_dtype = ggeur.local_statistics(X.float(), y, 3)
    G = GlobalGeometry
    unsorted = geo.eigenvalues.flip(1) + torch.arange(5.0).double()
    return {
        "empty list": (lambda: ggeur.aggregate([]), ValueError, "stats_list is empty"),
        "not a list": (lambda: ggeur.aggregate(s), TypeError, "stats_list must be a list"),
        "dict entry": (lambda: ggeur.aggregate([s, s.to_dict()]), TypeError,
                       "stats_list\\[1\\].*from_dict"),
        "C mismatch": (lambda: ggeur.aggregate([s, s, other_C]), ValueError, "client 2 .* C=4"),
        "D mismatch": (lambda: ggeur.aggregate([s, other_D]), ValueError, "client 1 .* D=4"),
        "dtype mismatch": (lambda: ggeur.aggregate([s, other_dtype]), ValueError, "client 1 .*float32"),
        "n_components > D": (lambda: ggeur.aggregate([s], n_components=6), ValueError,
                             "n_components=6 is larger"),
        "float counts": (lambda: ClassStatistics(s.counts.double(), s.means, s.covs), TypeError,
                         "counts must hold integer"),
        "negative counts": (lambda: ClassStatistics(-s.counts - 1, s.means, s.covs), ValueError,
                            "counts must be >= 0"),
        "counts shape": (lambda: ClassStatistics(s.counts[:2], s.means, s.covs), ValueError,
                         "counts must have shape"),
        "covs shape": (lambda: ClassStatistics(s.counts, s.means, s.covs[:, :4]), ValueError,
                       "covs must have shape"),
        "means NaN": (lambda: ClassStatistics(s.counts, s.means * float("nan"), s.covs), ValueError,
                      "means contains"),
        "negative eigenvalues": (lambda: G(geo.counts, geo.means, -1 - geo.eigenvalues, geo.eigenvectors),
                                 ValueError, "eigenvalues must be >= 0"),
        "unsorted eigenvalues": (lambda: G(geo.counts, geo.means, unsorted, geo.eigenvectors),
                                 ValueError, "descending"),
        "eigenvectors shape": (lambda: G(geo.counts, geo.means, geo.eigenvalues, geo.eigenvectors[..., :3]),
                               ValueError, "eigenvectors"),
        "prototypes mismatch": (lambda: ggeur.prototypes([s, other_D]), ValueError, "client 1 .* D=4"),
        "prototypes exclude": (lambda: ggeur.prototypes(stats, exclude=2), ValueError, "exclude=2"),
        "local_statistics labels": (lambda: ggeur.local_statistics(X, y + 5, 3), ValueError,
                                    "y values must lie in"),
    }


@pytest.mark.parametrize("case", list(_augment_cases()))
def test_augment_rejects_invalid_input(case):
    fn, exc, msg = _augment_cases()[case]
    with pytest.raises(exc, match=msg):
        fn()


@pytest.mark.parametrize("case", list(_aggregate_cases()))
def test_aggregate_and_containers_reject_invalid_input(case):
    fn, exc, msg = _aggregate_cases()[case]
    with pytest.raises(exc, match=msg):
        fn()


def test_group_prototypes_pool_each_group_and_leave_out_excluded(seed):
    """The multi-domain rule: one exact pooled class mean per (group, class), none of the excluded
    groups (a client's own domains), ordered by group then class."""
    rng = np.random.default_rng(seed)
    C, D = 5, 7
    clients = _clients(rng, C=C, D=D, sizes=_sizes(rng, 5, C))
    groups = [2, 0, 2, 1, 0]
    stats = _stats(clients, C, torch.float64)
    def expected(kept):  # (group, class, pooled mean) of every class a kept group holds
        want = []
        for g in kept:
            X = np.concatenate([X for (X, _), h in zip(clients, groups) if h == g])
            y = np.concatenate([y for (_, y), h in zip(clients, groups) if h == g])
            want += [(g, c, X[y == c].mean(0)) for c in range(C) if (y == c).any()]
        return want

    for exclude, kept in (({1}, (0, 2)), (set(), (0, 1, 2))):
        P, L, G = ggeur.group_prototypes(stats, groups, exclude=exclude)
        want = expected(kept)  # a group whose clients hold no rows (random sizes) has none
        assert G.tolist() == [g for g, _, _ in want] and L.tolist() == [c for _, c, _ in want]
        np.testing.assert_allclose(P.numpy(), np.stack([m for _, _, m in want]), rtol=1e-12, atol=1e-12)
    empty = ggeur.group_prototypes(stats, groups, exclude={0, 1, 2})
    assert [t.shape[0] for t in empty] == [0, 0, 0]
    with pytest.raises(ValueError, match="groups has 2 entries"):
        ggeur.group_prototypes(stats, [0, 1])
    with pytest.raises(TypeError, match=r"groups\[0\]"):
        ggeur.group_prototypes(stats, ["a"] * 5)


def test_generator_defaults_to_none(seed):
    """generator may be left out: None, a fresh secret seed on X's device (geomkern._random)."""
    import inspect

    for fn in (ggeur.augment, ggeur.augment_prototypes):
        assert inspect.signature(fn).parameters["generator"].default is None, fn.__name__
    stats, geo, X, y = _setup()
    torch.manual_seed(seed)  # the global RNG plays no part
    a, ya = ggeur.augment(X, y, geo, n_per_sample=2)
    torch.manual_seed(seed)
    b, yb = ggeur.augment(X, y, geo, n_per_sample=2)
    assert a.shape == (2 * X.shape[0], X.shape[1]) and torch.equal(ya, yb) and not torch.equal(a, b)
    P, L = ggeur.prototypes(stats, exclude=0)
    Pa, La = ggeur.augment_prototypes(P, L, geo, n_per_prototype=3)
    assert Pa.shape == (3 * P.shape[0], P.shape[1]) and La.shape == (3 * P.shape[0],)


# ------------------------------------------------------------------------------------------------
# Folded from test_ggeur_memory.py:
# GGEUR's exchange in memory that grows with what the clients hold, not with clients x C x D x D
# (issue 17, scale): the class-by-class pooling, HeldStatistics on the server, the Flower server's
# batched exchange and the geometry a Flower client keeps. Every path gives the same numbers as the
# dense one, bit for bit. (Its Flower paths: tests/fedsim/test_flower_exchange.py and
# tests/fedsim/test_augmenters.py.)

# (40, 6, 33), (31, 7, 47), (13, 11, 7): shapes where a per-class einsum sums in another order than
# pool_moments' batched product; D = 384: the embedded data's dimension
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("K,C,D,dtype", [(40, 6, 33, torch.float32), (31, 7, 47, torch.float32),
                                         (13, 11, 7, torch.float32), (20, 3, 384, torch.float32),
                                         (40, 6, 33, torch.float64), (9, 5, 12, torch.float64)])
def test_pool_by_class_is_pool_moments_bit_for_bit(threads, K, C, D, dtype):
    g = torch.Generator().manual_seed(K * C * D)
    counts = torch.randint(0, 30, (K, C), generator=g) * (torch.rand(K, C, generator=g) < 0.6)
    means = torch.randn(K, C, D, generator=g, dtype=dtype) * (counts > 0).unsqueeze(-1)
    A = torch.randn(K, C, D, 4, generator=g, dtype=dtype)
    covs = (A @ A.mT) * (counts > 0).view(K, C, 1, 1)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        dense = pool_moments(counts, means, covs)
        by_class = pool_moments_by_class(counts, means, lambda c, out: out.copy_(covs[:, c]))
    finally:
        torch.set_num_threads(old)
    for a, b in zip(dense, by_class):
        assert torch.equal(a, b)


def test_pool_by_class_checks_counts():
    stats = client_statistics(K=3, C=4, D=5)
    counts = torch.stack([s.counts for s in stats])
    means = torch.stack([s.means for s in stats])
    with pytest.raises(ValueError, match="counts must be a"):
        pool_moments_by_class(counts[:2], means, lambda c, out: None)
    with pytest.raises(ValueError, match="counts must be >= 0"):
        pool_moments_by_class(-counts, means, lambda c, out: None)


def test_held_statistics_keep_the_held_classes_and_aggregate_identically():
    stats = client_statistics()
    held = [ggeur.HeldStatistics.from_statistics(s) for s in stats]
    for s, h in zip(stats, held):
        assert h.covs.shape[0] == int((s.counts > 0).sum()) < s.n_classes  # only the held classes' D x D
        assert h.nbytes() == s.nbytes()  # the bytes that went up are the dense container's
    full, compact = ggeur.aggregate(stats), ggeur.aggregate(held)
    mixed = ggeur.aggregate([h if k % 2 else s for k, (s, h) in enumerate(zip(stats, held))])
    for g in (compact, mixed):
        for f in ggeur.GlobalGeometry._TENSORS:
            assert torch.equal(getattr(g, f), getattr(full, f))
    groups = list(range(len(stats)))
    for a, b in zip(ggeur.group_prototypes(stats, groups, exclude=[1]),
                    ggeur.group_prototypes(held, groups, exclude=[1])):
        assert torch.equal(a, b)


def test_the_geometry_is_the_dense_pooling_of_the_stacked_statistics():
    """aggregate (now class by class) against pool_moments on the stacked statistics followed by
    aggregate's own steps: the geometry the scale change must not move."""
    from geomkern.ops.eigh import eigh

    stats = client_statistics(K=12, C=4, D=10, seed=3)
    counts, mu, cov = pool_moments(torch.stack([s.counts for s in stats]), torch.stack([s.means for s in stats]),
                                   torch.stack([s.covs for s in stats]))
    cov = 0.5 * (cov + cov.mT)
    ev, V = eigh(cov, k=cov.shape[-1])
    tol = cov.shape[-1] * torch.finfo(ev.dtype).eps * ev[:, :1].clamp_min(0)
    ev = torch.where(ev > tol, ev, torch.zeros_like(ev))
    g = ggeur.aggregate(stats)
    for a, b in zip((counts, mu, ev, V), (g.counts, g.means, g.eigenvalues, g.eigenvectors)):
        assert torch.equal(a, b)


def test_a_nonzero_covariance_of_an_unheld_class_is_kept():
    """HeldStatistics stays exact for statistics that break the zero-covariance convention."""
    s = client_statistics(K=1, C=4, D=6)[0]
    covs = s.covs.clone()
    covs[3] = torch.eye(6)  # class 3 has count 0
    odd = ggeur.ClassStatistics(s.counts, s.means, covs)
    h = ggeur.HeldStatistics.from_statistics(odd)
    assert 3 in h.classes.tolist()
    out = torch.zeros(6, 6)
    h.class_covariance(3, out)
    assert torch.equal(out, torch.eye(6))
