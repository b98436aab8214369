"""FLIC's two toy problems (heterogeneous feature spaces, FLIC paper §5), generated
from a seed: ``--dataset toy:noisy-features`` and ``--dataset toy:linear-mapping``.

Both start from the same latent problem: C classes, class c ~ N(mu_c, I_p) in a latent space of
dimension p, with mu_c ~ N(0, separation^2 I_p) drawn once per seed. What differs is how a client
sees a latent sample z:

* noisy-features: x = [z, e], e ~ N(0, noise^2 I_{k_s}) with k_s extra noise dimensions drawn
  per feature space s (so D_s = p + k_s);
* linear-mapping: x = A_s z with A_s (D_s, p), entries N(0, 1/p), and D_s drawn per space.

Feature spaces: ``n_spaces`` spaces (default n_clients // 4, at least 1), clients assigned round
robin, so a space is held by ~4 clients. A client-specific space for every client is
``n_spaces=n_clients``; the default groups clients so that "FedRep restricted to the clients
sharing a feature space" has something to share (the issue's baseline).

Labels: every client holds all C classes (or ``classes_per_client`` of them, a seeded subset per
client: label skew as in the official code's shards), drawn uniformly, ``n_train`` training and
``n_test`` test rows per client. Same seed, same everything (latent means, maps, dimensions, rows).
``subsample=1`` then keeps a random share of each client's training rows, as the FLIC authors'
toys do (github.com/arakotom/flic, Het_data.py, read only): with probability 1/2 a share uniform
in [5 %, 100 %], otherwise uniform in [15 %, 35 %], the kept rows drawn with replacement; so the
clients' sizes differ. Its own seeded stream: the other rows are the same with or without it.

Every option is reachable from the CLI and TOML in the dataset's name (fedsim/data/spec.py), e.g.
``--dataset 'toy:linear-mapping?n_spaces=20&dims=3-99&n_classes=20&classes_per_client=2'``.
"""
from __future__ import annotations

import numpy as np
import torch

from .dataset import ClientSplit, PersonalDataset
from .spec import parse, split

DEFAULTS = {"n_classes": 5, "latent_dim": 8, "separation": 1.0, "n_train": 40, "n_test": 200,
            "dim_range": (10, 40), "noise": 1.0, "classes_per_client": None}


def _subsample(seed: int, cid: int, n: int) -> np.ndarray:
    """The training rows a client keeps under ``subsample=1`` (indices into its n rows; at least one)."""
    rng = np.random.default_rng([seed, 0x70F, cid + 1, 0x5B5])
    share = min(rng.uniform(5.0, 105.0), 100.0) if rng.uniform() < 0.5 else rng.uniform(15.0, 35.0)
    return rng.integers(0, n, size=max(1, int(n * share / 100)))


def _latent(rng, n_classes, latent_dim, separation):
    return rng.normal(0.0, separation, size=(n_classes, latent_dim))


def _draw(rng, means, n, classes):
    y = classes[rng.integers(0, len(classes), size=n)]
    return means[y] + rng.normal(size=(n, means.shape[1])), y


