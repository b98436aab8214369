"""FedMC (Federated Manifold Calibration): client and server steps as pure tensor functions.

Pipeline (each step is one call; any FL codebase can move the results over its own transport):

1. client  ``client_prototypes``  K-Means prototypes released with differential privacy.
2. server  ``build_gab``          K-Means over all clients' prototypes -> the shared anonymous
                                   basis (GAB) B (S, D); ``gab_gamma`` derives the kernel width from
                                   it (public data: every client and the server use one gamma).
3. client  ``local_geometry``     DP K-Means patches, kernel PCA of every patch in one call, and
                                   betas = <v_i, Phi(b_s)> -> a LocalGeometry (LGD batch).
4. server  ``fuse``               meta-clustering of the uploaded centres into L regions and the
                                   weighted fusion of paper Eq. 7 -> a GeometryDictionary.
5. client  ``calibrate``          nearest entry, perturbation in kernel-PC coordinates, pre-image.

Deviations from the paper's formulas (DESIGN.md math notes, all deliberate):
* alphas are normalised (u / sqrt(mu)), so betas are exact inner products <v_i, Phi(b_s)>;
* the perturbation uses the feature-space variance lambda = mu / n (``formulation="paper"`` uses
  the Gram eigenvalue mu, as printed);
* ``formulation="consistent"`` treats betas as inner products: a_i = (G + rho I)^-1 beta_i gives
  p_i(z) ~ k(z, B) a_i and targets keep the part of Phi(x) outside the PC subspace;
  ``formulation="paper"`` uses beta as expansion coefficients (Eq. 10-14 literally);
* the LGD centre is a DP release, not a raw mean; spectra and betas are NOT protected (README).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields
from pathlib import Path
from typing import NamedTuple, Sequence

import torch

from . import _validate, privacy
from .ops.kmeans import kmeans
from .ops.kpca import kpca, project_onto_basis
from .ops.preimage import preimage, preimage_loss
from .ops.rbf import _sqdist, median_gamma, rbf_gram

FORMULATIONS = ("consistent", "paper")
PREIMAGE_METHODS = ("coordinates", "gd", "fixed_point")
# Chosen by benchmarks/fidelity.py (README: manifold fidelity): the pre-image method whose samples
# stayed closest to the manifold at matched displacement.
DEFAULT_METHOD = "fixed_point"
FORMAT_VERSION = 1


class Prototypes(NamedTuple):
    """What ``client_prototypes`` releases: DP centres (k, D), noisy counts (k,), spent (eps, delta)."""

    centers: torch.Tensor
    counts: torch.Tensor
    epsilon: float
    delta: float


def client_prototypes(X: torch.Tensor, k: int, *, epsilon: float, delta: float, clip_norm: float,
                      generator: torch.Generator | None = None, iters: int = 5) -> Prototypes:
    """K-Means prototypes of a client's embeddings X (n, D), released through noisy Lloyd steps.

    ``epsilon=math.inf`` releases them without noise. The returned epsilon is what the
    accountant says was spent (<= the requested one).
    """
    X = _validate.tensor("X", X, ndim=2)
    res = privacy.dp_lloyd(X, k, epsilon=epsilon, delta=delta, clip_norm=clip_norm, iters=iters,
                           generator=generator)
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


gab_gamma = median_gamma  # the public-data bandwidth: gab_gamma(B)


@dataclass
class LocalGeometry:
    """A client's local geometry descriptors (one per patch j = 1..m), what it uploads.

    centers (m, D): DP patch centres; counts (m,): their (noisy) sizes; eigenvalues (m, d):
    centred-Gram eigenvalues mu; variances (m, d): mu / n; betas (m, d, S): <v_i, Phi(b_s)>.
    """

    centers: torch.Tensor
    counts: torch.Tensor
    eigenvalues: torch.Tensor
    variances: torch.Tensor
    betas: torch.Tensor
    gamma: float
    epsilon: float = math.inf
    delta: float = 0.0

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in _tensors(self).values())


def local_geometry(X: torch.Tensor, B: torch.Tensor, *, n_clusters: int, n_components: int | str,
                   gamma: float, epsilon: float = math.inf, delta: float = 1e-5,
                   clip_norm: float = 1.0, generator: torch.Generator | None = None,
                   explained: float = 0.9, max_components: int = 16, iters: int = 5) -> LocalGeometry:
    """Client: DP K-Means patches, kernel PCA of every patch in one call, betas by projection.

    X (n, D) the client's embeddings; B (S, D) the GAB. ``n_components`` is an int, or "auto":
    the smallest d whose top-d variances explain ``explained`` of every patch's feature-space
    variance (capped at ``max_components``). All ``n_clusters`` DP centres are uploaded; a patch
    with <= d points carries zero variances and betas. ``gamma`` must be the shared public one.
    The centres are DP (epsilon, delta spent are recorded); the spectra and betas are not.
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
    res = privacy.dp_lloyd(X, n_clusters, epsilon=epsilon, delta=delta, clip_norm=clip_norm,
                           iters=iters, generator=generator)
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


