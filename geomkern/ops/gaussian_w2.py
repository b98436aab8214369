"""The 2-Wasserstein geometry of Gaussians, the ``gaussian_w2`` family: a batched symmetric PSD
square root with its own backward, the Bures distance, the closed-form W2 between Gaussians and
their W2 barycentre. Unlike the other ops these are differentiable (FLIC's alignment loss
back-propagates through them), so their validation accepts tensors that require grad.

    W2^2(N(m1, S1), N(m2, S2)) = |m1 - m2|^2 + Bures^2(S1, S2)
    Bures^2(S1, S2) = tr S1 + tr S2 - 2 tr (S1^1/2 S2 S1^1/2)^1/2

Everything is batched over leading dimensions (e.g. one Gaussian per class) and broadcasts.
The torch reference (eigh-based) is the only backend: the matrices here are small (d <= a few
hundred) and batched eigh is already one launch.
"""
from __future__ import annotations

import torch

from .. import _dispatch, _validate

# Eigenvalues below ``_RANK_TOL * max eigenvalue`` are round-off of a PSD matrix and are clamped
# to 0 before the square root (a rank-deficient covariance has exact zeros that eigh returns as
# +-1e-17). The same scale floors the denominators of the backward (see _SqrtmPSD).
_RANK_TOL = {torch.float32: 1e-6, torch.float64: 1e-12}


def _check(name: str, t, *, ndim_min: int) -> torch.Tensor:
    return _validate.tensor(name, t, ndim=tuple(range(ndim_min, 9)), differentiable=True)


def _check_square(name: str, A: torch.Tensor) -> torch.Tensor:
    A = _check(name, A, ndim_min=2)
    _validate.symmetric(name, A)
    return A


class _SqrtmPSD(torch.autograd.Function):
    """F = U diag(sqrt(max(lambda, 0))) U^T with the Daleckii-Krein backward

        dL/dA = U (K o (U^T G U)) U^T,   K_ij = 1 / (s_i + s_j),   s = sqrt(lambda).

    Why not torch.linalg.eigh's own backward: it divides by lambda_i - lambda_j, which is 0 for
    repeated eigenvalues (identity-like covariances, the usual anchor initialisation) and gives
    Inf/NaN there. The divided difference of sqrt, (s_i - s_j)/(lambda_i - lambda_j) =
    1/(s_i + s_j), has no such singularity: repeated eigenvalues are harmless. What remains
    singular is s_i + s_j = 0, i.e. a rank-deficient input, where the square root is genuinely
    not differentiable (d sqrt(x)/dx = Inf at 0); there the denominator is floored at
    2 sqrt(tol * lambda_max), so the gradient stays finite and is exact on full-rank inputs.
    """

    @staticmethod
    def forward(ctx, A):
        lam, U = torch.linalg.eigh(A)
        top = lam.amax(-1, keepdim=True).clamp_min(0)
        # only eigenvalues at eigh's roundoff level (n eps lambda_max) are zeroed: a genuine small
        # eigenvalue of a full-rank, ill-conditioned input (1e-12 relative, i.e. a covariance
        # eigenvalue 1e-6 relative inside Bures' S1^1/2 S2 S1^1/2) must keep its square root
        roundoff = A.shape[-1] * torch.finfo(A.dtype).eps
        s = torch.where(lam > roundoff * top, lam, torch.zeros_like(lam)).sqrt()
        ctx.save_for_backward(U, s, top)
        return (U * s.unsqueeze(-2)) @ U.transpose(-1, -2)

    @staticmethod
    def backward(ctx, G):
        U, s, top = ctx.saved_tensors
        floor = 2 * (_RANK_TOL[s.dtype] * top).sqrt().clamp_min(torch.finfo(s.dtype).tiny)
        K = 1.0 / (s.unsqueeze(-1) + s.unsqueeze(-2)).clamp_min(floor.unsqueeze(-1))
        Gs = 0.5 * (G + G.transpose(-1, -2))
        return U @ (K * (U.transpose(-1, -2) @ Gs @ U)) @ U.transpose(-1, -2)


def sqrtm_psd_reference(A: torch.Tensor) -> torch.Tensor:
    # Symmetrise first: eigh reads one triangle only, so without this the gradient of an
    # entry in the other triangle would be 0 (and gradcheck's one-sided perturbations disagree).
    return _SqrtmPSD.apply(0.5 * (A + A.transpose(-1, -2)))


_dispatch.register("sqrtm_psd", "reference")(sqrtm_psd_reference)


def sqrtm_psd(A: torch.Tensor) -> torch.Tensor:
    """Batched symmetric positive semi-definite square root.

    A: (..., n, n) symmetric PSD (float32/float64; may require grad). Returns (..., n, n)
    symmetric PSD R with R @ R = A. Negative eigenvalues from round-off (down to -tol * lambda_max,
    tol 1e-12 in float64, 1e-6 in float32) are clamped to 0; clearly negative ones are an error.
    """
    A = _check_psd("A", A)
    return _dispatch.implementation("sqrtm_psd", A.device.type)(A)


def _check_psd(name: str, A) -> torch.Tensor:
    """A (..., n, n) symmetric PSD up to round-off (see sqrtm_psd), the error naming ``name``."""
    A = _check_square(name, A)
    lam_min = torch.linalg.eigvalsh(A.detach())
    low, top = lam_min[..., 0], lam_min[..., -1].abs().clamp_min(torch.finfo(A.dtype).tiny)
    worst = float((low / top).min())
    if worst < -1e3 * _RANK_TOL[A.dtype]:
        raise ValueError(f"{name} is not positive semi-definite (smallest eigenvalue / largest = {worst:.3g})")
    return A


