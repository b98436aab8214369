"""Kernel PCA (RBF) on many ragged clusters in one call, its transform, and basis projection.

Per cluster C_j (rows offsets[j]:offsets[j+1] of X, n = n_j): K its Gram, Kc = H K H,
Kc u_i = mu_i u_i (descending). alphas = u_i / sqrt(mu_i) make the feature-space components
v_i = sum_a alpha_ai (Phi(x_a) - mean Phi) unit-norm (sklearn's eigenvectors_/sqrt(eigenvalues_));
variances = mu / n is the feature-space variance along v_i (DESIGN.md math notes 1-2).
Sign convention: each u_i has its largest-magnitude entry positive (first one on ties).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .. import _dispatch, _validate
from .rbf import _sqdist, double_center, gram_reference

SOLVERS = ("auto", "dense", "subspace")
# auto -> subspace: it hands small clusters (block >= n/3) to dense itself; measured in
# benchmarks/test_client_pipeline.py (3 x 1,700 points: see README).
_SOLVER_OP = {"auto": "kpca_subspace", "subspace": "kpca_subspace", "dense": "kpca_dense"}


@dataclass
class KPCAFit:
    """Result of :func:`kpca` for m clusters with d components each.

    eigenvalues: (m, d) centred-Gram eigenvalues mu, descending (0 for null components).
    variances: (m, d) mu / n_j, the feature-space variance along each component.
    alphas: (N, d) normalised dual coefficients, row-aligned with X (0 for null components).
    mean_projection: (m, d) <v_i, mean Phi> = sum_a alpha_ai mean_c k(x_a, x_c); a centred
        score is p_i(z) = sum_a alpha_ai k(z, x_a) - mean_projection_i.
    offsets: (m+1,) int64 CSR boundaries, as passed in.
    """

    eigenvalues: torch.Tensor
    variances: torch.Tensor
    alphas: torch.Tensor
    mean_projection: torch.Tensor
    offsets: torch.Tensor

    @property
    def n_clusters(self) -> int:
        return self.eigenvalues.shape[0]

    @property
    def n_components(self) -> int:
        return self.eigenvalues.shape[1]


def sign_fix(U: torch.Tensor) -> torch.Tensor:
    """Flip columns of (..., n, d) so each column's largest-|.| entry is positive."""
    idx = U.abs().argmax(dim=-2, keepdim=True)
    s = torch.sign(torch.gather(U, -2, idx))
    return U * torch.where(s == 0, torch.ones_like(s), s)


def _buckets(sizes: list[int]) -> list[list[int]]:
    """Group clusters so each padded batch wastes at most 2x per side (4x memory) over its smallest."""
    order = sorted(range(len(sizes)), key=lambda j: -sizes[j])
    out: list[list[int]] = []
    for j in order:
        if out and sizes[out[-1][0]] <= 2 * sizes[j]:
            out[-1].append(j)
        else:
            out.append([j])
    return out


def dense_top(Kc: torch.Tensor, d: int):
    """Top-d eigenpairs (descending) of a batch of symmetric (B, n, n) by full eigh."""
    mu, U = torch.linalg.eigh(Kc)  # ascending
    return mu.flip(-1)[:, :d], U.flip(-1)[:, :, :d]


