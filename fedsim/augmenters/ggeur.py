"""``ggeur``: GGEUR's exchange (class statistics up, the global geometry down) and its sampling."""
from __future__ import annotations

from typing import TypedDict

import torch

from geomkern import ggeur
from geomkern.exchange import nbytes

from .._seeds import AUGMENT, generator as _generator  # augment()'s argument is named generator
from ..config import Bool, Choice, Either, Int, Nothing
from ._registry import register
from .base import Augmenter, check_rows


class StatisticsUpload(TypedDict):
    """Up in step "statistics": a client's class statistics, the domain ids it holds (None: the data
    has none) and one ClassStatistics per held domain (None unless the multi-domain step may need them)."""

    stats: ggeur.ClassStatistics
    domains: list[int] | None
    per_domain: list[ggeur.ClassStatistics] | None


class StatisticsKept(TypedDict):
    """What the server keeps of a StatisticsUpload: the held classes' covariances only."""

    stats: ggeur.HeldStatistics
    domains: list[int] | None
    per_domain: list[ggeur.HeldStatistics] | None


class GeometryDownload(TypedDict, total=False):
    """Down in step "statistics": the global geometry and, in the multi-domain step, the other
    domains' prototypes (P, D) and their labels (P,)."""

    geometry: ggeur.GlobalGeometry
    prototypes: torch.Tensor
    labels: torch.Tensor


