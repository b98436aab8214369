"""The batched symmetric eigen-decomposition (geomkern/ops/eigh.py): ONE oracle table over every
backend, each checked by tests/_eigh_oracle.check_eigh against scipy's float64 eigh of the same
(float32-rounded) matrices: eigenvalues, reconstruction, orthogonality and eigenvectors up to
sign (bounded by roundoff / gap).

Backends (generated where they run: _oracle.entries):
  * ``public:<b>``  gk.eigh under every backend built here that registers eigh (``reference``
    always), on CPU, at the public op's tolerance (_oracle.TOL);
  * ``emulated``    csrc/cuda's Jacobi kernel under the host emulation (tests/_cuda_emu.py: g++
    and the CUDA headers, no GPU), at the solver's bound (EIGH_TOL: it computes in double);
  * ``cuda``        the same kernel on a GPU through geomkern._C_cuda (``gpu``-marked).
Rows: the sizes the emulated and the GPU tests checked before (odd, tiny and 257-wide; batches
from 1 to 500). What is particular to one backend stays in its file: the Jacobi sweep counts,
the shared-memory / global-workspace paths and non-convergence (test_cuda_emulated.py,
test_cuda_native.py); the public op's contract (top k, ordering, sign convention, devices,
CuPy's glue) below the table.
"""
from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg
import torch
from _eigh_oracle import check_eigh
from _oracle import DEVICES, FLOATS, SIZES, TOL, assert_close_rel, entries, match_signs, table
from hypothesis import given, settings
from hypothesis import strategies as st

import geomkern as gk

# the Jacobi solver computes in double for float32 input as well, so float32 results are limited by
# their final rounding: measured (emulation, random symmetric, n <= 257) <= 1e-7 for float32 and
# <= 5e-14 for float64
EIGH_TOL = {torch.float32: 1e-6, torch.float64: 1e-12}
# (batch, n): the emulated rows (each launch is a forked child under a fiber scheduler: small) and
# the GPU rows (500 of 100 x 100, 64 of 512 x 512 through the global workspace, odd sizes)
EMULATED_ROWS = [(3, 1), (3, 2), (3, 7), (2, 33), (1, 64), (1, 80)]
GPU_ROWS = [(500, 100), (64, 512), (8, 1), (8, 7), (8, 33), (4, 257)]
ROWS = EMULATED_ROWS + GPU_ROWS
BACKENDS = entries("eigh", prefix="public:") + entries("eigh", names=("emulated", "cuda"))
MAX_SWEEPS = {"emulated": 15, "cuda": 20}  # what the two files asserted; the kernel allows native.MAX_SWEEPS


