"""Host-side helpers shared by the Triton launchers: output allocation, dtypes, block sizes."""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from ..._validate import DEFAULT_PRECISION, PRECISIONS  # noqa: F401  (the public choices)


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


def dot_precision(dtype: torch.dtype, precision: str) -> str:
    """tl.dot's input_precision: "tf32"/"tf32x3" only change float32 operands (float64 is exact,
    float16/bfloat16 use the tensor cores natively): others get "ieee"."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    return precision if dtype == torch.float32 else "ieee"


def dot_operands(t: torch.Tensor) -> torch.Tensor:
    """bfloat16 tl.dot is wrong in the interpreter: there, feed it float32 (bf16 products are exact
    in float32, so this is the GPU kernel's math); on a GPU the tensor is used as is."""
    return t.float() if t.dtype == torch.bfloat16 and interpreting() else t


def block(n: int, lo: int = 16, hi: int = 64) -> int:
    """A power-of-two tile edge for n elements, clamped to [lo, hi] (tl.dot needs >= 16)."""
    return max(lo, min(hi, triton.next_power_of_2(max(1, int(n)))))