def bures(S1: torch.Tensor, S2: torch.Tensor) -> torch.Tensor:
    """Squared Bures distance tr S1 + tr S2 - 2 tr (S1^1/2 S2 S1^1/2)^1/2, batched.

    S1, S2: (..., d, d) symmetric PSD, broadcast against each other. Returns (...), >= 0.
    The gradient with respect to S2 is exact while S1^1/2 S2 S1^1/2 has full rank; the one with
    respect to S1 also needs S1 of full rank (the square root's derivative is infinite at a zero
    eigenvalue; see _SqrtmPSD for the floor used there). Put the matrix you differentiate second.
    """
    # checked under their own names (sqrtm_psd's errors say "A"); S1^1/2 S2 S1^1/2 is then PSD
    S1, S2 = _check_psd("S1", S1), _check_psd("S2", S2)
    _validate.same_device_dtype(S1=S1, S2=S2)
    if S2.shape[-1] != S1.shape[-1]:
        raise ValueError(f"S1 and S2 differ in size: {tuple(S1.shape)} vs {tuple(S2.shape)}")
    sqrtm = _dispatch.implementation("sqrtm_psd", S1.device.type)
    R = sqrtm(S1)
    cross = sqrtm(R @ S2 @ R)
    tr = lambda M: M.diagonal(dim1=-2, dim2=-1).sum(-1)  # noqa: E731
    return (tr(S1) + tr(S2) - 2 * tr(cross)).clamp_min(0)


def gaussian_w2(m1: torch.Tensor, S1: torch.Tensor, m2: torch.Tensor, S2: torch.Tensor) -> torch.Tensor:
    """Squared 2-Wasserstein distance between N(m1, S1) and N(m2, S2), closed form, batched.

    m1, m2: (..., d); S1, S2: (..., d, d) symmetric PSD (covariances, not standard deviations).
    Returns (...) = |m1 - m2|^2 + bures(S1, S2).
    """
    m1, m2 = _check("m1", m1, ndim_min=1), _check("m2", m2, ndim_min=1)
    S1, S2 = _check_psd("S1", S1), _check_psd("S2", S2)
    _validate.same_device_dtype(m1=m1, S1=S1, m2=m2, S2=S2)
    if m1.shape[-1] != m2.shape[-1] or S1.shape[-1] != m1.shape[-1]:
        raise ValueError(f"means and covariances disagree in dimension: m1 {tuple(m1.shape)}, "
                         f"S1 {tuple(S1.shape)}, m2 {tuple(m2.shape)}, S2 {tuple(S2.shape)}")
    return ((m1 - m2) ** 2).sum(-1) + bures(S1, S2)


@torch.no_grad()
def gaussian_barycenter(weights: torch.Tensor, means: torch.Tensor, covs: torch.Tensor, *,
                        iters: int = 50, tol: float = 1e-10) -> tuple[torch.Tensor, torch.Tensor]:
    """W2 barycentre of K Gaussians, batched over the trailing batch dims (e.g. classes).

    weights: (K, ...) >= 0 (normalised per batch entry; an entry whose weights are all 0 gets
    mean 0 and covariance 0); means: (K, ..., d); covs: (K, ..., d, d).
    The mean is the weighted mean; the covariance is the fixed point of
    S = S^-1/2 (sum_k w_k (S^1/2 S_k S^1/2)^1/2)^2 S^-1/2 (Alvarez-Esteban et al. 2016), which
    converges from any positive definite start; started at the weighted mean covariance and
    stopped when the relative change falls below ``tol``.
    """
    weights = _check("weights", weights, ndim_min=1)
    means, covs = _check("means", means, ndim_min=2), _check_psd("covs", covs)
    _validate.same_device_dtype(weights=weights, means=means, covs=covs)
    if bool((weights < 0).any()):
        raise ValueError("weights must be >= 0")
    if means.shape[:-1] != weights.shape or covs.shape[:-1] != means.shape:
        raise ValueError(f"weights {tuple(weights.shape)}, means {tuple(means.shape)} and covs "
                         f"{tuple(covs.shape)} must be (K, ...), (K, ..., d) and (K, ..., d, d)")
    total = weights.sum(0)
    w = weights / total.clamp_min(torch.finfo(weights.dtype).tiny)
    mean = (w.unsqueeze(-1) * means).sum(0)
    S = (w[..., None, None] * covs).sum(0)
    for _ in range(iters):
        lam, U = torch.linalg.eigh(S)
        lam = lam.clamp_min(_RANK_TOL[S.dtype] * lam.amax(-1, keepdim=True).clamp_min(torch.finfo(S.dtype).tiny))
        R = (U * lam.sqrt().unsqueeze(-2)) @ U.mT
        Rinv = (U * lam.rsqrt().unsqueeze(-2)) @ U.mT
        T = (w[..., None, None] * sqrtm_psd_reference(R @ covs @ R)).sum(0)
        S_new = Rinv @ T @ T @ Rinv
        S_new = 0.5 * (S_new + S_new.mT)
        change = float(((S_new - S).flatten(-2).norm(dim=-1) /
                        S.flatten(-2).norm(dim=-1).clamp_min(torch.finfo(S.dtype).tiny)).max())
        S = S_new
        if change < tol:
            break
    empty = (total == 0)[..., None, None]
    return mean, torch.where(empty, torch.zeros_like(S), S)
