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
Groups: "kpca+projection", "many clusters", "pre-image". Checks (asserted; in extra_info): top-8
eigenvalues against float64 (``eig_rel_err`` <= 1e-5), the floor's Grams against float64
(``gram_rel_err``), the pre-images' mean final loss against a float64 run of the same descent
(relative 1e-4).
Run: pytest benchmarks/test_client_pipeline.py --benchmark-only [--smoke]   (ratios printed at
the end, and in each provider's extra_info["speedup"]).
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
N_COMPONENTS, STEPS = 8, 100
# dim D, basis points S, cluster sizes, pre-image points; --smoke: the same work at toy size
FULL = dict(dim=512, basis=512, sizes=(1650, 1700, 1750), preimage=5000,
            many=tuple(int(n) for n in np.random.default_rng(3).integers(50, 301, 200)))
SMOKE = dict(dim=32, basis=32, sizes=(60, 70, 80), preimage=50,
             many=tuple(int(n) for n in np.random.default_rng(3).integers(20, 41, 10)))
EIG_TOL = 1e-5  # top-8 eigenvalues, relative, against float64
GROUP_KPCA = "client_pipeline: kpca+projection, 3 clusters, d 8"
GROUP_MANY = "client_pipeline: many clusters, kpca per cluster vs batched"
GROUP_PRE = "client_pipeline: pre-image, 100 gd steps"


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


def make_data(smoke: bool = False) -> dict:
    """The pipeline workload: clusters, offsets, basis, gamma and the pre-image problem."""
    size = SMOKE if smoke else FULL
    X = torch.from_numpy(clip_like_clusters(size["sizes"], size["dim"]))
    offsets = torch.tensor(np.concatenate([[0], np.cumsum(size["sizes"])]), dtype=torch.int64)
    gen = torch.Generator().manual_seed(1)
    B = X[torch.randperm(X.shape[0], generator=gen)[:size["basis"]]].clone()
    gamma = gk.median_gamma(B)  # from the shared basis, not one client's private data
    x = X[torch.randperm(X.shape[0], generator=gen)[:size["preimage"]]]
    targets = gk.rbf_gram(x, B, gamma=gamma)
    z0 = x + 0.02 * torch.randn(x.shape, generator=gen)
    lr = default_gd_lr(z0, B, gamma)
    return dict(X=X, offsets=offsets, B=B, gamma=gamma, z0=z0, targets=targets, lr=lr)


@pytest.fixture(scope="module")
def data(smoke):
    return make_data(smoke)


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


def _eig_check(ev, exact, who) -> float:
    """Top-d eigenvalues' largest relative error against float64; asserted <= EIG_TOL."""
    err = float(np.max(np.abs(np.asarray(ev, dtype=np.float64) - exact) / exact))
    assert err <= EIG_TOL, f"{who}: top-{N_COMPONENTS} eigenvalue error {err:.2e} vs float64 > {EIG_TOL:g}"
    return err


@pytest.mark.parametrize("solver", ["arpack", "dense"])
def test_sklearn_kpca_projection(benchmark, recorder, data, exact_eigenvalues, solver):
    benchmark.group = GROUP_KPCA
    betas, ev = benchmark.pedantic(_sklearn_pipeline, args=(data["X"], data["offsets"], data["B"],
                                                            data["gamma"], solver), rounds=3)
    recorder.add(f"sklearn KernelPCA[{solver}] + projection", benchmark,
                 eig_rel_err=_eig_check(ev, exact_eigenvalues, f"sklearn {solver}"))


@pytest.mark.parametrize("backend", ["reference", "auto"])
def test_gk_kpca_projection(benchmark, recorder, data, exact_eigenvalues, backend):
    benchmark.group = GROUP_KPCA
    with gk.set_backend(backend):
        betas, ev = benchmark.pedantic(_gk_pipeline, args=(data["X"], data["offsets"], data["B"],
                                                           data["gamma"]), rounds=3)
        resolved = gk.resolve("kpca", "cpu")
    recorder.add(f"gk.kpca + project_onto_basis [{backend}]", benchmark, backend=resolved,
                 eig_rel_err=_eig_check(ev.numpy(), exact_eigenvalues, f"gk.kpca [{backend}]"))
    recorder.ratio(f"kpca+projection: gk[{backend}] vs sklearn ARPACK",
                   "sklearn KernelPCA[arpack] + projection", f"gk.kpca + project_onto_basis [{backend}]")
    recorder.ratio(f"kpca+projection: gk[{backend}] vs sklearn dense",
                   "sklearn KernelPCA[dense] + projection", f"gk.kpca + project_onto_basis [{backend}]")
    recorder.ratio(f"kpca+projection: floor (3 Grams) vs gk[{backend}] (1.0 = at the floor)",
                   "three Gram matrices (floor)", f"gk.kpca + project_onto_basis [{backend}]")


def test_gk_kpca_matrix_free(benchmark, recorder, data, exact_eigenvalues):
    """The Gram is never stored: every Krylov step recomputes it through rbf_matmul."""
    benchmark.group = GROUP_KPCA
    betas, ev = benchmark.pedantic(_gk_pipeline, args=(data["X"], data["offsets"], data["B"], data["gamma"],
                                                       "matrix_free"), rounds=3)
    recorder.add("gk.kpca[matrix_free] + project_onto_basis", benchmark,
                 eig_rel_err=_eig_check(ev.numpy(), exact_eigenvalues, "gk.kpca [matrix_free]"))
    recorder.ratio("kpca+projection: matrix_free vs stored-Gram auto (memory O(n k) instead of O(n^2))",
                   "gk.kpca + project_onto_basis [auto]", "gk.kpca[matrix_free] + project_onto_basis")


@pytest.fixture(scope="module")
def many(smoke):
    size = SMOKE if smoke else FULL
    X = torch.from_numpy(clip_like_clusters(size["many"], size["dim"], seed=1))
    offsets = torch.tensor(np.concatenate([[0], np.cumsum(size["many"])]), dtype=torch.int64)
    exact = gk.kpca(X.double(), offsets, n_components=N_COMPONENTS, gamma=gk.median_gamma(X[:512]),
                    solver="dense").eigenvalues.numpy()
    return dict(X=X, offsets=offsets, gamma=gk.median_gamma(X[:512]), exact=exact)


def test_many_clusters_sklearn(benchmark, recorder, many):
    benchmark.group = GROUP_MANY
    off = many["offsets"].tolist()

    def run():
        return np.stack([KernelPCA(N_COMPONENTS, kernel="rbf", gamma=many["gamma"]).fit(
            many["X"][off[j]:off[j + 1]].numpy()).eigenvalues_ for j in range(len(off) - 1)])

    ev = benchmark.pedantic(run, rounds=1)
    recorder.add("200 clusters: sklearn KernelPCA per cluster", benchmark,
                 eig_rel_err=_eig_check(ev, many["exact"], "sklearn per cluster"))


def test_many_clusters_gk_per_cluster(benchmark, recorder, many):
    benchmark.group = GROUP_MANY
    off = many["offsets"].tolist()
    one = [torch.tensor([0, off[j + 1] - off[j]]) for j in range(len(off) - 1)]

    def run():
        return torch.cat([gk.kpca(many["X"][off[j]:off[j + 1]], one[j], n_components=N_COMPONENTS,
                                  gamma=many["gamma"]).eigenvalues for j in range(len(off) - 1)])

    ev = benchmark.pedantic(run, rounds=3)
    recorder.add("200 clusters: gk.kpca one cluster per call", benchmark,
                 eig_rel_err=_eig_check(ev.numpy(), many["exact"], "gk.kpca per cluster"))


def test_many_clusters_gk_batched(benchmark, recorder, many):
    benchmark.group = GROUP_MANY
    ev = benchmark.pedantic(lambda: gk.kpca(many["X"], many["offsets"], n_components=N_COMPONENTS,
                                            gamma=many["gamma"]).eigenvalues, rounds=3)
    recorder.add("200 clusters: gk.kpca all in one call", benchmark,
                 eig_rel_err=_eig_check(ev.numpy(), many["exact"], "gk.kpca batched"))
    recorder.ratio("200 clusters: one call vs sklearn per cluster", "200 clusters: sklearn KernelPCA per cluster",
                   "200 clusters: gk.kpca all in one call")
    recorder.ratio("200 clusters: one call vs gk one cluster per call", "200 clusters: gk.kpca one cluster per call",
                   "200 clusters: gk.kpca all in one call")


def test_gram_floor(benchmark, recorder, data):
    benchmark.group = GROUP_KPCA
    off = data["offsets"].tolist()

    def grams():
        return [gk.rbf_gram(data["X"][off[j]:off[j + 1]], gamma=data["gamma"]) for j in range(3)]

    Ks = benchmark.pedantic(grams, rounds=5)
    err = max(float((K.double() - gk.rbf_gram(data["X"][off[j]:off[j + 1]].double(), gamma=data["gamma"])).norm()
                    / K.double().norm()) for j, K in enumerate(Ks))
    assert err <= 1e-5, f"float32 Gram error {err:.2e} vs float64"
    recorder.add("three Gram matrices (floor)", benchmark, gram_rel_err=err)


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


@pytest.fixture(scope="module")
def float64_loss(data):
    """Mean final loss of the same descent in float64 (reference backend): the yardstick."""
    with gk.set_backend("reference"):
        Z = gk.preimage(data["z0"].double(), data["B"].double(), data["targets"].double(), gamma=data["gamma"],
                        method="gd", steps=STEPS, lr=data["lr"].double())
    return float(gk.preimage_loss(Z, data["B"].double(), data["targets"].double(), gamma=data["gamma"]).mean())


def _loss_check(loss, float64_loss, who) -> dict:
    assert abs(loss - float64_loss) <= 1e-4 * float64_loss, f"{who}: mean loss {loss:.8g} vs float64 {float64_loss:.8g}"
    return dict(mean_final_loss=loss, float64_loss=float64_loss)


def test_preimage_per_point_loop(benchmark, recorder, data, float64_loss):
    benchmark.group = GROUP_PRE
    args = (data["z0"].numpy(), data["B"].numpy(), data["targets"].numpy(), np.float32(data["gamma"]),
            data["lr"].numpy(), STEPS)
    Z = benchmark.pedantic(_per_point_gd, args=args, rounds=1)
    loss = float(gk.preimage_loss(torch.from_numpy(Z), data["B"], data["targets"], gamma=data["gamma"]).mean())
    recorder.add("pre-image per-point loop (NumPy)", benchmark, **_loss_check(loss, float64_loss, "loop"))


@pytest.mark.parametrize("backend", ["reference", "auto"])
def test_preimage_batched(benchmark, recorder, data, float64_loss, backend):
    benchmark.group = GROUP_PRE
    with gk.set_backend(backend):
        Z, loss = benchmark.pedantic(
            lambda: gk.preimage(data["z0"], data["B"], data["targets"], gamma=data["gamma"],
                                method="gd", steps=STEPS, lr=data["lr"], return_loss=True), rounds=3)
        resolved = gk.resolve("preimage_gd", "cpu")
    recorder.add(f"pre-image batched gk.preimage [{backend}]", benchmark, backend=resolved,
                 **_loss_check(float(loss.mean()), float64_loss, f"gk.preimage [{backend}]"))
    recorder.ratio(f"pre-image: batched [{backend}] vs per-point loop",
                   "pre-image per-point loop (NumPy)", f"pre-image batched gk.preimage [{backend}]")
