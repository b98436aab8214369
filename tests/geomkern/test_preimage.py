"""Pre-image solvers recover a known point from its exact kernel target (oracle: the point itself,
kernel values from sklearn's rbf_kernel, losses recomputed with numpy)."""
from __future__ import annotations


import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.metrics.pairwise import rbf_kernel

import geomkern as gk
import geomkern.ops.preimage as pre_mod
from _preimage_problem import near_basis_problem, preimage_problem
from _oracle import DEVICES, TOL, assert_close_rel, entries, table
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


@pytest.mark.parametrize("backend", entries("preimage_gd"), indirect=True)
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


@pytest.mark.parametrize("backend", entries("preimage_fixed_point"), indirect=True)
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


@pytest.mark.parametrize("backend", entries("preimage_coordinates"), indirect=True)
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


@pytest.mark.parametrize("backend", entries("preimage_coordinates"), indirect=True)
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


# ------------------------------------------------- the oracle table: every backend, one problem set
# One table for every implementation of the pre-image that can run here, all on the same problems
# and against the float64 reference evaluated on the same rounded inputs, at TOL (1e-5 float32,
# 1e-10 float64) for every backend. Two problems (tests/_preimage_problem.py): "targets" (perturbed
# kernel targets; the fixed point takes the coefficients (G + 1e-6 I)^-1 T) and "near" (points near
# the basis, exact targets, positive coefficients: the Triton tests' problem). Fresh seed per case.
#
# Measured worst cases (before this table, per backend): native kernels over 5 seeds x 48 shapes x
# both methods 2.6e-6 float32 (the float32 reference itself 2.7e-6, mostly from the float32 default
# lr / fixed-point coefficients gk.preimage computes in the input dtype), 1.4e-15 float64; CUDA
# under emulation <= 2e-7 / 5e-16.
#
# Shapes: every b in {1, 5, 7, 17, 33, 40, 65, 257}, S in {1, 3, 7, 13, 33, 47, 96} and D in
# {1, 7, 9, 13, 17, 33, 64, 70, 100, 257} appears (b around the 16-lane tiles of AVX-512 and 8 of
# AVX2, S and D around the 6-wide register blocks, 33 and 70 not multiples of the CUDA kernel's
# 32-wide tiles); not the full product.
TARGET_SHAPES = [(1, 1, 1), (1, 33, 257), (7, 7, 33), (7, 33, 1), (33, 1, 7), (33, 7, 257),
                 (33, 33, 7), (257, 33, 33), (257, 7, 1), (257, 1, 257), (5, 3, 17), (17, 13, 13),
                 (33, 7, 64), (40, 47, 9), (65, 96, 100), (33, 7, 70)]
TARGET_STEPS = (0, 1, 2, 25)
# a size that needs 16 (float32) and 8 (float64) points per CUDA block to fit shared memory (227 KB
# on an H100: S = D = 1300 takes 194 KB and 221 KB), and a large batch: on a GPU only
GPU_SHAPES = [(70, 1300, 1300), (5000, 512, 512)]
# (b, S, D, steps): b = 130 > one Triton BLOCK_M, D and S past several BLOCK_N / BLOCK_K tiles and
# not 16-byte multiples (the descriptors' padded copies); 257 points wide is slow (--runslow)
NEAR_CASES = [(1, 1, 1, 3), (7, 33, 5, 4), (33, 7, 40, 3), (20, 9, 3, 0), (130, 131, 1027, 2),
              pytest.param(257, 40, 300, 5, marks=pytest.mark.slow)]
# The host emulation (one fiber per CUDA thread) runs the rows under this work budget (a bound picked,
# not measured, that every shape the emulated tests ran before stays under); Triton's interpreter
# leaves out the targets rows with b or D = 257 (measured 3-20 s each, about 90 s in all) and runs
# the other targets rows to 2 steps (25 on a GPU)
EMULATION_MAX = 100_000  # b * (S + D) * steps


def _native_entry(name):
    """The native CPU kernels: the dispatcher's entry (span form where S <= D, direct above) and
    both forms forced, so each runs every shape."""
    def run(method, Z0, B, X, gamma, steps, lr):
        if name == "native":
            f = native.kernels(native._C)[f"preimage_{method}"]["cpu"]
        else:
            f = getattr(native._C, f"preimage_{method}" + ("_span" if name == "native-span" else ""))
        return f(Z0, B, X, gamma, steps, lr) if method == "gd" else f(Z0, B, X, gamma, steps)
    return run


def _reference_entry(method, Z0, B, X, gamma, steps, lr):
    if method == "gd":
        return pre_mod.gd_reference(Z0, B, X, gamma, steps, lr)
    return pre_mod.fixed_point_reference(Z0, B, X, gamma, steps)


