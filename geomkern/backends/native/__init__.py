"""Native backend: the compiled libraries ``geomkern._C`` (csrc/cpu, C++/OpenMP) and
``geomkern._C_cuda`` (csrc/cuda, CUDA C++; built by setup.py with a CUDA build of torch and nvcc,
no GPU needed). Both are plain shared libraries on torch's stable ABI, one build for every torch
>= 2.10 and every Python >= 3.10 (one wheel, CPU and CUDA): loaded with torch.ops.load_library,
their operators are ``torch.ops.geomkern_native.*`` and ``torch.ops.geomkern_cuda.*``.

:func:`kernels` says which compiled kernel serves which op on which device (the native CPU/CUDA
pair), gathered from one module per op family (eigh, kmeans, preimage, rbf: :data:`FAMILIES`, as
backends/triton/ has); an op a device has no kernel for runs on the reference there, as for any
backend. ``auto`` prefers a native kernel only where a recorded benchmark measured it faster (each
family's ``auto`` gives the measurement): the CPU pre-image loops, rbf_matmul and rbf_gram when
geomkern._C runs its AVX2+FMA or AVX-512F variant, the CPU kmeans on every variant. No CUDA kernel
is preferred (eigh.py says why).

Availability is per device type and goes through the registry: ``gk.why_not("native", "cpu")``
answers for geomkern._C, ``gk.why_not("native", "cuda")`` for geomkern._C_cuda: "not compiled with
CUDA" and how to get it, a CPU-only torch, a CUDA major version other than the build's (and the
fix), or, where it loaded, no CUDA device visible. The kernels of an extension that did not load
are registered all the same (:class:`_Missing`), so the registry knows what a build would serve:
``gk.set_backend("native")`` refuses such an op on that device type with the reason, instead of
quietly running the reference, and ``auto`` falls back to the reference and says so once: a
warning when the compiled file is there but does not load (another torch or CUDA, a missing
library), an INFO log line when it was never built or cannot apply here (a pure-torch install, or
the one wheel beside a CPU-only torch, is a supported set-up, not an accident).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from ... import _dispatch
from .. import families
from .eigh import MAX_SWEEPS, eigh_tol  # noqa: F401 (the names tests and scripts use)
from .preimage import span_form  # noqa: F401

# The op families with native kernels, one module each (as backends/triton/), every public module
# of this package: each has kernels(C, C_cuda) -> {op: {device type: implementation}} and auto(C)
# -> {device type: ops auto prefers native for}. A new family is its module, found here.
FAMILIES = families(__name__, __path__)

_PACKAGE = Path(__file__).resolve().parents[2]  # geomkern/, where setup.py puts the extensions
_BUILD_CPU = ("it is built by setup.py: reinstall from the source tree with "
              "`pip install --no-build-isolation .` (needs a C++ compiler and torch installed first)")
_BUILD_CUDA = ("setup.py builds it when torch is a CUDA build and a CUDA toolkit is found (`CUDA_HOME`, or "
               "`nvcc` on PATH): reinstall from the source tree with `pip install --no-build-isolation .` "
               "(TORCH_CUDA_ARCH_LIST picks the GPU architectures; GEOMKERN_NO_CUDA=1 skips them)")


@dataclass(frozen=True)
class _Extension:
    """One compiled extension as found at import: the module, or why not ("" when loaded), and
    whether a compiled file was there but failed to load (``broken``) rather than never built."""

    module: object | None
    why_not: str
    broken: bool
    cuda: str | None = None  # geomkern._C_cuda: the CUDA version it was built with ("13.0")


def _compiled_files(name: str) -> list[Path]:
    """The compiled files of extension ``name`` in the package, for any Python or platform."""
    return sorted(p for p in _PACKAGE.glob(f"{name}.*") if p.suffix in (".so", ".pyd"))


_TAGGED = re.compile(r"\[geomkern (ValueError|TypeError)\] (.*)", re.S)
_ERRORS = {"ValueError": ValueError, "TypeError": TypeError}


class _Library:
    """A library of operators registered with torch (``torch.ops.<namespace>``) as the backend
    calls them: by name, with the checks' tagged RuntimeErrors raised as the Python type they name
    (csrc/stable.h: ``[geomkern ValueError] ...``)."""

    def __init__(self, ops):
        self._ops = ops

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        op = getattr(self._ops, name)

        def call(*args, **kwargs):
            try:
                return op(*args, **kwargs)
            except RuntimeError as exc:  # csrc/stable.h: the check says which Python type it is
                m = _TAGGED.search(str(exc))
                if m is None:
                    raise
                raise _ERRORS[m.group(1)](m.group(2)) from None

        call.__name__ = name
        setattr(self, name, call)  # made once: later lookups find it without __getattr__
        return call


class _CpuLibrary(_Library):
    """geomkern._C (``torch.ops.geomkern_native``, csrc/geomkern.cpp), with the variant choice
    checked here so that a bad name is a ValueError with the variants listed."""

    def select_cpu_isa(self, isa: str) -> None:
        names, runnable = self._ops.cpu_isas(False), self._ops.cpu_isas(True)
        if isa not in names:
            raise ValueError(f"'{isa}' is not a variant of this build of geomkern._C (it has: "
                             f"{', '.join(names)}; this CPU runs: {', '.join(runnable)})")
        if isa not in runnable:
            raise ValueError(f"'{isa}' needs instructions this CPU does not have (it runs: "
                             f"{', '.join(runnable)})")
        self._ops.select_cpu_isa(isa)


def _library_file(name: str):
    """The compiled file of geomkern.<name>: <name>.abi3.so where the build made one, else the first
    found; None where there is none."""
    files = _compiled_files(name)
    return next((p for p in files if p.name == f"{name}.abi3.so"), files[0]) if files else None


def _load_cpu(build: str) -> _Extension:
    """geomkern._C: a plain shared library on torch's stable ABI (no Python module), loaded with
    torch.ops.load_library; its operators land in torch.ops.geomkern_native. The same file serves
    every Python >= 3.10 and every torch >= 2.10 (setup.py)."""
    kernels = "the native CPU kernels"
    lib = _library_file("_C")
    if lib is None:
        return _Extension(None, f"{kernels} are unavailable: geomkern._C is not built (no compiled file "
                                f"in {_PACKAGE}); {build}", False)
    try:
        torch.ops.load_library(str(lib))
        ops = torch.ops.geomkern_native
        ops.cpu_isa  # noqa: B018 - raises if the file registered no geomkern_native operators
    except Exception as exc:  # an undefined symbol (torch older than 2.10), a foreign file
        return _Extension(None, f"{kernels} are unavailable: geomkern._C is built ({lib.name}) but "
                                f"cannot be loaded here (torch {torch.__version__}; it needs torch >= 2.10 "
                                f"and a build of this geomkern): {type(exc).__name__}: {exc}; rebuild it for "
                                f"this environment: {build}", True)
    return _Extension(_CpuLibrary(ops), "", False)


def _select_cpu_isa(ext: _Extension, isa: str) -> _Extension:
    """geomkern._C running the instruction-set variant ``isa`` (GEOMKERN_CPU_ISA; "" keeps the widest
    the CPU runs, which the library picks at load), or unavailable, saying why, if it has no such
    variant or the CPU cannot run it."""
    if ext.module is None or not isa:
        return ext
    try:
        ext.module.select_cpu_isa(isa)
    except ValueError as exc:
        return _Extension(None, f"the native CPU kernels are unavailable: GEOMKERN_CPU_ISA={isa!r} is "
                                f"refused: {exc}; unset GEOMKERN_CPU_ISA to run the widest variant this CPU "
                                "supports", True)
    return ext


def _cuda_major(version: str | None) -> int | None:
    """12 for "12.8"; None for no version (a CPU-only torch) or an unparsable one."""
    try:
        return int(str(version).split(".")[0])
    except ValueError:
        return None


def _load_cuda(build: str) -> _Extension:
    """geomkern._C_cuda: a plain shared library on torch's stable ABI (no Python module), loaded
    with torch.ops.load_library; its operators land in torch.ops.geomkern_cuda. It links the CUDA
    runtime statically and loads into any CUDA build of torch >= 2.10 of the CUDA major version it
    was built with (its cuda_version operator says which); beside a CPU-only torch it is not
    loaded at all (it needs libtorch_cuda)."""
    kernels = "the native CUDA kernels"
    lib = _library_file("_C_cuda")
    if lib is None:
        return _Extension(None, f"geomkern was not compiled with CUDA: geomkern._C_cuda is not built (no "
                                f"compiled file in {_PACKAGE}); {build}", False)
    if torch.version.cuda is None:  # the one wheel beside a CPU-only torch: supported, not broken
        return _Extension(None, f"{kernels} are unavailable: torch {torch.__version__} is a CPU-only build "
                                f"(torch.version.cuda is None), and geomkern._C_cuda ({lib.name}) runs on a "
                                "CUDA build of torch: install one (e.g. `pip install torch --index-url "
                                "https://download.pytorch.org/whl/cu130`) on a machine with an NVIDIA GPU",
                          False)
    try:
        torch.ops.load_library(str(lib))
        ops = torch.ops.geomkern_cuda
        built = int(ops.cuda_version())  # raises if the file registered no geomkern_cuda operators
    except Exception as exc:  # an undefined symbol (torch older than 2.10), a foreign file
        return _Extension(None, f"{kernels} are unavailable: geomkern._C_cuda is built ({lib.name}) but "
                                f"cannot be loaded here (torch {torch.__version__}, CUDA {torch.version.cuda}; "
                                f"it needs a CUDA build of torch >= 2.10 and a build of this geomkern): "
                                f"{type(exc).__name__}: {exc}; rebuild it for this environment: {build}", True)
    built_version = f"{built // 1000}.{built % 1000 // 10}"
    if _cuda_major(torch.version.cuda) != built // 1000:
        return _Extension(None, f"{kernels} are unavailable: geomkern._C_cuda ({lib.name}) was built with CUDA "
                                f"{built_version}, but torch {torch.__version__} uses CUDA {torch.version.cuda}; "
                                f"the major versions must match: install a torch built for CUDA {built // 1000} "
                                f"(e.g. `pip install torch --index-url https://download.pytorch.org/whl/"
                                f"cu{built // 1000}0`), or rebuild geomkern against this torch with a CUDA "
                                f"{torch.version.cuda} toolkit: {build}", True)
    return _Extension(_Library(ops), "", False, cuda=built_version)


def _find() -> tuple[_Extension, _Extension]:
    """geomkern._C (on the variant GEOMKERN_CPU_ISA names, if set) and geomkern._C_cuda as this
    process finds them."""
    return (_select_cpu_isa(_load_cpu(_BUILD_CPU),
                            os.environ.get("GEOMKERN_CPU_ISA", "").strip()),
            _load_cuda(_BUILD_CUDA))


_CPU, _CUDA = _find()
_C, _C_cuda = _CPU.module, _CUDA.module


def _no_device() -> str:
    """Why the loaded geomkern._C_cuda cannot run here ("" where a CUDA device is visible). Asked
    when needed, not at import: torch.cuda.is_available() initialises the driver."""
    if torch.cuda.is_available():
        return ""
    return (f"the native CUDA kernels are unavailable: geomkern._C_cuda (CUDA {_CUDA.cuda}) is built and "
            f"loads, but torch {torch.__version__} sees no CUDA device (torch.cuda.is_available() is "
            "False: no NVIDIA GPU, no driver, or CUDA_VISIBLE_DEVICES hides them); they run on a "
            "machine with an NVIDIA GPU and its driver")


def why_not(device_type: str | None = None) -> str:
    """"" when the native kernels for ``device_type`` ("cpu": geomkern._C, "cuda":
    geomkern._C_cuda and a CUDA device) are built, load and can run, else why not and how to get
    them; None: "" when either can."""
    if device_type is None:
        return _CPU.why_not if why_not("cuda") else ""
    if device_type == "cpu":
        return _CPU.why_not
    if device_type == "cuda":
        return _CUDA.why_not or _no_device()
    return f"the native backend has kernels for cpu and cuda tensors only, not {device_type}"


def cpu_isa() -> str | None:
    """The instruction-set variant of the native CPU kernels that runs here: "avx512f", "avx2+fma"
    or "baseline" (x86-64, no AVX), the widest this CPU supports unless GEOMKERN_CPU_ISA names
    another; a build with GEOMKERN_NATIVE_ARCH=1 (-march=native) reports the target it was compiled
    for ("avx512f", "avx2+fma", "avx", "sse2", or "generic" off x86). None where geomkern._C is
    not loaded (``gk.why_not("native", "cpu")`` says why). Every variant computes the same bits."""
    return _C.cpu_isa() if _C is not None else None


def broken(device_type: str) -> bool:
    """Whether the extension for ``device_type`` is there but failed to load (auto warns then)."""
    ext = {"cpu": _CPU, "cuda": _CUDA}.get(device_type)
    return ext is not None and ext.broken


class _Missing:
    """Stands in for an extension that did not load, so that its kernels can be registered (the
    registry checks ``why_not`` before it calls one; a call that got here anyway raises it)."""

    def __init__(self, reason: str):
        self._reason = reason

    def __getattr__(self, name):
        if name.startswith("__"):  # copy, pickle and friends probe these: not a kernel call
            raise AttributeError(name)
        raise RuntimeError(self._reason)


def kernels(C=None, C_cuda=None) -> dict[str, dict[str, object]]:
    """op -> {device type: implementation} for the given extension modules (None: not built), from
    every family module of :data:`FAMILIES`.

    Each implementation has the signature of the op's reference (geomkern/ops/<family>.py)."""
    table: dict[str, dict[str, object]] = {}
    for family in FAMILIES:
        for op, per_device in family.kernels(C, C_cuda).items():
            table.setdefault(op, {}).update(per_device)
    return table


