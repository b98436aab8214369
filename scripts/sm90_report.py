"""sm_90 compile report: every geomkern GPU kernel compiled for an H100, with a modelled time.

    python scripts/sm90_report.py --out FILE.json [--cases "gram;preimage"] [--no-cuda]
    python scripts/sm90_report.py --measure --out FILE.json      # on a GPU: model + measurement

No GPU is needed (or used) to compile. The Triton kernels are compiled by running geomkern's own
launchers (geomkern/backends/triton/*.py) under a compile-only Triton driver that reports
GPUTarget("cuda", 90, 32) and captures each compiled kernel instead of launching it, so the
block sizes, num_warps and num_stages are exactly those the launchers pick for each shape; the
inputs are uninitialised CPU tensors that no kernel ever reads. Each float32 case is compiled at
every precision the launchers support (geomkern/backends/triton/_common.py PRECISIONS). The CUDA
kernels (csrc/cuda/*.cu) are compiled as tests/geomkern/test_nvcc_compile.py does, plus ``-cubin
--resource-usage``, and the template instance the host code picks for each case is looked up.
Registers and spills come from ptxas's own report; tensor-core instructions, the hot loop's
instruction mix and the exp count come from the SASS (cuobjdump from Triton's NVIDIA backend).

Every ``predicted_us`` / ``roofline_us`` is a MODEL (scripts/gpu_model.py, whose docstring lists
every constant and assumption), never a measurement. ``--measure`` (GPU only) times the same cases
with triton.testing.do_bench (median) and writes ``measured_us`` beside them.

Output: a JSON list of records, one per (kernel, case, precision).
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import importlib.util
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
import zlib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str, path: Path):
    """Import a sibling script by path (scripts/ is not a package), once."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up while it executes
        spec.loader.exec_module(module)
    return sys.modules[name]


gm = _load("gpu_model", ROOT / "scripts" / "gpu_model.py")

TARGET = ("cuda", 90, 32)
MODEL_LABEL = ("model (scripts/gpu_model.py: H100 SXM datasheet rates; tensor cores, L2 and HBM at "
               "the fractions measured on this workplace's H100 by bare GEMMs and a copy): compiled "
               "for sm_90, not run")
STEPS = 100


# ------------------------------------------------------------------------------ toolchain

def nvidia_bin() -> Path | None:
    """triton/backends/nvidia/bin (ptxas, cuobjdump, nvdisasm), or None without triton."""
    spec = importlib.util.find_spec("triton")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "backends" / "nvidia" / "bin"
    return path if (path / "cuobjdump").exists() else None


def why_not() -> str:
    """'' when the report can run here, else why not."""
    b = nvidia_bin()
    if b is None:
        return "triton (with its NVIDIA backend's bin/ptxas and cuobjdump) is not installed"
    if not any((b / p).exists() for p in ("ptxas", "ptxas-blackwell")):
        return f"no ptxas under {b}"
    return ""


def sass(cubin: bytes | Path) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        if isinstance(cubin, bytes):
            path = Path(tmp) / "k.cubin"
            path.write_bytes(cubin)
        else:
            path = cubin
        return subprocess.run([str(nvidia_bin() / "cuobjdump"), "-sass", str(path)],
                              capture_output=True, text=True, check=True).stdout


_PTXAS_FN = re.compile(r"Compiling entry function '([^']+)'")
_PTXAS_PROPS = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_PTXAS_USED = re.compile(r"Used (\d+) registers(?:.*?(\d+) bytes smem)?")


def parse_ptxas(log: str) -> dict[str, dict]:
    """ptxas -v output -> {function: {regs, stack_bytes, spill_stores, spill_loads, static_smem}}."""
    out: dict[str, dict] = {}
    cur = None
    for line in log.splitlines():
        m = _PTXAS_FN.search(line)
        if m:
            cur = out.setdefault(m.group(1), {"regs": 0, "stack_bytes": 0, "spill_stores": 0,
                                              "spill_loads": 0, "static_smem": 0})
            continue
        if cur is None:
            continue
        m = _PTXAS_PROPS.search(line)
        if m:
            cur["stack_bytes"], cur["spill_stores"], cur["spill_loads"] = map(int, m.groups())
        m = _PTXAS_USED.search(line)
        if m:
            cur["regs"] = int(m.group(1))
            cur["static_smem"] = int(m.group(2) or 0)
    return out


# ------------------------------------------------------------------- compile-only driver

@dataclass
class Launch:
    """One captured launch: the compiled kernel and the arguments the launcher passed."""
    kernel: object          # triton CompiledKernel
    grid: tuple
    args: dict


class _Utils:
    def get_device_properties(self, device):
        # H100: opt-in shared memory per block, as cudaDevAttrMaxSharedMemoryPerBlockOptin reports it
        return {"max_shared_mem": gm.SMEM_PER_BLOCK_MAX, "multiprocessor_count": gm.SMS,
                "max_num_regs": gm.REGS_PER_SM, "warpSize": 32}

    def load_binary(self, name, kernel, shared, device):
        return None, name, 0, 0, 1024

    def unload_module(self, module):
        pass


class CompileOnlyDriver:
    """A Triton driver for a GPU that is not there: it reports sm_90 as the current target and its
    launcher records (kernel, grid, arguments) instead of launching. Kernels are compiled exactly
    as for a real H100 (same backend, same options, same ptxas)."""

    def __init__(self):
        from triton.backends.compiler import GPUTarget
        self.target = GPUTarget(*TARGET)
        self.utils = _Utils()
        self.launches: list[Launch] = []
        drv = self

        class Launcher:
            def __init__(self, src, metadata):
                self.src, self.metadata = src, metadata

            def __call__(self, g0, g1, g2, stream, function, packed, launch_md, enter, exit_, *args):
                fn = self.src.fn
                kernel = next(k for k in fn.device_caches[0][0].values()
                              if k.metadata.hash == self.metadata.hash)
                drv.launches.append(Launch(kernel, (g0, g1, g2), dict(zip(fn.arg_names, args))))

        self.launcher_cls = Launcher

    def get_current_device(self):
        return 0

    def set_current_device(self, device):
        pass

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        return self.target

    def get_active_torch_device(self):
        import torch
        return torch.device("cpu")


def _ptxas_log_hook(*args):
    """knobs.runtime.add_stages_inspection_hook: keep ptxas's -v report in the kernel's metadata
    (``ptxas_log``), so it survives Triton's on-disk cache."""
    from triton import knobs
    if not args:
        return "-geomkern-sm90-report-ptxas-log-v1", "1"
    stages = args[1]
    make_cubin = stages["cubin"]

    def cubin(src, metadata):
        old = knobs.nvidia.dump_ptxas_log
        knobs.nvidia.dump_ptxas_log = True
        buf = io.StringIO()
        try:
            with contextlib.redirect_stdout(buf):
                out = make_cubin(src, metadata)
        finally:
            knobs.nvidia.dump_ptxas_log = old
        metadata["ptxas_log"] = buf.getvalue()
        return out

    stages["cubin"] = cubin


@contextlib.contextmanager
def compile_only():
    from triton import knobs
    from triton.runtime import driver
    drv = CompileOnlyDriver()
    old_hook = knobs.runtime.add_stages_inspection_hook
    old_driver = driver._active  # None unless a driver was already chosen (no GPU: none exists)
    driver.set_active(drv)
    knobs.runtime.add_stages_inspection_hook = _ptxas_log_hook
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="TRITON_DEFAULT_FP_FUSION")
            yield drv
    finally:
        knobs.runtime.add_stages_inspection_hook = old_hook
        driver.set_active(old_driver)


# ----------------------------------------------------------------------------------- cases

class _Fallback(Exception):
    pass


def _cluster_offsets(sizes, device):
    import torch
    off = [0]
    for s in sizes:
        off.append(off[-1] + s)
    return torch.tensor(off, dtype=torch.int64, device=device)


SEG_SIZES = [round(100 + (2000 - 100) * i / 29) for i in range(30)]   # 30 clusters, 100..2,000
PROJ_SIZES = [1000] * 20                                            # 20,000 points, 20 clusters


