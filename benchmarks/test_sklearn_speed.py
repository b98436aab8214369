"""geomkern.sklearn against scikit-learn's own estimators: same data, same run, same machine.

Workloads (one ``benchmark.group`` each; the parameter ``provider`` is "sklearn" or "geomkern"):
  kernel_pca          KernelPCA(8, gamma) fit + transform of 300 held-out rows, N 2,000 x D 32
                      (a swiss roll plus 29 small noise dimensions). sklearn:
                      decomposition.KernelPCA(kernel="rbf") with its default solver.
  kmeans              KMeans(16, n_init=1, max_iter=50) fit, N 40,000 x D 16, 16 blobs.
                      sklearn: cluster.KMeans (greedy k-means++, Lloyd), same n_init and max_iter.
  batched_kernel_pca  BatchedKernelPCA(4): 200 groups of 40-160 rows (D 32), fit + transform of
                      20 held-out rows per group; sklearn: a loop of KernelPCA, one per group.
  batched_kmeans      BatchedKMeans(4): 400 groups of 40-200 rows (D 16); sklearn: a loop of
                      KMeans, one per group.
Interleaved: the cases run as (workload, rep, provider), the providers alternating within every
rep, so a busy machine slows both sides alike; each rep is ROUNDS timed rounds and the summary's
median is over the reps' medians (``recorder.add_round``).
Quality (asserted; in ``extra_info``): kernel PCA scores against scikit-learn's dense float64
solution, per group, signs aligned (``max_rel_diff``, relative to the largest score); K-Means
inertia over scikit-learn's on the same data (``inertia_ratio`` <= 1.01). The blobs are separated
enough that both libraries' k-means++ find them from these seeds, so the ratio checks the
algorithm rather than a lucky start; the batched ratio sums all groups.
The geomkern side runs on CUDA when torch sees a GPU (``extra_info["device"]``), else on the CPU.
Writes nothing unless asked (benchmarks/conftest.py: ``--save-results``, ``--benchmark-json``).
Run: pytest benchmarks/test_sklearn_speed.py --benchmark-only [--smoke]
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn import cluster, datasets, decomposition

from geomkern import median_gamma
from geomkern.sklearn import BatchedKernelPCA, BatchedKMeans, KernelPCA, KMeans

SUITE = "sklearn_speed"
REPS, ROUNDS = 5, 2
PROVIDERS = ("sklearn", "geomkern")
WORKLOADS = ("kernel_pca", "kmeans", "batched_kernel_pca", "batched_kmeans")
FULL = dict(kpca_n=2000, kmeans_n=40_000, kpca_groups=200, kmeans_groups=400)
SMOKE = dict(kpca_n=200, kmeans_n=2000, kpca_groups=6, kmeans_groups=8)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
KPCA_TOL = 1e-6  # float64 scores against scikit-learn's dense solution, relative to the largest
INERTIA_TOL = 1.01


def _aligned_diff(ours, ref) -> float:
    """max |ours - ref| over max |ref|, each column's sign aligned first (eigenvectors have none)."""
    ours = ours * np.sign((ours * ref).sum(0))
    return float(np.abs(ours - ref).max() / np.abs(ref).max())


def _grouped_blobs(rng, n_groups, lo, hi, D, k, spread):
    """Each group: ``k`` blobs of its own (centres ~ N(0, spread^2)), unit noise; rows shuffled."""
    sizes = rng.integers(lo, hi + 1, n_groups)
    X = np.concatenate([rng.normal(0, spread, (k, D))[rng.integers(0, k, n)] + rng.normal(size=(n, D))
                        for n in sizes])
    groups = np.repeat(np.arange(n_groups), sizes)
    perm = rng.permutation(len(X))
    return X[perm], groups[perm]


