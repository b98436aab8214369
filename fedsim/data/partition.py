"""Client partitions of a training set: IID, Dirichlet label skew, domain skew, label+domain skew;
and a feature-shift option over any of them (``feature_shift``: per-client rotation + noise).

Each partitioner returns a list of int64 index tensors (one per client) into the training set,
deterministic for a seed.
"""
from __future__ import annotations

import math

import numpy as np
import torch

SCHEMES = ("iid", "dirichlet", "domain", "label_domain")
# the schemes that draw from a Dirichlet(beta) (iid uses no beta; partition() below)
USES_BETA = ("dirichlet", "domain", "label_domain")
_SHIFT = 0x5F17  # key of the feature-shift option's streams in the seeded numpy generators


def _check(n: int, n_clients: int, min_size: int) -> None:
    if n_clients < 1:
        raise ValueError(f"n_clients must be >= 1, got {n_clients}")
    if n_clients * max(min_size, 1) > n:
        raise ValueError(f"{n_clients} clients with at least {max(min_size, 1)} samples each need "
                         f"{n_clients * max(min_size, 1)} samples, but the training set has {n}; "
                         "use fewer clients or a smaller min_size")


def iid(n: int, n_clients: int, *, seed: int) -> list[torch.Tensor]:
    _check(n, n_clients, 1)
    perm = np.random.default_rng(seed).permutation(n)
    return [torch.from_numpy(np.sort(p)).long() for p in np.array_split(perm, n_clients)]


def dirichlet(labels, n_clients: int, *, beta: float, seed: int, min_size: int = 10,
              max_redraws: int = 100) -> list[torch.Tensor]:
    """Label skew, NIID-Bench / flwr-datasets convention: for every class, client proportions
    p ~ Dir(beta); a client already holding N/K samples gets no more of the next classes (the
    balancing step); the whole draw is repeated until every client has >= min_size samples
    (at most ``max_redraws`` times)."""
    if not beta > 0:
        raise ValueError(f"beta must be > 0 (smaller = more skewed), got {beta}")
    y = np.asarray(labels.cpu() if isinstance(labels, torch.Tensor) else labels)
    n = len(y)
    _check(n, n_clients, min_size)
    rng = np.random.default_rng(seed)
    classes = np.unique(y)
    for _ in range(max_redraws):
        parts: list[list[int]] = [[] for _ in range(n_clients)]
        for c in classes:
            idx = rng.permutation(np.nonzero(y == c)[0])
            p = rng.dirichlet(np.full(n_clients, beta))
            sizes = np.array([len(q) for q in parts])
            p = p * (sizes < n / n_clients)
            if p.sum() == 0:  # every client is full: fall back to the raw draw
                p = rng.dirichlet(np.full(n_clients, beta))
            p = p / p.sum()
            cuts = (np.cumsum(p) * len(idx)).astype(int)[:-1]
            for k, chunk in enumerate(np.split(idx, cuts)):
                parts[k].extend(chunk.tolist())
        if min(len(q) for q in parts) >= min_size:
            return [torch.tensor(sorted(q), dtype=torch.int64) for q in parts]
    raise ValueError(f"no Dirichlet(beta={beta}) partition into {n_clients} clients gave every client "
                     f">= {min_size} samples in {max_redraws} draws; raise beta, lower min_size or "
                     "use fewer clients")


def _clients_per_domain(scheme: str, n_doms: int, n_clients: int | None, default: int) -> list[np.ndarray]:
    """Client ids of each domain: ``n_clients`` spread over the domains as evenly as possible
    (the first domains get one more when it does not divide)."""
    n_clients = default if n_clients is None else n_clients
    if n_clients < n_doms:
        raise ValueError(f"{scheme} skew needs at least one client per domain: the data has {n_doms} domains, "
                         f"but n_clients (--clients) is {n_clients}")
    return np.array_split(np.arange(n_clients), n_doms)


