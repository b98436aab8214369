"""scikit-learn estimators over geomkern's kernel PCA and K-Means (``import geomkern.sklearn``).

Thin wrappers: input is checked as scikit-learn checks it (``validate_data``: float64, float32
kept), computed by ``gk.kpca`` / ``gk.kpca_transform`` / ``gk.kmeans`` on ``device``, returned as
NumPy (or pandas through ``set_output``). The batched estimators fit every group of rows
(``groups=``) in one geomkern call, where scikit-learn needs one estimator per group.
``geomkern`` does not import this module, so scikit-learn (>= 1.6) stays optional.

Checks of ``sklearn.utils.estimator_checks`` that cannot pass are listed, with the reason, by
:func:`expected_failed_checks` (scikit-learn >= 1.6 takes them as ``check_estimator(...,
expected_failed_checks=...)``; the ``_xfail_checks`` tag of older releases is gone).
"""
from __future__ import annotations

import numbers

import numpy as np
import torch

try:
    from sklearn.base import BaseEstimator, ClassNamePrefixFeaturesOutMixin, ClusterMixin, TransformerMixin
    from sklearn.utils import check_random_state
    from sklearn.utils.validation import check_is_fitted, column_or_1d, validate_data
except ImportError as e:  # validate_data and __sklearn_tags__ arrived in scikit-learn 1.6
    raise ImportError("geomkern.sklearn needs scikit-learn >= 1.6: pip install 'scikit-learn>=1.6'") from e

from . import _validate, kmeans, kpca, kpca_transform, median_gamma

__all__ = ["BatchedKMeans", "BatchedKernelPCA", "KMeans", "KernelPCA", "expected_failed_checks"]


def expected_failed_checks(estimator) -> dict[str, str]:
    """The scikit-learn estimator checks ``estimator`` cannot pass, by name, with the reason
    (none today)."""
    return {}


def _device(device, X) -> torch.device:
    """``device``, else the device of a torch input, else the CPU."""
    if device is None:
        return X.device if isinstance(X, torch.Tensor) else torch.device("cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"device={device!r} is not a torch device; pass e.g. 'cpu', 'cuda' or "
                         "'cuda:1' (None: the device of a torch input, else the CPU)") from e
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={device!r} but torch.cuda.is_available() is False; pass device='cpu'")
    return dev


def _rows(est, X, device: torch.device, *, reset: bool) -> torch.Tensor:
    """X checked by scikit-learn (float32 kept, anything else float64) as a tensor on ``device``.
    Fitting copies X (the estimator keeps it; later edits of the caller's array must not reach
    it); predicting reads the caller's array in place where it can."""
    if isinstance(X, torch.Tensor):
        X = X.detach().cpu().numpy()  # validate_data reads host arrays
    X = validate_data(est, X, reset=reset, dtype=[np.float64, np.float32], order="C")
    t = torch.tensor(X) if reset or not X.flags.writeable else torch.from_numpy(X)
    return t.to(device)


def _positive_int(name: str, v) -> int:
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
    return int(v)


def _plain(v):
    """A NumPy scalar as the Python value it holds (for messages: 'a', not np.str_('a'))."""
    return v.item() if isinstance(v, np.generic) else v


class _Groups:
    """Rows sorted by group: ``names`` (m,) the sorted distinct ids, ``order`` (n,) the row
    permutation that sorts them, ``offsets`` (m+1,) int64 CSR boundaries of the sorted rows,
    ``index`` (n,) each caller row's group number."""

    def __init__(self, groups, n: int):
        if groups is None:
            groups = np.zeros(n, dtype=np.int64)  # one group, named 0
        groups = column_or_1d(groups, warn=True)
        if groups.shape[0] != n:
            raise ValueError(f"groups has {groups.shape[0]} entries but X has {n} rows; pass one "
                             "group id per row of X")
        try:
            self.names, self.index = np.unique(groups, return_inverse=True)
        except TypeError as e:
            raise ValueError("groups must hold ids of one comparable kind (all numbers or all "
                             "strings)") from e
        self.order = np.argsort(self.index, kind="stable")
        self.sizes = np.bincount(self.index, minlength=len(self.names))
        self.offsets = torch.from_numpy(np.concatenate([[0], np.cumsum(self.sizes)]).astype(np.int64))

    def require(self, name: str, value: int) -> None:
        """Every group has at least ``value`` rows (``value``: the parameter ``name``)."""
        j = int(np.argmin(self.sizes))
        if self.sizes[j] < value:
            where = "X has" if len(self.names) == 1 else f"group {_plain(self.names[j])!r} has"
            raise ValueError(f"{name}={value} is larger than the number of samples ({where} "
                             f"n_samples={self.sizes[j]}); lower {name}")


