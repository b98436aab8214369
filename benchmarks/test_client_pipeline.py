"""The FedMC client pipeline, as the paper's pseudocode writes it vs. batched geomkern calls.

Data: 3 clusters of ~1,700 unit-norm points at D = 512 (CLIP-like: a cluster centre, a decaying
low-rank structure and isotropic noise, normalised), 512 basis points, d = 8 components,
gamma by the median heuristic. Everything in float32 for every provider.

Providers (same data, same run):
  kpca+projection  sklearn KernelPCA per cluster (default solver = ARPACK here; and "dense")
                   + rbf_kernel projection  vs  gk.kpca (all clusters, one call) +
                   gk.project_onto_basis; floor = the three Gram matrices alone (gk.rbf_gram).
  many clusters    200 clusters of 50-300 points (D = 512, d = 8): sklearn KernelPCA per cluster
                   (default solver) vs gk.kpca one cluster per call vs gk.kpca of all in one call.
  pre-image        5,000 points, S = 512, 100 steps of the paper's gradient descent (Eq. 14):
                   a per-point NumPy loop vs batched gk.preimage (reference and auto backends),
                   same step sizes, so the same iterates up to roundoff.
Run: pytest benchmarks/ --benchmark-only   (ratios printed at the end, JSON under results/).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.decomposition import KernelPCA
from sklearn.metrics.pairwise import rbf_kernel

import geomkern as gk
from geomkern.ops.preimage import default_gd_lr

SUITE = "client_pipeline"
D, S, N_COMPONENTS = 512, 512, 8
SIZES = (1650, 1700, 1750)
N_PREIMAGE, STEPS = 5000, 100


def clip_like_clusters(sizes, dim, seed=0):
    rng = np.random.default_rng(seed)
    parts = []
    for n in sizes:
        centre = rng.standard_normal(dim)
        centre /= np.linalg.norm(centre)
        basis = np.linalg.qr(rng.standard_normal((dim, 24)))[0]
        scales = 0.6 * 0.85 ** np.arange(24)
        pts = centre + (rng.standard_normal((n, 24)) * scales) @ basis.T + 0.05 * rng.standard_normal((n, dim))
        parts.append(pts / np.linalg.norm(pts, axis=1, keepdims=True))
    return np.concatenate(parts).astype(np.float32)


def make_data() -> dict:
    """The pipeline workload: clusters, offsets, basis, gamma and the pre-image problem."""
    X = torch.from_numpy(clip_like_clusters(SIZES, D))
    offsets = torch.tensor(np.concatenate([[0], np.cumsum(SIZES)]), dtype=torch.int64)
    gen = torch.Generator().manual_seed(1)
    B = X[torch.randperm(X.shape[0], generator=gen)[:S]].clone()
    gamma = gk.median_gamma(B)  # from the shared basis, not one client's private data
    x = X[torch.randperm(X.shape[0], generator=gen)[:N_PREIMAGE]]
    targets = gk.rbf_gram(x, B, gamma=gamma)
    z0 = x + 0.02 * torch.randn(x.shape, generator=gen)
    lr = default_gd_lr(z0, B, gamma)
    return dict(X=X, offsets=offsets, B=B, gamma=gamma, z0=z0, targets=targets, lr=lr)


@pytest.fixture(scope="module")
def data():
    return make_data()


def _sklearn_pipeline(X, offsets, B, gamma, solver):
    betas, eigenvalues = [], []
    Bn = B.numpy()
    off = offsets.tolist()
    for j in range(len(off) - 1):
        Xj = X[off[j]:off[j + 1]].numpy()
        kp = KernelPCA(N_COMPONENTS, kernel="rbf", gamma=gamma, eigen_solver=solver).fit(Xj)
        alphas = kp.eigenvectors_ / np.sqrt(kp.eigenvalues_)
        betas.append(alphas.T @ rbf_kernel(Xj, Bn, gamma=gamma))
        eigenvalues.append(kp.eigenvalues_)
    return np.stack(betas), np.stack(eigenvalues)


def _gk_pipeline(X, offsets, B, gamma, solver="auto"):
    fit = gk.kpca(X, offsets, n_components=N_COMPONENTS, gamma=gamma, solver=solver)
    return gk.project_onto_basis(X, fit, B, gamma=gamma), fit.eigenvalues


@pytest.fixture(scope="module")
def exact_eigenvalues(data):
    """float64 dense eigenvalues: the accuracy yardstick for every provider."""
    X64 = data["X"].double()
    fit = gk.kpca(X64, data["offsets"], n_components=N_COMPONENTS, gamma=data["gamma"])
    return fit.eigenvalues.numpy()


def _rel_err(ev, exact):
    return float(np.max(np.abs(np.asarray(ev, dtype=np.float64) - exact) / exact))


@pytest.mark.parametrize("solver", ["arpack", "dense"])
def test_sklearn_kpca_projection(benchmark, recorder, data, exact_eigenvalues, solver):
    betas, ev = benchmark.pedantic(_sklearn_pipeline, args=(data["X"], data["offsets"], data["B"],
                                                            data["gamma"], solver), rounds=3)
    recorder.add(f"sklearn KernelPCA[{solver}] + projection", benchmark,
                 eig_rel_err=_rel_err(ev, exact_eigenvalues))


@pytest.mark.parametrize("backend", ["reference", "auto"])
def test_gk_kpca_projection(benchmark, recorder, data, exact_eigenvalues, backend):
    with gk.set_backend(backend):
        betas, ev = benchmark.pedantic(_gk_pipeline, args=(data["X"], data["offsets"], data["B"],
                                                           data["gamma"]), rounds=3)
        resolved = gk.resolve("kpca", "cpu")
    recorder.add(f"gk.kpca + project_onto_basis [{backend}]", benchmark, backend=resolved,
                 eig_rel_err=_rel_err(ev.numpy(), exact_eigenvalues))
    recorder.ratio(f"kpca+projection: gk[{backend}] vs sklearn ARPACK",
                   "sklearn KernelPCA[arpack] + projection", f"gk.kpca + project_onto_basis [{backend}]")
    recorder.ratio(f"kpca+projection: gk[{backend}] vs sklearn dense",
                   "sklearn KernelPCA[dense] + projection", f"gk.kpca + project_onto_basis [{backend}]")
    recorder.ratio(f"kpca+projection: floor (3 Grams) vs gk[{backend}] (1.0 = at the floor)",
                   "three Gram matrices (floor)", f"gk.kpca + project_onto_basis [{backend}]")


def test_gk_kpca_matrix_free(benchmark, recorder, data, exact_eigenvalues):
    """The Gram is never stored: every Krylov step recomputes it through rbf_matmul."""
    betas, ev = benchmark.pedantic(_gk_pipeline, args=(data["X"], data["offsets"], data["B"], data["gamma"],
                                                       "matrix_free"), rounds=3)
    recorder.add("gk.kpca[matrix_free] + project_onto_basis", benchmark,
                 eig_rel_err=_rel_err(ev.numpy(), exact_eigenvalues))
    recorder.ratio("kpca+projection: matrix_free vs stored-Gram auto (memory O(n k) instead of O(n^2))",
                   "gk.kpca + project_onto_basis [auto]", "gk.kpca[matrix_free] + project_onto_basis")


MANY_SIZES = tuple(int(n) for n in np.random.default_rng(3).integers(50, 301, 200))


@pytest.fixture(scope="module")
def many():
    X = torch.from_numpy(clip_like_clusters(MANY_SIZES, D, seed=1))
    offsets = torch.tensor(np.concatenate([[0], np.cumsum(MANY_SIZES)]), dtype=torch.int64)
    exact = gk.kpca(X.double(), offsets, n_components=N_COMPONENTS, gamma=gk.median_gamma(X[:512]),
                    solver="dense").eigenvalues.numpy()
    return dict(X=X, offsets=offsets, gamma=gk.median_gamma(X[:512]), exact=exact)


def test_many_clusters_sklearn(benchmark, recorder, many):
    off = many["offsets"].tolist()

    def run():
        return np.stack([KernelPCA(N_COMPONENTS, kernel="rbf", gamma=many["gamma"]).fit(
            many["X"][off[j]:off[j + 1]].numpy()).eigenvalues_ for j in range(len(off) - 1)])

    ev = benchmark.pedantic(run, rounds=1)
    recorder.add("200 clusters: sklearn KernelPCA per cluster", benchmark, eig_rel_err=_rel_err(ev, many["exact"]))


def test_many_clusters_gk_per_cluster(benchmark, recorder, many):
    off = many["offsets"].tolist()
    one = [torch.tensor([0, off[j + 1] - off[j]]) for j in range(len(off) - 1)]

    def run():
        return torch.cat([gk.kpca(many["X"][off[j]:off[j + 1]], one[j], n_components=N_COMPONENTS,
                                  gamma=many["gamma"]).eigenvalues for j in range(len(off) - 1)])

    ev = benchmark.pedantic(run, rounds=3)
    recorder.add("200 clusters: gk.kpca one cluster per call", benchmark,
                 eig_rel_err=_rel_err(ev.numpy(), many["exact"]))


def test_many_clusters_gk_batched(benchmark, recorder, many):
    ev = benchmark.pedantic(lambda: gk.kpca(many["X"], many["offsets"], n_components=N_COMPONENTS,
                                            gamma=many["gamma"]).eigenvalues, rounds=3)
    recorder.add("200 clusters: gk.kpca all in one call", benchmark, eig_rel_err=_rel_err(ev.numpy(), many["exact"]))
    recorder.ratio("200 clusters: one call vs sklearn per cluster", "200 clusters: sklearn KernelPCA per cluster",
                   "200 clusters: gk.kpca all in one call")
    recorder.ratio("200 clusters: one call vs gk one cluster per call", "200 clusters: gk.kpca one cluster per call",
                   "200 clusters: gk.kpca all in one call")


def test_gram_floor(benchmark, recorder, data):
    off = data["offsets"].tolist()

    def grams():
        return [gk.rbf_gram(data["X"][off[j]:off[j + 1]], gamma=data["gamma"]) for j in range(3)]

    benchmark.pedantic(grams, rounds=5)
    recorder.add("three Gram matrices (floor)", benchmark)


def _per_point_gd(z0, B, T, gamma, lr, steps):
    """The paper's Eq. 14 one point at a time (NumPy), as its pseudocode loops over samples."""
    Z = np.empty_like(z0)
    bb = (B * B).sum(1)
    for i in range(z0.shape[0]):
        z, t, step = z0[i].copy(), T[i], np.float32(4.0 * gamma * lr[i])
        for _ in range(steps):
            k = np.exp(-gamma * np.maximum(z @ z + bb - 2.0 * (B @ z), 0.0))
            w = (k - t) * k
            z = z + step * (w.sum() * z - w @ B)
        Z[i] = z
    return Z


