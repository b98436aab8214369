"""Class moments (GGEUR's client statistics) and their exact pooling. (The batched symmetric
eigen-solve GGEUR uses next is its own family: geomkern/ops/eigh.py.)"""
from __future__ import annotations

import torch

from .. import _dispatch, _validate


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
    _validate.allocation("the class covariances", (C, X.shape[1], X.shape[1]), X.dtype, X.device,
                         dims="n_classes x D x D, D the columns of X")
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
    _validate.counts("counts", counts)
    for k in range(K):  # what ggeur.ClassStatistics refuses, refused here too
        _validate.covariances(f"covs[{k}]", covs[k], counts[k])
    return _pool(counts, means, lambda w: torch.einsum("kc,kcde->cde", w, covs))


def _pool(counts: torch.Tensor, means: torch.Tensor, weighted_covs):
    """pool_moments' arithmetic; ``weighted_covs(w)`` gives sum_k w[k, c] covs[k, c] as (C, D, D)."""
    C = means.shape[1]
    w = counts.to(device=means.device, dtype=means.dtype)
    total = w.sum(0)  # (C,)
    safe = total.clamp_min(torch.finfo(means.dtype).tiny)
    mu = torch.einsum("kc,kcd->cd", w, means) / safe.unsqueeze(1)
    dev = means - mu.unsqueeze(0)
    cov = weighted_covs(w) + torch.einsum("kc,kcd,kce->cde", w, dev, dev)
    cov = cov / safe.view(C, 1, 1)
    return counts.sum(0), mu, cov


def pool_moments_by_class(counts: torch.Tensor, means: torch.Tensor, class_covs):
    """pool_moments without the (K, C, D, D) stack of every client's covariances: the same
    numbers, bit for bit, with one class's (K, D, D) block in memory at a time.

    counts (K, C), means (K, C, D) as in pool_moments; ``class_covs(c, out)`` writes the K
    clients' covariances of class c into ``out`` (K, D, D), which holds zeros (leave a client
    without class c at zero). So a server's memory grows with K x D x D, not K x C x D x D.

    Bits: pool_moments' covariance term is a batched product (C, 1, K) @ (C, K, D*D) whose left
    operand is a strided view of the (K, C) weights; here each class runs the same (1, K) @
    (K, D*D) product with the same strided row (a per-class einsum lays the weights out otherwise,
    and the BLAS then sums in another order on some shapes: tests/geomkern/test_ggeur.py).
    """
    means = _validate.tensor("means", means, ndim=3)
    if not isinstance(counts, torch.Tensor) or counts.shape != means.shape[:2]:
        raise ValueError(f"counts must be a (K, C) = {tuple(means.shape[:2])} tensor of per-client class counts")
    _validate.counts("counts", counts)
    K, C, D = means.shape

    def weighted_covs(w):
        out = means.new_empty(C, 1, D * D)  # as the batched product's output
        block = means.new_empty(K, D, D)
        left = w.T.unsqueeze(1)  # (C, 1, K), strided as the batched product's left operand
        for c in range(C):
            block.zero_()
            class_covs(c, block)
            torch.mm(left[c], block.view(K, D * D), out=out[c])
        return out.view(C, D, D)

    return _pool(counts, means, weighted_covs)
