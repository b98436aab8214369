"""Can tf32x3 keep its per-K-step fresh accumulator (the accuracy fix of docs/history.md §19) and
still let Triton keep wgmma groups in flight? Each variant of the bare 4,096^2 x 512 GEMM compiled
for sm_90 (no GPU: scripts/sm90_report.py's compile-only driver), its hot loop counted:
instructions, wgmma waits, and how many of them drain everything (full).

    .venv/bin/python studies/tf32x3-waits/waits.py

  split         geomkern's default (_common.mma "tf32x3split"): split in registers, three dots
                into a fresh accumulator, one FADD into the running sum
  split-defer   the same, the FADD of step k issued in step k+1 (same additions, same bits)
  planes-fresh  operands split once outside (hi and lo tensors, loaded from memory like a plain
                GEMM's), three dots into a fresh accumulator per K step
  planes-defer  planes-fresh with the FADD deferred one step
  planes-chain  the three products chained into the loop-carried accumulator (benchmarks/
                tf32x3_schemes.py's "planes": pipelined, but 5.3e-6 error on an H100 against 1.5e-7)
"""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)
ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from geomkern.backends.triton._common import _tf32_split, mma  # noqa: E402

_spec = importlib.util.spec_from_file_location("sm90_report", ROOT / "scripts" / "sm90_report.py")
rep = importlib.util.module_from_spec(_spec)
sys.modules["sm90_report"] = rep
_spec.loader.exec_module(rep)
gm = sys.modules["gpu_model"]


@triton.jit
def _gemm(Ah, Al, Bh, Bl, Out, n, m, K, zero, MODE: tl.constexpr, BLOCK_M: tl.constexpr,
          BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Out = A @ B^T; the split modes read A from Ah and B from Bh, the planes modes read the
    pre-split hi/lo planes."""
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    prev = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ia = rm.to(tl.int64)[:, None] * K + (k0 + rk)[None, :]
        ib = rn.to(tl.int64)[:, None] * K + (k0 + rk)[None, :]
        if MODE == "split":
            acc = mma(tl.load(Ah + ia), tl.trans(tl.load(Bh + ib)), acc, "tf32x3split")
        elif MODE == "planes-fresh-one":
            # one dot per K step over K' = 4 BLOCK_K (a power of two, as tl.arange needs): planes
            # interleaved per block of K, A' = [a_lo | a_hi | a_hi | a_lo] against
            # B' = [b_hi | b_lo | b_hi | b_lo] (the split's three products, small first, and the
            # tiny lo.lo), summed in a fresh accumulator, then one FADD
            r4 = 4 * k0 + tl.arange(0, 4 * BLOCK_K)
            a4 = tl.load(Al + rm.to(tl.int64)[:, None] * (4 * K) + r4[None, :])
            b4 = tl.load(Bl + rn.to(tl.int64)[:, None] * (4 * K) + r4[None, :])
            acc = acc + tl.dot(a4, tl.trans(b4), tl.zeros(acc.shape, acc.dtype), input_precision="tf32")
        elif MODE == "planes-fresh-one-kept":
            # the same, with the step's accumulator a splat of a run-time zero: Triton folds
            # "acc + dot(a, b, 0)" into "dot(a, b, acc)" (the long chain again), not this
            r4 = 4 * k0 + tl.arange(0, 4 * BLOCK_K)
            a4 = tl.load(Al + rm.to(tl.int64)[:, None] * (4 * K) + r4[None, :])
            b4 = tl.load(Bl + rn.to(tl.int64)[:, None] * (4 * K) + r4[None, :])
            acc = acc + tl.dot(a4, tl.trans(b4), tl.full(acc.shape, zero, tl.float32), input_precision="tf32")
        else:
            if MODE == "split-defer":
                a_hi, a_lo = _tf32_split(tl.load(Ah + ia))
                b_hi, b_lo = _tf32_split(tl.trans(tl.load(Bh + ib)))
            else:
                a_hi, a_lo = tl.load(Ah + ia), tl.load(Al + ia)
                b_hi, b_lo = tl.trans(tl.load(Bh + ib)), tl.trans(tl.load(Bl + ib))
            if MODE == "planes-chain":
                acc = tl.dot(a_lo, b_hi, acc, input_precision="tf32")
                acc = tl.dot(a_hi, b_lo, acc, input_precision="tf32")
                acc = tl.dot(a_hi, b_hi, acc, input_precision="tf32")
            else:
                step = tl.dot(a_lo, b_hi, tl.zeros(acc.shape, acc.dtype), input_precision="tf32")
                step = tl.dot(a_hi, b_lo, step, input_precision="tf32")
                step = tl.dot(a_hi, b_hi, step, input_precision="tf32")
                if MODE == "planes-fresh":
                    acc = acc + step
                else:  # the deferred modes
                    acc = acc + prev
                    prev = step
    acc = acc + prev  # zero unless deferred
    tl.store(Out + rm.to(tl.int64)[:, None] * m + rn[None, :], acc)


def main() -> int:
    n, D = 4096, 512
    x, x4, out = torch.empty(n, D), torch.empty(n, 4 * D), torch.empty(n, n)
    print("| variant | regs | spilled bytes | hot-loop instructions per K step | wgmma waits | full waits |")
    print("|---|---|---|---|---|---|")
    with rep.compile_only() as drv:
        for mode in ("split", "split-defer", "planes-fresh", "planes-defer", "planes-chain", "planes-fresh-one",
                     "planes-fresh-one-kept"):
            drv.launches.clear()
            one = mode.startswith("planes-fresh-one")
            lo = x4 if one else x
            bk = 16 if one else 32  # 4 x 16 = 64 columns a stage in shared memory
            _gemm[(n // 128, n // 128)](x, lo, x, lo, out, n, n, D, 0.0, MODE=mode, BLOCK_M=128, BLOCK_N=128,
                                        BLOCK_K=bk, num_warps=8, num_stages=3)
            k = drv.launches[-1].kernel
            ptx = rep.parse_ptxas(k.metadata.ptxas_log)[k.metadata.name]
            instrs = gm.sass_functions(rep.sass(k.asm["cubin"]))[k.metadata.name]
            mix = gm.loop_mix(instrs, gm.dot_pipe(gm.opcode_counts(instrs), "float32"))
            print(f"| {mode} | {ptx['regs']} | {ptx['spill_stores'] + ptx['spill_loads']} | "
                  f"{mix.instructions} | {mix.waits} | {mix.full_waits} |")
    print(f"\ntriton {triton.__version__}, compiled for sm_90, not run")
    return 0


if __name__ == "__main__":
    sys.exit(main())