def _triton_check(device, method, Z0, B, X, gamma, steps, lr):
    """The Triton kernel with every buffer its launcher allocates poisoned (NaN); picklable, so it
    runs in the interpreter worker for CPU tensors."""
    from geomkern.backends.triton import _common
    from geomkern.backends.triton import preimage as tpre

    orig = _common.empty
    _common.empty = lambda shape, dtype, dev: orig(shape, dtype, dev).fill_(float("nan"))
    try:
        Z0, B, X = (t.to(device) for t in (Z0, B, X))
        if method == "gd":
            return tpre.preimage_gd(Z0, B, X, gamma, steps, lr.to(device)).cpu()
        return tpre.preimage_fixed_point(Z0, B, X, gamma, steps).cpu()
    finally:
        _common.empty = orig


def _cuda_emulated_entry(emu_lib, seed):
    from _cuda_emu import H100_SMEM, preimage, preimage_points

    def run(method, Z0, B, X, gamma, steps, lr):
        rc, err, out, points = preimage(emu_lib, Z0.numpy(), B.numpy(), X.numpy(), lr.numpy(), gamma,
                                        steps, seed=seed)
        assert rc == 0, f"launch returned cudaError {rc}: {err}"
        want = preimage_points(B.shape[0], B.shape[1], Z0.element_size(), H100_SMEM)
        assert points == want, f"{points} points per block, the launcher should take {want}"
        return torch.from_numpy(out)
    return run


def _cuda_entry(method, Z0, B, X, gamma, steps, lr):
    Z0, B, X, lr = (t.to("cuda") for t in (Z0, B, X, lr))
    with gk.set_backend("native"):
        assert gk.resolve("preimage_gd", "cuda") == "native"
        out = gk.preimage(Z0, B, X, gamma=gamma, method="gd", steps=steps, lr=lr)
    assert out.is_cuda
    return out.cpu()


def _rows():
    rows = [pytest.param("targets", *s, TARGET_STEPS, id="targets-b%d-S%d-D%d" % s) for s in TARGET_SHAPES]
    rows += [pytest.param("targets", *s, (0, 1, 25), id="targets-b%d-S%d-D%d" % s, marks=pytest.mark.gpu)
             for s in GPU_SHAPES]
    for c in NEAR_CASES:
        values, marks = (c.values, c.marks) if hasattr(c, "values") else (c, ())
        b, S, D, steps = values
        rows.append(pytest.param("near", b, S, D, (steps,), id=f"near-b{b}-S{S}-D{D}-steps{steps}", marks=marks))
    return rows


def _table_problem(kind, b, S, D, seed, dtype):
    """(Z0, B, T, A, gamma) rounded to dtype: the inputs every backend and the reference see."""
    if kind == "targets":
        Z0, B, T, gamma = preimage_problem(b, S, D, seed)
        A = pre_mod.fixed_point_coefficients(B, T, gamma, 1e-6)
    else:
        Z0, B, T, A, gamma = near_basis_problem(b, S, D, seed)
    return (*(t.to(dtype) for t in (Z0, B, T, A)), gamma)


def _check_against_reference(out, Z0, ref, steps, where):
    """A pre-image run against the float64 reference: Z0's shape and dtype, no NaN (the kernels'
    buffers start as NaN), Z0 itself at steps = 0, then within TOL of the reference."""
    assert out.shape == Z0.shape and out.dtype == Z0.dtype, where
    assert not torch.isnan(out).any(), f"NaN in the output ({where})"
    if steps == 0:
        assert torch.equal(out, Z0), where
    assert_close_rel(out, ref, TOL[Z0.dtype], where)


def _runs(dtype, method, kind, b, S, D, steps_list, entry):
    """The cases of the table that run: csrc/cuda has the gradient-descent pre-image only (its
    fixed point is the reference's); the GPU-sized shapes (the CUDA kernel's shared-memory tiling)
    on a GPU only; the host emulation within EMULATION_MAX; Triton's interpreter without the
    targets rows where b or D is 257 (those on a GPU: triton-cuda)."""
    if entry in ("cuda-emulated", "cuda") and method == "fixed_point":
        return False
    if (b, S, D) in GPU_SHAPES:
        return entry == "cuda"
    if entry == "cuda-emulated":
        return b * (S + D) * max(steps_list) <= EMULATION_MAX
    return not (entry == "triton-cpu" and kind == "targets" and max(b, D) >= 257)


# every pre-image implementation of the table: the reference, the native CPU kernels (the
# dispatcher's entry and both forms forced), Triton, and csrc/cuda's kernel under the host
# emulation and on a GPU
@pytest.mark.parametrize("dtype,method,kind,b,S,D,steps_list,entry", table(
    [pytest.param(torch.float32, id="f32"), pytest.param(torch.float64, id="f64")], ["gd", "fixed_point"],
    (5, _rows()), entries("preimage_gd", names=("reference", "native", "native-span", "native-direct",
                                                "triton-cpu", "triton-cuda", "cuda-emulated", "cuda")),
    keep=_runs))
