"""geomkern refuses what it cannot compute (never returns NaN for finite input): overflow-scale
values, non-finite solver parameters, gradients it would drop, a fit used with another gamma or X,
outputs larger than the machine, and K-Means memory that grows with the data."""
from __future__ import annotations

import math

import pytest
import torch

import geomkern as gk
from geomkern import _validate
from geomkern.ops import kmeans as kmeans_mod

F32, F64 = torch.float32, torch.float64


def _ops(X):
    """Every public op that takes a data matrix, as a one-argument call."""
    B = X[:3].clone()
    off = torch.tensor([0, 4, X.shape[0]])
    return {
        "rbf_gram": lambda: gk.rbf_gram(X, gamma=1.0),
        "rbf_matmul": lambda: gk.rbf_matmul(X, X, X[:, :1], gamma=1.0),
        "median_gamma": lambda: gk.median_gamma(X),
        "kpca": lambda: gk.kpca(X, off, n_components=1, gamma=1.0),
        "kmeans": lambda: gk.kmeans(X, 2),
        "class_moments": lambda: gk.class_moments(X, torch.arange(X.shape[0]) % 2, 2),
        "preimage": lambda: gk.preimage(X[:2], B, torch.rand(2, 3, dtype=X.dtype), gamma=1.0),
        "preimage_loss": lambda: gk.preimage_loss(X[:2], B, torch.rand(2, 3, dtype=X.dtype), gamma=1.0),
    }


@pytest.mark.parametrize("dtype", [F32, F64], ids=["f32", "f64"])
@pytest.mark.parametrize("op", list(_ops(torch.zeros(8, 3))))
def test_overflow_scale_input_is_refused_not_nan(op, dtype, gen):
    X = torch.randn(8, 3, generator=gen, dtype=F64)
    big = math.sqrt(torch.finfo(dtype).max) * 0.9  # |x|^2 alone is finite, sums of them are not
    X[1] = big
    X[2] = -big
    with pytest.raises(ValueError, match=r"(X|Z0) has values up to .* overflow"):
        _ops(X.to(dtype))[op]()


@pytest.mark.parametrize("dtype", [F32, F64], ids=["f32", "f64"])
def test_large_but_safe_values_still_compute(dtype, gen):
    # just below the refusal bound the Gram is finite: the bound is not stricter than it must be
    D = 3
    limit = math.sqrt(torch.finfo(dtype).max / (4 * D))
    X = (torch.rand(6, D, generator=gen, dtype=F64) * 2 - 1).to(dtype) * (0.5 * limit)
    K = gk.rbf_gram(X, gamma=1.0 / (0.5 * limit) ** 2)
    assert bool(torch.isfinite(K).all())


def test_old_code_returned_nan_here():
    # the case this guards: float32 rows of 1e20 made |x|^2 + |y|^2 - 2<x, y> = inf - inf
    X = torch.full((4, 3), 1e20)
    X[1] *= -1
    with pytest.raises(ValueError, match="overflow float32"):
        gk.rbf_gram(X, gamma=1.0)
    assert bool(torch.isfinite(gk.rbf_gram(X.double(), gamma=1e-40)).all())  # float64 is fine


def test_median_gamma_never_returns_nan_or_inf():
    X = torch.tensor([[0.0], [1e-170], [2e-170]], dtype=F64)  # median squared distance 1e-340 -> 0
    with pytest.raises(ValueError, match="median pairwise squared distance"):
        gk.median_gamma(X)
    g = gk.median_gamma(torch.tensor([[0.0], [1.0], [3.0]]))
    assert math.isfinite(g) and g > 0


@pytest.mark.parametrize("bad", [math.inf, math.nan, -1.0, 0.0, True, "0.1"])
def test_preimage_rejects_bad_lr_and_ridge(bad, gen):
    Z0, B = torch.randn(2, 3, generator=gen), torch.randn(4, 3, generator=gen)
    T = torch.rand(2, 4, generator=gen)
    err = TypeError if isinstance(bad, (bool, str)) else ValueError
    with pytest.raises(err, match="lr"):
        gk.preimage(Z0, B, T, gamma=1.0, lr=bad)
    with pytest.raises(err, match="ridge"):
        gk.preimage(Z0, B, T, gamma=1.0, method="fixed_point", ridge=bad)
    with pytest.raises(ValueError, match="lr contains 1 NaN/Inf"):
        gk.preimage(Z0, B, T, gamma=1.0, lr=torch.tensor([0.1, math.inf]))


