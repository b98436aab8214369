"""geomkern's CPU defaults against every peer that installs here, at equal quality: each workload
is one pytest-benchmark group, providers interleaved round by round (round 0 of every provider,
then round 1, ...), the quality check inside every provider's test.

  rbf_gram        K(X, X), 4,096 x 512 float32, and K(X, Y), 4,096 x 2,048 x 512: torch
                  ``exp(-g cdist^2)`` | sklearn ``rbf_kernel`` | ``gk.rbf_gram`` (default).
                  Check: max |K - K_float64| <= 1e-5 (float32 level).
  kmeans          200 sets of 50-300 points, D 512, k 8, separated blobs and unstructured data:
                  sklearn ``KMeans`` per set (its default, n_init 1) | faiss ``Kmeans`` per set |
                  fast-pytorch-kmeans per set | torch-kmeans per set | ``gk.kmeans`` (default).
                  Check: total inertia / sklearn's, asserted <= 1.01 for gk, recorded for all.
  rbf_matmul      K(X, Y) V, 8,192 x 8,192 x 512, p 16: dense torch (K then K @ V) | pykeops
                  (LazyTensor, CPU) | ``gk.rbf_matmul`` (default). Check: relative error vs
                  float64 <= 1e-5.
  kpca            30 clusters of 150-1,900 points, D 512, d 8, low-rank (embedding-like) and
                  isotropic (flat spectrum) clouds: the floor (the clusters' Gram matrices alone) | sklearn ``KernelPCA`` (ARPACK) per cluster | torchdr
                  ``KernelPCA`` per cluster | ``gk.kpca`` (default). Check: top-8 eigenvalues
                  vs float64, relative 1e-5 (torchdr's are recorded, not asserted).

Peers that are not installed are skipped (``pip install -e .[peers]``).
Run: .venv/bin/python -m pytest benchmarks/test_cpu_peers.py --benchmark-only --threads 2
     [-k rbf_gram|kmeans|rbf_matmul|kpca] [--smoke]   (GK_BENCH_ROUNDS rounds, default 3)
The ratios print at the end of the run and go into extra_info["speedup"]; on a shared machine
read the ratios, not the seconds.
"""
from __future__ import annotations

import importlib
import os

import numpy as np
import pytest
import torch

import geomkern as gk

SUITE = "cpu_peers"
ROUNDS = int(os.environ.get("GK_BENCH_ROUNDS", "3"))
pytestmark = pytest.mark.usefixtures("threads")


def _peer(module: str):
    """The peer's module, or skip: peers are optional (the ``peers`` extra)."""
    try:
        return importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001  (a peer that fails to import is a missing peer)
        pytest.skip(f"{module} is not importable here ({type(exc).__name__}: {exc})")


def _timed(benchmark, group: str, fn):
    benchmark.group = f"{SUITE}: {group}"
    return benchmark.pedantic(fn, rounds=1, iterations=1)


def _round_robin(providers):
    return [pytest.param(r, p, id=f"r{r}-{p}") for r in range(ROUNDS) for p in providers]


# ------------------------------------------------------------------------------------- rbf_gram
GRAM_PROVIDERS = ("torch", "sklearn", "gk")


@pytest.fixture(scope="module")
def gram_data(smoke):
    n, m, D = (256, 128, 32) if smoke else (4096, 2048, 512)
    gen = torch.Generator().manual_seed(3)
    X = torch.randn(n, D, generator=gen) + 0.5  # offset: distances cancel in |x|^2 + |y|^2 - 2<x,y>
    Y = torch.randn(m, D, generator=gen) + 0.5
    g = 1.0 / D
    exact = {"sym": gk.rbf_gram(X.double(), gamma=g), "cross": gk.rbf_gram(X.double(), Y.double(), gamma=g)}
    return X, Y, g, exact


