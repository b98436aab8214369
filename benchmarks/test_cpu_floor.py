"""The CPU path near its floor (issue 20): four workloads, each against the libraries people use
instead, providers interleaved round by round (every round of every provider is its own
pytest-benchmark test, run in the order round 0 of each provider, round 1 of each, ...), with an
equal-quality check inside every provider's test so a faster provider cannot win by doing less.

  kpca       3 clusters of ~1,700 (D 512, d 8) + projection onto S = 512 basis points:
             sklearn KernelPCA (ARPACK) + rbf_kernel | gk.kpca + gk.project_onto_basis |
             the floor, the three Gram matrices alone (provider "grams"). Check: top-8
             eigenvalues vs float64.
  kmeans     200 sets of 50-300 points, D 512, k 8, 50 iterations, well-separated and
             unstructured data: sklearn KMeans per set (n_init 1) | gk reference (torch) |
             gk native (C++ Lloyd per set). Check: total inertia within 2% of sklearn's.
  preimage   5,000 points, S = D = 512, 100 gd steps: the paper's per-point loop (NumPy) |
             gk reference (torch) | native direct form | native span form (the default).
             Check: mean final loss equal to the float64 reference's (relative 1e-4).
  rbf_matmul K(X, Y) V, 8,192 x 8,192 x D 512, p 16: dense NumPy GEMM + exp + GEMM (the floor) |
             dense torch | gk reference (row chunks) | gk native (tiles, K never stored).
             Check: relative error vs float64 <= 1e-5.

Each workload is one pytest-benchmark group; the tests' parameters are ``round`` and
``provider`` (ids like ``r0-sklearn``: ``-k "kpca and not grams"`` leaves out the floor; -k also
matches this file's name, so select providers by their ids, not by "floor").
Run: .venv/bin/python -m pytest benchmarks/test_cpu_floor.py --benchmark-only --threads 2
     [-k kpca|kmeans|preimage|rbf_matmul] [--smoke]   (GK_BENCH_ROUNDS=3 rounds of each
     provider, 1 of the per-point loop)
Ratios print at the end and go into extra_info["speedup"] (same run only; on a shared machine,
read ratios only).
"""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from sklearn.cluster import KMeans
from sklearn.decomposition import KernelPCA
from sklearn.metrics.pairwise import rbf_kernel

import geomkern as gk
from geomkern.backends import native
from test_client_pipeline import N_COMPONENTS, STEPS, _per_point_gd, make_data

SUITE = "cpu_floor"
ROUNDS = int(os.environ.get("GK_BENCH_ROUNDS", "3"))  # rounds of each provider (the loop: 1)
pytestmark = [pytest.mark.skipif("native" not in gk.available_backends(),
                                 reason="geomkern._C (native backend) is not built"),
              pytest.mark.usefixtures("threads")]


def _timed(benchmark, group, fn):
    """One pytest-benchmark round of fn in ``group``; returns fn's result."""
    benchmark.group = f"{SUITE}: {group}"
    return benchmark.pedantic(fn, rounds=1, iterations=1)


def _round_robin(providers):
    """(round, provider) in the order round 0 of every provider, round 1 of every provider..."""
    return [pytest.param(r, p, id=f"r{r}-{p}") for r in range(ROUNDS) for p in providers]


# --------------------------------------------------------------------------- kpca + projection
KPCA_PROVIDERS = ("sklearn", "gk", "grams")
KPCA_NAMES = {"sklearn": "kpca: sklearn KernelPCA[arpack] + rbf_kernel",
              "gk": "kpca: gk.kpca + project_onto_basis [auto]",
              "grams": "kpca: three Gram matrices (floor)"}


@pytest.fixture(scope="module")
def kpca_data(smoke):
    data = make_data(smoke)
    exact = gk.kpca(data["X"].double(), data["offsets"], n_components=N_COMPONENTS,
                    gamma=data["gamma"], solver="dense").eigenvalues.numpy()
    return data, exact


