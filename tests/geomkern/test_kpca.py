"""kpca / kpca_transform / project_onto_basis against sklearn.decomposition.KernelPCA, per cluster
of ragged batches, for every solver.

Eigenvectors are only defined up to sign and are only as accurate as the eigengap allows
(error ~ |dKc| / gap), so clusters used for vector comparisons are drawn until the top
n_components + 1 eigenvalues of their centred Gram are separated by >= GAP * mu_0 (float64) or
GAP * n (float32: K's entries are ~1 and carry eps32 each, so |dKc| ~ eps32 n whatever mu_0 is).
Eigenvalues (Weyl: error <= |dKc|) need no such guard and are also checked on degenerate clusters.
"""
from __future__ import annotations


import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.decomposition import KernelPCA
from sklearn.metrics.pairwise import rbf_kernel

import geomkern as gk
import geomkern.ops.kpca as kpca_mod
import geomkern.ops.rbf as rbf_mod
from _oracle import DEVICES, FLOATS, TOL, assert_close_rel, entries, match_signs, offsets_from_sizes

GAP = 0.02
SOLVERS = ("auto", "dense", "subspace", "matrix_free")
seeds = st.integers(0, 2 ** 32 - 1)


def _np(t):
    return t.detach().cpu().double().numpy()


def _centred_gram(X64: np.ndarray, g: float) -> np.ndarray:
    """H K H with H = I - 11^T/n, written out as K - row means - column means + grand mean."""
    K = rbf_kernel(X64, gamma=g)
    return K - K.mean(0, keepdims=True) - K.mean(1, keepdims=True) + K.mean()


def _gap_ok(X, g, d) -> bool:
    n = X.shape[0]
    mu = np.linalg.eigvalsh(_centred_gram(_np(X), g))[::-1]
    mu = np.concatenate([mu, np.zeros(d + 1)])
    scale = mu[0] if X.dtype == torch.float64 else n
    return mu[0] > 0 and bool(((mu[:d] - mu[1:d + 1]) >= GAP * scale).all())


def separated_cluster(n, D, d, g, gen, dtype):
    """A Gaussian blob around a random centre with up to 3 dominant directions (the rest thin),
    redrawn until its top-d kernel spectrum is separated (see the module docstring)."""
    for _ in range(2000):
        scales = 0.1 * torch.rand(D, generator=gen, dtype=torch.float64)
        q = min(D, 3)
        scales[:q] = 0.5 + torch.rand(q, generator=gen, dtype=torch.float64)
        scales = scales[torch.randperm(D, generator=gen)]
        centre = 2.0 * torch.randn(D, generator=gen, dtype=torch.float64)
        X = (torch.randn(n, D, generator=gen, dtype=torch.float64) * scales + centre).to(dtype)
        if _gap_ok(X, g, d):
            return X
    raise RuntimeError(f"no cluster with a separated spectrum for n={n}, D={D}, d={d}")


def sklearn_fit(X64, d, g):
    kp = KernelPCA(n_components=d, kernel="rbf", gamma=g, eigen_solver="dense").fit(X64)
    lam = kp.eigenvalues_
    scaled = np.zeros_like(kp.eigenvectors_)
    nz = lam > 0
    scaled[:, nz] = kp.eigenvectors_[:, nz] / np.sqrt(lam[nz])
    return kp, lam, scaled


# subspace_top's documented stopping rule: every residual |Kc u - mu u| <= this * mu_1
SUBSPACE_RESIDUAL = {torch.float32: 1e-6, torch.float64: 1e-12}


def vector_tol(X64, g, d, dtype, solver) -> float:
    """Bound for eigenvector-derived quantities (alphas, scores, betas) of one cluster.

    The dense solver is held to the dtype's bound. The iterative solvers (``subspace``,
    ``matrix_free``; ``auto`` uses subspace) stop at a residual of SUBSPACE_RESIDUAL * mu_1, and
    Davis-Kahan turns a residual r into an eigenvector error <= r / gap: that is the accuracy
    they promise, below the dtype's bound unless the gap is small.
    """
    if solver == "dense":
        return TOL[dtype]
    mu = np.linalg.eigvalsh(_centred_gram(X64, g))[::-1]
    mu = np.concatenate([mu, np.zeros(d + 1)])
    gap = (mu[:d] - mu[1:d + 1]).min()
    return max(TOL[dtype], 2.0 * SUBSPACE_RESIDUAL[dtype] * mu[0] / gap)


def check_cluster(fit, X, j, g, d, solver, Z=None):
    """Every per-cluster property of ``fit`` for cluster j against the sklearn oracle."""
    off = fit.offsets.tolist()
    Xj = X[off[j]:off[j + 1]]
    n = Xj.shape[0]
    X64 = _np(Xj)
    tol = TOL[X.dtype]
    vtol = vector_tol(X64, g, d, X.dtype, solver)
    kp, lam, scaled = sklearn_fit(X64, d, g)
    assert_close_rel(fit.eigenvalues[j], lam, tol, f"cluster {j} eigenvalues")
    assert_close_rel(fit.variances[j], lam / n, tol, f"cluster {j} variances")
    a = _np(fit.alphas[off[j]:off[j + 1]])
    s = match_signs(a, scaled)
    assert_close_rel(a * s, scaled, vtol, f"cluster {j} alphas (up to sign)")
    # sum_a alpha_ai = 0: the components live in the centred feature space
    colsum, colabs = a.sum(0), np.abs(a).sum(0)
    assert (np.abs(colsum) <= vtol * np.maximum(colabs, 1e-300)).all(), f"alpha sums {colsum}"
    # unit-norm, mutually orthogonal feature-space components: alpha^T Kc alpha = I (kept ones)
    keep = lam > 0
    gram = a.T @ _centred_gram(X64, g) @ a
    assert_close_rel(gram[np.ix_(keep, keep)], np.eye(int(keep.sum())), 2 * vtol,
                     f"cluster {j} alpha^T Kc alpha")
    # null components have zero alphas
    assert (a[:, ~keep] == 0).all()
    # sign convention: each component's largest-|.| coefficient is positive
    for i in np.flatnonzero(keep):
        assert a[np.argmax(np.abs(a[:, i])), i] > 0, f"cluster {j} component {i} sign"
    # centred scores == sklearn transform. Training points: scores sqrt(mu) u, no cancellation.
    scores = gk.kpca_transform(Xj, X, fit, gamma=g, segment=j)
    assert scores.dtype == X.dtype and scores.shape == (n, d)
    assert_close_rel(_np(scores) * s, kp.transform(X64), vtol, f"cluster {j} transform of X_j")
    if Z is not None:
        # Fresh points: p(z) = (k(z, X) - colmean K) alpha cancels, so the bound is alphas' own
        # accuracy (tol) carried through that map: |dp| <= |k(Z, X) - 1 m^T| |alpha| tol.
        out = _np(gk.kpca_transform(Z, X, fit, gamma=g, segment=j)) * s
        assert_transform_close(out, kp.transform(_np(Z)), _np(Z), X64, scaled, g, vtol,
                               f"cluster {j} transform of fresh points")
    return kp, s


