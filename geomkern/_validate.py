"""Input checks at the public boundary. Each error names the argument and says how to fix it."""
from __future__ import annotations

import math
import numbers

import torch

FLOAT_DTYPES = (torch.float32, torch.float64)
HALF_DTYPES = (torch.float16, torch.bfloat16)


def tensor(name: str, t, *, ndim: int | tuple[int, ...], allow_half: bool = False,
           allow_empty: bool = False, finite: bool = True) -> torch.Tensor:
    """A floating tensor of the given rank(s), finite, made contiguous."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}; "
                        f"wrap arrays with torch.as_tensor({name})")
    ranks = (ndim,) if isinstance(ndim, int) else ndim
    if t.dim() not in ranks:
        want = " or ".join(str(r) for r in ranks)
        raise ValueError(f"{name} must have rank {want}, got shape {tuple(t.shape)}")
    allowed = FLOAT_DTYPES + (HALF_DTYPES if allow_half else ())
    if t.dtype not in allowed:
        names = ", ".join(str(d).replace("torch.", "") for d in allowed)
        raise TypeError(f"{name} has dtype {str(t.dtype).replace('torch.', '')}; expected one of "
                        f"{names} (convert with {name}.float() or {name}.double())")
    if not allow_empty and t.numel() == 0:
        raise ValueError(f"{name} is empty (shape {tuple(t.shape)}); it needs at least one row")
    if finite and t.numel() and not bool(torch.isfinite(t).all()):
        bad = int((~torch.isfinite(t)).sum())
        raise ValueError(f"{name} contains {bad} NaN/Inf value(s); clean or drop those rows first")
    return t.contiguous()


def same_device_dtype(**tensors: torch.Tensor) -> None:
    items = [(k, v) for k, v in tensors.items() if v is not None]
    k0, v0 = items[0]
    for k, v in items[1:]:
        if v.device != v0.device:
            raise ValueError(f"{k} is on {v.device} but {k0} is on {v0.device}; "
                             f"move them to one device (e.g. {k}.to({k0}.device))")
        if v.dtype != v0.dtype:
            raise TypeError(f"{k} has dtype {v.dtype} but {k0} has {v0.dtype}; "
                            f"cast one of them (e.g. {k}.to({k0}.dtype))")


def same_dim(name_a: str, a: torch.Tensor, name_b: str, b: torch.Tensor) -> None:
    if a.shape[-1] != b.shape[-1]:
        raise ValueError(f"feature dimension mismatch: {name_a} has D={a.shape[-1]} but "
                         f"{name_b} has D={b.shape[-1]}; both must embed in the same space")


def gamma(g) -> float:
    if isinstance(g, torch.Tensor):
        if g.numel() != 1:
            raise ValueError(f"gamma must be a scalar, got a tensor of shape {tuple(g.shape)}")
        g = g.item()
    if isinstance(g, bool) or not isinstance(g, numbers.Real):
        raise TypeError(f"gamma must be a positive number, got {type(g).__name__}; "
                        "use gk.median_gamma(X) for a data-driven bandwidth")
    g = float(g)
    if not math.isfinite(g) or g <= 0:
        raise ValueError(f"gamma must be a finite number > 0, got {g}; "
                         "use gk.median_gamma(X) for a data-driven bandwidth")
    return g


def positive_int(name: str, v, *, minimum: int = 1) -> int:
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {type(v).__name__}")
    v = int(v)
    if v < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {v}")
    return v


def offsets(off, n_rows: int, *, device: torch.device, allow_empty_segments: bool) -> torch.Tensor:
    """CSR segment boundaries: int64 (m+1,), off[0] = 0, off[-1] = n_rows, non-decreasing."""
    if not isinstance(off, torch.Tensor):
        raise TypeError(f"offsets must be an int64 torch.Tensor of segment boundaries, got "
                        f"{type(off).__name__}; e.g. torch.tensor([0, n1, n1 + n2])")
    if off.dtype != torch.int64:
        raise TypeError(f"offsets must have dtype int64, got {off.dtype}; use offsets.long()")
    if off.dim() != 1 or off.numel() < 2:
        raise ValueError(f"offsets must be 1-D with m+1 >= 2 entries, got shape {tuple(off.shape)}")
    o = off.cpu()
    if int(o[0]) != 0:
        raise ValueError(f"offsets[0] must be 0, got {int(o[0])}")
    if int(o[-1]) != n_rows:
        raise ValueError(f"offsets[-1] must equal the number of rows of X ({n_rows}), got {int(o[-1])}")
    sizes = o[1:] - o[:-1]
    if bool((sizes < 0).any()):
        j = int(torch.nonzero(sizes < 0)[0])
        raise ValueError(f"offsets must be non-decreasing (sorted); offsets[{j + 1}] = "
                         f"{int(o[j + 1])} < offsets[{j}] = {int(o[j])}")
    if not allow_empty_segments and bool((sizes == 0).any()):
        j = int(torch.nonzero(sizes == 0)[0])
        raise ValueError(f"segment {j} is empty (offsets[{j}] == offsets[{j + 1}] == {int(o[j])}); "
                         "drop empty segments before the call")
    return off.to(device)


def labels(name: str, y, n: int, n_classes: int, *, device: torch.device) -> torch.Tensor:
    if not isinstance(y, torch.Tensor):
        raise TypeError(f"{name} must be an integer torch.Tensor, got {type(y).__name__}")
    if y.dtype.is_floating_point or y.dtype.is_complex or y.dtype == torch.bool:
        raise TypeError(f"{name} must hold integer class ids, got dtype {y.dtype}; use {name}.long()")
    if y.dim() != 1 or y.shape[0] != n:
        raise ValueError(f"{name} must have shape ({n},) to match the rows of X, got {tuple(y.shape)}")
    if y.device != device:
        raise ValueError(f"{name} is on {y.device} but X is on {device}; move them to one device")
    if n and (int(y.min()) < 0 or int(y.max()) >= n_classes):
        raise ValueError(f"{name} values must lie in [0, n_classes={n_classes}), got range "
                         f"[{int(y.min())}, {int(y.max())}]")
    return y.long()


def choice(name: str, v, options: tuple[str, ...]) -> str:
    if v not in options:
        raise ValueError(f"{name}={v!r} is not supported; choose one of {options}")
    return v
