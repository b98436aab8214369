"""FedMC (Federated Manifold Calibration): client and server steps as pure tensor functions.

Pipeline (each step is one call; any FL codebase can move the results over its own transport):

1. client  ``client_prototypes``  K-Means prototypes released with differential privacy.
2. server  ``build_gab``          K-Means over all clients' prototypes -> the shared anonymous
                                   basis (GAB) B (S, D); ``resolve_gamma`` derives the kernel width
                                   from it (public data: every client and the server use one gamma).
3. client  ``local_geometry``     DP K-Means patches, kernel PCA of every patch in one call, and
                                   betas = <v_i, Phi(b_s)> -> a LocalGeometry (LGD batch).
4. server  ``fuse``               meta-clustering of the uploaded centres into L regions and the
                                   weighted fusion of paper Eq. 7 -> a GeometryDictionary.
5. client  ``prepare``            the dictionary's per-GAB constants (Cholesky factor of the GAB
                                   Gram, coefficient maps), once per dictionary;
           ``calibrate``          nearest entry, perturbation in kernel-PC coordinates, pre-image.

``setup`` runs steps 1-4 for all clients in one process with the one set of sizing rules (the
simulator, the benchmarks and the demo all call it); its halves ``setup_basis`` (steps 1-2) and
``setup_geometry`` (steps 3-4 for any subset of clients) serve a per-round protocol (the paper's
Algorithm 1: fresh LGDs from each round's clients). What is exchanged (``GAB``, ``LocalGeometry``,
``GeometryDictionary``) follows :mod:`geomkern.exchange`: validated on construction,
to_dict/from_dict, one safetensors format (``save``/``load``). ``generator`` defaults to None,
which follows the package rule (:mod:`geomkern._random`): a fresh, secretly seeded generator,
never the global RNG.

Deviations from the paper's formulas (docs/design.md math notes, all deliberate):
* alphas are normalised (u / sqrt(mu)), so betas are exact inner products <v_i, Phi(b_s)>;
* the perturbation uses the feature-space variance lambda = mu / n (``formulation="paper"`` uses
  the Gram eigenvalue mu, as printed);
* ``formulation="consistent"`` treats betas as inner products: a_i = (G + rho I)^-1 beta_i gives
  p_i(z) ~ k(z, B) a_i and targets keep the part of Phi(x) outside the PC subspace;
  ``formulation="paper"`` is Eq. 10-13 literally: beta as expansion coefficients, the target built
  from the perturbed coordinates alone (T = sum_i p'_i beta_i G); ``formulation="hybrid"`` is the
  paper's perturbation added to k(x, B) (the part of Phi(x) outside the d components kept);
* at epsilon = inf the patches and prototypes are plain K-Means (k-means++, ``geomkern.kmeans``)
  on unclipped rows unless ``clip_norm`` is given; a finite epsilon needs ``clip_norm`` (the bound
  the DP release rests on);
* the LGD centre is a DP release, not a raw mean; spectra and betas are NOT protected (README).
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import NamedTuple, Sequence

import torch

from . import _random, _validate, privacy
from .exchange import Exchanged, read
from .ops.kmeans import kmeans
from .ops.kpca import kpca, project_onto_basis
from .ops.preimage import fixed_point_factor, preimage
from .ops.rbf import _sqdist, median_gamma, rbf_gram

FORMULATIONS = ("consistent", "hybrid", "paper")
PREIMAGE_METHODS = ("coordinates", "gd", "fixed_point")
# Chosen by benchmarks/fidelity.py (README: manifold fidelity): the pre-image method whose samples
# stayed closest to the manifold at matched displacement.
DEFAULT_METHOD = "fixed_point"
# rho of (G + rho I)^-1, relative to G's unit diagonal: the coefficient maps and the fixed-point solve
DEFAULT_RIDGE = 1e-3
# the cap on d for n_components="auto" (local_geometry and setup's patch sizing)
MAX_COMPONENTS = 16
_FORMAT = "geomkern.fedmc"


class Prototypes(NamedTuple):
    """What ``client_prototypes`` releases: DP centres (k, D), noisy counts (k,), spent (eps, delta)."""

    centers: torch.Tensor
    counts: torch.Tensor
    epsilon: float
    delta: float


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
    gen = _random.resolve(generator, "cpu")
    seed = int(torch.randint(0, 2 ** 62, (1,), generator=gen, device=gen.device))
    labels, centers = kmeans(Xc, k, seed=seed)
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


def build_gab(prototypes, n_base: int, *, seed: int = 0, iters: int = 50) -> torch.Tensor:
    """Server: K-Means of all clients' prototypes into ``n_base`` anonymous basis points B (S, D).

    prototypes: a (P, D) tensor or a list of per-client (k_i, D) tensors / :class:`Prototypes`.
    """
    if isinstance(prototypes, (list, tuple)):
        parts = [p.centers if isinstance(p, Prototypes) else p for p in prototypes]
        if not parts:
            raise ValueError("prototypes is an empty list; every client must send some")
        for i, p in enumerate(parts):
            _validate.tensor(f"prototypes[{i}]", p, ndim=2)
        P = torch.cat(parts)
    else:
        P = prototypes
    P = _validate.tensor("prototypes", P, ndim=2)
    n_base = _validate.positive_int("n_base", n_base)
    if n_base > P.shape[0]:
        raise ValueError(f"n_base={n_base} basis points cannot come from only {P.shape[0]} "
                         "prototypes; lower n_base or have clients send more prototypes")
    if n_base == P.shape[0]:
        return P.clone()
    _, centers = kmeans(P, n_base, seed=seed, iters=iters)
    return centers


def resolve_gamma(gamma, B: torch.Tensor) -> float:
    """gamma as a number, "median" (median heuristic on the GAB points) or "1/D" (the paper's)."""
    if gamma == "median":
        return median_gamma(B)
    if gamma == "1/D":
        return 1.0 / B.shape[1]
    return _validate.gamma(gamma)


@dataclass(eq=False)
class GAB(Exchanged):
    """The shared anonymous basis as an exchanged container: basis (S, D). ``build_gab`` returns
    the plain tensor B; ``GAB(B)`` is what goes over the wire (``save``/``to_dict``)."""

    basis: torch.Tensor

    _FORMAT = _FORMAT
    _KIND = "gab"
    _TENSORS = ("basis",)

    def _check(self):
        self.basis = _validate.tensor("GAB.basis", self.basis, ndim=2)


@dataclass(eq=False)
class PrototypeRelease(Exchanged):
    """A client's released prototypes (step 1) as an exchanged container: DP centres (k, D), noisy
    counts (k,) of the same float dtype, and the (epsilon, delta) the release spent (epsilon may be
    inf: released without noise). ``PrototypeRelease(*client_prototypes(...))`` is what goes over
    the wire; ``prototypes()`` gives back the :class:`Prototypes` that ``build_gab`` takes."""

    centers: torch.Tensor
    counts: torch.Tensor
    epsilon: float
    delta: float

    _FORMAT = _FORMAT
    _KIND = "prototypes"
    _TENSORS = ("centers", "counts")
    _SCALARS = ("epsilon", "delta")

    def _check(self):
        self.centers = _validate.tensor("PrototypeRelease.centers", self.centers, ndim=2)
        self.counts = _validate.tensor("PrototypeRelease.counts", self.counts, ndim=1)
        _validate.same_device_dtype(**{"PrototypeRelease.centers": self.centers,
                                       "PrototypeRelease.counts": self.counts})
        if self.counts.shape[0] != self.centers.shape[0]:
            raise ValueError(f"PrototypeRelease.counts has {self.counts.shape[0]} entries but centers has "
                             f"{self.centers.shape[0]} rows")
        for k in ("epsilon", "delta"):
            v = getattr(self, k)
            if not isinstance(v, numbers.Real) or math.isnan(v) or v < 0:
                raise ValueError(f"PrototypeRelease.{k} must be a number >= 0 (inf allowed for epsilon), got {v!r}")
            setattr(self, k, float(v))

    def prototypes(self) -> Prototypes:
        return Prototypes(self.centers, self.counts, self.epsilon, self.delta)


def _check_entries(obj, rows: str, sizes: str) -> None:
    """Shared by LocalGeometry and GeometryDictionary: m entries of rows (m, D), sizes (m,),
    eigenvalues and variances (m, d), betas (m, d, S), one float dtype and device, finite; gamma > 0."""
    name = type(obj).__name__
    t = {k: _validate.tensor(f"{name}.{k}", getattr(obj, k), ndim=nd)
         for k, nd in ((rows, 2), (sizes, 1), ("eigenvalues", 2), ("variances", 2), ("betas", 3))}
    _validate.same_device_dtype(**{f"{name}.{k}": v for k, v in t.items()})
    m, (d, S) = t[rows].shape[0], t["betas"].shape[1:]
    for k, shape in ((sizes, (m,)), ("eigenvalues", (m, d)), ("variances", (m, d)), ("betas", (m, d, S))):
        if tuple(t[k].shape) != shape:
            raise ValueError(f"{name}.{k} has shape {tuple(t[k].shape)}, expected {shape} ({m} entries in "
                             f"{rows}, d={d} components and S={S} basis points in betas)")
    for k in ("eigenvalues", "variances") + ((sizes,) if sizes == "weights" else ()):
        if bool((t[k] < 0).any()):  # exact: kpca returns 0, never round-off below it, for null components
            raise ValueError(f"{name}.{k} must be >= 0 ({'variances' if k != 'weights' else 'sample counts'}), "
                             f"got min {float(t[k].min()):.3g}")
    for k, v in t.items():
        setattr(obj, k, v)
    obj.gamma = _validate.gamma(obj.gamma)


@dataclass(eq=False)
class LocalGeometry(Exchanged):
    """A client's local geometry descriptors (one per patch j = 1..m), what it uploads.

    centers (m, D): DP patch centres; counts (m,): their (noisy) sizes; eigenvalues (m, d):
    centred-Gram eigenvalues mu; variances (m, d): mu / n; betas (m, d, S): <v_i, Phi(b_s)>;
    epsilon, delta: what the centres' DP release spent.
    """

    centers: torch.Tensor
    counts: torch.Tensor
    eigenvalues: torch.Tensor
    variances: torch.Tensor
    betas: torch.Tensor
    gamma: float
    epsilon: float = math.inf
    delta: float = 0.0

    _FORMAT = _FORMAT
    _KIND = "local_geometry"
    _TENSORS = ("centers", "counts", "eigenvalues", "variances", "betas")
    _SCALARS = ("gamma", "epsilon", "delta")

    def _check(self):
        _check_entries(self, "centers", "counts")
        eps, delta = self.epsilon, self.delta
        if any(isinstance(v, bool) or not isinstance(v, numbers.Real) for v in (eps, delta)):
            raise TypeError(f"LocalGeometry: epsilon and delta must be numbers, got {eps!r}, {delta!r}")
        eps, delta = float(eps), float(delta)
        if not eps > 0 or not 0 <= delta < 1:  # NaN fails both
            raise ValueError(f"LocalGeometry: epsilon must be > 0 (inf: no noise) and delta in [0, 1), "
                             f"got {eps}, {delta}")
        if math.isfinite(eps) and delta == 0:
            raise ValueError(f"LocalGeometry: epsilon={eps} with delta=0 is impossible: the centres are a "
                             "Gaussian-mechanism release, which is never pure (delta = 0) DP")
        self.epsilon, self.delta = eps, delta


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


@dataclass(eq=False)
class GeometryDictionary(Exchanged):
    """The server's fused geometry: L entries with prototypes (L, D), weights (L,) (summed patch
    counts), eigenvalues (L, d), variances (L, d) and betas (L, d, S)."""

    prototypes: torch.Tensor
    weights: torch.Tensor
    eigenvalues: torch.Tensor
    variances: torch.Tensor
    betas: torch.Tensor
    gamma: float

    _FORMAT = _FORMAT
    _KIND = "geometry_dictionary"
    _TENSORS = ("prototypes", "weights", "eigenvalues", "variances", "betas")
    _SCALARS = ("gamma",)

    def _check(self):
        _check_entries(self, "prototypes", "weights")


def fuse(lgds: Sequence[LocalGeometry], *, n_entries: int, seed: int = 0) -> GeometryDictionary:
    """Server: meta-cluster all uploaded patch centres into (at most) ``n_entries`` regions and fuse each
    region's patches by paper Eq. 7: per component i, beta*_i = sum_j n_j lambda_j,i beta_j,i /
    sum_j n_j lambda_j,i and lambda*_i = sum_j n_j lambda_j,i / sum_j n_j (the variance is
    sample-weighted). The paper does not define the fused Gram eigenvalue mu*; here it is
    sample-weighted like lambda* (mu*_i = sum_j n_j mu_j,i / sum_j n_j).

    Before averaging, each patch's beta_i is sign-aligned with that of the region's member with
    the largest weight for component i (eigenvector signs are arbitrary per patch; averaging
    opposite signs would cancel them). All
    LGDs must share gamma, d and S.
    """
    if not isinstance(lgds, (list, tuple)) or not lgds:
        raise ValueError("lgds must be a non-empty list of LocalGeometry")
    for i, l in enumerate(lgds):
        if not isinstance(l, LocalGeometry):
            raise TypeError(f"lgds[{i}] must be a LocalGeometry, got {type(l).__name__}")
        if l.gamma != lgds[0].gamma or l.betas.shape[1:] != lgds[0].betas.shape[1:] \
                or l.centers.shape[1] != lgds[0].centers.shape[1]:
            raise ValueError(f"lgds[{i}] disagrees with lgds[0] on gamma, d, S or D "
                             f"(gamma {l.gamma} vs {lgds[0].gamma}, betas {tuple(l.betas.shape)} vs "
                             f"{tuple(lgds[0].betas.shape)}); every client must use the same GAB, "
                             "gamma and n_components")
    L = _validate.positive_int("n_entries", n_entries)
    centers = torch.cat([l.centers for l in lgds])
    if L > centers.shape[0]:
        raise ValueError(f"n_entries={L} exceeds the {centers.shape[0]} uploaded patches; lower it")
    counts = torch.cat([l.counts for l in lgds]).to(centers.dtype).clamp_min(1.0)
    mu = torch.cat([l.eigenvalues for l in lgds])
    lam = torch.cat([l.variances for l in lgds])
    betas = torch.cat([l.betas for l in lgds])
    region, _ = kmeans(centers, L, seed=seed)
    # a region K-Means left empty has nothing to fuse: compact the ids (the dictionary may hold
    # fewer than n_entries entries)
    used, region = torch.unique(region, return_inverse=True)
    return _fuse_regions(centers, counts, mu, lam, betas, region, used.numel(), lgds[0].gamma)


def _fuse_regions(centers, counts, mu, lam, betas, region, L: int, gamma: float) -> GeometryDictionary:
    d = lam.shape[1]
    w = counts.unsqueeze(1) * lam  # (P, d): Eq. 7 weights n_j * lambda_j,i
    # sign alignment, per region and component, against the member with the largest weight
    heaviest = torch.zeros(L, d, dtype=torch.int64, device=centers.device)
    for r in range(L):
        members = torch.nonzero(region == r).squeeze(1)
        heaviest[r] = members[w[members].argmax(0)]
    ref = betas[heaviest[region], torch.arange(d, device=betas.device)]  # (P, d, S)
    sign = torch.sign((betas * ref).sum(-1))
    sign = torch.where(sign == 0, torch.ones_like(sign), sign)
    aligned = betas * sign.unsqueeze(-1)
    wsum = torch.zeros(L, d, dtype=w.dtype, device=w.device).index_add_(0, region, w)
    safe = torch.where(wsum > 0, wsum, torch.ones_like(wsum))

    def wmean(v):  # (P, d, ...) -> (L, d, ...)
        shape = (L,) + tuple(v.shape[1:])
        acc = torch.zeros(shape, dtype=v.dtype, device=v.device)
        acc.index_add_(0, region, v * w.view(w.shape + (1,) * (v.dim() - 2)))
        return acc / safe.view(safe.shape + (1,) * (v.dim() - 2))

    n_r = torch.zeros(L, dtype=counts.dtype, device=counts.device).index_add_(0, region, counts)

    def nmean(v):  # (P, d) -> (L, d), weights n_j: Eq. 7's variance fusion
        acc = torch.zeros(L, v.shape[1], dtype=v.dtype, device=v.device)
        return acc.index_add_(0, region, v * counts.unsqueeze(1)) / n_r.unsqueeze(1)

    protos = torch.zeros(L, centers.shape[1], dtype=centers.dtype, device=centers.device)
    protos.index_add_(0, region, centers * counts.unsqueeze(1))
    protos /= n_r.unsqueeze(1)
    return GeometryDictionary(prototypes=protos, weights=n_r, eigenvalues=nmean(mu),
                              variances=nmean(lam), betas=wmean(aligned), gamma=gamma)


def nearest_entry(X: torch.Tensor, dictionary: GeometryDictionary) -> torch.Tensor:
    """Index (b,) of the dictionary prototype nearest to each row of X."""
    return _sqdist(X, dictionary.prototypes).argmin(1)


@dataclass(eq=False)
class PreparedDictionary:
    """A GeometryDictionary with its GAB and the constants ``calibrate`` needs for it, computed once
    by :func:`prepare` (they only change when the dictionary or the GAB does).

    factor (S, S): float64 Cholesky factor of G + ridge I, G = K(B, B), for the fixed-point solve.
    coefficients (L, d, S): the rows a_i = (G + ridge I)^-1 beta_i of each entry's map A_l.
    captured (L, d): a_i^T beta_i, the share of v_i the GAB span represents (clamped to [0, 1]).
    paper_directions (L, d, S): betas G, the targets' directions under ``formulation="paper"`` and
    ``"hybrid"`` (Phi(v_i) = sum_s beta_is Phi(b_s) has kernel values beta_i G on the basis).
    """

    dictionary: GeometryDictionary
    basis: torch.Tensor
    ridge: float
    factor: torch.Tensor
    coefficients: torch.Tensor
    captured: torch.Tensor
    paper_directions: torch.Tensor

    @property
    def gamma(self) -> float:
        return self.dictionary.gamma


def prepare(dictionary: GeometryDictionary, B: torch.Tensor, *, ridge: float = DEFAULT_RIDGE) -> PreparedDictionary:
    """The per-dictionary constants of :func:`calibrate` (see :class:`PreparedDictionary`), once.

    ``ridge`` is rho relative to G's unit diagonal, used by the coefficient maps and by the
    fixed-point pre-image alike.
    """
    if not isinstance(dictionary, GeometryDictionary):
        raise TypeError(f"dictionary must be a GeometryDictionary (from fedmc.fuse or fedmc.load), "
                        f"got {type(dictionary).__name__}")
    B = _validate.tensor("B", B, ndim=2)
    _validate.same_device_dtype(B=B, prototypes=dictionary.prototypes)
    _validate.same_dim("B", B, "dictionary.prototypes", dictionary.prototypes)
    if dictionary.betas.shape[2] != B.shape[0]:
        raise ValueError(f"dictionary has betas for S={dictionary.betas.shape[2]} basis points but B "
                         f"has {B.shape[0]}; use the GAB the dictionary was built with")
    if isinstance(ridge, bool) or not isinstance(ridge, (int, float)) or not (math.isfinite(ridge) and ridge > 0):
        raise ValueError(f"ridge must be a finite number > 0, got {ridge!r}")
    g = dictionary.gamma
    # One factorisation of G + ridge I (float64, like the fixed-point solve that reuses it) gives the
    # coefficient maps a_i = (G + ridge I)^-1 beta_i too.
    factor = fixed_point_factor(B, g, ridge)
    betas = dictionary.betas.double()
    L, d, S = betas.shape
    coef = torch.cholesky_solve(betas.reshape(L * d, S).T, factor).T.reshape(L, d, S)
    captured = (coef * betas).sum(-1).clamp(0.0, 1.0)
    dtype = dictionary.betas.dtype
    return PreparedDictionary(dictionary=dictionary, basis=B, ridge=float(ridge), factor=factor,
                              coefficients=coef.to(dtype).contiguous(), captured=captured.to(dtype),
                              paper_directions=dictionary.betas @ rbf_gram(B, gamma=g))


def _prepared(dictionary, B, ridge) -> PreparedDictionary:
    """``dictionary`` as a PreparedDictionary (checked against B and ridge when already one)."""
    if isinstance(dictionary, PreparedDictionary):
        prep = dictionary
        if B is not None and B is not prep.basis and not (B.shape == prep.basis.shape and torch.equal(B, prep.basis)):
            raise ValueError("B differs from the GAB the dictionary was prepared with; omit B or "
                             "prepare the dictionary with this one")
        if ridge is not None and ridge != prep.ridge:
            raise ValueError(f"ridge={ridge} differs from the prepared dictionary's {prep.ridge}; "
                             "prepare it again with this ridge")
        return prep
    if B is None:
        raise ValueError("calibrate needs the GAB B with a GeometryDictionary (or pass "
                         "fedmc.prepare(dictionary, B))")
    return prepare(dictionary, B, ridge=DEFAULT_RIDGE if ridge is None else ridge)


def _check_scale(scale) -> float:
    if isinstance(scale, bool) or not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale >= 0):
        raise ValueError(f"scale must be a finite number >= 0, got {scale!r}")
    return float(scale)