@pytest.mark.parametrize("round,provider", _round_robin(KPCA_PROVIDERS))
def test_kpca(benchmark, recorder, kpca_data, round, provider):
    data, exact = kpca_data
    X, off, B, g = data["X"], data["offsets"], data["B"], data["gamma"]
    o = off.tolist()
    if provider == "sklearn":
        def run():
            ev = []
            for j in range(len(o) - 1):
                Xj = X[o[j]:o[j + 1]].numpy()
                kp = KernelPCA(N_COMPONENTS, kernel="rbf", gamma=g, eigen_solver="arpack").fit(Xj)
                (kp.eigenvectors_ / np.sqrt(kp.eigenvalues_)).T @ rbf_kernel(Xj, B.numpy(), gamma=g)
                ev.append(kp.eigenvalues_)
            return np.stack(ev)
    elif provider == "gk":
        def run():
            fit = gk.kpca(X, off, n_components=N_COMPONENTS, gamma=g)
            gk.project_onto_basis(X, fit, B, gamma=g)
            return fit.eigenvalues.numpy()
    else:
        def run():
            return [gk.rbf_gram(X[o[j]:o[j + 1]], gamma=g) for j in range(len(o) - 1)]
    out = _timed(benchmark, "kpca+projection, 3 clusters, d 8", run)
    if provider == "grams":
        err = max(float((K.double() - gk.rbf_gram(X[o[j]:o[j + 1]].double(), gamma=g)).norm() / K.double().norm())
                  for j, K in enumerate(out))
        assert err <= 1e-5, f"grams: float32 Gram error {err:.2e} vs float64"
        extra = {"gram_rel_err": err}
    else:
        err = float(np.max(np.abs(np.asarray(out, np.float64) - exact) / exact))
        assert err <= 1e-5, f"{provider}: top-{N_COMPONENTS} eigenvalue error {err:.2e} vs float64"
        extra = {"eig_rel_err": err}
    recorder.add_round(KPCA_NAMES[provider], benchmark, **extra)
    if round == 0:  # named once; a -k subset gets the ratios whose both sides it ran
        recorder.ratio("kpca+projection: gk vs sklearn ARPACK (goal >= 6x)", KPCA_NAMES["sklearn"], KPCA_NAMES["gk"])
        recorder.ratio("kpca+projection: floor / gk (goal >= 1/1.5 = 0.67)", KPCA_NAMES["grams"], KPCA_NAMES["gk"])


# ------------------------------------------------------------------------------ batched k-means
K, ITERS = 8, 50
KMEANS_SIZE = dict(sets=200, lo=50, hi=300, dim=512)
KMEANS_SMOKE = dict(sets=6, lo=20, hi=40, dim=32)
KMEANS_PROVIDERS = ("sklearn", "reference", "native")


def _kmeans_sets(kind: str, size: dict):
    rng = np.random.default_rng(7)
    sizes = rng.integers(size["lo"], size["hi"] + 1, size["sets"])
    if kind == "separated":
        X = separated_blobs(sizes, rng, size["dim"])
    else:
        X = rng.standard_normal((int(sizes.sum()), size["dim"])).astype(np.float32)
    off = np.concatenate([[0], np.cumsum(sizes)])
    return torch.from_numpy(X), torch.from_numpy(off).to(torch.int64)


def separated_blobs(sizes, rng, dim=512):
    """Per set, K well-separated Gaussian blobs in D 512 (centres 4 sigma apart and more)."""
    parts = []
    for n in sizes:
        centres = 4.0 * rng.standard_normal((K, dim)) / np.sqrt(2.0)
        lab = rng.integers(0, K, n)
        parts.append(centres[lab] + 0.3 * rng.standard_normal((n, dim)))
    return np.concatenate(parts).astype(np.float32)