def assert_transform_close(out, ref, Z64, X64, scaled, g, tol, name):
    M = rbf_kernel(Z64, X64, gamma=g) - rbf_kernel(X64, gamma=g).mean(0)
    bound = tol * np.linalg.norm(M) * np.linalg.norm(scaled)
    err = np.linalg.norm(out - ref)
    assert err <= bound, f"{name}: |out - ref| = {err:.3e} > {bound:.3e} (|ref| = " \
                         f"{np.linalg.norm(ref):.3e})"


@pytest.mark.parametrize("backend", entries("kpca"), indirect=True)
@settings(max_examples=12)
@given(d=st.integers(1, 3),
       sizes=st.lists(st.sampled_from((4, 7, 33, 257)), min_size=1, max_size=4),
       D=st.sampled_from((1, 3, 10)), solver=st.sampled_from(SOLVERS),
       dtype=st.sampled_from(FLOATS), seed=seeds)
def test_kpca_ragged_batch_matches_sklearn(d, sizes, D, solver, dtype, seed, backend):
    gen = torch.Generator().manual_seed(seed)
    g = 0.25
    X = torch.cat([separated_cluster(n, D, d, g, gen, dtype) for n in sizes])
    off = offsets_from_sizes(sizes)
    fit = gk.kpca(X, off, n_components=d, gamma=g, solver=solver)
    m, N = len(sizes), X.shape[0]
    assert fit.eigenvalues.shape == (m, d) and fit.variances.shape == (m, d)
    assert fit.alphas.shape == (N, d) and fit.mean_projection.shape == (m, d)
    assert fit.alphas.dtype == dtype and torch.equal(fit.offsets, off)
    assert bool((fit.eigenvalues[:, :-1] >= fit.eigenvalues[:, 1:]).all()), "not descending"
    far = (2.0 * torch.randn(3, D, generator=gen, dtype=torch.float64)).to(dtype)
    for j in range(m):
        Xj = X[off[j]:off[j + 1]]
        near = Xj[:3] + (0.5 * torch.randn(min(3, len(Xj)), D, generator=gen,
                                           dtype=torch.float64)).to(dtype)
        check_cluster(fit, X, j, g, d, solver, Z=torch.cat([near, far]))


@pytest.mark.parametrize("backend", entries("kpca", "project_onto_basis"), indirect=True)
@settings(max_examples=12)
@given(d=st.integers(1, 3),
       sizes=st.lists(st.sampled_from((4, 7, 33, 257)), min_size=1, max_size=3),
       S=st.sampled_from((1, 7, 33)), D=st.sampled_from((1, 3, 10)),
       solver=st.sampled_from(SOLVERS), dtype=st.sampled_from(FLOATS), seed=seeds)
def test_project_onto_basis_matches_numpy_and_sklearn(d, sizes, S, D, solver, dtype, seed,
                                                      backend):
    gen = torch.Generator().manual_seed(seed)
    g = 0.25
    X = torch.cat([separated_cluster(n, D, d, g, gen, dtype) for n in sizes])
    off = offsets_from_sizes(sizes)
    B = (2.0 * torch.randn(S, D, generator=gen, dtype=torch.float64)).to(dtype)
    fit = gk.kpca(X, off, n_components=d, gamma=g, solver=solver)
    betas = gk.project_onto_basis(X, fit, B, gamma=g)
    assert betas.shape == (len(sizes), d, S) and betas.dtype == dtype
    B64 = _np(B)
    for j in range(len(sizes)):
        Xj = _np(X[off[j]:off[j + 1]])
        a = _np(fit.alphas[off[j]:off[j + 1]])
        # (1) the definition, with the fit's own alphas, in float64 numpy
        kxb = rbf_kernel(Xj, B64, gamma=g)
        ref = a.T @ kxb
        # beta sums alphas of mixed sign: the roundoff bound is the sum of magnitudes
        scale = np.abs(a).T @ kxb
        err = np.abs(_np(betas[j]) - ref)
        assert (err <= TOL[dtype] * np.maximum(scale, 1e-300)).all(), (
            f"cluster {j}: betas off by {err.max():.3e} (|alpha| k scale {scale.max():.3e})")
        # (2) betas are inner products <v_i, Phi(b_s)>: sklearn's centred transform of the basis
        # points is <v_i, Phi(b_s) - mean Phi> = beta - mean_projection, exactly (sum alpha = 0).
        kp, lam, scaled = sklearn_fit(Xj, d, g)
        s = match_signs(a, scaled)
        centred = (_np(betas[j]) - _np(fit.mean_projection[j])[:, None]).T * s
        assert_transform_close(centred, kp.transform(B64), B64, Xj, scaled, g,
                               vector_tol(Xj, g, d, dtype, solver),
                               f"cluster {j} beta - mean_projection")


# ---------------------------------------- projection: one oracle table over every backend
# project_onto_basis's kernel (betas[j] = alphas[rows of j]^T K(X[rows of j], B)) on every backend
# that has it, on the same rounded inputs (alphas of both signs, an empty segment among them),
# against kpca.projection_reference in float64. betas sum terms of both signs, so each entry is
# bounded by TOL * (|alphas|^T K): the bound the Triton tests had. (The public op on a real fit,
# against numpy and sklearn: test_project_onto_basis_matches_numpy_and_sklearn above.)
# (sizes, S, d), D = 7: one point; an empty segment between two; more components than a tile; and
# segments of 300 and 260 rows (several 128-row tiles: Triton splits a segment's row tiles over
# programs and sums the partials).
PROJECTION_ROWS = [([1], 1, 1), ([7, 0, 33], 17, 3), ([0, 70, 5], 40, 20), ([300, 0, 260], 20, 3)]


def _triton_projection(device, X, alphas, off, B, g):
    """Triton's project_onto_basis with its launcher's buffers poisoned (NaN); picklable."""
    from geomkern.backends.triton import _common
    from geomkern.backends.triton import kpca as tkpca

    orig = _common.empty
    _common.empty = lambda shape, dtype, dev: orig(shape, dtype, dev).fill_(float("nan"))
    try:
        return tkpca.project_onto_basis(X.to(device), alphas.to(device), off.to(device), B.to(device), g).cpu()
    finally:
        _common.empty = orig


def _projection_entries():
    return entries("project_onto_basis", names=("reference", "triton-cpu", "triton-cuda"))


