"""Backend registry and selection. Pure: it imports nothing from geomkern and knows no backend.

A backend is a module that, on import, describes itself once with :func:`register_backend`
(is it usable here, and if not why and how to get it) and registers each op it implements with
:func:`register`, naming the device types that implementation serves. ``geomkern.backends``
declares which modules are backends (:func:`declare_backend`); they are imported on the first
dispatch, so a slow import (Triton) costs nothing until an op runs.

Selection, per op and device type: ``auto`` takes the first backend of the op's measured
preference list for that device type that is usable and serves it; an explicit backend is used
where it serves the device, and the reference everywhere else (a backend that is asked for but is
not usable here is an error saying why).
"""
from __future__ import annotations

import contextvars
import importlib
import os
from dataclasses import dataclass, field
from typing import Callable

KNOWN_BACKENDS = ("reference", "native", "triton", "cupy")
ANY_DEVICE = "*"


@dataclass(frozen=True)
class Backend:
    """What the registry needs to know about a backend: ``why_not()`` is "" when it is usable
    here, otherwise one sentence saying what is missing and how to get it."""

    name: str
    why_not: Callable[[], str]

    def available(self) -> bool:
        return not self.why_not()


@dataclass
class _OpEntry:
    # backend -> device type ("cpu", "cuda", ... or ANY_DEVICE) -> implementation
    impls: dict[str, dict[str, Callable]] = field(default_factory=dict)
    # device type -> backend names in order of measured preference
    auto_order: dict[str, tuple[str, ...]] = field(default_factory=dict)


_BACKENDS: dict[str, Backend] = {"reference": Backend("reference", lambda: "")}
_DECLARED: dict[str, str] = {}  # backend name -> module that registers it when imported
_REGISTRY: dict[str, _OpEntry] = {}
_current: contextvars.ContextVar[str | None] = contextvars.ContextVar("geomkern_backend", default=None)


def _known(name: str) -> str:
    if name not in KNOWN_BACKENDS:
        raise ValueError(f"unknown backend {name!r}; known: {KNOWN_BACKENDS}")
    return name


def declare_backend(name: str, module: str) -> None:
    """``module`` (a dotted path) registers backend ``name`` when imported."""
    _DECLARED[_known(name)] = module


def register_backend(name: str, *, why_not: Callable[[], str]) -> None:
    """Describe backend ``name``: ``why_not()`` returns "" when it is usable here."""
    _BACKENDS[_known(name)] = Backend(name, why_not)


def register(op: str, backend: str, *, devices: tuple[str, ...] = (ANY_DEVICE,),
             auto_on: tuple[str, ...] = ()):
    """Decorator: register ``fn`` as ``backend``'s implementation of ``op`` for tensors on
    ``devices`` (device types; ``ANY_DEVICE`` for all).

    ``auto_on`` lists device types on which ``auto`` prefers this backend over the reference
    (only where a recorded benchmark shows it wins).
    """
    _known(backend)

    def deco(fn):
        entry = _REGISTRY.setdefault(op, _OpEntry())
        per_device = entry.impls.setdefault(backend, {})
        for dev in devices:
            per_device[dev] = fn
        for dev in auto_on:
            order = entry.auto_order.get(dev, ())
            if backend not in order:
                entry.auto_order[dev] = (backend,) + order
        return fn

    return deco


def _load() -> None:
    for name, module in list(_DECLARED.items()):
        if name not in _BACKENDS:
            importlib.import_module(module)


def why_not(name: str) -> str:
    """"" when backend ``name`` is usable here and implements an op, else the reason."""
    _load()
    backend = _BACKENDS.get(name)
    if backend is None:
        return f"no module registered backend {name!r}"
    reason = backend.why_not()
    if not reason and not any(name in e.impls for e in _REGISTRY.values()):
        reason = f"backend {name!r} implements no op in this build"
    return reason


def available_backends() -> list[str]:
    """Backends that are usable here and implement at least one op."""
    return [name for name in KNOWN_BACKENDS if not why_not(name)]


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
    reason = why_not(name)
    if reason:
        raise RuntimeError(f"backend {name!r} is not available: {reason}")
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


def serves(op: str, backend: str, device_type: str) -> bool:
    """Whether ``backend`` has an implementation of ``op`` for tensors on ``device_type``."""
    _load()
    per_device = _REGISTRY[op].impls.get(backend, {})
    return device_type in per_device or ANY_DEVICE in per_device


def resolve(op: str, device_type: str) -> str:
    """The backend that ``op`` runs on for tensors on ``device_type`` under the current choice."""
    _load()
    chosen = get_backend()
    candidates = _REGISTRY[op].auto_order.get(device_type, ()) if chosen == "auto" else (chosen,)
    for name in candidates:
        if serves(op, name, device_type) and _BACKENDS[name].available():
            return name
    return "reference"


def implementation(op: str, device_type: str) -> Callable:
    per_device = _REGISTRY[op].impls[resolve(op, device_type)]
    return per_device.get(device_type) or per_device[ANY_DEVICE]


def registered_ops() -> dict[str, tuple[str, ...]]:
    """Every registered op and the backends that implement it."""
    _load()
    return {op: tuple(e.impls) for op, e in sorted(_REGISTRY.items())}