def _lookup(names: np.ndarray, groups, n: int) -> np.ndarray:
    """Each row's group number in ``names`` (the fitted groups); an unseen group is an error."""
    if groups is None:
        if len(names) != 1:
            raise ValueError(f"groups is required: the estimator was fitted on {len(names)} groups; "
                             "pass groups=, one fitted group id per row of X")
        return np.zeros(n, dtype=np.int64)
    groups = column_or_1d(groups, warn=True)
    if groups.shape[0] != n:
        raise ValueError(f"groups has {groups.shape[0]} entries but X has {n} rows; pass one group "
                         "id per row of X")
    try:
        idx = np.minimum(np.searchsorted(names, groups), len(names) - 1)
        unseen = names[idx] != groups
    except TypeError:  # ids of another kind than the fitted ones (e.g. str against int)
        known = {g: i for i, g in enumerate(names.tolist())}
        idx = np.array([known.get(g, -1) for g in groups.tolist()], dtype=np.int64)
        unseen = idx < 0
    if unseen.any():
        bad = _plain(groups[int(np.argmax(unseen))])
        shown = ", ".join(repr(g) for g in names[:10].tolist()) + (", ..." if len(names) > 10 else "")
        raise ValueError(f"group {bad!r} was not seen in fit (fitted groups: {shown}); fit on rows of "
                         "that group first")
    return idx.astype(np.int64)


def _by_group(Z: torch.Tensor, index: np.ndarray, m: int, fn) -> torch.Tensor:
    """Rows of Z scattered by group: ``fn(Z_j, j)`` on the rows of each group j, results in Z's
    row order (one sort, then contiguous slices)."""
    order = np.argsort(index, kind="stable")
    bounds = np.searchsorted(index[order], np.arange(m + 1))
    order_t = torch.from_numpy(order).to(Z.device)
    out = None
    for j in range(m):
        if bounds[j] == bounds[j + 1]:
            continue
        rows = order_t[bounds[j]:bounds[j + 1]]
        r = fn(Z[rows], j)
        if out is None:
            out = r.new_empty((Z.shape[0],) + tuple(r.shape[1:]))
        out[rows] = r
    return out


# ---------------------------------------------------------------------------------- kernel PCA

class _KernelPCABase(ClassNamePrefixFeaturesOutMixin, TransformerMixin, BaseEstimator):
    def __init__(self, n_components=2, *, gamma=None, solver="auto",
                 precision=_validate.DEFAULT_PRECISION, device=None):
        self.n_components = n_components
        self.gamma = gamma
        self.solver = solver
        self.precision = precision
        self.device = device

    def _fit(self, X, groups) -> _Groups:
        d = _positive_int("n_components", self.n_components)
        if self.gamma is not None:
            _validate.gamma(self.gamma)
        device = _device(self.device, X)
        Xt = _rows(self, X, device, reset=True)
        g = _Groups(groups, Xt.shape[0])
        g.require("n_components", d)
        Xs = Xt[torch.from_numpy(g.order).to(device)] if len(g.names) > 1 else Xt
        if self.gamma is None and Xs.shape[0] < 2:
            raise ValueError("gamma=None (the median heuristic) needs 2 or more samples, X has "
                             "n_samples=1; pass gamma")
        # One gamma for every group: gk.kpca fits all clusters under one kernel.
        gamma = median_gamma(Xs) if self.gamma is None else float(self.gamma)
        self.fit_ = kpca(Xs, g.offsets.to(device), n_components=d, gamma=gamma, solver=self.solver,
                         precision=self.precision)
        self.X_fit_, self.gamma_, self.device_ = Xs, gamma, device
        self.eigenvalues_ = self.fit_.eigenvalues.cpu().numpy()
        return g

    def _training_scores(self, g: _Groups) -> np.ndarray:
        """Scores of the fitted rows without a second Gram (K_c alpha = mu alpha), in the
        caller's row order."""
        fit = self.fit_
        seg = torch.from_numpy(g.index[g.order]).to(self.device_)
        out = torch.empty_like(fit.alphas)
        out[torch.from_numpy(g.order).to(self.device_)] = fit.alphas * fit.eigenvalues[seg]
        return out.cpu().numpy()

    def _transform(self, X, groups):
        check_is_fitted(self)
        Z = _rows(self, X, self.device_, reset=False).to(self.X_fit_.dtype)
        segment = None
        if groups is not None or self.fit_.n_clusters > 1:
            idx = _lookup(self.groups_, groups, Z.shape[0])
            segment = torch.from_numpy(idx).to(self.device_) if self.fit_.n_clusters > 1 else None
        return kpca_transform(Z, self.X_fit_, self.fit_, gamma=self.gamma_,
                              segment=segment).cpu().numpy()

    @property
    def _n_features_out(self):
        return self.fit_.n_components

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.transformer_tags.preserves_dtype = ["float64", "float32"]
        return tags