def test_preimage_kernels_match_float64_reference(entry, kind, b, S, D, steps_list, method, dtype, request, seed):
    """Every pre-image kernel (reference, native CPU in both forms, Triton, CUDA emulated and on a
    GPU) on the same rounded inputs, against the float64 reference at TOL: shape, dtype, no NaN
    (Triton's buffers start as NaN, the emulation's output too), steps = 0 returns Z0 exactly."""
    if entry == "triton-cpu" and kind == "targets":
        steps_list = tuple(s for s in steps_list if s <= 2)  # 25 steps in the interpreter: GPU only
    Z0, B, T, A, gamma = _table_problem(kind, b, S, D, seed, dtype)
    X = T if method == "gd" else A
    lr = pre_mod.default_gd_lr(Z0, B, gamma)
    if entry == "reference":
        run = _reference_entry
    elif entry.startswith("native"):
        run = _native_entry(entry)
    elif entry.startswith("triton"):
        device = "cuda" if entry == "triton-cuda" else "cpu"
        triton_run = request.getfixturevalue("triton_run")
        run = lambda *a: triton_run(_triton_check, device, *a)  # noqa: E731
    elif entry == "cuda-emulated":
        run = _cuda_emulated_entry(request.getfixturevalue("emu_lib"), seed)
    else:
        run = _cuda_entry
    for steps in steps_list:
        ref = _reference_entry(method, Z0.double(), B.double(), X.double(), gamma, steps, lr.double())
        out = run(method, Z0, B, X, gamma, steps, lr)
        where = f"{entry} seed={seed} {kind} b,S,D={b},{S},{D} method={method} dtype={dtype} steps={steps}"
        _check_against_reference(out, Z0, ref, steps, where)


# The public op through the dispatcher, on every backend that takes it on CPU tensors: gk.preimage
# computes the default lr and the fixed-point coefficients itself, in the input dtype, so its
# float32 run is compared with the whole float64 computation (the reference's own float32 run
# included).
ORACLE_SHAPES = TARGET_SHAPES[:10]
ORACLE_STEPS = (0, 1, 25)


@pytest.mark.parametrize("backend", entries("preimage_gd", "preimage_fixed_point"), indirect=True)
@pytest.mark.parametrize("shape", ORACLE_SHAPES, ids=lambda s: "b%d-S%d-D%d" % s)
@pytest.mark.parametrize("method", ["gd", "fixed_point"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_matches_float64_reference(shape, method, dtype, backend, seed):
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
        _check_against_reference(out, Z0, ref, steps,
                                 f"seed={seed} shape={shape} method={method} dtype={dtype} steps={steps}")


needs_native = pytest.mark.skipif("native" not in gk.available_backends(),
                                  reason="geomkern._C (native backend) is not built")


def _native_kernel(op):
    return native.kernels(native._C)[op]["cpu"]


@needs_native
@pytest.mark.parametrize("b", [20, 257])
@pytest.mark.parametrize("method", ["gd", "fixed_point"])
def test_native_result_does_not_depend_on_thread_count(method, b, seed):
    # The kernel picks a narrower tile when there are more threads than wide tiles; the order of
    # every sum is the same for all tile widths, so the result is bitwise the same (b=257 and
    # b=20 take 4-, 2- and 1-vector tiles between 1 and 3 threads with AVX-512). Called below
    # gk.preimage: the default lr and the fixed-point coefficients come from torch/MKL ops,
    # which need not be bitwise reproducible across thread counts.
    kernel = _native_kernel(f"preimage_{method}")
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


@pytest.mark.parametrize("backend", entries("preimage_gd"), indirect=True)
def test_gd_default_lr_reduces_loss(backend, seed):
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


@needs_native
@pytest.mark.parametrize("form,S", [("", 4), ("_span", 2)], ids=["full", "span"])
def test_native_entry_points_reject_bad_inputs(form, S):
    """geomkern._C's pre-image entry points, both forms (the span form takes S <= D), refuse a
    bad argument with an error that names it."""
    _native_kernel("preimage_gd")
    gd, fp = getattr(native._C, f"preimage_gd{form}"), getattr(native._C, f"preimage_fixed_point{form}")
    Z0, B, T = torch.randn(5, 3), torch.randn(S, 3), torch.rand(5, S)
    lr = torch.full((5,), 0.1)
    with pytest.raises(TypeError, match="dtype"):
        gd(Z0, B.double(), T, 0.5, 3, lr)
    with pytest.raises(ValueError, match="D=3"):
        gd(Z0, torch.randn(S, 2), T, 0.5, 3, lr)
    with pytest.raises(ValueError, match="shape"):
        fp(Z0, B, T[:, :S - 1], 0.5, 3)
    with pytest.raises(ValueError, match="lr"):
        gd(Z0, B, T, 0.5, 3, lr[:4])
    with pytest.raises(ValueError, match="steps"):
        fp(Z0, B, T, 0.5, -1)
    with pytest.raises(ValueError, match="gamma"):
        gd(Z0, B, T, 0.0, 3, lr)