def _perturb(X, prep: PreparedDictionary, formulation: str, scale: float, generator):
    """Nearest entry (b,), k(X, B) (b, S) and the coordinate perturbation dp (b, d) of one draw."""
    D_, B = prep.dictionary, prep.basis
    gen = _random.resolve(generator, X.device)
    entry = nearest_entry(X, D_)
    eps = torch.randn(X.shape[0], D_.variances.shape[1], generator=gen, dtype=X.dtype,
                      device=gen.device).to(X.device)
    kx = rbf_gram(X, B, gamma=prep.gamma)
    if formulation == "consistent":
        # Only the part of v_i inside span Phi(B) moves p_i(z) ~ k(z, B) a_i; its squared norm is
        # a_i^T beta_i (<= 1). Perturbing by the full sqrt(lambda) asks for coordinate changes the
        # GAB cannot express (on MiniLM embeddings almost no such target was reachable), so the
        # standard deviation is that of the representable part: sqrt(lambda * a_i^T beta_i).
        dp = scale * eps * (D_.variances * prep.captured)[entry].clamp_min(0).sqrt()
    else:
        dp = scale * eps * D_.eigenvalues[entry].clamp_min(0).sqrt()  # Gram eigenvalue, as printed
    return entry, kx, dp


def _kernel_targets(prep: PreparedDictionary, formulation: str, entry, kx, dp):
    """(T, T0): the kernel-value targets (b, S) for the perturbation dp and for none."""
    if formulation == "consistent":
        return kx + (dp.unsqueeze(-1) * prep.dictionary.betas[entry]).sum(1), kx
    W = prep.paper_directions[entry]  # (b, d, S): beta_i G, the kernel values of v_i on the basis
    if formulation == "hybrid":
        return kx + (dp.unsqueeze(-1) * W).sum(1), kx
    # paper, Eq. 10-13: with v_i = sum_s beta_is Phi(b_s), x's coordinates are
    # p_i = <Phi(x), v_i> = sum_s beta_is k(x, b_s); p'_i = p_i + dp_i, and the target is the
    # kernel values of sum_i p'_i v_i: T = sum_i p'_i beta_i G (nothing of Phi(x) outside the d
    # components survives, so even T0 = sum_i p_i beta_i G differs from k(x, B)).
    p = torch.bmm(prep.dictionary.betas[entry], kx.unsqueeze(-1)).squeeze(-1)  # (b, d)
    return ((p + dp).unsqueeze(-1) * W).sum(1), (p.unsqueeze(-1) * W).sum(1)


