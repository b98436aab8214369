"""Triton fused pre-image solvers: every iteration in one launch per tile of points.

Same math as geomkern.ops.preimage.gd_reference / fixed_point_reference. A program owns BLOCK_M
points and runs all ``steps`` for them. Each step is two tiled matrix products over the basis
B (S, D), both shaped for the tensor cores (BLOCK_M >= 64 rows: Hopper's wgmma):

1. k = exp(-gamma |z - b|^2) from zb = z B^T, (BLOCK_M, BLOCK_N) tiles reduced over D in BLOCK_K
   chunks; w (gd: (k - t) k; fixed point: a k) and its row sums are formed in the product's own
   register layout (each exp computed once) and written to a per-point scratch row W (b, S);
2. wB = w B, (BLOCK_M, BLOCK_N) tiles of D reduced over S, and the update of those columns of z.

Nothing D-sized lives in registers, so any D compiles without spilling (issue 13: the old
whole-row-in-registers kernel spilled at D = 1,024 and used 16-row tiles below wgmma's minimum).
The iterate itself lives in the output (updated in place, the program's own rows) and w in a
scratch buffer: both are re-read from L2 every step, which scripts/sm90_report.py prices (each
B tile is reused BLOCK_M times per product). Every 2-D access is a tensor descriptor (TMA on
Hopper), so no thread holds tile addresses; a row is written by TMA stores and read back by TMA
loads after a barrier, before which Triton waits for the stores to complete
(``cp.async.bulk.wait_group 0``, in the PTX): the one ordering a GPU run must still confirm.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from triton.tools.tensor_descriptor import TensorDescriptor

from ... import _dispatch
from . import _common as C
from ._common import mma  # by name, not C.mma: see mma's docstring


# do_not_specialize: Triton compiles a variant per pattern of integer arguments equal to 1, and
# the variant for S = 1 or D = 1 (the other > 1) asked for 262,184 B of shared memory, over an
# H100's 232,448 (GPU session 11; tests/geomkern/test_sm90_compile.py compiles every launcher at
# sizes of 1). One general kernel serves every size; its hot loop is the same instructions.
@triton.jit(do_not_specialize=["b", "S", "D", "steps"])
def _preimage_kernel(Z0, Zk, Zn, Bk, Bn, BB, T, Step, Params, Wn, Wk, b, S, D, steps,
                     FIXED_POINT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_K: tl.constexpr, PRECISION: tl.constexpr, ACC: tl.constexpr):
    """``steps`` iterations for points row0 + [0, BLOCK_M). Per step, with k = k(z, B) (BLOCK_M, S):
    gd (T = targets):          w = (k - T) k,  z <- z + Step ((sum_s w) z - w B)
    fixed point (T = coeffs a): w = a k,       z <- (w B) / (sum_s w)  where |sum_s w| > tiny

    Every 2-D operand is a tensor descriptor (TMA on Hopper: no address registers, zero fill
    past the edges), named by its block: Z0 (z0) and Zn (the iterate, in the output) and T, Wn
    (the scratch w) in (BLOCK_M, BLOCK_N) blocks; Zk, Wk in (BLOCK_M, BLOCK_K); Bk in
    (BLOCK_N, BLOCK_K), Bn in (BLOCK_K, BLOCK_N). BB = |b_s|^2 (S,); Params = [gamma, tiny]."""
    row0 = tl.program_id(0) * BLOCK_M
    lm = tl.arange(0, BLOCK_M)
    row_ok = lm < b - row0
    rn = tl.arange(0, BLOCK_N)
    gamma = tl.load(Params)
    tiny = tl.load(Params + 1)
    if not FIXED_POINT:
        step = tl.load(Step + row0 + lm, mask=row_ok, other=0.0).to(ACC)
    # z0 -> the output (the iterate's home) and |z|^2
    zz = tl.zeros((BLOCK_M,), dtype=ACC)
    for d0 in range(0, D, BLOCK_N):
        z = Z0.load([row0, d0]).to(ACC)
        Zn.store([row0, d0], z.to(Zn.dtype))
        zz += tl.sum(z * z, 1)
    tl.debug_barrier()
    for _ in range(steps):
        # 1. w = f(k(z, B)) tile by tile of S, into W; its row sums
        wsum = tl.zeros((BLOCK_M,), dtype=ACC)
        for s0 in range(0, S, BLOCK_N):
            zb = tl.zeros((BLOCK_M, BLOCK_N), dtype=ACC)
            for k0 in range(0, D, BLOCK_K):
                zb = mma(Zk.load([row0, k0]).to(ACC), tl.trans(Bk.load([s0, k0]).to(ACC)), zb,
                         PRECISION)
            s_ok = s0 + rn < S
            bb = tl.load(BB + s0 + rn, mask=s_ok, other=0.0)
            k = tl.exp(-gamma * tl.maximum(zz[:, None] + bb[None, :] - 2.0 * zb, 0.0))
            ts = T.load([row0, s0]).to(ACC)
            if FIXED_POINT:
                w = ts * k
            else:
                w = (k - ts) * k
            w = tl.where(s_ok[None, :], w, 0.0)  # B's zero-filled rows past S have k != 0
            wsum += tl.sum(w, 1)
            Wn.store([row0, s0], w)
        tl.debug_barrier()  # W complete before any thread reads it; every read of z done
        # 2. w B, BLOCK_N columns of z at a time, and the update of those columns
        if FIXED_POINT:
            # a vanishing denominator has no fixed point: keep the iterate (as the reference)
            ok = tl.abs(wsum) > tiny
            den = tl.where(ok, wsum, 1.0)
        zz = tl.zeros((BLOCK_M,), dtype=ACC)
        for d0 in range(0, D, BLOCK_N):
            wb = tl.zeros((BLOCK_M, BLOCK_N), dtype=ACC)
            for k0 in range(0, S, BLOCK_K):
                wb = mma(Wk.load([row0, k0]), Bn.load([k0, d0]).to(ACC), wb, PRECISION)
            z = Zn.load([row0, d0]).to(ACC)
            if FIXED_POINT:
                z = tl.where(ok[:, None], wb / den[:, None], z)
            else:
                z = z + step[:, None] * (wsum[:, None] * z - wb)
            zz += tl.sum(z * z, 1)
            Zn.store([row0, d0], z.to(Zn.dtype))
        tl.debug_barrier()  # the new z complete before the next step reads it


# ------------------------------------------------------------------------------------ launchers

def _aligned(t: torch.Tensor) -> torch.Tensor:
    """t (rows, cols), contiguous with 16-byte-aligned rows and base (what a tensor descriptor
    needs): t itself when it already is, else a zero-padded copy whose extra columns the kernel
    never reads (its descriptors keep the true width)."""
    t = t.contiguous()
    per16 = 16 // t.element_size()
    if t.shape[1] % per16 == 0 and t.data_ptr() % 16 == 0:
        return t
    out = torch.zeros((t.shape[0], triton.cdiv(t.shape[1], per16) * per16), dtype=t.dtype,
                      device=t.device)
    out[:, :t.shape[1]] = t
    return out


def _desc(t: torch.Tensor, cols: int, block) -> TensorDescriptor:
    return TensorDescriptor(t, [t.shape[0], cols], [t.stride(0), 1], list(block))


def _tiles(dtype: torch.dtype, dot: str) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, num_warps). Tensor cores (tf32, tf32x3): 128 x 128 output tiles
    over two warpgroups, each on wgmma's 64 rows, so every B tile serves 128 points per product;
    float64 (DMMA, no wgmma) 64 x 64; float32 "ieee" (FFMA) 64 x 128 over 8 warps (128 x 128 at
    ieee spills: its FMA operands sit in registers). docs/history.md §10."""
    if dtype == torch.float64:
        return 64, 64, 16, 4
    return (64, 128, 16, 8) if dot == "ieee" else (128, 128, 32, 8)