@pytest.mark.parametrize("entry", _projection_entries())
@pytest.mark.parametrize("sizes,S,d", PROJECTION_ROWS, ids=str)
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_projection_matches_float64_on_every_backend(entry, sizes, S, d, dtype, request, seed):
    D = 7
    gen = torch.Generator().manual_seed(seed)
    X = torch.randn(sum(sizes), D, generator=gen, dtype=torch.float64).to(dtype)
    alphas = torch.randn(sum(sizes), d, generator=gen, dtype=torch.float64).to(dtype)
    B = torch.randn(S, D, generator=gen, dtype=torch.float64).to(dtype)
    off = offsets_from_sizes(sizes)
    g = float(0.2 + 1.8 * torch.rand((), generator=gen, dtype=torch.float64)) / (2.0 * D)
    if entry == "reference":
        betas = kpca_mod.projection_reference(X, alphas, off, B, g)
    else:
        betas = request.getfixturevalue("triton_run")(
            _triton_projection, "cuda" if entry == "triton-cuda" else "cpu", X, alphas, off, B, g)
    where = f"{entry} seed={seed} sizes={sizes} S={S} d={d} {dtype}"
    assert betas.shape == (len(sizes), d, S) and betas.dtype == dtype, where
    args = (X.double(), alphas.double(), off, B.double(), g)
    ref = kpca_mod.projection_reference(*args)
    scale = kpca_mod.projection_reference(args[0], args[1].abs(), *args[2:])
    err = (betas.double() - ref).abs()
    assert bool((err <= TOL[dtype] * scale.clamp_min(1e-300)).all()), (
        f"{where}: betas off by {float(err.max()):.3e} (|alpha| k scale {float(scale.max()):.3e})")
    for j, n in enumerate(sizes):
        if n == 0:
            assert bool((betas[j] == 0).all()), f"{where}: empty segment {j} has non-zero betas"


def _poison_launchers():
    """Every buffer the Triton launchers allocate starts as NaN (-1 for integers); returns the undo."""
    from geomkern.backends.triton import _common

    orig = _common.empty
    _common.empty = lambda shape, dtype, dev: orig(shape, dtype, dev).fill_(
        float("nan") if dtype.is_floating_point else -1)
    return lambda: setattr(_common, "empty", orig)


# ------------------------------------- kpca of many clusters: one oracle table over every backend
# gk.kpca (the kpca op: each size bucket's centred Grams, then torch's eigen-solve) on every
# backend that has it, launcher buffers poisoned, against numpy's float64 eigh of each cluster's
# centred Gram (sklearn's rbf_kernel) on the same rounded inputs: eigenvalues within TOL[dtype];
# alphas (up to sign) and mean_projection within TOL[dtype] from the dense solver, within
# max(TOL, the subspace stopping rule / the 0.02 relative gap) from the iterative ones;
# mean_projection sums terms of both signs, so its bound is sum_a |alpha_a| colmean_a.
# Rows (sizes, D, d, shift): the Triton test's (70 and 33 share a size bucket, 7 and 4 another:
# two fused launches; 70 points with d=3 make subspace_top iterate rather than hand over to dense),
# and the same far from the origin (shift 50: the kernels move each cluster to its mean first).
KPCA_ROWS = [([7, 70, 33, 4], 4, 3, 0.0), ([7, 70, 33, 4], 4, 3, 50.0)]
# subspace_top's convergence test: residual <= tol * mu_1; eigenvectors are then accurate to
# ~ tol / relative gap (0.02 in _gapped_blobs), eigenvalues to ~ tol^2 / gap.
_SUBSPACE_VECTOR_BOUND = {torch.float32: 1e-6 / 0.02, torch.float64: 1e-9 / 0.02}


def _gapped_blobs(sizes, D, d, g, gen, dtype, shift):
    """Anisotropic blobs whose top-d centred-kernel spectrum is separated as the module docstring
    says (_gap_ok, on the rounded points: gaps >= GAP * mu_0 in float64, >= GAP * n in float32),
    so eigenvectors are as accurate as the Gram (error ~ eps |Kc| / gap). With the float64 rule
    for float32 too, a 4-point cluster's alphas erred 1.08e-5 (bound 1e-5) on 1 seed in ~137."""
    out = []
    for n in sizes:
        for _ in range(200):
            X = (torch.randn(n, D, generator=gen, dtype=torch.float64)
                 * (0.2 + 1.5 * torch.rand(D, generator=gen, dtype=torch.float64))
                 + 2.0 * torch.randn(D, generator=gen, dtype=torch.float64) + shift).to(dtype)
            if _gap_ok(X, g, d):
                out.append(X)
                break
        else:
            raise RuntimeError(f"no cluster with a separated spectrum (n={n}, D={D}, d={d})")
    return torch.cat(out)


def _kpca_fit(device, backend, X, off, d, g, solver):
    """gk.kpca routed to ``backend`` (buffers poisoned where it is Triton): eigenvalues, alphas and
    mean_projection on the CPU; picklable, so Triton's CPU case runs in the interpreter worker."""
    undo = _poison_launchers() if backend == "triton" else (lambda: None)
    try:
        X, off = X.to(device), off.to(device)
        with gk.set_backend(backend):
            assert gk._dispatch.resolve("kpca", X.device.type) == backend
            fit = gk.kpca(X, off, n_components=d, gamma=g, solver=solver)
    finally:
        undo()
    return fit.eigenvalues.cpu(), fit.alphas.cpu(), fit.mean_projection.cpu()


@pytest.mark.parametrize("entry", entries("kpca", names=("reference", "reference-cuda", "triton-cpu", "triton-cuda")))
@pytest.mark.parametrize("sizes,D,d,shift", KPCA_ROWS, ids=str)
@pytest.mark.parametrize("solver", ("dense", "subspace", "auto"))
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_kpca_of_many_clusters_matches_float64_on_every_backend(entry, sizes, D, d, shift, solver, dtype,
                                                                request, seed):
    gen = torch.Generator().manual_seed(seed)
    g = 1.0 / (2.0 * D)
    X = _gapped_blobs(sizes, D, d, g, gen, dtype, shift)
    off = offsets_from_sizes(sizes)
    backend, device = entry.split("-")[0], "cuda" if entry.endswith("-cuda") else "cpu"
    if backend == "triton":
        mu, alphas, mean_proj = request.getfixturevalue("triton_run")(
            _kpca_fit, device, backend, X, off, d, g, solver)
    else:
        mu, alphas, mean_proj = _kpca_fit(device, backend, X, off, d, g, solver)
    where = f"{entry} seed={seed} sizes={sizes} D={D} d={d} shift={shift} {solver} {dtype}"
    tol = TOL[dtype] if solver == "dense" else max(TOL[dtype], _SUBSPACE_VECTOR_BOUND[dtype])
    o = off.tolist()
    eig = [np.linalg.eigh(_centred_gram(_np(X[o[j]:o[j + 1]]), g)) for j in range(len(sizes))]
    assert_close_rel(mu, np.stack([w[::-1][:d] for w, _ in eig]), TOL[dtype], f"{where}: eigenvalues")
    for j, (w, U) in enumerate(eig):
        X64 = _np(X[o[j]:o[j + 1]])
        ref = U[:, ::-1][:, :d] / np.sqrt(w[::-1][:d])
        a = _np(alphas[o[j]:o[j + 1]])
        sign = match_signs(a, ref)
        assert_close_rel(a * sign, ref, tol, f"{where}: cluster {j} alphas (up to sign)")
        colmeans = rbf_kernel(X64, gamma=g).mean(0)
        scale = colmeans @ np.abs(ref)
        err = np.abs(_np(mean_proj[j]) * sign - colmeans @ ref)
        assert (err <= tol * scale).all(), (
            f"{where}: cluster {j} mean_projection off by {err.tolist()} (scale {scale.tolist()})")


