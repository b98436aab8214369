"""The Triton launchers as torch operators, ``torch.ops.geomkern_triton.*``, registered with
torch.library.triton_op: inside torch.compile on a GPU, their kernels (every launcher starts them
through _common.launch, which hands them to torch.library.wrap_triton while torch traces) are
part of the graph instead of one opaque call. Import this module to register them::

    import geomkern.backends.triton.operators  # noqa: F401
    torch.ops.geomkern_triton.rbf_gram(X, None, gamma, False, "tf32x3")

It is not imported with geomkern: triton_op imports torch._dynamo and torch._inductor (1.1 s
measured on this project's CPU machine), which eager use never needs. The public ops
(``gk.rbf_gram`` ...) stay ``torch.ops.geomkern.*`` custom operators either way.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch.library import triton_op

from ... import _validate
from ...ops.rbf import _gram_check, _matmul_check
from .kmeans import assign
from .kpca import project_onto_basis
from .rbf import rbf_gram, rbf_matmul

# Each operator first runs the checks that read no tensor values, the same ones (and messages) as
# the public op's (geomkern/ops/<family>.py; issue 44): a bad name, count, shape, dtype or device
# stops it before a launch, and stops torch.compile while it traces. The value checks (NaN/Inf)
# stay with the public ops: inside a traced graph they would be data-dependent.


@triton_op("geomkern_triton::rbf_gram", mutates_args=())
def rbf_gram_op(X: torch.Tensor, Y: Optional[torch.Tensor], gamma: float, center: bool,
                precision: str) -> torch.Tensor:
    return rbf_gram(*_gram_check(X, Y, gamma, center, precision))


@triton_op("geomkern_triton::rbf_matmul", mutates_args=())
def rbf_matmul_op(X: torch.Tensor, Y: torch.Tensor, V: torch.Tensor, gamma: float,
                  precision: str) -> torch.Tensor:
    return rbf_matmul(*_matmul_check(X, Y, V, gamma, precision))


def _projection_check(X, alphas, offsets, B, gamma, precision):
    """project_onto_basis's launcher arguments (a fit as its alphas and offsets): the checks that
    read no values."""
    gamma, precision = _validate.gamma(gamma), _validate.precision(precision)
    X = _validate.tensor_meta("X", X, ndim=2)
    B = _validate.tensor_meta("B", B, ndim=2)
    alphas = _validate.tensor_meta("alphas", alphas, ndim=2)
    _validate.offsets_meta(offsets)
    _validate.same_device_dtype(X=X, B=B, alphas=alphas)
    _validate.same_dim("X", X, "B", B)
    if alphas.shape[0] != X.shape[0]:
        raise ValueError(f"alphas must have one row per row of X ({X.shape[0]}), got shape {tuple(alphas.shape)}")
    return X, alphas, offsets, B, gamma, precision


@triton_op("geomkern_triton::project_onto_basis", mutates_args=())
def project_onto_basis_op(X: torch.Tensor, alphas: torch.Tensor, offsets: torch.Tensor, B: torch.Tensor,
                          gamma: float, precision: str) -> torch.Tensor:
    return project_onto_basis(*_projection_check(X, alphas, offsets, B, gamma, precision))


# the K-Means assignment step, batched: X (m, n, D), centers (m, k, D) -> (m, n)
@triton_op("geomkern_triton::kmeans_assign", mutates_args=())
def assign_op(X: torch.Tensor, centers: torch.Tensor, precision: str) -> torch.Tensor:
    if X.dim() != 3 or centers.dim() != 3:
        raise ValueError(f"kmeans_assign takes batched X (m, n, D) and centers (m, k, D), got "
                         f"{tuple(X.shape)} and {tuple(centers.shape)}")
    precision = _validate.precision(precision)
    X = _validate.tensor_meta("X", X, ndim=3)
    centers = _validate.tensor_meta("centers", centers, ndim=3)
    _validate.same_device_dtype(X=X, centers=centers)
    if centers.shape[0] != X.shape[0] or centers.shape[2] != X.shape[2]:
        raise ValueError(f"centers (m, k, D) must match X (m, n, D) in m and D, got {tuple(centers.shape)} "
                         f"and {tuple(X.shape)}")
    return assign(X, centers, precision)