def targets(X: torch.Tensor, dictionary, B: torch.Tensor | None = None, *, formulation: str = "consistent",
            scale: float = 1.0, ridge: float | None = None, generator: torch.Generator | None = None):
    """The kernel-value targets (T, T0), each (b, S), that :func:`calibrate` hands its "gd" and
    "fixed_point" pre-image for the rows of X (b, D), drawing eps from ``generator`` exactly as
    calibrate does (same generator state -> same draw); T0 is the target with no perturbation.

    consistent: T = k(x, B) + sum_i dp_i beta_i, T0 = k(x, B);
    hybrid:     T = k(x, B) + sum_i dp_i beta_i G, T0 = k(x, B);
    paper:      T = sum_i (p_i + dp_i) beta_i G with p_i = beta_i . k(x, B), T0 the same with dp = 0
                (paper Eq. 10-13 as printed: beta as expansion coefficients of v_i on Phi(B)).
    dp_i = scale * eps_i * sqrt(lambda_i a_i^T beta_i) (consistent) or scale * eps_i * sqrt(mu_i)
    (paper, hybrid: the Gram eigenvalue, as printed).
    """
    prep = _prepared(dictionary, B, ridge)
    X = _validate.tensor("X", X, ndim=2)
    _validate.same_device_dtype(X=X, B=prep.basis)
    _validate.same_dim("X", X, "B", prep.basis)
    formulation = _validate.choice("formulation", formulation, FORMULATIONS)
    entry, kx, dp = _perturb(X, prep, formulation, _check_scale(scale), generator)
    return _kernel_targets(prep, formulation, entry, kx, dp)