# ---------------------------------- segmented Grams: one oracle table over every backend
# The zero-padded (m, nmax, nmax) Grams of all segments (empty ones allowed): Triton's
# segmented_gram (plain or double-centred, launcher buffers poisoned) and, centred, the
# reference's centred_grams_reference (the kpca op's Grams; it has no plain form), against
# float64 gram_reference per segment on the same rounded inputs (points 1.5 N(0, 1) + shift).
# Zero padding; plain Grams with an exact unit diagonal; Triton's exactly symmetric. Tolerance
# TOL[dtype]; the reference's centring cancels up to |K| / |HKH| digits, so its bound is
# TOL * max(1, |K| / |HKH|), as for the public rbf_gram (test_rbf.py).
# Rows (sizes, D, shift): the Triton test's (one point; empty segments first and between), a
# segment over a 128-row tile, and one far from the origin (shift 50).
SEGMENTED_GRAM_ROWS = [([1], 6, 4.0), ([7, 0, 33, 2], 6, 4.0), ([0, 40, 17], 6, 4.0),
                       ([5, 129, 0, 3], 3, 4.0), ([9, 20], 5, 50.0)]


def _triton_segmented_gram(device, X, off, g, center):
    """Triton's segmented_gram with its launcher's buffers poisoned; picklable."""
    from geomkern.backends.triton import kpca as tkpca

    undo = _poison_launchers()
    try:
        return tkpca.segmented_gram(X.to(device), off.to(device), g, center).cpu()
    finally:
        undo()


def _reference_segmented_gram(X, off, g):
    """centred_grams_reference over the non-empty segments (one bucket, largest first), laid out
    as segmented_gram's (m, nmax, nmax)."""
    o = off.tolist()
    sizes = [o[j + 1] - o[j] for j in range(len(o) - 1)]
    bucket = sorted((j for j in range(len(sizes)) if sizes[j]), key=lambda j: -sizes[j])
    Kc, _ = kpca_mod.centred_grams_reference(X, o, bucket, g)
    out = torch.zeros(len(sizes), max(sizes), max(sizes), dtype=X.dtype)
    for t, j in enumerate(bucket):
        out[j] = Kc[t]
    return out


def _segmented_gram_entries():
    """(center, entry): plain Grams on Triton, centred ones on the reference and Triton."""
    return ([pytest.param(False, *e.values, id="plain-" + e.id, marks=e.marks)
             for e in entries("kpca", names=("triton-cpu", "triton-cuda"))]
            + [pytest.param(True, *e.values, id="centred-" + e.id, marks=e.marks) for e in _projection_entries()])


@pytest.mark.parametrize("center,entry", _segmented_gram_entries())
@pytest.mark.parametrize("sizes,D,shift", SEGMENTED_GRAM_ROWS, ids=str)
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_segmented_gram_matches_float64_on_every_backend(entry, sizes, D, shift, center, dtype, request, seed):
    gen = torch.Generator().manual_seed(seed)
    X = (torch.randn(sum(sizes), D, generator=gen, dtype=torch.float64) * 1.5 + shift).to(dtype)
    off = offsets_from_sizes(sizes)
    g = float(0.2 + 1.8 * torch.rand((), generator=gen, dtype=torch.float64)) / (2.0 * D)
    if entry == "reference":
        K = _reference_segmented_gram(X, off, g)
    else:
        K = request.getfixturevalue("triton_run")(
            _triton_segmented_gram, "cuda" if entry == "triton-cuda" else "cpu", X, off, g, center)
    where = f"{entry} seed={seed} sizes={sizes} D={D} shift={shift} center={center} {dtype}"
    nmax = max(sizes)
    assert K.shape == (len(sizes), nmax, nmax) and K.dtype == dtype, where
    o = off.tolist()
    for j, n in enumerate(sizes):
        ref = torch.zeros(nmax, nmax, dtype=torch.float64)
        plain = rbf_mod.gram_reference(X[o[j]:o[j + 1]].double(), None, g, False) if n else ref[:0, :0]
        if n:
            ref[:n, :n] = rbf_mod.gram_reference(X[o[j]:o[j + 1]].double(), None, g, center)
        if entry != "reference":
            assert torch.equal(K[j], K[j].T), f"{where}: segment {j} Gram is not exactly symmetric"
        assert bool((K[j, n:] == 0).all() and (K[j, :, n:] == 0).all()), f"{where}: segment {j} padding"
        if not center and n:
            assert bool((K[j, :n, :n].diagonal() == 1).all()), f"{where}: segment {j} diagonal"
        tol = TOL[dtype]
        if entry == "reference" and n:
            tol *= max(1.0, float(plain.norm() / ref.norm().clamp_min(1e-300)))
        assert_close_rel(K[j], ref, tol, f"{where}: segment {j} (n={n}) Gram")


# segment_means (Triton's kernel for the per-segment shifts its Grams start from; the reference
# takes each cluster's torch mean, the oracle here) against float64 means of the same rounded
# rows, launcher buffers poisoned, in the compute dtype (float32, float64 for float64), TOL[dtype].
# Rows (sizes, D, scale, shift): the Triton test's (0, 1, one whole 256-row chunk, 257 and 700
# rows: several chunks per segment, ragged last chunks, chunks past a short segment's end; D 130
# crosses a column tile), and a small one far from the origin (shift 1e3).
SEGMENT_MEANS_ROWS = [([0, 1, 256, 257, 700], 130, 2.0, -3.0), ([3, 0, 40], 5, 1.0, 1e3)]


def _triton_segment_means(device, X, off):
    from geomkern.backends.triton import kpca as tkpca

    undo = _poison_launchers()
    try:
        off = off.to(device)
        return tkpca.segment_means(X.to(device), off[:-1], off[1:], int((off[1:] - off[:-1]).max())).cpu()
    finally:
        undo()


@pytest.mark.parametrize("entry", entries("kpca", names=("triton-cpu", "triton-cuda")))
@pytest.mark.parametrize("sizes,D,scale,shift", SEGMENT_MEANS_ROWS, ids=str)
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_segment_means_match_float64_on_every_backend(entry, sizes, D, scale, shift, dtype, request, seed):
    gen = torch.Generator().manual_seed(seed)
    X = (torch.randn(sum(sizes), D, generator=gen, dtype=torch.float64) * scale + shift).to(dtype)
    off = offsets_from_sizes(sizes)
    M = request.getfixturevalue("triton_run")(
        _triton_segment_means, "cuda" if entry == "triton-cuda" else "cpu", X, off)
    where = f"{entry} seed={seed} sizes={sizes} D={D} shift={shift} {dtype}"
    assert M.shape == (len(sizes), D) and M.dtype == (torch.float64 if dtype == torch.float64 else torch.float32), where
    o = off.tolist()
    for j, n in enumerate(sizes):
        ref = X[o[j]:o[j + 1]].double().mean(0) if n else torch.zeros(D, dtype=torch.float64)
        assert_close_rel(M[j], ref, TOL[dtype], f"{where}: segment {j} (n={n}) mean")