def test_preimage_loss_validates_like_preimage(gen):
    Z, B, T = torch.randn(2, 3, generator=gen), torch.randn(4, 3, generator=gen), torch.rand(2, 4)
    with pytest.raises(ValueError, match="gamma must be a finite number > 0"):
        gk.preimage_loss(Z, B, T, gamma=-1.0)
    with pytest.raises(ValueError, match="targets must have one column per basis point"):
        gk.preimage_loss(Z, B, T[:, :3], gamma=1.0)
    with pytest.raises(ValueError, match="Z0 contains 1 NaN/Inf"):
        gk.preimage_loss(torch.tensor([[math.nan, 0, 0], [0, 0, 0.0]]), B, T, gamma=1.0)
    with pytest.raises(ValueError, match="proj must have shape"):
        gk.preimage_loss(Z, B, T[:, :2], gamma=1.0, proj=torch.ones(3, 4))
    loss = gk.preimage_loss(Z, B, T, gamma=1.0)
    assert torch.allclose(loss, ((gk.rbf_gram(Z, B, gamma=1.0) - T) ** 2).sum(1))


@pytest.mark.parametrize("op", list(_ops(torch.zeros(8, 3))))
def test_requires_grad_is_refused_with_the_fix(op, gen):
    X = torch.randn(8, 3, generator=gen, requires_grad=True)
    with pytest.raises(ValueError, match=r"requires grad.*\.detach\(\)"):
        _ops(X)[op]()


def test_fit_refuses_another_gamma_or_another_x(gen):
    X = torch.randn(20, 3, generator=gen, dtype=F64)
    off = torch.tensor([0, 9, 20])
    fit = gk.kpca(X, off, n_components=2, gamma=0.5)
    B, Z = torch.randn(4, 3, dtype=F64), torch.randn(2, 3, dtype=F64)
    gk.project_onto_basis(X, fit, B, gamma=0.5)
    gk.kpca_transform(Z, X, fit, gamma=0.5, segment=0)
    with pytest.raises(ValueError, match="fitted with gamma=0.5|computed with gamma=0.5"):
        gk.project_onto_basis(X, fit, B, gamma=0.25)
    with pytest.raises(ValueError, match="computed with gamma=0.5"):
        gk.kpca_transform(Z, X, fit, gamma=0.25, segment=0)
    other = X.clone()
    other[5, 1] += 1e-9
    with pytest.raises(ValueError, match="X differs from the X that gk.kpca was fitted on"):
        gk.project_onto_basis(other, fit, B, gamma=0.5)
    with pytest.raises(ValueError, match="X differs"):
        gk.kpca_transform(Z, X.flip(0), fit, gamma=0.5, segment=0)  # same values, other order


def test_outputs_larger_than_the_machine_are_refused_before_allocating(monkeypatch):
    monkeypatch.setattr(_validate, "_physical_memory", lambda device: 1 << 20)  # a 1 MiB machine
    X = torch.randn(600, 2)  # 600^2 float32 = 1.37 MiB
    with pytest.raises(ValueError, match=r"the Gram matrix would need 1\.4 MiB \(\(600, 600\) float32\) but cpu has 1\.0 MiB"):
        gk.rbf_gram(X, gamma=1.0)
    gk.rbf_gram(X[:500], gamma=1.0)  # 0.95 MiB fits
    with pytest.raises(ValueError, match="the class covariances would need"):
        gk.class_moments(torch.randn(10, 400), torch.zeros(10, dtype=torch.int64), 3)


def test_kmeans_padding_grows_with_the_data_not_segments_times_largest(monkeypatch, gen):
    sizes = [2000] + [10] * 200  # one large segment and many small ones
    X = torch.randn(sum(sizes), 4, generator=gen)
    off = torch.tensor([0] + torch.tensor(sizes).cumsum(0).tolist())
    padded = []
    real_pad = kmeans_mod._pad

    def spy(*args):
        Xp, mask, s = real_pad(*args)
        padded.append(Xp.numel())
        return Xp, mask, s

    monkeypatch.setattr(kmeans_mod, "_pad", spy)
    labels, centers = gk.kmeans(X, 3, offsets=off, iters=5)
    assert labels.shape == (X.shape[0],) and centers.shape == (len(sizes), 3, 4)
    assert sum(padded) <= 2 * X.numel(), f"padded {sum(padded)} elements for {X.numel()} of data"
    # the old single padded batch: 201 segments x 2000 rows
    assert len(sizes) * max(sizes) * 4 > 50 * X.numel()
    # every segment's labels are its own cluster ids and every centre a mean of its points
    o = off.tolist()
    for j in (0, 1, 200):
        lj = labels[o[j]:o[j + 1]]
        assert int(lj.max()) < 3
        for c in lj.unique().tolist():
            assert torch.allclose(centers[j, c], X[o[j]:o[j + 1]][lj == c].mean(0), atol=1e-5)
