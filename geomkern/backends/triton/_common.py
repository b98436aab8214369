"""Host-side helpers shared by the Triton launchers: output allocation, dtypes, block sizes."""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from torch.library import wrap_triton

from ..._validate import DEFAULT_PRECISION, PRECISIONS  # noqa: F401  (the public choices)
from ..._validate import precision as _validate_precision
from ...ops.rbf import shift_rows


def launch(kernel):
    """kernel, launchable as ``launch(kernel)[grid](...)``: every launcher starts its kernels so.

    Inside a trace (torch.compile, or the torch.library.triton_op operators of
    geomkern.backends.triton.operators being traced on fake or functional tensors) it is
    torch.library.wrap_triton(kernel), so the kernel enters the graph. In eager mode it is the
    kernel itself: wrap_triton dispatches every eager launch through a higher-order operator,
    which torch's own triton_op skips in eager mode ("slow enough to matter (~1ms)",
    torch.library's set_wrap_triton_enabled) and whose side table keeps every launch's non-tensor
    arguments (the pre-image's TensorDescriptors, and so their tensors) for the life of the
    process. On the H100 the Gram's launcher took 847 us a call against 205 us before the launches
    went through wrap_triton (kernel 168 us both times; GPU sessions 9 and 11)."""
    return wrap_triton(kernel) if tracing() else kernel


def tracing() -> bool:
    """Whether torch is tracing this call (dynamo, or a fake / functional / proxy dispatch mode)
    rather than running it on real tensors."""
    keys = torch._C._TorchDispatchModeKey
    return torch.compiler.is_compiling() or any(
        torch._C._get_dispatch_mode(k) is not None for k in (keys.FAKE, keys.FUNCTIONAL, keys.PROXY))


def empty(shape, dtype: torch.dtype, device) -> torch.Tensor:
    """Every buffer a launcher allocates comes from here (tests swap in a NaN-filled version so an
    element a kernel fails to write shows up)."""
    return torch.empty(shape, dtype=dtype, device=device)


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


# Device types the kernels serve: CUDA tensors, and CPU tensors under the interpreter (which must
# be switched on before triton is imported).
DEVICES = ("cuda", "cpu") if interpreting() else ("cuda",)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 stays float64; float32 and the half types accumulate in float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def acc_type(dtype: torch.dtype):
    return tl.float64 if dtype == torch.float64 else tl.float32


def scalars(device, dtype: torch.dtype, *values: float) -> torch.Tensor:
    """Scalars for a kernel in its compute dtype, passed by pointer: a Python float argument is a
    float32 in the interpreter, which would round gamma for float64 inputs. Filled on the device
    (no host-to-device copy, which would synchronise)."""
    out = torch.full((len(values),), values[0], dtype=compute_dtype(dtype), device=device)
    for i, v in enumerate(values[1:], 1):
        out[i] = v
    return out


# How the kernels issue a "tf32x3" product (three TF32 tensor-core products per float32
# multiply-add: hi*hi + hi*lo + lo*hi):
#   "split"   (default) the kernel splits each float32 operand itself (hi = x rounded to TF32's
#             10-bit mantissa by integer ops, lo = x - hi, exact) and issues three "tf32" dots into
#             a fresh accumulator per K step, small products first, added to the running sum with
#             one FADD (``mma``). Compiled for sm_90 the 128 x 128 x 32 GEMM step is 290 SASS
#             instructions per warp against 499 for "builtin"; both wait on each of the three wgmma
#             groups (WARPGROUP.DEPBAR, pendings 0). Measured on an H100: 6-13% faster than
#             "builtin" in every kernel at the same error (docs/gpu-model.md).
#   "builtin" tl.dot(input_precision="tf32x3"): Triton's own split (cvt.rna.tf32 per operand and
#             product).
# scripts/tf32x3_schemes.py times both (and a K-concatenated plain tf32 GEMM) on a GPU, with
# their errors against float64; GEOMKERN_TF32X3 picks one for a process (the measurement's switch).
TF32X3_SCHEMES = ("split", "builtin")
TF32X3 = os.environ.get("GEOMKERN_TF32X3", "split")
if TF32X3 not in TF32X3_SCHEMES:
    raise ValueError(f"GEOMKERN_TF32X3={TF32X3!r}: choose one of {TF32X3_SCHEMES}")


def dot_precision(dtype: torch.dtype, precision: str) -> str:
    """The PRECISION constexpr the kernels pass to ``mma``: "tf32"/"tf32x3" only change float32
    operands (float64 is exact, float16/bfloat16 use the tensor cores natively): others get
    "ieee". float32 "tf32x3" becomes "tf32x3split" under the "split" scheme (above)."""
    precision = _validate_precision(precision)  # the public ops' own refusal, word for word
    if dtype != torch.float32:
        return "ieee"
    return "tf32x3split" if precision == "tf32x3" and TF32X3 == "split" else precision