def _random_symmetric(batch: int, n: int, dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(batch, n, n, generator=g, dtype=torch.float64)
    return ((X + X.transpose(1, 2)) / 2).to(dtype).contiguous()


def _solve(backend: str, A: torch.Tensor, request) -> tuple[np.ndarray, np.ndarray]:
    """(w, V) of every matrix of A by ``backend``, as float64 arrays (the oracle's input)."""
    if backend.startswith("public:"):
        with gk.set_backend(backend.split(":", 1)[1]):
            w, V = gk.eigh(A)
        return w.double().numpy(), V.double().numpy()
    if backend == "emulated":
        from _cuda_emu import jacobi, jacobi_smem

        matrix, scratch = jacobi_smem(A.shape[-1])
        # exactly enough shared memory (an H100's 227 KiB would do as well): the on-chip path
        rc, err, w, V, info, ws = jacobi(request.getfixturevalue("emu_lib"), A.numpy(),
                                         seed=request.getfixturevalue("seed"), device_smem=matrix + scratch)
        assert rc == 0, f"launch returned cudaError {rc}: {err}"
        assert ws == 0, ws
    else:
        from geomkern.backends import native as native_cuda

        Ac = A.cuda()
        w, V, info = native_cuda._C_cuda.eigh(Ac, native_cuda.eigh_tol(A.dtype, A.shape[-1]), native_cuda.MAX_SWEEPS)
        assert w.is_cuda and V.is_cuda and w.dtype == A.dtype
        w, V, info = w.cpu().numpy(), V.cpu().numpy(), info.cpu().numpy()
    assert (info >= 0).all(), f"not converged: info = {info}"
    assert (info <= MAX_SWEEPS[backend]).all(), f"{int(info.max())} sweeps"
    return np.asarray(w, np.float64), np.asarray(V, np.float64)


def _runs(backend, batch, n, dtype):
    """The emulation runs the small rows (a fiber per thread, a fork per launch); the public op on
    CPU (LAPACK) the rows up to 4 x 257 x 257, not the GPU's large batches."""
    if backend == "emulated":
        return (batch, n) in EMULATED_ROWS
    return not backend.startswith("public:") or batch * n * n <= 4 * 257 * 257


@pytest.mark.parametrize("backend,batch,n,dtype", table(
    BACKENDS, (2, [pytest.param(b, n, id=f"{b}x{n}") for b, n in ROWS]),
    [pytest.param(torch.float64, id="f64"), pytest.param(torch.float32, id="f32")], keep=_runs))
def test_eigh_oracle_table(backend, batch, n, dtype, seed, request):
    A = _random_symmetric(batch, n, dtype, seed)
    w, V = _solve(backend, A, request)
    tol = TOL[dtype] if backend.startswith("public:") else EIGH_TOL[dtype]
    check_eigh(A.double().numpy(), w, V, tol, name=f"{backend} eigh {batch}x{n} {dtype}")


# ---------------------------------------------------------------------- the public op's contract
seeds = st.integers(0, 2 ** 32 - 1)


def _np(t):
    return t.detach().cpu().double().numpy()


def _sym_with_spectrum(batch, n, gen, dtype):
    """Random symmetric matrices Q diag(w) Q^T with eigenvalues spaced >= 1/(2n) of the range."""
    Q = torch.linalg.qr(torch.randn(*batch, n, n, generator=gen, dtype=torch.float64)).Q
    base = torch.linspace(-1.0, 2.0, n, dtype=torch.float64)
    w = base + (1.0 / (4 * max(n, 2))) * torch.rand(*batch, n, generator=gen, dtype=torch.float64)
    A = (Q * w.unsqueeze(-2)) @ Q.transpose(-1, -2)
    A = 0.5 * (A + A.transpose(-1, -2))
    return A.to(dtype)


@pytest.mark.parametrize("backend", entries("eigh"), indirect=True)
@settings(max_examples=20)
@given(n=st.sampled_from(SIZES), batch=st.sampled_from(((), (3,), (2, 2))),
       k=st.sampled_from((None, 1, 3)), dtype=st.sampled_from(FLOATS), seed=seeds)
def test_eigh_matches_scipy(n, batch, k, dtype, seed, backend):
    gen = torch.Generator().manual_seed(seed)
    k = None if k is None else min(k, n)
    A = _sym_with_spectrum(batch, n, gen, dtype)
    w, V = gk.eigh(A, k=k)
    kk = n if k is None else k
    assert w.shape == (*batch, kk) and V.shape == (*batch, n, kk) and w.dtype == dtype
    assert bool((w[..., :-1] >= w[..., 1:]).all()), "eigenvalues not descending"
    A64 = _np(A).reshape(-1, n, n)
    W, VV = _np(w).reshape(-1, kk), _np(V).reshape(-1, n, kk)
    for b in range(A64.shape[0]):
        rw, rV = scipy.linalg.eigh(A64[b], subset_by_index=[n - kk, n - 1])
        rw, rV = rw[::-1], rV[:, ::-1]
        assert_close_rel(W[b], rw, TOL[dtype], f"eigenvalues[{b}]")
        # A V = V diag(w) and V^T V = I (backward-stable quantities: no eigengap needed)
        scale = 2.25  # |A|_2 = max |w| <= 2 + 1/(4n) by construction
        resid = A64[b] @ VV[b] - VV[b] * W[b]
        assert np.linalg.norm(resid) <= TOL[dtype] * scale * np.sqrt(kk), "A V != V diag(w)"
        assert_close_rel(VV[b].T @ VV[b], np.eye(kk), TOL[dtype], "V^T V")
        # eigenvectors up to sign (the spectrum is spaced; float32 vectors are only as accurate as
        # eps / relative gap, so they are compared in float64 only)
        if dtype == torch.float64:
            s = match_signs(VV[b], rV)
            assert_close_rel(VV[b] * s, rV, TOL[dtype], f"eigenvectors[{b}]")
        # sign convention: each column's largest-|.| entry is positive
        cols = np.arange(kk)
        assert (VV[b][np.abs(VV[b]).argmax(0), cols] > 0).all()


@pytest.mark.parametrize("dtype", FLOATS)
def test_eigh_rank_one(dtype, gen):
    v = torch.randn(9, generator=gen, dtype=torch.float64)
    A = torch.outer(v, v).to(dtype)
    w, V = gk.eigh(A)
    assert bool(torch.isfinite(w).all()) and bool(torch.isfinite(V).all())
    assert_close_rel(w[0], float(v @ v), TOL[dtype])
    assert float(w[1:].abs().max()) <= TOL[dtype] * float(v @ v)
    u = _np(v) / np.linalg.norm(_np(v))
    assert_close_rel(_np(V[:, 0]) * np.sign(_np(V[:, 0]) @ u), u, TOL[dtype])
    assert_close_rel(_np(V).T @ _np(V), np.eye(9), TOL[dtype])
    w2, V2 = gk.eigh(A, k=2)
    assert_close_rel(w2, w[:2], TOL[dtype])


@pytest.mark.parametrize("device", DEVICES)
def test_eigh_on_device(device, gen):
    A = _sym_with_spectrum((2,), 7, gen, torch.float64)
    w, V = gk.eigh(A.to(device), k=3)
    assert w.device.type == device and V.device.type == device
    rw, rV = gk.eigh(A, k=3)
    assert_close_rel(w, rw, TOL[torch.float64])
    assert_close_rel(V, rV, TOL[torch.float64])


def test_cupy_eigh_glue_with_a_numpy_stand_in(monkeypatch, gen):
    """The CuPy path's DLPack round trip, ordering, truncation and sign convention, run on CPU
    with NumPy standing in for CuPy (same from_dlpack / linalg.eigh API). The real CuPy run is
    the GPU-marked test below."""
    import contextlib
    import types

    import geomkern.backends.cupy as cupy_backend

    fake = types.SimpleNamespace(from_dlpack=np.from_dlpack, linalg=types.SimpleNamespace(eigh=np.linalg.eigh),
                                 cuda=types.SimpleNamespace(Device=lambda i: contextlib.nullcontext()))
    monkeypatch.setattr(cupy_backend, "cupy", fake)
    A = _sym_with_spectrum((3,), 11, gen, torch.float64)
    w, V = cupy_backend.eigh(A, 4)
    rw, rV = gk.eigh(A, k=4)
    assert w.shape == (3, 4) and V.shape == (3, 11, 4)
    assert_close_rel(w, rw, TOL[torch.float64])
    assert_close_rel(V, rV, TOL[torch.float64])  # same sign convention, so no sign matching


@pytest.mark.gpu
@pytest.mark.skipif("cupy" not in gk.available_backends(), reason="cupy is not importable here: pip install cupy-cuda12x")
@pytest.mark.parametrize("dtype", FLOATS)
def test_cupy_eigh_on_cuda_matches_reference(dtype, gen):
    A = _sym_with_spectrum((5,), 40, gen, dtype)
    with gk.set_backend("cupy"):
        assert gk._dispatch.resolve("eigh", "cuda") == "cupy"
        w, V = gk.eigh(A.cuda(), k=6)
    rw, rV = gk.eigh(A.double(), k=6)
    assert_close_rel(w.cpu().double(), rw, TOL[dtype])
    if dtype == torch.float64:
        assert_close_rel(V.cpu(), rV, TOL[dtype])
