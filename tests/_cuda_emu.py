"""The host emulation of csrc/cuda's kernels (tests/cuda_host/cuda_emu.h), shared by
tests/geomkern/test_cuda_emulated.py (launch shapes, Jacobi eigh) and the pre-image oracle table
of tests/geomkern/test_preimage.py: the build of the emulated library and the ctypes wrappers,
each launch in a forked child so an out-of-bounds access fails one test, not the session."""
from __future__ import annotations

import ctypes
import math
import multiprocessing
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
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
UNAVAILABLE = (None if CXX is not None and CUDA_INCLUDE is not None else
               "needs g++ and the CUDA toolkit's headers (cuda_runtime_api.h) for the host emulation")

H100_SMEM = 227 * 1024  # cudaDevAttrMaxSharedMemoryPerBlockOptin on H100 / H200
CUDA_ERROR_INVALID_VALUE = 1


def build(folder: Path) -> str:
    """Compiles every csrc/cuda/*.cu with the emulation header into folder/libgkemu.so."""
    lib = folder / "libgkemu.so"
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


def preimage_smem_bytes(P, S, D, itemsize):
    """preimage.cu smem_elems: Z (P x Dp) and W (P x Sp) with rows padded to KT = P, the B tile
    (4096 / P rows of KT + one 16-byte vector), |b|^2, 3 per-point values, 256 of scratch."""
    up = lambda x: -(-x // P) * P  # noqa: E731
    vw = 16 // itemsize
    return (P * (up(D) + up(S)) + (4096 // P) * (P + vw) + S + 3 * P + 256) * itemsize


def preimage_points(S, D, itemsize, device_smem=H100_SMEM):
    """Points per block the launcher picks (preimage.cu pick_points): the most of 32, 16, 8 whose
    shared memory fits, 0 if none does."""
    return next((P for P in (32, 16, 8) if preimage_smem_bytes(P, S, D, itemsize) <= device_smem), 0)


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


def jacobi_smem(n):
    """(matrix bytes, scratch bytes) of eigh.cu's Layout: double A and V^T, then c, s, t
    per pair and the reduction buffer (double, min(threads, 128) slots), p, q per pair and the
    permutation (int)."""
    h = (n + (n & 1)) // 2
    nt = 64 if n <= 16 else 128 if n <= 32 else 256 if n <= 48 else 512 if n <= 64 else 1024
    return 16 * n * n, (3 * h + min(nt, 128)) * 8 + (2 * h + n) * 4


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
