"""What the geomkern tests compare with: per-dtype tolerances, a relative-error assertion that says
where it failed, and the one way an oracle table is built.

Tables. An oracle table runs the same rows on every implementation of an op (its *entries*:
"reference", "native", "triton-cpu", ...). It is built at collection, as pytorch_scatter builds
``product(tests, dtypes, devices)``: ``entries`` keeps the entries that run on this machine
(CUDA ones only where CUDA is, ``gpu``-marked so the GPU session's ``-m gpu`` runs them; Triton
ones only where triton imports; native ones only where geomkern._C has the op), and ``table``
keeps the (row, dtype, entry) combinations its ``keep`` rule allows (a case too slow for Triton's
interpreter is a GPU-only case). So an id that cannot run here is never generated, and no test
body skips. Ids are pytest's own (the axes' ids joined by "-"), so seeds, which derive from the
node id, stay what they were.

Imported as ``_oracle`` (tests/geomkern is on sys.path under pytest's prepend import mode), not
from a conftest: every folder's conftest is a module named ``conftest``, and which one that name
means depends on which was loaded last.
"""
from __future__ import annotations

import importlib.util
import itertools

import numpy as np
import pytest
import torch

import geomkern as gk

# Relative error bounds per dtype, for ops whose float64 oracle is exact (docs/design.md conventions):
# float32 outputs are compared with the float64 oracle evaluated on the same float32-rounded inputs.
TOL = {torch.float64: 1e-10, torch.float32: 1e-5}
# float16/bfloat16 results are rounded to the storage format: unit roundoff 2^-11 and 2^-8, so twice
# that bounds the norm-wise error of a result computed in float32 and rounded once.
HALF_TOL = {torch.float16: 2 * 2.0 ** -11, torch.bfloat16: 2 * 2.0 ** -8}
FLOATS = (torch.float64, torch.float32)
SIZES = (1, 7, 33, 257)

CUDA = torch.cuda.is_available()
TRITON = importlib.util.find_spec("triton") is not None
# "cpu", and "cuda" (gpu-marked) where there is a CUDA device
DEVICES = ("cpu",) + ((pytest.param("cuda", marks=pytest.mark.gpu),) if CUDA else ())


# ----------------------------------------------------------------------------- the tables

def _native_cuda_built() -> bool:
    from geomkern.backends import native

    return not native.why_not("cuda")


def _emulation_builds() -> bool:
    import _cuda_emu

    return _cuda_emu.UNAVAILABLE is None


# What each entry that is not a plain backend of the public op needs: (needs CUDA, runs here).
# "native-*" are geomkern._C's entry points called directly; "cuda" csrc/cuda's kernels through
# geomkern._C_cuda; "cuda-emulated" / "emulated" the same kernels under the host emulation
# (tests/_cuda_emu.py: g++ and the CUDA headers, no GPU).
_ENTRIES = {
    "reference": (False, lambda ops: True),
    "reference-cuda": (True, lambda ops: True),
    "native": (False, lambda ops: _native_has(ops)),
    "native-direct": (False, lambda ops: _native_has(ops)),
    "native-span": (False, lambda ops: _native_has(ops)),
    "triton-cpu": (False, lambda ops: TRITON),
    "triton-cuda": (True, lambda ops: TRITON),
    "cuda": (True, lambda ops: _native_cuda_built()),
    "cuda-emulated": (False, lambda ops: _emulation_builds()),
    "emulated": (False, lambda ops: _emulation_builds()),
}


def _native_has(ops) -> bool:
    reg = gk.registered_ops()
    return "native" in gk.available_backends() and any("native" in reg.get(op, ()) for op in ops)


def entries(*ops: str, names=None, prefix: str = "") -> list:
    """The entries of ``ops``' oracle table that run on this machine, as pytest params (CUDA ones
    ``gpu``-marked; ``prefix`` goes before every value and id, as in eigh's "public:native").

    ``names``: the table's entries (keys of ``_ENTRIES``, in order). Without it, every backend
    built here that implements one of ``ops`` (the reference always): the backends of the public
    op on CPU tensors, for a test that takes the ``backend`` fixture (indirect parametrization)."""
    if names is None:
        reg = gk.registered_ops()
        return [prefix + b for b in gk.available_backends()
                if b == "reference" or any(b in reg.get(op, ()) for op in ops)]
    out = []
    for name in names:
        cuda, runs = _ENTRIES[name]
        if (cuda and not CUDA) or not runs(ops):
            continue
        out.append(pytest.param(prefix + name, id=prefix + name, marks=[pytest.mark.gpu] if cuda else []))
    return out