@pytest.mark.parametrize("form", ["sym", "cross"])
@pytest.mark.parametrize("round,provider", _round_robin(GRAM_PROVIDERS))
def test_rbf_gram(benchmark, recorder, gram_data, form, round, provider):
    X, Y, g, exact = gram_data
    B = X if form == "sym" else Y
    if provider == "torch":
        def run():
            return torch.cdist(X, B).square_().mul_(-g).exp_()
    elif provider == "sklearn":
        from sklearn.metrics.pairwise import rbf_kernel

        def run():
            return torch.from_numpy(rbf_kernel(X.numpy(), B.numpy(), gamma=g))
    elif form == "sym":
        def run():
            return gk.rbf_gram(X, gamma=g)
    else:
        def run():
            return gk.rbf_gram(X, Y, gamma=g)
    K = _timed(benchmark, f"rbf_gram {form} {tuple(X.shape)} x {B.shape[0]}", run)
    err = float((K.double() - exact[form]).abs().max())
    assert err <= 1e-5, f"{provider}: max |K - K_float64| = {err:.2e} > 1e-5"
    name = f"rbf_gram {form}: {provider}"
    recorder.add_round(name, benchmark, max_abs_err=err)
    if round == 0 and provider == GRAM_PROVIDERS[-1]:
        for peer in GRAM_PROVIDERS[:-1]:
            recorder.ratio(f"rbf_gram {form}: gk vs {peer} (goal >= 1x)", f"rbf_gram {form}: {peer}", name)


# --------------------------------------------------------------------------------------- kmeans
K, ITERS = 8, 50
KMEANS_SIZE = dict(sets=200, lo=50, hi=300, dim=512)
KMEANS_SMOKE = dict(sets=6, lo=20, hi=40, dim=32)
KMEANS_PROVIDERS = ("sklearn", "faiss", "fast_pytorch_kmeans", "torch_kmeans", "gk")


@pytest.fixture(scope="module")
def kmeans_data(smoke):
    from test_cpu_floor import _kmeans_sets

    size = KMEANS_SMOKE if smoke else KMEANS_SIZE
    return {kind: _kmeans_sets(kind, size) for kind in ("separated", "unstructured")}


def _per_set(X, off, fit_one):
    """Runs fit_one(points (n, D) float32 tensor, j) -> (labels (n,), centres (k, D)) per set."""
    o = off.tolist()
    labels, centres = [], []
    for j in range(len(o) - 1):
        lab, cen = fit_one(X[o[j]:o[j + 1]], j)
        labels.append(torch.as_tensor(np.asarray(lab), dtype=torch.int64).reshape(-1))
        centres.append(torch.as_tensor(np.asarray(cen, dtype=np.float32)).reshape(K, -1))
    return torch.cat(labels), torch.stack(centres)


def _kmeans_provider(provider: str, X, off):
    if provider == "sklearn":
        from sklearn.cluster import KMeans

        def one(P, j):
            km = KMeans(K, max_iter=ITERS, random_state=j).fit(P.numpy())
            return km.labels_, km.cluster_centers_
    elif provider == "faiss":
        faiss = _peer("faiss")
        faiss.omp_set_num_threads(torch.get_num_threads())

        def one(P, j):
            x = np.ascontiguousarray(P.numpy())
            km = faiss.Kmeans(x.shape[1], K, niter=ITERS, seed=j + 1, min_points_per_centroid=1,
                              max_points_per_centroid=1 << 20)
            km.train(x)
            return km.index.search(x, 1)[1][:, 0], km.centroids
    elif provider == "fast_pytorch_kmeans":
        fpk = _peer("fast_pytorch_kmeans")

        def one(P, j):
            torch.manual_seed(j)
            km = fpk.KMeans(n_clusters=K, max_iter=ITERS, mode="euclidean", init_method="kmeans++")
            lab = km.fit_predict(P)
            return lab.numpy(), km.centroids.numpy()
    elif provider == "torch_kmeans":
        tk = _peer("torch_kmeans")

        def one(P, j):
            km = tk.KMeans(n_clusters=K, max_iter=ITERS, num_init=1, init_method="k-means++",
                           verbose=False, seed=j)
            res = km(P.unsqueeze(0))
            return res.labels[0].numpy(), res.centers[0].numpy()
    else:
        return lambda: gk.kmeans(X, K, offsets=off, iters=ITERS, seed=0)
    return lambda: _per_set(X, off, one)