class KernelPCA(_KernelPCABase):
    """RBF kernel PCA (``gk.kpca``): ``sklearn.decomposition.KernelPCA(kernel="rbf")``'s
    transform, top ``n_components`` only.

    gamma: the RBF width; None is the median heuristic ``gk.median_gamma(X)`` (scikit-learn's
    None is 1 / n_features). solver, precision: as in ``gk.kpca``. device: where it computes
    (None: the device of a torch input, else the CPU); results come back as NumPy.
    Attributes: eigenvalues_ (n_components,) centred-Gram eigenvalues (descending), gamma_,
    fit_ (the ``gk.KPCAFit``), X_fit_ (the fitted rows, a tensor on device_), n_features_in_,
    feature_names_in_ (pandas input).
    """

    def fit(self, X, y=None):
        self._fit(X, None)
        self.eigenvalues_ = self.eigenvalues_[0]
        return self

    def transform(self, X):
        return self._transform(X, None)

    def fit_transform(self, X, y=None):
        g = self._fit(X, None)
        self.eigenvalues_ = self.eigenvalues_[0]
        return self._training_scores(g)


class BatchedKernelPCA(_KernelPCABase):
    """One RBF kernel PCA per group of rows, all groups in one ``gk.kpca`` call.

    groups: one id per row of X (numbers or strings); None is one group (named 0). Every group
    needs >= n_components rows. transform scores each row in its own group's components, so it
    needs the rows' groups too (None only for a fit of one group); an id not seen in fit raises.
    One gamma for all groups (None: the median heuristic over all rows), as ``gk.kpca`` has one.
    Attributes: groups_ (m,) sorted ids, eigenvalues_ (m, n_components), gamma_, fit_,
    X_fit_ (the fitted rows sorted by group, a tensor on device_), n_features_in_.
    """

    def fit(self, X, y=None, groups=None):
        self.groups_ = self._fit(X, groups).names
        return self

    def transform(self, X, groups=None):
        return self._transform(X, groups)

    def fit_transform(self, X, y=None, groups=None):
        g = self._fit(X, groups)
        self.groups_ = g.names
        return self._training_scores(g)


# ------------------------------------------------------------------------------------- K-Means

def _sqdist(Z: torch.Tensor, C: torch.Tensor) -> torch.Tensor:
    """(b, D), (k, D) -> (b, k) squared distances, measured from the centres' mean: the
    expansion |z|^2 + |c|^2 - 2<z, c> cancels on data far from the origin (design math note 10)."""
    s = C.mean(0)
    Zs, Cs = Z - s, C - s
    d2 = (Zs * Zs).sum(1, keepdim=True) + (Cs * Cs).sum(1) - 2.0 * (Zs @ Cs.T)
    return d2.clamp_min_(0.0)


def _assign(Z: torch.Tensor, centers: torch.Tensor, index: np.ndarray):
    """Nearest centre of each row of Z among its group's: labels (b,) int64 and the squared
    distance to that centre (b,) float64, computed as |z - c|^2 directly (no cancellation)."""
    labels = _by_group(Z, index, centers.shape[0], lambda Zj, j: _sqdist(Zj, centers[j]).argmin(1))
    seg = torch.from_numpy(index).to(Z.device)
    d2 = torch.linalg.vector_norm(Z - centers[seg, labels], dim=1, dtype=torch.float64).square()
    return labels, d2


