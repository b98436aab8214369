"""Batched pre-image solvers for RBF feature-space targets.

Given basis points B (S, D) and, per point, a feature-space target described by kernel values
T_s = <Psi, Phi(b_s)>, find z with k(z, B) ~ T. Three methods (docs/design.md, math note 4):

* ``gd`` — the paper's Eq. 14: plain gradient descent on f(z) = sum_s (k(z, b_s) - T_s)^2,
  gradient -4 gamma sum_s r_s k_s (z - b_s) with r = k(z, B) - T.
* ``fixed_point`` — Mika et al. (1999): write Psi ~ sum_s a_s Phi(b_s) with a = (G + rho I)^-1 T,
  G = K(B, B), and iterate z <- sum_s a_s k(z, b_s) b_s / sum_s a_s k(z, b_s).
* ``coordinates`` — match d coordinates P(z) = A k(z, B) (A: (d, S), e.g. kernel-PC maps)
  to targets c: minimise |P(z) - c|^2 by damped Gauss-Newton (Levenberg-Marquardt) with a
  bounded step, in the dual (d x d) form so the cost is linear in D.
"""
from __future__ import annotations

import torch

from .. import _dispatch, _library, _validate

METHODS = ("gd", "fixed_point", "coordinates")
# Points per chunk in the reference so (chunk, S) and (chunk, d, D) work arrays stay bounded.
_CHUNK = 4096


def _kernel(Z: torch.Tensor, B: torch.Tensor, gamma: float) -> torch.Tensor:
    """K(Z, B) through the dispatched rbf_gram (shifted by B's mean), so at Z = x it has the bits
    of ``gk.rbf_gram(x, B)``, from which fedmc's coordinate targets are made."""
    return _dispatch.implementation("rbf_gram", Z.device.type)(Z, B, gamma, False,
                                                               precision=_validate.DEFAULT_PRECISION)


def default_gd_lr(Z0: torch.Tensor, B: torch.Tensor, gamma: float) -> torch.Tensor:
    """Per-point step for ``gd``: 1 / (4 gamma max(1, sum_s k(z0, b_s))).

    The curvature of f is a sum over basis points each bounded by ~4 gamma k_s, so the sum of
    kernel values at the start counts the basis points that matter; the floor of 1 keeps points
    far from every b_s from taking huge steps.
    """
    s = torch.cat([_kernel(Z0[i:i + _CHUNK], B, gamma).sum(1) for i in range(0, Z0.shape[0], _CHUNK)])
    return 1.0 / (4.0 * gamma * s.clamp_min(1.0))


def gd_reference(Z0, B, T, gamma: float, steps: int, lr: torch.Tensor, *,
                 precision: str | None = None) -> torch.Tensor:
    out = torch.empty_like(Z0)
    for i in range(0, Z0.shape[0], _CHUNK):
        z = Z0[i:i + _CHUNK].clone()
        t, step = T[i:i + _CHUNK], (4.0 * gamma * lr[i:i + _CHUNK]).unsqueeze(1)
        for _ in range(steps):
            k = _kernel(z, B, gamma)
            w = (k - t).mul_(k)
            # grad f = -4 gamma ((sum w) z - w B), so z - lr grad f = z + 4 gamma lr ((sum w) z - w B)
            z = z + step * (w.sum(1, keepdim=True) * z - w @ B)
        out[i:i + _CHUNK] = z
    return out


def fixed_point_factor(B: torch.Tensor, gamma: float, ridge: float) -> torch.Tensor:
    """The float64 Cholesky factor (S, S) of G + ridge I, G = K(B, B): what
    :func:`fixed_point_coefficients` solves with. Build it once to reuse it across calls with one
    basis (``fedmc.prepare`` does).

    float64 whatever the input dtype: with near-duplicate basis points G is nearly singular and a
    float32 Cholesky of G + 1e-6 I can fail (S = 300 points on a line did).
    """
    B64 = B.double()
    G = _kernel(B64, B64, gamma)
    G.diagonal().add_(ridge)
    L, info = torch.linalg.cholesky_ex(G)
    if int(info) != 0:
        raise ValueError(f"fixed_point: the GAB Gram G + ridge*I is not positive definite even in float64 "
                         f"(ridge={ridge}); raise ridge or remove duplicate basis points")
    return L


def fixed_point_coefficients(B: torch.Tensor, T: torch.Tensor, gamma: float, ridge: float,
                             factor: torch.Tensor | None = None) -> torch.Tensor:
    """a = T (G + ridge I)^-1, the expansion of each target in Phi(B) (G has unit diagonal), solved
    in float64 with ``factor`` (from :func:`fixed_point_factor`; built here when None)."""
    L = fixed_point_factor(B, gamma, ridge) if factor is None else factor
    return torch.cholesky_solve(T.T.double(), L).T.to(T.dtype).contiguous()