@pytest.mark.parametrize("kind", ["separated", "unstructured"])
@pytest.mark.parametrize("round,provider", _round_robin(KMEANS_PROVIDERS))
def test_kmeans(benchmark, recorder, kmeans_data, kind, round, provider):
    from test_cpu_floor import _inertia

    X, off = kmeans_data[kind]
    run = _kmeans_provider(provider, X, off)
    labels, centres = _timed(benchmark, f"kmeans {kind}, {off.numel() - 1} sets, k {K}", run)
    inertia = _inertia(X, off, labels, centres)
    extra = {"inertia": inertia}
    sk = recorder.results.get(f"kmeans {kind}: sklearn")  # measured earlier in this round
    if provider != "sklearn" and sk is not None:
        extra["inertia_vs_sklearn"] = inertia / sk["inertia"]
        if provider == "gk":
            assert inertia <= 1.01 * sk["inertia"], (
                f"gk: total inertia {inertia:.6g} > 1.01 x sklearn's {sk['inertia']:.6g}")
    name = f"kmeans {kind}: {provider}"
    recorder.add_round(name, benchmark, **extra)
    if round == 0 and provider == KMEANS_PROVIDERS[-1]:
        for peer in KMEANS_PROVIDERS[:-1]:
            if f"kmeans {kind}: {peer}" in recorder.results:
                recorder.ratio(f"kmeans {kind}: gk vs {peer}" + (" (goal >= 3x)" if peer == "sklearn" else ""),
                               f"kmeans {kind}: {peer}", name)


# ----------------------------------------------------------------------------------- rbf_matmul
MATMUL_PROVIDERS = ("torch", "pykeops", "gk")


@pytest.fixture(scope="module")
def matmul_data(smoke):
    n, D, p = (512, 32, 4) if smoke else (8192, 512, 16)
    gen = torch.Generator().manual_seed(5)
    X = torch.randn(n, D, generator=gen) / D ** 0.5
    Y = torch.randn(n, D, generator=gen) / D ** 0.5
    V = torch.randn(n, p, generator=gen)
    exact = gk.rbf_matmul(X.double(), Y.double(), V.double(), gamma=1.0)
    return X, Y, V, exact


@pytest.mark.parametrize("round,provider", _round_robin(MATMUL_PROVIDERS))
def test_rbf_matmul(benchmark, recorder, matmul_data, round, provider):
    X, Y, V, exact = matmul_data
    if provider == "torch":
        def run():
            return torch.cdist(X, Y).square_().neg_().exp_() @ V
    elif provider == "pykeops":
        keops = _peer("pykeops.torch")
        x, y = keops.LazyTensor(X[:, None, :]), keops.LazyTensor(Y[None, :, :])
        Kxy = (-((x - y) ** 2).sum(-1)).exp()

        def run():
            return Kxy @ V
    else:
        def run():
            return gk.rbf_matmul(X, Y, V, gamma=1.0)
    out = _timed(benchmark, f"rbf_matmul {tuple(X.shape)} x {Y.shape[0]}, p {V.shape[1]}", run)
    err = float((out.double() - exact).norm() / exact.norm())
    assert err <= 1e-5, f"{provider}: relative error {err:.2e} vs float64"
    name = f"rbf_matmul: {provider}"
    recorder.add_round(name, benchmark, rel_err=err)
    if round == 0 and provider == MATMUL_PROVIDERS[-1]:
        for peer in MATMUL_PROVIDERS[:-1]:
            if f"rbf_matmul: {peer}" in recorder.results:
                recorder.ratio(f"rbf_matmul: gk vs {peer}" + (" (goal >= 1x)" if peer == "torch" else ""),
                               f"rbf_matmul: {peer}", name)


# ----------------------------------------------------------------------------------------- kpca
KPCA_PROVIDERS = ("grams", "sklearn", "torchdr", "gk")
D_COMPONENTS = 8
_TORCHDR_REFUSES: dict[str, str] = {}  # kind -> torchdr's error on it ("" when it ran)


