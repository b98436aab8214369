"""How to issue a float32-accurate dot on Hopper tensor cores: the tf32x3 schemes as bare GEMMs.

    python scripts/tf32x3_schemes.py [--jsonl FILE]     # on a GPU: time + error of each scheme
    python scripts/tf32x3_schemes.py --dry [--jsonl F]  # no GPU: each scheme's sm_90 SASS

C = A @ B^T for A, B (4096, 512) float32 (the Gram's shape), one Triton kernel per scheme with
the tiles geomkern's Gram uses (128 x 128 x 32, 8 warps), every scheme through
geomkern/backends/triton/_common.py's ``mma`` where it has one:

  builtin   tl.dot(input_precision="tf32x3"): Triton splits each operand (cvt.rna) itself
  split     _common.mma's "tf32x3split": integer-op split, three chained "tf32" dots
  planes    the operands split once, outside the GEMM (A' = [a_hi | a_hi | a_lo],
            B' = [b_hi | b_lo | b_hi], K' = 3 x 512), then one plain "tf32" GEMM: the three
            products are one tensor-core chain that Triton pipelines like any GEMM (its wgmma
            waits leave a group in flight) at three times the operand bytes; timed with and
            without the split
  tf32      one TF32 pass (about 1e-3 relative error: below the float32 bound)
  ieee      FFMA, no tensor cores

beside cuBLAS through torch.mm (float32 with TF32 off, and TF32 on). Each provider's relative
error (Frobenius) against the float64 product of the same inputs sits beside its time, and so
does the error of rbf_gram on an offset cloud (rows at distance 1 from the origin, spread 0.05,
gamma |x|^2 = 200: the cancellation case of |x|^2 + |y|^2 - 2<x, y>) for the Triton default and
for the torch float32 reference. Times: triton.testing.do_bench medians, one process, providers
interleaved (each timed in turn, twice). ``--dry`` compiles each scheme for sm_90 and reports
its hot loop: instructions, HGMMA count, wgmma waits (and how many leave nothing in flight).
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import sys
import time
from pathlib import Path

import torch
import triton
import triton.language as tl

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from geomkern.backends.triton import _common as C  # noqa: E402

N, D = 4096, 512
BM, BN, BK, WARPS = 128, 128, 32, 8


@triton.jit
def _gemm(A, B, Out, n, m, K, PRECISION: tl.constexpr, BLOCK_M: tl.constexpr,
          BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Out (n, m) = A (n, K) @ B (m, K)^T, row-major, sizes multiples of the blocks."""
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        a = tl.load(A + rm.to(tl.int64)[:, None] * K + (k0 + rk)[None, :])
        b = tl.load(B + rn.to(tl.int64)[:, None] * K + (k0 + rk)[None, :])
        if PRECISION == "tf32raw":
            # tl.dot straight on the loaded tiles, one TF32 pass: the bare GEMM's ceiling (and the
            # planes' chain). The kernels' "tf32" rounds its operands in registers first
            # (_common.mma: the raw form was wrong inside the RBF kernels under triton 3.6)
            acc = tl.dot(a, tl.trans(b), acc, input_precision="tf32")
        else:
            acc = C.mma(a, tl.trans(b), acc, PRECISION)
    tl.store(Out + rm.to(tl.int64)[:, None] * m + rn[None, :], acc)