def _launch(Z0, B, T, step, gamma: float, steps: int, fixed_point: bool, precision: str):
    b, D = Z0.shape
    S = B.shape[0]
    if b == 0:
        return C.empty((b, D), Z0.dtype, Z0.device)
    acc = C.compute_dtype(Z0.dtype)
    Bc = B.to(acc)
    bb = (Bc * Bc).sum(1)
    Z0, B, T = _aligned(Z0), _aligned(B), _aligned(T)
    # the iterate lives in the output: padded like Z0 when D's rows are not 16-byte aligned
    out = C.empty(Z0.shape, Z0.dtype, Z0.device)
    w = C.empty(T.shape, acc, Z0.device)
    tiny = torch.finfo(Z0.dtype).tiny ** 0.5
    # (128, 128) output tiles over two warpgroups (each on wgmma's 64 rows): every B tile serves
    # 128 points per product; float64 (DMMA: no wgmma) (64, 64). docs/history.md §10.
    dot = C.dot_precision(Z0.dtype, precision)
    BM, BN, BK, warps = _tiles(Z0.dtype, dot)
    C.launch(_preimage_kernel)[(triton.cdiv(b, BM),)](
        _desc(Z0, D, (BM, BN)), _desc(out, D, (BM, BK)), _desc(out, D, (BM, BN)),
        _desc(B, D, (BN, BK)), _desc(B, D, (BK, BN)), bb, _desc(T, S, (BM, BN)),
        step if step is not None else bb, C.scalars(Z0.device, Z0.dtype, gamma, tiny),
        _desc(w, S, (BM, BN)), _desc(w, S, (BM, BK)), b, S, D, int(steps),
        FIXED_POINT=fixed_point, BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK,
        PRECISION=dot, ACC=C.acc_type(Z0.dtype),
        num_warps=warps, num_stages=3)
    return out if out.shape[1] == D else out[:, :D].contiguous()


def preimage_gd(Z0, B, T, gamma: float, steps: int, lr: torch.Tensor, precision: str = C.DEFAULT_PRECISION):
    """Same contract as geomkern.ops.preimage.gd_reference; lr: (b,) per-point steps."""
    step = (4.0 * gamma * lr).contiguous()  # the reference's step, computed the same way
    return _launch(Z0, B, T, step, gamma, steps, False, precision)


def preimage_fixed_point(Z0, B, A, gamma: float, steps: int, precision: str = C.DEFAULT_PRECISION):
    """Same contract as geomkern.ops.preimage.fixed_point_reference; A: (b, S) coefficients."""
    return _launch(Z0, B, A, None, gamma, steps, True, precision)


# --------------------------------------------------------------------------------- registration

_dispatch.register("preimage_gd", "triton", devices=C.DEVICES)(preimage_gd)
_dispatch.register("preimage_fixed_point", "triton", devices=C.DEVICES)(preimage_fixed_point)
