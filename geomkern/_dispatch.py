"""Backend registry and selection. Pure: it imports nothing from geomkern and knows no backend.

A backend is a module that, on import, describes itself once with :func:`register_backend`
(is it usable here, and if not why and how to get it) and registers each op it implements with
:func:`register`, naming the device types that implementation serves. ``geomkern.backends``
declares which modules are backends (:func:`declare_backend`); they are imported on the first
dispatch, so a slow import (Triton) costs nothing until an op runs.

Selection, per op and device type: ``auto`` takes the first backend of the op's measured
preference list for that device type that is usable on it and serves it; an explicit backend is
used where it serves the device, and the reference everywhere else. Availability is per device
type (``why_not(name, device_type)``): a backend that is asked for but is not usable here is an
error saying why, at ``set_backend`` (not usable on any device type) or at the dispatch of an op
it serves on a device type it cannot run on (e.g. native on CUDA tensors where geomkern was not
compiled with CUDA). Where ``auto`` passes over a preferred backend it says so once per process
and device type: a ``RuntimeWarning`` when the backend is installed but broken (a compiled
extension that exists and does not load), an INFO line on the "geomkern" logger when it is simply
absent (never built, not installed: a supported set-up).
"""
from __future__ import annotations

import contextvars
import importlib
import logging
import os
import warnings
from dataclasses import dataclass, field
from typing import Callable

KNOWN_BACKENDS = ("reference", "native", "triton", "cupy")
ANY_DEVICE = "*"


def _never_broken(device_type: str) -> bool:
    return False


@dataclass(frozen=True)
class Backend:
    """What the registry needs to know about a backend. ``why_not(device_type)`` is "" when it can
    run on tensors of that device type here, otherwise one sentence saying what is missing and how
    to get it; ``why_not(None)`` answers for the backend as a whole ("" when it can run on some
    device type). ``broken(device_type)`` is True when it is installed for that device type but
    fails to load (then ``auto`` warns when it falls back, rather than logging)."""

    name: str
    why_not: Callable[[str | None], str]
    broken: Callable[[str], bool] = _never_broken

    def available(self, device_type: str | None = None) -> bool:
        return not self.why_not(device_type)


@dataclass
class _OpEntry:
    # backend -> device type ("cpu", "cuda", ... or ANY_DEVICE) -> implementation
    impls: dict[str, dict[str, Callable]] = field(default_factory=dict)
    # device type -> backend names in order of measured preference
    auto_order: dict[str, tuple[str, ...]] = field(default_factory=dict)


# Public functions that dispatch to one of several registered ops, picked by their ``method``
# argument: public name -> (the function's default method, method -> registered op). resolve()
# takes these names with the same ``method`` choice and default as the function, so a user
# can ask about ``gk.preimage`` without knowing the internal op names. Kept in step with
# geomkern.ops.preimage.METHODS by tests/geomkern/test_dispatch.py.
METHOD_OPS: dict[str, tuple[str, dict[str, str]]] = {
    "preimage": ("gd", {"gd": "preimage_gd", "fixed_point": "preimage_fixed_point",
                        "coordinates": "preimage_coordinates"}),
}

_BACKENDS: dict[str, Backend] = {"reference": Backend("reference", lambda device_type=None: "")}
_DECLARED: dict[str, str] = {}  # backend name -> module that registers it when imported
_REGISTRY: dict[str, _OpEntry] = {}
_current: contextvars.ContextVar[str | None] = contextvars.ContextVar("geomkern_backend", default=None)
_REPORTED: set[tuple[str, str]] = set()  # (backend, device type) whose fallback auto has reported
_log = logging.getLogger("geomkern")


def _known(name: str) -> str:
    if name not in KNOWN_BACKENDS:
        raise ValueError(f"unknown backend {name!r}; known: {KNOWN_BACKENDS}")
    return name


def declare_backend(name: str, module: str) -> None:
    """``module`` (a dotted path) registers backend ``name`` when imported."""
    _DECLARED[_known(name)] = module


def register_backend(name: str, *, why_not: Callable[[str | None], str],
                     broken: Callable[[str], bool] = _never_broken) -> None:
    """Describe backend ``name``: ``why_not(device_type)`` returns "" when it is usable on that
    device type here (None: on some device type); ``broken(device_type)`` whether it is installed
    there but fails to load (see :class:`Backend`)."""
    _BACKENDS[_known(name)] = Backend(name, why_not, broken)


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


def why_not(name: str, device_type=None) -> str:
    """Why backend ``name`` cannot run here: "" when it is usable (its dependencies are present,
    e.g. a built ``geomkern._C`` for ``"native"``, Triton and a GPU or ``TRITON_INTERPRET=1``
    for ``"triton"``) and implements at least one op; otherwise one sentence saying what is
    missing and how to get it. ``name`` is one of ``KNOWN_BACKENDS``; ``gk.set_backend`` raises
    this reason for a backend that is asked for but not usable. ``why_not("reference")`` is
    always "".

    device_type (``"cpu"``, ``"cuda"``, ``"cuda:0"`` or a ``torch.device``): answer for tensors
    of that type only, e.g. ``why_not("native", "cuda")`` says "geomkern was not compiled with
    CUDA" and how to get it where ``geomkern._C_cuda`` was not built, and an op that native
    serves on CUDA raises that reason under ``gk.set_backend("native")``.
    """
    _load()
    backend = _BACKENDS.get(name)
    if backend is None:
        return f"no module registered backend {name!r}"
    dev = None if device_type is None else _device_type(device_type)
    reason = backend.why_not(dev)
    if not reason and not any(name in e.impls and (dev is None or serves(op, name, dev))
                              for op, e in _REGISTRY.items()):
        where = "" if dev is None else f" for {dev} tensors"
        reason = f"backend {name!r} implements no op{where} in this build"
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