def _alloc(real: bool, device: str):
    """Tensor factory: uninitialised CPU memory for compiling (never touched: no RSS), or real
    random data for measuring (unit-norm rows, like CLIP embeddings; never zeros)."""
    import torch

    def make(shape, dtype, kind="rows"):
        if not real:
            return torch.empty(shape, dtype=dtype, device=device)
        # drawn in float64 from a seed of (shape, kind) alone: a case's float32 and float64
        # inputs are the same numbers (the accuracy check compares the two)
        g = torch.Generator(device=device).manual_seed(zlib.crc32(repr((shape, kind)).encode()))
        t = torch.randn(shape, dtype=torch.float64, device=device, generator=g)
        if kind == "rows":
            t = t / t.norm(dim=-1, keepdim=True)
        elif kind == "positive":
            t = t.abs() / shape[-1]
        elif kind == "small":
            t = 0.1 * t
        return t.to(dtype)
    return make


@dataclass
class Case:
    name: str            # case label
    op: str              # public op (gk.*)
    dtype: str
    build: object        # (make, device, dtype) -> (precision -> None): runs the launcher once
    precisions: tuple = ()   # () = every precision the launchers support (_common.PRECISIONS)


def _triton_cases() -> list[Case]:
    import torch

    from geomkern.backends.triton import _common as C
    F = {"float32": torch.float32, "float64": torch.float64}
    gamma = 1.0  # unit-norm rows: squared distances in [0, 4]

    def gram(n, D, cross=False):
        def build(make, dev, dt):
            from geomkern.backends.triton import rbf
            X = make((n, D), dt)
            Y = make((n, D), dt) if cross else None
            return lambda p: rbf.rbf_gram(X, Y, gamma, False, p)
        return build

    def segmented(sizes, D):
        def build(make, dev, dt):
            from geomkern.backends.triton import kpca
            X = make((sum(sizes), D), dt)
            off = _cluster_offsets(sizes, dev)
            return lambda p: kpca.segmented_gram(X, off, gamma, True, p)
        return build

    def projection(sizes, S, d, D):
        def build(make, dev, dt):
            from geomkern.backends.triton import kpca
            X, B = make((sum(sizes), D), dt), make((S, D), dt)
            alphas = make((sum(sizes), d), dt, "small")
            off = _cluster_offsets(sizes, dev)
            return lambda p: kpca.project_onto_basis(X, alphas, off, B, gamma, p)
        return build

    def preimage(b, S, D, method):
        def build(make, dev, dt):
            from geomkern.backends.triton import preimage as tp
            Z0, B = make((b, D), dt), make((S, D), dt)
            T = make((b, S), dt, "positive")
            if method == "gd":
                lr = torch.full((b,), 0.5, dtype=dt, device=dev)
                return lambda p: tp.preimage_gd(Z0, B, T, gamma, STEPS, lr, p)
            return lambda p: tp.preimage_fixed_point(Z0, B, T, gamma, STEPS, p)
        return build

    def matmul(n, D, p_cols):
        def build(make, dev, dt):
            from geomkern.backends.triton import rbf
            X = make((n, D), dt)
            V = make((n, p_cols), dt, "small")
            return lambda p: rbf.rbf_matmul(X, X, V, gamma, p)
        return build

    def assign(m, n, k, D):
        def build(make, dev, dt):
            from geomkern.backends.triton import kmeans
            X, C = make((m, n, D), dt), make((m, k, D), dt)
            return lambda p: kmeans.assign(X, C, p)
        return build

    cases = [
        Case("gram 4096^2 x D512", "rbf_gram", "float32", gram(4096, 512)),
        Case("gram 4096^2 x D512", "rbf_gram", "float64", gram(4096, 512), ("ieee",)),
        Case("gram cross 4096 x 4096 x D512", "rbf_gram", "float32", gram(4096, 512, True)),
        Case("segmented gram 30 clusters 100-2000 x D512, centred", "kpca", "float32",
             segmented(SEG_SIZES, 512)),
        Case("projection 20x1000 pts, S512 d8 D512", "project_onto_basis", "float32",
             projection(PROJ_SIZES, 512, 8, 512)),
        Case("preimage gd 50000 x S512 x D512, 100 steps", "preimage", "float32",
             preimage(50000, 512, 512, "gd")),
        Case("preimage gd 50000 x S512 x D512, 100 steps", "preimage", "float64",
             preimage(50000, 512, 512, "gd"), ("ieee",)),
        Case("preimage fixed_point 50000 x S512 x D512, 100 steps", "preimage", "float32",
             preimage(50000, 512, 512, "fixed_point")),
        Case("preimage gd 50000 x S512 x D1024, 100 steps", "preimage", "float32",
             preimage(50000, 512, 1024, "gd")),
        Case("preimage fixed_point 50000 x S512 x D1024, 100 steps", "preimage", "float32",
             preimage(50000, 512, 1024, "fixed_point")),
        Case("rbf_matmul 20000 x 20000 x D64, p16", "rbf_matmul", "float32", matmul(20000, 64, 16)),
        Case("rbf_matmul 20000 x 20000 x D512, p16", "rbf_matmul", "float32", matmul(20000, 512, 16)),
        Case("kmeans assign 10 x 5000 x D512, k10", "kmeans", "float32", assign(10, 5000, 10, 512)),
        Case("kmeans assign 10 x 5000 x D512, k64", "kmeans", "float32", assign(10, 5000, 64, 512)),
    ]
    supported = tuple(C.PRECISIONS)
    default = default_precision()
    for c in cases:
        c.torch_dtype = F[c.dtype]
        # the default first; float64 dots have one precision (dot_precision maps all to ieee)
        c.precisions = c.precisions or (default,) + tuple(p for p in supported if p != default)
    return cases


def default_precision() -> str:
    """The precision a launcher uses when its caller passes none (what gk.* ops get)."""
    import inspect

    from geomkern.backends.triton import rbf
    return inspect.signature(rbf.rbf_gram).parameters["precision"].default


# ------------------------------------------------------------------- work of each kernel

