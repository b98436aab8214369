"""What FedMC's clients and server exchange, as :mod:`geomkern.exchange` containers: validated on
construction, ``to_dict``/``from_dict``, and ``save``/``load`` (``to_bytes``/``from_bytes``) in
the one safetensors format "geomkern.fedmc", never pickle. Each class reads only its own kind
(``LocalGeometry.load`` refuses a dictionary's file); the GAB travels as ``GAB(B)`` and comes back
as ``GAB.load(path).basis``.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import NamedTuple

import torch

from .. import _validate
from ..exchange import Exchanged

_FORMAT = "geomkern.fedmc"


class Prototypes(NamedTuple):
    """What ``client_prototypes`` releases: DP centres (k, D), noisy counts (k,), spent (eps, delta)."""

    centers: torch.Tensor
    counts: torch.Tensor
    epsilon: float
    delta: float


@dataclass(eq=False)
class GAB(Exchanged):
    """The shared anonymous basis as an exchanged container: basis (S, D). ``build_gab`` returns
    the plain tensor B; ``GAB(B)`` is what goes over the wire (``save``/``to_dict``)."""

    basis: torch.Tensor

    _FORMAT = _FORMAT
    _KIND = "gab"
    _TENSORS = ("basis",)

    def _check(self):
        self.basis = _validate.tensor("GAB.basis", self.basis, ndim=2)


@dataclass(eq=False)
class PrototypeRelease(Exchanged):
    """A client's released prototypes (step 1) as an exchanged container: DP centres (k, D), noisy
    counts (k,) of the same float dtype, and the (epsilon, delta) the release spent (epsilon may be
    inf: released without noise). ``PrototypeRelease(*client_prototypes(...))`` is what goes over
    the wire; ``prototypes()`` gives back the :class:`Prototypes` that ``build_gab`` takes."""

    centers: torch.Tensor
    counts: torch.Tensor
    epsilon: float
    delta: float

    _FORMAT = _FORMAT
    _KIND = "prototypes"
    _TENSORS = ("centers", "counts")
    _SCALARS = ("epsilon", "delta")

    def _check(self):
        self.centers = _validate.tensor("PrototypeRelease.centers", self.centers, ndim=2)
        self.counts = _validate.tensor("PrototypeRelease.counts", self.counts, ndim=1)
        _validate.same_device_dtype(**{"PrototypeRelease.centers": self.centers,
                                       "PrototypeRelease.counts": self.counts})
        if self.counts.shape[0] != self.centers.shape[0]:
            raise ValueError(f"PrototypeRelease.counts has {self.counts.shape[0]} entries but centers has "
                             f"{self.centers.shape[0]} rows")
        for k in ("epsilon", "delta"):
            v = getattr(self, k)
            if not isinstance(v, numbers.Real) or math.isnan(v) or v < 0:
                raise ValueError(f"PrototypeRelease.{k} must be a number >= 0 (inf allowed for epsilon), got {v!r}")
            setattr(self, k, float(v))

    def prototypes(self) -> Prototypes:
        return Prototypes(self.centers, self.counts, self.epsilon, self.delta)


def _check_entries(obj, rows: str, sizes: str) -> None:
    """Shared by LocalGeometry and GeometryDictionary: m entries of rows (m, D), sizes (m,),
    eigenvalues and variances (m, d), betas (m, d, S), one float dtype and device, finite; gamma > 0."""
    name = type(obj).__name__
    t = {k: _validate.tensor(f"{name}.{k}", getattr(obj, k), ndim=nd)
         for k, nd in ((rows, 2), (sizes, 1), ("eigenvalues", 2), ("variances", 2), ("betas", 3))}
    _validate.same_device_dtype(**{f"{name}.{k}": v for k, v in t.items()})
    m, (d, S) = t[rows].shape[0], t["betas"].shape[1:]
    for k, shape in ((sizes, (m,)), ("eigenvalues", (m, d)), ("variances", (m, d)), ("betas", (m, d, S))):
        if tuple(t[k].shape) != shape:
            raise ValueError(f"{name}.{k} has shape {tuple(t[k].shape)}, expected {shape} ({m} entries in "
                             f"{rows}, d={d} components and S={S} basis points in betas)")
    for k in ("eigenvalues", "variances") + ((sizes,) if sizes == "weights" else ()):
        if bool((t[k] < 0).any()):  # exact: kpca returns 0, never round-off below it, for null components
            raise ValueError(f"{name}.{k} must be >= 0 ({'variances' if k != 'weights' else 'sample counts'}), "
                             f"got min {float(t[k].min()):.3g}")
    for k, v in t.items():
        setattr(obj, k, v)
    obj.gamma = _validate.gamma(obj.gamma)


@dataclass(eq=False)
class LocalGeometry(Exchanged):
    """A client's local geometry descriptors (one per patch j = 1..m), what it uploads.

    centers (m, D): DP patch centres; counts (m,): their (noisy) sizes; eigenvalues (m, d):
    centred-Gram eigenvalues mu; variances (m, d): mu / n; betas (m, d, S): <v_i, Phi(b_s)>;
    epsilon, delta: what the centres' DP release spent.
    """

    centers: torch.Tensor
    counts: torch.Tensor
    eigenvalues: torch.Tensor
    variances: torch.Tensor
    betas: torch.Tensor
    gamma: float
    epsilon: float = math.inf
    delta: float = 0.0

    _FORMAT = _FORMAT
    _KIND = "local_geometry"
    _TENSORS = ("centers", "counts", "eigenvalues", "variances", "betas")
    _SCALARS = ("gamma", "epsilon", "delta")

    def _check(self):
        _check_entries(self, "centers", "counts")
        eps, delta = self.epsilon, self.delta
        if any(isinstance(v, bool) or not isinstance(v, numbers.Real) for v in (eps, delta)):
            raise TypeError(f"LocalGeometry: epsilon and delta must be numbers, got {eps!r}, {delta!r}")
        eps, delta = float(eps), float(delta)
        if not eps > 0 or not 0 <= delta < 1:  # NaN fails both
            raise ValueError(f"LocalGeometry: epsilon must be > 0 (inf: no noise) and delta in [0, 1), "
                             f"got {eps}, {delta}")
        if math.isfinite(eps) and delta == 0:
            raise ValueError(f"LocalGeometry: epsilon={eps} with delta=0 is impossible: the centres are a "
                             "Gaussian-mechanism release, which is never pure (delta = 0) DP")
        self.epsilon, self.delta = eps, delta


@dataclass(eq=False)
class GeometryDictionary(Exchanged):
    """The server's fused geometry: L entries with prototypes (L, D), weights (L,) (summed patch
    counts), eigenvalues (L, d), variances (L, d) and betas (L, d, S)."""

    prototypes: torch.Tensor
    weights: torch.Tensor
    eigenvalues: torch.Tensor
    variances: torch.Tensor
    betas: torch.Tensor
    gamma: float

    _FORMAT = _FORMAT
    _KIND = "geometry_dictionary"
    _TENSORS = ("prototypes", "weights", "eigenvalues", "variances", "betas")
    _SCALARS = ("gamma",)

    def _check(self):
        _check_entries(self, "prototypes", "weights")
