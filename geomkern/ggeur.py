"""GGEUR (CVPR 2025): geometric knowledge-guided localized global distribution alignment.

Pure functions over tensors, split by who runs them, so any FL codebase can call them:

client   stats = local_statistics(X, y, n_classes)            -> upload (stats.to_dict())
server   geometry = aggregate([stats_0, stats_1, ...])         -> download (geometry.to_dict())
client   X_new, y_new = augment(X, y, geometry, n_per_sample=1, generator=g)
client   P, labels = prototypes(stats_list, exclude=k)         (multi-domain: other clients'
         X_p, y_p = augment_prototypes(P, labels, geometry, n_per_prototype=30, generator=g)
                                                                class means, sent by the server)
         P, labels, _ = group_prototypes(stats_list, domains, exclude={my_domain})
                                                               (the paper's rule: other *domains'*
                                                                pooled class means only)

Math (paper Eq. 4 and Sec. 3): the server pools the clients' biased per-class covariances
exactly, Sigma = (1/N)[sum_k n_k Sigma_k + sum_k n_k (mu_k - mu)(mu_k - mu)^T], and
eigendecomposes each class once, Sigma = Xi diag(lambda) Xi^T. A client turns a sample x of class
c into x' = x + sum_m eps_m s_m xi_m, eps ~ N(0, I), with s_m = sqrt(lambda_m) (``noise="sqrt"``,
the default: x' - x ~ N(0, Sigma), which is what the official code draws through
``np.random.multivariate_normal``) or s_m = lambda_m (``noise="paper"``, the formula as the paper
prints it; it uses a variance as a standard deviation, so its scale depends on the units of X).

Containers follow :mod:`geomkern.exchange` (validated on construction, to_dict/from_dict,
save/load); ``generator`` defaults to None, which follows the package rule (:mod:`geomkern._random`:
a fresh, secretly seeded generator, never the global RNG; numbers drawn on the generator's device).

Speed: the official code eigendecomposes (and Cholesky-factors) the class covariance again for
every sample; here it is one batched eigh per round on the server, and sampling is one GEMM per
class, (n_new, k) standard normals times (k, D) = diag(s) Xi^T.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from . import _random, _validate
from .exchange import Exchanged, nbytes
from .ops.eigh import eigh
from .ops.moments import class_moments, pool_moments, pool_moments_by_class

NOISE_MODES = ("sqrt", "paper")
VALUE_RTOL = _validate.VALUE_RTOL  # the value checks' tolerance (geomkern/_validate.py says why)


class _ClassRows:
    """Per-class tensors whose ``means`` is (C, D): one row per class."""

    @property
    def n_classes(self) -> int:
        return self.means.shape[0]

    @property
    def dim(self) -> int:
        return self.means.shape[1]


class _PerClassTensors(_ClassRows, Exchanged):
    """Shared by the two exchanged containers (:mod:`geomkern.exchange`): one row per class."""

    _FORMAT = "geomkern.ggeur"


@dataclass(eq=False)
class ClassStatistics(_PerClassTensors):
    """What one client uploads: per-class counts (C,) int64, means (C, D), biased covs (C, D, D).

    Classes the client does not hold have count 0 (and zero mean and covariance).
    """
    counts: torch.Tensor
    means: torch.Tensor
    covs: torch.Tensor

    _KIND = "class_statistics"
    _TENSORS = ("counts", "means", "covs")

    def _check(self):
        self.counts, self.means, self.covs = _check_statistics("statistics", self)


@dataclass(eq=False)
class GlobalGeometry(_PerClassTensors):
    """What the server sends back: per class c the pooled count, mean and covariance eigenbasis.

    counts (C,) int64; means (C, D); eigenvalues (C, K) descending, >= 0 (variances along the
    axes); eigenvectors (C, D, K), column m of eigenvectors[c] is xi_m of class c. K = D unless
    ``aggregate(..., n_components=K)`` kept only the top K.
    """
    counts: torch.Tensor
    means: torch.Tensor
    eigenvalues: torch.Tensor
    eigenvectors: torch.Tensor

    _KIND = "global_geometry"
    _TENSORS = ("counts", "means", "eigenvalues", "eigenvectors")

    def _check(self):
        self.counts, self.means, self.eigenvalues, self.eigenvectors = _check_geometry("geometry", self)

    def covariances(self) -> torch.Tensor:
        """(C, D, D) = Xi diag(lambda) Xi^T: the pooled covariances (their top-K part if truncated)."""
        return (self.eigenvectors * self.eigenvalues.unsqueeze(1)) @ self.eigenvectors.mT

    def to(self, device=None, dtype=None) -> "GlobalGeometry":
        """A copy on another device and/or float dtype (counts stay int64)."""
        return GlobalGeometry(self.counts.to(device), self.means.to(device, dtype),
                              self.eigenvalues.to(device, dtype), self.eigenvectors.to(device, dtype))



def _check_counts(name: str, counts, C: int, device) -> torch.Tensor:
    if not isinstance(counts, torch.Tensor):
        raise TypeError(f"{name}.counts must be an int64 torch.Tensor, got {type(counts).__name__}")
    if counts.dtype.is_floating_point or counts.dtype.is_complex or counts.dtype == torch.bool:
        raise TypeError(f"{name}.counts must hold integer sample counts, got dtype {counts.dtype}; "
                        f"use counts.long()")
    if counts.shape != (C,):
        raise ValueError(f"{name}.counts must have shape (C,) = ({C},) to match means, "
                         f"got {tuple(counts.shape)}")
    if counts.device != device:
        raise ValueError(f"{name}.counts is on {counts.device} but means are on {device}")
    _validate.counts(f"{name}.counts", counts)
    return counts.long()


def _check_statistics(name: str, s: ClassStatistics):
    means = _validate.tensor(f"{name}.means", s.means, ndim=2)
    covs = _validate.tensor(f"{name}.covs", s.covs, ndim=3)
    _validate.same_device_dtype(**{f"{name}.means": means, f"{name}.covs": covs})
    C, D = means.shape
    if covs.shape != (C, D, D):
        raise ValueError(f"{name}.covs must have shape (C, D, D) = ({C}, {D}, {D}) to match means "
                         f"{tuple(means.shape)}, got {tuple(covs.shape)}")
    counts = _check_counts(name, s.counts, C, means.device)
    _validate.covariances(f"{name}.covs", covs, counts)
    return counts, means, covs


def _check_geometry(name: str, g: GlobalGeometry):
    means = _validate.tensor(f"{name}.means", g.means, ndim=2)
    ev = _validate.tensor(f"{name}.eigenvalues", g.eigenvalues, ndim=2)
    V = _validate.tensor(f"{name}.eigenvectors", g.eigenvectors, ndim=3)
    _validate.same_device_dtype(**{f"{name}.means": means, f"{name}.eigenvalues": ev,
                                   f"{name}.eigenvectors": V})
    C, D = means.shape
    K = ev.shape[1]
    if ev.shape[0] != C or not 1 <= K <= D or V.shape != (C, D, K):
        raise ValueError(f"{name}: expected eigenvalues (C, K) and eigenvectors (C, D, K) with "
                         f"1 <= K <= D for means (C, D) = {tuple(means.shape)}; got eigenvalues "
                         f"{tuple(ev.shape)}, eigenvectors {tuple(V.shape)}")
    if bool((ev < 0).any()):
        raise ValueError(f"{name}.eigenvalues must be >= 0 (variances), got min {float(ev.min()):.3g}; "
                         "clamp them with eigenvalues.clamp_min(0)")
    if K > 1 and bool((ev[:, 1:] > ev[:, :-1]).any()):
        raise ValueError(f"{name}.eigenvalues must be sorted in descending order along each row "
                         "(n_components keeps the leading ones)")
    counts = _check_counts(name, g.counts, C, means.device)
    held = torch.nonzero(counts > 0).squeeze(1)
    if held.numel():  # a class nobody holds is never sampled: its columns are not used
        W = V[held.to(V.device)].to(torch.float64)
        err = (W.mT @ W - torch.eye(K, dtype=W.dtype, device=W.device)).abs().amax((1, 2))
        bad = torch.nonzero(err > VALUE_RTOL).squeeze(1)
        if bad.numel():
            j = int(bad[0])
            raise ValueError(f"{name}.eigenvectors[{int(held[j])}] are not orthonormal columns: max "
                             f"|V^T V - I| = {float(err[j]):.3g} > {VALUE_RTOL:g} (classes "
                             f"{held[bad.cpu()].tolist()})")
    return counts, means, ev, V


def local_statistics(X: torch.Tensor, y: torch.Tensor, n_classes: int) -> ClassStatistics:
    """Client side: per-class counts, means and biased covariances of its embeddings.

    X: (N, D) float32/float64; y: (N,) integer labels in [0, n_classes). N may be 0.
    """
    counts, means, covs = class_moments(X, y, n_classes)
    return ClassStatistics(counts, means, covs)


@dataclass(eq=False)
class HeldStatistics(_ClassRows):
    """A client's ClassStatistics in less memory, for a server that keeps many: counts and means
    as they are, the covariances of the held classes only (``classes``: those with a nonzero
    count or a nonzero covariance, ascending; every other class's covariance is zero). Not a
    container that travels: build it from a received, checked ClassStatistics
    (``from_statistics``). ``aggregate`` and ``group_prototypes`` take it in place of the
    ClassStatistics it came from and give the same results, bit for bit.
    """
    counts: torch.Tensor
    means: torch.Tensor
    classes: torch.Tensor
    covs: torch.Tensor

    @classmethod
    def from_statistics(cls, stats: ClassStatistics) -> "HeldStatistics":
        if not isinstance(stats, ClassStatistics):
            raise TypeError(f"stats must be a ClassStatistics, got {type(stats).__name__}")
        nonzero = (stats.counts.to(stats.covs.device) > 0) | (stats.covs != 0).flatten(1).any(1)
        classes = torch.nonzero(nonzero).squeeze(1)
        return cls(stats.counts, stats.means, classes, stats.covs[classes])

    def nbytes(self) -> int:
        """The size of the ClassStatistics it stands for (what went up), not of this copy."""
        C, D = self.means.shape
        return nbytes(self.counts, self.means) + C * D * D * self.means.element_size()

    def class_covariance(self, c: int, out: torch.Tensor) -> None:
        """Write class c's covariance into ``out`` (D, D), which holds zeros."""
        j = torch.nonzero(self.classes == c)
        if j.numel():
            out.copy_(self.covs[int(j[0, 0])])


def _check_stats_list(stats_list) -> tuple[int, int]:
    """All entries ClassStatistics (or HeldStatistics) with client 0's C, D, dtype and device;
    returns (C, D)."""
    if isinstance(stats_list, (ClassStatistics, HeldStatistics)) or not hasattr(stats_list, "__len__"):
        raise TypeError("stats_list must be a list of ClassStatistics (one per client)")
    if len(stats_list) == 0:
        raise ValueError("stats_list is empty; it needs at least one client's statistics")
    for k, s in enumerate(stats_list):
        if not isinstance(s, (ClassStatistics, HeldStatistics)):
            raise TypeError(f"stats_list[{k}] is a {type(s).__name__}, not ClassStatistics; "
                            "rebuild received dicts with ClassStatistics.from_dict(d)")
    s0 = stats_list[0]
    C, D = s0.means.shape
    for k, s in enumerate(stats_list[1:], start=1):
        if s.means.shape != (C, D):
            raise ValueError(f"client {k} (stats_list[{k}]) has C={s.means.shape[0]} classes and "
                             f"D={s.means.shape[1]} dims, but client 0 has C={C}, D={D}; all "
                             "clients must use the same label space and embedding")
        if s.means.dtype != s0.means.dtype or s.means.device != s0.means.device:
            raise ValueError(f"client {k} (stats_list[{k}]) is {s.means.dtype} on {s.means.device} "
                             f"but client 0 is {s0.means.dtype} on {s0.means.device}; convert "
                             "them to one dtype and device first")
    return C, D


def aggregate(stats_list, *, n_components: int | None = None) -> GlobalGeometry:
    """Server side: pool the clients' statistics exactly (paper Eq. 4) and eigendecompose.

    stats_list: non-empty sequence of ClassStatistics (or HeldStatistics: same result), all with
    the same C, D, dtype and device. On the CPU the pooling holds one class's (K, D, D) covariances
    at a time (``pool_moments_by_class``: the numbers of ``pool_moments`` on the stacked
    statistics, bit for bit). One batched symmetric eigh over all C classes. Eigenvalues are clamped at 0, and those at
    or below the numerical-rank tolerance D * eps * lambda_max of their class (numpy's
    ``matrix_rank`` convention) are set to exactly 0: they are round-off, and sampling with
    sqrt(lambda) would otherwise amplify 1e-16 into 1e-8 of spurious noise per direction off
    the span of the data. Classes nobody holds get count 0, zero mean and zero eigenvalues.
    n_components: keep only the top K eigenpairs (smaller download; augment can then use at
    most K).
    """
    C, D = _check_stats_list(stats_list)
    K = D if n_components is None else _validate.positive_int("n_components", n_components)
    if K > D:
        raise ValueError(f"n_components={K} is larger than the embedding dimension D={D}")
    counts, means = torch.stack([s.counts for s in stats_list]), torch.stack([s.means for s in stats_list])

    def class_covs(c: int, out: torch.Tensor) -> None:
        for k, s in enumerate(stats_list):
            if isinstance(s, HeldStatistics):
                s.class_covariance(c, out[k])
            else:
                out[k] = s.covs[c]

    if means.device.type == "cpu":  # one class's (K, D, D) at a time, pool_moments' bits
        counts, means, covs = pool_moments_by_class(counts, means, class_covs)
    else:  # the stacked pooling (its bits on this device's BLAS)
        covs = means.new_zeros(len(stats_list), C, D, D)
        for c in range(C):
            class_covs(c, covs[:, c])
        counts, means, covs = pool_moments(counts, means, covs)
    # Pooling is symmetric only up to round-off; make it exact so eigh sees a symmetric matrix.
    covs = 0.5 * (covs + covs.mT)
    ev, V = eigh(covs, k=K)
    tol = D * torch.finfo(ev.dtype).eps * ev[:, :1].clamp_min(0)
    ev = torch.where(ev > tol, ev, torch.zeros_like(ev))
    return GlobalGeometry(counts, means, ev, V)


def prototypes(stats_list, *, exclude: int | None = None):
    """Class prototypes (local class means) of every client except ``exclude``, for the
    multi-domain step. Returns prototypes (P, D) and labels (P,) int64, one row per (client,
    class) with a nonzero count, ordered by client then class.
    """
    _check_stats_list(stats_list)
    if exclude is not None:
        exclude = _validate.positive_int("exclude", exclude, minimum=0)
        if exclude >= len(stats_list):
            raise ValueError(f"exclude={exclude} is not a client index (there are {len(stats_list)})")
    P, L = [], []
    for k, s in enumerate(stats_list):
        if k == exclude:
            continue
        held = torch.nonzero(s.counts > 0).squeeze(1)
        P.append(s.means[held])
        L.append(held)
    if not P:
        return stats_list[0].means[:0], stats_list[0].counts.new_zeros(0)
    return torch.cat(P), torch.cat(L)


def group_prototypes(stats_list, groups, *, exclude=()):
    """Class prototypes of whole groups (domains) for the multi-domain step, leaving out the
    groups in ``exclude``: the paper's rule is that a client augments the prototypes of the *other
    domains*, so a client of domain a receives no prototype of domain a, not even one from
    another client of domain a.

    stats_list: ClassStatistics, one per contributor (a client, or a client's rows of one domain);
    groups: one group id (int) per entry of stats_list; exclude: group ids to leave out. The
    prototype of (group g, class c) is the exact pooled mean of class c over g's entries,
    sum_k n_k mu_k / sum_k n_k. Returns prototypes (P, D), labels (P,) int64 and their groups
    (P,) int64, one row per (group, class) with a nonzero pooled count, ordered by group id then
    class.
    """
    _check_stats_list(stats_list)
    if isinstance(groups, torch.Tensor):
        groups = groups.tolist()
    groups = list(groups)
    if len(groups) != len(stats_list):
        raise ValueError(f"groups has {len(groups)} entries but stats_list has {len(stats_list)}; "
                         "give one group id per entry")
    for i, g in enumerate(groups):
        if isinstance(g, bool) or not isinstance(g, int):
            raise TypeError(f"groups[{i}] must be an int group id, got {g!r}")
    skip = {int(g) for g in exclude}
    s0 = stats_list[0]
    P, L, G = [], [], []
    for g in sorted(set(groups) - skip):
        members = [s for s, h in zip(stats_list, groups) if h == g]
        n = torch.stack([s.counts for s in members]).to(s0.means.dtype)  # (k, C)
        tot = n.sum(0)
        held = torch.nonzero(tot > 0).squeeze(1)
        if held.numel() == 0:
            continue
        sums = sum(s.means * n[i].unsqueeze(1) for i, s in enumerate(members))  # (C, D)
        P.append(sums[held] / tot[held].unsqueeze(1))
        L.append(held.to(s0.counts.device))
        G.append(torch.full((held.numel(),), g, dtype=torch.int64, device=s0.counts.device))
    if not P:
        return s0.means[:0], s0.counts.new_zeros(0), s0.counts.new_zeros(0)
    return torch.cat(P), torch.cat(L), torch.cat(G)


def _sample(X, y, geometry, n_new, generator, noise, n_components, what: str):
    """Shared sampler. n_new: (C,) int64 on CPU, new rows per class. Rows of class c are drawn
    round-robin from that class's rows of X (in their order in X); output grouped by class."""
    C = geometry.n_classes
    local = torch.bincount(y, minlength=C).cpu()
    missing = torch.nonzero((local > 0) & (geometry.counts.cpu() == 0)).squeeze(1)
    if missing.numel():
        raise ValueError(f"class {int(missing[0])} has {what} but count 0 in geometry (classes "
                         f"{missing.tolist()}); the geometry was aggregated without this client's "
                         "statistics or for another label space")
    n_new = torch.where(local > 0, n_new, torch.zeros_like(n_new))
    total = int(n_new.sum())
    K = geometry.eigenvalues.shape[1]
    k = K if n_components is None else _validate.positive_int("n_components", n_components)
    if k > K:
        raise ValueError(f"n_components={k} is larger than the {K} eigenpairs in geometry")
    gen = _random.resolve(generator, X.device)
    X_new = X.new_empty(total, X.shape[1])
    y_new = torch.repeat_interleave(torch.arange(C), n_new).to(y.device)
    if total == 0:
        return X_new, y_new
    eps = _random.randn((total, k), gen, dtype=X.dtype, device=X.device)

    # Source rows: class c's local rows in X order, cycled round-robin to n_new[c] rows.
    classes = torch.nonzero(n_new).squeeze(1).tolist()
    order = torch.argsort(y, stable=True).cpu()
    starts = torch.cumsum(local, 0) - local
    src = torch.cat([order[starts[c] + torch.arange(int(n_new[c])) % local[c]] for c in classes])
    torch.index_select(X, 0, src.to(X.device), out=X_new)
    lo = 0
    for c in classes:
        hi = lo + int(n_new[c])
        lam = geometry.eigenvalues[c, :k]
        scale = lam.sqrt() if noise == "sqrt" else lam
        W = scale.unsqueeze(1) * geometry.eigenvectors[c, :, :k].T  # (k, D) = diag(s) Xi^T
        X_new[lo:hi].addmm_(eps[lo:hi], W)  # the one GEMM per class
        lo = hi
    return X_new, y_new


def _check_inputs(name: str, X, labels_name: str, y, geometry):
    if not isinstance(geometry, GlobalGeometry):
        raise TypeError(f"geometry must be a GlobalGeometry (from ggeur.aggregate or "
                        f"GlobalGeometry.from_dict), got {type(geometry).__name__}")
    X = _validate.tensor(name, X, ndim=2, allow_empty=True)
    _validate.same_dim(name, X, "geometry.means", geometry.means)
    if geometry.means.device != X.device or geometry.means.dtype != X.dtype:
        raise ValueError(f"geometry is {geometry.means.dtype} on {geometry.means.device} but {name} "
                         f"is {X.dtype} on {X.device}; use geometry.to({name}.device, {name}.dtype)")
    y = _validate.labels(labels_name, y, X.shape[0], geometry.n_classes, device=X.device)
    return X, y


def augment(X: torch.Tensor, y: torch.Tensor, geometry: GlobalGeometry, *,
            n_per_sample: int | None = None, target_per_class: int | None = None,
            generator: torch.Generator | None = None, noise: str = "sqrt",
            n_components: int | None = None):
    """Client side: new samples x' = x + sum_m eps_m s_m xi_m around the local samples.

    X: (N, D) local embeddings, y: (N,) labels in [0, C); geometry from ``aggregate`` on X's
    device and dtype. Exactly one of
      n_per_sample: int >= 0, that many new samples per local sample;
      target_per_class: int >= 0, max(0, target - n_c) new samples for each class c the client
        holds (n_c > 0), spread round-robin over that class's local samples (so when fewer
        than n_c are needed, the first ones in X order are used: shuffle X for a random
        choice). Classes with no local sample get none (use ``augment_prototypes`` for those).
    generator: a torch.Generator makes the draw reproducible (on any device: the numbers are
      drawn on its device and moved to X's, so a CPU generator draws the same numbers for CPU
      and CUDA X); None (the default) draws from a fresh, secretly seeded generator on X's
      device (geomkern._random).
    noise: "sqrt" (s = sqrt(lambda): x' - x ~ N(0, Sigma_c), as the official code samples) or
      "paper" (s = lambda, as the paper's equation prints it).
    n_components: use only the top n_components eigenpairs of each class (default: all).

    Returns only the generated samples (X_new (M, D), y_new (M,) int64), on X's device and in
    X's dtype, grouped by class in ascending order; within class c, row j comes from the
    class's (j mod n_c)-th local sample in X order. The caller concatenates them with X.
    Raises ValueError if a class with local samples has count 0 in geometry.
    """
    X, y = _check_inputs("X", X, "y", y, geometry)
    noise = _validate.choice("noise", noise, NOISE_MODES)
    if (n_per_sample is None) == (target_per_class is None):
        raise ValueError("give exactly one of n_per_sample (new samples per local sample) or "
                         "target_per_class (total samples per class after augmentation)")
    local = torch.bincount(y, minlength=geometry.n_classes).cpu()
    if n_per_sample is not None:
        m = _validate.positive_int("n_per_sample", n_per_sample, minimum=0)
        n_new = local * m
    else:
        t = _validate.positive_int("target_per_class", target_per_class, minimum=0)
        n_new = (t - local).clamp_min(0)
    return _sample(X, y, geometry, n_new, generator, noise, n_components, "local samples")


def augment_prototypes(prototypes: torch.Tensor, labels: torch.Tensor, geometry: GlobalGeometry,
                       *, n_per_prototype: int, generator: torch.Generator | None = None,
                       noise: str = "sqrt", n_components: int | None = None):
    """Multi-domain step: samples around other clients'/domains' class prototypes.

    prototypes: (P, D) (e.g. from ``ggeur.prototypes(stats_list, exclude=me)``), labels: (P,)
    in [0, C). Each prototype p of class c gets n_per_prototype samples p + sum_m eps_m s_m xi_m
    with class c's global eigenbasis: the same sampler, arguments and output order as
    ``augment(prototypes, labels, geometry, n_per_sample=n_per_prototype, ...)``.
    """
    prototypes, labels = _check_inputs("prototypes", prototypes, "labels", labels, geometry)
    noise = _validate.choice("noise", noise, NOISE_MODES)
    m = _validate.positive_int("n_per_prototype", n_per_prototype, minimum=0)
    n_new = torch.bincount(labels, minlength=geometry.n_classes).cpu() * m
    return _sample(prototypes, labels, geometry, n_new, generator, noise, n_components,
                   "prototypes")