def _cdiv(a, b):
    return -(-int(a) // int(b))


def _clamp(x, lo, hi):
    return max(lo, min(hi, x))


def _esize(t) -> int:
    return t.element_size()


def _ints(t) -> list[int]:
    return [int(v) for v in t.tolist()]


def _work_cross_gram(a, grid):
    X, K = a["X"], a["K"]
    nx, ny, D = a["n_x"], a["n_y"], a["D"]
    BM, BN, BK = a["BLOCK_M"], a["BLOCK_N"], a["BLOCK_K"]
    e, eo = _esize(X), _esize(K)
    macs, l2, ex = [], [], []
    for j in range(grid[1]):
        for i in range(grid[0]):
            rx, ry = _clamp(nx - i * BM, 0, BM), _clamp(ny - j * BN, 0, BN)
            macs.append(BM * BN * _cdiv(D, BK) * BK)
            l2.append((rx + ry) * D * e + rx * ry * eo)
            ex.append(BM * BN)
    hbm = (nx + ny) * D * e + nx * ny * eo
    op = {"flops": 2.0 * nx * ny * D, "bytes": hbm, "exps": float(nx * ny)}
    return gm.Work(macs, l2, ex, hbm, BM * BN), op


def _work_sym_gram(a, grid):
    X, K = a["X"], a["K"]
    sizes = _ints(a["Sizes"])
    nmax, D, B, BK = a["nmax"], a["D"], a["BLOCK"], a["BLOCK_K"]
    e, eo = _esize(X), _esize(K)
    acc = 8 if e == 8 else 4
    m, nt = grid[0], grid[1]
    macs, l2, ex = [], [], []
    for j in range(nt):              # grid z = pid_n
        for i in range(nt):          # grid y = pid_m
            for c in range(m):       # grid x = segment
                if i > j:
                    macs.append(0), l2.append(0), ex.append(0)
                    continue
                size = sizes[c]
                tiles = (1 if i == j else 2)
                out = tiles * _clamp(nmax - i * B, 0, B) * _clamp(nmax - j * B, 0, B) * eo
                if a["ROW_SUMS"]:
                    out += tiles * B * acc
                if j * B < size:
                    ri, rj = _clamp(size - i * B, 0, B), _clamp(size - j * B, 0, B)
                    shift = _cdiv(D, BK) * BK * acc * (1 if a["SHIFT"] else 0)
                    macs.append(B * B * _cdiv(D, BK) * BK)
                    l2.append((ri + rj) * D * e + shift + out)
                    ex.append(B * B)
                else:                # padding tiles: zeros stored, nothing loaded
                    macs.append(0), l2.append(out), ex.append(0)
    hbm = sum(sizes) * D * e + m * nmax * nmax * eo
    if a["ROW_SUMS"]:
        hbm += m * nt * nmax * acc
    # the op: each segment's Gram, upper triangle only (symmetry), into the padded output
    flops = sum(2.0 * s * (s + 1) / 2 * D for s in sizes)
    exps = sum(s * (s - 1) / 2 for s in sizes)
    return gm.Work(macs, l2, ex, hbm, B * B), {"flops": flops, "bytes": hbm, "exps": float(exps)}


def _work_center(a, grid):
    K, Out = a["K"], a["Out"]
    sizes = _ints(a["Sizes"])
    nmax, B = a["nmax"], a["BLOCK"]
    e, eo = _esize(K), _esize(Out)
    m, nt = grid[0], grid[1]
    l2 = []
    for j in range(nt):
        for i in range(nt):
            for c in range(m):
                ri, rj = _clamp(sizes[c] - i * B, 0, B), _clamp(sizes[c] - j * B, 0, B)
                l2.append(ri * rj * e + _clamp(nmax - i * B, 0, B) * _clamp(nmax - j * B, 0, B) * eo)
    hbm = sum(s * s for s in sizes) * e + m * nmax * nmax * eo
    zeros = [0] * len(l2)
    return gm.Work(zeros, l2, zeros, hbm), {"flops": 0.0, "bytes": hbm, "exps": 0.0}


def _work_segment_sum(a, grid):
    """grid (segments, column tiles, row chunks): program (j, t, c) reads chunk c's rows of
    segment j (CHUNK rows, fewer at its end, none past it) in column tile t and writes one
    partial sum row; the chunks' partials are summed afterwards (priced as their HBM bytes)."""
    X, Out = a["X"], a["Out"]
    starts, ends = _ints(a["Starts"]), _ints(a["Ends"])
    D, BD, chunk = a["D"], a["BLOCK_D"], a["CHUNK"]
    e = _esize(X)
    l2 = []
    for c in range(grid[2]):  # program id 0 varies fastest
        for t in range(grid[1]):
            for j in range(grid[0]):
                rows = _clamp(ends[j] - starts[j] - c * chunk, 0, chunk)
                l2.append(rows * _clamp(D - t * BD, 0, BD) * e)
    hbm = sum(b - a_ for a_, b in zip(starts, ends)) * D * e + 2 * grid[0] * grid[2] * D * _esize(Out)
    zeros = [0] * len(l2)
    return gm.Work(zeros, l2, zeros, hbm), {"flops": 0.0, "bytes": hbm, "exps": 0.0}


def _work_rbf_matmul(a, grid):
    """grid (row tiles, p tiles, Y splits): program (i, q, s) streams the Y rows of chunk s
    (y_chunk rows) and writes a partial (BLOCK_M, BLOCK_P) tile; the splits' partials are summed
    afterwards (a torch sum, priced here as its HBM bytes)."""
    X, V, Out = a["X"], a["V"], a["Out"]
    nx, ny, D, p = a["n_x"], a["n_y"], a["D"], a["p"]
    chunk = a.get("y_chunk", ny)
    BM, BN, BD, BP = a["BLOCK_M"], a["BLOCK_N"], a["BLOCK_D"], a["BLOCK_P"]
    e = _esize(X)
    kdim = BD if a["X_RESIDENT"] else _cdiv(D, BD) * BD
    macs, l2, ex = [], [], []
    for s in range(grid[2]):
        rows = _clamp(ny - s * chunk, 0, chunk)
        it = _cdiv(rows, BN)
        for q in range(grid[1]):
            for i in range(grid[0]):
                rx = _clamp(nx - i * BM, 0, BM)
                pc = _clamp(p - q * BP, 0, BP)
                x_bytes = rx * D * e * (1 if a["X_RESIDENT"] else it)
                macs.append(it * BM * BN * (kdim + BP))
                l2.append(x_bytes + rows * D * e + rows * pc * e + rx * pc * _esize(Out))
                ex.append(it * BM * BN)
    splits = grid[2]
    partial = (2 * splits * nx * p * _esize(Out)) if splits > 1 else 0  # write + sum's read
    hbm = (nx + ny) * D * e + ny * p * e + nx * p * _esize(Out) + partial
    op = {"flops": 2.0 * nx * ny * (D + p), "bytes": (nx + ny) * D * e + ny * p * e + nx * p * e,
          "exps": float(nx * ny)}
    return gm.Work(macs, l2, ex, hbm, BM * BN), op


def _work_projection(a, grid):
    """grid (segments x SPLITS, S tiles, component tiles): program (j, split) takes segment j's
    BLOCK_A-row tiles split, split + SPLITS, ...; each row tile re-reads its X rows and the
    (BLOCK_S, D) B tile through L2; the splits' partial outputs are summed afterwards (HBM)."""
    X, B, Al, Out = a["X"], a["B"], a["Alphas"], a["Out"]
    off = _ints(a["Offsets"])
    D, S, d = a["D"], a["S"], a["d"]
    P = a.get("SPLITS", 1)
    BA, BS, BK, BC = a["BLOCK_A"], a["BLOCK_S"], a["BLOCK_K"], a["BLOCK_C"]
    e = _esize(X)
    macs, l2, ex = [], [], []
    for cb in range(grid[2]):
        for sb in range(grid[1]):
            for g in range(grid[0]):
                j, split = divmod(g, P)
                n = off[j + 1] - off[j]
                it = len(range(split * BA, n, P * BA))
                rows = sum(_clamp(n - t * BA, 0, BA) for t in range(split, _cdiv(n, BA), P))
                sc = _clamp(S - sb * BS, 0, BS)
                dc = _clamp(d - cb * BC, 0, BC)
                macs.append(it * (BA * BS * _cdiv(D, BK) * BK + BC * BA * BS))
                # X rows and the B tile are both read for every BLOCK_A rows
                l2.append(rows * D * e + it * sc * D * e + rows * dc * _esize(Al)
                          + dc * sc * _esize(Out))
                ex.append(it * BA * BS)
    N, m = off[-1], len(off) - 1
    hbm_min = N * D * e + S * D * e + N * d * _esize(Al) + m * d * S * e
    hbm = hbm_min + (2 * P * m * d * S * _esize(Out) if P > 1 else 0)
    op = {"flops": 2.0 * N * S * D + 2.0 * N * d * S, "bytes": hbm_min, "exps": float(N * S)}
    return gm.Work(macs, l2, ex, hbm, BA * BS), op


def _work_preimage(a, grid):
    """Per step, two tiled products (geomkern/backends/triton/preimage.py): k(z, B) as
    (BLOCK_M, BLOCK_N) tiles of S reduced over D, re-reading the program's z rows (from Out) once
    per S tile and all of B once; then w B as (BLOCK_M, BLOCK_N) tiles of D reduced over S,
    re-reading the program's w rows (scratch W) once per D tile and all of B once. z and W are
    the program's own rows: L2 traffic, not HBM (assumption: the live rows of the resident
    programs fit in L2; ``l2_live_bytes`` in the record says how much that is)."""
    # 2-D operands are tensor descriptors (TMA): their tensors are .base
    Z0, B, T, W = a["Z0"].base, a["Bk"].base, a["T"].base, a["Wn"].base
    b, S, D, steps = a["b"], a["S"], a["D"], a["steps"]
    BM, BN, BK = a["BLOCK_M"], a["BLOCK_N"], a["BLOCK_K"]
    e, ew, et = _esize(Z0), _esize(W), _esize(T)
    ts, td = _cdiv(S, BN), _cdiv(D, BN)
    macs_step = BM * BN * (ts * _cdiv(D, BK) * BK + td * _cdiv(S, BK) * BK)
    macs, l2, ex = [], [], []
    for i in range(grid[0]):
        r = _clamp(b - i * BM, 0, BM)
        per_step = (ts * r * D * e + S * D * _esize(B) + S * ew          # product 1: z, B, |b|^2
                    + r * S * et + r * S * ew                             # targets in, w out
                    + td * r * S * ew + S * D * _esize(B) + 2 * r * D * e)  # product 2, z update
        macs.append(steps * macs_step)
        l2.append(steps * per_step + 2 * r * D * e + r * e)
        ex.append(steps * BM * BN * ts)
    hbm = 2 * b * D * e + b * S * et + S * D * _esize(B) + b * e
    op = {"flops": steps * 4.0 * b * S * D, "bytes": hbm, "exps": float(steps * b * S)}
    work = gm.Work(macs, l2, ex, hbm, BM * BN)
    work.note = f"l2_live_bytes per program: {BM * (D * e + S * ew + S * et)}"
    return work, op


def _work_assign(a, grid):
    X, Cen = a["X"], a["Cen"]
    n, k, D = a["n"], a["k"], a["D"]
    BM, BC, BK = a["BLOCK_M"], a["BLOCK_C"], a["BLOCK_K"]
    e = _esize(X)
    it = _cdiv(k, BC)
    macs, l2, ex = [], [], []
    for t in range(grid[1]):
        for g in range(grid[0]):
            r = _clamp(n - t * BM, 0, BM)
            macs.append(it * BM * BC * _cdiv(D, BK) * BK)
            l2.append(r * D * e + k * D * _esize(Cen) + r * 8)
            ex.append(0)
    m = grid[0]
    hbm = m * n * D * e + m * k * D * _esize(Cen) + m * n * 8
    return gm.Work(macs, l2, ex, hbm), {"flops": 2.0 * m * n * k * D, "bytes": hbm, "exps": 0.0}


WORK = {
    "_cross_gram_kernel": _work_cross_gram,
    "_sym_gram_kernel": _work_sym_gram,
    "_center_kernel": _work_center,
    "_segment_sum_kernel": _work_segment_sum,
    "_rbf_matmul_kernel": _work_rbf_matmul,
    "_projection_kernel": _work_projection,
    "_preimage_kernel": _work_preimage,
    "_assign_kernel": _work_assign,
}
_CONFIG_KEYS = re.compile(r"^(BLOCK\w*|X_RESIDENT|FIXED_POINT|SHIFT|ROW_SUMS|PRECISION)$")


# ------------------------------------------------------------------------------- records

def _record(kernel: str, backend: str, case: str, op: str, dtype: str, precision: str,
            ptx: dict, instrs: list, threads: int, smem: int, work: gm.Work, op_min: dict,
            has_dot: bool, launch: dict) -> dict:
    counts = gm.opcode_counts(instrs)
    pipe = gm.dot_pipe(counts, dtype)
    mix = gm.loop_mix(instrs, pipe)
    occ = gm.occupancy(ptx["regs"], smem, threads)
    red = gm.exp_redundancy(instrs, threads, work.exp_tile) if work and work.exp_tile else 0.0
    if work is not None:
        pred = gm.predict(work, pipe, mix.efficiency, red if red else 1.0, dtype,
                          gm.dot_passes(precision, pipe))
        worst = gm.predict(work, pipe, mix.worst_efficiency, red if red else 1.0, dtype,
                           gm.dot_passes(precision, pipe), serial_hbm=True)["predicted_us"]
        roof = gm.roofline(op_min["flops"], op_min["bytes"], op_min["exps"], dtype)
        model = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in pred.items()
                 if k != "predicted_us"} | {"roofline_bound": roof["roofline_bound"],
                                            "op_min_flops": op_min["flops"],
                                            "op_min_bytes": op_min["bytes"],
                                            "op_min_exps": op_min["exps"],
                                            "dot_passes": gm.dot_passes(precision, pipe)}
        if work.note:
            model["note"] = work.note
    else:  # a kernel this report has no work function for (yet): compiled, not modelled
        pred, worst = {"predicted_us": None}, None
        roof = {"roofline_us": None, "roofline_tf32_us": None}
        model = {"error": op_min.get("error", "no work function")}

    def r2(x):
        return None if x is None else round(x, 2)
    tc = {op_: n for op_, n in counts.items() if op_.split(".")[0] in gm.TENSOR_OPS}
    rec = {
        "kernel": kernel, "backend": backend, "case": case, "op": op, "dtype": dtype,
        "precision": precision, **launch, "threads": threads,
        "regs": ptx["regs"], "spill_bytes": ptx["spill_stores"] + ptx["spill_loads"],
        "spill_stores": ptx["spill_stores"], "spill_loads": ptx["spill_loads"],
        "stack_bytes": ptx["stack_bytes"], "smem_bytes": smem,
        "blocks_per_sm": occ["blocks_per_sm"], "warps_per_sm": occ["warps_per_sm"],
        "occupancy_limited_by": occ["limited_by"],
        "tensor_core_instructions": sum(tc.values()), "tensor_core_ops": tc,
        "has_dot": bool(has_dot), "dot_pipe": pipe if has_dot else None,
        "hot_loop": {"instructions": mix.instructions, "macs_per_warp": mix.macs,
                     "local_memory_ops": mix.local, "shared_wavefronts": mix.wavefronts,
                     "mufu": mix.mufu, "efficiency": round(mix.efficiency, 4),
                     "worst_efficiency": round(mix.worst_efficiency, 4), "bound": mix.bound,
                     "wgmma_waits": mix.waits, "wgmma_full_waits": mix.full_waits},
        "hot_loop_spill": mix.local > 0,
        "local_memory_ops": sum(1 for i in instrs if i.op.split(".")[0] in ("LDL", "STL")),
        "exp_redundancy": round(red, 3),
        "predicted_us": r2(pred["predicted_us"]), "predicted_worst_us": r2(worst),
        "roofline_us": r2(roof["roofline_us"]),
        "roofline_tf32_us": r2(roof["roofline_tf32_us"]),
        "ratio": (r2(pred["predicted_us"] / roof["roofline_us"])
                  if pred["predicted_us"] and roof["roofline_us"] else None),
        "ratio_worst": r2(worst / roof["roofline_us"]) if worst and roof["roofline_us"] else None,
        "model": model,
        "label": MODEL_LABEL,
    }
    return rec


