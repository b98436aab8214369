"""FedMC client step 5: per-dictionary constants once (``prepare``), then calibrated samples
(``calibrate``): nearest entry, a perturbation in kernel-PC coordinates, and a pre-image."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .. import _random, _validate
from ..ops.preimage import fixed_point_factor, preimage
from ..ops.rbf import _sqdist, rbf_gram
from .containers import GeometryDictionary

FORMULATIONS = ("consistent", "hybrid", "paper")
PREIMAGE_METHODS = ("coordinates", "gd", "fixed_point")
# Chosen by scripts/fidelity.py (README: manifold fidelity): the pre-image method whose samples
# stayed closest to the manifold at matched displacement.
DEFAULT_METHOD = "fixed_point"
# rho of (G + rho I)^-1, relative to G's unit diagonal: the coefficient maps and the fixed-point solve
DEFAULT_RIDGE = 1e-3


def nearest_entry(X: torch.Tensor, dictionary: GeometryDictionary) -> torch.Tensor:
    """Index (b,) of the dictionary prototype nearest to each row of X."""
    return _sqdist(X, dictionary.prototypes).argmin(1)


@dataclass(eq=False)
class PreparedDictionary:
    """A GeometryDictionary with its GAB and the constants ``calibrate`` needs for it, computed once
    by :func:`prepare` (they only change when the dictionary or the GAB does).

    factor (S, S): float64 Cholesky factor of G + ridge I, G = K(B, B), for the fixed-point solve.
    coefficients (L, d, S): the rows a_i = (G + ridge I)^-1 beta_i of each entry's map A_l.
    captured (L, d): a_i^T beta_i, the share of v_i the GAB span represents (clamped to [0, 1]).
    paper_directions (L, d, S): betas G, the targets' directions under ``formulation="paper"`` and
    ``"hybrid"`` (Phi(v_i) = sum_s beta_is Phi(b_s) has kernel values beta_i G on the basis).
    """

    dictionary: GeometryDictionary
    basis: torch.Tensor
    ridge: float
    factor: torch.Tensor
    coefficients: torch.Tensor
    captured: torch.Tensor
    paper_directions: torch.Tensor

    @property
    def gamma(self) -> float:
        return self.dictionary.gamma


def prepare(dictionary: GeometryDictionary, B: torch.Tensor, *, ridge: float = DEFAULT_RIDGE) -> PreparedDictionary:
    """The per-dictionary constants of :func:`calibrate` (see :class:`PreparedDictionary`), once.

    ``ridge`` is rho relative to G's unit diagonal, used by the coefficient maps and by the
    fixed-point pre-image alike.
    """
    if not isinstance(dictionary, GeometryDictionary):
        raise TypeError(f"dictionary must be a GeometryDictionary (from fedmc.fuse or "
                        f"GeometryDictionary.load), got {type(dictionary).__name__}")
    B = _validate.tensor("B", B, ndim=2)
    _validate.same_device_dtype(B=B, prototypes=dictionary.prototypes)
    _validate.same_dim("B", B, "dictionary.prototypes", dictionary.prototypes)
    if dictionary.betas.shape[2] != B.shape[0]:
        raise ValueError(f"dictionary has betas for S={dictionary.betas.shape[2]} basis points but B "
                         f"has {B.shape[0]}; use the GAB the dictionary was built with")
    if isinstance(ridge, bool) or not isinstance(ridge, (int, float)) or not (math.isfinite(ridge) and ridge > 0):
        raise ValueError(f"ridge must be a finite number > 0, got {ridge!r}")
    g = dictionary.gamma
    # One factorisation of G + ridge I (float64, like the fixed-point solve that reuses it) gives the
    # coefficient maps a_i = (G + ridge I)^-1 beta_i too.
    factor = fixed_point_factor(B, g, ridge)
    betas = dictionary.betas.double()
    L, d, S = betas.shape
    coef = torch.cholesky_solve(betas.reshape(L * d, S).T, factor).T.reshape(L, d, S)
    captured = (coef * betas).sum(-1).clamp(0.0, 1.0)
    dtype = dictionary.betas.dtype
    return PreparedDictionary(dictionary=dictionary, basis=B, ridge=float(ridge), factor=factor,
                              coefficients=coef.to(dtype).contiguous(), captured=captured.to(dtype),
                              paper_directions=dictionary.betas @ rbf_gram(B, gamma=g))


def _prepared(dictionary, B, ridge) -> PreparedDictionary:
    """``dictionary`` as a PreparedDictionary (checked against B and ridge when already one)."""
    if isinstance(dictionary, PreparedDictionary):
        prep = dictionary
        if B is not None and B is not prep.basis and not (B.shape == prep.basis.shape and torch.equal(B, prep.basis)):
            raise ValueError("B differs from the GAB the dictionary was prepared with; omit B or "
                             "prepare the dictionary with this one")
        if ridge is not None and ridge != prep.ridge:
            raise ValueError(f"ridge={ridge} differs from the prepared dictionary's {prep.ridge}; "
                             "prepare it again with this ridge")
        return prep
    if B is None:
        raise ValueError("calibrate needs the GAB B with a GeometryDictionary (or pass "
                         "fedmc.prepare(dictionary, B))")
    return prepare(dictionary, B, ridge=DEFAULT_RIDGE if ridge is None else ridge)


def _check_scale(scale) -> float:
    if isinstance(scale, bool) or not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale >= 0):
        raise ValueError(f"scale must be a finite number >= 0, got {scale!r}")
    return float(scale)


def _perturb(X, prep: PreparedDictionary, formulation: str, scale: float, generator):
    """Nearest entry (b,), k(X, B) (b, S) and the coordinate perturbation dp (b, d) of one draw."""
    D_, B = prep.dictionary, prep.basis
    gen = _random.resolve(generator, X.device)
    entry = nearest_entry(X, D_)
    eps = _random.randn((X.shape[0], D_.variances.shape[1]), gen, dtype=X.dtype, device=X.device)
    kx = rbf_gram(X, B, gamma=prep.gamma)
    if formulation == "consistent":
        # Only the part of v_i inside span Phi(B) moves p_i(z) ~ k(z, B) a_i; its squared norm is
        # a_i^T beta_i (<= 1). Perturbing by the full sqrt(lambda) asks for coordinate changes the
        # GAB cannot express (on MiniLM embeddings almost no such target was reachable), so the
        # standard deviation is that of the representable part: sqrt(lambda * a_i^T beta_i).
        dp = scale * eps * (D_.variances * prep.captured)[entry].clamp_min(0).sqrt()
    else:
        dp = scale * eps * D_.eigenvalues[entry].clamp_min(0).sqrt()  # Gram eigenvalue, as printed
    return entry, kx, dp


def _kernel_targets(prep: PreparedDictionary, formulation: str, entry, kx, dp):
    """(T, T0): the kernel-value targets (b, S) for the perturbation dp and for none."""
    if formulation == "consistent":
        return kx + (dp.unsqueeze(-1) * prep.dictionary.betas[entry]).sum(1), kx
    W = prep.paper_directions[entry]  # (b, d, S): beta_i G, the kernel values of v_i on the basis
    if formulation == "hybrid":
        return kx + (dp.unsqueeze(-1) * W).sum(1), kx
    # paper, Eq. 10-13: with v_i = sum_s beta_is Phi(b_s), x's coordinates are
    # p_i = <Phi(x), v_i> = sum_s beta_is k(x, b_s); p'_i = p_i + dp_i, and the target is the
    # kernel values of sum_i p'_i v_i: T = sum_i p'_i beta_i G (nothing of Phi(x) outside the d
    # components survives, so even T0 = sum_i p_i beta_i G differs from k(x, B)).
    p = torch.bmm(prep.dictionary.betas[entry], kx.unsqueeze(-1)).squeeze(-1)  # (b, d)
    return ((p + dp).unsqueeze(-1) * W).sum(1), (p.unsqueeze(-1) * W).sum(1)


def targets(X: torch.Tensor, dictionary, B: torch.Tensor | None = None, *, formulation: str = "consistent",
            scale: float = 1.0, ridge: float | None = None, generator: torch.Generator | None = None):
    """The kernel-value targets (T, T0), each (b, S), that :func:`calibrate` hands its "gd" and
    "fixed_point" pre-image for the rows of X (b, D), drawing eps from ``generator`` exactly as
    calibrate does (same generator state -> same draw); T0 is the target with no perturbation.

    consistent: T = k(x, B) + sum_i dp_i beta_i, T0 = k(x, B);
    hybrid:     T = k(x, B) + sum_i dp_i beta_i G, T0 = k(x, B);
    paper:      T = sum_i (p_i + dp_i) beta_i G with p_i = beta_i . k(x, B), T0 the same with dp = 0
                (paper Eq. 10-13 as printed: beta as expansion coefficients of v_i on Phi(B)).
    dp_i = scale * eps_i * sqrt(lambda_i a_i^T beta_i) (consistent) or scale * eps_i * sqrt(mu_i)
    (paper, hybrid: the Gram eigenvalue, as printed).
    """
    prep = _prepared(dictionary, B, ridge)
    X = _validate.tensor("X", X, ndim=2)
    _validate.same_device_dtype(X=X, B=prep.basis)
    _validate.same_dim("X", X, "B", prep.basis)
    formulation = _validate.choice("formulation", formulation, FORMULATIONS)
    entry, kx, dp = _perturb(X, prep, formulation, _check_scale(scale), generator)
    return _kernel_targets(prep, formulation, entry, kx, dp)


def calibrate(X: torch.Tensor, dictionary, B: torch.Tensor | None = None, *,
              formulation: str = "consistent", method: str = DEFAULT_METHOD, scale: float = 1.0,
              steps: int | None = None, ridge: float | None = None, anchored: bool = True,
              generator: torch.Generator | None = None, return_loss: bool = False):
    """Client: one calibrated sample around each row of X (b, D) (repeat rows for more).

    ``dictionary`` is a :class:`PreparedDictionary` (from :func:`prepare`: the per-dictionary
    constants computed once; B may then be omitted), or a GeometryDictionary with its GAB B,
    prepared on the fly with ``ridge`` (default DEFAULT_RIDGE). The kernel is the dictionary's.

    For x in entry l (nearest prototype): draw eps ~ N(0, I_d), perturb the d kernel-PC
    coordinates by dp_i = scale * eps_i * sqrt(var_i) and find z by pre-image from z0 = x.

    formulation="consistent" (default): with A_l = betas_l (G + rho I)^-1 (rows a_i, so
    p_i(z) ~ k(z, B) a_i), var_i = lambda_i a_i^T beta_i: lambda = mu/n is the variance along v_i
    and a_i^T beta_i the share of v_i the GAB span represents (only that part moves
    k(z, B) a_i). method="coordinates" solves A_l k(z, B) = A_l k(x, B) + dp; "gd" and
    "fixed_point" use targets T = k(x, B) + dp betas_l.
    formulation="paper" (Eq. 10-13 as printed): var_i = mu_i (the Gram eigenvalue), betas as
    expansion coefficients, and the target built from the perturbed coordinates alone:
    T = sum_i (p_i + dp_i) beta_i G with p_i = beta_i . k(x, B) (see :func:`targets`).
    formulation="hybrid": the paper's perturbation added to x's own kernel values,
    T = k(x, B) + sum_i dp_i beta_i G. Both are solved by "gd" (Eq. 14) or "fixed_point".
    method defaults to DEFAULT_METHOD, the one that measured best in scripts/fidelity.py.
    ``scale`` multiplies the perturbation standard deviation. ``anchored=True`` (default) returns
    x + z(T) - z(T0) instead of z(T), with T0 the unperturbed target solved from the same start,
    wherever z(T0) != x: the fixed-point iteration (it lands in the span of B: on MiniLM
    embeddings |z(T0) - x| was 0.79 for unit-norm x, whatever the scale), and gd under
    formulation="paper" (its T0 keeps only x's d components). The pre-image's reconstruction error
    then cancels and only the perturbation moves the sample (measured in
    studies/fedmc-defaults/fedmc_defaults.py); gd under the other formulations and coordinates already have
    z(T0) = x. The paper's Eq. 14 as printed is ``formulation="paper", method="gd",
    anchored=False``. The loss returned is that of the solve for T. ``generator``: eps is drawn on
    its device (None, the default: a fresh, secretly seeded one on X's device,
    :mod:`geomkern._random`). Returns (b, D) rows on X's device, and the per-sample pre-image loss
    when ``return_loss``.
    """
    prep = _prepared(dictionary, B, ridge)
    B = prep.basis
    X = _validate.tensor("X", X, ndim=2)
    _validate.same_device_dtype(X=X, B=B)
    _validate.same_dim("X", X, "B", B)
    formulation = _validate.choice("formulation", formulation, FORMULATIONS)
    method = _validate.choice("method", method, PREIMAGE_METHODS)
    if formulation != "consistent" and method == "coordinates":
        raise ValueError(f"formulation={formulation!r} defines kernel-value targets (Eq. 10-13): use "
                         "method='gd' (Eq. 14) or 'fixed_point'")
    g = prep.gamma
    scale = _check_scale(scale)
    if steps is None:
        # LM: 10 and 20 steps met the same targets; fixed point: the fidelity benchmark gave the
        # same ratios at 10, 20 and 100 steps; gd (the paper's) converges slowly: 100
        steps = 100 if method == "gd" else 10
    x = X
    entry, kx, dp = _perturb(x, prep, formulation, scale, generator)
    if method == "coordinates":
        A = prep.coefficients[entry]
        c = torch.bmm(A, kx.unsqueeze(-1)).squeeze(-1) + dp  # P(x) exactly as the solver computes it
        return preimage(x, B, c, gamma=g, method="coordinates", steps=steps, proj=A,
                        return_loss=return_loss)  # LM's z(T0) is x: nothing to anchor
    T, T0 = _kernel_targets(prep, formulation, entry, kx, dp)
    solve = dict(gamma=g, method=method, steps=steps, return_loss=return_loss)
    if method == "fixed_point":
        solve["factor"] = prep.factor
    # gd's z(T0) is x when T0 = k(x, B) (zero gradient at the start): anchoring it would only
    # double the work
    if not (anchored and (method == "fixed_point" or formulation == "paper")):
        return preimage(x, B, T, **solve)
    return _anchored(x, B, T, T0, **solve)


def _anchored(x, B, T, T0, *, return_loss: bool, **kw):
    """x + z(T) - z(T0), both pre-images from z0 = x in one batched call; the loss is z(T)'s."""
    b = x.shape[0]
    res = preimage(torch.cat([x, x]), B, torch.cat([T, T0]), return_loss=return_loss, **kw)
    Z, loss = res if return_loss else (res, None)
    out = x + (Z[:b] - Z[b:])
    return (out, loss[:b]) if return_loss else out
