"""Feature-calibration plug-ins for the round loop: ``none``, ``ggeur``, ``fedmc``.

An augmenter runs its geometry exchange once (``setup``: embeddings are frozen, so the clients'
geometry only changes when their data does) and then gives each selected client extra samples
every round (``augment``: fresh perturbations per round). It accounts the bytes its exchange
moves: ``setup_bytes`` (up, down) summed over clients.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from geomkern import fedmc, ggeur
from geomkern.exchange import nbytes

from ._params import merge_params
from ._seeds import SETUP, generator


@dataclass
class ClientData:
    x: torch.Tensor
    y: torch.Tensor
    d: torch.Tensor | None = None


class Augmenter:
    name = "none"
    defaults: dict = {}

    def __init__(self, **params):
        self.p = merge_params(f"augmenter {self.name!r}", "parameter", self.defaults, params)
        self.setup_bytes = (0, 0)

    def setup(self, clients: list[ClientData], *, n_classes: int, seed: int) -> None:
        pass

    def privacy(self, n_clients: int) -> dict:
        """What the exchange of ``setup`` spent per client, as the DP accountant states it:
        ``epsilon_spent`` (one per client; None where something was sent without noise, i.e. with
        no finite bound), ``delta`` and ``releases`` (DP releases per client). It covers the
        augmenter's releases only: model updates and the un-noised parts of an exchange (FedMC's
        spectra and betas) are not private."""
        return {"epsilon_spent": [0.0] * n_clients, "delta": 0.0, "releases": 0}

    def augment(self, cid: int, data: ClientData, *, generator: torch.Generator):
        """Extra (x, y) for client ``cid`` this round; empty tensors for none."""
        return data.x[:0], data.y[:0]


class GGEURAugmenter(Augmenter):
    """GGEUR: clients upload class moments, the server pools them (Eq. 4) and sends back each
    class's global eigenbasis; clients sample around their local samples (fill each held class up
    to ``target_per_class``). Multi-domain data (or ``prototypes=True``): clients also upload class
    prototypes and sample ``n_per_prototype`` around every other client's prototypes."""

    name = "ggeur"
    defaults = {"target_per_class": 100, "n_per_prototype": 5, "prototypes": "auto", "noise": "sqrt"}

    def setup(self, clients, *, n_classes, seed):
        self.stats = [ggeur.local_statistics(c.x, c.y, n_classes) for c in clients]
        self.geometry = ggeur.aggregate(self.stats)
        use_protos = self.p["prototypes"]
        if use_protos == "auto":  # the multi-domain step, when the data has several domains
            doms = [c.d for c in clients if c.d is not None]
            use_protos = bool(doms) and len(torch.unique(torch.cat(doms))) > 1
        self.use_protos = bool(use_protos)
        up = sum(s.nbytes() for s in self.stats)
        down = len(clients) * self.geometry.nbytes()
        if self.use_protos:
            self.others = [ggeur.prototypes(self.stats, exclude=k) for k in range(len(clients))]
            down += sum(nbytes(p, l) for p, l in self.others)
        self.setup_bytes = (up, down)

    def privacy(self, n_clients: int) -> dict:  # the class statistics go up without noise
        return {"epsilon_spent": [None] * n_clients, "delta": 0.0, "releases": 0}

    def augment(self, cid, data, *, generator):
        xs, ys = [], []
        x_new, y_new = ggeur.augment(data.x, data.y, self.geometry, target_per_class=self.p["target_per_class"],
                                     generator=generator, noise=self.p["noise"])
        xs.append(x_new)
        ys.append(y_new)
        if self.use_protos:
            P, L = self.others[cid]
            xp, yp = ggeur.augment_prototypes(P, L, self.geometry, n_per_prototype=self.p["n_per_prototype"],
                                              generator=generator, noise=self.p["noise"])
            xs.append(xp)
            ys.append(yp)
        return torch.cat(xs), torch.cat(ys)


def fill_sources(y: torch.Tensor, n_classes: int, target: int) -> torch.Tensor:
    """Rows to calibrate so every class the client holds reaches ``target`` samples: for class c
    with n_c local samples, max(0, target - n_c) rows taken round-robin from c's samples in local
    order (the same budget rule as ggeur.augment's target_per_class)."""
    out = []
    for c in range(n_classes):
        rows = torch.nonzero(y == c).squeeze(1)
        need = target - rows.numel()
        if rows.numel() and need > 0:
            out.append(rows[torch.arange(need, device=rows.device) % rows.numel()])
    return torch.cat(out) if out else y.new_zeros(0)