def variants(prec: str, schemes) -> list[tuple[str, str | None]]:
    """(precision, tf32x3 scheme) pairs to compile or time for one case precision: "tf32x3" once
    per scheme (geomkern/backends/triton/_common.py TF32X3_SCHEMES), the others once."""
    return [(prec, s) for s in schemes] if prec == "tf32x3" else [(prec, None)]


@contextlib.contextmanager
def tf32x3_scheme(scheme: str | None):
    """Run the launchers under one tf32x3 scheme (they read _common.TF32X3 at each call)."""
    from geomkern.backends.triton import _common as C
    old = C.TF32X3
    C.TF32X3 = scheme or old
    try:
        yield
    finally:
        C.TF32X3 = old


def triton_records(cases: list[Case], log=print, schemes=None) -> list[dict]:
    from geomkern.backends.triton import _common as C
    from geomkern.backends.triton import preimage as tp
    schemes = schemes or (C.TF32X3,)

    records = []
    with compile_only() as drv:
        # The pre-image launchers fall back to the torch reference when a kernel does not fit:
        # never run that here (it would be minutes of CPU work on uninitialised data).
        saved = {n: getattr(tp, n) for n in ("gd_reference", "fixed_point_reference") if hasattr(tp, n)}

        def refuse(*a, **k):
            raise _Fallback()
        for n in saved:
            setattr(tp, n, refuse)
        try:
            for case in cases:
                fn = case.build(_alloc(False, "cpu"), "cpu", case.torch_dtype)
                for prec, scheme in (v for p in case.precisions for v in variants(p, schemes)):
                    t0 = time.time()
                    drv.launches.clear()
                    try:
                        with tf32x3_scheme(scheme):
                            fn(prec)
                    except _Fallback:
                        log(f"  {case.name} [{case.dtype} {prec}]: the launcher fell back to the "
                            "torch reference (kernel does not fit sm_90)")
                    for ln in drv.launches:
                        rec = _triton_record(ln, case, prec)
                        rec["tf32x3_scheme"] = scheme
                        rec["default_precision"] &= scheme in (None, C.TF32X3)
                        records.append(rec)
                    log(f"  {case.name} [{case.dtype} {prec}{' ' + scheme if scheme else ''}]: "
                        f"{len(drv.launches)} launch(es), {time.time() - t0:.1f} s")
        finally:
            for n, f in saved.items():
                setattr(tp, n, f)
    return records