def domain_skew(domains, n_clients: int | None = None, *, seed: int, labels=None, beta: float | None = None,
                min_size: int = 1, max_redraws: int = 100) -> list[torch.Tensor]:
    """Each client holds data of one domain. Default: 2 clients per domain. The clients of a domain
    split it by label skew, a Dirichlet(``beta``) client x class draw inside the domain (``dirichlet``,
    redrawn until each of them has >= ``min_size`` samples, or as many as a small domain can give
    each; FedMC reports beta for domain skew); with
    ``beta=None`` or no ``labels`` they split it IID. Every sample is used exactly once."""
    d = np.asarray(domains.cpu() if isinstance(domains, torch.Tensor) else domains)
    doms = np.unique(d)
    per = _clients_per_domain("domain", len(doms), n_clients, 2 * len(doms))
    _check(len(d), sum(len(c) for c in per), 1)
    if beta is None or labels is None:
        rng = np.random.default_rng(seed)
        parts = []
        for dom, clients in zip(doms, per):
            idx = rng.permutation(np.nonzero(d == dom)[0])
            parts.extend(np.sort(c) for c in np.array_split(idx, len(clients)))
        return [torch.from_numpy(p).long() for p in parts]
    y = np.asarray(labels.cpu() if isinstance(labels, torch.Tensor) else labels)
    parts = []
    for i, (dom, clients) in enumerate(zip(doms, per)):
        rows = np.nonzero(d == dom)[0]
        if len(rows) < len(clients):  # a client is left empty: partition() refuses that, naming --clients
            parts.extend(torch.from_numpy(r).long() for r in np.array_split(rows, len(clients)))
            continue
        # a small domain asks no more per client than it can give (at least 1)
        sub = dirichlet(y[rows], len(clients), beta=beta, seed=seed + 7919 * i,
                        min_size=max(1, min(min_size, len(rows) // len(clients))), max_redraws=max_redraws)
        parts.extend(torch.from_numpy(rows[s.numpy()]).long() for s in sub)
    return parts


def label_domain_skew(labels, domains, n_clients: int | None = None, *, beta: float, seed: int,
                      min_size: int = 5, max_redraws: int = 100) -> list[torch.Tensor]:
    """Label and domain skew as GGEUR builds Office-Home-LDS: one client per domain (default); for
    every class c, p ~ Dir(beta) over the domains, and domain k keeps floor(p_k x n_kc) of its own
    n_kc samples of class c (a seeded random subset); the rest is not used. So each domain's class
    histogram follows its own share of the Dirichlet draws (label skew across the domains), and
    every sample is used at most once. With more clients than domains, the clients of a domain split
    its kept samples IID. The whole draw is repeated until every client has >= ``min_size`` samples
    (at most ``max_redraws`` times)."""
    if not beta > 0:
        raise ValueError(f"beta must be > 0 (smaller = more skewed), got {beta}")
    y = np.asarray(labels.cpu() if isinstance(labels, torch.Tensor) else labels)
    d = np.asarray(domains.cpu() if isinstance(domains, torch.Tensor) else domains)
    doms, classes = np.unique(d), np.unique(y)
    per = _clients_per_domain("label-domain", len(doms), n_clients, len(doms))
    K = sum(len(c) for c in per)
    _check(len(y), K, min_size)
    rng = np.random.default_rng(seed)
    for _ in range(max_redraws):
        kept: list[list[np.ndarray]] = [[] for _ in doms]
        for c in classes:
            p = rng.dirichlet(np.full(len(doms), beta))
            for i, dom in enumerate(doms):
                idx = rng.permutation(np.nonzero((d == dom) & (y == c))[0])
                kept[i].append(idx[:int(p[i] * len(idx))])
        parts = []
        for rows, clients in zip(kept, per):
            rows = rng.permutation(np.concatenate(rows))
            parts.extend(np.sort(s) for s in np.array_split(rows, len(clients)))
        if min(len(q) for q in parts) >= min_size:
            return [torch.from_numpy(q).long() for q in parts]
    raise ValueError(f"no label-domain partition (Dirichlet(beta={beta}) over {len(doms)} domains per class) gave "
                     f"every one of the {K} clients >= {min_size} samples in {max_redraws} draws; raise beta, "
                     "lower min_size or use fewer clients")


def partition(scheme: str, *, labels, domains=None, n_clients: int | None, beta: float = 0.5,
              seed: int = 0, min_size: int = 10) -> list[torch.Tensor]:
    if scheme not in SCHEMES:
        raise ValueError(f"partition={scheme!r} is not known; choose one of {SCHEMES}")
    if scheme in ("domain", "label_domain") and domains is None:
        raise ValueError(f"partition={scheme!r} needs domain ids; this dataset has none")
    if scheme == "iid":
        parts = iid(len(labels), n_clients or 10, seed=seed)
    elif scheme == "dirichlet":
        parts = dirichlet(labels, n_clients or 10, beta=beta, seed=seed, min_size=min_size)
    elif scheme == "domain":  # min_size capped at 5 in the domain schemes: a domain is a fraction of the data
        parts = domain_skew(domains, n_clients, seed=seed, labels=labels, beta=beta, min_size=min(min_size, 5))
    else:
        parts = label_domain_skew(labels, domains, n_clients, beta=beta, seed=seed, min_size=min(min_size, 5))
    # A client without samples cannot train, be averaged (weight 0) or send geometry: refused here,
    # so the round loop, the augmenters and the aggregation never meet one.
    empty = [k for k, p in enumerate(parts) if p.numel() == 0]
    if empty:
        raise ValueError(f"partition={scheme!r} leaves client(s) {empty} of {len(parts)} without samples "
                         f"(a domain with fewer rows than its clients); use fewer clients (--clients)")
    return parts


def client_rotation(dim: int, angle: float, *, seed: int, client: int) -> torch.Tensor:
    """Client ``client``'s fixed rotation (dim, dim) float64: expm(angle * A), A the skew-symmetric
    (G - G^T) / sqrt(2 dim) of a seeded Gaussian G. A's eigenvalues are +-i w with w spread over
    about [0, 2], so ``angle`` sets how far a row turns: 0 is the identity; on the embedded data (384-d)
    the mean cosine between x and R_k x is 0.88 / 0.58 / 0.23 at angle 0.5 / 1 / 1.5, and between
    two clients' views R_j x and R_k x 0.77 / 0.33 / 0.04."""
    G = torch.from_numpy(np.random.default_rng([seed, client, _SHIFT, 0]).standard_normal((dim, dim)))
    return torch.linalg.matrix_exp(angle * (G - G.T) / math.sqrt(2 * dim))


def _shift_rows(x: torch.Tensor, R: torch.Tensor, noise: float, rng: np.random.Generator) -> torch.Tensor:
    x64 = x.to(torch.float64)
    out = x64 @ R.T
    if noise > 0:  # per-coordinate std noise / sqrt(D): the noise vector's norm is about ``noise``
        out = out + torch.from_numpy(rng.standard_normal(tuple(x.shape))) * (noise / math.sqrt(x.shape[1]))
    # rows keep their norm (unit-norm embeddings stay unit-norm)
    out = out * (x64.norm(dim=1, keepdim=True) / out.norm(dim=1, keepdim=True).clamp_min(1e-300))
    return out.to(x.dtype)


def feature_shift(x_clients: list[torch.Tensor], x_test: torch.Tensor, *, angle: float, noise: float,
                  seed: int) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
    """Feature-shift option of any partition: client k sees its rows x through its own fixed
    rotation R_k (``client_rotation``) plus fixed Gaussian noise (drawn once per row from (seed, k)),
    each row rescaled to its original norm. The test set is split evenly among the clients by a
    seeded permutation and every test row is seen through its client's view (its own noise stream),
    so the global model is evaluated on the union of the clients' views.

    Returns (client views, test view, test owner (m,) int64). New tensors; the dataset is untouched."""
    for name, v in (("feature_shift", angle), ("feature_noise", noise)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise ValueError(f"{name} must be a finite number >= 0, got {v!r}")
    K, D = len(x_clients), x_test.shape[1]
    rots = [client_rotation(D, float(angle), seed=seed, client=k) for k in range(K)]
    views = [_shift_rows(x, rots[k], noise, np.random.default_rng([seed, k, _SHIFT, 1]))
             for k, x in enumerate(x_clients)]
    owner = np.empty(x_test.shape[0], dtype=np.int64)
    for k, rows in enumerate(np.array_split(np.random.default_rng([seed, _SHIFT, 3]).permutation(len(owner)), K)):
        owner[rows] = k
    owner = torch.from_numpy(owner)
    test = x_test.clone()
    for k in range(K):
        rows = torch.nonzero(owner == k).squeeze(1)
        test[rows] = _shift_rows(x_test[rows], rots[k], noise, np.random.default_rng([seed, k, _SHIFT, 2]))
    return views, test, owner


def class_matrix(parts: list[torch.Tensor], labels, n_classes: int) -> np.ndarray:
    """(clients, classes) sample counts."""
    y = torch.as_tensor(labels)
    return np.stack([torch.bincount(y[p], minlength=n_classes).numpy() for p in parts])