class OversampleAugmenter(Augmenter):
    """The matched-compute control of GGEUR and FedMC (docs/design.md note 9): the same extra
    rows per round under the same budget rule (fill each held class up to ``target_per_class``),
    but copies of the client's own real samples instead of synthetic ones. An augmenter's gain over
    FedAvg that this control also shows comes from the extra local steps, not from geometry."""

    name = "oversample"
    defaults = {"target_per_class": 100}

    def setup(self, clients, *, n_classes, seed):
        self.n_classes = n_classes  # nothing is exchanged: setup_bytes stay (0, 0)

    def augment(self, cid, data, *, generator):
        rows = fill_sources(data.y, self.n_classes, self.p["target_per_class"])
        return data.x[rows], data.y[rows]


class FedMCAugmenter(Augmenter):
    """FedMC: DP prototypes -> GAB -> local geometry -> fused dictionary (once), then every round
    fresh calibrated samples labelled like their source: by default the same budget as GGEUR
    (fill each held class up to ``target_per_class``), or ``n_per_sample`` per local sample."""

    name = "fedmc"
    defaults = {"n_prototypes": 32, "n_base": 256, "n_clusters": 8, "n_components": 4, "n_entries": 32,
                "gamma": "median", "epsilon": math.inf, "delta": 1e-5, "clip_norm": 1.0,
                "target_per_class": 100, "n_per_sample": None, "scale": 1.0, "method": fedmc.DEFAULT_METHOD,
                "formulation": "consistent", "steps": None, "anchored": True, "epsilon_total": None}

    def setup(self, clients, *, n_classes, seed):
        p = self.p
        self.n_classes = n_classes
        gens = [generator(seed, 0, k, SETUP) for k in range(len(clients))]  # the run's one derivation
        # the data stays on its device: geomkern's steps return tensors where their inputs are
        res = fedmc.setup([c.x for c in clients], generators=gens, n_prototypes=p["n_prototypes"],
                          n_base=p["n_base"], n_clusters=p["n_clusters"], n_components=p["n_components"],
                          n_entries=p["n_entries"], gamma=p["gamma"], epsilon=p["epsilon"], delta=p["delta"],
                          clip_norm=p["clip_norm"], seed=seed, epsilon_total=p["epsilon_total"])
        self.B, self.gamma, self.dictionary = res.basis, res.gamma, res.dictionary
        self.prepared = fedmc.prepare(res.dictionary, res.basis)  # calibrate's constants, once
        self.spent, self.delta = res.epsilon, res.delta  # per client, both DP releases composed
        # a client without data (None) sends nothing
        up = sum(nbytes(pr.centers, pr.counts) + l.nbytes() for pr, l in zip(res.prototypes, res.lgds)
                 if pr is not None)
        down = len(clients) * (nbytes(self.B) + self.dictionary.nbytes())
        self.setup_bytes = (up, down)

    def privacy(self, n_clients: int) -> dict:  # prototypes, then patch centres: two DP releases per client
        return {"epsilon_spent": [e if math.isfinite(e) else None for e in self.spent], "delta": self.delta,
                "releases": 2}

    def augment(self, cid, data, *, generator):
        p = self.p
        if p["n_per_sample"] is not None:
            rows = torch.arange(data.x.shape[0], device=data.x.device).repeat_interleave(p["n_per_sample"])
        else:
            rows = fill_sources(data.y, self.n_classes, p["target_per_class"])
        if rows.numel() == 0:
            return data.x[:0], data.y[:0]
        Z = fedmc.calibrate(data.x[rows], self.prepared, formulation=p["formulation"], method=p["method"],
                            scale=p["scale"], steps=p["steps"], anchored=p["anchored"], generator=generator)
        return Z, data.y[rows]


AUGMENTERS = {"none": Augmenter, "oversample": OversampleAugmenter, "ggeur": GGEURAugmenter,
              "fedmc": FedMCAugmenter}


def build_augmenter(name: str, **params) -> Augmenter:
    if name not in AUGMENTERS:
        raise ValueError(f"augmenter={name!r} is not known; choose one of {sorted(AUGMENTERS)}")
    return AUGMENTERS[name](**params)
