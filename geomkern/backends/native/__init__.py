"""Loader for the compiled extension ``geomkern._C`` (csrc/): CPU C++/OpenMP kernels, plus
``geomkern._C_cuda`` (csrc/cuda/, see cuda.py) where it was built.

Importing this module registers the native implementations with the dispatcher when the
extension is built; when it is not, ``is_available()`` is False and ``load_error()`` says why.
"""
from __future__ import annotations

_C = None
_ERROR = ""
try:
    from ... import _C  # type: ignore[attr-defined,no-redef]
except ImportError as exc:  # not built, or built against another torch
    _ERROR = (
        f"geomkern._C could not be imported ({exc}); it is built by setup.py: reinstall from the "
        "source tree with `pip install --no-build-isolation .` (needs a C++ compiler and torch "
        "installed first)"
    )


def is_available() -> bool:
    return _C is not None


def load_error() -> str:
    return _ERROR


def supports_device(device_type: str) -> bool:
    if _C is None:
        return False
    return device_type in _C.devices() or (device_type == "cuda" and cuda.is_available())


if _C is not None:
    from . import ops  # noqa: F401  (registers implementations)
    from . import cuda  # (after ops: wraps its registrations with the CUDA kernels of _C_cuda, if built)
