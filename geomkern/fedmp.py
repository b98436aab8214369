"""FedMP's server-side pieces (Zhou et al. 2025, "FedMP: Tackling Medical Feature Heterogeneity in
Federated Learning from a Manifold Perspective"): class prototypes with EMA smoothing and the
feature bank's per-client sample. Pure functions over plain tensors, so any FL codebase can call
them; fedsim's ``fedmp`` algorithm (fedsim/algorithms/fedmp.py) is one caller.

client   counts, means = class_prototypes(F, y, n_classes)        F = trunk features (n, F)
client   P_k, has_k = ema_prototypes(P_k, has_k, means, counts > 0, momentum=m_local)   (Eq. 6)
server   P, has = global_prototypes(P, has, stack(P_k), stack(n_k), momentum=m_global)  (Eq. 7)
server   rows = sample_bank(owners, n, client=k, exclude_own=True, generator=g)         (SFMC)

The EMA (both levels): P <- m P + (1 - m) P_new for a class that has both an old and a new
value; a class seen for the first time takes P_new as it is (an EMA started from zero would pull
every new prototype toward the origin); a class without a new value keeps its old one. The
global P_new of class c is the count-weighted mean of the uploaded local prototypes of c.

They are geometry in the sense of ``ggeur``: class means through ``class_moments`` and their
pooling, on the embedding manifold. The bank's sampling is plain row selection, kept here so that
a caller reproduces fedsim's exchange exactly from the same generator.
"""
from __future__ import annotations

import math

import torch

from . import _validate
from .ops.moments import class_moments


def _momentum(name: str, m) -> float:
    if isinstance(m, bool) or not isinstance(m, (int, float)) or not math.isfinite(m) or not 0.0 <= m < 1.0:
        raise ValueError(f"{name} must lie in [0, 1) (the weight of the previous prototype), got {m!r}")
    return float(m)


def class_prototypes(X: torch.Tensor, y: torch.Tensor, n_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-class counts (C,) int64 and means (C, F) of features X (n, F) with labels y (n,);
    classes without samples get count 0 and a zero row."""
    counts, means, _ = class_moments(X, y, n_classes)
    return counts, means


def ema_prototypes(prev: torch.Tensor | None, prev_has: torch.Tensor | None, new: torch.Tensor,
                   new_has: torch.Tensor, *, momentum: float) -> tuple[torch.Tensor, torch.Tensor]:
    """One EMA step over class prototypes (paper Eq. 6 on a client, Eq. 7 on the server).

    prev (C, F) and prev_has (C,) bool: the current prototypes and which classes have one (None,
    None: none yet). new (C, F), new_has (C,) bool: this round's values. Returns (prototypes,
    has): m prev + (1 - m) new where both exist, new where only it exists, prev where only it does.
    """
    m = _momentum("momentum", momentum)
    new = _validate.tensor("new", new, ndim=2)
    if not isinstance(new_has, torch.Tensor) or new_has.dtype != torch.bool or new_has.shape != new.shape[:1]:
        raise ValueError(f"new_has must be a bool tensor of shape ({new.shape[0]},)")
    if (prev is None) != (prev_has is None):
        raise ValueError("prev and prev_has must both be given or both be None")
    if prev is None:
        return torch.where(new_has[:, None], new, torch.zeros_like(new)), new_has.clone()
    prev = _validate.tensor("prev", prev, ndim=2)
    if prev.shape != new.shape:
        raise ValueError(f"prev has shape {tuple(prev.shape)}, new {tuple(new.shape)}; they must match")
    if not isinstance(prev_has, torch.Tensor) or prev_has.dtype != torch.bool or prev_has.shape != new_has.shape:
        raise ValueError(f"prev_has must be a bool tensor of shape ({new.shape[0]},)")
    both = (prev_has & new_has)[:, None]
    out = torch.where(both, m * prev + (1.0 - m) * new, torch.where(new_has[:, None], new, prev))
    return out, prev_has | new_has


def global_prototypes(prev: torch.Tensor | None, prev_has: torch.Tensor | None, local: torch.Tensor,
                      counts: torch.Tensor, *, momentum: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The server's prototype step (Eq. 7): pool this round's K local prototypes local (K, C, F)
    by their class counts (K, C) (count-weighted mean over the clients holding the class, in
    float64), then one EMA step into prev (C, F) / prev_has (C,) (None, None at the start)."""
    local = _validate.tensor("local", local, ndim=3)
    if not isinstance(counts, torch.Tensor) or counts.shape != local.shape[:2] or counts.dtype.is_floating_point:
        raise ValueError(f"counts must be an integer tensor of shape {tuple(local.shape[:2])} (clients, classes)")
    if bool((counts < 0).any()):
        raise ValueError("counts must be >= 0")
    w = counts.to(device=local.device, dtype=torch.float64)
    total = w.sum(0)
    pooled = torch.einsum("kc,kcf->cf", w, local.to(torch.float64)) / total.clamp_min(1.0)[:, None]
    return ema_prototypes(prev, prev_has, pooled.to(local.dtype), total > 0, momentum=momentum)


def sample_bank(owners: torch.Tensor, n: int, *, client: int, exclude_own: bool,
                generator: torch.Generator) -> torch.Tensor:
    """Rows of the feature bank sent to ``client``: ``n`` drawn uniformly without replacement
    (all eligible rows when fewer), sorted. owners (N,) int: the client each bank row came from;
    with ``exclude_own`` the client's own rows are never eligible. Returns int64 indices (m,)."""
    n = _validate.positive_int("n", n)
    if not isinstance(owners, torch.Tensor) or owners.dim() != 1 or owners.dtype.is_floating_point:
        raise ValueError("owners must be a 1-D integer tensor (the client of every bank row)")
    if not isinstance(generator, torch.Generator):
        raise TypeError("generator must be a torch.Generator (the sample is reproducible from it)")
    eligible = torch.nonzero(owners != client).squeeze(1) if exclude_own else torch.arange(
        owners.numel(), device=owners.device)
    if eligible.numel() <= n:
        return eligible
    pick = torch.randperm(eligible.numel(), generator=generator, device=generator.device)[:n]
    return eligible[pick.to(eligible.device)].sort().values
