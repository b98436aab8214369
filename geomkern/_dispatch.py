"""Backend registry and selection.

Every public op is registered once per backend that implements it. ``auto`` picks, per op and
device type, the first *available* backend from that op's measured preference list; an explicit
backend is used for the ops it implements and the rest fall back to ``reference`` (a backend
that is asked for but not built or not importable is an error naming how to get it).
"""
from __future__ import annotations

import contextvars
import os
from dataclasses import dataclass, field
from typing import Callable

KNOWN_BACKENDS = ("reference", "native", "triton", "cupy")

_HOW_TO_GET = {
    "native": (
        "the compiled extension geomkern._C is built by setup.py: reinstall from the source tree "
        "with `pip install --no-build-isolation .` (needs a C++ compiler and torch installed first)"
    ),
    "triton": "install triton: `pip install triton` (or `pip install geomkern[triton]`)",
    "cupy": "install CuPy for your CUDA (`pip install cupy-cuda12x`); it serves gk.eigh on CUDA tensors",
}


@dataclass
class _OpEntry:
    impls: dict[str, Callable] = field(default_factory=dict)
    # device type ("cpu", "cuda", ...) -> backend names in order of measured preference
    auto_order: dict[str, tuple[str, ...]] = field(default_factory=dict)


_REGISTRY: dict[str, _OpEntry] = {}
_current: contextvars.ContextVar[str | None] = contextvars.ContextVar("geomkern_backend", default=None)


def register(op: str, backend: str, *, auto_on: tuple[str, ...] = ()):
    """Decorator: register ``fn`` as ``backend``'s implementation of ``op``.

    ``auto_on`` lists device types on which ``auto`` prefers this backend over the reference
    (only where a recorded benchmark shows it wins).
    """
    if backend not in KNOWN_BACKENDS:
        raise ValueError(f"unknown backend {backend!r}")

    def deco(fn):
        entry = _REGISTRY.setdefault(op, _OpEntry())
        entry.impls[backend] = fn
        for dev in auto_on:
            order = entry.auto_order.get(dev, ())
            if backend not in order:
                entry.auto_order[dev] = (backend,) + order
        return fn

    return deco


def _backend_is_built(name: str) -> tuple[bool, str]:
    if name == "reference":
        return True, ""
    if name == "native":
        from .backends import native

        return native.is_available(), native.load_error()
    if name == "cupy":
        from .backends import cupy

        if not cupy.is_available():
            return False, cupy.load_error()
    if name == "triton":
        from .backends import triton

        if not triton.is_available():
            return False, triton.load_error()
        if not _triton_can_run():
            return False, ("Triton kernels need a CUDA device here (or TRITON_INTERPRET=1 to run "
                           "them in Triton's CPU interpreter, for testing)")
    if not any(name in e.impls for e in _REGISTRY.values()):
        return False, _HOW_TO_GET[name]
    return True, ""


def _triton_can_run() -> bool:
    import torch

    return torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"


def available_backends() -> list[str]:
    """Backends that are built and importable here, and implement at least one op."""
    _ensure_loaded()
    out = []
    for name in KNOWN_BACKENDS:
        ok, _ = _backend_is_built(name)
        if ok and any(name in e.impls for e in _REGISTRY.values()):
            out.append(name)
    return out


def _check_backend_name(name: str) -> str:
    if not isinstance(name, str):
        raise TypeError(f"backend must be a string, got {type(name).__name__}")
    name = name.strip().lower()
    if name == "auto":
        return name
    if name not in KNOWN_BACKENDS:
        raise ValueError(
            f"backend={name!r} is not a geomkern backend; choose one of "
            f"{('auto',) + KNOWN_BACKENDS}"
        )
    _ensure_loaded()
    ok, why = _backend_is_built(name)
    if not ok:
        raise RuntimeError(f"backend {name!r} is not available: {why}")
    return name


class _BackendContext:
    """Returned by :func:`set_backend`; usable as a context manager that restores the old choice."""

    def __init__(self, token: contextvars.Token):
        self._token = token

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        _current.reset(self._token)
        return False


def set_backend(name: str) -> _BackendContext:
    """Choose the backend: ``"auto"`` (default), ``"reference"``, ``"native"``, ``"triton"``,
    ``"cupy"`` (``gk.eigh`` on CUDA only).

    Works as a plain call (stays in force) and as ``with gk.set_backend("native"): ...``.
    The environment variable ``GEOMKERN_BACKEND`` sets the initial choice.
    """
    return _BackendContext(_current.set(_check_backend_name(name)))


def get_backend() -> str:
    name = _current.get()
    if name is None:
        name = _check_backend_name(os.environ.get("GEOMKERN_BACKEND", "auto") or "auto")
    return name


def resolve(op: str, device_type: str) -> str:
    """The backend that ``op`` runs on for tensors on ``device_type`` under the current choice."""
    _ensure_loaded()
    entry = _REGISTRY[op]
    chosen = get_backend()
    if chosen == "auto":
        for name in entry.auto_order.get(device_type, ()):
            if name in entry.impls and _backend_is_built(name)[0]:
                return name
        return "reference"
    if chosen in entry.impls and _supports_device(chosen, device_type):
        return chosen
    return "reference"


def _supports_device(backend: str, device_type: str) -> bool:
    if backend == "reference":
        return True
    if backend == "native":
        from .backends import native

        return native.supports_device(device_type)
    return device_type == "cuda" or (
        backend == "triton" and os.environ.get("TRITON_INTERPRET") == "1"
    )


def implementation(op: str, device_type: str) -> Callable:
    return _REGISTRY[op].impls[resolve(op, device_type)]


def registered_ops() -> dict[str, tuple[str, ...]]:
    """Every registered op and the backends that implement it."""
    _ensure_loaded()
    return {op: tuple(e.impls) for op, e in sorted(_REGISTRY.items())}


def _ensure_loaded():
    # Fast backends register themselves on import; importing is cheap and idempotent.
    from .backends import cupy, native, triton  # noqa: F401