def _triton_record(ln: Launch, case: Case, prec: str) -> dict:
    k = ln.kernel
    md = k.metadata
    name = md.name
    ptx = parse_ptxas(getattr(md, "ptxas_log", "")).get(name)
    if ptx is None:
        raise RuntimeError(f"no ptxas report for {name}")
    instrs = gm.sass_functions(sass(k.asm["cubin"])).get(name, [])
    threads = md.num_warps * 32
    smem = md.shared + ptx["static_smem"]
    try:
        work, op_min = WORK[name](ln.args, ln.grid)
    except Exception as exc:  # noqa: BLE001 - a renamed argument must not lose the compile data
        work, op_min = None, {"error": f"work model failed: {exc!r}"}
    config = {key: (str(v) if not isinstance(v, (int, float, bool)) else v)
              for key, v in ln.args.items() if _CONFIG_KEYS.match(key)}
    launch = {"grid": list(ln.grid), "num_warps": md.num_warps, "num_stages": md.num_stages,
              "constexprs": config}
    rec = _record(name, "triton", case.name, case.op, case.dtype, prec, ptx, instrs, threads,
                  smem, work, op_min, "tt.dot" in k.asm["ttir"], launch)
    rec["default_precision"] = prec == case.precisions[0]
    return rec


# --------------------------------------------------------------------------------- CUDA

def _nvcc_check():
    """tests/geomkern/test_nvcc_compile.py: the CUDA sources, nvcc and flags the CI compile check uses."""
    spec = importlib.util.spec_from_file_location("_nvcc_compile_check",
                                                  ROOT / "tests" / "geomkern" / "test_nvcc_compile.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _demangle(names: list[str]) -> dict[str, str]:
    filt = shutil.which("c++filt") or shutil.which("cu++filt")
    if filt is None:
        return {n: n for n in names}
    out = subprocess.run([filt], input="\n".join(names), capture_output=True, text=True).stdout
    return dict(zip(names, out.splitlines()))


def compile_cuda(workdir: Path) -> tuple[dict, str] | tuple[None, str]:
    """Start nvcc -cubin --resource-usage on every csrc/cuda/*.cu; returns a handle to finish()."""
    chk = _nvcc_check()
    if chk.NVCC is None:
        return None, "nvcc is not on PATH"
    procs = {}
    for src in chk.SOURCES:
        cubin = workdir / (src.stem + ".cubin")
        cmd = [chk.NVCC, *chk.FLAGS, "-cubin", "--resource-usage", "-I", str(chk.CUDA_DIR), str(src),
               "-o", str(cubin)]
        procs[src] = (cubin, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                              text=True))
    return procs, ""


def _source_constants(text: str) -> dict[str, int]:
    return {k: int(v) for k, v in re.findall(r"constexpr int (k\w+) = (\d+);", text)}


def _preimage_tile_points(src: str, S: int, D: int, esize: int) -> int:
    """P the host picks (csrc/cuda/preimage.cu pick_points / smem_elems), constants read from
    the source (_preimage_smem_elems) must fit."""
    for P in (32, 16, 8):
        if _preimage_smem_elems(src, P, S, D, esize) * esize <= gm.SMEM_PER_BLOCK_MAX:
            return P
    return 0


def _preimage_smem_elems(src: str, P: int, S: int, D: int, esize: int) -> int:
    """csrc/cuda/preimage.cu smem_elems: Z (P x Dp) and W (P x Sp), rows padded to the tile depth
    KT = P; the B tile, (threads x 4 x 4 / P) rows of KT + one 16-byte vector; |b|^2 (S); 3 P;
    the row-sum scratch (threads). Register-block sizes read from the source."""
    c = _source_constants(src)
    threads = c.get("kThreads", 256)
    nc = threads * c.get("kBlockRows", 4) * c.get("kBlockCols", 4) // P
    up = lambda x: _cdiv(x, P) * P  # noqa: E731
    return P * (up(D) + up(S)) + nc * (P + 16 // esize) + S + 3 * P + threads


def _jacobi_launch(src: str, n: int) -> tuple[int, int]:
    """(threads, dynamic shared bytes) the host picks for a Jacobi eigh of size n (threads_for and
    Layout in the source: thresholds read from it)."""
    steps = [(int(a), int(b)) for a, b in re.findall(r"if \(n <= (\d+)\) return (\d+);", src)]
    nt = next((t for lim, t in steps if n <= lim), _source_constants(src).get("kMaxThreads", 1024))
    m = n + (n & 1)
    h = m // 2
    matrix = 2 * n * n * 8
    scratch = (3 * h + min(nt, _source_constants(src).get("kRedSlots", nt))) * 8 + (2 * h + n) * 4
    return nt, scratch + (matrix if matrix + scratch <= gm.SMEM_PER_BLOCK_MAX else 0)


CUDA_PREIMAGE_CASES = [  # (case, dtype, b, S, D)
    ("preimage gd 50000 x S512 x D512, 100 steps", "float32", 50000, 512, 512),
    ("preimage gd 50000 x S512 x D1024, 100 steps", "float32", 50000, 512, 1024),
    ("preimage gd 50000 x S512 x D512, 100 steps", "float64", 50000, 512, 512),
]
JACOBI_BATCH = 300
JACOBI_SWEEPS = 8          # ASSUMPTION (model): sweeps to converge in double, n ~ 100
JACOBI_ROUND_CYCLES = 400  # ASSUMPTION (model): latency floor of one round (2 barriers, DP div/sqrt)
CUDA_JACOBI_CASES = [("eigh batch 300 x n100", "float32", 100),
                     ("eigh batch 300 x n118", "float32", 118),
                     ("eigh batch 300 x n128", "float32", 128),
                     ("eigh batch 300 x n100", "float64", 100)]


def cuda_records(procs: dict, log=print) -> list[dict]:
    records = []
    for src, (cubin, proc) in procs.items():
        out, _ = proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"nvcc failed on {src.name}:\n{out}")
        ptx = parse_ptxas(out)
        funcs = gm.sass_functions(sass(cubin))
        names = _demangle(sorted(set(ptx) | set(funcs)))
        text = src.read_text()
        for mangled, pretty in names.items():
            if mangled not in ptx:
                continue
            instrs = funcs.get(mangled, [])
            m = re.search(r"(\w+)<(float|double)(?:, (\d+))?>", pretty)
            if not m:
                continue
            base, ctype, tmpl = m.group(1), m.group(2), m.group(3)
            dtype = "float32" if ctype == "float" else "float64"
            esize = 4 if ctype == "float" else 8
            kname = f"{base}<{ctype}{', ' + tmpl if tmpl else ''}>"
            if "preimage" in base and tmpl:
                for case, dt, b, S, D in CUDA_PREIMAGE_CASES:
                    if dt != dtype or _preimage_tile_points(text, S, D, esize) != int(tmpl):
                        continue
                    records.append(_cuda_preimage_record(kname, case, dtype, esize, int(tmpl), b, S,
                                                         D, text, ptx[mangled], instrs))
            elif "eigh" in base or "jacobi" in base:
                for case, dt, n in CUDA_JACOBI_CASES:
                    if dt == dtype:
                        records.append(_cuda_jacobi_record(kname, case, dtype, n, text, ptx[mangled],
                                                           instrs))
        log(f"  {src.name}: {len(ptx)} kernel instance(s) compiled")
    return records


def _cuda_preimage_record(kname, case, dtype, e, P, b, S, D, text, ptx, instrs):
    c = _source_constants(text)
    threads = c.get("kThreads", 256)
    nc = threads * c.get("kBlockRows", 4) * c.get("kBlockCols", 4) // P  # columns per chunk
    s32, d32 = _cdiv(S, nc) * nc, _cdiv(D, nc) * nc  # G and Y are computed in whole chunks
    smem = _preimage_smem_elems(text, P, S, D, e) * e + ptx["static_smem"]
    grid = _cdiv(b, P)
    dp, sp = _cdiv(D, P) * P, _cdiv(S, P) * P  # reduction depth padded to the tile depth KT = P
    macs = [STEPS * (P * s32 * dp + P * d32 * sp)] * grid
    l2 = [STEPS * (2 * S * D * e + P * S * e) + S * D * e + 2 * P * D * e] * grid
    ex = [STEPS * P * s32] * grid
    hbm = 2 * b * D * e + b * S * e + S * D * e + b * e
    work = gm.Work(macs, l2, ex, hbm, P * nc)
    op_min = {"flops": STEPS * 4.0 * b * S * D, "bytes": hbm, "exps": float(STEPS * b * S)}
    launch = {"grid": [grid, 1, 1], "num_warps": threads // 32, "num_stages": None,
              "constexprs": {"P": P}}
    rec = _record(kname, "cuda", case, "preimage", dtype, "ieee", ptx, instrs, threads, smem,
                  work, op_min, True, launch)
    rec["default_precision"] = True  # one precision: plain FP32/FP64 arithmetic
    return rec