def tf32_split(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x = hi + lo, hi rounded to nearest on TF32's mantissa (the same bits as _common._tf32_split)."""
    bits = x.contiguous().view(torch.int32)
    hi = ((bits + 0x1000) & -0x2000).view(torch.float32)
    return hi, x - hi


def planes(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    ah, al = tf32_split(a)
    bh, bl = tf32_split(b)
    return torch.cat([ah, ah, al], 1).contiguous(), torch.cat([bh, bl, bh], 1).contiguous()


def gemm(a, b, precision, out=None, block_n=BN):
    n, K = a.shape
    m = b.shape[0]
    out = torch.empty(n, m, dtype=torch.float32, device=a.device) if out is None else out
    _gemm[(n // BM, m // block_n)](a, b, out, n, m, K, PRECISION=precision, BLOCK_M=BM,
                                   BLOCK_N=block_n, BLOCK_K=BK, num_warps=WARPS)
    return out


def providers(a, b):
    """name -> zero-argument callable returning the (n, m) product."""
    pa, pb = planes(a, b)

    def mm(tf32):
        def f():
            old = torch.backends.cuda.matmul.allow_tf32
            torch.backends.cuda.matmul.allow_tf32 = tf32
            try:
                return a @ b.T
            finally:
                torch.backends.cuda.matmul.allow_tf32 = old
        return f
    return {
        "triton builtin tf32x3": lambda: gemm(a, b, "tf32x3"),
        "triton split tf32x3": lambda: gemm(a, b, "tf32x3split"),
        "triton planes tf32x3 (split included)": lambda: gemm(*planes(a, b), "tf32raw"),
        "triton planes tf32x3 (GEMM only)": lambda: gemm(pa, pb, "tf32raw"),
        "triton planes tf32x3 (GEMM only, 128x256)": lambda: gemm(pa, pb, "tf32raw", block_n=256),
        "triton tf32 (1 pass)": lambda: gemm(a, b, "tf32raw"),
        "triton tf32 (1 pass, operands rounded: the kernels' tf32)": lambda: gemm(a, b, "tf32"),
        "triton ieee (FFMA)": lambda: gemm(a, b, "ieee"),
        "torch.mm float32 (cuBLAS, TF32 off)": mm(False),
        "torch.mm TF32 (cuBLAS, 1 pass)": mm(True),
    }


def rel_err(out, ref) -> float:
    return float((out.double() - ref).norm() / ref.norm())


def offset_cloud(n, D, device, seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    c = torch.randn(D, dtype=torch.float64, device=device, generator=g)
    c = c / c.norm()
    X = c + 0.05 * torch.randn(n, D, dtype=torch.float64, device=device, generator=g) / D ** 0.5
    return X, 200.0 / float((X * X).sum(1).mean())


def accuracy_offset(device, emit):
    """rbf_gram / rbf_matmul on one offset cloud (X and Y: rows of the same cloud): each
    backend's float32 result against float64."""
    import geomkern as gk
    from geomkern.ops import rbf as rrbf
    Z64, gamma = offset_cloud(1700, 512, device)
    X64, Y64 = Z64[:1000], Z64[1000:]
    X, Y = X64.float(), Y64.float()
    V64 = torch.rand(700, 16, dtype=torch.float64, device=device,
                     generator=torch.Generator(device=device).manual_seed(2))
    refs = {"rbf_gram symmetric": rrbf.gram_reference(X64, None, gamma, False),
            "rbf_gram cross": rrbf.gram_reference(X64, Y64, gamma, False),
            "rbf_matmul": rrbf.gram_reference(X64, Y64, gamma, False) @ V64}
    calls = {"rbf_gram symmetric": lambda: gk.rbf_gram(X, gamma=gamma),
             "rbf_gram cross": lambda: gk.rbf_gram(X, Y, gamma=gamma),
             "rbf_matmul": lambda: gk.rbf_matmul(X, Y, V64.float(), gamma=gamma)}
    for name, call in calls.items():
        for backend in ("triton", "reference"):
            with gk.set_backend(backend):
                err = rel_err(call(), refs[name])
            rec = {"step": "schemes", "kind": "offset_accuracy", "provider": f"{name}, {backend}",
                   "op": name, "backend": backend, "tf32x3_scheme": C.TF32X3,
                   "gamma_x2": 200.0, "n": 1000, "m": 700, "D": 512, "rel_err_vs_float64": err}
            emit(rec)
            print(f"  offset cloud  {rec['provider']:32s} rel err {err:.2e}")


def default_paths(device, emit):
    """Each op with a Triton kernel through the public API (validation included), Triton at the
    default precision against the torch reference (float32 GEMMs, TF32 off: the same accuracy
    class), same inputs, timed interleaved; each result's error against float64. This is the
    measurement ``auto``'s choice on CUDA rests on."""
    import geomkern as gk
    g = torch.Generator(device=device).manual_seed(5)

    def rows(n, D):
        t = torch.randn(n, D, dtype=torch.float64, device=device, generator=g)
        return t / t.norm(dim=1, keepdim=True)
    X, Y, B = rows(4096, 512), rows(4096, 512), rows(512, 512)
    big = rows(20000, 64)
    V = torch.rand(20000, 16, dtype=torch.float64, device=device, generator=g)
    sizes = [round(100 + (2000 - 100) * i / 29) for i in range(30)]
    off = torch.tensor([0] + list(torch.tensor(sizes).cumsum(0)), device=device)
    Xs = rows(int(off[-1]), 512)
    Z0 = rows(5000, 512)
    T = torch.rand(5000, 512, dtype=torch.float64, device=device, generator=g) / 512
    with gk.set_backend("reference"):
        fit32 = gk.kpca(Xs.float(), off, n_components=8, gamma=1.0)
    # the float64 oracle projects with the same coefficients (a fit assembled by hand carries no
    # fingerprint of X, so the float64 X is accepted)
    fit64 = dataclasses.replace(fit32, fingerprint=None, **{
        f.name: getattr(fit32, f.name).double() for f in dataclasses.fields(fit32)
        if f.name != "fingerprint" and torch.is_tensor(getattr(fit32, f.name))
        and getattr(fit32, f.name).is_floating_point()})
    cases = {
        "rbf_gram symmetric 4096 x D512": lambda x: gk.rbf_gram(x(X), gamma=1.0),
        "rbf_gram cross 4096 x 4096 x D512": lambda x: gk.rbf_gram(x(X), x(Y), gamma=1.0),
        "rbf_matmul 20000^2 x D64, p16": lambda x: gk.rbf_matmul(x(big), x(big), x(V), gamma=1.0),
        "preimage gd 5000 x S512 x D512, 20 steps": lambda x: gk.preimage(
            x(Z0), x(B), x(T), gamma=1.0, method="gd", steps=20),
        "preimage fixed_point 5000 x S512 x D512, 20 steps": lambda x: gk.preimage(
            x(Z0), x(B), x(T), gamma=1.0, method="fixed_point", steps=20),
    }
    cases["project_onto_basis 30 clusters, S512, d8"] = lambda x: gk.project_onto_basis(
        x(Xs), fit32 if x(Xs).dtype == torch.float32 else fit64, x(B), gamma=1.0)
    f32 = lambda t: t.float()  # noqa: E731
    f64 = lambda t: t  # noqa: E731
    for name, call in cases.items():
        try:
            with gk.set_backend("reference"):
                ref = call(f64)
            outs, times = {}, {"triton": [], "reference": []}
            fns = {}
            for backend in ("triton", "reference"):
                def fn(backend=backend):
                    with gk.set_backend(backend):
                        return call(f32)
                fns[backend] = fn
                outs[backend] = rel_err(fn(), ref)
            torch.cuda.synchronize()
            for _ in range(2):
                for backend, fn in fns.items():
                    times[backend].append(triton.testing.do_bench(fn, warmup=10, rep=60,
                                                                  return_mode="median"))
        except Exception as exc:  # noqa: BLE001 - one op failing must not lose the others
            emit({"step": "schemes", "kind": "default_path", "case": name, "error": repr(exc)[:300]})
            print(f"  {name}: failed {exc!r}")
            continue
        t = {b: min(v) * 1e3 for b, v in times.items()}
        rec = {"step": "schemes", "kind": "default_path", "case": name,
               "tf32x3_scheme": C.TF32X3, "device": torch.cuda.get_device_name(),
               "triton_us": round(t["triton"], 1), "reference_us": round(t["reference"], 1),
               "triton_speedup": round(t["reference"] / t["triton"], 2),
               "triton_rel_err": outs["triton"], "reference_rel_err": outs["reference"],
               "label": "measured (public op, do_bench median, min of 2 interleaved rounds)"}
        emit(rec)
        print(f"  {name:48s} triton {t['triton']:9.1f} us (err {outs['triton']:.1e})  reference "
              f"{t['reference']:9.1f} us (err {outs['reference']:.1e})  -> {rec['triton_speedup']}x")


def run_gpu(emit):
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(0)
    a64 = torch.randn(N, D, dtype=torch.float64, device=dev, generator=g)
    b64 = torch.randn(N, D, dtype=torch.float64, device=dev, generator=g)
    a64, b64 = a64 / a64.norm(dim=1, keepdim=True), b64 / b64.norm(dim=1, keepdim=True)
    a, b = a64.float(), b64.float()
    ref = a.double() @ b.double().T
    provs = providers(a, b)
    errs, times = {}, {k: [] for k in provs}
    for name, f in provs.items():
        try:
            errs[name] = rel_err(f(), ref)
        except Exception as exc:  # noqa: BLE001 - one scheme failing must not lose the others
            errs[name] = repr(exc)[:300]
    torch.cuda.synchronize()
    for _ in range(2):  # interleaved: every provider timed in turn, twice
        for name, f in provs.items():
            if isinstance(errs[name], str):
                continue
            times[name].append(triton.testing.do_bench(f, warmup=25, rep=100, return_mode="median"))
    for name in provs:
        ms = min(times[name]) if times[name] else None
        rec = {"step": "schemes", "kind": "scheme", "provider": name, "n": N, "m": N, "D": D,
               "device": torch.cuda.get_device_name(),
               "median_us": round(ms * 1e3, 2) if ms else None,
               "median_us_runs": [round(t * 1e3, 2) for t in times[name]],
               "nominal_tflops": round(2 * N * N * D / (ms * 1e-3) / 1e12, 1) if ms else None,
               "rel_err_vs_float64": errs[name] if not isinstance(errs[name], str) else None,
               "error": errs[name] if isinstance(errs[name], str) else None,
               "label": "measured (triton.testing.do_bench median, min over 2 interleaved rounds)"}
        emit(rec)
        print(f"  {name:44s} {rec['median_us'] or float('nan'):9.1f} us "
              f"{rec['nominal_tflops'] or float('nan'):7.1f} TF/s  err {errs[name]}")
    accuracy_offset(dev, emit)
    default_paths(dev, emit)


def run_dry(emit):
    """Each scheme compiled for sm_90 (no GPU): the hot loop's instructions and wgmma waits."""
    spec = importlib.util.spec_from_file_location("sm90_report", ROOT / "scripts" / "sm90_report.py")
    rep = sys.modules.get("sm90_report") or importlib.util.module_from_spec(spec)
    if "sm90_report" not in sys.modules:
        sys.modules["sm90_report"] = rep
        spec.loader.exec_module(rep)
    gm = sys.modules["gpu_model"]
    a = torch.empty(N, D)
    p = torch.empty(N, 3 * D)
    cases = {"builtin": ("tf32x3", a), "split": ("tf32x3split", a), "planes": ("tf32raw", p),
             "tf32": ("tf32raw", a), "tf32 rounded": ("tf32", a), "ieee": ("ieee", a)}
    with rep.compile_only() as drv:
        for name, (prec, x) in cases.items():
            drv.launches.clear()
            gemm(x, x, prec, out=torch.empty(N, N))
            k = drv.launches[-1].kernel
            ptx = rep.parse_ptxas(k.metadata.ptxas_log)[k.metadata.name]
            instrs = gm.sass_functions(rep.sass(k.asm["cubin"]))[k.metadata.name]
            pipe = gm.dot_pipe(gm.opcode_counts(instrs), "float32")
            mix = gm.loop_mix(instrs, pipe)
            iters = 3 if name == "planes" else 1  # loop iterations per 32 of the op's K
            rec = {"step": "schemes", "kind": "scheme_sass", "scheme": name, "precision": prec,
                   "regs": ptx["regs"], "spill_bytes": ptx["spill_stores"] + ptx["spill_loads"],
                   "hot_loop_instructions_per_k32": mix.instructions * iters,
                   # one HGMMA.64x128x8 is 64 * 128 * 8 / 4 multiply-adds per warp
                   "hgmma_per_k32": (round(mix.macs * iters / (64 * BN * 8 / 4))
                                     if pipe.startswith("hgmma") else 0),
                   "wgmma_waits_per_k32": mix.waits * iters,
                   "wgmma_full_waits_per_k32": mix.full_waits * iters,
                   "loop_efficiency": round(mix.efficiency, 3),
                   "loop_worst_efficiency": round(mix.worst_efficiency, 3), "pipe": pipe,
                   "label": "compiled for sm_90, not run"}
            emit(rec)
            print(f"  {name:8s} regs {rec['regs']:3d} spill {rec['spill_bytes']:4d}  per 32 of K: "
                  f"{rec['hot_loop_instructions_per_k32']:4d} instructions, "
                  f"{rec['hgmma_per_k32']} HGMMA, {rec['wgmma_waits_per_k32']} waits "
                  f"({rec['wgmma_full_waits_per_k32']} full); worst-case loop efficiency "
                  f"{rec['loop_worst_efficiency']}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jsonl", help="append each record to this JSON-lines file as it is made")
    ap.add_argument("--dry", action="store_true", help="no GPU: compile for sm_90, report the SASS")
    args = ap.parse_args(argv)

    def emit(rec):
        if args.jsonl:
            with open(args.jsonl, "a") as fh:
                fh.write(json.dumps(rec) + "\n")
    t0 = time.time()
    if args.dry:
        os.environ.pop("TRITON_INTERPRET", None)
        run_dry(emit)
    else:
        if not torch.cuda.is_available():
            print("tf32x3_schemes: no CUDA device (use --dry for the compile-only report)")
            return 2
        run_gpu(emit)
    print(f"({time.time() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