@pytest.mark.parametrize("solver", ["dense", "subspace", "matrix_free"])
def test_kpca_deterministic_and_permutation_invariant(solver, gen):
    d, D, g = 3, 5, 0.25
    sizes = [7, 257, 33, 7, 120, 4]
    clusters = [separated_cluster(n, D, d, g, gen, torch.float64) for n in sizes]
    X, off = torch.cat(clusters), offsets_from_sizes(sizes)
    f1 = gk.kpca(X, off, n_components=d, gamma=g, solver=solver)
    f2 = gk.kpca(X, off, n_components=d, gamma=g, solver=solver)
    for name in ("eigenvalues", "variances", "alphas", "mean_projection"):
        assert torch.equal(getattr(f1, name), getattr(f2, name)), f"{name} differs between calls"
    perm = [4, 0, 5, 2, 1, 3]
    Xp = torch.cat([clusters[p] for p in perm])
    offp = offsets_from_sizes([sizes[p] for p in perm])
    fp = gk.kpca(Xp, offp, n_components=d, gamma=g, solver=solver)
    for new, old in enumerate(perm):
        assert_close_rel(fp.eigenvalues[new], f1.eigenvalues[old], 1e-12)
        assert_close_rel(fp.mean_projection[new], f1.mean_projection[old], 1e-12)
        # same signs too: the sign convention does not depend on batch position
        assert_close_rel(fp.alphas[offp[new]:offp[new + 1]], f1.alphas[off[old]:off[old + 1]],
                         1e-12)


def test_zero_padding_keeps_top_eigenpairs(gen):
    """diag(Kc, 0) has Kc's positive eigenpairs, eigenvectors padded with zeros."""
    n, pad, d, g = 33, 40, 3, 0.25
    X = separated_cluster(n, 5, d, g, gen, torch.float64)
    Kc = torch.from_numpy(_centred_gram(_np(X), g))
    Kp = torch.zeros(n + pad, n + pad, dtype=torch.float64)
    Kp[:n, :n] = Kc
    w, V = torch.linalg.eigh(Kc)
    wp, Vp = torch.linalg.eigh(Kp)
    w, V, wp, Vp = w.flip(0)[:d], V.flip(1)[:, :d], wp.flip(0)[:d], Vp.flip(1)[:, :d]
    assert_close_rel(wp, w, 1e-12, "padded eigenvalues")
    assert float(Vp[n:].abs().max()) <= 1e-12, "padding rows of top eigenvectors are not 0"
    s = match_signs(Vp[:n], V)
    assert_close_rel(_np(Vp[:n]) * s, V, 1e-10, "padded eigenvectors")


@pytest.mark.parametrize("solver", ["dense", "subspace", "matrix_free"])
@pytest.mark.parametrize("dtype", FLOATS)
def test_kpca_batch_of_very_different_sizes_equals_each_alone(dtype, solver, gen):
    d, D, g = 2, 4, 0.25
    sizes = [257, 3, 130, 9, 64, 33, 4]
    clusters = [separated_cluster(n, D, d, g, gen, dtype) for n in sizes]
    X, off = torch.cat(clusters), offsets_from_sizes(sizes)
    fit = gk.kpca(X, off, n_components=d, gamma=g, solver=solver)
    for j, Xj in enumerate(clusters):
        alone = gk.kpca(Xj, offsets_from_sizes([sizes[j]]), n_components=d, gamma=g,
                        solver=solver)
        # both are within vector_tol of the exact answer, so within twice that of each other
        vtol = 2 * vector_tol(_np(Xj), g, d, dtype, solver)
        assert_close_rel(fit.eigenvalues[j], alone.eigenvalues[0], TOL[dtype])
        assert_close_rel(fit.alphas[off[j]:off[j + 1]], alone.alphas, vtol)
        assert_close_rel(fit.mean_projection[j], alone.mean_projection[0], vtol)


@pytest.mark.parametrize("device", DEVICES)
def test_kpca_on_device(device, gen):
    d, g, sizes = 2, 0.2, [7, 33]
    X = torch.cat([separated_cluster(n, 3, d, g, gen, torch.float64) for n in sizes])
    off = offsets_from_sizes(sizes)
    fit = gk.kpca(X.to(device), off.to(device), n_components=d, gamma=g)
    assert fit.alphas.device.type == device and fit.eigenvalues.device.type == device
    cpu = gk.kpca(X, off, n_components=d, gamma=g)
    assert_close_rel(fit.alphas, cpu.alphas, TOL[torch.float64])
    B = torch.randn(5, 3, generator=gen, dtype=torch.float64)
    betas = gk.project_onto_basis(X.to(device), fit, B.to(device), gamma=g)
    assert betas.device.type == device
    assert_close_rel(betas, gk.project_onto_basis(X, cpu, B, gamma=g), TOL[torch.float64])


# ----- degenerate clusters: no NaN, and still what sklearn says ---------------------------------

def _no_nan(fit):
    for name in ("eigenvalues", "variances", "alphas", "mean_projection"):
        t = getattr(fit, name)
        assert bool(torch.isfinite(t).all()), f"{name} has NaN/Inf"


@pytest.mark.parametrize("solver", SOLVERS)
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("D,scale", [(10, 3.0), (3, 0.5), (64, 1.0)])
def test_kpca_identical_points(dtype, D, scale, solver, gen):
    """A cluster of identical points has zero feature-space variance: no component at all."""
    n, d, g = 40, 3, 0.25
    x = (scale * torch.randn(1, D, generator=gen, dtype=torch.float64) + 5.0).to(dtype)
    other = separated_cluster(7, D, d, g, gen, dtype)
    X = torch.cat([x.repeat(n, 1), other])
    fit = gk.kpca(X, offsets_from_sizes([n, 7]), n_components=d, gamma=g, solver=solver)
    _no_nan(fit)
    # sklearn agrees up to its own roundoff (it Grams the uncentred points: ~eps |x|^2 noise)
    kp, lam, scaled = sklearn_fit(_np(X[:n]), d, g)
    assert (np.abs(lam) <= 1e-12 * n).all()
    # exactly: every point is the mean, so there is no component, and every score is 0
    assert torch.equal(fit.eigenvalues[0], torch.zeros(d, dtype=dtype))
    assert torch.equal(fit.variances[0], torch.zeros(d, dtype=dtype))
    assert torch.equal(fit.alphas[:n], torch.zeros(n, d, dtype=dtype))
    assert torch.equal(fit.mean_projection[0], torch.zeros(d, dtype=dtype))
    Z = torch.cat([X[:n], torch.randn(4, D, generator=gen, dtype=torch.float64).to(dtype)])
    scores = gk.kpca_transform(Z, X, fit, gamma=g, segment=0)
    assert torch.equal(scores, torch.zeros(n + 4, d, dtype=dtype))
    B = torch.randn(5, D, generator=gen, dtype=torch.float64).to(dtype)
    assert torch.equal(gk.project_onto_basis(X, fit, B, gamma=g)[0], torch.zeros(d, 5, dtype=dtype))
    # the other cluster of the batch is unaffected
    check_cluster(fit, X, 1, g, d, solver)