def _cuda_jacobi_record(kname, case, dtype, n, text, ptx, instrs):
    """Jacobi has no tile loop for the generic model: per round, the larger of the FP64 and
    shared-memory throughput of all co-resident blocks and a latency floor (assumptions above)."""
    nt, dyn = _jacobi_launch(text, n)
    smem = dyn + ptx["static_smem"]
    occ = gm.occupancy(ptx["regs"], smem, nt)
    m = n + (n & 1)
    h = m // 2
    blocks = h * (h + 1) // 2
    # per round: phase 2 ~44 FP64 ops and 16 8-byte shared accesses per 2x2 block (12 flops of
    # rotation + a double sqrt for the block index), eigenvector update 6 flops + 4 accesses per
    # (pair, column); phase 1 ~40 FP64 ops per pair.
    fp64 = blocks * 44 + h * n * 6 + h * 40
    acc = blocks * 16 + h * n * 4
    per_block_cycles = max(fp64 / 64, acc / 16)            # 64 FP64 lanes, 16 8-byte accesses/clk
    bps = max(occ["blocks_per_sm"], 1)
    round_cycles = max(per_block_cycles * min(bps, _cdiv(JACOBI_BATCH, gm.SMS)), JACOBI_ROUND_CYCLES)
    waves = _cdiv(JACOBI_BATCH, gm.SMS * bps)
    t = waves * JACOBI_SWEEPS * (m - 1) * round_cycles / gm.CLOCK_HZ
    e = 4 if dtype == "float32" else 8
    bytes_ = JACOBI_BATCH * (2 * n * n + n) * e
    predicted = gm.LAUNCH_US + max(t, bytes_ / gm.HBM_BYTES_S) * 1e6
    roof = gm.roofline(JACOBI_BATCH * 9.0 * n ** 3, bytes_, 0.0, "float64")
    counts = gm.opcode_counts(instrs)
    return {
        "kernel": kname, "backend": "cuda", "case": case, "op": "eigh", "dtype": dtype,
        "precision": "fp64 arithmetic", "default_precision": True,
        "grid": [JACOBI_BATCH, 1, 1], "num_warps": nt // 32,
        "num_stages": None, "constexprs": {"threads_for(n)": nt}, "threads": nt,
        "regs": ptx["regs"], "spill_bytes": ptx["spill_stores"] + ptx["spill_loads"],
        "spill_stores": ptx["spill_stores"], "spill_loads": ptx["spill_loads"],
        "stack_bytes": ptx["stack_bytes"], "smem_bytes": smem,
        "blocks_per_sm": occ["blocks_per_sm"], "warps_per_sm": occ["warps_per_sm"],
        "occupancy_limited_by": occ["limited_by"],
        "tensor_core_instructions": gm.tensor_core_instructions(instrs),
        "tensor_core_ops": {k: v for k, v in counts.items() if k.split(".")[0] in gm.TENSOR_OPS},
        "has_dot": False, "dot_pipe": None, "hot_loop": None, "hot_loop_spill": False,
        "local_memory_ops": sum(1 for i in instrs if i.op.split(".")[0] in ("LDL", "STL")),
        "exp_redundancy": 0.0,
        "predicted_us": round(predicted, 2), "roofline_us": round(roof["roofline_us"], 2),
        "roofline_tf32_us": round(roof["roofline_tf32_us"], 2),
        "ratio": round(predicted / roof["roofline_us"], 2),
        "model": {"sweeps": JACOBI_SWEEPS, "round_cycles": round(round_cycles, 1),
                  "round_latency_floor_cycles": JACOBI_ROUND_CYCLES, "waves": waves,
                  "roofline_bound": roof["roofline_bound"], "op_min_flops": JACOBI_BATCH * 9.0 * n ** 3,
                  "note": "9 n^3 flops per matrix (tridiagonalisation + vectors) at the DMMA rate"},
        "label": MODEL_LABEL,
    }


# --------------------------------------------------------------------------------- report

def toolchain() -> dict:
    import torch
    import triton
    from triton.backends.nvidia.compiler import get_ptxas
    info = {"date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "triton": triton.__version__, "torch": torch.__version__,
            "target": "sm_90a (Triton: GPUTarget('cuda', 90, 32)); nvcc -arch=sm_90"}
    try:
        info["ptxas"] = get_ptxas(90).version.splitlines()[-1] if get_ptxas(90).version else None
    except Exception:  # noqa: BLE001 - informational only
        info["ptxas"] = None
    nvcc = shutil.which("nvcc")
    if nvcc:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
        info["nvcc"] = out.strip().splitlines()[-1] if out.strip() else None
    return info


def build_report(case_filter: list[str] | None = None, with_cuda: bool = True, log=print,
                 schemes=None, precisions=None) -> list[dict]:
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise RuntimeError("sm90_report compiles for a GPU: run it in a process without "
                           "TRITON_INTERPRET=1 (python scripts/sm90_report.py does that)")
    reason = why_not()
    if reason:
        raise RuntimeError(f"sm90_report cannot run: {reason}")
    cases = [c for c in _triton_cases()
             if not case_filter or any(f.lower() in c.name.lower() for f in case_filter)]
    if precisions:
        for c in cases:
            c.precisions = tuple(p for p in c.precisions if p in precisions)
        cases = [c for c in cases if c.precisions]
    with tempfile.TemporaryDirectory() as tmp:
        procs, why = compile_cuda(Path(tmp)) if with_cuda else (None, "skipped (--no-cuda)")
        log(f"Triton: {len(cases)} case(s)")
        records = triton_records(cases, log, schemes)
        if procs is not None:
            log("CUDA (nvcc -arch=sm_90 -cubin --resource-usage):")
            recs = cuda_records(procs, log)
            records += [r for r in recs
                        if not case_filter or any(f.lower() in r["case"].lower() for f in case_filter)]
        else:
            log(f"CUDA: {why}")
    tc = toolchain()
    for r in records:
        r["toolchain"] = tc
    return records


def _num(x) -> str:
    return "-" if x is None else f"{x:,.1f}"


def _precision_label(r: dict) -> str:
    return r["precision"] + (f" ({r['tf32x3_scheme']})" if r.get("tf32x3_scheme") else "")


def _markdown(head: list[str], rows: list[list]) -> str:
    lines = [head, ["---"] * len(head)] + rows
    return "\n".join("| " + " | ".join(str(c) for c in row) + " |" for row in lines)


def table(records: list[dict], measured: bool = False) -> str:
    head = ["kernel", "case", "dtype", "precision", "regs", "spill", "warps/SM", "TC instr",
            "predicted_us", "worst_us", "roofline_us", "ratio", "ratio_worst"] + (
                ["measured_us"] if measured else [])
    return _markdown(head, [
        [r["kernel"], r["case"], r["dtype"], _precision_label(r), r.get("regs"), r.get("spill_bytes"),
         r.get("warps_per_sm"), r.get("tensor_core_instructions"), _num(r.get("predicted_us")),
         _num(r.get("predicted_worst_us")), _num(r.get("roofline_us")), _num(r.get("ratio")),
         _num(r.get("ratio_worst"))] + ([r.get("measured_us", "-")] if measured else [])
        for r in records])


# ------------------------------------------------------------------------------- measure

def _model_index(records: list[dict]) -> dict[tuple, list[dict]]:
    out: dict[tuple, list[dict]] = {}
    for r in records:
        key = (r["case"], r["dtype"], r["precision"], r.get("tf32x3_scheme"), r["backend"])
        out.setdefault(key, []).append(r)
    return out


