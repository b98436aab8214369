"""The whole FedMC set-up in one process, with one set of sizing rules (the simulator, the
benchmarks and the demo all call it): ``setup`` runs steps 1-4 for every client and the server;
its halves ``setup_basis`` (steps 1-2) and ``setup_geometry`` (steps 3-4 for any subset of
clients) serve a per-round protocol (the paper's Algorithm 1: fresh LGDs from each round's
clients), and ``setup_client_*`` / ``setup_server_*`` are the single steps as ``setup`` sizes them,
for a client or server of a real federation."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch

from .. import _validate, privacy
from .client import MAX_COMPONENTS, client_prototypes, local_geometry
from .containers import GeometryDictionary, LocalGeometry, Prototypes
from .server import build_gab, fuse, resolve_gamma


@dataclass(eq=False)
class Setup:
    """What :func:`setup` returns: the GAB ``basis`` (S, D) and ``gamma``, every client's released
    ``prototypes`` and uploaded ``lgds``, the fused ``dictionary``, and per client the
    ``epsilon`` its two DP releases spent together (``privacy.compose_epsilon``, at ``delta``).
    ``B`` is a read-only alias of ``basis``: the name the GAB has in the formulas and in the
    step-by-step API (``fedmc.calibrate(X, dictionary, B)``)."""

    basis: torch.Tensor
    gamma: float
    prototypes: list
    lgds: list
    dictionary: GeometryDictionary
    epsilon: list
    delta: float

    @property
    def B(self) -> torch.Tensor:
        return self.basis


def setup(clients: Sequence[torch.Tensor], *, generators: Sequence[torch.Generator | None],
          n_prototypes: int, n_base: int, n_clusters: int, n_components: int | str, n_entries: int,
          gamma="median", epsilon: float = math.inf, delta: float = 1e-5, clip_norm: float | None = None,
          explained: float = 0.9, max_components: int = MAX_COMPONENTS, iters: int = 5,
          seed: int = 0, epsilon_total: float | None = None) -> Setup:
    """Steps 1-4 for every client and the server, in one process: the one FedMC set-up recipe.

    clients: each client's embeddings (n_k, D), on any one device (results stay there); a client
    with no rows takes no part (it releases nothing: its prototypes and lgds entries are None and
    its epsilon 0);
    generators: one per client, driving its two DP releases in turn (None: secret seeds).
    Privacy: at finite epsilon (``clip_norm`` required) each of the two releases (prototypes, patch
    centres) spends ``epsilon`` at ``delta``
    (together ``Setup.epsilon`` per client), or, with ``epsilon_total``, the two share that budget
    (``privacy.split_epsilon``) so that a client spends at most ``epsilon_total`` in all.
    Sizing rules (so small clients and small federations still work):
    * client k releases min(n_prototypes, n_k) prototypes;
    * the GAB has min(n_base, all prototypes) points (``build_gab`` with ``seed``); gamma is
      resolved on it ("median", "1/D" or a number: public, one for everybody);
    * client k cuts max(1, min(n_clusters, n_k // (2 d))) patches, d = n_components (or
      max_components for "auto"): d kernel PCs need patches of more than d points;
    * the dictionary has min(n_entries, all patches) entries (``fuse`` with ``seed``).
    """
    protos, B, g = setup_basis(clients, generators=generators, n_prototypes=n_prototypes, n_base=n_base,
                               gamma=gamma, epsilon=epsilon, delta=delta, clip_norm=clip_norm, iters=iters,
                               seed=seed, epsilon_total=epsilon_total, calls=2)
    if epsilon_total is not None:
        epsilon = privacy.split_epsilon(epsilon_total, delta, calls=2, releases=iters)
    lgds, dictionary = setup_geometry(clients, B, g, generators=generators, n_clusters=n_clusters,
                                      n_components=n_components, n_entries=n_entries, epsilon=epsilon,
                                      delta=delta, clip_norm=clip_norm, explained=explained,
                                      max_components=max_components, iters=iters, seed=seed)
    # both releases of a client use the same (epsilon, delta, iters), hence the same multiplier
    total = spent(epsilon, delta, iters=iters, releases=2)
    return Setup(basis=B, gamma=g, prototypes=protos, lgds=lgds, dictionary=dictionary,
                 epsilon=[total if p is not None else 0.0 for p in protos], delta=delta)


def _active(clients, generators) -> list[int]:
    """Indices of the clients with rows (a client with none takes no part); checks the lists."""
    if not isinstance(clients, (list, tuple)) or not clients:
        raise ValueError("clients must be a non-empty list of (n_k, D) tensors")
    if not isinstance(generators, (list, tuple)) or len(generators) != len(clients):
        raise ValueError(f"generators must be a list with one entry per client ({len(clients)}), "
                         f"got {generators!r}")
    active = [k for k, x in enumerate(clients) if not (isinstance(x, torch.Tensor) and x.dim() == 2
                                                        and x.shape[0] == 0)]
    if not active:
        raise ValueError("every client is empty (0 rows); FedMC needs data on at least one client")
    return active


def spent(epsilon: float, delta: float, *, iters: int, releases: int) -> float:
    """What a client spends (epsilon at ``delta``) over ``releases`` calls of ``iters`` noisy Lloyd
    releases each at per-call ``epsilon`` (one PLD accountant; inf for epsilon = inf)."""
    z = privacy.noise_multiplier(epsilon, delta, releases=iters, sensitivity=privacy.SUM_COUNT_SENSITIVITY)
    return privacy.compose_epsilon([(z, iters)] * releases, delta)


def setup_basis(clients: Sequence[torch.Tensor], *, generators: Sequence[torch.Generator | None],
                n_prototypes: int, n_base: int, gamma="median", epsilon: float = math.inf,
                delta: float = 1e-5, clip_norm: float | None = None, iters: int = 5, seed: int = 0,
                epsilon_total: float | None = None, calls: int = 2):
    """Steps 1-2 of :func:`setup`: every client's prototypes, the GAB B and the shared gamma.
    Returns (prototypes (None for an empty client), B, gamma). ``epsilon_total`` is split over
    ``calls`` calls of ``iters`` releases (the prototypes' and the patches' in :func:`setup`)."""
    active = _active(clients, generators)
    if epsilon_total is not None:
        if epsilon != math.inf:
            raise ValueError(f"give epsilon (per release, got {epsilon}) or epsilon_total (both releases "
                             f"together, got {epsilon_total}), not both")
        epsilon = privacy.split_epsilon(epsilon_total, delta, calls=calls, releases=iters)
    protos: list = [None] * len(clients)
    for k in active:
        protos[k] = setup_client_prototypes(clients[k], generators[k], n_prototypes=n_prototypes, epsilon=epsilon,
                                            delta=delta, clip_norm=clip_norm, iters=iters)
    B, g = setup_server_basis([protos[k] for k in active], n_base=n_base, gamma=gamma, seed=seed)
    return protos, B, g


def setup_client_prototypes(x: torch.Tensor, generator, *, n_prototypes: int, epsilon: float, delta: float,
                            clip_norm: float | None, iters: int = 5) -> Prototypes:
    """Step 1 for one client with rows x (n_k, D), as :func:`setup` sizes it: min(n_prototypes, n_k)
    DP prototypes (what :func:`setup_basis` runs per client, and a client of a real federation runs
    alone)."""
    return client_prototypes(x, min(n_prototypes, x.shape[0]), epsilon=epsilon, delta=delta,
                             clip_norm=clip_norm, generator=generator, iters=iters)


def setup_server_basis(released, *, n_base: int, gamma="median", seed: int = 0):
    """Step 2 on the server, as :func:`setup` sizes it: the GAB of min(n_base, all prototypes)
    points from the released prototypes (a list of :class:`Prototypes`), and gamma resolved on it.
    Returns (B, gamma)."""
    B = build_gab(released, min(n_base, sum(p.centers.shape[0] for p in released)), seed=seed)
    return B, resolve_gamma(gamma, B)


def setup_geometry(clients: Sequence[torch.Tensor], B: torch.Tensor, gamma: float, *,
                   generators: Sequence[torch.Generator | None], n_clusters: int, n_components: int | str,
                   n_entries: int, epsilon: float = math.inf, delta: float = 1e-5,
                   clip_norm: float | None = None, explained: float = 0.9,
                   max_components: int = MAX_COMPONENTS, iters: int = 5, seed: int = 0):
    """Steps 3-4 of :func:`setup` for the given clients (a client with no rows, or None, takes no
    part): their LGDs on the GAB B, and the dictionary fused from them. Returns (lgds, dictionary);
    ``lgds[k]`` is None for a client that took no part. Sizing as :func:`setup` says."""
    clients = [c if c is not None else B[:0] for c in clients]
    active = _active(clients, generators)
    lgds: list = [None] * len(clients)
    for k in active:
        lgds[k] = setup_client_geometry(clients[k], B, gamma, generators[k], n_clusters=n_clusters,
                                        n_components=n_components, epsilon=epsilon, delta=delta,
                                        clip_norm=clip_norm, explained=explained, max_components=max_components,
                                        iters=iters)
    return lgds, setup_server_fuse([lgds[k] for k in active], n_entries=n_entries, seed=seed)


def setup_client_geometry(x: torch.Tensor, B: torch.Tensor, gamma: float, generator, *, n_clusters: int,
                          n_components: int | str, epsilon: float = math.inf, delta: float = 1e-5,
                          clip_norm: float | None = None, explained: float = 0.9,
                          max_components: int = MAX_COMPONENTS, iters: int = 5) -> "LocalGeometry":
    """Step 3 for one client with rows x (n_k, D), as :func:`setup` sizes it: its LGD on the GAB B
    with max(1, min(n_clusters, n_k // (2 d))) patches (what :func:`setup_geometry` runs per client)."""
    d = max_components if n_components == "auto" else _validate.positive_int("n_components", n_components)
    return local_geometry(x, B, n_clusters=max(1, min(n_clusters, x.shape[0] // (2 * d))),
                          n_components=n_components, gamma=gamma, epsilon=epsilon, delta=delta,
                          clip_norm=clip_norm, generator=generator, explained=explained,
                          max_components=max_components, iters=iters)


def setup_server_fuse(uploaded, *, n_entries: int, seed: int = 0) -> "GeometryDictionary":
    """Step 4 on the server, as :func:`setup` sizes it: the dictionary of min(n_entries, all
    patches) entries fused from the uploaded LGDs (a non-empty list of :class:`LocalGeometry`)."""
    return fuse(uploaded, n_entries=min(n_entries, sum(l.centers.shape[0] for l in uploaded)), seed=seed)
