"""Input checks at the public boundary. Each error names the argument and says how to fix it.

Every op with a registered operator (``torch.ops.geomkern.*``, geomkern/_library.py) has one
argument check in its family module (``geomkern/ops/<family>.py``, the function handed to
``_library.op`` as ``check``): it reads no tensor values (types, names, counts and their bounds,
ranks, dtypes, emptiness, devices, shapes), so it runs in the public function, in the operator and
in the operator's fake implementation alike; the operator's body then makes the checks that read
values (NaN/Inf and magnitude: :func:`finite`; offsets' contents). One call, one check: see
``_library.Op``."""
from __future__ import annotations

import math
import numbers
import os

import torch

FLOAT_DTYPES = (torch.float32, torch.float64)
HALF_DTYPES = (torch.float16, torch.bfloat16)


def tensor(name: str, t, *, ndim: int | tuple[int, ...], allow_half: bool = False,
           allow_empty: bool = False, finite: bool = True, differentiable: bool = False) -> torch.Tensor:
    """A floating tensor of the given rank(s), finite, made contiguous. Tensors that require grad
    are refused unless the op is ``differentiable`` (then the checks read ``t.detach()``)."""
    tensor_meta(name, t, ndim=ndim, allow_half=allow_half, allow_empty=allow_empty,
                differentiable=differentiable)
    if finite and t.numel():
        _finite_and_in_range(name, t.detach())
    return t.contiguous()


def tensor_meta(name: str, t, *, ndim: int | tuple[int, ...], allow_half: bool = False,
                allow_empty: bool = False, differentiable: bool = False) -> torch.Tensor:
    """What :func:`tensor` checks without reading values (so also of a fake tensor): a floating
    tensor of the given rank(s), non-empty unless ``allow_empty``. Returns ``t`` as it is."""
    tensor_arg(name, t, differentiable=differentiable)
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
    return t


def finite(name: str, t: torch.Tensor) -> torch.Tensor:
    """The value half of :func:`tensor`, for a tensor :func:`tensor_meta` has passed: finite and
    in range, made contiguous."""
    if t.numel():
        _finite_and_in_range(name, t.detach())
    return t.contiguous()