def _inertia(X, off, labels, centres):
    total = 0.0
    o = off.tolist()
    for j in range(len(o) - 1):
        Xj = X[o[j]:o[j + 1]].double()
        total += float(((Xj - centres[j].double()[labels[o[j]:o[j + 1]]]) ** 2).sum())
    return total


@pytest.fixture(scope="module")
def kmeans_data(smoke):
    size = KMEANS_SMOKE if smoke else KMEANS_SIZE
    return {kind: _kmeans_sets(kind, size) for kind in ("separated", "unstructured")}


@pytest.mark.parametrize("kind", ["separated", "unstructured"])
@pytest.mark.parametrize("round,provider", _round_robin(KMEANS_PROVIDERS))
def test_kmeans(benchmark, recorder, kmeans_data, kind, round, provider):
    X, off = kmeans_data[kind]
    o = off.tolist()
    if provider == "sklearn":
        def run():
            labels, centres = [], []
            for j in range(len(o) - 1):
                km = KMeans(K, n_init=1, max_iter=ITERS, random_state=j, algorithm="lloyd").fit(X[o[j]:o[j + 1]].numpy())
                labels.append(torch.from_numpy(km.labels_.astype(np.int64)))
                centres.append(torch.from_numpy(km.cluster_centers_))
            return torch.cat(labels), torch.stack(centres)
    else:
        def run():
            with gk.set_backend(provider):
                return gk.kmeans(X, K, offsets=off, iters=ITERS, seed=0)
    labels, centres = _timed(benchmark, f"kmeans {kind}, {len(o) - 1} sets, k {K}", run)
    inertia = _inertia(X, off, labels, centres)
    extra = {"inertia": inertia}
    if provider != "sklearn":
        sk = recorder.results.get(f"kmeans {kind}: sklearn")  # measured earlier in this round
        if sk is not None:
            extra["inertia_vs_sklearn"] = inertia / sk["inertia"]
            assert inertia <= 1.02 * sk["inertia"], (
                f"{provider}: total inertia {inertia:.6g} > 1.02 x sklearn's {sk['inertia']:.6g}")
    recorder.add_round(f"kmeans {kind}: {provider}", benchmark, **extra)
    if round == 0:
        for p in ("reference", "native"):
            recorder.ratio(f"kmeans {kind}: gk {p} vs sklearn per set (goal >= 3x)",
                           f"kmeans {kind}: sklearn", f"kmeans {kind}: {p}")


# ------------------------------------------------------------------------------------ pre-image
PRE_PROVIDERS = ("loop", "reference", "native_direct", "native_span")
PRE_NAMES = {"loop": "preimage: per-point loop (NumPy)", "reference": "preimage: gk reference (torch)",
             "native_direct": "preimage: gk native, direct form",
             "native_span": "preimage: gk native, span form (default)"}


@pytest.fixture(scope="module")
def pre_data(smoke):
    data = make_data(smoke)
    with gk.set_backend("reference"):
        Z64 = gk.preimage(data["z0"].double(), data["B"].double(), data["targets"].double(),
                          gamma=data["gamma"], method="gd", steps=STEPS, lr=data["lr"].double())
    ref_loss = float(gk.preimage_loss(Z64, data["B"].double(), data["targets"].double(),
                                      gamma=data["gamma"]).mean())
    return data, ref_loss