def calibrate(X: torch.Tensor, dictionary, B: torch.Tensor | None = None, *,
              formulation: str = "consistent", method: str = DEFAULT_METHOD, scale: float = 1.0,
              steps: int | None = None, ridge: float | None = None, anchored: bool = True,
              generator: torch.Generator | None = None, return_loss: bool = False):
    """Client: one calibrated sample around each row of X (b, D) (repeat rows for more).

    ``dictionary`` is a :class:`PreparedDictionary` (from :func:`prepare`: the per-dictionary
    constants computed once; B may then be omitted), or a GeometryDictionary with its GAB B,
    prepared on the fly with ``ridge`` (default DEFAULT_RIDGE). The kernel is the dictionary's.

    For x in entry l (nearest prototype): draw eps ~ N(0, I_d), perturb the d kernel-PC
    coordinates by dp_i = scale * eps_i * sqrt(var_i) and find z by pre-image from z0 = x.

    formulation="consistent" (default): with A_l = betas_l (G + rho I)^-1 (rows a_i, so
    p_i(z) ~ k(z, B) a_i), var_i = lambda_i a_i^T beta_i: lambda = mu/n is the variance along v_i
    and a_i^T beta_i the share of v_i the GAB span represents (only that part moves
    k(z, B) a_i). method="coordinates" solves A_l k(z, B) = A_l k(x, B) + dp; "gd" and
    "fixed_point" use targets T = k(x, B) + dp betas_l.
    formulation="paper" (Eq. 10-13 as printed): var_i = mu_i (the Gram eigenvalue), betas as
    expansion coefficients, and the target built from the perturbed coordinates alone:
    T = sum_i (p_i + dp_i) beta_i G with p_i = beta_i . k(x, B) (see :func:`targets`).
    formulation="hybrid": the paper's perturbation added to x's own kernel values,
    T = k(x, B) + sum_i dp_i beta_i G. Both are solved by "gd" (Eq. 14) or "fixed_point".
    method defaults to DEFAULT_METHOD, the one that measured best in benchmarks/fidelity.py.
    ``scale`` multiplies the perturbation standard deviation. ``anchored=True`` (default) returns
    x + z(T) - z(T0) instead of z(T), with T0 the unperturbed target solved from the same start,
    wherever z(T0) != x: the fixed-point iteration (it lands in the span of B: on MiniLM
    embeddings |z(T0) - x| was 0.79 for unit-norm x, whatever the scale), and gd under
    formulation="paper" (its T0 keeps only x's d components). The pre-image's reconstruction error
    then cancels and only the perturbation moves the sample (measured in
    benchmarks/fedmc_defaults.py); gd under the other formulations and coordinates already have
    z(T0) = x. The paper's Eq. 14 as printed is ``formulation="paper", method="gd",
    anchored=False``. The loss returned is that of the solve for T. ``generator``: eps is drawn on
    its device (None, the default: a fresh, secretly seeded one on X's device,
    :mod:`geomkern._random`). Returns (b, D) rows on X's device, and the per-sample pre-image loss
    when ``return_loss``.
    """
    prep = _prepared(dictionary, B, ridge)
    D_, B = prep.dictionary, prep.basis
    X = _validate.tensor("X", X, ndim=2)
    _validate.same_device_dtype(X=X, B=B)
    _validate.same_dim("X", X, "B", B)
    formulation = _validate.choice("formulation", formulation, FORMULATIONS)
    method = _validate.choice("method", method, PREIMAGE_METHODS)
    if formulation != "consistent" and method == "coordinates":
        raise ValueError(f"formulation={formulation!r} defines kernel-value targets (Eq. 10-13): use "
                         "method='gd' (Eq. 14) or 'fixed_point'")
    g = prep.gamma
    scale = _check_scale(scale)
    if steps is None:
        # LM: 10 and 20 steps met the same targets; fixed point: the fidelity benchmark gave the
        # same ratios at 10, 20 and 100 steps; gd (the paper's) converges slowly: 100
        steps = 100 if method == "gd" else 10
    x = X
    entry, kx, dp = _perturb(x, prep, formulation, scale, generator)
    if method == "coordinates":
        A = prep.coefficients[entry]
        c = torch.bmm(A, kx.unsqueeze(-1)).squeeze(-1) + dp  # P(x) exactly as the solver computes it
        return preimage(x, B, c, gamma=g, method="coordinates", steps=steps, proj=A,
                        return_loss=return_loss)  # LM's z(T0) is x: nothing to anchor
    T, T0 = _kernel_targets(prep, formulation, entry, kx, dp)
    solve = dict(gamma=g, method=method, steps=steps, return_loss=return_loss)
    if method == "fixed_point":
        solve["factor"] = prep.factor
    # gd's z(T0) is x when T0 = k(x, B) (zero gradient at the start): anchoring it would only
    # double the work
    if not (anchored and (method == "fixed_point" or formulation == "paper")):
        return preimage(x, B, T, **solve)
    return _anchored(x, B, T, T0, **solve)