@pytest.mark.parametrize("solver", SOLVERS)
@pytest.mark.parametrize("dtype", FLOATS)
def test_kpca_many_duplicates_rank_deficient(dtype, solver, gen):
    """3 distinct points repeated 11 times: Kc has rank 2, so component 3 and 4 are null."""
    D, d, g = 10, 4, 0.05
    P = (torch.randn(3, D, generator=gen, dtype=torch.float64) * torch.tensor([1.0, 2.0, 3.0],
         dtype=torch.float64).unsqueeze(1)).to(dtype)
    X = P.repeat_interleave(11, 0)[torch.randperm(33, generator=gen)]
    fit = gk.kpca(X, offsets_from_sizes([33]), n_components=d, gamma=g, solver=solver)
    _no_nan(fit)
    kp, lam, scaled = sklearn_fit(_np(X), d, g)
    assert_close_rel(fit.eigenvalues[0], lam, TOL[dtype], "eigenvalues")
    assert (lam[2:] == 0).all() and torch.equal(fit.eigenvalues[0, 2:], torch.zeros(2, dtype=dtype))
    assert torch.equal(fit.alphas[:, 2:], torch.zeros(33, 2, dtype=dtype))
    if _gap_ok(X, g, 2):  # the two real components are separated: compare them fully
        check_cluster(gk.kpca(X, offsets_from_sizes([33]), n_components=2, gamma=g,
                              solver=solver), X, 0, g, 2, solver)


@pytest.mark.parametrize("solver", SOLVERS)
@pytest.mark.parametrize("dtype", FLOATS)
def test_kpca_points_on_a_line(dtype, solver, gen):
    """Collinear points in D=10 (n > rank of the data): the RBF spectrum decays fast."""
    n, D, d, g = 40, 10, 3, 0.5
    u = torch.randn(D, generator=gen, dtype=torch.float64)
    t = torch.rand(n, 1, generator=gen, dtype=torch.float64) * 2.0
    X = (t * u / u.norm() + torch.randn(D, generator=gen, dtype=torch.float64)).to(dtype)
    fit = gk.kpca(X, offsets_from_sizes([n]), n_components=d, gamma=g, solver=solver)
    _no_nan(fit)
    kp, lam, _ = sklearn_fit(_np(X), d, g)
    assert_close_rel(fit.eigenvalues[0], lam, TOL[dtype], "eigenvalues")
    if _gap_ok(X, g, d):
        check_cluster(fit, X, 0, g, d, solver)


@pytest.mark.parametrize("dtype", FLOATS)
def test_kpca_n_components_equal_to_cluster_size(dtype, gen):
    """n = d: the last centred-Gram eigenvalue is 0 (Kc 1 = 0), so that component is null;
    a 1-point cluster has no component at all."""
    D, g = 3, 0.2
    X = torch.cat([separated_cluster(3, D, 2, g, gen, dtype),
                   torch.randn(1, D, generator=gen, dtype=torch.float64).to(dtype),
                   separated_cluster(7, D, 2, g, gen, dtype)])
    fit = gk.kpca(X, offsets_from_sizes([3, 1, 7]), n_components=1, gamma=g)
    _no_nan(fit)
    assert fit.eigenvalues[1, 0] == 0 and bool((fit.alphas[3:4] == 0).all())
    fit3 = gk.kpca(X[:3], offsets_from_sizes([3]), n_components=3, gamma=g)
    _no_nan(fit3)
    kp, lam, scaled = sklearn_fit(_np(X[:3]), 3, g)
    assert_close_rel(fit3.eigenvalues[0], lam, TOL[dtype])
    assert fit3.eigenvalues[0, 2] == 0 and bool((fit3.alphas[:, 2] == 0).all())
    s = match_signs(fit3.alphas, scaled)
    assert_close_rel(_np(fit3.alphas) * s, scaled, TOL[dtype])



@pytest.mark.parametrize("solver", ["dense", "subspace", "matrix_free"])
@pytest.mark.parametrize("dtype", FLOATS)
def test_kpca_null_direction_of_many_small_clusters(dtype, solver, gen):
    """Kc 1 = 0 exactly: the constant vector is never a component. Roundoff gives its eigenvalue
    ~ n eps (not ~ n eps mu_1), so a relative-only cut-off kept it as a component with alphas
    ~ 1/sqrt(eps) and column sum ~ sqrt(n/eps) for a few percent of tight float32 clusters."""
    m, n, D = 200, 3, 3
    X = (torch.randn(m, n, D, generator=gen, dtype=torch.float64)
         * torch.rand(m, 1, 1, generator=gen, dtype=torch.float64) * 2.0
         + 3.0 * torch.randn(m, 1, D, generator=gen, dtype=torch.float64)).reshape(m * n, D)
    X = X.to(dtype)
    off = offsets_from_sizes([n] * m)
    fit = gk.kpca(X, off, n_components=n, gamma=0.2, solver=solver)
    _no_nan(fit)
    assert torch.equal(fit.eigenvalues[:, n - 1], torch.zeros(m, dtype=dtype))
    assert torch.equal(fit.alphas[:, n - 1], torch.zeros(m * n, dtype=dtype))
    B = torch.randn(4, D, generator=gen, dtype=torch.float64).to(dtype)
    betas = gk.project_onto_basis(X, fit, B, gamma=0.2)
    assert torch.equal(betas[:, n - 1], torch.zeros(m, 4, dtype=dtype))


def test_kpca_transform_empty_and_per_row_segments(gen):
    d, g, sizes = 2, 0.25, [7, 33, 4]
    X = torch.cat([separated_cluster(n, 3, d, g, gen, torch.float64) for n in sizes])
    fit = gk.kpca(X, offsets_from_sizes(sizes), n_components=d, gamma=g)
    out = gk.kpca_transform(X[:0], X, fit, gamma=g, segment=1)
    assert out.shape == (0, d)
    Z = torch.randn(6, 3, generator=gen, dtype=torch.float64)
    seg = torch.tensor([2, 0, 1, 1, 0, 2])
    mixed = gk.kpca_transform(Z, X, fit, gamma=g, segment=seg)
    for r in range(6):
        one = gk.kpca_transform(Z[r:r + 1], X, fit, gamma=g, segment=int(seg[r]))
        assert_close_rel(mixed[r:r + 1], one, TOL[torch.float64])


@pytest.mark.slow
@pytest.mark.parametrize("solver", ["auto", "matrix_free"])
@pytest.mark.parametrize("dtype", FLOATS)
def test_kpca_large_clusters_match_sklearn(dtype, solver, gen):
    """Realistic FedMC patch sizes (the iterative solvers' regime) against sklearn."""
    d, g, sizes = 2, 0.25, [1500, 700]
    X = torch.cat([separated_cluster(n, 3, d, g, gen, dtype) for n in sizes])
    fit = gk.kpca(X, offsets_from_sizes(sizes), n_components=d, gamma=g, solver=solver)
    Z = X[:5] + 0.3
    for j in range(len(sizes)):
        check_cluster(fit, X, j, g, d, solver, Z=Z)