@triton.jit
def _tf32_round(x):
    """x (float32) rounded to nearest on TF32's 10 mantissa bits (integer add of half an ulp, then
    the low 13 bits cleared; a carry into the exponent is the correct rounding)."""
    bits = x.to(tl.uint32, bitcast=True)
    return ((bits + 0x1000) & 0xFFFFE000).to(tl.float32, bitcast=True)


@triton.jit
def _tf32_split(x):
    """x = hi + lo exactly: hi = x rounded to nearest on TF32's 10 mantissa bits (integer add of
    half an ulp, then the low 13 bits cleared; a carry into the exponent is the correct rounding),
    lo = x - hi (|lo| <= 2^-11 |x|, exact in float32). The tensor core truncates lo to TF32 too,
    so a product loses about 2^-22 relative: far below float32 accumulation error."""
    hi = _tf32_round(x)
    return hi, x - hi


@triton.jit
def mma(a, b, acc, PRECISION: tl.constexpr):
    """acc + a @ b on the tensor cores as PRECISION says (see dot_precision): every kernel's dot
    goes through here, so a scheme change reaches all of them. acc: the accumulator tile (float32,
    or float64 for float64 operands), never None.

    Kernels call it by this name (``from ._common import mma``), not through a module alias such as
    ``C.mma``: torch.compile (Inductor) copies a kernel with the @triton.jit functions it names,
    and a module alias does not come along (tests/geomkern/test_triton.py checks every kernel)."""
    # out_dtype: acc's (float64 for float64 operands): triton 3.6 (the GPU image's) takes
    # float32 unless told, and refuses a float64 accumulator then
    if PRECISION == "tf32x3split":
        a_hi, a_lo = _tf32_split(a.to(tl.float32))
        b_hi, b_lo = _tf32_split(b.to(tl.float32))
        # The three products go to a fresh accumulator, added to acc with one float32 FADD: the
        # tensor cores align addends to the largest exponent and truncate, so chaining this
        # step's small products into a long-running acc lost them (measured on an H100: 3.5e-6
        # relative on a 4096 x 4096 x 512 product, 3.2e-5 on rbf_matmul, over the 1e-5 bound;
        # with the fresh accumulator 1.5e-7, as Triton's own tf32x3)
        step = tl.dot(a_lo, b_hi, tl.zeros(acc.shape, acc.dtype), input_precision="tf32",
                      out_dtype=acc.dtype)
        step = tl.dot(a_hi, b_lo, step, input_precision="tf32", out_dtype=acc.dtype)
        step = tl.dot(a_hi, b_hi, step, input_precision="tf32", out_dtype=acc.dtype)
        return acc + step
    elif PRECISION == "tf32":
        # One TF32 product of operands rounded here (to nearest), as one of the split scheme's
        # three. Triton rewrites "acc + dot(a, b, 0)" into "dot(a, b, acc)", so this product
        # accumulates into the running sum (studies/tf32x3-waits): at tf32's 1e-4-class error
        # that truncation does not show. tl.dot(input_precision="tf32") straight on the loaded
        # tiles was wrong on an H100 under triton 3.6 (GPU session 9, scripts/gpu_findings.py):
        # 1.1e-1 relative on a 300 x D64 Gram and 3.3e-1 on the cross Gram, against the 2.3e-4
        # that TF32 operands give, changing with the tile shape (64 x 64, 4 warps: 2.2e-4 at
        # D64, 9.2e-3 at 4096 x D512) -- while every path whose operands are computed in
        # registers first (tf32x3 split and builtin) was right
        return acc + tl.dot(_tf32_round(a.to(tl.float32)), _tf32_round(b.to(tl.float32)),
                            tl.zeros(acc.shape, acc.dtype), input_precision="tf32",
                            out_dtype=acc.dtype)
    else:
        return tl.dot(a, b, acc, input_precision=PRECISION, out_dtype=acc.dtype)


def dot_operands(t: torch.Tensor) -> torch.Tensor:
    """bfloat16 tl.dot is wrong in the interpreter: there, feed it float32 (bf16 products are exact
    in float32, so this is the GPU kernel's math); on a GPU the tensor is used as is."""
    return t.float() if t.dtype == torch.bfloat16 and interpreting() else t


def shifted(*tensors: torch.Tensor, by: torch.Tensor | None = None) -> list[torch.Tensor]:
    """The reference's common shift (geomkern.ops.rbf.shift_rows: the mean of the rows of ``by``,
    default all the tensors, subtracted from each; on an H100 an offset cloud lost ~1e-4 in
    float32 without it, 1e-7 with it). float16/bfloat16 inputs are returned as they are:
    rounding the shifted copy back to 11 (8) bits moves each point by up to 2^-11 of its
    distance to the shift, more than the float32 cancellation it would remove."""
    if tensors[0].dtype not in (torch.float32, torch.float64):
        return [t.contiguous() for t in tensors]
    return shift_rows(*tensors, by=by)


def block(n: int, lo: int = 16, hi: int = 64) -> int:
    """A power-of-two tile edge for n elements, clamped to [lo, hi] (tl.dot needs >= 16)."""
    return max(lo, min(hi, triton.next_power_of_2(max(1, int(n)))))