@pytest.mark.parametrize("round,provider", _round_robin(PRE_PROVIDERS))
def test_preimage(benchmark, recorder, pre_data, round, provider):
    data, ref_loss = pre_data
    z0, B, T, g, lr = data["z0"], data["B"], data["targets"], data["gamma"], data["lr"]
    if provider == "loop":
        if round > 0:
            pytest.skip("one round of the per-point loop (tens of seconds)")
        args = (z0.numpy(), B.numpy(), T.numpy(), np.float32(g), lr.numpy(), STEPS)
        run = lambda: torch.from_numpy(_per_point_gd(*args))  # noqa: E731
    elif provider == "reference":
        def run():
            with gk.set_backend("reference"):
                return gk.preimage(z0, B, T, gamma=g, method="gd", steps=STEPS, lr=lr)
    else:
        f = native._C.preimage_gd_span if provider == "native_span" else native._C.preimage_gd
        run = lambda: f(z0, B, T, float(g), STEPS, lr)  # noqa: E731
    Z = _timed(benchmark, f"preimage, {STEPS} gd steps", run)
    loss = float(gk.preimage_loss(Z, B, T, gamma=g).mean())
    assert abs(loss - ref_loss) <= 1e-4 * ref_loss, f"{provider}: mean loss {loss:.8g} vs float64 {ref_loss:.8g}"
    recorder.add_round(PRE_NAMES[provider], benchmark, mean_final_loss=loss, float64_loss=ref_loss)
    if round == 0:
        for p in ("reference", "native_direct", "native_span"):
            recorder.ratio(f"preimage: {p} vs per-point loop (goal >= 10x)", PRE_NAMES["loop"], PRE_NAMES[p])
        recorder.ratio("preimage: span vs direct native", PRE_NAMES["native_direct"], PRE_NAMES["native_span"])


# ----------------------------------------------------------------------------------- rbf_matmul
RM_SIZE = dict(n=8192, dim=512, p=16)
RM_SMOKE = dict(n=256, dim=32, p=4)
RM_PROVIDERS = ("numpy", "torch", "reference", "native")
RM_NAMES = {"numpy": "rbf_matmul: dense NumPy GEMM + exp + GEMM (floor)",
            "torch": "rbf_matmul: dense torch GEMM + exp + GEMM",
            "reference": "rbf_matmul: gk reference (row chunks)",
            "native": "rbf_matmul: gk native (tiles, K never stored)"}


@pytest.fixture(scope="module")
def rm_data(smoke):
    n, dim, p = (RM_SMOKE if smoke else RM_SIZE).values()
    gen = torch.Generator().manual_seed(5)
    X = torch.randn(n, dim, generator=gen) / dim ** 0.5
    Y = torch.randn(n, dim, generator=gen) / dim ** 0.5
    V = torch.randn(n, p, generator=gen)
    g = 0.5
    ref = gk.rbf_matmul(X[:512].double(), Y.double(), V.double(), gamma=g)  # float64, first 512 rows
    return X, Y, V, g, ref


@pytest.mark.parametrize("round,provider", _round_robin(RM_PROVIDERS))
def test_rbf_matmul(benchmark, recorder, rm_data, round, provider):
    X, Y, V, g, ref = rm_data
    if provider == "numpy":
        Xn, Yn, Vn = X.numpy(), Y.numpy(), V.numpy()

        def run():
            d2 = (Xn * Xn).sum(1)[:, None] + (Yn * Yn).sum(1)[None, :] - 2.0 * (Xn @ Yn.T)
            np.maximum(d2, 0.0, out=d2)
            d2 *= -g
            np.exp(d2, out=d2)
            return torch.from_numpy(d2 @ Vn)
    elif provider == "torch":
        def run():
            from geomkern.ops.rbf import _sqdist

            return _sqdist(X, Y).mul_(-g).exp_() @ V
    else:
        def run():
            with gk.set_backend(provider):
                return gk.rbf_matmul(X, Y, V, gamma=g)
    out = _timed(benchmark, f"rbf_matmul, {X.shape[0]:,}^2 x D {X.shape[1]}, p {V.shape[1]}", run)
    err = float((out[:512].double() - ref).norm() / ref.norm())
    assert err <= 1e-5, f"{provider}: relative error {err:.2e} vs float64"
    recorder.add_round(RM_NAMES[provider], benchmark, rel_err=err)
    if round == 0:
        for p in ("torch", "reference", "native"):
            recorder.ratio(f"rbf_matmul: dense NumPy floor / {p} (goal for native >= 1/1.3 = 0.77)",
                           RM_NAMES["numpy"], RM_NAMES[p])

