"""FedMC client steps: DP K-Means prototypes (step 1, ``client_prototypes``) and the local
geometry descriptors of its patches (step 3, ``local_geometry``)."""
from __future__ import annotations

import math

import torch

from .. import _random, _validate, privacy
from ..ops.kmeans import kmeans
from ..ops.kpca import kpca, project_onto_basis
from ..ops.rbf import rbf_gram
from .containers import LocalGeometry, Prototypes

# the cap on d for n_components="auto" (local_geometry and setup's patch sizing)
MAX_COMPONENTS = 16


def _clusters(X: torch.Tensor, k: int, *, epsilon: float, delta: float | None, clip_norm: float | None,
              generator: torch.Generator | None, iters: int) -> privacy.DPClusters:
    """The K-Means of a client's rows behind its prototypes and patches.

    Finite epsilon: ``privacy.dp_lloyd`` (``iters`` noisy Lloyd releases on rows clipped to
    ``clip_norm``, which is then required: the release's sensitivity rests on it). epsilon = inf:
    plain K-Means (``geomkern.kmeans``: greedy k-means++, seeded by one int64 drawn from
    ``generator``), on the rows as they are, or clipped to ``clip_norm`` when one is given; counts
    are the exact cluster sizes. Clipping un-normalised rows into a ball would bend their geometry
    for no privacy gain, so it happens only when asked (or needed). ``delta`` may be None only at
    epsilon = inf (nothing is released with noise, so there is no delta to spend): the result
    then reports delta 0.
    """
    eps = privacy._epsilon(epsilon)  # the same checks as dp_lloyd's
    if delta is None and math.isfinite(eps):
        raise ValueError(f"delta is required with a finite epsilon ({eps:g}): the Gaussian mechanism is "
                         "(epsilon, delta)-DP; pass e.g. delta=1e-5 (well below 1/number of rows), or "
                         "epsilon=math.inf for no DP")
    if clip_norm is None and math.isfinite(eps):
        raise ValueError(f"clip_norm is required with a finite epsilon ({eps:g}): the DP release needs a "
                         "bound on the row norms (1.0 for L2-normalised embeddings); pass clip_norm, or "
                         "epsilon=math.inf for no DP")
    if math.isfinite(eps):
        return privacy.dp_lloyd(X, k, epsilon=eps, delta=delta, clip_norm=clip_norm, iters=iters,
                                generator=generator)
    _validate.positive_int("iters", iters)
    Xc = X if clip_norm is None else privacy.clip_rows(X, clip_norm)
    labels, centers = kmeans(Xc, k, seed=_random.seed(generator))
    counts = torch.bincount(labels, minlength=k).to(X.dtype)
    return privacy.DPClusters(centers=centers, counts=counts, epsilon=math.inf,
                              delta=0.0 if delta is None else privacy._delta(delta),
                              noise_multiplier=0.0, labels=labels)


def client_prototypes(X: torch.Tensor, k: int, *, epsilon: float, delta: float | None = None,
                      clip_norm: float | None = None, generator: torch.Generator | None = None,
                      iters: int = 5) -> Prototypes:
    """K-Means prototypes of a client's embeddings X (n, D).

    Finite ``epsilon``: released through ``iters`` noisy Lloyd steps on rows clipped to
    ``clip_norm`` (required) at ``delta`` (required, in (0, 1)); the returned epsilon is what the
    accountant says was spent (<= the requested one). ``epsilon=math.inf``: plain K-Means
    (k-means++, seed drawn from ``generator``), no clipping unless ``clip_norm`` is given;
    ``delta`` is then optional (None reports delta 0: nothing was spent; a given one is
    validated and reported back). ``generator``: None (the default) is a fresh, secretly seeded
    generator (:mod:`geomkern._random`); pass a seeded one to reproduce a draw.
    """
    X = _validate.tensor("X", X, ndim=2)
    res = _clusters(X, k, epsilon=epsilon, delta=delta, clip_norm=clip_norm, iters=iters, generator=generator)
    return Prototypes(res.centers, res.counts, float(res.epsilon), float(res.delta))


