"""The five registered operators' good calls, as a public-function call and as the operator's
positional arguments made the way the public function makes them: what
test_operator_validation.py and test_hostile_ops.py change into bad calls."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

import geomkern as gk

_g = torch.Generator().manual_seed(44)
X = torch.randn(12, 3, generator=_g, dtype=torch.float64)
B = torch.randn(5, 3, generator=_g, dtype=torch.float64)
Z0 = X[:4] + 0.1
T = gk.rbf_gram(Z0, B, gamma=0.5)
OFF = torch.tensor([0, 6, 12])
FIT = gk.kpca(X, OFF, n_components=2, gamma=0.5)
PROJ = torch.randn(2, 5, generator=_g, dtype=torch.float64)
HUGE = 2 ** 62  # a count whose work exceeds 2^63 - 1 multiply-adds on these sizes


def with_value(t: torch.Tensor, index, value) -> torch.Tensor:
    t = t.clone()
    t[index] = value
    return t


@dataclass(frozen=True)
class Spec:
    """An operator's good call (keyword arguments of the public function), the public function
    over such keywords, and the operator's positional arguments made from them (as the public
    function makes them)."""

    good: dict
    public: Callable
    operator_args: Callable


def _preimage_operator_args(kw):
    lr = kw["lr"]
    lr_value, lr = (lr, None) if lr is not None and not isinstance(lr, torch.Tensor) else (None, lr)
    ridge = kw["ridge"] if kw["method"] == "fixed_point" else 0.0
    return (kw["Z0"], kw["B"], kw["targets"], kw["gamma"], kw["method"], kw["steps"], lr_value, lr,
            kw["proj"], ridge, kw["factor"], kw["return_loss"], kw["precision"])


def _transform_operator_args(kw):
    fit, seg = kw["fit"], kw["segment"]
    seg_int, seg = (seg, None) if seg is not None and not isinstance(seg, torch.Tensor) else (None, seg)
    return (kw["Z"], kw["X"], fit.eigenvalues, fit.variances, fit.alphas, fit.mean_projection, fit.offsets,
            fit.gamma, fit.fingerprint, kw["gamma"], seg_int, seg)


SPECS = {
    "rbf_gram": Spec(
        dict(X=X, Y=None, gamma=0.5, center=False, precision="tf32x3"),
        lambda kw: gk.rbf_gram(kw["X"], kw["Y"], gamma=kw["gamma"], center=kw["center"], precision=kw["precision"]),
        lambda kw: (kw["X"], kw["Y"], kw["gamma"], kw["center"], kw["precision"])),
    "rbf_matmul": Spec(
        dict(X=X, Y=B, V=B[:, :2].contiguous(), gamma=0.5, precision="tf32x3"),
        lambda kw: gk.rbf_matmul(kw["X"], kw["Y"], kw["V"], gamma=kw["gamma"], precision=kw["precision"]),
        lambda kw: (kw["X"], kw["Y"], kw["V"], kw["gamma"], kw["precision"])),
    "kmeans": Spec(
        dict(X=X, k=2, offsets=None, iters=5, seed=0, n_init=1, precision="tf32x3"),
        lambda kw: gk.kmeans(kw["X"], kw["k"], offsets=kw["offsets"], iters=kw["iters"], seed=kw["seed"],
                             n_init=kw["n_init"], precision=kw["precision"]),
        lambda kw: (kw["X"], kw["k"], kw["offsets"], kw["iters"], kw["seed"], kw["n_init"], kw["precision"])),
    "kpca_transform": Spec(
        dict(Z=B, X=X, fit=FIT, gamma=0.5, segment=0),
        lambda kw: gk.kpca_transform(kw["Z"], kw["X"], kw["fit"], gamma=kw["gamma"], segment=kw["segment"]),
        _transform_operator_args),
    "preimage": Spec(
        dict(Z0=Z0, B=B, targets=T, gamma=0.5, method="gd", steps=3, lr=None, proj=None, ridge=1e-6,
             factor=None, return_loss=False, precision="tf32x3"),
        lambda kw: gk.preimage(kw["Z0"], kw["B"], kw["targets"], gamma=kw["gamma"], method=kw["method"],
                               steps=kw["steps"], lr=kw["lr"], proj=kw["proj"], ridge=kw["ridge"],
                               factor=kw["factor"], return_loss=kw["return_loss"], precision=kw["precision"]),
        _preimage_operator_args),
}