def subspace_top(Kc: torch.Tensor, d: int, *, max_iter: int = 300, check_every: int = 4):
    """Top-d eigenpairs of a batch of symmetric PSD (B, n, n): block subspace iteration with
    Rayleigh-Ritz, block size k = max(2d, d + 8), from a seeded random start (deterministic).

    The iteration runs in float64 whatever Kc's dtype (float32 iterates stopped at a residual of
    1e-4 left alphas ~1e-4 off the float64 oracle). Converged when every residual
    |Kc u_i - mu_i u_i| <= tol * mu_1 (tol 1e-6 for float32 input, 1e-12 for float64; the
    eigenvalue error is ~ residual^2 / gap, far below those). A batch that has not
    converged after ``max_iter`` iterations falls back to the dense solver.
    """
    Bsz, n, _ = Kc.shape
    k = min(n, max(2 * d, d + 8))
    if 3 * k > n:  # the block is a sizeable part of the matrix: dense is cheaper and exact
        return dense_top(Kc, d)
    out_dtype = Kc.dtype
    tol = 1e-6 if out_dtype == torch.float32 else 1e-12
    Kc = Kc.to(torch.float64)
    gen = torch.Generator(device=Kc.device).manual_seed(0)
    Q = torch.linalg.qr(torch.randn(Bsz, n, k, generator=gen, dtype=Kc.dtype, device=Kc.device)).Q
    for it in range(1, max_iter + 1):
        KQ = Kc @ Q
        if it % check_every == 0:
            w, V = torch.linalg.eigh(Q.transpose(1, 2) @ KQ)
            w, V = w.flip(-1)[:, :d], V.flip(-1)[:, :, :d]
            U = Q @ V
            res = (KQ @ V - U * w.unsqueeze(1)).norm(dim=1)
            scale = w[:, :1].abs().clamp_min(torch.finfo(Kc.dtype).tiny)
            if bool((res <= tol * scale).all()):
                return w.to(out_dtype), U.to(out_dtype)
        Q = torch.linalg.qr(KQ).Q
    return tuple(t.to(out_dtype) for t in dense_top(Kc, d))


def eigenpairs_from_centred_grams(Kc: torch.Tensor, colmeans: list, sizes: list, n_components: int,
                                  top=dense_top):
    """Top eigenpairs of b zero-padded centred Grams, normalised as kpca returns them.

    Kc: (b, nmax, nmax), cluster t's H K H in its leading sizes[t] rows/columns, zeros elsewhere;
    colmeans: b tensors (sizes[t],), the column means of the uncentred K; top: the eigen-solver.
    Returns eigenvalues (b, d), alphas (a list of b (sizes[t], d) tensors), mean_projection (b, d).
    Every kpca backend shares this, so only the Gram construction differs between them.
    """
    d = n_components
    eigenvalues = torch.zeros(len(sizes), d, dtype=Kc.dtype, device=Kc.device)
    mean_proj = torch.zeros(len(sizes), d, dtype=Kc.dtype, device=Kc.device)
    alphas = []
    eps = torch.finfo(Kc.dtype).eps
    mu, U = top(Kc, d)
    for t, n in enumerate(sizes):
        mu_j, U_j = mu[t], sign_fix(U[t, :n])
        # numpy's matrix_rank tolerance (n eps mu_1) plus the floor from forming Kc = HKH out of
        # K's O(1) entries, each left with a few eps, so every eigenvalue carries up to ~4 n eps
        # whatever mu_1 is (a tight cluster's null direction, the constant vector, came out with
        # mu ~ 3e-7 in float32 and alphas ~1e3). Below it eigenvalues are roundoff and their
        # directions undefined: such components get zero alphas instead of dividing by ~0.
        tol = (max(float(mu_j[0]), 0.0) + 4.0) * n * eps
        keep = mu_j > tol
        mu_j = torch.where(keep, mu_j, torch.zeros_like(mu_j))
        a = U_j / torch.where(keep, mu_j, torch.ones_like(mu_j)).sqrt() * keep
        eigenvalues[t] = mu_j
        alphas.append(a)
        mean_proj[t] = colmeans[t] @ a
    return eigenvalues, alphas, mean_proj