@pytest.fixture(scope="module")
def kpca_data(smoke):
    """Two kinds of 30 clusters: ``lowrank`` (each cluster a 16-dimensional cloud in D 512 plus
    noise, a spectrum that decays as embeddings' do) and ``isotropic`` (Gaussian in all 512
    directions: a flat spectrum, the Krylov solver's worst case)."""
    out = {}
    for kind in ("lowrank", "isotropic"):
        rng = np.random.default_rng(11)
        sizes = rng.integers(30, 80, 4) if smoke else rng.integers(150, 1901, 30)
        D = 32 if smoke else 512
        W = rng.standard_normal((16, D)) / 4
        if kind == "lowrank":
            parts = [rng.standard_normal((1, D)) + rng.standard_normal((n, 16)) @ W
                     + 0.1 * rng.standard_normal((n, D)) for n in sizes]
        else:
            parts = [rng.standard_normal((1, D)) * 2 + rng.standard_normal((n, D)) for n in sizes]
        X = torch.from_numpy(np.concatenate(parts).astype(np.float32))
        off = torch.from_numpy(np.concatenate([[0], np.cumsum(sizes)])).to(torch.int64)
        g = gk.median_gamma(X)
        exact = gk.kpca(X.double(), off, n_components=D_COMPONENTS, gamma=g, solver="dense").eigenvalues.numpy()
        out[kind] = (X, off, g, exact)
    return out


@pytest.mark.parametrize("kind", ["lowrank", "isotropic"])
@pytest.mark.parametrize("round,provider", _round_robin(KPCA_PROVIDERS))
def test_kpca(benchmark, recorder, kpca_data, kind, round, provider):
    X, off, g, exact = kpca_data[kind]
    o = off.tolist()
    clusters = [X[o[j]:o[j + 1]] for j in range(len(o) - 1)]
    if provider == "grams":
        def run():
            return [gk.rbf_gram(Xj, gamma=g) for Xj in clusters]
    elif provider == "sklearn":
        from sklearn.decomposition import KernelPCA

        def run():
            return np.stack([KernelPCA(D_COMPONENTS, kernel="rbf", gamma=g, eigen_solver="arpack",
                                       random_state=0).fit(Xj.numpy()).eigenvalues_ for Xj in clusters])
    elif provider == "torchdr":
        torchdr = _peer("torchdr")
        aff = torchdr.NormalizedGaussianAffinity(sigma=1.0 / g, normalization_dim=None)

        def fit_all():
            out = []
            for Xj in clusters:
                kp = torchdr.KernelPCA(affinity=aff, n_components=D_COMPONENTS, device="cpu")
                kp.fit_transform(Xj)
                out.append(np.asarray(kp.eigenvalues_[:D_COMPONENTS], np.float64))
            return np.stack(out)

        if kind not in _TORCHDR_REFUSES:  # tried once, untimed: a skip inside the timing would
            try:                          # leave pytest-benchmark an empty record
                fit_all()
                _TORCHDR_REFUSES[kind] = ""
            except ValueError as exc:  # it refuses some clusters' Grams
                _TORCHDR_REFUSES[kind] = str(exc)
        if _TORCHDR_REFUSES[kind]:
            pytest.skip(f"torchdr fails on this workload: {_TORCHDR_REFUSES[kind]}")
        run = fit_all
    else:
        def run():
            return gk.kpca(X, off, n_components=D_COMPONENTS, gamma=g).eigenvalues.numpy()
    out = _timed(benchmark, f"kpca {kind}, {len(clusters)} clusters, d {D_COMPONENTS}", run)
    extra = {}
    if provider != "grams":
        err = float(np.max(np.abs(np.asarray(out, np.float64) - exact) / exact))
        extra["eig_rel_err"] = err
        if provider != "torchdr":  # its own kernel normalisation: recorded, not asserted
            assert err <= 1e-5, f"{provider}: top-{D_COMPONENTS} eigenvalue error {err:.2e} vs float64"
    name = f"kpca {kind}: {provider}"
    recorder.add_round(name, benchmark, **extra)
    if round == 0 and provider == KPCA_PROVIDERS[-1]:
        recorder.ratio(f"kpca {kind}: floor / gk (goal >= 1/1.5 = 0.67)", f"kpca {kind}: grams", name)
        for peer in ("sklearn", "torchdr"):
            if f"kpca {kind}: {peer}" in recorder.results:
                recorder.ratio(f"kpca {kind}: gk vs {peer}", f"kpca {kind}: {peer}", name)
