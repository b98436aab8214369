"""The CUDA kernels of csrc/cuda/ run on the CPU under a host emulation of the CUDA subset they use
(tests/cuda_host/cuda_emu.h: each block's threads are fibers switched at __syncthreads, in a
random order per barrier phase; shared memory starts as NaN; divergent barriers and launches
asking for more shared memory than granted are errors). The kernel and launcher sources are
compiled unchanged by g++; only the CUDA runtime underneath is replaced.

This is what checks the kernels' arithmetic, indexing and barrier placement on a machine without
a GPU; tests/geomkern/test_cuda_native.py runs the same checks on a real device. Each launch runs in a
forked child, so an out-of-bounds access fails one test instead of the whole session. The
thread order seed is the printed test seed.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from _cuda_emu import (CUDA_ERROR_INVALID_VALUE, H100_SMEM, UNAVAILABLE, jacobi, jacobi_smem, preimage,
                       preimage_smem_bytes)
from _eigh_oracle import check_eigh
from _preimage_problem import preimage_problem

from geomkern.ops.preimage import default_gd_lr, gd_reference

pytestmark = pytest.mark.skipif(UNAVAILABLE is not None, reason=str(UNAVAILABLE))

# Error bounds for the Jacobi solver. It computes in double for float32 input as well, so float32
# results are limited by their final rounding: measured (emulation, random symmetric, n <= 257)
# <= 1e-7 on every measure for float32 and <= 5e-14 for float64.
EIGH_TOL = {np.float32: 1e-6, np.float64: 1e-12}
# Pre-image: as the pre-image oracle table (tests/geomkern/test_preimage.py: the float64 reference
# on the float32-rounded inputs); measured here <= 2e-7 (float32) and <= 5e-16 (float64).
PREIMAGE_TOL = {np.float32: 1e-5, np.float64: 1e-10}


# -------------------------------------------------------------------------------- Jacobi eigh

def _random_symmetric(rng, batch, n, dtype):
    X = rng.standard_normal((batch, n, n))
    return ((X + X.transpose(0, 2, 1)) / 2).astype(dtype)


def _assert_ok(rc, err, info=None, max_sweeps=None):
    assert rc == 0, f"launch returned cudaError {rc}: {err}"
    if info is not None:
        assert (info >= 0).all(), f"not converged: info = {info}"
        if max_sweeps is not None:
            assert (info <= max_sweeps).all(), info


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("n", [9, 33])
def test_jacobi_global_memory_path(emu_lib, rng, seed, n, dtype):
    """A device with 8 bytes too little shared memory for A and V: they live in the workspace."""
    A = _random_symmetric(rng, 2, n, dtype)
    matrix, scratch = jacobi_smem(n)
    rc, err, w, V, info, ws = jacobi(emu_lib, A, seed=seed, device_smem=matrix + scratch - 8)
    _assert_ok(rc, err, info, max_sweeps=15)
    assert ws == 2 * 16 * n * n, ws
    check_eigh(A, w, V, EIGH_TOL[dtype], name=f"emulated jacobi (global) n={n}")


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_jacobi_structured_matrices(emu_lib, rng, seed, dtype):
    n = 24
    Q = np.linalg.qr(rng.standard_normal((n, n)))[0]
    repeated = np.repeat([3.0, 1.0, -2.0, 0.0], n // 4)  # four eigenvalues of multiplicity 6
    X = rng.standard_normal((n, 5))
    sq = ((X[:, None, :] - X[None, :, :]) ** 2).sum(-1)
    K = np.exp(-sq / np.median(sq))
    H = np.eye(n) - 1.0 / n
    mats = np.stack([
        np.diag(rng.standard_normal(n)),      # already diagonal: no sweep needed
        np.zeros((n, n)),                     # all zero
        (Q * repeated) @ Q.T,                 # repeated eigenvalues
        H @ K @ H,                            # centred RBF Gram: one eigenvalue is 0
        np.diag(np.arange(n, dtype=float)) + 1e-3 * np.ones((n, n)),  # near-diagonal
        np.eye(n) + X @ X.T / 5,              # regularised low rank: eigenvalue 1, multiplicity 19
    ])
    A = ((mats + mats.transpose(0, 2, 1)) / 2).astype(dtype)
    rc, err, w, V, info, ws = jacobi(emu_lib, A, seed=seed)
    # repeated eigenvalues stalled at 1e-11 (f64) before rotations below tol ||A||_F / n were
    # skipped; now 11-13 sweeps, like distinct ones
    _assert_ok(rc, err, info, max_sweeps=15)
    assert info[0] == 0 and info[1] == 0, info
    np.testing.assert_array_equal(w[0], np.sort(np.diag(A[0]))[::-1])
    np.testing.assert_array_equal(w[1], 0)
    check_eigh(A, w, V, EIGH_TOL[dtype], name="emulated jacobi (structured)")


def test_jacobi_reports_non_convergence(emu_lib, rng, seed):
    A = _random_symmetric(rng, 3, 10, np.float64)
    A[2, 3, 4] = A[2, 4, 3] = np.nan
    rc, err, w, V, info, _ = jacobi(emu_lib, A, seed=seed, max_sweeps=0)
    _assert_ok(rc, err)
    assert (info == -1).all(), info  # zero sweeps allowed: nothing converged
    rc, err, w, V, info, _ = jacobi(emu_lib, A, seed=seed, max_sweeps=20)
    _assert_ok(rc, err)
    assert info[0] > 0 and info[1] > 0 and info[2] == -1, info  # NaN never converges


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_jacobi_n257_workspace(emu_lib, rng, seed, dtype):
    """n = 257 (odd, 1024 threads, beyond an H100's shared memory: the global workspace)."""
    A = _random_symmetric(rng, 1, 257, dtype)
    rc, err, w, V, info, ws = jacobi(emu_lib, A, seed=seed)
    _assert_ok(rc, err, info, max_sweeps=15)
    assert ws > 0
    check_eigh(A, w, V, EIGH_TOL[dtype], name="emulated jacobi n=257")


# ---------------------------------------------------------------------------------- pre-image



def _check_preimage(emu_lib, shape, dtype, seed, steps_list=(0, 1, 25), device_smem=H100_SMEM,
                    points_expected=None):
    tdt = torch.float32 if dtype == np.float32 else torch.float64
    Z0, B, T, gamma = preimage_problem(*shape, seed)
    Z0, B, T = Z0.to(tdt), B.to(tdt), T.to(tdt)  # the inputs both sides see
    lr = default_gd_lr(Z0, B, gamma)
    for steps in steps_list:
        ref = gd_reference(Z0.double(), B.double(), T.double(), gamma, steps, lr.double())
        rc, err, out, points = preimage(emu_lib, Z0.numpy(), B.numpy(), T.numpy(), lr.numpy(), gamma,
                                        steps, seed=seed, device_smem=device_smem)
        assert rc == 0, f"launch returned cudaError {rc}: {err}"
        if points_expected is not None:
            assert points == points_expected
        rel = float(np.linalg.norm(out.astype(np.float64) - ref.numpy()) / max(ref.norm().item(), 1e-300))
        assert rel <= PREIMAGE_TOL[dtype], (f"b,S,D={shape} steps={steps} {dtype.__name__}: relative error "
                                            f"{rel:.3e} > {PREIMAGE_TOL[dtype]:.0e} (seed {seed})")


# The kernel against the float64 reference at the H100's shared memory: the pre-image oracle
# table (tests/geomkern/test_preimage.py, entry cuda-emulated); here the launch shapes.


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_preimage_several_column_chunks(emu_lib, seed, dtype):
    """S and D above one chunk of columns (4096 / P = 128 for P = 32) and neither a multiple of
    it nor of the tile depth: several chunks per phase, partial last chunk and partial last tile."""
    _check_preimage(emu_lib, (9, 150, 140), dtype, seed, steps_list=(1, 4), points_expected=32)


@pytest.mark.parametrize("points", [16, 8])
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_preimage_smaller_tiles(emu_lib, seed, points, dtype):
    """Less shared memory: 16 and 8 points per block (the P = 16 / 8 kernels)."""
    shape = (20, 40, 50)
    smem = preimage_smem_bytes(points, 40, 50, np.dtype(dtype).itemsize)
    _check_preimage(emu_lib, shape, dtype, seed, steps_list=(3,), device_smem=smem, points_expected=points)


def test_preimage_too_large_for_shared_memory(emu_lib, seed):
    Z0, B, T, gamma = (x.numpy() if hasattr(x, "numpy") else x for x in preimage_problem(2, 40, 50, seed))
    lr = np.full(2, 0.1)
    smem = preimage_smem_bytes(8, 40, 50, 8) - 8
    rc, _, out, points = preimage(emu_lib, Z0, B, T, lr, gamma, 3, seed=seed, device_smem=smem)
    assert points == 0 and rc == CUDA_ERROR_INVALID_VALUE