def _kpca_reference(X, offsets, n_components: int, gamma: float, top):
    """Centred Grams of all clusters, zero-padded and bucketed by size, eigen-solved with ``top``.

    Zero padding keeps the top eigenpairs: diag(Kc, 0) has Kc's spectrum plus zeros, and the
    padded eigenvectors for positive eigenvalues are Kc's with zeros appended.
    """
    m, d = offsets.numel() - 1, n_components
    N = X.shape[0]
    off = offsets.tolist()
    sizes = [off[j + 1] - off[j] for j in range(m)]
    eigenvalues = torch.zeros(m, d, dtype=X.dtype, device=X.device)
    alphas = torch.zeros(N, d, dtype=X.dtype, device=X.device)
    mean_proj = torch.zeros(m, d, dtype=X.dtype, device=X.device)
    for bucket in _buckets(sizes):
        nmax = sizes[bucket[0]]
        Kc = torch.zeros(len(bucket), nmax, nmax, dtype=X.dtype, device=X.device)
        colmeans = []
        for t, j in enumerate(bucket):
            Xj = X[off[j]:off[j + 1]]
            # The RBF kernel is translation invariant; centring first removes the roundoff of the
            # |x|^2 + |y|^2 - 2<x, y> expansion far from the origin (identical points then give
            # K = 1 exactly, so Kc = 0 instead of ~eps noise that became unit-norm "components").
            K = gram_reference(Xj - Xj.mean(0), None, gamma, False)
            colmeans.append(K.mean(0))
            Kc[t, :sizes[j], :sizes[j]] = double_center(K)
        mu_b, alphas_b, mean_proj_b = eigenpairs_from_centred_grams(
            Kc, colmeans, [sizes[j] for j in bucket], d, top)
        for t, j in enumerate(bucket):
            eigenvalues[j] = mu_b[t]
            alphas[off[j]:off[j + 1]] = alphas_b[t]
            mean_proj[j] = mean_proj_b[t]
    return eigenvalues, alphas, mean_proj


def kpca_dense_reference(X, offsets, n_components: int, gamma: float):
    return _kpca_reference(X, offsets, n_components, gamma, dense_top)


def kpca_subspace_reference(X, offsets, n_components: int, gamma: float):
    return _kpca_reference(X, offsets, n_components, gamma, subspace_top)


_dispatch.register("kpca_dense", "reference")(kpca_dense_reference)
_dispatch.register("kpca_subspace", "reference")(kpca_subspace_reference)


def kpca(X: torch.Tensor, offsets: torch.Tensor, *, n_components: int, gamma: float,
         solver: str = "auto") -> KPCAFit:
    """Kernel PCA of every cluster of X in one call.

    X: (N, D); offsets: int64 (m+1,) CSR boundaries (cluster j = rows offsets[j]:offsets[j+1]).
    Every cluster needs at least ``n_components`` points. Returns a :class:`KPCAFit`.
    solver: "dense" (full batched eigh of the zero-padded centred Grams), "subspace" (top-d
    block subspace iteration with Rayleigh-Ritz and a residual check; dense for small clusters),
    "auto" (= subspace).
    """
    X = _validate.tensor("X", X, ndim=2)
    offsets = _validate.offsets(offsets, X.shape[0], device=X.device, allow_empty_segments=False)
    d = _validate.positive_int("n_components", n_components)
    g = _validate.gamma(gamma)
    solver = _validate.choice("solver", solver, SOLVERS)
    sizes = (offsets[1:] - offsets[:-1]).cpu()
    if int(sizes.min()) < d:
        j = int(sizes.argmin())
        raise ValueError(f"n_components={d} is larger than cluster {j}'s size {int(sizes[j])}; "
                         "lower n_components or merge small clusters")
    mu, alphas, mean_proj = _dispatch.implementation(_SOLVER_OP[solver], X.device.type)(X, offsets, d, g)
    n = sizes.to(device=X.device, dtype=X.dtype).unsqueeze(1)
    return KPCAFit(eigenvalues=mu, variances=mu / n, alphas=alphas, mean_projection=mean_proj,
                   offsets=offsets)


def _check_fit(fit, X: torch.Tensor) -> None:
    if not isinstance(fit, KPCAFit):
        raise TypeError(f"fit must be the KPCAFit returned by gk.kpca, got {type(fit).__name__}")
    if fit.alphas.shape[0] != X.shape[0]:
        raise ValueError(f"X has {X.shape[0]} rows but fit was computed on {fit.alphas.shape[0]}; "
                         "pass the same X that gk.kpca was fitted on")
    _validate.same_device_dtype(X=X, **{"fit.alphas": fit.alphas})