def fixed_point_reference(Z0, B, A, gamma: float, steps: int, *,
                          precision: str | None = None) -> torch.Tensor:
    out = torch.empty_like(Z0)
    tiny = torch.finfo(Z0.dtype).tiny ** 0.5
    for i in range(0, Z0.shape[0], _CHUNK):
        z, a = Z0[i:i + _CHUNK].clone(), A[i:i + _CHUNK]
        for _ in range(steps):
            w = _kernel(z, B, gamma).mul_(a)
            den = w.sum(1, keepdim=True)
            ok = den.abs() > tiny  # a vanishing denominator has no fixed point: keep the iterate
            z = torch.where(ok, (w @ B) / torch.where(ok, den, torch.ones_like(den)), z)
        out[i:i + _CHUNK] = z
    return out


def _coords(z, B, A, gamma):
    """P(z) = A k(z, B): (b, d)."""
    return torch.bmm(A, _kernel(z, B, gamma).unsqueeze(-1)).squeeze(-1)


def _jacobian(z, B, A, gamma):
    """J (b, d, D) of P at z: -2 gamma (P z^T - (A*k) B)."""
    Ak = A * _kernel(z, B, gamma).unsqueeze(1)  # (b, d, S)
    return -2.0 * gamma * (Ak.sum(-1).unsqueeze(-1) * z.unsqueeze(1) - Ak @ B)


def coordinates_reference(Z0, B, C, A, gamma: float, steps: int) -> torch.Tensor:
    out = torch.empty_like(Z0)
    radius = 0.5 / gamma ** 0.5  # at most half a kernel width per step: the model is local
    d = C.shape[1]
    eye = torch.eye(d, dtype=Z0.dtype, device=Z0.device)
    for i in range(0, Z0.shape[0], _CHUNK):
        z, c = Z0[i:i + _CHUNK].clone(), C[i:i + _CHUNK]
        a = A[i:i + _CHUNK] if A.dim() == 3 else A.unsqueeze(0).expand(z.shape[0], -1, -1)
        r = _coords(z, B, a, gamma) - c
        loss = (r * r).sum(1)
        J = _jacobian(z, B, a, gamma)
        JJ = J @ J.transpose(1, 2)
        lam = 1e-3 * JJ.diagonal(dim1=1, dim2=2).mean(1).clamp_min(1e-30)
        for _ in range(steps):
            y = torch.linalg.solve(JJ + lam[:, None, None] * eye, r.unsqueeze(-1))
            delta = -(J.transpose(1, 2) @ y).squeeze(-1)
            norm = delta.norm(dim=1, keepdim=True)
            z_new = z + delta * (radius / norm.clamp_min(radius)).clamp(max=1.0)
            r_new = _coords(z_new, B, a, gamma) - c
            loss_new = (r_new * r_new).sum(1)
            better = loss_new < loss
            lam = torch.where(better, lam / 3.0, lam * 4.0)
            idx = torch.nonzero(better).squeeze(1)
            if idx.numel() == 0:
                continue
            # the Jacobian is only needed again where the step was accepted
            z[idx], r[idx], loss[idx] = z_new[idx], r_new[idx], loss_new[idx]
            J[idx] = _jacobian(z[idx], B, a[idx], gamma)
            JJ[idx] = J[idx] @ J[idx].transpose(1, 2)
        out[i:i + _CHUNK] = z
    return out


_dispatch.register("preimage_gd", "reference")(gd_reference)
_dispatch.register("preimage_fixed_point", "reference")(fixed_point_reference)
_dispatch.register("preimage_coordinates", "reference")(coordinates_reference)


def _problem_meta(Z0, B, targets, proj, *, coordinates: bool, z_name: str = "Z0"):
    """The checks of a pre-image problem that read no values (shared by :func:`preimage`'s
    operator, its fake and :func:`preimage_loss`, whose points are called ``z_name``)."""
    Z0 = _validate.tensor_meta(z_name, Z0, ndim=2)
    B = _validate.tensor_meta("B", B, ndim=2)
    targets = _validate.tensor_meta("targets", targets, ndim=2)
    _validate.same_device_dtype(**{z_name: Z0}, B=B, targets=targets)
    _validate.same_dim(z_name, Z0, "B", B)
    b, S = Z0.shape[0], B.shape[0]
    if targets.shape[0] != b:
        raise ValueError(f"targets must have one row per row of {z_name} ({b}), got shape {tuple(targets.shape)}")
    if coordinates:
        if proj is None:
            raise ValueError("method='coordinates' needs proj: the (d, S) or (b, d, S) map from "
                             "kernel values k(z, B) to the d coordinates being matched")
        proj = _validate.tensor_meta("proj", proj, ndim=(2, 3))
        _validate.same_device_dtype(**{z_name: Z0}, proj=proj)
        d = targets.shape[1]
        if proj.shape[-2:] != (d, S) or (proj.dim() == 3 and proj.shape[0] != b):
            raise ValueError(f"proj must have shape ({d}, {S}) or ({b}, {d}, {S}) to match "
                             f"targets (b, d) and B (S, D), got {tuple(proj.shape)}")
    elif targets.shape[1] != S:
        raise ValueError(f"targets must have one column per basis point (S={S}), one per row of B, "
                         f"got shape {tuple(targets.shape)}")
    return Z0, B, targets, proj


