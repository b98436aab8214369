"""gk.sqrtm_psd / gk.bures / gk.gaussian_w2 / gk.gaussian_barycenter against direct computations
(scipy.linalg.sqrtm, float64), including rank-deficient covariances, and gradcheck in float64."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg
import torch

import geomkern as gk


def _cov(d, rank, gen, batch=()):
    F = torch.randn(*batch, d, rank, generator=gen, dtype=torch.float64)
    return F @ F.mT / rank


def _bures_direct(S1, S2):
    r = scipy.linalg.sqrtm(S1)
    cross = scipy.linalg.sqrtm(r @ S2 @ r)
    return float(np.trace(S1) + np.trace(S2) - 2 * np.trace(cross).real)


@pytest.mark.parametrize("d", [1, 3, 7, 16])
@pytest.mark.parametrize("rank_frac", [1.0, 0.5])
def test_sqrtm_matches_scipy(d, rank_frac):
    gen = torch.Generator().manual_seed(int(torch.randint(0, 2**31, ())))
    rank = max(1, int(d * rank_frac))
    F = torch.randn(4, d, rank, generator=gen, dtype=torch.float64)
    A = F @ F.mT / rank
    R = gk.sqrtm_psd(A)
    # oracle from the factor, not from A: F = U diag(sigma) V^T gives A^1/2 = U diag(sigma / sqrt(rank)) U^T
    # exactly, also for rank-deficient A (scipy's Schur sqrtm was off by up to 2.8x relative on
    # rank-1 3 x 3 inputs, where this op is exact to 2e-15)
    U, sig, _ = torch.linalg.svd(F, full_matrices=False)
    exact = (U * (sig / rank ** 0.5).unsqueeze(-2)) @ U.mT
    for b in range(4):
        err = float((R[b] - exact[b]).norm() / exact[b].norm())
        assert err < 1e-6, err
        if rank == d:  # full rank: scipy's independent Schur method agrees too
            ref = scipy.linalg.sqrtm(A[b].numpy()).real
            assert np.linalg.norm(R[b].numpy() - ref) / np.linalg.norm(ref) < 1e-6
    assert torch.allclose(R @ R, A, atol=1e-10 * float(A.abs().max()))
    assert torch.allclose(R, R.mT)


@pytest.mark.parametrize("d,r1,r2", [(5, 5, 5), (6, 2, 6), (6, 6, 3), (8, 3, 2), (1, 1, 1)])
def test_w2_matches_direct(d, r1, r2):
    gen = torch.Generator().manual_seed(int(torch.randint(0, 2**31, ())))
    S1, S2 = _cov(d, r1, gen, batch=(3,)), _cov(d, r2, gen, batch=(3,))
    m1, m2 = torch.randn(3, d, generator=gen, dtype=torch.float64), torch.randn(3, d, generator=gen,
                                                                                 dtype=torch.float64)
    w2 = gk.gaussian_w2(m1, S1, m2, S2)
    assert w2.shape == (3,)
    for b in range(3):
        ref = float(((m1[b] - m2[b]) ** 2).sum()) + _bures_direct(S1[b].numpy(), S2[b].numpy())
        assert abs(float(w2[b]) - ref) <= 1e-6 * max(1.0, abs(ref)), (float(w2[b]), ref)
    # a distance: symmetric, zero on equal inputs
    assert torch.allclose(w2, gk.gaussian_w2(m2, S2, m1, S1), rtol=1e-6, atol=1e-9)
    assert float(gk.gaussian_w2(m1, S1, m1, S1).abs().max()) < 1e-7


def test_commuting_case_closed_form():
    # diagonal covariances: Bures = sum (sqrt a - sqrt b)^2
    a, b = torch.rand(2, 9, dtype=torch.float64).unbind(0)
    a[:3] = 0  # rank-deficient
    got = gk.bures(torch.diag(a), torch.diag(b))
    assert abs(float(got) - float(((a.sqrt() - b.sqrt()) ** 2).sum())) < 1e-10


def test_float32_close_to_float64():
    gen = torch.Generator().manual_seed(3)
    S1, S2 = _cov(12, 12, gen, batch=(5,)), _cov(12, 6, gen, batch=(5,))
    ref = gk.bures(S1, S2)
    got = gk.bures(S1.float(), S2.float()).double()
    assert float(((got - ref).norm() / ref.norm())) < 1e-4


def test_gradcheck_sqrtm_and_w2():
    gen = torch.Generator().manual_seed(int(torch.randint(0, 2**31, ())))
    A = (_cov(4, 4, gen, batch=(2,)) + 0.1 * torch.eye(4, dtype=torch.float64)).requires_grad_()
    # the domain is symmetric matrices: gradcheck's one-entry perturbations go through a symmetrisation
    sym = lambda X: 0.5 * (X + X.mT)  # noqa: E731
    assert torch.autograd.gradcheck(lambda X: gk.sqrtm_psd(sym(X)), (A,))
    S1 = _cov(4, 4, gen, batch=(3,)) + 0.1 * torch.eye(4, dtype=torch.float64)
    S2 = (_cov(4, 4, gen, batch=(3,)) + 0.1 * torch.eye(4, dtype=torch.float64)).requires_grad_()
    m1 = torch.randn(3, 4, generator=gen, dtype=torch.float64).requires_grad_()
    m2 = torch.randn(3, 4, generator=gen, dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda a, b, c: gk.gaussian_w2(a, sym(b), m2, sym(c)), (m1, S1.requires_grad_(), S2))


def test_gradient_finite_on_repeated_eigenvalues():
    # the identity (all eigenvalues equal) is where eigh's own backward divides by zero
    S = torch.eye(5, dtype=torch.float64).requires_grad_()
    T = torch.diag(torch.arange(1.0, 6.0, dtype=torch.float64))
    gk.bures(T, S).backward()
    assert bool(torch.isfinite(S.grad).all())
    # d/dS Bures(T, S) at S = I where T is diagonal: I - T^1/2 (T^1/2 S T^1/2)^-1/2 T^1/2 = I - T^1/2
    assert torch.allclose(S.grad, torch.eye(5, dtype=torch.float64) - torch.diag(T.diagonal().sqrt()),
                          atol=1e-8)


def test_barycenter_fixed_point_and_commuting_case():
    gen = torch.Generator().manual_seed(int(torch.randint(0, 2**31, ())))
    K, C, d = 4, 3, 5
    covs = _cov(d, d, gen, batch=(K, C)) + 0.05 * torch.eye(d, dtype=torch.float64)
    means = torch.randn(K, C, d, generator=gen, dtype=torch.float64)
    w = torch.rand(K, C, generator=gen, dtype=torch.float64)
    mean, S = gk.gaussian_barycenter(w, means, covs)
    wn = w / w.sum(0)
    assert torch.allclose(mean, (wn[..., None] * means).sum(0))
    # fixed-point equation S = sum_k w_k (S^1/2 S_k S^1/2)^1/2 conjugated back
    R = gk.sqrtm_psd(S)
    T = (wn[..., None, None] * gk.sqrtm_psd(R @ covs @ R)).sum(0)
    assert torch.allclose(T @ T, R @ S @ R, rtol=1e-6, atol=1e-8)
    # it minimises the weighted sum of W2: perturbing it increases the objective
    obj = lambda Sb: float((wn * gk.bures(Sb.expand_as(covs), covs)).sum())  # noqa: E731
    for _ in range(3):
        E = 1e-2 * torch.randn(C, d, d, generator=gen, dtype=torch.float64)
        assert obj(S) < obj(S + E @ E.mT)
    # commuting (diagonal) case: sqrt of the barycentre = weighted mean of the sqrts
    diag = torch.rand(K, d, dtype=torch.float64) + 0.1
    _, Sd = gk.gaussian_barycenter(torch.full((K,), 0.25, dtype=torch.float64), torch.zeros(K, d, dtype=torch.float64),
                                   torch.diag_embed(diag))
    assert torch.allclose(Sd.diagonal(), diag.sqrt().mean(0) ** 2, atol=1e-9)


def test_refusals():
    with pytest.raises(ValueError, match="not positive semi-definite"):
        gk.sqrtm_psd(-torch.eye(3, dtype=torch.float64))
    with pytest.raises(ValueError, match="not symmetric"):
        gk.sqrtm_psd(torch.tensor([[1.0, 2.0], [0.0, 1.0]]))
    with pytest.raises(ValueError, match="NaN"):
        gk.sqrtm_psd(torch.full((2, 2), float("nan")))
    with pytest.raises(ValueError, match="disagree in dimension"):
        gk.gaussian_w2(torch.zeros(3), torch.eye(3), torch.zeros(4), torch.eye(4))
    with pytest.raises(TypeError, match="dtype"):
        gk.sqrtm_psd(torch.eye(2, dtype=torch.int64))
