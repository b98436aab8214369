"""Pre-image solvers recover a known point from its exact kernel target (oracle: the point itself,
kernel values from sklearn's rbf_kernel, losses recomputed with numpy)."""
from __future__ import annotations

import secrets

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.metrics.pairwise import rbf_kernel

import geomkern as gk
import geomkern.ops.preimage as pre_mod
from _preimage_problem import preimage_problem
from conftest import DEVICES, TOL, assert_close_rel, backends_for
from geomkern.backends import native

seeds = st.integers(0, 2 ** 32 - 1)
F64 = torch.float64


def _np(t):
    return t.detach().cpu().double().numpy()


def _problem(b, D, S, gen, *, noise=0.02):
    """Basis B (S, D), true points x (b, D), gamma = median heuristic on B, and a start
    z0 = x + noise kernel widths of Gaussian perturbation per coordinate.

    The objectives are non-convex: with d = 8 random coordinates a spurious local minimum can sit
    ~0.07 kernel widths from x (3 of 20,000 starts at noise 0.05 found one, 0 of 20,000 at 0.02),
    so recovery tests start 0.02 widths per coordinate away (start loss ~1e-3, not ~1e-20).
    """
    B = torch.randn(S, D, generator=gen, dtype=F64)
    x = 0.7 * torch.randn(b, D, generator=gen, dtype=F64)
    g = gk.median_gamma(B)
    z0 = x + (noise / g ** 0.5) * torch.randn(b, D, generator=gen, dtype=F64)
    return B, x, g, z0


def _loss_np(Z, B, T, g, A=None):
    k = rbf_kernel(_np(Z), _np(B), gamma=g)
    if A is None:
        r = k - _np(T)
    elif A.dim() == 2:
        r = k @ _np(A).T - _np(T)
    else:
        r = np.einsum("bds,bs->bd", _np(A), k) - _np(T)
    return (r * r).sum(1)


def _dist_in_widths(z, x, g):
    """|z - x| in kernel widths 1/sqrt(gamma), per point."""
    return _np((z - x).norm(dim=1)) * g ** 0.5


@pytest.mark.parametrize("backend", backends_for("preimage_gd"), indirect=True)
@settings(max_examples=10)
@given(b=st.sampled_from((1, 7)), seed=seeds)
def test_gd_recovers_point_when_S_exceeds_D(b, seed, backend):
    gen = torch.Generator().manual_seed(seed)
    B, x, g, z0 = _problem(b, 5, 30, gen)
    T = torch.from_numpy(rbf_kernel(_np(x), _np(B), gamma=g))
    z, loss = gk.preimage(z0, B, T, gamma=g, method="gd", steps=5000, return_loss=True)
    assert z.shape == x.shape and z.dtype == F64
    # plain gradient descent converges linearly, at a rate set by the draw's conditioning: 1000
    # steps left one ill-conditioned draw at 3.2e-6 widths, so 5000 (the problem is tiny); almost
    # every point is at ~1e-15, and a wrong gradient is far off
    dist = _dist_in_widths(z, x, g)
    assert (dist <= 1e-6).all(), f"gd did not recover x: distances {dist}"
    start = _loss_np(z0, B, T, g)
    assert (_np(loss) < 1e-6 * start).all()


@pytest.mark.parametrize("backend", backends_for("preimage_fixed_point"), indirect=True)
@settings(max_examples=10)
@given(b=st.sampled_from((1, 7, 33)), ridge=st.sampled_from((1e-12, 1e-6)), seed=seeds)
def test_fixed_point_recovers_a_basis_point(b, ridge, seed, backend):
    """x = b_s has the exactly representable target k(b_s, B) = G[s]; with a = (G + rho I)^-1 G[s]
    = e_s - rho (G + rho I)^-1 e_s the fixed point moves off x by the ridge's first-order term."""
    gen = torch.Generator().manual_seed(seed)
    S, D = 40, 5
    B = torch.randn(S, D, generator=gen, dtype=F64)
    g = gk.median_gamma(B)
    idx = torch.randint(0, S, (b,), generator=gen)
    x = B[idx]
    z0 = x + (0.02 / g ** 0.5) * torch.randn(b, D, generator=gen, dtype=F64)
    G = rbf_kernel(_np(B), gamma=g)
    T = torch.from_numpy(G[idx.numpy()])
    z = gk.preimage(z0, B, T, gamma=g, method="fixed_point", steps=50, ridge=ridge)
    # first-order displacement predicted by the oracle: sum_s a_s k_s (b_s - x) / sum_s a_s k_s
    a = np.linalg.solve(G + ridge * np.eye(S), _np(T).T).T
    k = rbf_kernel(_np(x), _np(B), gamma=g)
    w = a * k
    shift = (w @ _np(B) - w.sum(1, keepdims=True) * _np(x)) / w.sum(1, keepdims=True)
    bound = 2.0 * np.linalg.norm(shift, axis=1) + 1e-12 * (1.0 + np.linalg.norm(_np(x), axis=1))
    err = np.linalg.norm(_np(z) - _np(x), axis=1)
    assert (err <= bound).all(), f"fixed point off x by {err} > {bound}"
    if ridge == 1e-12:
        assert (_dist_in_widths(z, x, g) <= 1e-6).all()


