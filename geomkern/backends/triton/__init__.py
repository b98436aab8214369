"""Loader for the Triton kernels (one module per op family: rbf, kpca, preimage, kmeans).

Importing this package registers the Triton implementations with the dispatcher when ``triton``
imports; when it does not, ``is_available()`` is False and ``load_error()`` says why. Nothing here
imports triton at geomkern's import time: the dispatcher imports this package on first use.

The kernels run on CUDA tensors; with ``TRITON_INTERPRET=1`` set before this package is imported
they run (slowly, for tests) on CPU tensors. None is preferred by ``auto``: an op moves to Triton
only once a recorded GPU benchmark (benchmarks/test_triton_gpu.py) shows it winning.
"""
from __future__ import annotations

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


def is_available() -> bool:
    return triton is not None


def load_error() -> str:
    return _ERROR


if triton is not None:
    from . import kmeans, kpca, preimage, rbf  # noqa: F401,E402  (register implementations)