class _KMeansBase(ClassNamePrefixFeaturesOutMixin, TransformerMixin, ClusterMixin, BaseEstimator):
    def __init__(self, n_clusters=8, *, n_init=1, max_iter=50, random_state=None,
                 precision=_validate.DEFAULT_PRECISION, device=None):
        self.n_clusters = n_clusters
        self.n_init = n_init
        self.max_iter = max_iter
        self.random_state = random_state
        self.precision = precision
        self.device = device

    def _fit(self, X, groups):
        k = _positive_int("n_clusters", self.n_clusters)
        n_init = _positive_int("n_init", self.n_init)
        iters = _positive_int("max_iter", self.max_iter)
        _validate.precision(self.precision)
        device = _device(self.device, X)
        Xt = _rows(self, X, device, reset=True)
        g = _Groups(groups, Xt.shape[0])
        g.require("n_clusters", k)
        order = torch.from_numpy(g.order).to(device)
        Xs, index = (Xt[order] if len(g.names) > 1 else Xt), g.index[g.order]
        seed = int(check_random_state(self.random_state).randint(np.iinfo(np.int32).max))
        # gk.kmeans keeps each group's lowest-inertia start of n_init; one last assignment to
        # the kept centres gives labels_ that agree with predict (a run stopped by max_iter
        # moved its centres after its last assignment) and the float64 inertia of those labels.
        res = kmeans(Xs, k, offsets=g.offsets.to(device), iters=iters, seed=seed, n_init=n_init,
                     precision=self.precision)
        centers = res.centers
        labels, d2 = _assign(Xs, centers, index)
        inertia = torch.zeros(len(g.names), dtype=torch.float64, device=device).index_add_(
            0, torch.from_numpy(index).to(device), d2)
        out = torch.empty_like(labels)
        out[order] = labels
        self.labels_ = out.cpu().numpy()
        self.device_ = device
        return g, centers.cpu().numpy(), inertia.cpu().numpy(), res.n_iter.cpu().numpy()

    def _centers(self):
        C = self.cluster_centers_
        return C.reshape(-1, C.shape[-2], C.shape[-1])  # (m, k, D): one group for KMeans

    def _rows_and_groups(self, X, groups):
        check_is_fitted(self)
        Z = _rows(self, X, self.device_, reset=False)
        C = torch.from_numpy(self._centers()).to(device=self.device_, dtype=Z.dtype)
        names = getattr(self, "groups_", np.zeros(1, dtype=np.int64))
        return Z, C, _lookup(names, groups, Z.shape[0])

    def _predict(self, X, groups):
        Z, C, index = self._rows_and_groups(X, groups)
        return _assign(Z, C, index)[0].cpu().numpy()

    def _transform(self, X, groups):
        Z, C, index = self._rows_and_groups(X, groups)
        return _by_group(Z, index, C.shape[0], lambda Zj, j: _sqdist(Zj, C[j]).sqrt_()).cpu().numpy()

    def _score(self, X, groups):
        Z, C, index = self._rows_and_groups(X, groups)
        return -float(_assign(Z, C, index)[1].sum())

    @property
    def _n_features_out(self):
        return self.cluster_centers_.shape[-2]

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.transformer_tags.preserves_dtype = ["float64", "float32"]
        return tags


class KMeans(_KMeansBase):
    """K-Means (Lloyd, greedy k-means++ init) by ``gk.kmeans``: ``sklearn.cluster.KMeans``'s
    fit / predict / transform (distances to the centres) / score (minus the inertia).

    n_init: runs from seeds drawn from random_state, the lowest inertia kept. max_iter: Lloyd
    iterations per run. precision, device: as in ``gk.kmeans`` / :class:`KernelPCA`.
    Attributes: cluster_centers_ (n_clusters, n_features), labels_, inertia_ (float64, the sum of
    squared distances to the nearest centre), n_iter_ (the kept run's Lloyd assignment passes),
    n_features_in_, feature_names_in_ (pandas input).
    """

    def fit(self, X, y=None):
        _, centers, inertia, n_iter = self._fit(X, None)
        self.cluster_centers_, self.inertia_, self.n_iter_ = centers[0], float(inertia[0]), int(n_iter[0])
        return self

    def predict(self, X):
        return self._predict(X, None)

    def transform(self, X):
        return self._transform(X, None)

    def score(self, X, y=None):
        return self._score(X, None)


class BatchedKMeans(_KMeansBase):
    """One K-Means per group of rows, all groups in one ``gk.kmeans`` call per init.

    groups: one id per row of X (numbers or strings); None is one group (named 0). Every group
    needs >= n_clusters rows. predict / transform / score take the rows' groups too (None only
    for a fit of one group); an id not seen in fit raises. n_init keeps, per group, the run of
    lowest inertia. labels_ are cluster ids within each row's group.
    Attributes: groups_ (m,) sorted ids, cluster_centers_ (m, n_clusters, n_features),
    inertia_ (m,) float64 per group, n_iter_ (m,) Lloyd assignment passes per group, labels_,
    n_features_in_.
    """

    def fit(self, X, y=None, groups=None):
        g, self.cluster_centers_, self.inertia_, self.n_iter_ = self._fit(X, groups)
        self.groups_ = g.names
        return self

    def predict(self, X, groups=None):
        return self._predict(X, groups)

    def transform(self, X, groups=None):
        return self._transform(X, groups)

    def fit_transform(self, X, y=None, groups=None):
        return self.fit(X, groups=groups).transform(X, groups=groups)

    def score(self, X, y=None, groups=None):
        return self._score(X, groups)