@dataclass
class GeometryDictionary:
    """The server's fused geometry: L entries with prototypes (L, D), weights (L,) (summed patch
    counts), eigenvalues (L, d), variances (L, d) and betas (L, d, S)."""

    prototypes: torch.Tensor
    weights: torch.Tensor
    eigenvalues: torch.Tensor
    variances: torch.Tensor
    betas: torch.Tensor
    gamma: float

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in _tensors(self).values())


def fuse(lgds: Sequence[LocalGeometry], *, n_entries: int, seed: int = 0) -> GeometryDictionary:
    """Server: meta-cluster all uploaded patch centres into (at most) ``n_entries`` regions and fuse each
    region's patches by paper Eq. 7: per component i, a weighted mean with weights n_j * lambda_j,i
    of the variances, eigenvalues and betas.

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
    protos = torch.zeros(L, centers.shape[1], dtype=centers.dtype, device=centers.device)
    protos.index_add_(0, region, centers * counts.unsqueeze(1))
    protos /= n_r.unsqueeze(1)
    return GeometryDictionary(prototypes=protos, weights=n_r, eigenvalues=wmean(mu),
                              variances=wmean(lam), betas=wmean(aligned), gamma=gamma)


def nearest_entry(X: torch.Tensor, dictionary: GeometryDictionary) -> torch.Tensor:
    """Index (b,) of the dictionary prototype nearest to each row of X."""
    return _sqdist(X, dictionary.prototypes).argmin(1)


def calibrate(X: torch.Tensor, dictionary: GeometryDictionary, B: torch.Tensor, *,
              gamma: float | None = None, formulation: str = "consistent",
              method: str = DEFAULT_METHOD, scale: float = 1.0, n_per_sample: int = 1,
              steps: int | None = None, ridge: float = 1e-3, anchored: bool = True,
              generator: torch.Generator | None = None, return_loss: bool = False):
    """Client: calibrated samples around each row of X (b, D), ``n_per_sample`` each.

    For x in entry l (nearest prototype): draw eps ~ N(0, I_d), perturb the d kernel-PC
    coordinates by dp_i = scale * eps_i * sqrt(lambda_li) and find z by pre-image from z0 = x.

    formulation="consistent" (default): with A_l = betas_l (G + rho I)^-1 (rows a_i, so
    p_i(z) ~ k(z, B) a_i), dp_i = scale * eps_i * sqrt(lambda_i a_i^T beta_i): lambda = mu/n is the
    variance along v_i and a_i^T beta_i the share of v_i the GAB span represents (only that part
    moves k(z, B) a_i). method="coordinates" solves A_l k(z, B) = A_l k(x, B) + dp; "gd" and
    "fixed_point" use targets T = k(x, B) + dp betas_l.
    formulation="paper": lambda = Gram eigenvalue mu, targets T = k(x, B) + dp betas_l G (betas
    as expansion coefficients, Eq. 10-13), solved by "gd" (Eq. 14) or "fixed_point".
    method defaults to DEFAULT_METHOD, the one that measured best in benchmarks/fidelity.py.
    ``scale`` multiplies the perturbation standard deviation. ``ridge`` is rho relative to G's
    unit diagonal. ``anchored=True`` (default) returns x + z(T) - z(T0) instead of z(T), with T0
    the unperturbed target solved from the same start: the pre-image's reconstruction error (the
    fixed-point iteration lands in the span of B: on MiniLM embeddings |z(T0) - x| was 0.79 for
    unit-norm x, whatever the scale) cancels and only the perturbation moves the sample (measured
    in benchmarks/fedmc_defaults.py; gd and coordinates already have z(T0) = x). The loss
    returned is that of the solve for T. Returns (b * n_per_sample, D) rows in the order of X
    repeated, and the per-sample pre-image loss when ``return_loss``.
    """
    X = _validate.tensor("X", X, ndim=2)
    B = _validate.tensor("B", B, ndim=2)
    _validate.same_device_dtype(X=X, B=B, prototypes=dictionary.prototypes)
    _validate.same_dim("X", X, "B", B)
    if dictionary.betas.shape[2] != B.shape[0]:
        raise ValueError(f"dictionary has betas for S={dictionary.betas.shape[2]} basis points but B "
                         f"has {B.shape[0]}; use the GAB the dictionary was built with")
    formulation = _validate.choice("formulation", formulation, FORMULATIONS)
    method = _validate.choice("method", method, PREIMAGE_METHODS)
    if formulation == "paper" and method == "coordinates":
        raise ValueError("formulation='paper' defines kernel-value targets (Eq. 10-13): use "
                         "method='gd' (Eq. 14) or 'fixed_point'")
    g = dictionary.gamma if gamma is None else _validate.gamma(gamma)
    if g != dictionary.gamma:
        raise ValueError(f"gamma={g} differs from the dictionary's {dictionary.gamma}; the betas are "
                         "only meaningful under the kernel they were computed with")
    if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale >= 0):
        raise ValueError(f"scale must be a finite number >= 0, got {scale!r}")
    reps = _validate.positive_int("n_per_sample", n_per_sample)
    if steps is None:
        # LM: 10 and 20 steps met the same targets; fixed point: the fidelity benchmark gave the
        # same ratios at 10, 20 and 100 steps; gd (the paper's) converges slowly: 100
        steps = 100 if method == "gd" else 10
    entry = nearest_entry(X, dictionary).repeat_interleave(reps)
    x = X.repeat_interleave(reps, dim=0)
    eps = torch.randn(x.shape[0], dictionary.variances.shape[1], generator=generator, dtype=X.dtype,
                      device="cpu" if generator is None else generator.device).to(X.device)
    kx = rbf_gram(x, B, gamma=g)  # (b, S)
    betas = dictionary.betas[entry]  # (b, d, S)
    G = rbf_gram(B, gamma=g)
    if formulation == "consistent":
        Greg = G.clone()
        Greg.diagonal().add_(ridge)
        coef = torch.linalg.solve(Greg, dictionary.betas.transpose(1, 2)).transpose(1, 2)  # (L, d, S)
        # Only the part of v_i inside span Phi(B) moves p_i(z) ~ k(z, B) a_i; its squared norm is
        # a_i^T beta_i (<= 1). Perturbing by the full sqrt(lambda) asks for coordinate changes the
        # GAB cannot express (on MiniLM embeddings almost no such target was reachable), so the
        # standard deviation is that of the representable part: sqrt(lambda * a_i^T beta_i).
        captured = (coef * dictionary.betas).sum(-1).clamp(0.0, 1.0)  # (L, d)
        dp = scale * eps * (dictionary.variances * captured)[entry].clamp_min(0).sqrt()
        if method == "coordinates":
            A = coef[entry]
            c = torch.bmm(A, kx.unsqueeze(-1)).squeeze(-1) + dp  # P(x) exactly as the solver computes it
            return preimage(x, B, c, gamma=g, method="coordinates", steps=steps, proj=A,
                            return_loss=return_loss)  # LM's z(T0) is x: nothing to anchor
        T = kx + (dp.unsqueeze(-1) * betas).sum(1)
    else:
        dp = scale * eps * dictionary.eigenvalues[entry].clamp_min(0).sqrt()  # Gram eigenvalue, as printed
        T = kx + (dp.unsqueeze(-1) * (betas @ G)).sum(1)
    # Only the fixed-point iteration moves away from an already-met target: gd's z(T0) is x (zero
    # gradient), so anchoring it would only double the work.
    if not (anchored and method == "fixed_point"):
        return preimage(x, B, T, gamma=g, method=method, steps=steps, return_loss=return_loss)
    return _anchored(x, B, T, kx, gamma=g, method=method, steps=steps, return_loss=return_loss)


def _anchored(x, B, T, T0, *, return_loss: bool, **kw):
    """x + z(T) - z(T0), both pre-images from z0 = x in one batched call; the loss is z(T)'s."""
    b = x.shape[0]
    res = preimage(torch.cat([x, x]), B, torch.cat([T, T0]), return_loss=return_loss, **kw)
    Z, loss = res if return_loss else (res, None)
    out = x + (Z[:b] - Z[b:])
    return (out, loss[:b]) if return_loss else out