@pytest.mark.parametrize("backend", backends_for("preimage_coordinates"), indirect=True)
@settings(max_examples=10)
@given(b=st.sampled_from((1, 7)), d=st.integers(1, 5), shared=st.booleans(), seed=seeds)
def test_coordinates_reach_zero_loss_when_d_at_most_D(b, d, shared, seed, backend):
    gen = torch.Generator().manual_seed(seed)
    D, S = 5, 30
    B, x, g, z0 = _problem(b, D, S, gen)
    A = torch.randn(*(() if shared else (b,)), d, S, generator=gen, dtype=F64)
    k = torch.from_numpy(rbf_kernel(_np(x), _np(B), gamma=g))
    C = k @ A.T if shared else torch.einsum("bds,bs->bd", A, k)
    z, loss = gk.preimage(z0, B, C, gamma=g, method="coordinates", steps=100, proj=A,
                          return_loss=True)
    ref = _loss_np(z, B, C, g, A)
    assert (ref < 1e-20).all(), f"coordinates loss {ref}"
    assert (_np(loss) < 1e-20).all()


@pytest.mark.parametrize("backend", backends_for("preimage_coordinates"), indirect=True)
@settings(max_examples=10)
@given(b=st.sampled_from((1, 7)), seed=seeds)
def test_coordinates_recover_point_when_d_exceeds_D(b, seed, backend):
    gen = torch.Generator().manual_seed(seed)
    D, S, d = 5, 30, 8
    B, x, g, z0 = _problem(b, D, S, gen)
    A = torch.randn(d, S, generator=gen, dtype=F64)
    C = torch.from_numpy(rbf_kernel(_np(x), _np(B), gamma=g) @ _np(A).T)
    z = gk.preimage(z0, B, C, gamma=g, method="coordinates", steps=100, proj=A)
    assert_close_rel(z, x, TOL[F64], "recovered point")


@pytest.mark.parametrize("method", ["gd", "fixed_point", "coordinates"])
def test_return_loss_is_the_objective(method, gen):
    """Few steps, so the objective is far from 0 and a relative comparison is meaningful."""
    B, x, g, z0 = _problem(9, 4, 12, gen, noise=0.8)
    T = torch.from_numpy(rbf_kernel(_np(x), _np(B), gamma=g))
    A = None
    if method == "coordinates":
        A = torch.randn(3, 12, generator=gen, dtype=F64)
        T = T @ A.T
    z, loss = gk.preimage(z0, B, T, gamma=g, method=method, steps=2, proj=A, return_loss=True)
    ref = _loss_np(z, B, T, g, A)
    assert ref.min() > 1e-8
    assert_close_rel(loss, ref, TOL[F64], f"{method} loss")
    assert_close_rel(gk.preimage_loss(z, B, T, gamma=g, proj=A), ref, TOL[F64])


@pytest.mark.parametrize("method", ["gd", "fixed_point", "coordinates"])
def test_float32_solvers_recover_point(method, gen):
    B, x, g, z0 = _problem(7, 5, 30, gen)
    if method == "fixed_point":  # exactly representable targets: the points are basis points
        x = B[:7]
        z0 = x + (0.02 / g ** 0.5) * torch.randn(7, 5, generator=gen, dtype=F64)
    T = torch.from_numpy(rbf_kernel(_np(x), _np(B), gamma=g))
    A = None
    if method == "coordinates":
        A = torch.randn(8, 30, generator=gen, dtype=F64)
        T = T @ A.T
    steps = {"gd": 1000, "fixed_point": 50, "coordinates": 100}[method]
    z32 = gk.preimage(z0.float(), B.float(), T.float(), gamma=g, method=method, steps=steps,
                      proj=None if A is None else A.float())
    assert z32.dtype == torch.float32
    # Near the optimum the objective is quadratic, so float32 (which resolves its value to ~eps32)
    # pins z down to ~sqrt(eps32) ~ 3e-4 kernel widths, not to eps32.
    dist = _dist_in_widths(z32.double(), x, g)
    assert (dist <= 1e-3).all(), f"float32 {method}: distances {dist}"