@pytest.mark.parametrize("dtype", FLOATS)
def test_auto_goes_matrix_free_over_the_gram_budget(dtype, gen, monkeypatch):
    """A size bucket whose stored Grams exceed GRAM_BUDGET_BYTES is solved without storing
    them (no (n, n) tensor is allocated by the solver), with the same accuracy."""
    d, g, sizes = 3, 0.25, [260, 150, 9]
    X = torch.cat([separated_cluster(n, 4, d, g, gen, dtype) for n in sizes])
    off = offsets_from_sizes(sizes)
    monkeypatch.setattr(kpca_mod, "GRAM_BUDGET_BYTES", 100 * 100 * 8)
    calls = []
    real = kpca_mod._matrix_free_cluster
    monkeypatch.setattr(kpca_mod, "_matrix_free_cluster", lambda Xj, *a: calls.append(len(Xj)) or real(Xj, *a))
    fit = gk.kpca(X, off, n_components=d, gamma=g)
    assert sorted(calls) == [150, 260]  # the 9-point cluster's bucket fits the budget
    for j in range(len(sizes)):
        check_cluster(fit, X, j, g, d, "auto")


def test_block_krylov_top_on_a_known_spectrum():
    """Operator-only interface: a diagonal operator in a random basis, batch of two."""
    gen = torch.Generator().manual_seed(5)
    n, d = 300, 4
    Q = torch.linalg.qr(torch.randn(2, n, n, generator=gen, dtype=torch.float64)).Q
    lam = torch.stack([0.9 ** torch.arange(n, dtype=torch.float64), 0.8 ** torch.arange(n, dtype=torch.float64)])
    A = Q @ (lam.unsqueeze(-1) * Q.transpose(1, 2))
    mu, U = kpca_mod.block_krylov_top(lambda Y: A @ Y, 2, n, d, device="cpu", tol=1e-12)
    assert_close_rel(mu, lam[:, :d], 1e-12, "eigenvalues")
    cos = (U * Q[:, :, :d]).sum(1).abs()
    assert_close_rel(cos, torch.ones(2, d, dtype=torch.float64), 1e-12, "eigenvectors up to sign")
    # an unreachable tolerance with one pass allowed reports failure instead of a wrong answer
    assert kpca_mod.block_krylov_top(lambda Y: A @ Y, 2, n, d, device="cpu", tol=1e-30, max_restarts=1) is None


@pytest.mark.parametrize("dtype", FLOATS)
def test_kpca_far_from_origin(dtype, gen):
    """RBF kernels are translation invariant, and so must the accuracy be: a cluster centred at
    100 * (1, ..., 1) (|x|^2 ~ 8e4) is measured from its own mean, not through
    |x|^2 + |y|^2 - 2<x, y> at the origin (that cost ~gamma eps |x|^2 ~ 1e-3 in float32)."""
    d, D, g = 2, 8, 0.25
    sizes = [33, 7]
    X = torch.cat([separated_cluster(n, D, d, g, gen, dtype) for n in sizes])
    X = (X.double() + 100.0).to(dtype)
    if dtype == torch.float32 and not all(_gap_ok(X[a:b], g, d) for a, b in ((0, 33), (33, 40))):
        pytest.skip("float32 rounding of the shifted points closed a spectral gap")
    off = offsets_from_sizes(sizes)
    fit = gk.kpca(X, off, n_components=d, gamma=g, solver="dense")
    Z = X[:4] + 0.5
    B = (X[30:38].double() + 0.3).to(dtype)
    betas = gk.project_onto_basis(X, fit, B, gamma=g)
    for j in range(len(sizes)):
        kp, s = check_cluster(fit, X, j, g, d, "dense", Z=Z)
        Xj = _np(X[off[j]:off[j + 1]])
        a = _np(fit.alphas[off[j]:off[j + 1]])
        kxb = rbf_kernel(Xj, _np(B), gamma=g)
        err = np.abs(_np(betas[j]) - a.T @ kxb)
        assert (err <= TOL[dtype] * np.abs(a).T @ kxb).all(), f"betas off by {err.max():.3e}"


def test_auto_picks_dense_below_the_measured_crossover(monkeypatch):
    """auto: dense eigh below DENSE_BELOW_BLOCKS Krylov blocks (k = max(2d, d + 8)), Krylov above."""
    seen = []
    real_dense, real_sub = kpca_mod.dense_top, kpca_mod.subspace_top
    monkeypatch.setattr(kpca_mod, "dense_top", lambda Kc, d: seen.append(("dense", Kc.shape[-1])) or real_dense(Kc, d))
    monkeypatch.setattr(kpca_mod, "subspace_top", lambda Kc, d: seen.append(("krylov", Kc.shape[-1])) or real_sub(Kc, d))
    edge = kpca_mod.DENSE_BELOW_BLOCKS * 10  # d = 2: k = 10
    for n in (edge - 1, edge):
        A = torch.randn(n, 5, dtype=torch.float64)
        kpca_mod.auto_top(A.unsqueeze(0) @ A.T.unsqueeze(0), 2)
    assert seen == [("dense", edge - 1), ("krylov", edge)]


def test_kpca_offsets_optional_and_segment_defaults_for_one_cluster(gen):
    """As sklearn's KernelPCA(...).fit(X).transform(Z): no offsets means one cluster of all rows,
    and the transform of a one-cluster fit needs no segment; the results are those of the
    explicit [0, N] call bit for bit. A fit of several clusters still needs segment."""
    d, g = 3, 0.25
    X = separated_cluster(41, 4, d, g, gen, torch.float64)
    Z = torch.randn(5, 4, generator=gen, dtype=torch.float64)
    explicit = gk.kpca(X, offsets_from_sizes([41]), n_components=d, gamma=g)
    for fit in (gk.kpca(X, n_components=d, gamma=g), gk.kpca(X, None, n_components=d, gamma=g)):
        assert fit.offsets.tolist() == [0, 41] and fit.offsets.dtype == torch.int64
        for name in ("eigenvalues", "variances", "alphas", "mean_projection", "fingerprint"):
            assert torch.equal(getattr(fit, name), getattr(explicit, name)), name
        assert torch.equal(gk.kpca_transform(Z, X, fit, gamma=g),
                           gk.kpca_transform(Z, X, explicit, gamma=g, segment=0))
    two = gk.kpca(X, offsets_from_sizes([20, 21]), n_components=d, gamma=g)
    with pytest.raises(ValueError, match="segment is required: fit has 2 clusters"):
        gk.kpca_transform(Z, X, two, gamma=g)
    with pytest.raises(ValueError, match="segment is required"):
        gk.kpca_transform(Z[:0], X, two, gamma=g)


# ------------------------------------------------------------------------------------------------
# Folded from test_kpca_gram_tiles.py:
# The kpca Gram built from upper-triangle row blocks straight into its bucket slot
# (geomkern.ops.kpca.centred_gram_into over geomkern.ops.rbf.sym_gram_into, which rbf_gram's
# symmetric case shares) and the thread-count-independent fit fingerprint (issue 20).
#
# Small GRAM_TILE_ROWS (monkeypatched) so odd and ragged sizes cover every block layout in a fast
# test: one block, several, a last block of exactly the short-GEMM limit (_MKL_ROWS rows) and one
# of fewer (merged into the block before it).