def measure(model: list[dict], case_filter, log=print, emit=None, schemes=None,
            precisions=None, accuracy=False) -> list[dict]:
    """On a GPU: time every case's launcher (triton.testing.do_bench, median) and each kernel of it
    (torch.profiler, mean device time), beside the model's records for the same (case, dtype,
    precision, tf32x3 scheme) taken from ``model`` (a compile report, e.g. the committed one: no
    recompiling here). ``emit(record)`` is called as soon as each case is measured (the GPU
    session appends it to its JSONL), so a run cut short keeps what it measured. ``accuracy``:
    also the float32 output's relative error (Frobenius) against the same case in float64."""
    import torch

    from geomkern.backends.triton import _common as C
    if not torch.cuda.is_available():
        raise RuntimeError("--measure needs a CUDA GPU")
    dev = "cuda"
    schemes = schemes or (C.TF32X3,)
    by_case = _model_index(model)
    out: list[dict] = []

    def keep(recs):
        for r in recs:
            out.append(r)
            if emit:
                emit(r)
    cases = [c for c in _triton_cases()
             if not case_filter or any(f.lower() in c.name.lower() for f in case_filter)]
    for case in cases:
        precs = [p for p in case.precisions if not precisions or p in precisions]
        if not precs:
            continue
        try:
            fn = case.build(_alloc(True, dev), dev, case.torch_dtype)
            ref = None
            if accuracy and case.dtype == "float32":
                f64 = case.build(_alloc(True, dev), dev, torch.float64)
                ref = f64("ieee")
                del f64
        except Exception as exc:  # noqa: BLE001 - e.g. out of memory: keep the other cases
            log(f"  {case.name} [{case.dtype}]: inputs not built: {exc!r}")
            continue
        for prec, scheme in (v for p in precs for v in variants(p, schemes)):
            recs = [dict(r) for r in by_case.get((case.name, case.dtype, prec, scheme, "triton"), [])]
            if not recs:  # no model record: measured alone, under the case's identity
                recs = [{"kernel": None, "backend": "triton", "case": case.name, "op": case.op,
                         "dtype": case.dtype, "precision": prec, "tf32x3_scheme": scheme,
                         "predicted_us": None}]
            label = f"{case.name} [{case.dtype} {prec}{' ' + scheme if scheme else ''}]"
            with tf32x3_scheme(scheme):
                _time_into(lambda: fn(prec), recs, log, label, ref)
            keep(recs)
        del fn, ref
        torch.cuda.empty_cache()
    _measure_cuda(by_case, dev, log, keep)
    return out


def _rel_err(out, ref) -> float | None:
    import torch
    if ref is None or not isinstance(out, torch.Tensor):
        return None
    ref = ref.double()
    return float((out.double() - ref).norm() / ref.norm().clamp_min(1e-300))


def _time_into(call, recs, log, label, ref=None):
    import torch
    import triton.testing
    dev_name = torch.cuda.get_device_name()
    try:
        out = call()
        torch.cuda.synchronize()
        err = _rel_err(out, ref)
        del out
        ms = triton.testing.do_bench(call, warmup=25, rep=200, return_mode="median")
        per_kernel = _profile(call)
    except Exception as exc:  # noqa: BLE001 - one failing case must not lose the others
        log(f"  {label}: measurement failed: {exc!r}")
        for r in recs:
            r["measured_error"] = repr(exc)[:500]
            r["measured_device"] = dev_name
        return
    case_model = [x["predicted_us"] for x in recs]
    case_worst = [x.get("predicted_worst_us") for x in recs]
    for r in recs:
        r["measured_case_us"] = round(ms * 1e3, 2)
        r["predicted_case_us"] = round(sum(case_model), 2) if None not in case_model else None
        r["predicted_worst_case_us"] = (round(sum(case_worst), 2) if None not in case_worst
                                        else None)
        hits = [v for k, v in per_kernel.items() if r["kernel"] and r["kernel"] in k]
        r["measured_us"] = round(hits[0], 2) if len(hits) == 1 else None
        r["measured_over_model"] = (round(r["measured_us"] / r["predicted_us"], 2)
                                    if r["measured_us"] and r["predicted_us"] else None)
        r["measured_rel_err_vs_float64"] = err
        r["measured_device"] = dev_name
        r["measured_label"] = "measured (triton.testing.do_bench median; per kernel: torch.profiler)"
    model = recs[0].get("predicted_case_us") or "-"
    worst = recs[0].get("predicted_worst_case_us") or "-"
    log(f"  {label}: {ms * 1e3:,.1f} us measured (op), model {model} us, worst {worst} us"
        + (f", rel err {err:.1e}" if err is not None else ""))


def _profile(call, iters: int = 3) -> dict[str, float]:
    """{kernel name: mean device time in us} over ``iters`` calls (empty if the profiler fails)."""
    import torch
    try:
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(iters):
                call()
            torch.cuda.synchronize()
        out = {}
        for evt in prof.key_averages():
            total = getattr(evt, "device_time_total", None) or getattr(evt, "cuda_time_total", 0)
            if evt.count and total:
                out[evt.key] = total / evt.count
        return out
    except Exception:  # noqa: BLE001
        return {}


def _measure_cuda(by_case, dev, log, keep) -> None:
    """The CUDA C++ kernels' cases (when geomkern._C_cuda is built), beside their model records;
    ``keep(records)`` takes each case's records as soon as it is measured."""
    import torch
    try:
        from geomkern.backends import native
        table_ = native.kernels(None, native._C_cuda)
    except Exception as exc:  # noqa: BLE001
        log(f"  CUDA kernels: not measured ({exc!r})")
        return
    if not table_:
        log(f"  CUDA kernels: not built ({native.why_not('cuda')})")
        return
    make = _alloc(True, dev)
    F = {"float32": torch.float32, "float64": torch.float64}
    for case, dt, b, S, D in CUDA_PREIMAGE_CASES:
        recs = [dict(r) for r in by_case.get((case, dt, "ieee", None, "cuda"), [])]
        if not recs or "preimage_gd" not in table_:
            continue
        f = table_["preimage_gd"]["cuda"]
        try:
            Z0, B, T = make((b, D), F[dt]), make((S, D), F[dt]), make((b, S), F[dt], "positive")
            lr = torch.full((b,), 0.5, dtype=F[dt], device=dev)
        except Exception as exc:  # noqa: BLE001
            log(f"  CUDA {case} [{dt}]: inputs not built: {exc!r}")
            continue
        _time_into(lambda: f(Z0, B, T, 1.0, STEPS, lr), recs, log, f"CUDA {case} [{dt}]")
        keep(recs)
        del Z0, B, T
    for case, dt, n in CUDA_JACOBI_CASES:
        recs = [dict(r) for r in by_case.get((case, dt, "fp64 arithmetic", None, "cuda"), [])]
        if not recs or "eigh" not in table_:
            continue
        try:
            A = make((JACOBI_BATCH, n, n), F[dt], "raw")
            A = (A + A.transpose(1, 2)).contiguous()
        except Exception as exc:  # noqa: BLE001
            log(f"  CUDA {case} [{dt}]: inputs not built: {exc!r}")
            continue
        f = table_["eigh"]["cuda"]
        _time_into(lambda: f(A, 8), recs, log, f"CUDA {case} [{dt}]")
        keep(recs)


# ------------------------------------------------------------------------------- compare

def compare(model: list[dict], measured: list[dict]) -> list[dict]:
    """The model's two predictions beside GPU measurements of the same (kernel, case, dtype,
    precision, tf32x3 scheme): one row per kernel that has both (a later measurement of a key
    replaces an earlier one). ``inside``: predicted <= measured <= worst."""
    def key(r):
        return (r.get("kernel"), r["case"], r["dtype"], r["precision"], r.get("tf32x3_scheme"),
                r.get("backend"))
    meas = {key(r): r for r in measured if r.get("measured_us")}
    rows = []
    for r in model:
        m = meas.get(key(r))
        if m is None or not r.get("predicted_us"):
            continue
        t, p, w, roof = m["measured_us"], r["predicted_us"], r.get("predicted_worst_us"), r.get("roofline_us")
        rows.append({"kernel": r["kernel"], "case": r["case"], "dtype": r["dtype"],
                     "precision": r["precision"], "tf32x3_scheme": r.get("tf32x3_scheme"),
                     "backend": r["backend"], "measured_us": t, "predicted_us": p,
                     "predicted_worst_us": w, "roofline_us": roof,
                     "measured_over_predicted": round(t / p, 2),
                     "measured_over_worst": round(t / w, 2) if w else None,
                     "measured_over_roofline": round(t / roof, 2) if roof else None,
                     "inside": bool(w) and p <= t <= w,
                     "measured_device": m.get("measured_device"),
                     "measured_rel_err_vs_float64": m.get("measured_rel_err_vs_float64")})
    return rows