def kpca_transform(Z: torch.Tensor, X: torch.Tensor, fit: KPCAFit, *, gamma: float,
                   segment) -> torch.Tensor:
    """Centred kernel-PC scores of Z in cluster ``segment``'s components (== sklearn transform).

    Z: (b, D); X: (N, D) the fitted data; segment: an int (all rows) or an int64 (b,) tensor of
    cluster ids per row. Returns (b, d).
    """
    Z = _validate.tensor("Z", Z, ndim=2, allow_empty=True)
    X = _validate.tensor("X", X, ndim=2)
    _validate.same_device_dtype(Z=Z, X=X)
    _validate.same_dim("Z", Z, "X", X)
    _check_fit(fit, X)
    g = _validate.gamma(gamma)
    m = fit.n_clusters
    if isinstance(segment, torch.Tensor):
        if segment.dtype != torch.int64 or segment.shape != (Z.shape[0],):
            raise ValueError(f"segment must be an int or an int64 tensor of shape ({Z.shape[0]},)")
        seg = segment.to(Z.device)
    elif isinstance(segment, int) and not isinstance(segment, bool):
        seg = torch.full((Z.shape[0],), segment, dtype=torch.int64, device=Z.device)
    else:
        raise TypeError(f"segment must be an int or an int64 tensor, got {type(segment).__name__}")
    if seg.numel() and (int(seg.min()) < 0 or int(seg.max()) >= m):
        raise ValueError(f"segment ids must lie in [0, {m}), got [{int(seg.min())}, {int(seg.max())}]")
    off = fit.offsets.tolist()
    out = torch.empty(Z.shape[0], fit.n_components, dtype=Z.dtype, device=Z.device)
    for j in torch.unique(seg).tolist():
        rows = torch.nonzero(seg == j).squeeze(1)
        Xj = X[off[j]:off[j + 1]]
        mu = Xj.mean(0)  # distances from the cluster, not the origin: as in the fit (roundoff)
        Kz = torch.exp(_sqdist(Z[rows] - mu, Xj - mu).mul_(-g))
        out[rows] = Kz @ fit.alphas[off[j]:off[j + 1]] - fit.mean_projection[j]
    return out


def projection_reference(X, alphas, offsets, B, gamma: float) -> torch.Tensor:
    off = offsets.tolist()
    m = len(off) - 1
    out = torch.empty(m, alphas.shape[1], B.shape[0], dtype=X.dtype, device=X.device)
    for j in range(m):
        Xj = X[off[j]:off[j + 1]]
        mu = Xj.mean(0)  # distances from the cluster, not the origin: as in the fit (roundoff)
        Kj = torch.exp(_sqdist(Xj - mu, B - mu).mul_(-gamma))
        torch.mm(alphas[off[j]:off[j + 1]].T, Kj, out=out[j])
    return out


_dispatch.register("project_onto_basis", "reference")(projection_reference)


def project_onto_basis(X: torch.Tensor, fit: KPCAFit, B: torch.Tensor, *, gamma: float) -> torch.Tensor:
    """betas[j, i, s] = sum_{a in cluster j} alpha[a, i] k(x_a, b_s) = <v_ji, Phi(b_s)>.

    X: (N, D) the fitted data, B: (S, D) basis points. Returns (m, d, S).
    Exact inner products because sum_a alpha_ai = 0 (DESIGN.md math note 1).
    """
    X = _validate.tensor("X", X, ndim=2)
    B = _validate.tensor("B", B, ndim=2)
    _validate.same_device_dtype(X=X, B=B)
    _validate.same_dim("X", X, "B", B)
    _check_fit(fit, X)
    g = _validate.gamma(gamma)
    return _dispatch.implementation("project_onto_basis", X.device.type)(X, fit.alphas, fit.offsets, B, g)