# ---------------------------------------------------------------- serialisation (safetensors + JSON)

_KINDS = {"gab": None, "local_geometry": LocalGeometry, "geometry_dictionary": GeometryDictionary}


def _tensors(obj) -> dict[str, torch.Tensor]:
    return {f.name: getattr(obj, f.name) for f in fields(obj) if isinstance(getattr(obj, f.name), torch.Tensor)}


def save(obj, path) -> None:
    """Write a GAB tensor, LocalGeometry or GeometryDictionary to ``path`` (safetensors; the
    scalars go in its JSON metadata). Never pickle: the file holds only tensors and JSON."""
    from safetensors.torch import save_file

    if isinstance(obj, torch.Tensor):
        kind, tensors, scalars = "gab", {"basis": obj}, {}
    else:
        kind = next((k for k, cls in _KINDS.items() if cls is not None and isinstance(obj, cls)), None)
        if kind is None:
            raise TypeError(f"cannot save {type(obj).__name__}; expected a GAB tensor, LocalGeometry "
                            "or GeometryDictionary")
        tensors = _tensors(obj)
        scalars = {f.name: getattr(obj, f.name) for f in fields(obj) if f.name not in tensors}
    meta = {"format": "geomkern.fedmc", "version": str(FORMAT_VERSION), "kind": kind,
            "scalars": json.dumps({k: (v if math.isfinite(v) else str(v)) for k, v in scalars.items()})}
    save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, str(path), metadata=meta)