def compare_table(rows: list[dict]) -> str:
    head = ["kernel", "case", "dtype", "precision", "measured us", "model us", "worst us",
            "roofline us", "meas/model", "meas/worst", "meas/roofline"]
    return _markdown(head, [
        [r["kernel"], r["case"], r["dtype"], _precision_label(r), _num(r["measured_us"]),
         _num(r["predicted_us"]), _num(r["predicted_worst_us"]), _num(r["roofline_us"]),
         r["measured_over_predicted"], r["measured_over_worst"] or "-",
         r["measured_over_roofline"] or "-"] for r in rows])


# ---------------------------------------------------------------------------------- main

def degenerate_cases():
    """(name, call) for every Triton launcher at sizes of 1 beside wider sizes, float32 (the
    default precision) and float64: Triton compiles a kernel per pattern of integer arguments
    equal to 1, and such a variant can need other resources than the general one. The pre-image
    kernel with S = 1 or D = 1 (and the other > 1) needed 262,184 B of shared memory against the
    H100's 232,448 (OutOfResources at launch: GPU session 11's four failing oracle rows)."""
    import itertools

    import torch

    from geomkern.backends.triton import kmeans as tkm
    from geomkern.backends.triton import kpca as tkpca
    from geomkern.backends.triton import preimage as tpre
    from geomkern.backends.triton import rbf as trbf

    def offsets(sizes):
        return torch.tensor([0] + list(itertools.accumulate(sizes)))

    for dt in (torch.float32, torch.float64):
        def r(*shape, dt=dt):
            return torch.randn(*shape, dtype=dt)
        tag = str(dt).replace("torch.", "")
        for n, m, D in [(1, 1, 1), (7, 1, 33), (1, 7, 33), (7, 33, 1), (300, 1, 64)]:
            yield f"rbf_gram symmetric n{n} D{D} {tag}", lambda n=n, D=D, r=r: trbf.rbf_gram(r(n, D), None, 0.5, False)
            yield f"rbf_gram cross n{n} m{m} D{D} {tag}", lambda n=n, m=m, D=D, r=r: trbf.rbf_gram(r(n, D), r(m, D), 0.5, False)
            for p in (1, 16):
                yield (f"rbf_matmul n{n} m{m} D{D} p{p} {tag}",
                       lambda n=n, m=m, D=D, p=p, r=r: trbf.rbf_matmul(r(n, D), r(m, D), r(m, p), 0.5))
        for sizes, D in [([1], 1), ([7, 1], 33), ([1, 300], 1)]:
            yield (f"segmented gram sizes {sizes} D{D} {tag}",
                   lambda sizes=sizes, D=D, r=r: tkpca.segmented_gram(r(sum(sizes), D), offsets(sizes), 0.5, True))
        for sizes, S, d, D in [([1], 1, 1, 1), ([7], 33, 1, 1), ([7], 1, 1, 33), ([300], 64, 8, 1)]:
            yield (f"project_onto_basis sizes {sizes} S{S} d{d} D{D} {tag}",
                   lambda sizes=sizes, S=S, d=d, D=D, r=r: tkpca.project_onto_basis(
                       r(sum(sizes), D), r(sum(sizes), d), offsets(sizes), r(S, D), 0.5))
        for m, n, k, D in [(1, 1, 1, 1), (2, 7, 1, 33), (2, 7, 5, 1)]:
            yield f"kmeans assign m{m} n{n} k{k} D{D} {tag}", lambda m=m, n=n, k=k, D=D, r=r: tkm.assign(r(m, n, D), r(m, k, D))
        for b, S, D in [(1, 1, 1), (7, 33, 1), (33, 1, 7), (257, 1, 257)]:
            yield (f"preimage gd b{b} S{S} D{D} {tag}",
                   lambda b=b, S=S, D=D, r=r: tpre.preimage_gd(r(b, D), r(S, D), r(b, S), 0.5, 3, r(b).abs()))
            yield (f"preimage fixed_point b{b} S{S} D{D} {tag}",
                   lambda b=b, S=S, D=D, r=r: tpre.preimage_fixed_point(r(b, D), r(S, D), r(b, S), 0.5, 3))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="JSON file to write (a list of records)")
    ap.add_argument("--jsonl", help="also append each record to this JSON-lines file as soon as it "
                    "exists (a run cut short keeps what it did)")
    ap.add_argument("--cases", default="", help="';'-separated substrings of case names")
    ap.add_argument("--no-cuda", action="store_true", help="skip the nvcc-compiled CUDA kernels")
    ap.add_argument("--tf32x3", default="",
                    help="comma-separated tf32x3 schemes to compile/time (default: the one in use; "
                    "'all': every scheme in geomkern/backends/triton/_common.py TF32X3_SCHEMES)")
    ap.add_argument("--precisions", default="",
                    help="comma-separated precisions to keep (default: every one the launchers "
                    "support); 'default': the default precision only")
    ap.add_argument("--measure", action="store_true",
                    help="on a GPU: time every case and write measured_us beside the model")
    ap.add_argument("--model", help="with --measure: the compile report whose predictions go beside "
                    "the measurements (no recompiling; e.g. results/sm90-compile/sm90-compile.json)")
    ap.add_argument("--accuracy", action="store_true",
                    help="with --measure: each float32 case's relative error against float64")
    ap.add_argument("--compare", nargs="+", metavar="JSONL",
                    help="no compiling or timing: the --model report's predictions beside the "
                    "measurements in these GPU-session files (later files win); --out gets the rows")
    ap.add_argument("--degenerate", action="store_true",
                    help="no report: compile every Triton launcher for sm_90 at sizes of 1 (float32 "
                    "and float64) and print each case's outcome; exit 1 if any fails to compile")
    args = ap.parse_args(argv)
    if args.degenerate:
        os.environ.pop("TRITON_INTERPRET", None)
        failed = 0
        for name, call in degenerate_cases():
            try:
                with compile_only():
                    call()
                print(f"ok      {name}")
            except Exception as exc:  # noqa: BLE001 - report every case, then fail
                failed += 1
                print(f"FAILED  {name}: {exc!r}"[:400])
        return 1 if failed else 0
    if args.compare:
        if not args.model:
            ap.error("--compare needs --model (the compile report to hold against the measurements)")
        measured = [json.loads(line) for f in args.compare for line in Path(f).read_text().splitlines()
                    if line.strip()]
        rows = compare(json.loads(Path(args.model).read_text()), measured)
        print(compare_table(rows))
        if args.out:
            Path(args.out).write_text(json.dumps(rows, indent=1) + "\n")
        return 0
    if not (args.out or args.jsonl):
        ap.error("give --out and/or --jsonl")
    os.environ.pop("TRITON_INTERPRET", None)  # compile for a GPU, never interpret
    from geomkern.backends.triton import _common as C
    flt = [s.strip() for s in args.cases.split(";") if s.strip()]
    schemes = (C.TF32X3_SCHEMES if args.tf32x3 == "all"
               else tuple(x for x in args.tf32x3.split(",") if x) or (C.TF32X3,))
    bad = [x for x in schemes if x not in C.TF32X3_SCHEMES]
    if bad:
        ap.error(f"--tf32x3: unknown scheme(s) {bad}; choose from {C.TF32X3_SCHEMES} or 'all'")
    precs = [x for x in args.precisions.split(",") if x]
    if precs == ["default"]:
        precs = [default_precision()]
    jsonl = Path(args.jsonl) if args.jsonl else None
    if jsonl:
        jsonl.parent.mkdir(parents=True, exist_ok=True)

    def emit(rec):
        if jsonl:
            with jsonl.open("a") as fh:
                fh.write(json.dumps(rec) + "\n")

    t0 = time.time()
    if args.measure:
        model = json.loads(Path(args.model).read_text()) if args.model else []
        records = measure(model, flt, emit=emit, schemes=schemes, precisions=precs,
                          accuracy=args.accuracy)
    else:
        records = build_report(flt, not args.no_cuda, schemes=schemes, precisions=precs)
        for r in records:
            emit(r)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(records, indent=1) + "\n")
    print(f"\n{MODEL_LABEL}\n")
    print(table(records, args.measure))
    print(f"\n{len(records)} records -> {args.out or args.jsonl} ({time.time() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