def _problem_values(Z0, B, targets, proj, *, z_name: str = "Z0"):
    """The value half of a pre-image problem's checks: finite, in range, contiguous."""
    return (_validate.finite(z_name, Z0), _validate.finite("B", B), _validate.finite("targets", targets),
            None if proj is None else _validate.finite("proj", proj))


def _loss(Z, B, targets, gamma: float, proj=None) -> torch.Tensor:
    k = _kernel(Z, B, gamma)
    if proj is None:
        r = k - targets
    else:
        r = ((proj if proj.dim() == 3 else proj.unsqueeze(0)) * k.unsqueeze(1)).sum(-1) - targets
    return (r * r).sum(1)


def preimage_loss(Z, B, targets, *, gamma, proj=None) -> torch.Tensor:
    """Per-point objective (b,): sum_s (k(z, b_s) - T_s)^2, or |A k(z, B) - c|^2 when ``proj``
    (the ``coordinates`` map, (d, S) or (b, d, S)) is given. Shapes as in :func:`preimage`."""
    Z, B, targets, proj = _problem_meta(Z, B, targets, proj, coordinates=proj is not None, z_name="Z")
    Z, B, targets, proj = _problem_values(Z, B, targets, proj, z_name="Z")
    return _loss(Z, B, targets, _validate.gamma(gamma), proj)


def _preimage_check(Z0, B, targets, gamma, method, steps, lr_value, lr, proj, ridge, factor, return_loss,
                    precision):
    """preimage's arguments, every check that reads no values (the function, the operator and its
    fake run it); returns them normalised. ``lr`` arrives as ``lr_value`` (a float) or ``lr``
    (a tensor); ``ridge`` is read by ``fixed_point`` only. ``steps`` is bounded by the work it asks
    for (_validate.work)."""
    method = _validate.choice("method", method, METHODS)
    precision = _validate.precision(precision)
    if factor is not None and method != "fixed_point":
        raise ValueError(f"factor is only used by method='fixed_point', not {method!r}")
    if method != "coordinates" and proj is not None:
        raise ValueError(f"proj is only used by method='coordinates', not {method!r}")
    if (lr is not None or lr_value is not None) and method != "gd":
        raise ValueError("lr is only used by method='gd'")
    if lr is not None and lr_value is not None:
        raise ValueError("lr is given twice, as lr_value (a float) and as lr (a tensor); pass one")
    if factor is not None and not isinstance(factor, torch.Tensor):
        raise ValueError("factor must be the float64 Cholesky factor (a tensor) from "
                         "fixed_point_factor(B, gamma, ridge)")
    Z0, B, targets = (_validate.tensor_arg(n, t) for n, t in (("Z0", Z0), ("B", B), ("targets", targets)))
    proj = None if proj is None else _validate.tensor_arg("proj", proj)
    lr = None if lr is None else _validate.tensor_arg("lr", lr)
    lr_value = None if lr_value is None else _validate.finite_positive("lr", lr_value)
    gamma = _validate.gamma(gamma)
    steps = _validate.positive_int("steps", steps, minimum=0)
    ridge = _validate.finite_positive("ridge", ridge) if method == "fixed_point" else float(ridge)
    Z0, B, targets, proj = _problem_meta(Z0, B, targets, proj, coordinates=method == "coordinates")
    b, S, D = Z0.shape[0], B.shape[0], B.shape[1]
    if lr is not None:
        _validate.tensor_meta("lr", lr, ndim=(0, 1))
        if lr.dim() == 1 and lr.shape != (b,):
            raise ValueError(f"lr must be a scalar or have shape ({b},), got {tuple(lr.shape)}")
    if factor is not None and (factor.dtype != torch.float64 or factor.shape != (S, S)
                               or factor.device != B.device):
        raise ValueError(f"factor must be the float64 ({S}, {S}) Cholesky factor on {B.device} from "
                         "fixed_point_factor(B, gamma, ridge)")
    # a step evaluates k(z, B) (S D per point) and, for coordinates, a d x D Jacobian per basis point
    per_step = b * S * D * (targets.shape[1] if method == "coordinates" else 1)
    _validate.work(f"preimage with steps={steps} on Z0 {tuple(Z0.shape)} and B {tuple(B.shape)}",
                   steps * per_step, "lower steps")
    return (Z0, B, targets, gamma, method, steps, lr_value, lr, proj, ridge, factor, bool(return_loss),
            precision)


