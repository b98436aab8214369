"""Native CPU pre-image kernels (csrc/cpu/preimage.cpp) against the float64 torch reference.

Everything goes through the public API: ``gk.preimage`` under ``gk.set_backend("native")``
versus ``gk.set_backend("reference")``. Inputs are fresh random draws each run; the seed is in
every failure message.
"""
from __future__ import annotations

import secrets

import pytest
import torch
from _preimage_problem import preimage_problem

import geomkern as gk

pytestmark = pytest.mark.skipif(
    "native" not in gk.available_backends(), reason="geomkern._C (native backend) is not built"
)

# Every b in {1, 7, 33, 257}, S in {1, 7, 33} and D in {1, 7, 33, 257} appears; not the full product.
SHAPES = [(1, 1, 1), (1, 33, 257), (7, 7, 33), (7, 33, 1), (33, 1, 7), (33, 7, 257),
          (33, 33, 7), (257, 33, 33), (257, 7, 1), (257, 1, 257)]
STEPS = (0, 1, 25)
# Relative error ||out - ref|| / ||ref|| against the float64 reference on the same inputs.
# float32: the native result is compared with the float64 reference run on the float32-rounded
# inputs. Measured worst case over 5 seeds x 48 shapes x both methods: 2.6e-6 (the float32
# reference itself: 2.7e-6, mostly from the float32 default lr / fixed-point coefficients that
# gk.preimage computes in the input dtype); float64: 1.4e-15.
TOL = {torch.float32: 1e-5, torch.float64: 1e-10}




def _poison_allocator(shape, dtype):
    # The kernel allocates its output; hand the allocator back a NaN-filled block of that size
    # first so an element the kernel forgets to write is likely to read as NaN, not as 0.
    p = torch.full(shape, float("nan"), dtype=dtype)
    del p


def _rel(out, ref):
    den = ref.norm().item()
    return (out.double() - ref).norm().item() / (den if den > 0 else 1.0)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "b%d-S%d-D%d" % s)
@pytest.mark.parametrize("method", ["gd", "fixed_point"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_native_matches_float64_reference(shape, method, dtype):
    seed = secrets.randbits(31)
    Z0, B, T, gamma = preimage_problem(*shape, seed)
    Z0, B, T = Z0.to(dtype), B.to(dtype), T.to(dtype)  # the inputs both backends see
    for steps in STEPS:
        with gk.set_backend("reference"):
            ref = gk.preimage(Z0.double(), B.double(), T.double(), gamma=gamma, method=method,
                              steps=steps)
        _poison_allocator(Z0.shape, dtype)
        with gk.set_backend("native"):
            assert gk.resolve(f"preimage_{method}", "cpu") == "native"
            out = gk.preimage(Z0, B, T, gamma=gamma, method=method, steps=steps)
        where = f"seed={seed} shape={shape} method={method} dtype={dtype} steps={steps}"
        assert out.shape == Z0.shape and out.dtype == dtype, where
        assert not torch.isnan(out).any(), f"NaN in the native output ({where})"
        if steps == 0:
            assert torch.equal(out, Z0), where
        err = _rel(out, ref)
        assert err <= TOL[dtype], f"relative error {err:.2e} > {TOL[dtype]:.0e} ({where})"


@pytest.mark.parametrize("b", [20, 257])
@pytest.mark.parametrize("method", ["gd", "fixed_point"])
def test_native_result_does_not_depend_on_thread_count(method, b):
    # The kernel picks a narrower tile when there are more threads than wide tiles; the order of
    # every sum is the same for all tile widths, so the result is bitwise the same (b=257 and
    # b=20 take 4-, 2- and 1-vector tiles between 1 and 3 threads with AVX-512). Called below
    # gk.preimage: the default lr and the fixed-point coefficients come from torch/MKL ops,
    # which need not be bitwise reproducible across thread counts.
    from geomkern.backends.native import ops as native_ops

    seed = secrets.randbits(31)
    Z0, B, T, gamma = preimage_problem(b, 33, 70, seed)
    Z0, B, T = Z0.float(), B.float(), T.float()
    lr = torch.full((Z0.shape[0],), 2.0)
    before = torch.get_num_threads()
    outs = []
    try:
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            if method == "gd":
                outs.append(native_ops.preimage_gd(Z0, B, T, gamma, 5, lr))
            else:
                outs.append(native_ops.preimage_fixed_point(Z0, B, T, gamma, 5))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2]), f"seed={seed}"


def test_native_gd_default_lr_reduces_loss():
    seed = secrets.randbits(31)
    g = torch.Generator().manual_seed(seed)
    b, S, D = 200, 64, 40
    B = torch.randn(S, D, generator=g, dtype=torch.float64)
    X = torch.randn(b, D, generator=g, dtype=torch.float64)
    gamma = gk.median_gamma(B)
    T = torch.exp(-gamma * torch.cdist(X, B).square())  # exact pre-images exist: z = X
    Z0 = X + 0.3 * torch.randn(b, D, generator=g, dtype=torch.float64)
    for dtype in (torch.float32, torch.float64):
        z0, Bd, Td = Z0.to(dtype), B.to(dtype), T.to(dtype)
        loss0 = gk.preimage_loss(z0, Bd, Td, gamma=gamma)
        with gk.set_backend("native"):
            Z, loss = gk.preimage(z0, Bd, Td, gamma=gamma, method="gd", steps=100,
                                  return_loss=True)
        assert torch.isfinite(Z).all(), f"seed={seed}"
        assert (loss <= loss0 * (1 + 1e-4)).all(), f"seed={seed} dtype={dtype}"
        assert loss.mean() < 0.5 * loss0.mean(), (
            f"seed={seed} dtype={dtype}: mean loss {loss0.mean():.3e} -> {loss.mean():.3e}")


def test_native_entry_points_reject_bad_inputs():
    from geomkern.backends.native import _C

    Z0, B, T = torch.randn(5, 3), torch.randn(4, 3), torch.rand(5, 4)
    lr = torch.full((5,), 0.1)
    with pytest.raises(TypeError, match="dtype"):
        _C.preimage_gd(Z0, B.double(), T, 0.5, 3, lr)
    with pytest.raises(ValueError, match="D=3"):
        _C.preimage_gd(Z0, torch.randn(4, 2), T, 0.5, 3, lr)
    with pytest.raises(ValueError, match="shape"):
        _C.preimage_fixed_point(Z0, B, T[:, :3], 0.5, 3)
    with pytest.raises(ValueError, match="lr"):
        _C.preimage_gd(Z0, B, T, 0.5, 3, lr[:4])
    with pytest.raises(ValueError, match="steps"):
        _C.preimage_fixed_point(Z0, B, T, 0.5, -1)