def local_geometry(X: torch.Tensor, B: torch.Tensor, *, n_clusters: int, n_components: int | str,
                   gamma: float, epsilon: float = math.inf, delta: float | None = 1e-5,
                   clip_norm: float | None = None, generator: torch.Generator | None = None,
                   explained: float = 0.9, max_components: int = MAX_COMPONENTS, iters: int = 5) -> LocalGeometry:
    """Client: K-Means patches (DP at finite ``epsilon``, which needs ``clip_norm``; plain k-means++
    without clipping at epsilon = inf, see :func:`client_prototypes`), kernel PCA of every patch in
    one call, betas by projection.

    X (n, D) the client's embeddings; B (S, D) the GAB. ``n_components`` is an int, or "auto":
    the smallest d whose top-d variances explain ``explained`` of every patch's feature-space
    variance (capped at ``max_components``). All ``n_clusters`` DP centres are uploaded; a patch
    with <= d points carries zero variances and betas. ``gamma`` must be the shared public one.
    The centres are DP (epsilon, delta spent are recorded); the spectra and betas are not.
    ``delta`` as in :func:`client_prototypes` (None only at epsilon = inf). ``generator``: None
    (the default) is a fresh, secretly seeded generator (:mod:`geomkern._random`).
    """
    X = _validate.tensor("X", X, ndim=2)
    B = _validate.tensor("B", B, ndim=2)
    _validate.same_device_dtype(X=X, B=B)
    _validate.same_dim("X", X, "B", B)
    g = _validate.gamma(gamma)
    auto = n_components == "auto"
    d_req = _validate.positive_int("max_components" if auto else "n_components",
                                   max_components if auto else n_components)
    if auto and not 0 < explained <= 1:
        raise ValueError(f"explained must lie in (0, 1], got {explained}")
    res = _clusters(X, n_clusters, epsilon=epsilon, delta=delta, clip_norm=clip_norm, iters=iters,
                    generator=generator)
    # Every one of the m DP centres is uploaded, whatever the (private) patch sizes: a patch with
    # <= d points has no d-component kernel PCA, so it goes up with zero variances and betas,
    # which gives it zero weight in the fusion (Eq. 7 weights n * lambda).
    sizes = torch.bincount(res.labels, minlength=n_clusters)
    keep = torch.nonzero(sizes > d_req).squeeze(1)
    m, S = n_clusters, B.shape[0]
    mu = X.new_zeros(m, d_req)
    lam = X.new_zeros(m, d_req)
    betas = X.new_zeros(m, d_req, S)
    d = d_req
    if keep.numel():
        order = torch.argsort(res.labels, stable=True)
        Xs = X[order]
        bounds = torch.zeros(n_clusters + 1, dtype=torch.int64)
        bounds[1:] = torch.cumsum(sizes.cpu(), 0)
        rows = torch.cat([torch.arange(int(bounds[j]), int(bounds[j + 1])) for j in keep.tolist()])
        Xk = Xs[rows.to(X.device)]
        offsets = torch.zeros(keep.numel() + 1, dtype=torch.int64)
        offsets[1:] = torch.cumsum(sizes[keep].cpu(), 0)
        fit = kpca(Xk, offsets.to(X.device), n_components=d_req, gamma=g)
        if auto:
            total = torch.stack([1.0 - rbf_gram(Xk[offsets[j]:offsets[j + 1]], gamma=g).mean()
                                 for j in range(keep.numel())]).clamp_min(torch.finfo(X.dtype).tiny)
            share = fit.variances.cumsum(1) / total.unsqueeze(1)
            reached = (share >= explained).to(torch.int64)
            # first d reaching the threshold per patch (d_req where none does); one d for all
            first = torch.where(reached.any(1), reached.argmax(1) + 1, torch.full_like(reached[:, 0], d_req))
            d = int(first.max())
        mu[keep] = fit.eigenvalues
        lam[keep] = fit.variances
        betas[keep] = project_onto_basis(Xk, fit, B, gamma=g)
    return LocalGeometry(centers=res.centers.contiguous(), counts=res.counts.to(X.dtype).contiguous(),
                         eigenvalues=mu[:, :d].contiguous(), variances=lam[:, :d].contiguous(),
                         betas=betas[:, :d].contiguous(), gamma=g,
                         epsilon=float(res.epsilon), delta=float(res.delta))
