"""Loader for the Triton kernels (one module per op family: rbf, kpca, preimage, kmeans).

Importing this package describes the backend to the dispatcher (``why_not``: triton missing, or
no CUDA device and no interpreter) and registers the Triton implementations when ``triton``
imports, for the device types of ``_common.DEVICES``. Nothing here
imports triton at geomkern's import time: the dispatcher imports this package on first use.

The kernels run on CUDA tensors; with ``TRITON_INTERPRET=1`` set before this package is imported
they run (slowly, for tests) on CPU tensors. ``auto`` takes Triton on CUDA for rbf_gram, rbf_matmul
and project_onto_basis, the ops a recorded H100 benchmark measured faster than the reference (the
notes at their registrations). Every kernel is launched through ``_common.launch`` (the kernel
itself in eager mode, torch.library.wrap_triton while torch traces); importing
``geomkern.backends.triton.operators`` registers the operators each family names in its
``OPERATORS`` (rbf_gram, rbf_matmul, project_onto_basis, kmeans_assign) as torch operators too
(``torch.ops.geomkern_triton.*``, torch.library.triton_op), for torch.compile on a GPU.
"""
from __future__ import annotations

import os

import torch

from ... import _dispatch

_ERROR = ""
try:
    import triton  # noqa: F401
except ImportError as exc:
    triton = None
    _ERROR = (
        f"triton could not be imported ({exc}); install it with `pip install triton` (or "
        "`pip install geomkern[triton]`); its kernels run on CUDA tensors, or on CPU tensors "
        "under TRITON_INTERPRET=1 (slow, for tests)"
    )


def why_not(device_type: str | None = None) -> str:  # the same on every device type it serves
    if triton is None:
        return _ERROR
    if not (torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"):
        return ("Triton kernels need a CUDA device here (or TRITON_INTERPRET=1 to run them in "
                "Triton's CPU interpreter, for testing)")
    return ""


_dispatch.register_backend("triton", why_not=why_not)

# The op families, one module each (kmeans, kpca, preimage, rbf): every public module here but
# operators.py, none without triton. Each registers its implementations when imported and names
# the torch operators it has in OPERATORS (operators.py registers them); a new family is its
# module, found here.
FAMILIES: tuple = ()
if triton is not None:
    from .. import families  # noqa: E402

    FAMILIES = families(__name__, __path__, skip=("operators",))