def _spaces(n_clients, n_spaces):
    n_spaces = max(1, n_clients // 4) if n_spaces is None else int(n_spaces)
    if not 1 <= n_spaces <= n_clients:
        raise ValueError(f"n_spaces must lie in [1, n_clients={n_clients}], got {n_spaces}")
    return n_spaces, [cid % n_spaces for cid in range(n_clients)]


def _build(kind, n_clients, seed, n_spaces, view_of, subsample: int = 0, **kw):
    p = {**DEFAULTS, **kw}
    if n_clients < 1:
        raise ValueError(f"n_clients must be >= 1, got {n_clients}")
    rng = np.random.default_rng([seed, 0x70F])
    means = _latent(rng, p["n_classes"], p["latent_dim"], p["separation"])
    n_spaces, space_of = _spaces(n_clients, n_spaces)
    lo, hi = p["dim_range"]
    views = [view_of(rng, int(rng.integers(lo, hi + 1)), p) for _ in range(n_spaces)]
    clients = []
    for cid in range(n_clients):
        s = space_of[cid]
        crng = np.random.default_rng([seed, 0x70F, cid + 1])
        k = p["classes_per_client"]
        classes = np.arange(p["n_classes"]) if k is None else np.sort(crng.choice(p["n_classes"], k, replace=False))
        parts = []
        for n in (p["n_train"], p["n_test"]):
            z, y = _draw(crng, means, n, classes)
            parts += [torch.from_numpy(views[s](crng, z).astype(np.float32)), torch.from_numpy(y.astype(np.int64))]
        if subsample:
            keep = torch.from_numpy(_subsample(seed, cid, p["n_train"]))
            parts[0], parts[1] = parts[0][keep], parts[1][keep]
        clients.append(ClientSplit(*parts, n_classes=p["n_classes"], space=f"s{s}"))
    meta = {"generator": f"fedsim.data.toy:{kind}", "seed": seed, "n_spaces": n_spaces,
            **{k: (list(v) if isinstance(v, tuple) else v) for k, v in p.items()}}
    if subsample:  # recorded only where set: the metadata of every other toy stays as it was
        meta["subsample"] = subsample
    return PersonalDataset(name=f"toy:{kind}", clients=clients,
                           class_names=[f"class{c}" for c in range(p["n_classes"])], meta=meta)


def noisy_features(n_clients: int = 20, *, seed: int = 0, n_spaces: int | None = None, **kw) -> PersonalDataset:
    """Latent class Gaussians plus k_s extra N(0, noise^2) dimensions per space (D_s in dim_range)."""
    lat = {**DEFAULTS, **kw}["latent_dim"]

    def view(rng, dim, p):
        if dim <= lat:
            raise ValueError(f"dim_range must lie above latent_dim={lat} (noise dimensions are added)")
        k = dim - lat
        return lambda crng, z: np.concatenate([z, crng.normal(0.0, p["noise"], size=(z.shape[0], k))], axis=1)

    return _build("noisy-features", n_clients, seed, n_spaces, view, **kw)


def linear_mapping(n_clients: int = 20, *, seed: int = 0, n_spaces: int | None = None, **kw) -> PersonalDataset:
    """Latent class Gaussians mapped by a random A_s (D_s, p), entries N(0, 1/p), per space."""

    def view(rng, dim, p):
        A = rng.normal(0.0, 1.0 / np.sqrt(p["latent_dim"]), size=(dim, p["latent_dim"]))
        return lambda crng, z: z @ A.T

    return _build("linear-mapping", n_clients, seed, n_spaces, view, **kw)


TOYS = {"noisy-features": noisy_features, "linear-mapping": linear_mapping}


def is_toy(name) -> bool:
    return isinstance(name, str) and name.startswith("toy:")


def _pos(v) -> bool:
    return v > 0


# The generators' options as ``toy:NAME?key=value&...`` (fedsim/data/spec.py): type, check, allowed values.
OPTIONS = {
    "n_spaces": (int, _pos, "an integer >= 1 (at most --clients)"),
    "n_classes": (int, lambda v: v >= 2, "an integer >= 2"),
    "latent_dim": (int, _pos, "an integer >= 1"),
    "separation": (float, _pos, "a number > 0"),
    "n_train": (int, _pos, "an integer >= 1"),
    "n_test": (int, _pos, "an integer >= 1"),
    "dims": ("range", lambda v: 1 <= v[0] <= v[1], "LO-HI with 1 <= LO <= HI (D_s drawn per space)"),
    "noise": (float, lambda v: v >= 0, "a number >= 0"),
    "classes_per_client": (int, _pos, "an integer >= 1 (at most n_classes)"),
    "subsample": (int, lambda v: v in (0, 1), "0 or 1 (1: keep a random share of each client's training rows)"),
}


def load_toy(name: str, *, n_clients: int, seed: int) -> PersonalDataset:
    """``"toy:NAME"`` or ``"toy:NAME?key=value&..."`` (keys: ``OPTIONS``; ``dims=LO-HI`` is
    ``dim_range``) -> the generated dataset for ``seed``."""
    base, given = split(name)
    kind = base.split(":", 1)[1]
    if kind not in TOYS:
        raise ValueError(f"dataset {name!r}: unknown toy problem; choose one of "
                         f"{['toy:' + k for k in sorted(TOYS)]}")
    kw = parse(name, given, OPTIONS)
    if kind == "linear-mapping" and "noise" in kw:
        raise ValueError(f"dataset {name!r}: option noise is for toy:noisy-features (linear-mapping adds none)")
    if "dims" in kw:
        kw["dim_range"] = kw.pop("dims")
    p = {**DEFAULTS, **kw}
    if p["classes_per_client"] is not None and p["classes_per_client"] > p["n_classes"]:
        raise ValueError(f"dataset {name!r}: option classes_per_client={p['classes_per_client']} must be at "
                         f"most n_classes={p['n_classes']}")
    if kind == "noisy-features" and p["dim_range"][0] <= p["latent_dim"]:
        raise ValueError(f"dataset {name!r}: option dims={p['dim_range'][0]}-{p['dim_range'][1]} must lie above "
                         f"latent_dim={p['latent_dim']} (noise dimensions are added to the latent ones)")
    try:
        return TOYS[kind](n_clients, seed=seed, **kw)
    except ValueError as exc:  # n_spaces beyond the number of clients
        raise ValueError(f"dataset {name!r}: {exc}") from None