def _make(workload: str, size: dict) -> dict:
    rng = np.random.default_rng(0)
    if workload == "kernel_pca":
        n = size["kpca_n"]
        X, _ = datasets.make_swiss_roll(n + 300, noise=0.3, random_state=0)
        X = np.hstack([X, 0.1 * rng.normal(size=(n + 300, 29))])
        X, Z = X[:n], X[n:]
        gamma = median_gamma(torch.from_numpy(X))
        ref = decomposition.KernelPCA(8, kernel="rbf", gamma=gamma, eigen_solver="dense").fit(X).transform(Z)
        return dict(X=X, Z=Z, gamma=gamma, ref=ref)
    if workload == "kmeans":
        X, _ = datasets.make_blobs(size["kmeans_n"], centers=16, n_features=16, cluster_std=1.5,
                                   center_box=(-15, 15), random_state=0)
        return dict(X=X)
    if workload == "batched_kernel_pca":
        m = size["kpca_groups"]
        X, groups = _grouped_blobs(rng, m, 60, 180, 32, 3, 2.0)
        held = np.zeros(len(X), dtype=bool)
        for g in range(m):  # the first 20 rows of each group are held out
            held[np.flatnonzero(groups == g)[:20]] = True
        Xtr, gtr, Z, gz = X[~held], groups[~held], X[held], groups[held]
        gamma = median_gamma(torch.from_numpy(Xtr))
        ref = np.empty((len(Z), 4))
        for g in range(m):
            fit = decomposition.KernelPCA(4, kernel="rbf", gamma=gamma, eigen_solver="dense").fit(Xtr[gtr == g])
            ref[gz == g] = fit.transform(Z[gz == g])
        return dict(X=Xtr, groups=gtr, Z=Z, zgroups=gz, gamma=gamma, ref=ref)
    X, groups = _grouped_blobs(rng, size["kmeans_groups"], 40, 200, 16, 4, 10.0)
    return dict(X=X, groups=groups)


def _run(workload: str, provider: str, d: dict):
    """One timed call: the workload's fit (+ transform) by ``provider``; returns what quality reads."""
    sk = provider == "sklearn"
    if workload == "kernel_pca":
        est = (decomposition.KernelPCA(8, kernel="rbf", gamma=d["gamma"]) if sk
               else KernelPCA(8, gamma=d["gamma"], device=DEVICE))
        return est.fit(d["X"]).transform(d["Z"])
    if workload == "kmeans":
        est = (cluster.KMeans(16, n_init=1, max_iter=50, random_state=0) if sk
               else KMeans(16, n_init=1, max_iter=50, random_state=0, device=DEVICE))
        return est.fit(d["X"]).inertia_
    X, groups = d["X"], d["groups"]
    if workload == "batched_kernel_pca":
        if not sk:
            est = BatchedKernelPCA(4, gamma=d["gamma"], device=DEVICE).fit(X, groups=groups)
            return est.transform(d["Z"], groups=d["zgroups"])
        out = np.empty((len(d["Z"]), 4))
        for g in np.unique(groups):
            rows = d["zgroups"] == g
            est = decomposition.KernelPCA(4, kernel="rbf", gamma=d["gamma"]).fit(X[groups == g])
            out[rows] = est.transform(d["Z"][rows])
        return out
    if not sk:
        return BatchedKMeans(4, n_init=1, max_iter=50, random_state=0, device=DEVICE).fit(
            X, groups=groups).inertia_.sum()
    return sum(cluster.KMeans(4, n_init=1, max_iter=50, random_state=0).fit(X[groups == g]).inertia_
               for g in np.unique(groups))


def _quality(workload: str, provider: str, d: dict, result) -> dict:
    if workload == "kernel_pca":
        diff = _aligned_diff(result, d["ref"])
    elif workload == "batched_kernel_pca":
        z = d["zgroups"]
        diff = max(_aligned_diff(result[z == g], d["ref"][z == g]) for g in np.unique(z))
    else:
        if "sklearn_inertia" not in d:  # the reference: scikit-learn's own result on this data
            d["sklearn_inertia"] = float(_run(workload, "sklearn", d))
        ratio = float(result) / d["sklearn_inertia"]
        assert ratio <= INERTIA_TOL, f"{provider}: inertia {ratio:.4f}x scikit-learn's"
        return dict(inertia=float(result), inertia_ratio=ratio)
    assert diff <= KPCA_TOL, f"{provider}: scores differ from scikit-learn's dense solution by {diff:.2e}"
    return dict(max_rel_diff=diff)


@pytest.fixture(scope="module")
def data():
    return {}


CASES = [(w, r, p) for w in WORKLOADS for r in range(REPS) for p in PROVIDERS]


@pytest.mark.parametrize("workload,rep,provider", CASES, ids=[f"{w}-rep{r}-{p}" for w, r, p in CASES])
def test_sklearn_speed(benchmark, recorder, smoke, data, workload, rep, provider):
    if workload not in data:
        data[workload] = _make(workload, SMOKE if smoke else FULL)
        for p in PROVIDERS:  # untimed warm-up of both (imports, thread pools, first allocations)
            _run(workload, p, data[workload])
    d = data[workload]
    benchmark.group = workload
    result = benchmark.pedantic(_run, args=(workload, provider, d), rounds=ROUNDS, iterations=1)
    name = f"{workload}: {provider}"
    recorder.add_round(name, benchmark, rep=rep, device=DEVICE if provider == "geomkern" else "cpu",
                       **_quality(workload, provider, d, result))
    if provider == "geomkern":
        recorder.ratio(f"{workload}: sklearn / geomkern", f"{workload}: sklearn", name)
