"""The Triton launchers as torch operators, ``torch.ops.geomkern_triton.*``, registered with
torch.library.triton_op: inside torch.compile on a GPU, their kernels (every launcher starts them
through _common.launch, which hands them to torch.library.wrap_triton while torch traces) are
part of the graph instead of one opaque call. Import this module to register them::

    import geomkern.backends.triton.operators  # noqa: F401
    torch.ops.geomkern_triton.rbf_gram(X, None, gamma, False, "tf32x3")

Each family module names its operators in ``OPERATORS`` ({name: function}, the schema read from
the function's annotations); nothing here is per op. Each function first runs the checks that
read no tensor values, the same ones (and messages) as the public op's (geomkern/ops/<family>.py;
issue 44): a bad name, count, shape, dtype or device stops it before a launch, and stops
torch.compile while it traces. The value checks (NaN/Inf) stay with the public ops: inside a
traced graph they would be data-dependent.

It is not imported with geomkern: triton_op imports torch._dynamo and torch._inductor (1.1 s
measured on this project's CPU machine), which eager use never needs. The public ops
(``gk.rbf_gram`` ...) stay ``torch.ops.geomkern.*`` custom operators either way.
"""
from __future__ import annotations

from torch.library import triton_op

from . import FAMILIES, triton, why_not

if triton is None:  # no family was imported: nothing to register
    raise ImportError(why_not())

# name -> the registered operator (torch.library.CustomOpDef), every family's
OPERATORS = {name: triton_op(f"geomkern_triton::{name}", mutates_args=())(fn)
             for family in FAMILIES for name, fn in getattr(family, "OPERATORS", {}).items()}