@register
class GGEURAugmenter(Augmenter[StatisticsUpload, StatisticsKept, GeometryDownload]):
    """GGEUR: clients upload class moments, the server pools them (Eq. 4) and sends back each
    class's global eigenbasis; clients sample around their local samples (fill each held class up
    to ``target_per_class``; the paper fills to 2,000 on single-domain data). Multi-domain data (or
    ``prototypes=True``): clients also upload class prototypes and sample ``n_per_prototype``
    around every prototype of the *other domains* (the paper's Algorithm 2, M = 500 there): one
    pooled class mean per (domain, class), never one of the client's own domains; step 1 then
    fills to ``multi_domain_target`` (unset: ``target_per_class``; 500 in the paper). Without
    domain ids (``prototypes=True`` on single-domain data) each client counts as its own domain.

    ``resample``: "round" draws fresh samples every round (default); "once" is the paper's one-shot
    augmentation (Algorithms 1-2): a client's samples are drawn once, from the stream of round 0,
    and the same fixed set is used every round (and again, identically, after a resume).

    The exchange: one step, ``"statistics"``: up, a client's ClassStatistics (``stats``), the
    domain ids it holds (``domains``) and one ClassStatistics per held domain (``per_domain``, from
    a client of several domains when the multi-domain step may run); down, the GlobalGeometry
    (``geometry``) and, in the multi-domain step, the other domains' prototypes and labels
    (``prototypes``, ``labels``)."""

    name = "ggeur"
    summary = "GGEUR: samples drawn along the pooled class covariances, added to the real ones (control: oversample)"
    step_names = ("statistics",)
    defaults = {"target_per_class": 100, "n_per_prototype": 5, "prototypes": "auto", "noise": "sqrt",
                "multi_domain_target": None, "resample": "round"}
    params = {"target_per_class": Int(0), "n_per_prototype": Int(0), "prototypes": Either(Bool(), Choice("auto")),
              "noise": Choice(*ggeur.NOISE_MODES), "multi_domain_target": Either(Nothing(), Int(0)),
              "resample": Choice("round", "once")}

    @classmethod
    def controls(cls, p):
        # the same extra rows per held class, copies of real rows (on multi-domain data GGEUR also adds
        # n_per_prototype rows around each other domain's prototype, which the control does not)
        return [{"augmenter": "oversample", "augmenter_params": {"target_per_class": p["target_per_class"]}}]

    def bind(self, **kw):
        super().bind(**kw)
        self.cache, self.others, self.geometry, self.use_protos = {}, {}, None, False

    def steps(self, round, clients):
        return [("statistics", clients)] if round is None else []

    def upload(self, step, cid, data, *, round):
        doms = None if data.d is None else sorted(set(data.d.tolist()))
        per_domain = None
        if doms and len(doms) > 1 and self.p["prototypes"] is not False:
            per_domain = [ggeur.local_statistics(data.x[data.d == d], data.y[data.d == d], self.n_classes)
                          for d in doms]
        return {"stats": ggeur.local_statistics(data.x, data.y, self.n_classes), "domains": doms,
                "per_domain": per_domain}

    def accept(self, step, cid, payload, *, round):
        """A client's statistics checked against the run (C, D, dtype; one per-domain entry per
        domain where the multi-domain step needs them), kept as ggeur.HeldStatistics (the held
        classes' covariances only; the same geometry, bit for bit), so that the server's memory
        grows with what the clients hold, not with clients x C x D x D."""
        src = f"client {cid}'s GGEUR statistics"
        stats, doms, per = payload["stats"], payload.get("domains"), payload.get("per_domain")
        if not isinstance(stats, ggeur.ClassStatistics):
            raise ValueError(f"{src} are a {type(stats).__name__}, not a ClassStatistics")
        if doms is not None and not (isinstance(doms, list) and all(isinstance(d, int) for d in doms)):
            raise ValueError(f"{src}: domains must be a list of domain ids, got {doms!r}")
        if stats.means.shape[0] != self.n_classes:
            raise ValueError(f"{src} are for C={stats.means.shape[0]} classes; the run has C={self.n_classes}")
        check_rows(src, stats.means, self.dim, self.dtype)
        if doms and len(doms) > 1 and self.p["prototypes"] is not False and (per is None or len(per) != len(doms)):
            raise ValueError(f"{src}: {len(doms)} domains but {0 if per is None else len(per)} per-domain statistics")
        for e in per or []:
            if not isinstance(e, ggeur.ClassStatistics) or e.means.shape != stats.means.shape \
                    or e.means.dtype != stats.means.dtype:
                raise ValueError(f"{src}: a per-domain entry is not a ClassStatistics like its total")
        return {"stats": ggeur.HeldStatistics.from_statistics(stats), "domains": doms,
                "per_domain": None if per is None else [ggeur.HeldStatistics.from_statistics(e) for e in per]}

    def aggregate(self, step, uploads, *, round, clients, rejected):
        """The global geometry, whether the multi-domain step runs, each client's prototypes of the
        other domains, and the bytes moved. A client without an accepted upload takes part as a
        client without rows (count 0 everywhere)."""
        if not uploads:
            raise RuntimeError("GGEUR: no client's statistics were usable")
        first = next(iter(uploads.values()))
        C, D = first["stats"].means.shape
        dtype = first["stats"].means.dtype
        with_domains = any(u["domains"] is not None for u in uploads.values())
        empty = {"stats": ggeur.HeldStatistics(torch.zeros(C, dtype=torch.int64), torch.zeros(C, D, dtype=dtype),
                                               torch.zeros(0, dtype=torch.int64), torch.zeros(0, D, D, dtype=dtype)),
                 "domains": [] if with_domains else None, "per_domain": None}
        order = sorted(set(clients) | set(uploads))
        ups = [uploads.get(k, empty) for k in order]
        stats = [u["stats"] for u in ups]
        self.geometry = ggeur.aggregate(stats)
        doms = [u["domains"] for u in ups]
        use_protos = self.p["prototypes"]
        if use_protos == "auto":  # the multi-domain step, when the data has several domains
            use_protos = len({d for ds in doms if ds for d in ds}) > 1
        self.use_protos = bool(use_protos)
        up = sum(s.nbytes() for s in stats)
        down = len(ups) * self.geometry.nbytes()
        others = {}
        if self.use_protos:
            if any(ds is None for ds in doms):  # no domain ids: every client is its own domain
                entries, groups, own = stats, list(range(len(ups))), [[k] for k in range(len(ups))]
            elif all(len(ds) <= 1 for ds in doms):  # one domain per client: its statistics carry the means
                entries, groups, own = stats, [ds[0] if ds else -1 for ds in doms], doms
            else:  # clients holding several domains upload one set of class means per domain they hold
                entries, groups = [], []
                for u, ds in zip(ups, doms):  # a one-domain client's statistics are its domain's
                    entries += u["per_domain"] if len(ds) > 1 else [u["stats"]] * len(ds)
                    groups += ds
                up += sum(nbytes(e.means, e.counts) for e in entries)
                own = doms
            for i, k in enumerate(order):
                others[k] = ggeur.group_prototypes(entries, groups, exclude=own[i])[:2]
            down += sum(nbytes(P, L) for P, L in others.values())
        self.setup_bytes = (up, down)
        return {k: {"geometry": self.geometry, **({"prototypes": others[k][0], "labels": others[k][1]}
                                                   if k in others else {})} for k in order}

    def download(self, step, cid, payload, *, round):
        self.geometry = payload["geometry"]
        self.use_protos = "prototypes" in payload
        if self.use_protos:
            self.others[cid] = (payload["prototypes"], payload["labels"])
        self.cache.pop(cid, None)

    def client_state(self, cid, data):
        """What a client keeps of the global geometry between rounds: every class's count, mean and
        eigenvalues, and the eigenvectors of the classes it samples only (its rows' classes and, in
        the multi-domain step, its prototypes' labels), plus its prototypes. ggeur.augment reads no
        other class, so the draws are the same bit for bit, and a client keeps held/C of the
        C x D x D eigenbasis. Nothing before the geometry came down."""
        g = self.geometry
        if g is None:
            return {}
        labels = [data.y] + ([self.others[cid][1]] if self.use_protos else [])
        classes = torch.unique(torch.cat([y.to(g.counts.device, torch.int64) for y in labels]))
        state = {"counts": g.counts, "means": g.means, "eigenvalues": g.eigenvalues, "classes": classes,
                 "eigenvectors": g.eigenvectors[classes]}
        if self.use_protos:
            state["prototypes"], state["labels"] = self.others[cid]
        return state

    def load_client_state(self, cid, state):
        """The GlobalGeometry ``client_state`` kept, with the other classes' counts and eigenvectors
        zero (checked again on construction, as from_bytes checks the geometry on receipt)."""
        if not state:
            return
        classes, means, ev = state["classes"], state["means"], state["eigenvalues"]
        counts = torch.zeros_like(state["counts"])
        counts[classes] = state["counts"][classes]
        V = means.new_zeros(means.shape[0], means.shape[1], ev.shape[1])
        V[classes] = state["eigenvectors"]
        payload = {"geometry": ggeur.GlobalGeometry(counts, means, ev, V)}
        if "prototypes" in state:
            payload.update(prototypes=state["prototypes"], labels=state["labels"])
        self.download("statistics", cid, payload, round=None)

    def privacy(self, n_clients: int) -> dict:  # the class statistics go up without noise
        return {"epsilon_spent": [None] * n_clients, "delta": 0.0, "releases": 0}

    def augment(self, cid, data, *, generator):
        if self.p["resample"] == "once":  # one draw per client, from round 0's stream, reused every round
            if cid not in self.cache:
                self.cache[cid] = self._draw(cid, data, _generator(self.seed, 0, cid, AUGMENT, device=data.x.device))
            return self.cache[cid]
        return self._draw(cid, data, generator)

    def _draw(self, cid, data, generator):
        p = self.p
        target = p["target_per_class"]
        if self.use_protos and p["multi_domain_target"] is not None:
            target = p["multi_domain_target"]
        xs, ys = [], []
        x_new, y_new = ggeur.augment(data.x, data.y, self.geometry, target_per_class=target,
                                     generator=generator, noise=p["noise"])
        xs.append(x_new)
        ys.append(y_new)
        if self.use_protos:
            P, L = self.others[cid]
            xp, yp = ggeur.augment_prototypes(P, L, self.geometry, n_per_prototype=p["n_per_prototype"],
                                              generator=generator, noise=p["noise"])
            xs.append(xp)
            ys.append(yp)
        return torch.cat(xs), torch.cat(ys)
