"""Class moments (GGEUR's client statistics), their exact pooling, and batched symmetric eigh."""
from __future__ import annotations

import torch

from .. import _dispatch, _validate
from .kpca import sign_fix


def class_moments_reference(X, y, n_classes: int):
    N, D = X.shape
    counts = torch.bincount(y, minlength=n_classes)
    means = torch.zeros(n_classes, D, dtype=X.dtype, device=X.device).index_add_(0, y, X)
    means /= counts.clamp_min(1).to(X.dtype).unsqueeze(1)
    Xc = X - means[y]  # two-pass: centring first keeps the covariance accurate far from 0
    covs = torch.zeros(n_classes, D, D, dtype=X.dtype, device=X.device)
    order = torch.argsort(y, stable=True)
    Xs = Xc[order]
    off = torch.zeros(n_classes + 1, dtype=torch.int64)
    off[1:] = torch.cumsum(counts.cpu(), 0)
    for c in torch.nonzero(counts.cpu()).squeeze(1).tolist():
        seg = Xs[off[c]:off[c + 1]]
        torch.mm(seg.T, seg, out=covs[c])
        covs[c] /= float(counts[c])
    return counts, means, covs


_dispatch.register("class_moments", "reference")(class_moments_reference)


def class_moments(X: torch.Tensor, y: torch.Tensor, n_classes: int):
    """Per-class counts (C,) int64, means (C, D) and biased covariances (C, D, D).

    X: (N, D); y: (N,) integer labels in [0, n_classes). Empty classes get count 0 and zero
    mean and covariance.
    """
    X = _validate.tensor("X", X, ndim=2, allow_empty=True)
    C = _validate.positive_int("n_classes", n_classes)
    y = _validate.labels("y", y, X.shape[0], C, device=X.device)
    return _dispatch.implementation("class_moments", X.device.type)(X, y, C)


def pool_moments(counts: torch.Tensor, means: torch.Tensor, covs: torch.Tensor):
    """Exact pooling of K clients' class moments (GGEUR Eq. 4).

    counts (K, C), means (K, C, D), covs (K, C, D, D) biased -> pooled counts (C,), means (C, D),
    covs (C, D, D): Sigma = (1/N)[sum_k n_k Sigma_k + sum_k n_k (mu_k - mu)(mu_k - mu)^T].
    Classes nobody holds get zeros.
    """
    means = _validate.tensor("means", means, ndim=3)
    covs = _validate.tensor("covs", covs, ndim=4)
    _validate.same_device_dtype(means=means, covs=covs)
    if not isinstance(counts, torch.Tensor) or counts.dim() != 2:
        raise ValueError("counts must be a (K, C) tensor of per-client class counts")
    K, C, D = means.shape
    if counts.shape != (K, C) or covs.shape != (K, C, D, D):
        raise ValueError(f"shapes disagree: counts {tuple(counts.shape)}, means {tuple(means.shape)}, "
                         f"covs {tuple(covs.shape)}; expected (K, C), (K, C, D), (K, C, D, D)")
    if counts.dtype.is_floating_point and not bool(torch.isfinite(counts).all()):
        raise ValueError("counts contains NaN/Inf")
    if bool((counts < 0).any()):
        raise ValueError("counts must be >= 0")
    w = counts.to(device=means.device, dtype=means.dtype)
    total = w.sum(0)  # (C,)
    safe = total.clamp_min(torch.finfo(means.dtype).tiny)
    mu = torch.einsum("kc,kcd->cd", w, means) / safe.unsqueeze(1)
    dev = means - mu.unsqueeze(0)
    cov = torch.einsum("kc,kcde->cde", w, covs) + torch.einsum("kc,kcd,kce->cde", w, dev, dev)
    cov = cov / safe.view(C, 1, 1)
    return counts.sum(0), mu, cov


def top_eigenpairs(vals: torch.Tensor, vecs: torch.Tensor, k: int):
    """Ascending eigh output -> the top k, descending, in the public sign convention."""
    return vals.flip(-1)[..., :k], sign_fix(vecs.flip(-1)[..., :k])


def eigh_reference(A, k):
    return top_eigenpairs(*torch.linalg.eigh(A), k)


_dispatch.register("eigh", "reference")(eigh_reference)


def eigh(A: torch.Tensor, *, k: int | None = None):
    """Batched symmetric eigen-decomposition.

    A: (..., n, n) symmetric. Returns eigenvalues (..., k) descending and eigenvectors (..., n, k)
    (columns; each column's largest-|.| entry positive). k defaults to n.
    """
    A = _validate.tensor("A", A, ndim=tuple(range(2, 8)))
    n = A.shape[-1]
    if A.shape[-2] != n:
        raise ValueError(f"A must be square in its last two dims, got shape {tuple(A.shape)}")
    k = n if k is None else _validate.positive_int("k", k)
    if k > n:
        raise ValueError(f"k={k} is larger than the matrix size n={n}")
    asym = (A - A.transpose(-1, -2)).abs().amax()
    scale = A.abs().amax().clamp_min(torch.finfo(A.dtype).tiny)
    if float(asym) > 100 * torch.finfo(A.dtype).eps * float(scale) * n:
        raise ValueError(f"A is not symmetric (max |A - A^T| = {float(asym):.3g}); "
                         "symmetrise it with (A + A.mT) / 2 if that is what you mean")
    return _dispatch.implementation("eigh", A.device.type)(A, k)