def _anchored(x, B, T, T0, *, return_loss: bool, **kw):
    """x + z(T) - z(T0), both pre-images from z0 = x in one batched call; the loss is z(T)'s."""
    b = x.shape[0]
    res = preimage(torch.cat([x, x]), B, torch.cat([T, T0]), return_loss=return_loss, **kw)
    Z, loss = res if return_loss else (res, None)
    out = x + (Z[:b] - Z[b:])
    return (out, loss[:b]) if return_loss else out


# ---------------------------------------------------------------- the whole set-up, simulated

@dataclass(eq=False)
class Setup:
    """What :func:`setup` returns: the GAB ``basis`` (S, D) and ``gamma``, every client's released
    ``prototypes`` and uploaded ``lgds``, the fused ``dictionary``, and per client the
    ``epsilon`` its two DP releases spent together (``privacy.compose_epsilon``, at ``delta``).
    ``B`` is a read-only alias of ``basis``: the name the GAB has in the formulas and in the
    step-by-step API (``fedmc.calibrate(X, dictionary, B)``)."""

    basis: torch.Tensor
    gamma: float
    prototypes: list
    lgds: list
    dictionary: GeometryDictionary
    epsilon: list
    delta: float

    @property
    def B(self) -> torch.Tensor:
        return self.basis