@pytest.mark.parametrize("method", ["gd", "fixed_point", "coordinates"])
def test_chunking_does_not_change_results(method, gen, monkeypatch):
    B, x, g, z0 = _problem(10, 3, 9, gen, noise=0.3)
    T = torch.from_numpy(rbf_kernel(_np(x), _np(B), gamma=g))
    A = None
    if method == "coordinates":
        A = torch.randn(10, 2, 9, generator=gen, dtype=F64)  # per-point maps must follow chunks
        T = torch.einsum("bds,bs->bd", A, T)
    whole = gk.preimage(z0, B, T, gamma=g, method=method, steps=20, proj=A)
    monkeypatch.setattr(pre_mod, "_CHUNK", 3)
    chunked = gk.preimage(z0, B, T, gamma=g, method=method, steps=20, proj=A)
    assert_close_rel(chunked, whole, TOL[F64])


def test_steps_zero_and_explicit_lr(gen):
    B, x, g, z0 = _problem(4, 3, 9, gen, noise=0.3)
    T = torch.from_numpy(rbf_kernel(_np(x), _np(B), gamma=g))
    assert torch.equal(gk.preimage(z0, B, T, gamma=g, steps=0), z0)
    lr = 0.5 / (4 * g * 9)
    a = gk.preimage(z0, B, T, gamma=g, steps=5, lr=lr)
    b = gk.preimage(z0, B, T, gamma=g, steps=5, lr=torch.full((4,), lr, dtype=F64))
    c = gk.preimage(z0, B, T, gamma=g, steps=5, lr=torch.tensor(lr, dtype=F64))
    assert_close_rel(a, b, 1e-15)
    assert_close_rel(a, c, 1e-15)
    # one explicit gradient step, recomputed with numpy: z - lr * grad f,
    # grad f = sum_s 2 r_s dk_s/dz = sum_s 2 r_s k_s (-2 gamma)(z - b_s)
    z1 = gk.preimage(z0, B, T, gamma=g, steps=1, lr=lr)
    Z, Bn = _np(z0), _np(B)
    k = rbf_kernel(Z, Bn, gamma=g)
    r = k - _np(T)
    grad = -4 * g * ((r * k).sum(1, keepdims=True) * Z - (r * k) @ Bn)
    assert_close_rel(z1, Z - lr * grad, TOL[F64], "one gd step")


@pytest.mark.parametrize("device", DEVICES)
def test_preimage_on_device(device, gen):
    B, x, g, z0 = _problem(7, 5, 30, gen)
    T = torch.from_numpy(rbf_kernel(_np(x), _np(B), gamma=g))
    z = gk.preimage(z0.to(device), B.to(device), T.to(device), gamma=g, steps=1000)
    assert z.device.type == device
    assert (_dist_in_widths(z.cpu(), x, g) <= 1e-6).all()


def test_float32_fixed_point_with_nearly_singular_gram(gen):
    """300 basis points on a line (D = 1): G is singular to float32 precision. The coefficients
    are solved in float64, so float32 input works, equals the float64 run to float32 rounding,
    and a basis point's own target still pulls the iterate back to it."""
    B = torch.linspace(-1.0, 1.0, 300, dtype=F64).unsqueeze(1)
    g = 1.0
    x = B[[3, 150, 290]]
    T = torch.from_numpy(rbf_kernel(_np(x), _np(B), gamma=g))
    z0 = x + 0.01
    z64 = gk.preimage(z0, B, T, gamma=g, method="fixed_point", steps=20)
    z32 = gk.preimage(z0.float(), B.float(), T.float(), gamma=g, method="fixed_point", steps=20)
    assert z32.dtype == torch.float32 and torch.isfinite(z32).all()
    assert_close_rel(z32.double(), z64, 1e-4, "float32 vs float64 fixed point")
    assert (z64 - x).abs().max() < 0.01


def test_fixed_point_singular_gram_gives_clear_error(gen):
    B = torch.zeros(4, 2, dtype=F64)  # four identical points: G = all ones, G + ridge I is PD...
    T = torch.ones(1, 4, dtype=F64)
    z = gk.preimage(torch.zeros(1, 2, dtype=F64), B, T, gamma=1.0, method="fixed_point", steps=3)
    assert torch.isfinite(z).all()  # ...so this works; a ridge below float64 resolution does not
    with pytest.raises(ValueError, match="ridge=1e-20"):
        gk.preimage(torch.zeros(1, 2, dtype=F64), B, T, gamma=1.0, method="fixed_point", steps=3, ridge=1e-20)


# ------------------------------------------------- every backend against the float64 reference
# One table for every backend that implements the pre-image (the reference itself included: its
# float32 run against float64). Every b in {1, 7, 33, 257}, S in {1, 7, 33} and D in
# {1, 7, 33, 257} appears; not the full product.
ORACLE_SHAPES = [(1, 1, 1), (1, 33, 257), (7, 7, 33), (7, 33, 1), (33, 1, 7), (33, 7, 257),
                 (33, 33, 7), (257, 33, 33), (257, 7, 1), (257, 1, 257)]
