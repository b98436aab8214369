"""Triton fused pre-image solvers: every iteration in one launch per tile of points.

Same math as geomkern.ops.preimage.gd_reference / fixed_point_reference. A program owns
BLOCK_M points; their iterates z (BLOCK_M, D) stay in registers for all ``steps`` while the basis
B (and the per-point targets or coefficients) are streamed tile by tile each step, so nothing
but the final z is written. That needs the whole row on chip: D <= 1024 in float32, 512 in
float64 (``MAX_D``; both fit the shared memory of an A100, compiled for sm_90 with 2 pipeline
stages: ~130 KB); a larger D, or a GPU whose shared memory is too small, runs the reference with
a warning saying so.
"""
from __future__ import annotations

import warnings

import torch
import triton
import triton.language as tl

from ... import _dispatch
from ...ops.preimage import fixed_point_reference, gd_reference
from . import _common as C

MAX_D = {torch.float32: 1024, torch.float64: 512}


@triton.jit
def _preimage_kernel(Z0, B, T, Step, Params, Out, b, S, D, steps, FIXED_POINT: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
                     PRECISION: tl.constexpr, ACC: tl.constexpr):
    """``steps`` iterations for points rm. Per step, with k = k(z, B) (BLOCK_M, S):
    gd (T = targets):          w = (k - T) k,  z <- z + Step ((sum_s w) z - w B)
    fixed point (T = coeffs a): w = a k,       z <- (w B) / (sum_s w)  where |sum_s w| > tiny
    Params = [gamma, tiny] in the compute dtype."""
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rd = tl.arange(0, BLOCK_D)
    row_ok = rm < b
    z_mask = row_ok[:, None] & (rd[None, :] < D)
    z_offs = rm.to(tl.int64)[:, None] * D + rd[None, :]
    z = tl.load(Z0 + z_offs, mask=z_mask, other=0.0).to(ACC)
    gamma = tl.load(Params)
    tiny = tl.load(Params + 1)
    if not FIXED_POINT:
        step = tl.load(Step + rm, mask=row_ok, other=0.0).to(ACC)
    for _ in range(steps):
        zz = tl.sum(z * z, 1)
        wsum = tl.zeros((BLOCK_M,), dtype=ACC)
        wb = tl.zeros((BLOCK_M, BLOCK_D), dtype=ACC)
        for s0 in range(0, S, BLOCK_S):
            rs = s0 + tl.arange(0, BLOCK_S)
            s_ok = rs < S
            bt = tl.load(B + rs.to(tl.int64)[:, None] * D + rd[None, :],
                         mask=s_ok[:, None] & (rd[None, :] < D), other=0.0).to(ACC)
            zb = tl.dot(z, tl.trans(bt), input_precision=PRECISION)
            d2 = tl.maximum(zz[:, None] + tl.sum(bt * bt, 1)[None, :] - 2.0 * zb, 0.0)
            k = tl.exp(-gamma * d2)
            t = tl.load(T + rm.to(tl.int64)[:, None] * S + rs[None, :],
                        mask=row_ok[:, None] & s_ok[None, :], other=0.0).to(ACC)
            if FIXED_POINT:
                w = t * k
            else:
                w = (k - t) * k
            w = tl.where(s_ok[None, :], w, 0.0)
            wsum += tl.sum(w, 1)
            wb = tl.dot(w, bt, wb, input_precision=PRECISION)
        if FIXED_POINT:
            # a vanishing denominator has no fixed point: keep the iterate (as the reference)
            ok = tl.abs(wsum) > tiny
            z = tl.where(ok[:, None], wb / tl.where(ok, wsum, 1.0)[:, None], z)
        else:
            z = z + step[:, None] * (wsum[:, None] * z - wb)
    tl.store(Out + z_offs, z.to(Out.dtype.element_ty), mask=z_mask)


# ------------------------------------------------------------------------------------ launchers

def _launch(Z0, B, T, step, gamma: float, steps: int, fixed_point: bool, precision: str):
    """The fused solver's result, or None (after a warning) when it does not fit on chip."""
    Z0, B, T = Z0.contiguous(), B.contiguous(), T.contiguous()
    b, D = Z0.shape
    S = B.shape[0]
    out = C.empty((b, D), Z0.dtype, Z0.device)
    if b == 0:
        return out
    method = "fixed_point" if fixed_point else "gd"
    if D > MAX_D[Z0.dtype]:
        return _fallback(method, f"D={D} > {MAX_D[Z0.dtype]} for {Z0.dtype}")
    tiny = torch.finfo(Z0.dtype).tiny ** 0.5
    BLOCK_D = C.block(D, 16, 1024)
    f64 = Z0.dtype == torch.float64
    # registers per thread stay ~flat: z, w B and a B tile each hold BLOCK_M (or BLOCK_S) x D
    num_warps = 4 if BLOCK_D <= 128 else (8 if BLOCK_D <= 512 else 16)
    try:
        _preimage_kernel[(triton.cdiv(b, 16),)](
            Z0, B, T, step if step is not None else Z0,
            C.scalars(Z0.device, Z0.dtype, gamma, tiny), out, b, S, D, int(steps),
            FIXED_POINT=fixed_point, BLOCK_M=16, BLOCK_S=16 if (f64 or BLOCK_D > 256) else 32,
            BLOCK_D=BLOCK_D, PRECISION=C.dot_precision(Z0.dtype, precision),
            ACC=C.acc_type(Z0.dtype), num_warps=num_warps, num_stages=2)
    except triton.runtime.errors.OutOfResources as exc:
        return _fallback(method, f"D={D} does not fit this GPU ({exc})")
    return out


def _fallback(method: str, why: str) -> None:
    warnings.warn(f"Triton pre-image ({method}) keeps each point's iterate on chip: {why}; "
                  "running the torch reference instead", RuntimeWarning, stacklevel=4)
    return None


def preimage_gd(Z0, B, T, gamma: float, steps: int, lr: torch.Tensor, precision: str = C.DEFAULT_PRECISION):
    """Same contract as geomkern.ops.preimage.gd_reference; lr: (b,) per-point steps."""
    step = (4.0 * gamma * lr).contiguous()  # the reference's step, computed the same way
    out = _launch(Z0, B, T, step, gamma, steps, False, precision)
    return gd_reference(Z0, B, T, gamma, steps, lr) if out is None else out


def preimage_fixed_point(Z0, B, A, gamma: float, steps: int, precision: str = C.DEFAULT_PRECISION):
    """Same contract as geomkern.ops.preimage.fixed_point_reference; A: (b, S) coefficients."""
    out = _launch(Z0, B, A, None, gamma, steps, True, precision)
    return fixed_point_reference(Z0, B, A, gamma, steps) if out is None else out


# --------------------------------------------------------------------------------- registration

_dispatch.register("preimage_gd", "triton", devices=C.DEVICES)(preimage_gd)
_dispatch.register("preimage_fixed_point", "triton", devices=C.DEVICES)(preimage_fixed_point)