def op_names() -> list[str]:
    """Every name :func:`resolve` accepts: the registered ops and the public names in METHOD_OPS."""
    _load()
    return sorted(set(_REGISTRY) | set(METHOD_OPS))


def _registered_op(op: str, method: str | None) -> str:
    """The registered op behind ``op`` (a registered op, or a public name of METHOD_OPS with its
    ``method``); ValueError naming the argument and the choices otherwise."""
    if not isinstance(op, str):
        raise TypeError(f"op must be a string, got {type(op).__name__}")
    if op in METHOD_OPS:
        default, variants = METHOD_OPS[op]
        m = default if method is None else method
        if not isinstance(m, str) or m not in variants:
            raise ValueError(f"method={m!r} is not a method of {op!r}; choose one of {tuple(variants)}")
        return variants[m]
    if op not in _REGISTRY:
        raise ValueError(f"op={op!r} is not a geomkern op; choose one of {op_names()}")
    if method is not None:
        raise ValueError(f"method is only taken for {sorted(METHOD_OPS)}, not for op={op!r}; "
                         "leave method out")
    return op


def resolve(op: str, device_type, *, method: str | None = None) -> str:
    """The backend that ``op`` runs on for tensors on ``device_type`` under the current backend choice
    (``gk.set_backend``): ``"reference"``, ``"native"``, ``"triton"`` or ``"cupy"``.

    op: a public op name (``"rbf_gram"``, ``"rbf_matmul"``, ``"kpca"``, ``"project_onto_basis"``,
    ``"preimage"``, ``"kmeans"``, ``"eigh"``, ``"class_moments"``, ``"sqrtm_psd"``) or any
    registered op of :func:`registered_ops`. ``gk.preimage`` runs one registered op per method:
    ``resolve("preimage", dev, method=m)`` answers for ``gk.preimage(..., method=m)`` (the ops
    ``preimage_gd``, ``preimage_fixed_point``, ``preimage_coordinates``); ``method`` defaults to
    ``"gd"``, gk.preimage's default, and is refused for every other op. An unknown op is a
    ValueError listing the names that exist.
    device_type: a device type (``"cpu"``, ``"cuda"``), a device string with an index
    (``"cuda:0"``) or a ``torch.device``; only its type matters.

    E.g. under ``auto``, ``resolve("preimage", "cpu", method="fixed_point")`` is ``"native"``
    where ``geomkern._C`` is built for AVX2 or wider (measured faster there) and ``"reference"``
    elsewhere. Under an explicit backend that serves the op on that device type but cannot run
    there (:func:`why_not` with the device type), it raises RuntimeError with the reason, as the
    op itself would.
    """
    _load()
    return _resolve(_registered_op(op, method), _device_type(device_type))


def _device_type(device_type) -> str:
    """The bare device type of a device type string, a device string ("cuda:0") or a torch.device."""
    dev = device_type if isinstance(device_type, str) else getattr(device_type, "type", None)
    if not isinstance(dev, str):
        raise TypeError(f"device_type must be a device type string ('cpu', 'cuda') or a torch.device, "
                        f"got {type(device_type).__name__}")
    return dev.split(":", 1)[0]


def _resolve(op: str, device_type: str) -> str:
    """:func:`resolve` for a registered op and a bare device type (the dispatch path)."""
    _load()
    chosen = get_backend()
    if chosen != "auto":
        if not serves(op, chosen, device_type):
            return "reference"
        reason = _BACKENDS[chosen].why_not(device_type)
        if reason:
            raise RuntimeError(f"backend {chosen!r} was asked for (gk.set_backend or GEOMKERN_BACKEND) "
                               f"but cannot run {op} on {device_type} tensors here: {reason}; "
                               "gk.set_backend('auto') runs it on the reference instead")
        return chosen
    for name in _REGISTRY[op].auto_order.get(device_type, ()):
        if serves(op, name, device_type):
            reason = _BACKENDS[name].why_not(device_type)
            if not reason:
                return name
            _report_fallback(name, device_type, op, reason)
    return "reference"


def _report_fallback(name: str, device_type: str, op: str, reason: str) -> None:
    """``auto`` passed over ``name``, preferred for ``op`` on ``device_type``: say so once per process."""
    if (name, device_type) in _REPORTED:
        return
    _REPORTED.add((name, device_type))
    msg = (f"geomkern: {op} (and every op auto prefers {name!r} for) runs on the torch reference for "
           f"{device_type} tensors, not on the {name!r} backend: {reason}")
    if _BACKENDS[name].broken(device_type):
        warnings.warn(msg, RuntimeWarning)
    else:
        _log.info(msg)


def implementation(op: str, device_type: str) -> Callable:
    per_device = _REGISTRY[op].impls[_resolve(op, device_type)]
    return per_device.get(device_type) or per_device[ANY_DEVICE]


def registered_ops() -> dict[str, tuple[str, ...]]:
    """Every registered op (the unit the dispatcher picks a backend for) and the backends that
    have an implementation of it on some device, whether or not they are usable here (see
    :func:`why_not`; :func:`resolve` says which one runs). Most public functions are one op of
    the same name; ``gk.preimage`` is three (``preimage_gd``, ``preimage_fixed_point``,
    ``preimage_coordinates``, one per method), and the Gram step of ``gk.kpca`` is the op
    ``kpca`` (its eigen-solve is torch on every backend). E.g. ``registered_ops()["preimage_gd"]``
    is ``("reference", "native", "triton")`` where Triton is installed; native's kernels are
    listed whether or not its extensions were built (``why_not("native", device_type)`` says).
    """
    _load()
    return {op: tuple(e.impls) for op, e in sorted(_REGISTRY.items())}
