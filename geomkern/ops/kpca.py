"""Kernel PCA (RBF) on many ragged clusters in one call, its transform, and basis projection.

Per cluster C_j (rows offsets[j]:offsets[j+1] of X, n = n_j): K its Gram, Kc = H K H,
Kc u_i = mu_i u_i (descending). alphas = u_i / sqrt(mu_i) make the feature-space components
v_i = sum_a alpha_ai (Phi(x_a) - mean Phi) unit-norm (sklearn's eigenvectors_/sqrt(eigenvalues_));
variances = mu / n is the feature-space variance along v_i (docs/design.md math notes 1-2).
Sign convention: each u_i has its largest-magnitude entry positive (first one on ties).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .. import _dispatch, _library, _validate
from ._segments import buckets
from .eigh import full_eigh, sign_fix, thread_independent
from .rbf import _sqdist, double_center, gram_reference, sym_gram_into, thread_independent_mm

SOLVERS = ("auto", "dense", "subspace", "matrix_free")
# auto: dense for size buckets below DENSE_BELOW_BLOCKS blocks of the Krylov solver, subspace
# above, matrix-free for buckets whose stored Grams would exceed GRAM_BUDGET_BYTES.
# Crossover measured on the 2-core CPU (docs/history.md §6), batches of ~2,400
# points, D = 512: d = 8 (block k = 16) dense 1.7x faster at n = 200, even at 300, 1.35x
# slower at 400; d = 2 (k = 10) dense 1.2x faster at n = 100, 1.2x slower at 150. Dense below 16 k.
DENSE_BELOW_BLOCKS = 16
# LAPACK solves a CPU batch one matrix at a time, so zero padding is pure extra work there (a
# dense eigh grows as n^3): CPU buckets pad by at most 10% (200 clusters of 50-300 points, one
# call: ratio 2 measured 0.62 s, slower than 200 separate calls at 0.47 s). Other devices: 2x.
CPU_BUCKET_RATIO = 1.1
# Stored zero-padded centred Grams of one size bucket above this go matrix-free (the Gram is
# recomputed by rbf_matmul at every Krylov step instead: ~8x the Gram's flops, O(n k) memory).
GRAM_BUDGET_BYTES = 2 << 30


@dataclass
class KPCAFit:
    """Result of :func:`kpca` for m clusters with d components each.

    eigenvalues: (m, d) centred-Gram eigenvalues mu, descending (0 for null components).
    variances: (m, d) mu / n_j, the feature-space variance along each component.
    alphas: (N, d) normalised dual coefficients, row-aligned with X (0 for null components).
    mean_projection: (m, d) <v_i, mean Phi> = sum_a alpha_ai mean_c k(x_a, x_c); a centred
        score is p_i(z) = sum_a alpha_ai k(z, x_a) - mean_projection_i.
    offsets: (m+1,) int64 CSR boundaries, as passed in ([0, N] for ``offsets=None``).
    gamma: the kernel width it was fitted with; fingerprint: a checksum of the fitted X (see
        :func:`fingerprint`). kpca_transform and project_onto_basis refuse another gamma or X
        (None, for a fit assembled by hand: not checked).
    """

    eigenvalues: torch.Tensor
    variances: torch.Tensor
    alphas: torch.Tensor
    mean_projection: torch.Tensor
    offsets: torch.Tensor
    gamma: float | None = None
    fingerprint: torch.Tensor | None = None

    @property
    def n_clusters(self) -> int:
        return self.eigenvalues.shape[0]

    @property
    def n_components(self) -> int:
        return self.eigenvalues.shape[1]


def fingerprint(X: torch.Tensor) -> torch.Tensor:
    """(3,) float64 on X's device: sum, sum of squared row norms and a row-position-weighted sum
    of X. Any change of a value or of the row order changes it (barring exact cancellation); no
    host copy. Independent of the thread count, so a fit made at one ``torch.set_num_threads``
    is recognised at another: per-row reductions (split over rows, never within one), then a
    sequential cumulative sum over the rows (a plain ``sum`` over more than 32,768 elements splits
    by thread count, and the bits then differ: 200,000 x 64 did at 1 and 2 threads)."""
    rows = X.sum(1, dtype=torch.float64)
    norms = torch.linalg.vector_norm(X, dim=1, dtype=torch.float64)  # 5x a float64 square-sum here
    pos = torch.arange(1, X.shape[0] + 1, dtype=torch.float64, device=X.device)
    return torch.stack([rows, norms.square(), rows * pos]).cumsum(1)[:, -1]


def dense_top(Kc: torch.Tensor, d: int):
    """Top-d eigenpairs (descending) of a batch of symmetric (B, n, n) by full eigh.

    (LAPACK ?syevx for the top d only measured 1.5-2.9x faster than torch's full eigh in
    isolation at n = 175-300, but slower inside kpca: scipy's OpenBLAS threads and torch's
    OpenMP threads contend, see docs/history.md §6. So: torch.)"""
    mu, U = full_eigh(Kc)  # ascending
    return mu.flip(-1)[:, :d], U.flip(-1)[:, :, :d]


def krylov_block(n: int, d: int) -> int:
    """Block size of the Krylov solver for d components of an n x n matrix."""
    return min(n, max(2 * d, d + 8))


def krylov_tol(dtype: torch.dtype) -> float:
    """Residual bound (relative to mu_1) the Krylov solver stops at for inputs of ``dtype``."""
    return 1e-6 if dtype == torch.float32 else 1e-12


def block_krylov_top(apply, Bsz: int, n: int, d: int, *, device, tol: float, max_depth: int = 8,
                     max_restarts: int = 30):
    """:func:`_block_krylov_top`; on CPU, everything but ``apply`` on one thread.

    Besides the passes (``apply``, at the caller's thread count) the solver is ~150 small float64
    ops per call (projections, QR, Rayleigh-Ritz): threaded, each pays an OpenMP barrier (at 2
    threads on a loaded machine, milliseconds each, §15e), and MKL's GEMMs of 5-11 rows (a block
    of k = d + 8 <= 11 columns) gave other bits at 1 and 2 threads. On one thread neither happens.
    """
    threads = torch.get_num_threads()
    if torch.device(device).type != "cpu" or threads == 1:
        return _block_krylov_top(apply, Bsz, n, d, device=device, tol=tol, max_depth=max_depth,
                                 max_restarts=max_restarts)

    def threaded_apply(Y):
        torch.set_num_threads(threads)
        try:
            return apply(Y)
        finally:
            torch.set_num_threads(1)

    torch.set_num_threads(1)
    try:
        return _block_krylov_top(threaded_apply, Bsz, n, d, device=device, tol=tol,
                                 max_depth=max_depth, max_restarts=max_restarts)
    finally:
        torch.set_num_threads(threads)


def _block_krylov_top(apply, Bsz: int, n: int, d: int, *, device, tol: float, max_depth: int = 8,
                      max_restarts: int = 30):
    """Top-d eigenpairs of a batch of symmetric PSD operators (B, n, n) given only ``apply``
    (float64 (B, n, k) -> float64 (B, n, k), the operator times a block).

    Randomized block Krylov (block Lanczos with full reorthogonalisation, block size
    k = krylov_block(n, d)) with Rayleigh-Ritz after 4, 6 and ``max_depth`` blocks:
    K Q of the whole Krylov basis is the products already made, so the Rayleigh quotient costs
    no extra pass over K. Converged
    when every residual |K u_i - mu_i u_i| <= tol * mu_1; otherwise restarted from the top-k Ritz
    vectors. Returns float64 (mu (B, d), U (B, n, d)), or None after ``max_restarts`` passes.
    The basis is kept transposed (blocks as rows) so growing it needs no copies.
    """
    f64 = torch.float64
    k = krylov_block(n, d)
    depth = max(1, min(max_depth, n // k))
    QT = torch.empty(Bsz, depth * k, n, dtype=f64, device=device)  # Krylov basis, transposed
    WT = torch.empty_like(QT)  # K times the basis, transposed
    gen = torch.Generator(device=device).manual_seed(0)
    Y = torch.linalg.qr(torch.randn(Bsz, n, k, generator=gen, dtype=f64, device=device)).Q
    checks = {min(4, depth), min(6, depth), depth}
    # Rayleigh quotient Q^T K Q, grown by the blocks added since the last check instead of being
    # recomputed whole: at checks of 64, 96, 128 columns the products shrink to ~55% (§15e).
    HB = torch.empty(Bsz, depth * k, depth * k, dtype=f64, device=device)
    for _ in range(max_restarts):
        done = 0  # basis columns whose rows and columns of HB are filled
        for i in range(depth):
            a, b = i * k, (i + 1) * k
            QT[:, a:b] = Y.transpose(1, 2)
            WT[:, a:b] = apply(Y).transpose(1, 2)
            if i + 1 in checks:
                HB[:, :b, done:b] = QT[:, :b] @ WT[:, done:b].transpose(1, 2)
                HB[:, done:b, :done] = QT[:, done:b] @ WT[:, :done].transpose(1, 2)
                done = b
                H = HB[:, :b, :b]
                with thread_independent(H.device):
                    w, V = torch.linalg.eigh(0.5 * (H + H.transpose(1, 2)))
                w, V = w.flip(-1), V.flip(-1)
                Vd = V[:, :, :d].transpose(1, 2)  # (B, d, m)
                UT = Vd @ QT[:, :b]
                res = (Vd @ WT[:, :b] - UT * w[:, :d].unsqueeze(-1)).norm(dim=-1)
                scale = w[:, :1].abs().clamp_min(torch.finfo(f64).tiny)
                if bool((res <= tol * scale).all()):
                    return w[:, :d], UT.transpose(1, 2)
            if i + 1 == depth:
                break
            ZT = WT[:, a:b]
            for _ in range(2):  # twice is enough (Kahan): the basis stays orthonormal to roundoff
                ZT = ZT - (ZT @ QT[:, :b].transpose(1, 2)) @ QT[:, :b]
                ZT = torch.linalg.qr(ZT.transpose(1, 2)).Q.transpose(1, 2)
            Y = ZT.transpose(1, 2)
        Y = (V[:, :, :k].transpose(1, 2) @ QT).transpose(1, 2)  # thick restart: top-k Ritz vectors
    return None


def subspace_top(Kc: torch.Tensor, d: int, *, max_restarts: int = 30):
    """Top-d eigenpairs of a batch of stored symmetric PSD (B, n, n): :func:`block_krylov_top`.

    The products run in Kc's dtype (float32 products of the float32 Gram reached residuals of
    5e-8 on the client-pipeline clusters, so a float64 copy of Kc buys nothing) while the
    Krylov basis and Rayleigh-Ritz are float64. Converged when every residual <= tol * mu_1 (tol
    1e-6 for float32 input, 1e-12 for float64; the eigenvalue error is ~ residual^2 / gap, far
    below those). Dense when the block is a sizeable part of the matrix or if it does not converge.
    """
    Bsz, n, _ = Kc.shape
    if 3 * krylov_block(n, d) > n:  # the block is a sizeable part of the matrix: dense is cheaper and exact
        return dense_top(Kc, d)
    out = block_krylov_top(lambda Y: (Kc @ Y.to(Kc.dtype)).to(torch.float64), Bsz, n, d,
                           device=Kc.device, tol=krylov_tol(Kc.dtype), max_restarts=max_restarts)
    if out is None:
        return dense_top(Kc, d)
    return out[0].to(Kc.dtype), out[1].to(Kc.dtype)


def auto_top(Kc: torch.Tensor, d: int):
    """The measured choice: dense eigh for small matrices, block Krylov for large ones."""
    n = Kc.shape[-1]
    return dense_top(Kc, d) if n < DENSE_BELOW_BLOCKS * krylov_block(n, d) else subspace_top(Kc, d)


def eigenpairs_from_centred_grams(Kc: torch.Tensor, colmeans: list, sizes: list, n_components: int,
                                  top=dense_top):
    """Top eigenpairs of b zero-padded centred Grams, normalised as kpca returns them.

    Kc: (b, nmax, nmax), cluster t's H K H in its leading sizes[t] rows/columns, zeros elsewhere;
    colmeans: b tensors (sizes[t],), the column means of the uncentred K; top: the eigen-solver.
    Returns eigenvalues (b, d), alphas (a list of b (sizes[t], d) tensors), mean_projection (b, d).
    Every kpca backend shares this, so only the Gram construction differs between them.
    """
    mu, U = top(Kc, n_components)
    return normalise_eigenpairs(mu, U, colmeans, sizes)


def normalise_eigenpairs(mu: torch.Tensor, U: torch.Tensor, colmeans: list, sizes: list):
    """Top-d eigenpairs (mu (b, d), U (b, >= n_t, d)) of b centred Grams -> (eigenvalues,
    alphas list, mean_projection) as kpca returns them; see eigenpairs_from_centred_grams."""
    d = mu.shape[1]
    eigenvalues = torch.zeros(len(sizes), d, dtype=mu.dtype, device=mu.device)
    mean_proj = torch.zeros(len(sizes), d, dtype=mu.dtype, device=mu.device)
    alphas = []
    eps = torch.finfo(mu.dtype).eps
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


def centred_grams_reference(X, off: list, bucket: list, gamma: float, *, precision: str | None = None):
    """The zero-padded centred Grams of one size bucket: the ``kpca`` op each backend implements.

    X: (N, D); off: the m+1 CSR boundaries as a list; bucket: cluster ids, largest first.
    Returns Kc (b, nmax, nmax), cluster t's H K H in its leading n_t rows/columns and zeros
    elsewhere (zero padding keeps the top eigenpairs: diag(Kc, 0) has Kc's spectrum plus zeros,
    and the padded eigenvectors for positive eigenvalues are Kc's with zeros appended), and
    colmeans, b tensors (n_t,): the column means of the uncentred K.
    """
    nmax = off[bucket[0] + 1] - off[bucket[0]]
    Kc = torch.empty(len(bucket), nmax, nmax, dtype=X.dtype, device=X.device)  # padding zeroed below
    colmeans = []
    for t, j in enumerate(bucket):
        n = off[j + 1] - off[j]
        Kc[t, n:].zero_()
        Kc[t, :n, n:].zero_()
        colmeans.append(centred_gram_into(Kc[t, :n, :n], X[off[j]:off[j + 1]], gamma))
    return Kc, colmeans


def centred_gram_into(out: torch.Tensor, Xj: torch.Tensor, gamma: float) -> torch.Tensor:
    """Write H K H of one cluster Xj (n, D) into ``out`` (an (n, n) view, e.g. its slot of the
    padded bucket: no fresh n x n and no copy) and return K's column means (n,).

    K comes from :func:`geomkern.ops.rbf.sym_gram_into` (upper-triangle row blocks, about half
    the full Gram's GEMM flops, exactly symmetric with a unit diagonal), so its row means are its
    column means and one reduction serves the centring.
    """
    # The RBF kernel is translation invariant; centring first removes the roundoff of the
    # |x|^2 + |y|^2 - 2<x, y> expansion far from the origin (identical points then give
    # K = 1 exactly, so Kc = 0 instead of ~eps noise that became unit-norm "components").
    sym_gram_into(out, Xj - Xj.mean(0), gamma)
    r = out.mean(1)  # per row: a reduction of n elements, whatever the thread count
    out.sub_(r).sub_((r - r.mean()).unsqueeze(1))  # K - col means - row means + overall mean
    return r


_dispatch.register("kpca", "reference")(centred_grams_reference)


def _matrix_free_cluster(Xj: torch.Tensor, d: int, gamma: float, precision: str):
    """Top-d kernel PCA of one cluster without storing its Gram: every Krylov step applies
    Kc = H K H to a block through ``rbf_matmul`` (the Triton flash-style kernel on CUDA).
    Returns (eigenvalues (d,), alphas (n, d), mean_projection (d,))."""
    n = Xj.shape[0]
    if bool((Xj == Xj[0]).all()):
        # every point is the mean: H K H = 0 exactly, no component (detected here, not left to
        # the products, whose tile-order sums need not give bit-equal rows of K V)
        return (Xj.new_zeros(d), Xj.new_zeros(n, d), Xj.new_zeros(d))
    Xc = Xj - Xj.mean(0)  # translation invariance; as the stored path does (roundoff)
    if 3 * krylov_block(n, d) > n:  # small: the Gram is tiny, the dense solve exact
        K = gram_reference(Xc, None, gamma, False)
        mu, alphas, mp = eigenpairs_from_centred_grams(double_center(K).unsqueeze(0), [K.mean(0)], [n], d)
        return mu[0], alphas[0], mp[0]
    matmul = _dispatch.implementation("rbf_matmul", Xj.device.type)
    dt = Xj.dtype

    def apply(Y):  # (1, n, k) float64 -> H K H Y
        V = Y[0].to(dt)
        KV = matmul(Xc, Xc, V - V.mean(0), gamma, precision=precision)
        return (KV - KV.mean(0)).to(torch.float64).unsqueeze(0)

    out = block_krylov_top(apply, 1, n, d, device=Xj.device, tol=krylov_tol(dt))
    colmean = matmul(Xc, Xc, torch.full((n, 1), 1.0 / n, dtype=dt, device=Xj.device), gamma,
                     precision=precision)[:, 0]
    if out is None:
        raise RuntimeError(f"matrix-free kpca did not converge on a cluster of {n} points; "
                           "use solver='dense' or 'subspace' (they store the Gram)")
    mu, alphas, mp = normalise_eigenpairs(out[0].to(dt), out[1].to(dt), [colmean], [n])
    return mu[0], alphas[0], mp[0]


_TOP = {"auto": auto_top, "dense": dense_top, "subspace": subspace_top}


def _kpca(X, offsets, d: int, gamma: float, solver: str, precision: str):
    """The one bucket loop: clusters grouped by size, each bucket's centred Grams from the
    dispatched ``kpca`` op, eigen-solved by the solver's ``top``, normalised, scattered back;
    a bucket whose stored Grams would exceed GRAM_BUDGET_BYTES (or every cluster, for
    ``matrix_free``) goes matrix-free, one cluster at a time."""
    m, N = offsets.numel() - 1, X.shape[0]
    off = offsets.tolist()
    sizes = [off[j + 1] - off[j] for j in range(m)]
    eigenvalues = torch.zeros(m, d, dtype=X.dtype, device=X.device)
    alphas = torch.zeros(N, d, dtype=X.dtype, device=X.device)
    mean_proj = torch.zeros(m, d, dtype=X.dtype, device=X.device)
    grams = _dispatch.implementation("kpca", X.device.type)
    for bucket in buckets(sizes, CPU_BUCKET_RATIO if X.device.type == "cpu" else 2.0):
        nmax = sizes[bucket[0]]
        too_large = len(bucket) * nmax * nmax * X.element_size() > GRAM_BUDGET_BYTES
        if solver == "matrix_free" or (solver != "dense" and too_large):
            for j in bucket:
                eigenvalues[j], alphas[off[j]:off[j + 1]], mean_proj[j] = _matrix_free_cluster(
                    X[off[j]:off[j + 1]], d, gamma, precision)
            continue
        Kc, colmeans = grams(X, off, bucket, gamma, precision=precision)
        mu_b, alphas_b, mean_proj_b = eigenpairs_from_centred_grams(
            Kc, colmeans, [sizes[j] for j in bucket], d, _TOP[solver])
        for t, j in enumerate(bucket):
            eigenvalues[j] = mu_b[t]
            alphas[off[j]:off[j + 1]] = alphas_b[t]
            mean_proj[j] = mean_proj_b[t]
    return eigenvalues, alphas, mean_proj


def kpca(X: torch.Tensor, offsets: torch.Tensor | None = None, *, n_components: int, gamma: float,
         solver: str = "auto", precision: str = _validate.DEFAULT_PRECISION) -> KPCAFit:
    """Kernel PCA of every cluster of X in one call.

    X: (N, D); offsets: int64 (m+1,) CSR boundaries (cluster j = rows offsets[j]:offsets[j+1]),
    or None (the default) for one cluster of all N rows, as ``sklearn.decomposition.KernelPCA``
    fits (``fit.offsets`` is then ``[0, N]``). Every cluster needs at least ``n_components``
    points. Returns a :class:`KPCAFit`.
    solver: "dense" (full batched eigh of the zero-padded centred Grams), "subspace" (top-d
    randomized block Krylov with Rayleigh-Ritz and a residual check on the stored Grams; dense
    for small clusters), "matrix_free" (the same iteration with the Gram never stored: each step
    is an ``rbf_matmul``), "auto" (per size bucket: dense below DENSE_BELOW_BLOCKS Krylov blocks,
    subspace above, matrix-free where the Grams would exceed GRAM_BUDGET_BYTES; measured).
    precision: how the Grams' float32 dots run on tensor-core backends (_validate.PRECISIONS).
    """
    X = _validate.tensor("X", X, ndim=2)
    if offsets is None:
        offsets = torch.tensor([0, X.shape[0]], dtype=torch.int64)
    offsets = _validate.offsets(offsets, X.shape[0], device=X.device, allow_empty_segments=False)
    d = _validate.positive_int("n_components", n_components)
    g = _validate.gamma(gamma)
    solver = _validate.choice("solver", solver, SOLVERS)
    p = _validate.precision(precision)
    sizes = (offsets[1:] - offsets[:-1]).cpu()
    if int(sizes.min()) < d:
        j = int(sizes.argmin())
        raise ValueError(f"n_components={d} is larger than cluster {j}'s size {int(sizes[j])} (rows "
                         f"offsets[{j}]:offsets[{j + 1}] of X); "
                         "lower n_components or merge small clusters")
    mu, alphas, mean_proj = _kpca(X, offsets, d, g, solver, p)
    n = sizes.to(device=X.device, dtype=X.dtype).unsqueeze(1)
    return KPCAFit(eigenvalues=mu, variances=mu / n, alphas=alphas, mean_projection=mean_proj,
                   offsets=offsets, gamma=g, fingerprint=fingerprint(X))


def _check_fit(fit, X: torch.Tensor, gamma: float) -> None:
    """A fit to use with X under gamma: :func:`_fit_meta`, then the fingerprint of X."""
    _fit_meta(fit, X, gamma)
    _fit_values(fit, X)


def _fit_meta(fit, X: torch.Tensor, gamma: float) -> None:
    """What can be checked of a fit without reading values: its type, its tensors' shapes against
    each other and X's, device and dtype, and the fitted gamma."""
    if not isinstance(fit, KPCAFit):
        raise TypeError(f"fit must be the KPCAFit returned by gk.kpca, got {type(fit).__name__}")
    if fit.alphas.shape[0] != X.shape[0]:
        raise ValueError(f"X has {X.shape[0]} rows but fit was computed on {fit.alphas.shape[0]}; "
                         "pass the same X that gk.kpca was fitted on")
    _validate.same_device_dtype(X=X, **{"fit.alphas": fit.alphas})
    m, d = fit.eigenvalues.shape[0], fit.eigenvalues.shape[-1]
    shapes = {"eigenvalues": (fit.eigenvalues, (m, d)), "alphas": (fit.alphas, (X.shape[0], d)),
              "mean_projection": (fit.mean_projection, (m, d)), "offsets": (fit.offsets, (m + 1,))}
    for name, (t, want) in shapes.items():
        if tuple(t.shape) != want:
            raise ValueError(f"fit.{name} has shape {tuple(t.shape)}, but a fit of {m} clusters with "
                             f"{d} components on {X.shape[0]} rows has {want}: pass the KPCAFit of gk.kpca")
    if fit.offsets.dtype != torch.int64:
        raise TypeError(f"fit.offsets must have dtype int64, got {fit.offsets.dtype}")
    if fit.gamma is not None and gamma != fit.gamma:
        raise ValueError(f"gamma={gamma} but fit was computed with gamma={fit.gamma}; the dual "
                         "coefficients only describe the components under the fitted kernel")


def _fit_values(fit, X: torch.Tensor) -> None:
    if fit.fingerprint is not None and not torch.equal(fingerprint(X), fit.fingerprint.to(X.device)):
        raise ValueError("X differs from the X that gk.kpca was fitted on (same shape, other values or "
                         "row order); pass the fitted X")


def _transform_check(Z, X, eigenvalues, variances, alphas, mean_projection, offsets, fit_gamma,
                     fingerprint, gamma, segment_int, segment):
    """kpca_transform's arguments, every check that reads no values (the function, the operator and
    its fake run it); returns them normalised. A fit arrives as its tensors; ``segment`` as an int
    (``segment_int``) or an int64 tensor (``segment``)."""
    Z, X = _validate.tensor_arg("Z", Z), _validate.tensor_arg("X", X)
    gamma = _validate.gamma(gamma)
    if segment_int is not None and segment is not None:
        raise ValueError("segment is given twice, as segment_int and as a tensor; pass one")
    if segment_int is not None and (not isinstance(segment_int, int) or isinstance(segment_int, bool)):
        raise TypeError(f"segment must be an int or an int64 tensor, got {type(segment_int).__name__}")
    Z = _validate.tensor_meta("Z", Z, ndim=2, allow_empty=True)
    X = _validate.tensor_meta("X", X, ndim=2)
    _validate.same_device_dtype(Z=Z, X=X)
    _validate.same_dim("Z", Z, "X", X)
    fit = KPCAFit(eigenvalues, variances, alphas, mean_projection, offsets, fit_gamma, fingerprint)
    _fit_meta(fit, X, gamma)
    m = fit.n_clusters
    if segment is None and segment_int is None and m != 1:
        raise ValueError(f"segment is required: fit has {m} clusters; pass segment=j (an int, "
                         f"0 <= j < {m}) or an int64 tensor of cluster ids, one per row of Z")
    if segment is not None:
        _validate.tensor_arg("segment", segment)
        if segment.dtype != torch.int64 or segment.shape != (Z.shape[0],):
            raise ValueError(f"segment must be an int or an int64 tensor of shape ({Z.shape[0]},)")
    if segment_int is not None and Z.shape[0] and not 0 <= segment_int < m:
        raise ValueError(f"segment ids must lie in [0, {m}), got [{segment_int}, {segment_int}]")
    return (Z, X, eigenvalues, variances, alphas, mean_projection, offsets, fit_gamma, fingerprint, gamma,
            segment_int, segment)


def _transform_fake(Z, X, eigenvalues, variances, alphas, mean_projection, offsets, fit_gamma,
                    fingerprint, gamma, segment_int, segment):
    return Z.new_empty(Z.shape[0], eigenvalues.shape[1])


@_library.op("kpca_transform", "(Tensor Z, Tensor X, Tensor eigenvalues, Tensor variances, Tensor alphas, "
             "Tensor mean_projection, Tensor offsets, float? fit_gamma, Tensor? fingerprint, float gamma, "
             "int? segment_int, Tensor? segment) -> Tensor", check=_transform_check, fake=_transform_fake)
def _kpca_transform_op(Z, X, eigenvalues, variances, alphas, mean_projection, offsets, fit_gamma,
                       fingerprint, gamma, segment_int, segment):
    fit = KPCAFit(eigenvalues, variances, alphas, mean_projection, offsets, fit_gamma, fingerprint)
    Z, X = _validate.finite("Z", Z), _validate.finite("X", X)
    _fit_values(fit, X)
    m = fit.n_clusters
    if segment is not None:
        seg = segment.to(Z.device)
        if seg.numel() and (int(seg.min()) < 0 or int(seg.max()) >= m):
            raise ValueError(f"segment ids must lie in [0, {m}), got [{int(seg.min())}, {int(seg.max())}]")
    else:
        seg = torch.full((Z.shape[0],), 0 if segment_int is None else segment_int, dtype=torch.int64,
                         device=Z.device)
    off = fit.offsets.tolist()
    if off[0] != 0 or off[-1] != X.shape[0] or any(a > b for a, b in zip(off, off[1:])):
        raise ValueError(f"fit.offsets must run from 0 to the number of rows of X ({X.shape[0]}) without "
                         f"decreasing, got {off}: pass the KPCAFit of gk.kpca")
    g = gamma
    out = torch.empty(Z.shape[0], fit.n_components, dtype=Z.dtype, device=Z.device)
    for j in torch.unique(seg).tolist():
        rows = torch.nonzero(seg == j).squeeze(1)
        Xj = X[off[j]:off[j + 1]]
        mu = Xj.mean(0)  # distances from the cluster, not the origin: as in the fit (roundoff)
        Kz = _sqdist(Z[rows] - mu, Xj - mu).mul_(-g).exp_()
        out[rows] = Kz @ fit.alphas[off[j]:off[j + 1]] - fit.mean_projection[j]
    return out


def kpca_transform(Z: torch.Tensor, X: torch.Tensor, fit: KPCAFit, *, gamma: float,
                   segment=None) -> torch.Tensor:
    """Centred kernel-PC scores of Z in cluster ``segment``'s components (== sklearn transform).

    Z: (b, D); X: (N, D) the fitted data; segment: an int (all rows) or an int64 (b,) tensor of
    cluster ids per row; None (the default) is cluster 0 when the fit has exactly one cluster
    (e.g. ``gk.kpca(X, n_components=..., gamma=...)``) and an error when it has several (which
    cluster's components score Z is the caller's choice). Returns (b, d).
    A torch custom operator (``torch.ops.geomkern.kpca_transform``): traces under torch.compile.
    """
    Z, X = _validate.tensor_arg("Z", Z), _validate.tensor_arg("X", X)
    if not isinstance(fit, KPCAFit):
        raise TypeError(f"fit must be the KPCAFit returned by gk.kpca, got {type(fit).__name__}")
    seg_int = None
    if segment is not None and not isinstance(segment, torch.Tensor):
        seg_int, segment = segment, None
    return _kpca_transform_op(Z, X, fit.eigenvalues, fit.variances, fit.alphas, fit.mean_projection,
                              fit.offsets, None if fit.gamma is None else float(fit.gamma),
                              fit.fingerprint, gamma, seg_int, segment)


def projection_reference(X, alphas, offsets, B, gamma: float, *, precision: str | None = None) -> torch.Tensor:
    off = offsets.tolist()
    m = len(off) - 1
    out = torch.empty(m, alphas.shape[1], B.shape[0], dtype=X.dtype, device=X.device)
    for j in range(m):
        Xj = X[off[j]:off[j + 1]]
        mu = Xj.mean(0)  # distances from the cluster, not the origin: as in the fit (roundoff)
        Kj = _sqdist(Xj - mu, B - mu).mul_(-gamma).exp_()
        out[j] = thread_independent_mm(alphas[off[j]:off[j + 1]].T, Kj)  # d of 5-11 rows: see rbf._MKL_ROWS
    return out


_dispatch.register("project_onto_basis", "reference")(projection_reference)


def project_onto_basis(X: torch.Tensor, fit: KPCAFit, B: torch.Tensor, *, gamma: float,
                       precision: str = _validate.DEFAULT_PRECISION) -> torch.Tensor:
    """betas[j, i, s] = sum_{a in cluster j} alpha[a, i] k(x_a, b_s) = <v_ji, Phi(b_s)>.

    X: (N, D) the fitted data, B: (S, D) basis points. Returns (m, d, S).
    Exact inner products because sum_a alpha_ai = 0 (docs/design.md math note 1).
    """
    X = _validate.tensor("X", X, ndim=2)
    B = _validate.tensor("B", B, ndim=2)
    _validate.same_device_dtype(X=X, B=B)
    _validate.same_dim("X", X, "B", B)
    g = _validate.gamma(gamma)
    _check_fit(fit, X, g)
    _validate.allocation("betas", (fit.n_clusters, fit.n_components, B.shape[0]), X.dtype, X.device)
    p = _validate.precision(precision)
    return _dispatch.implementation("project_onto_basis", X.device.type)(X, fit.alphas, fit.offsets, B, g,
                                                                         precision=p)
