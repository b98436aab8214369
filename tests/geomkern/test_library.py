"""geomkern's ops as torch custom operators (geomkern/_library.py): registered under
torch.ops.geomkern, schema and fake (meta) implementations consistent with the real ones
(torch.library.opcheck), and a torch.compile(fullgraph=True) of a function calling every one of
them compiles without a graph break and matches eager mode on CPU, value checks included."""
from __future__ import annotations

import pytest
import torch

import geomkern as gk

OPS = ("rbf_gram", "rbf_matmul", "kmeans", "kpca_transform", "preimage")


@pytest.fixture
def problem():
    g = torch.Generator().manual_seed(0)
    X = torch.randn(80, 6, generator=g)
    off = torch.tensor([0, 30, 80])
    B = torch.randn(12, 6, generator=g)
    fit = gk.kpca(X, off, n_components=3, gamma=0.4)
    return X, off, B, fit


def _pipeline(X, B, off, fit):
    K = gk.rbf_gram(X, gamma=0.4)
    KV = gk.rbf_matmul(X, B, B[:, :2], gamma=0.4)
    scores = gk.kpca_transform(B, X, fit, gamma=0.4, segment=0)
    T = gk.rbf_gram(B[:5], B, gamma=0.4)
    Z = gk.preimage(B[:5] + 0.1, B, T, gamma=0.4, steps=20)
    Zf, loss = gk.preimage(B[:5] + 0.1, B, T, gamma=0.4, method="fixed_point", steps=5, return_loss=True)
    km = gk.kmeans(X, 3, offsets=off)
    return K, KV, scores, Z, Zf, loss, km.labels, km.centers, km.inertia


def test_every_compiled_op_is_a_registered_operator():
    for name in OPS:
        assert hasattr(torch.ops.geomkern, name), f"torch.ops.geomkern.{name} is not registered"


def test_opcheck_schema_and_fake_implementations(problem):
    """torch.library.opcheck: the schema matches what the body does (no mutation, no aliasing)
    and each fake implementation gives the real outputs' shapes, dtypes and devices."""
    X, off, B, fit = problem
    T = gk.rbf_gram(B[:5], B, gamma=0.4)
    cases = [
        (torch.ops.geomkern.rbf_gram.default, (X, None, 0.4, True, "tf32x3")),
        (torch.ops.geomkern.rbf_gram.default, (X, B, 0.4, False, "tf32x3")),
        (torch.ops.geomkern.rbf_matmul.default, (X, B, B[:, :2].contiguous(), 0.4, "tf32x3")),
        (torch.ops.geomkern.kmeans.default, (X, 3, off, 10, 0, 2, "tf32x3")),
        (torch.ops.geomkern.kmeans.default, (X, 3, None, 10, 0, 1, "tf32x3")),
        (torch.ops.geomkern.kpca_transform.default,
         (B, X, fit.eigenvalues, fit.variances, fit.alphas, fit.mean_projection, fit.offsets,
          fit.gamma, fit.fingerprint, 0.4, 1, None)),
        (torch.ops.geomkern.preimage.default,
         (B[:5] + 0.1, B, T, 0.4, "gd", 10, None, None, None, 0.0, None, True, "tf32x3")),
        (torch.ops.geomkern.preimage.default,
         (B[:5] + 0.1, B, T, 0.4, "fixed_point", 5, None, None, None, 1e-6, None, False, "tf32x3")),
    ]
    for op, args in cases:
        torch.library.opcheck(op, args, test_utils=("test_schema", "test_faketensor"))


def test_fullgraph_compile_matches_eager(problem):
    X, off, B, fit = problem
    eager = _pipeline(X, B, off, fit)
    compiled = torch.compile(_pipeline, fullgraph=True)(X, B, off, fit)
    for e, c in zip(eager, compiled):
        assert torch.equal(e, c)


def test_value_checks_still_run_inside_a_compiled_function(problem):
    """The data-dependent checks run in the operator's body, at run time: a NaN in a compiled
    call gets the eager call's error, naming the argument."""
    X, off, B, fit = problem
    f = torch.compile(lambda X: gk.rbf_gram(X, gamma=0.4), fullgraph=True)
    f(X)
    bad = X.clone()
    bad[3, 1] = float("nan")
    with pytest.raises(ValueError, match="X contains 1 NaN"):
        f(bad)
    with pytest.raises(ValueError, match="requires grad"):
        gk.rbf_matmul(X.requires_grad_(), B, B, gamma=0.4)