ORACLE_STEPS = (0, 1, 25)
# float32: measured worst case of the native kernel over 5 seeds x 48 shapes x both methods:
# 2.6e-6 (the float32 reference itself: 2.7e-6, mostly from the float32 default lr / fixed-point
# coefficients that gk.preimage computes in the input dtype); float64: 1.4e-15.


@pytest.mark.parametrize("backend", backends_for("preimage_gd", "preimage_fixed_point"), indirect=True)
@pytest.mark.parametrize("shape", ORACLE_SHAPES, ids=lambda s: "b%d-S%d-D%d" % s)
@pytest.mark.parametrize("method", ["gd", "fixed_point"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_matches_float64_reference(shape, method, dtype, backend):
    seed = secrets.randbits(31)
    Z0, B, T, gamma = preimage_problem(*shape, seed)
    Z0, B, T = Z0.to(dtype), B.to(dtype), T.to(dtype)  # the inputs every backend sees
    for steps in ORACLE_STEPS:
        with gk.set_backend("reference"):
            ref = gk.preimage(Z0.double(), B.double(), T.double(), gamma=gamma, method=method,
                              steps=steps)
        # hand the allocator a NaN-filled block of the output's size first, so an element a
        # kernel forgets to write is likely to read as NaN, not as 0
        del_me = torch.full(Z0.shape, float("nan"), dtype=dtype)
        del del_me
        assert gk.resolve(f"preimage_{method}", "cpu") == backend
        out = gk.preimage(Z0, B, T, gamma=gamma, method=method, steps=steps)
        where = f"seed={seed} shape={shape} method={method} dtype={dtype} steps={steps}"
        assert out.shape == Z0.shape and out.dtype == dtype, where
        assert not torch.isnan(out).any(), f"NaN in the output ({where})"
        if steps == 0:
            assert torch.equal(out, Z0), where
        assert_close_rel(out, ref, TOL[dtype], where)


def _native_kernel(op):
    if "native" not in gk.available_backends():
        pytest.skip("geomkern._C (native backend) is not built")
    return native.kernels(native._C)[op]["cpu"]


@pytest.mark.parametrize("b", [20, 257])
@pytest.mark.parametrize("method", ["gd", "fixed_point"])
def test_native_result_does_not_depend_on_thread_count(method, b):
    # The kernel picks a narrower tile when there are more threads than wide tiles; the order of
    # every sum is the same for all tile widths, so the result is bitwise the same (b=257 and
    # b=20 take 4-, 2- and 1-vector tiles between 1 and 3 threads with AVX-512). Called below
    # gk.preimage: the default lr and the fixed-point coefficients come from torch/MKL ops,
    # which need not be bitwise reproducible across thread counts.
    kernel = _native_kernel(f"preimage_{method}")
    seed = secrets.randbits(31)
    Z0, B, T, gamma = preimage_problem(b, 33, 70, seed)
    Z0, B, T = Z0.float(), B.float(), T.float()
    args = (Z0, B, T, gamma, 5, torch.full((Z0.shape[0],), 2.0)) if method == "gd" else (Z0, B, T, gamma, 5)
    before = torch.get_num_threads()
    outs = []
    try:
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            outs.append(kernel(*args))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2]), f"seed={seed}"


@pytest.mark.parametrize("backend", backends_for("preimage_gd"), indirect=True)
def test_gd_default_lr_reduces_loss(backend):
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
        Z, loss = gk.preimage(z0, Bd, Td, gamma=gamma, method="gd", steps=100, return_loss=True)
        assert torch.isfinite(Z).all(), f"seed={seed}"
        assert (loss <= loss0 * (1 + 1e-4)).all(), f"seed={seed} dtype={dtype}"
        assert loss.mean() < 0.5 * loss0.mean(), (
            f"seed={seed} dtype={dtype}: mean loss {loss0.mean():.3e} -> {loss.mean():.3e}")


def test_native_entry_points_reject_bad_inputs():
    _native_kernel("preimage_gd")
    C = native._C
    Z0, B, T = torch.randn(5, 3), torch.randn(4, 3), torch.rand(5, 4)
    lr = torch.full((5,), 0.1)
    with pytest.raises(TypeError, match="dtype"):
        C.preimage_gd(Z0, B.double(), T, 0.5, 3, lr)
    with pytest.raises(ValueError, match="D=3"):
        C.preimage_gd(Z0, torch.randn(4, 2), T, 0.5, 3, lr)
    with pytest.raises(ValueError, match="shape"):
        C.preimage_fixed_point(Z0, B, T[:, :3], 0.5, 3)
    with pytest.raises(ValueError, match="lr"):
        C.preimage_gd(Z0, B, T, 0.5, 3, lr[:4])
    with pytest.raises(ValueError, match="steps"):
        C.preimage_fixed_point(Z0, B, T, 0.5, -1)
