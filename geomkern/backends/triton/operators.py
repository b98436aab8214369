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

from .kmeans import assign
from .kpca import project_onto_basis
from .rbf import rbf_gram, rbf_matmul


@triton_op("geomkern_triton::rbf_gram", mutates_args=())
def rbf_gram_op(X: torch.Tensor, Y: Optional[torch.Tensor], gamma: float, center: bool,
                precision: str) -> torch.Tensor:
    return rbf_gram(X, Y, gamma, center, precision)


@triton_op("geomkern_triton::rbf_matmul", mutates_args=())
def rbf_matmul_op(X: torch.Tensor, Y: torch.Tensor, V: torch.Tensor, gamma: float,
                  precision: str) -> torch.Tensor:
    return rbf_matmul(X, Y, V, gamma, precision)


@triton_op("geomkern_triton::project_onto_basis", mutates_args=())
def project_onto_basis_op(X: torch.Tensor, alphas: torch.Tensor, offsets: torch.Tensor, B: torch.Tensor,
                          gamma: float, precision: str) -> torch.Tensor:
    return project_onto_basis(X, alphas, offsets, B, gamma, precision)


# the K-Means assignment step, batched: X (m, n, D), centers (m, k, D) -> (m, n)
@triton_op("geomkern_triton::kmeans_assign", mutates_args=())
def assign_op(X: torch.Tensor, centers: torch.Tensor, precision: str) -> torch.Tensor:
    if X.dim() != 3 or centers.dim() != 3:
        raise ValueError(f"kmeans_assign takes batched X (m, n, D) and centers (m, k, D), got "
                         f"{tuple(X.shape)} and {tuple(centers.shape)}")
    return assign(X, centers, precision)