TILE = 16
SIZES = (1, 5, 11, 12, 16, 17, 27, 28, 45, 100)  # TILE + 11 = 27 merges, TILE + 12 = 28 does not


@pytest.fixture
def small_tiles(monkeypatch):
    monkeypatch.setattr(rbf_mod, "GRAM_TILE_ROWS", TILE)


def _threads(n):
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    return before


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("n", SIZES)
def test_centred_gram_into_its_slot_matches_float64(small_tiles, n, dtype, gen):
    D, g, pad = 7, 0.3, 3
    X = (torch.randn(n, D, generator=gen, dtype=torch.float64) + 3.0).to(dtype)
    buf = torch.full((n + pad, n + pad + 2), float("nan"), dtype=dtype)
    colmean = kpca_mod.centred_gram_into(buf[:n, 1:n + 1], X, g)
    K = rbf_kernel(X.double().numpy(), gamma=g)
    Kc = K - K.mean(0, keepdims=True) - K.mean(1, keepdims=True) + K.mean()
    assert_close_rel(buf[:n, 1:n + 1], Kc, TOL[dtype], "H K H in the slot")
    assert_close_rel(colmean, K.mean(0), TOL[dtype], "column means of K")
    # nothing outside the slot was written
    outside = torch.ones_like(buf, dtype=torch.bool)
    outside[:n, 1:n + 1] = False
    assert bool(buf[outside].isnan().all())


@pytest.mark.parametrize("dtype", FLOATS)
def test_the_uncentred_blocks_are_exactly_symmetric_with_a_unit_diagonal(small_tiles, dtype, gen, monkeypatch):
    """Before centring, K is the mirrored upper triangle: bitwise symmetric, unit diagonal."""
    n, D, g = 45, 6, 0.2
    X = torch.randn(n, D, generator=gen, dtype=dtype)
    captured = {}
    real_mean = torch.Tensor.mean

    def spy(self, *args, **kwargs):  # the row means are taken of the finished, uncentred K
        if self.shape == (n, n) and "K" not in captured:
            captured["K"] = self.clone()
        return real_mean(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "mean", spy)
    kpca_mod.centred_gram_into(torch.empty(n, n, dtype=dtype), X, g)
    monkeypatch.undo()
    K = captured["K"]
    assert torch.equal(K, K.T)
    assert torch.equal(K.diagonal(), torch.ones(n, dtype=dtype))
    assert_close_rel(K, rbf_kernel(X.double().numpy(), gamma=g), TOL[dtype], "K")


@pytest.mark.parametrize("solver", ["auto", "dense", "subspace"])
def test_kpca_of_ragged_clusters_has_the_same_bits_at_1_and_2_threads(small_tiles, solver, gen):
    """Blocks of 5-11 rows (a whole small cluster) go through the padded GEMM, longer clusters
    never end in such a block, so the fit and the projection do not depend on the thread count.
    subspace: a Krylov block of k = d + 8 = 11 columns; its small products (MKL's GEMMs of 5-11
    rows gave other alphas at 2 threads before block_krylov_top ran them on one thread)."""
    sizes = [7, 27, 100, 45, 11, 64]
    d, D, g = 3, 8, 0.1
    X = torch.randn(sum(sizes), D, generator=gen)
    B = torch.randn(9, D, generator=gen)
    off = offsets_from_sizes(sizes)
    out = {}
    before = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            fit = gk.kpca(X, off, n_components=d, gamma=g, solver=solver)
            out[n] = (fit, gk.project_onto_basis(X, fit, B, gamma=g))
    finally:
        torch.set_num_threads(before)
    for name in ("eigenvalues", "alphas", "mean_projection", "fingerprint"):
        assert torch.equal(getattr(out[1][0], name), getattr(out[2][0], name)), name
    assert torch.equal(out[1][1], out[2][1])


def test_fingerprint_does_not_depend_on_the_thread_count(gen):
    """200,000 rows: a single sum over X splits by thread count and its bits differed at 1 and
    2 threads; a fit made at one thread count must be recognised at another."""
    X = torch.randn(200_000, 64, generator=gen)
    before = torch.get_num_threads()
    try:
        fps = []
        for n in (1, 2):
            torch.set_num_threads(n)
            fps.append(kpca_mod.fingerprint(X))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(fps[0], fps[1])
    # still a checksum: one value, or two rows swapped, change it
    Y = X.clone()
    Y[123, 4] += 1e-3
    assert not torch.equal(kpca_mod.fingerprint(Y), fps[0])
    Y = X.clone()
    Y[[5, 6]] = X[[6, 5]]
    assert not torch.equal(kpca_mod.fingerprint(Y), fps[0])


@pytest.mark.slow  # ~10-20 s on the shared 2-core machine
def test_a_fit_made_at_2_threads_projects_at_1(gen):
    """End to end: project_onto_basis checks X against the fit's fingerprint; at another thread
    count than the fit's it must not call the same X a different one."""
    X = torch.randn(40_000, 64, generator=gen)  # its old one-sum fingerprint differed at 1 and 2
    off = torch.arange(0, 40_001, 40)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        fit = gk.kpca(X, off, n_components=2, gamma=0.01, solver="dense")
        torch.set_num_threads(1)
        betas = gk.project_onto_basis(X, fit, X[:3], gamma=0.01)
    finally:
        torch.set_num_threads(before)
    assert betas.shape == (1000, 2, 3)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("n", SIZES)
def test_rbf_gram_from_the_same_blocks_matches_float64_at_1_and_2_threads(small_tiles, n, dtype, gen):
    """gk.rbf_gram (reference) builds its symmetric Gram with the same blocks as kpca, on the
    common shift, and its cross Gram in row blocks: every block layout matches float64 on an
    offset cloud, the symmetric one bitwise symmetric with a unit diagonal, both (float32) with
    the same bits at 1 and 2 threads."""
    D, g = 7, 0.3
    X = (0.5 * torch.randn(n, D, generator=gen, dtype=torch.float64) + 40.0).to(dtype)
    Y = (0.5 * torch.randn(n + 3, D, generator=gen, dtype=torch.float64) + 40.0).to(dtype)
    outs = []
    for threads in (1, 2):
        before = _threads(threads)
        try:
            with gk.set_backend("reference"):
                outs.append((gk.rbf_gram(X, gamma=g), gk.rbf_gram(X, Y, gamma=g)))
        finally:
            torch.set_num_threads(before)
    (K, KY), (K2, KY2) = outs
    if dtype == torch.float32:  # float64: MKL's dgemm itself varies (see rbf._MKL_ROWS)
        assert torch.equal(K, K2) and torch.equal(KY, KY2), "bits depend on the thread count"
    assert torch.equal(K, K.T) and torch.equal(K.diagonal(), torch.ones(n, dtype=dtype))
    # offset 40, spread 0.5: without the shift float32 loses ~|x|^2 eps = 1e-2 here
    assert_close_rel(K, rbf_kernel(X.double().numpy(), gamma=g), TOL[dtype], "K(X, X)")
    assert_close_rel(KY, rbf_kernel(X.double().numpy(), Y.double().numpy(), gamma=g), TOL[dtype], "K(X, Y)")
