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

import ctypes
import math
import multiprocessing
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from _preimage_problem import preimage_problem
from _eigh_oracle import check_eigh

from geomkern.ops.preimage import default_gd_lr, gd_reference

ROOT = Path(__file__).resolve().parents[2]
CUDA_DIR = ROOT / "csrc" / "cuda"
HOST_DIR = ROOT / "tests" / "cuda_host"
CXX = shutil.which("g++")


def _cuda_include():
    nvcc = shutil.which("nvcc")
    homes = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"),
             Path(nvcc).resolve().parents[1] if nvcc else None, "/usr/local/cuda"]
    for h in homes:
        if h and (Path(h) / "include" / "cuda_runtime_api.h").exists():
            return Path(h) / "include"
    return None


CUDA_INCLUDE = _cuda_include()
pytestmark = pytest.mark.skipif(
    CXX is None or CUDA_INCLUDE is None,
    reason="needs g++ and the CUDA toolkit's headers (cuda_runtime_api.h) for the host emulation")

# Error bounds for the Jacobi solver. It computes in double for float32 input as well, so float32
# results are limited by their final rounding: measured (emulation, random symmetric, n <= 257)
# <= 1e-7 on every measure for float32 and <= 5e-14 for float64.
EIGH_TOL = {np.float32: 1e-6, np.float64: 1e-12}
# Pre-image: as tests/test_native_preimage.py (the float64 reference on the float32-rounded
# inputs); measured here <= 2e-7 (float32) and <= 5e-16 (float64).
PREIMAGE_TOL = {np.float32: 1e-5, np.float64: 1e-10}
H100_SMEM = 227 * 1024  # cudaDevAttrMaxSharedMemoryPerBlockOptin on H100 / H200
CUDA_ERROR_INVALID_VALUE = 1


@pytest.fixture(scope="module")
def emu_lib(tmp_path_factory) -> str:
    lib = tmp_path_factory.mktemp("cuda_emu") / "libgkemu.so"
    cmd = [CXX, "-std=c++17", "-O2", "-fPIC", "-shared", "-Wall", "-Wno-unknown-pragmas",
           "-I", str(CUDA_DIR), "-I", str(CUDA_INCLUDE), "-include", str(HOST_DIR / "cuda_emu.h"),
           "-x", "c++", *map(str, sorted(CUDA_DIR.glob("*.cu"))), "-x", "none",
           str(HOST_DIR / "emu_harness.cpp"),
           # -Bsymbolic: the harness binds to the emulator's cuda* functions even when a CUDA build of
           # torch has loaded the real libcudart into this process first (cudaError 35 otherwise)
           "-Wl,-Bsymbolic", "-o", str(lib)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"emulation build failed:\n{proc.stderr}"
    return str(lib)


# ---------------------------------------------------------------------------- running in a child

def _child(conn, fn, args):
    try:
        conn.send((True, fn(*args)))
    except BaseException as exc:  # noqa: BLE001 - reported in the parent
        conn.send((False, repr(exc)))
    finally:
        conn.close()


def _isolated(fn, *args):
    ctx = multiprocessing.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(send, fn, args))
    proc.start()
    send.close()
    try:
        ok, value = recv.recv()
    except EOFError:
        proc.join()
        raise AssertionError(f"the emulated kernel crashed the child process (exit code {proc.exitcode}): "
                             "an out-of-bounds access or a wild index") from None
    proc.join()
    assert ok, value
    return value


def _ptr(a: np.ndarray):
    return ctypes.c_void_p(a.ctypes.data)


def _jacobi_child(lib_path, A, tol, max_sweeps, device_smem, seed):
    lib = ctypes.CDLL(lib_path)
    lib.emu_last_error.restype = ctypes.c_char_p
    lib.emu_configure(ctypes.c_int64(device_smem), ctypes.c_uint64(seed))
    batch, n, _ = A.shape
    scalar = ctypes.c_float if A.dtype == np.float32 else ctypes.c_double
    fn = getattr(lib, "emu_eigh_" + ("f32" if A.dtype == np.float32 else "f64"))
    w = np.empty((batch, n), A.dtype)
    V = np.empty((batch, n, n), A.dtype)
    info = np.empty(batch, np.int32)
    ws = ctypes.c_int64(-1)
    rc = fn(_ptr(A), _ptr(w), _ptr(V), _ptr(info), ctypes.c_int64(batch), ctypes.c_int(n), scalar(tol),
            ctypes.c_int(max_sweeps), ctypes.byref(ws))
    return rc, lib.emu_last_error().decode(), w, V, info, ws.value


def jacobi(lib, A, *, seed, tol=None, max_sweeps=50, device_smem=H100_SMEM):
    A = np.ascontiguousarray(A)
    tol = float(np.finfo(A.dtype).eps) / math.sqrt(A.shape[-1]) if tol is None else tol  # native.eigh_tol
    rc, err, w, V, info, ws = _isolated(_jacobi_child, lib, A, tol, max_sweeps, device_smem, seed)
    return rc, err, w, V, info, ws


