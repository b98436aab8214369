"""Loader for the compiled extension ``geomkern._C`` (csrc/): CPU C++/OpenMP kernels.

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
    return _C is not None and device_type in _C.devices()


if _C is not None:
    from . import ops  # noqa: F401  (registers implementations)
