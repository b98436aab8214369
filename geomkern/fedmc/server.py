"""FedMC server steps: the shared anonymous basis from all clients' prototypes (step 2,
``build_gab``, with ``resolve_gamma``) and the geometry dictionary fused from the uploaded LGDs
(step 4, ``fuse``, paper Eq. 7)."""
from __future__ import annotations

from typing import Sequence

import torch

from .. import _validate
from ..ops.kmeans import kmeans
from ..ops.rbf import median_gamma
from .containers import GeometryDictionary, LocalGeometry, Prototypes


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