def test_preimage_per_point_loop(benchmark, recorder, data):
    args = (data["z0"].numpy(), data["B"].numpy(), data["targets"].numpy(), np.float32(data["gamma"]),
            data["lr"].numpy(), STEPS)
    Z = benchmark.pedantic(_per_point_gd, args=args, rounds=1)
    loss = gk.preimage_loss(torch.from_numpy(Z), data["B"], data["targets"], gamma=data["gamma"])
    recorder.add("pre-image per-point loop (NumPy)", benchmark, mean_final_loss=float(loss.mean()))


@pytest.mark.parametrize("backend", ["reference", "auto"])
def test_preimage_batched(benchmark, recorder, data, backend):
    with gk.set_backend(backend):
        Z, loss = benchmark.pedantic(
            lambda: gk.preimage(data["z0"], data["B"], data["targets"], gamma=data["gamma"],
                                method="gd", steps=STEPS, lr=data["lr"], return_loss=True), rounds=3)
        resolved = gk.resolve("preimage_gd", "cpu")
    recorder.add(f"pre-image batched gk.preimage [{backend}]", benchmark, backend=resolved,
                 mean_final_loss=float(loss.mean()))
    recorder.ratio(f"pre-image: batched [{backend}] vs per-point loop",
                   "pre-image per-point loop (NumPy)", f"pre-image batched gk.preimage [{backend}]")
