"""Client partitions of a training set: IID, Dirichlet label skew, domain skew, label+domain skew.

Each partitioner returns a list of int64 index tensors (one per client) into the training set,
deterministic for a seed.
"""
from __future__ import annotations

import numpy as np
import torch

SCHEMES = ("iid", "dirichlet", "domain", "label_domain")


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


def domain_skew(domains, n_clients: int | None = None, *, seed: int) -> list[torch.Tensor]:
    """Each client holds data of one domain; the clients of a domain split it IID.
    Default: 2 clients per domain."""
    d = np.asarray(domains.cpu() if isinstance(domains, torch.Tensor) else domains)
    doms = np.unique(d)
    n_clients = 2 * len(doms) if n_clients is None else n_clients
    if n_clients < len(doms):
        raise ValueError(f"domain skew needs at least one client per domain ({len(doms)}), got {n_clients}")
    _check(len(d), n_clients, 1)
    rng = np.random.default_rng(seed)
    per = np.array_split(np.arange(n_clients), len(doms))
    parts = []
    for dom, clients in zip(doms, per):
        idx = rng.permutation(np.nonzero(d == dom)[0])
        parts.extend(np.sort(c) for c in np.array_split(idx, len(clients)))
    return [torch.from_numpy(p).long() for p in parts]


def label_domain_skew(labels, domains, n_clients: int | None = None, *, beta: float, seed: int,
                      min_size: int = 5, max_redraws: int = 100) -> list[torch.Tensor]:
    """Office-Home-LDS style: the clients of each domain split that domain's data by a Dirichlet
    client x class matrix (label skew inside every domain)."""
    y = np.asarray(labels.cpu() if isinstance(labels, torch.Tensor) else labels)
    d = np.asarray(domains.cpu() if isinstance(domains, torch.Tensor) else domains)
    doms = np.unique(d)
    n_clients = 2 * len(doms) if n_clients is None else n_clients
    if n_clients < len(doms):
        raise ValueError(f"label-domain skew needs at least one client per domain ({len(doms)}), got {n_clients}")
    parts = []
    for i, (dom, clients) in enumerate(zip(doms, np.array_split(np.arange(n_clients), len(doms)))):
        rows = np.nonzero(d == dom)[0]
        sub = dirichlet(y[rows], len(clients), beta=beta, seed=seed + 7919 * i, min_size=min_size,
                        max_redraws=max_redraws)
        parts.extend(torch.from_numpy(rows[s.numpy()]).long() for s in sub)
    return parts


def partition(scheme: str, *, labels, domains=None, n_clients: int | None, beta: float = 0.5,
              seed: int = 0, min_size: int = 10) -> list[torch.Tensor]:
    if scheme not in SCHEMES:
        raise ValueError(f"partition={scheme!r} is not known; choose one of {SCHEMES}")
    if scheme in ("domain", "label_domain") and domains is None:
        raise ValueError(f"partition={scheme!r} needs domain ids; this dataset has none")
    if scheme == "iid":
        return iid(len(labels), n_clients or 10, seed=seed)
    if scheme == "dirichlet":
        return dirichlet(labels, n_clients or 10, beta=beta, seed=seed, min_size=min_size)
    if scheme == "domain":
        return domain_skew(domains, n_clients, seed=seed)
    return label_domain_skew(labels, domains, n_clients, beta=beta, seed=seed, min_size=min(min_size, 5))


def class_matrix(parts: list[torch.Tensor], labels, n_classes: int) -> np.ndarray:
    """(clients, classes) sample counts."""
    y = torch.as_tensor(labels)
    return np.stack([torch.bincount(y[p], minlength=n_classes).numpy() for p in parts])


def summary_table(parts, labels, n_classes: int, domains=None) -> str:
    M = class_matrix(parts, labels, n_classes)
    lines = [f"{'client':>6} {'samples':>8} {'classes':>8} {'top class share':>16}" +
             (f" {'domains':>8}" if domains is not None else "")]
    for k, row in enumerate(M):
        top = row.max() / max(row.sum(), 1)
        line = f"{k:>6} {row.sum():>8} {(row > 0).sum():>8} {top:>16.2f}"
        if domains is not None:
            line += f" {sorted(set(torch.as_tensor(domains)[parts[k]].tolist()))!s:>8}"
        lines.append(line)
    return "\n".join(lines)