def tensor_arg(name: str, t, *, differentiable: bool = False) -> torch.Tensor:
    """A torch.Tensor that needs no gradient unless the op is ``differentiable``: the checks that
    read no tensor values (a custom operator's wrapper makes these, its body the rest)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}; "
                        f"wrap arrays with torch.as_tensor({name})")
    if t.requires_grad and not differentiable:
        raise ValueError(f"{name} requires grad, but geomkern's ops are not differentiable (their "
                         f"results would carry no gradient); pass {name}.detach()")
    return t


def symmetric(name: str, A: torch.Tensor) -> None:
    """A (..., n, n) that is symmetric up to roundoff: |A - A^T| <= 100 eps max|A| n."""
    n = A.shape[-1]
    if A.shape[-2] != n:
        raise ValueError(f"{name} must be square in its last two dims, got shape {tuple(A.shape)}")
    a = A.detach()
    asym = (a - a.transpose(-1, -2)).abs().amax()
    scale = a.abs().amax().clamp_min(torch.finfo(a.dtype).tiny)
    if float(asym) > 100 * torch.finfo(a.dtype).eps * float(scale) * n:
        raise ValueError(f"{name} is not symmetric (max |A - A^T| = {float(asym):.3g}); "
                         "symmetrise it with (A + A.mT) / 2 if that is what you mean")


def _finite_and_in_range(name: str, t: torch.Tensor) -> None:
    """NaN/Inf, and values so large that the ops' squared norms and distances would overflow.

    Every op forms |x|^2 + |y|^2 - 2<x, y> (or x x^T) in the compute dtype (float32 for the half
    types), whose magnitude is at most 4 D max|x|^2: above that bound the result would be
    Inf - Inf = NaN, so such input is refused rather than returned as NaN."""
    biggest = float(t.abs().amax())  # NaN or Inf when any element is
    if not math.isfinite(biggest):
        bad = int((~torch.isfinite(t)).sum())
        raise ValueError(f"{name} contains {bad} NaN/Inf value(s); clean or drop those rows first")
    compute = torch.float64 if t.dtype == torch.float64 else torch.float32
    D = t.shape[-1] if t.dim() else 1
    limit = math.sqrt(torch.finfo(compute).max / (4.0 * max(D, 1)))
    if biggest > limit:
        raise ValueError(
            f"{name} has values up to {biggest:.3g}; squared norms and distances of rows of "
            f"{D} such values overflow {str(compute).replace('torch.', '')} (|values| must stay below "
            f"{limit:.3g}): rescale {name} (an RBF kernel's gamma scales by 1/factor^2) or use float64")


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


# the largest integer a registered operator's ``int`` argument holds (int64)
INT64_MAX = 2 ** 63 - 1


def positive_int(name: str, v, *, minimum: int = 1, maximum: int | None = None) -> int:
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {type(v).__name__}")
    v = int(v)
    if v < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {v}")
    if maximum is not None and v > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {v}")
    return v


# The most multiply-adds one call may ask for: 2^63 - 1 (so every count the work is made of also
# fits an operator's int64), over ten hours at an H200's peak TF32 rate (~5e14 multiply-adds/s)
# and years on a CPU. More is a count typed with a few zeros too many, not a job.
MAX_WORK = INT64_MAX


def work(what: str, multiply_adds: int, fix: str) -> None:
    """Refuse a call whose counts (steps, iters, n_init, ...) times its sizes exceed MAX_WORK."""
    if multiply_adds > MAX_WORK:
        raise ValueError(f"{what} would take about {multiply_adds:.3g} multiply-adds, more than "
                         f"{MAX_WORK:.3g} (2^63 - 1: over ten hours on the fastest GPU); {fix}")


def offsets_meta(off) -> torch.Tensor:
    """What :func:`offsets` checks without reading values: an int64 tensor of shape (m+1,), m >= 1."""
    if not isinstance(off, torch.Tensor):
        raise TypeError(f"offsets must be an int64 torch.Tensor of segment boundaries, got "
                        f"{type(off).__name__}; e.g. torch.tensor([0, n1, n1 + n2])")
    if off.dtype != torch.int64:
        raise TypeError(f"offsets must have dtype int64, got {off.dtype}; use offsets.long()")
    if off.dim() != 1 or off.numel() < 2:
        raise ValueError(f"offsets must be 1-D with m+1 >= 2 entries, got shape {tuple(off.shape)}")
    return off


def offsets(off, n_rows: int, *, device: torch.device, allow_empty_segments: bool) -> torch.Tensor:
    """CSR segment boundaries: int64 (m+1,), off[0] = 0, off[-1] = n_rows, non-decreasing."""
    offsets_meta(off)
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


def finite_positive(name: str, v) -> float:
    """A finite real number > 0 (not a bool)."""
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise TypeError(f"{name} must be a number, got {type(v).__name__}")
    v = float(v)
    if not (math.isfinite(v) and v > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {v}")
    return v


def _physical_memory(device: torch.device) -> int | None:
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[1]
    if device.type == "cpu":
        try:
            return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):  # not a POSIX system: no check
            return None
    return None


def allocation(name: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device,
               dims: str = "") -> None:
    """Refuse an output larger than the device's memory before allocating it (torch would
    either fail with an allocator message that names no argument or make the machine swap).
    ``dims`` says where the sizes come from (e.g. "n_classes x D x D"), for the message."""
    nbytes = math.prod(int(s) for s in shape) * torch.empty((), dtype=dtype).element_size()
    total = _physical_memory(device)
    if total is not None and nbytes > total:
        raise ValueError(f"{name} would need {_human(nbytes)} ({tuple(shape)} "
                         f"{str(dtype).replace('torch.', '')}{': ' + dims if dims else ''}) but {device.type} has "
                         f"{_human(total)} in all; split the input into smaller calls")


def _human(nbytes: int) -> str:
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= size:
            return f"{nbytes / size:.1f} {unit}"
    return f"{nbytes} B"


# How float32 dots run on tensor-core backends (Triton on CUDA); the reference and the native
# kernels compute in the input dtype with ordinary FMAs whatever is asked. Emulated errors
# (operands rounded as the tensor cores round them, tests/geomkern/test_precision.py) against float64:
#   "tf32x3" (default)  three TF32 products, hi*hi + hi*lo + lo*hi, each operand split into a TF32
#                       high part and a TF32 remainder: dot error ~1e-7 relative, as float32 FMA
#   "ieee"              float32 FMA on the CUDA cores, no tensor cores (the slowest pipe)
#   "tf32"              one TF32 product (10-bit mantissa operands): ~1e-3 relative on the dot
# float64 always runs exact float64 (DMMA); float16/bfloat16 inputs use the tensor cores natively.
PRECISIONS = ("tf32x3", "ieee", "tf32")
DEFAULT_PRECISION = "tf32x3"


def precision(p) -> str:
    if p not in PRECISIONS:
        raise ValueError(f"precision={p!r} is not supported; choose one of {PRECISIONS} "
                         f"(default {DEFAULT_PRECISION!r}: tensor cores at float32's accuracy)")
    return p


def choice(name: str, v, options: tuple[str, ...]) -> str:
    if v not in options:
        raise ValueError(f"{name}={v!r} is not supported; choose one of {options}")
    return v


# Tolerance of the value checks on received statistics, relative to each matrix's largest entry:
# a held class's covariance may be asymmetric by at most this, and have no eigenvalue below
# -VALUE_RTOL x its largest entry; eigenvectors may depart from orthonormal by this (max |V^T V - I|).
# Honest float32 statistics are ~100x inside it (class_moments: asymmetry 0, eigenvalues down to
# -5e-7 x the largest entry; eigh: |V^T V - I| <= 2e-6 up to D = 1024); a float32 geometry cast
# to float64 keeps its float32 error, so the same bound serves both dtypes.
VALUE_RTOL = 1e-4
# the most samples one client may report for one class: 2^31 - 1 (more rows than any client holds:
# 2^31 rows of D = 512 float32 are 4 TB). A larger count is a faulty or hostile upload, and would
# let that one client outweigh every other in a pooled mean.
MAX_COUNT = 2 ** 31 - 1


def counts(name: str, counts: torch.Tensor) -> None:
    """Per-class sample counts: >= 0 and <= MAX_COUNT."""
    if counts.numel() and bool((counts < 0).any()):
        raise ValueError(f"{name} must be >= 0, got min {float(counts.min()):g}")
    if counts.numel() and bool((counts > MAX_COUNT).any()):
        raise ValueError(f"{name} must be <= {MAX_COUNT} (2^31 - 1: more samples than one client holds), got "
                         f"{float(counts.max()):.3g}; so large a count is a faulty upload and would outweigh every "
                         "other client in the pooled moments")


def covariances(name: str, covs: torch.Tensor, counts: torch.Tensor) -> None:
    """The held classes' covariances (C, D, D) (``counts`` (C,) > 0) are symmetric and positive
    semi-definite within VALUE_RTOL: what GGEUR's containers and ``pool_moments`` accept."""
    held = torch.nonzero(counts > 0).squeeze(1).to(covs.device)
    if held.numel() == 0:
        return
    S = covs[held].to(torch.float64)
    scale = S.abs().amax((1, 2))
    asym = (S - S.mT).abs().amax((1, 2))
    bad = torch.nonzero(asym > VALUE_RTOL * scale).squeeze(1)
    if bad.numel():
        j = int(bad[0])
        raise ValueError(f"{name}[{int(held[j])}] is not symmetric: max |cov - cov^T| = {float(asym[j]):.3g}, "
                         f"above {VALUE_RTOL:g} x its largest entry {float(scale[j]):.3g} (classes "
                         f"{held[bad].tolist()})")
    # C + VALUE_RTOL max|C| I has a Cholesky factor iff no eigenvalue of C is below -VALUE_RTOL max|C|;
    # float64 so that the factorisation's own round-off (~D eps) stays far below that shift
    nz = scale > 0
    eye = torch.eye(S.shape[1], dtype=S.dtype, device=S.device)
    _, info = torch.linalg.cholesky_ex(0.5 * (S + S.mT)[nz] + (VALUE_RTOL * scale[nz]).view(-1, 1, 1) * eye)
    if bool((info > 0).any()):
        j = int(torch.nonzero(nz).squeeze(1)[int(torch.nonzero(info > 0)[0])])
        low = float(torch.linalg.eigvalsh(S[j])[0])
        raise ValueError(f"{name}[{int(held[j])}] is not positive semi-definite: it has the eigenvalue "
                         f"{low:.3g}, below -{VALUE_RTOL:g} x its largest entry {float(scale[j]):.3g}; a "
                         "covariance never is (was it computed or sent incorrectly?)")