def setup(clients: Sequence[torch.Tensor], *, generators: Sequence[torch.Generator | None],
          n_prototypes: int, n_base: int, n_clusters: int, n_components: int | str, n_entries: int,
          gamma="median", epsilon: float = math.inf, delta: float = 1e-5, clip_norm: float | None = None,
          explained: float = 0.9, max_components: int = MAX_COMPONENTS, iters: int = 5,
          seed: int = 0, epsilon_total: float | None = None) -> Setup:
    """Steps 1-4 for every client and the server, in one process: the one FedMC set-up recipe.

    clients: each client's embeddings (n_k, D), on any one device (results stay there); a client
    with no rows takes no part (it releases nothing: its prototypes and lgds entries are None and
    its epsilon 0);
    generators: one per client, driving its two DP releases in turn (None: secret seeds).
    Privacy: at finite epsilon (``clip_norm`` required) each of the two releases (prototypes, patch
    centres) spends ``epsilon`` at ``delta``
    (together ``Setup.epsilon`` per client), or, with ``epsilon_total``, the two share that budget
    (``privacy.split_epsilon``) so that a client spends at most ``epsilon_total`` in all.
    Sizing rules (so small clients and small federations still work):
    * client k releases min(n_prototypes, n_k) prototypes;
    * the GAB has min(n_base, all prototypes) points (``build_gab`` with ``seed``); gamma is
      resolved on it ("median", "1/D" or a number: public, one for everybody);
    * client k cuts max(1, min(n_clusters, n_k // (2 d))) patches, d = n_components (or
      max_components for "auto"): d kernel PCs need patches of more than d points;
    * the dictionary has min(n_entries, all patches) entries (``fuse`` with ``seed``).
    """
    protos, B, g = setup_basis(clients, generators=generators, n_prototypes=n_prototypes, n_base=n_base,
                               gamma=gamma, epsilon=epsilon, delta=delta, clip_norm=clip_norm, iters=iters,
                               seed=seed, epsilon_total=epsilon_total, calls=2)
    if epsilon_total is not None:
        epsilon = privacy.split_epsilon(epsilon_total, delta, calls=2, releases=iters)
    lgds, dictionary = setup_geometry(clients, B, g, generators=generators, n_clusters=n_clusters,
                                      n_components=n_components, n_entries=n_entries, epsilon=epsilon,
                                      delta=delta, clip_norm=clip_norm, explained=explained,
                                      max_components=max_components, iters=iters, seed=seed)
    # both releases of a client use the same (epsilon, delta, iters), hence the same multiplier
    total = spent(epsilon, delta, iters=iters, releases=2)
    return Setup(basis=B, gamma=g, prototypes=protos, lgds=lgds, dictionary=dictionary,
                 epsilon=[total if p is not None else 0.0 for p in protos], delta=delta)