def _as_param(value, one_value: bool):
    """A table axis item as (values, id, marks): a pytest.param keeps its own; a plain value (one
    argument) or tuple (several) gets pytest's ids=str."""
    if hasattr(value, "values") and hasattr(value, "marks"):
        return tuple(value.values), value.id, tuple(value.marks)
    if one_value:
        return (value,), str(value), ()
    return tuple(value), "-".join(str(v) for v in value), ()


def table(*axes, keep=None) -> list:
    """The product of ``axes`` as one list of pytest.param, for one ``parametrize`` whose argument
    names list each axis' arguments in the same order: values concatenated, ids joined by "-" in
    axis order (the order stacked parametrize decorators give, innermost first), marks of every
    axis kept. ``keep(*values)``: the combinations that run here (default: all).

    An axis is a list of pytest.param, of plain values (one argument, id str(value)) or of tuples
    (several arguments, id the str of each joined by "-"); an axis given as ``(n, items)`` says it
    holds ``n`` arguments per item."""
    norm = []
    for axis in axes:
        n, items = axis if isinstance(axis, tuple) and len(axis) == 2 and isinstance(axis[0], int) else (1, axis)
        norm.append([_as_param(v, n == 1) for v in items])
    out = []
    for combo in itertools.product(*norm):
        values = tuple(v for vals, _, _ in combo for v in vals)
        if keep is not None and not keep(*values):
            continue
        out.append(pytest.param(*values, id="-".join(i for _, i, _ in combo),
                                marks=[m for _, _, ms in combo for m in ms]))
    return out


# ------------------------------------------------------------------------- the comparisons

def _np64(a) -> np.ndarray:
    if isinstance(a, torch.Tensor):
        return a.detach().to("cpu", torch.float64).numpy()
    return np.asarray(a, dtype=np.float64)


def rel_error(out, ref) -> float:
    """Norm-wise relative error |out - ref| / |ref| (absolute when ref is all zero)."""
    o, r = _np64(out), _np64(ref)
    den = np.linalg.norm(r)
    num = np.linalg.norm(o - r)
    return float(num / den) if den > 0 else float(num)


def assert_close_rel(out, ref, tol: float, name: str = "output") -> None:
    """Assert |out - ref| / |ref| <= tol (norm-wise; absolute when ref == 0).

    Reports the relative error, the largest absolute error and where it is, the first index
    whose error exceeds tol * max|ref|, and any NaN/Inf that appears in only one of the two.
    """
    o, r = _np64(out), _np64(ref)
    assert o.shape == r.shape, f"{name}: shape {o.shape} != reference shape {r.shape}"
    bad_o, bad_r = ~np.isfinite(o), ~np.isfinite(r)
    if (bad_o != bad_r).any():
        idx = np.argwhere(bad_o != bad_r)
        first = tuple(int(i) for i in idx[0])
        raise AssertionError(
            f"{name}: NaN/Inf mismatch at {len(idx)} position(s), first {first}: "
            f"out={float(o[first])!r}, ref={float(r[first])!r}")
    if bad_r.any():  # both non-finite at the same places: those must agree exactly
        same = (o[bad_r] == r[bad_r]) | (np.isnan(o[bad_r]) & np.isnan(r[bad_r]))
        assert same.all(), f"{name}: non-finite values differ"
        o, r = np.where(bad_r, 0.0, o), np.where(bad_r, 0.0, r)
    err = rel_error(o, r)
    if not err <= tol:
        diff = np.abs(o - r)
        worst = tuple(int(i) for i in np.unravel_index(int(np.argmax(diff)), diff.shape))
        scale = np.abs(r).max() if r.size else 0.0
        over = np.argwhere(diff > tol * max(scale, np.finfo(np.float64).tiny))
        first = tuple(int(i) for i in over[0]) if len(over) else None
        msg = (f"{name}: relative error {err:.3e} > tol {tol:.1e}; max |out-ref| = "
               f"{diff.max():.3e} at {worst} (out={float(o[worst])!r}, ref={float(r[worst])!r}); "
               f"{len(over)} element(s) off by more than tol*max|ref|")
        if first is not None:
            msg += f", first at {first} (out={float(o[first])!r}, ref={float(r[first])!r})"
        raise AssertionError(msg)


def match_signs(out, ref) -> np.ndarray:
    """Per-column signs s (+-1) so that out * s best matches ref (columns along the last axis...
    of 2-D (rows, components) arrays). Columns that are zero in either keep +1."""
    o, r = _np64(out), _np64(ref)
    s = np.sign((o * r).sum(0))
    s[s == 0] = 1.0
    return s


def offsets_from_sizes(sizes) -> torch.Tensor:
    off = [0]
    for s in sizes:
        off.append(off[-1] + int(s))
    return torch.tensor(off, dtype=torch.int64)