def load(path, *, kind: str | None = None, device: str | torch.device = "cpu"):
    """Read a file written by :func:`save`, validating kind, keys, shapes, dtypes and finiteness.

    Raises ValueError naming the problem for a malformed, corrupted or mismatched file.
    """
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path} does not exist")
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as exc:  # safetensors raises several types for a bad header or truncation
        raise ValueError(f"{path} is not a readable safetensors file ({exc})") from None
    if meta.get("format") != "geomkern.fedmc":
        raise ValueError(f"{path} is not a geomkern.fedmc file (metadata format={meta.get('format')!r})")
    if meta.get("version") != str(FORMAT_VERSION):
        raise ValueError(f"{path} has format version {meta.get('version')}, this geomkern reads {FORMAT_VERSION}")
    found = meta.get("kind")
    if found not in _KINDS:
        raise ValueError(f"{path} has unknown kind {found!r}")
    if kind is not None and found != kind:
        raise ValueError(f"{path} holds a {found}, expected a {kind}")
    for name, t in tensors.items():
        if t.dtype not in _validate.FLOAT_DTYPES:
            raise ValueError(f"{path}: tensor {name!r} has dtype {t.dtype}, expected float32/float64")
        if not bool(torch.isfinite(t).all()):
            raise ValueError(f"{path}: tensor {name!r} contains NaN/Inf")
    if found == "gab":
        if set(tensors) != {"basis"} or tensors["basis"].dim() != 2:
            raise ValueError(f"{path}: a GAB file holds exactly one (S, D) tensor 'basis'")
        return tensors["basis"].to(device)
    cls = _KINDS[found]
    try:
        scalars = {k: float(v) for k, v in json.loads(meta.get("scalars", "{}")).items()}
    except (ValueError, TypeError, AttributeError) as exc:
        raise ValueError(f"{path}: malformed scalar metadata ({exc})") from None
    want = [f.name for f in fields(cls)]
    have = set(tensors) | set(scalars)
    if set(want) - have or have - set(want):
        raise ValueError(f"{path}: fields {sorted(have)} do not match {cls.__name__} {sorted(want)}")
    obj = cls(**{k: (tensors[k].to(device) if k in tensors else scalars[k]) for k in want})
    _check_shapes(obj, path)
    return obj


def _check_shapes(obj, path) -> None:
    first = obj.centers if isinstance(obj, LocalGeometry) else obj.prototypes
    m, D = first.shape if first.dim() == 2 else (None, None)
    if m is None or obj.betas.dim() != 3:
        raise ValueError(f"{path}: centres/prototypes must be (m, D) and betas (m, d, S)")
    d = obj.betas.shape[1]
    counts = obj.counts if isinstance(obj, LocalGeometry) else obj.weights
    expect = {"counts/weights": (counts, (m,)), "eigenvalues": (obj.eigenvalues, (m, d)),
              "variances": (obj.variances, (m, d)), "betas": (obj.betas, (m, d, obj.betas.shape[2]))}
    for name, (t, shape) in expect.items():
        if tuple(t.shape) != shape:
            raise ValueError(f"{path}: {name} has shape {tuple(t.shape)}, expected {shape}")
    dtypes = {t.dtype for t in _tensors(obj).values()}
    if len(dtypes) != 1:
        raise ValueError(f"{path}: tensors mix dtypes {sorted(map(str, dtypes))}")
    if not obj.gamma > 0:
        raise ValueError(f"{path}: gamma must be > 0, got {obj.gamma}")