def _preimage_fake(Z0, B, targets, gamma, method, steps, lr_value, lr, proj, ridge, factor,
                   return_loss, precision):
    return Z0.new_empty(Z0.shape), Z0.new_empty(Z0.shape[0] if return_loss else 0)


@_library.op("preimage", "(Tensor Z0, Tensor B, Tensor targets, float gamma, str method, int steps, "
             "float? lr_value, Tensor? lr, Tensor? proj, float ridge, Tensor? factor, bool return_loss, "
             "str precision) -> (Tensor, Tensor)", check=_preimage_check, fake=_preimage_fake)
def _preimage_op(Z0, B, targets, gamma, method, steps, lr_value, lr, proj, ridge, factor, return_loss,
                 precision):
    Z0, B, targets, proj = _problem_values(Z0, B, targets, proj)
    g, dev = gamma, Z0.device.type
    if method == "coordinates":
        Z = _dispatch.implementation("preimage_coordinates", dev)(Z0, B, targets, proj, g, steps)
    elif method == "gd":
        lr_t = _gd_lr(lr if lr is not None else lr_value, Z0, B, g)
        Z = _dispatch.implementation("preimage_gd", dev)(Z0, B, targets, g, steps, lr_t, precision=precision)
    else:
        A = fixed_point_coefficients(B, targets, g, ridge, factor)
        Z = _dispatch.implementation("preimage_fixed_point", dev)(Z0, B, A, g, steps, precision=precision)
    loss = _loss(Z, B, targets, g, proj) if return_loss else Z.new_empty(0)
    return Z, loss


def preimage(Z0: torch.Tensor, B: torch.Tensor, targets: torch.Tensor, *, gamma: float,
             method: str = "gd", steps: int = 100, lr=None, proj: torch.Tensor | None = None,
             ridge: float = 1e-6, factor: torch.Tensor | None = None, return_loss: bool = False,
             precision: str = _validate.DEFAULT_PRECISION):
    """Batched pre-image: one z per row of Z0, all solved together.

    Z0: (b, D) starting points; B: (S, D) basis points.
    targets: (b, S) kernel values for ``gd``/``fixed_point``; (b, d) coordinates for
    ``coordinates``, which also needs ``proj``: (d, S) shared or (b, d, S) per point.
    lr: ``gd`` step, a float or (b,) tensor; None picks :func:`default_gd_lr`.
    ridge: Tikhonov term on G for ``fixed_point``.
    factor: for ``fixed_point``, the (S, S) float64 Cholesky factor of G + ridge I from
    :func:`fixed_point_factor` (computed with this ``ridge``), to skip rebuilding it per call.
    precision: how float32 dots run on tensor-core backends (geomkern._validate.PRECISIONS;
    ``coordinates`` has no tensor-core path).
    Returns Z (b, D), and the per-point final loss (b,) when ``return_loss``.
    A torch custom operator (``torch.ops.geomkern.preimage``): traces under torch.compile.
    """
    lr_value = None
    if lr is not None and not isinstance(lr, torch.Tensor):
        lr_value, lr = lr, None
    Z, loss = _preimage_op(Z0, B, targets, gamma, method, steps, lr_value, lr, proj,
                           ridge if method == "fixed_point" else 0.0, factor, bool(return_loss), precision)
    return (Z, loss) if return_loss else Z


def _gd_lr(lr, Z0, B, gamma) -> torch.Tensor:
    """The per-point gd step (b,): ``lr`` a float or a tensor that the check has shaped, None for
    :func:`default_gd_lr`; here its values are checked (finite, > 0)."""
    b = Z0.shape[0]
    if lr is None:
        return default_gd_lr(Z0, B, gamma)
    if isinstance(lr, torch.Tensor):
        lr = _validate.finite("lr", lr)
        lr = lr.to(device=Z0.device, dtype=Z0.dtype).expand(b).contiguous() if lr.dim() == 0 else lr
        if bool((lr <= 0).any()):
            raise ValueError("lr must be > 0")
        return lr.to(device=Z0.device, dtype=Z0.dtype).contiguous()
    return torch.full((b,), lr, dtype=Z0.dtype, device=Z0.device)