def _active(clients, generators) -> list[int]:
    """Indices of the clients with rows (a client with none takes no part); checks the lists."""
    if not isinstance(clients, (list, tuple)) or not clients:
        raise ValueError("clients must be a non-empty list of (n_k, D) tensors")
    if not isinstance(generators, (list, tuple)) or len(generators) != len(clients):
        raise ValueError(f"generators must be a list with one entry per client ({len(clients)}), "
                         f"got {generators!r}")
    active = [k for k, x in enumerate(clients) if not (isinstance(x, torch.Tensor) and x.dim() == 2
                                                        and x.shape[0] == 0)]
    if not active:
        raise ValueError("every client is empty (0 rows); FedMC needs data on at least one client")
    return active


def spent(epsilon: float, delta: float, *, iters: int, releases: int) -> float:
    """What a client spends (epsilon at ``delta``) over ``releases`` calls of ``iters`` noisy Lloyd
    releases each at per-call ``epsilon`` (one PLD accountant; inf for epsilon = inf)."""
    z = privacy.noise_multiplier(epsilon, delta, releases=iters, sensitivity=privacy.SUM_COUNT_SENSITIVITY)
    return privacy.compose_epsilon([(z, iters)] * releases, delta)


def setup_basis(clients: Sequence[torch.Tensor], *, generators: Sequence[torch.Generator | None],
                n_prototypes: int, n_base: int, gamma="median", epsilon: float = math.inf,
                delta: float = 1e-5, clip_norm: float | None = None, iters: int = 5, seed: int = 0,
                epsilon_total: float | None = None, calls: int = 2):
    """Steps 1-2 of :func:`setup`: every client's prototypes, the GAB B and the shared gamma.
    Returns (prototypes (None for an empty client), B, gamma). ``epsilon_total`` is split over
    ``calls`` calls of ``iters`` releases (the prototypes' and the patches' in :func:`setup`)."""
    active = _active(clients, generators)
    if epsilon_total is not None:
        if epsilon != math.inf:
            raise ValueError(f"give epsilon (per release, got {epsilon}) or epsilon_total (both releases "
                             f"together, got {epsilon_total}), not both")
        epsilon = privacy.split_epsilon(epsilon_total, delta, calls=calls, releases=iters)
    protos: list = [None] * len(clients)
    for k in active:
        protos[k] = setup_client_prototypes(clients[k], generators[k], n_prototypes=n_prototypes, epsilon=epsilon,
                                            delta=delta, clip_norm=clip_norm, iters=iters)
    B, g = setup_server_basis([protos[k] for k in active], n_base=n_base, gamma=gamma, seed=seed)
    return protos, B, g