def auto_devices(C) -> dict[str, tuple[str, ...]]:
    """device type -> ops on which auto prefers the native kernel (measured wins only: each family
    module's ``auto`` gives its measurements). The CPU kernels of the pre-image and RBF families
    only on geomkern._C's AVX2+FMA or AVX-512F variant (_common.fast_cpu); no CUDA kernel."""
    out: dict[str, tuple[str, ...]] = {}
    for family in FAMILIES:
        for dev, ops in family.auto(C).items():
            out[dev] = out.get(dev, ()) + tuple(ops)
    return out


def register(C, C_cuda) -> None:
    """Register the kernels of C and C_cuda; those of an extension that is None (did not load)
    too, as :class:`_Missing` stand-ins that the registry refuses with :func:`why_not`."""
    auto = auto_devices(C)
    table = kernels(C if C is not None else _Missing(_CPU.why_not),
                    C_cuda if C_cuda is not None else _Missing(_CUDA.why_not))
    for op, per_device in table.items():
        for dev, fn in per_device.items():
            on = (dev,) if op in auto.get(dev, ()) else ()
            _dispatch.register(op, "native", devices=(dev,), auto_on=on)(fn)


_dispatch.register_backend("native", why_not=why_not, broken=broken)
register(_C, _C_cuda)