def _preimage_child(lib_path, Z0, B, T, lr, gamma, steps, device_smem, seed):
    lib = ctypes.CDLL(lib_path)
    lib.emu_last_error.restype = ctypes.c_char_p
    lib.emu_configure(ctypes.c_int64(device_smem), ctypes.c_uint64(seed))
    scalar = ctypes.c_float if Z0.dtype == np.float32 else ctypes.c_double
    fn = getattr(lib, "emu_preimage_gd_" + ("f32" if Z0.dtype == np.float32 else "f64"))
    out = np.full(Z0.shape, np.nan, Z0.dtype)
    points = ctypes.c_int(-1)
    rc = fn(_ptr(Z0), _ptr(B), _ptr(T), _ptr(lr), _ptr(out), ctypes.c_int64(Z0.shape[0]),
            ctypes.c_int64(B.shape[0]), ctypes.c_int64(B.shape[1]), scalar(gamma), ctypes.c_int64(steps),
            ctypes.byref(points))
    return rc, lib.emu_last_error().decode(), out, points.value


def preimage(lib, Z0, B, T, lr, gamma, steps, *, seed, device_smem=H100_SMEM):
    arrays = [np.ascontiguousarray(x) for x in (Z0, B, T, lr)]
    return _isolated(_preimage_child, lib, *arrays, gamma, steps, device_smem, seed)


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
@pytest.mark.parametrize("n,batch", [(1, 3), (2, 3), (7, 3), (33, 2), (64, 1), (80, 1)])
def test_jacobi_matches_float64_oracle(emu_lib, rng, seed, n, batch, dtype):
    A = _random_symmetric(rng, batch, n, dtype)
    matrix, scratch = _jacobi_smem(n)
    # exactly enough shared memory (H100's 227 KiB would do as well): the on-chip path
    rc, err, w, V, info, ws = jacobi(emu_lib, A, seed=seed, device_smem=matrix + scratch)
    _assert_ok(rc, err, info, max_sweeps=15)
    assert ws == 0
    check_eigh(A, w, V, EIGH_TOL[dtype], name=f"emulated jacobi n={n}")


def _jacobi_smem(n):
    """(matrix bytes, scratch bytes) of eigh.cu's Layout: double A and V^T, then c, s, t
    per pair and the reduction buffer (double, min(threads, 128) slots), p, q per pair and the
    permutation (int)."""
    h = (n + (n & 1)) // 2
    nt = 64 if n <= 16 else 128 if n <= 32 else 256 if n <= 48 else 512 if n <= 64 else 1024
    return 16 * n * n, (3 * h + min(nt, 128)) * 8 + (2 * h + n) * 4


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("n", [9, 33])
def test_jacobi_global_memory_path(emu_lib, rng, seed, n, dtype):
    """A device with 8 bytes too little shared memory for A and V: they live in the workspace."""
    A = _random_symmetric(rng, 2, n, dtype)
    matrix, scratch = _jacobi_smem(n)
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



def _smem_bytes(P, S, D, itemsize):
    """preimage.cu smem_elems: Z (P x Dp) and W (P x Sp) with rows padded to KT = P, the B tile
    (4096 / P rows of KT + one 16-byte vector), |b|^2, 3 per-point values, 256 of scratch."""
    up = lambda x: -(-x // P) * P  # noqa: E731
    vw = 16 // itemsize
    return (P * (up(D) + up(S)) + (4096 // P) * (P + vw) + S + 3 * P + 256) * itemsize


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


# Every b in {1, 7, 33}, S in {1, 7, 33} and D in {1, 7, 33, 70} appears; 33 and 70 are not
# multiples of the 32-wide tiles and 33 points leave a partly empty block.
PREIMAGE_SHAPES = [(1, 1, 1), (7, 7, 33), (7, 33, 1), (33, 1, 7), (33, 33, 7), (33, 7, 70)]


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("shape", PREIMAGE_SHAPES, ids=lambda s: "b%d-S%d-D%d" % s)
def test_preimage_matches_float64_reference(emu_lib, seed, shape, dtype):
    _check_preimage(emu_lib, shape, dtype, seed, points_expected=32)


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
    smem = _smem_bytes(points, 40, 50, np.dtype(dtype).itemsize)
    _check_preimage(emu_lib, shape, dtype, seed, steps_list=(3,), device_smem=smem, points_expected=points)


def test_preimage_too_large_for_shared_memory(emu_lib, seed):
    Z0, B, T, gamma = (x.numpy() if hasattr(x, "numpy") else x for x in preimage_problem(2, 40, 50, seed))
    lr = np.full(2, 0.1)
    smem = _smem_bytes(8, 40, 50, 8) - 8
    rc, _, out, points = preimage(emu_lib, Z0, B, T, lr, gamma, 3, seed=seed, device_smem=smem)
    assert points == 0 and rc == CUDA_ERROR_INVALID_VALUE