def setup_client_prototypes(x: torch.Tensor, generator, *, n_prototypes: int, epsilon: float, delta: float,
                            clip_norm: float | None, iters: int = 5) -> Prototypes:
    """Step 1 for one client with rows x (n_k, D), as :func:`setup` sizes it: min(n_prototypes, n_k)
    DP prototypes (what :func:`setup_basis` runs per client, and a client of a real federation runs
    alone)."""
    return client_prototypes(x, min(n_prototypes, x.shape[0]), epsilon=epsilon, delta=delta,
                             clip_norm=clip_norm, generator=generator, iters=iters)


def setup_server_basis(released, *, n_base: int, gamma="median", seed: int = 0):
    """Step 2 on the server, as :func:`setup` sizes it: the GAB of min(n_base, all prototypes)
    points from the released prototypes (a list of :class:`Prototypes`), and gamma resolved on it.
    Returns (B, gamma)."""
    B = build_gab(released, min(n_base, sum(p.centers.shape[0] for p in released)), seed=seed)
    return B, resolve_gamma(gamma, B)


def setup_geometry(clients: Sequence[torch.Tensor], B: torch.Tensor, gamma: float, *,
                   generators: Sequence[torch.Generator | None], n_clusters: int, n_components: int | str,
                   n_entries: int, epsilon: float = math.inf, delta: float = 1e-5,
                   clip_norm: float | None = None, explained: float = 0.9,
                   max_components: int = MAX_COMPONENTS, iters: int = 5, seed: int = 0):
    """Steps 3-4 of :func:`setup` for the given clients (a client with no rows, or None, takes no
    part): their LGDs on the GAB B, and the dictionary fused from them. Returns (lgds, dictionary);
    ``lgds[k]`` is None for a client that took no part. Sizing as :func:`setup` says."""
    clients = [c if c is not None else B[:0] for c in clients]
    active = _active(clients, generators)
    lgds: list = [None] * len(clients)
    for k in active:
        lgds[k] = setup_client_geometry(clients[k], B, gamma, generators[k], n_clusters=n_clusters,
                                        n_components=n_components, epsilon=epsilon, delta=delta,
                                        clip_norm=clip_norm, explained=explained, max_components=max_components,
                                        iters=iters)
    return lgds, setup_server_fuse([lgds[k] for k in active], n_entries=n_entries, seed=seed)


def setup_client_geometry(x: torch.Tensor, B: torch.Tensor, gamma: float, generator, *, n_clusters: int,
                          n_components: int | str, epsilon: float = math.inf, delta: float = 1e-5,
                          clip_norm: float | None = None, explained: float = 0.9,
                          max_components: int = MAX_COMPONENTS, iters: int = 5) -> "LocalGeometry":
    """Step 3 for one client with rows x (n_k, D), as :func:`setup` sizes it: its LGD on the GAB B
    with max(1, min(n_clusters, n_k // (2 d))) patches (what :func:`setup_geometry` runs per client)."""
    d = max_components if n_components == "auto" else _validate.positive_int("n_components", n_components)
    return local_geometry(x, B, n_clusters=max(1, min(n_clusters, x.shape[0] // (2 * d))),
                          n_components=n_components, gamma=gamma, epsilon=epsilon, delta=delta,
                          clip_norm=clip_norm, generator=generator, explained=explained,
                          max_components=max_components, iters=iters)


def setup_server_fuse(uploaded, *, n_entries: int, seed: int = 0) -> "GeometryDictionary":
    """Step 4 on the server, as :func:`setup` sizes it: the dictionary of min(n_entries, all
    patches) entries fused from the uploaded LGDs (a non-empty list of :class:`LocalGeometry`)."""
    return fuse(uploaded, n_entries=min(n_entries, sum(l.centers.shape[0] for l in uploaded)), seed=seed)


# ---------------------------------------------------------------- serialisation (geomkern.exchange)

_KINDS = {c._KIND: c for c in (GAB, PrototypeRelease, LocalGeometry, GeometryDictionary)}


def save(obj, path) -> None:
    """Write a GAB (or the plain (S, D) tensor), LocalGeometry or GeometryDictionary to ``path``:
    ``obj.save(path)`` of the exchange convention (safetensors + JSON metadata, never pickle)."""
    if isinstance(obj, torch.Tensor):
        obj = GAB(obj)
    if not isinstance(obj, tuple(_KINDS.values())):
        raise TypeError(f"cannot save {type(obj).__name__}; expected a GAB tensor, PrototypeRelease, "
                        "LocalGeometry or GeometryDictionary")
    obj.save(path)


def load(path, *, kind: str | None = None, device: str | torch.device = "cpu"):
    """Read a file written by :func:`save` (any of the three kinds; ``kind`` insists on one),
    validated like a construction. A GAB comes back as the plain (S, D) tensor.

    Raises ValueError naming the problem for a malformed, corrupted or mismatched file.
    """
    found, fields = read(path, _FORMAT)
    if found not in _KINDS:
        raise ValueError(f"{path} has unknown kind {found!r}")
    if kind is not None and found != kind:
        raise ValueError(f"{path} holds a {found}, expected a {kind}")
    obj = _KINDS[found]._build(path, fields, device)
    return obj.basis if isinstance(obj, GAB) else obj
