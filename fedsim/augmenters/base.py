"""Feature-calibration plug-ins for the round loop: ``none``, ``oversample``, ``ggeur``, ``fedmc``.

An augmenter exchanges geometry between the clients and the server through one interface, the
same on every engine (``Augmenter``: ``steps``, then per step ``upload`` on each client, ``accept``
and ``aggregate`` on the server, ``download`` on each client; fedsim/engine.py and the Flower apps
call nothing else), once before round 1 (embeddings are frozen, so the clients' geometry only
changes when their data does) and, for FedMC's ``protocol="algorithm1"``, again at the start of
every round. It then gives each selected client extra samples every round (``augment``: fresh
perturbations per round), may ask the loop to train on its samples alone (``replaces_data``),
accounts the bytes its exchange moves (``setup_bytes``, ``round_bytes``: (up, down) summed over
clients) and keeps what a resumed run needs in ``state_dict``. docs/flower.md shows the hooks in
a Flower app of one's own.
"""
from __future__ import annotations

import functools
import math

import torch

from geomkern import fedmc, ggeur, privacy
from geomkern.exchange import nbytes

from .._specs import merge_params
from ..config import MAX_EPSILON, Bool, Choice, Either, Int, Nothing, Real
from ..data.clients import ClientData
from .._seeds import GEOMETRY, SETUP, generator
from .._seeds import AUGMENT
from .._seeds import generator as _generator  # augment()'s argument is named generator


class Augmenter:
    """An augmenter's exchange is a list of steps, the same on every engine (engine.py drives them):
    in a step the taking-part clients ``upload`` (client side), the server ``accept``s each upload
    and ``aggregate``s them into what goes back to each client, and each client takes its
    ``download`` (client side). ``steps(None, clients)`` is the one-time exchange before round 1,
    ``steps(r, selected)`` the exchange at the start of round r (0-based), before its clients
    train. Payloads are dicts of tensors, exchanged containers (geomkern.exchange: validated on
    construction and on receipt), lists of containers, numbers, strings and lists of ints, so that
    an engine can put them in messages (fedsim/flower/codec.py). A client that is rebuilt for each
    message (a Flower SuperNode) keeps what it needs between messages in ``client_state``.

    The in-process engine uses one object as the server and every client; so does ``setup`` /
    ``begin_round``, which run the exchange here for a given list of ClientData.
    """

    name = "none"
    defaults: dict = {}
    # the kind of each parameter (config.py's Int, Real, Choice, ...), checked before anything is written;
    # one entry per key of defaults
    params: dict = {}
    step_names: tuple[str, ...] = ()  # every step ``steps`` can name

    def __init__(self, **params):
        self.p = merge_params(f"augmenter {self.name!r}", "parameter", self.defaults, params)
        self.setup_bytes = (0, 0)
        self.round_bytes = (0, 0)  # (up, down) of the exchange of the current round
        self.replaces_data = False  # True: this round's clients train on augment's samples alone
        # the run's number of rounds, set by the loop before setup (FedMC's algorithm1 splits
        # epsilon_total over the releases a client can make in them)
        self.rounds: int | None = None
        # what accept checks uploads against (bind); None: not checked
        self.dim: int | None = None
        self.dtype: torch.dtype | None = None

    def __getattr__(self, name):  # only for what normal lookup did not find
        if name in ("n_classes", "seed"):
            raise AttributeError(f"augmenter {self.name!r} is not bound to a run: call bind(n_classes=..., seed=...) "
                                 "(or setup) before its exchange hooks and augment")
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @classmethod
    def controls(cls, p: dict) -> list[dict]:
        """This augmenter's matched-compute controls (parameters ``p``, defaults merged in; docs/design.md
        note 9), in order of preference: each {"augmenter": name, "augmenter_params": values it must
        have}, under the same algorithm (report.control_of); none by default (none, oversample)."""
        return []

    # ---------------------------------------------------------------- the exchange
    def bind(self, *, n_classes: int, seed: int, dim: int | None = None, dtype: torch.dtype | None = None) -> None:
        """The run this object serves (server or client side): classes, seed, and the rows' width and
        dtype that uploads are checked against. Every engine calls it before the exchange."""
        self.n_classes, self.seed, self.dim, self.dtype = n_classes, seed, dim, dtype

    def steps(self, round: int | None, clients: list[int]) -> list[tuple[str, list[int]]]:
        """The exchange's steps, each (name, the clients taking part): ``round`` None is the one-time
        exchange (``clients``: all of them), an int the exchange of that round (``clients``: its
        selected ones). None by default (nothing is exchanged)."""
        return []

    def upload(self, step: str, cid: int, data: ClientData, *, round: int | None) -> dict | None:
        """Client side: what client ``cid`` sends in ``step`` (None: nothing, e.g. it has no rows)."""
        raise NotImplementedError(f"augmenter {self.name!r} has no exchange step {step!r}")

    def accept(self, step: str, cid: int, payload: dict, *, round: int | None) -> dict:
        """Server side: check one client's upload against the run (raise ValueError naming what is
        wrong: the engine leaves that client out) and return what the server keeps of it."""
        return payload

    def aggregate(self, step: str, uploads: dict[int, dict], *, round: int | None, clients: list[int],
                  rejected: list[int]) -> dict[int, dict]:
        """Server side: from the accepted uploads (cid -> what ``accept`` kept; ``rejected``: the
        clients whose upload was refused), what goes back to each client (cid -> payload). It also
        counts the step's bytes (``setup_bytes`` / ``round_bytes``)."""
        return {}

    def download(self, step: str, cid: int, payload: dict, *, round: int | None) -> None:
        """Client side: client ``cid`` takes what the server sent it in ``step``."""

    def client_state(self, cid: int, data: ClientData) -> dict:
        """Client side: what client ``cid`` (rows ``data``) keeps between messages (a payload);
        empty by default."""
        return {}

    def load_client_state(self, cid: int, state: dict) -> None:
        """Client side: restore :meth:`client_state` in a fresh object (after ``bind``)."""

    def exchange(self, round: int | None, clients: list[int], data: list[ClientData]) -> None:
        """Run the steps of ``round`` here, this object being the server and every client (the
        in-process engine); ``data``: every client's ClientData, by cid."""
        for step, cids in self.steps(round, clients):
            uploads = {}
            for k in cids:
                payload = self.upload(step, k, data[k], round=round)
                if payload is not None:
                    uploads[k] = self.accept(step, k, payload, round=round)
            downloads = self.aggregate(step, uploads, round=round, clients=cids, rejected=[])
            for k, payload in downloads.items():
                self.download(step, k, payload, round=round)

    def setup(self, clients: list[ClientData], *, n_classes: int, seed: int) -> None:
        """The one-time exchange in this process, every client's data given (``exchange``)."""
        x = clients[0].x if clients else None
        self.bind(n_classes=n_classes, seed=seed, dim=None if x is None else x.shape[1],
                  dtype=None if x is None else x.dtype)
        self.exchange(None, list(range(len(clients))), clients)

    def begin_round(self, round: int, selected: list[int], clients: list[ClientData], *, n_classes: int,
                    seed: int) -> None:
        """Round ``round``'s exchange in this process (after ``setup``). Its randomness must follow
        from (seed, round, selected) alone, so that a resumed run repeats it."""
        self.exchange(round, selected, clients)

    # ---------------------------------------------------------------- the rest of the run
    def state_dict(self) -> dict:
        """What a resumed run needs besides (seed, round): plain ints, floats, strings, lists and
        dicts, stored in the checkpoint after every round. Empty by default."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` (after ``setup``) when a run resumes."""

    def privacy(self, n_clients: int) -> dict:
        """What the exchange spent per client, as the DP accountant states it:
        ``epsilon_spent`` (one per client; None where something was sent without noise, i.e. with
        no finite bound), ``delta`` and ``releases`` (DP releases per client). It covers the
        augmenter's releases only: model updates and the un-noised parts of an exchange (FedMC's
        spectra and betas) are not private."""
        return {"epsilon_spent": [0.0] * n_clients, "delta": 0.0, "releases": 0}

    def augment(self, cid: int, data: ClientData, *, generator: torch.Generator):
        """Extra (x, y) for client ``cid`` this round; empty tensors for none."""
        return data.x[:0], data.y[:0]


def _check_rows(what: str, t: torch.Tensor, dim: int | None, dtype) -> None:
    """An uploaded container's rows must be the run's width and dtype."""
    if dim is not None and (t.shape[-1] != dim or t.dtype != dtype):
        raise ValueError(f"{what} are {t.dtype} in D={t.shape[-1]}; the run has {dtype} in D={dim}")


class GGEURAugmenter(Augmenter):
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
        _check_rows(src, stats.means, self.dim, self.dtype)
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
    params = {"target_per_class": Int(0)}

    def augment(self, cid, data, *, generator):
        rows = fill_sources(data.y, self.n_classes, self.p["target_per_class"])
        return data.x[rows], data.y[rows]


FEDMC_PROTOCOLS = ("fixed", "algorithm1")
_DP_ITERS = 5  # noisy Lloyd releases per DP K-Means (fedmc's default)


@functools.lru_cache(maxsize=64)  # the accountant is slow to ask (seconds), and every client asks the same
def _split_epsilon(epsilon_total: float, delta: float, calls: int) -> float:
    return privacy.split_epsilon(epsilon_total, delta, calls=calls, releases=_DP_ITERS)


class FedMCAugmenter(Augmenter):
    """FedMC, in one of two protocols (``protocol``), each its own class over the helpers here:
    ``FedMCAugmenter(protocol=...)`` builds a :class:`FedMCAlgorithm1` (the default) or a
    :class:`FedMCFixed`. Both start with the same step, ``"prototypes"``: every client releases DP
    prototypes (its set-up generator (seed, 0, cid)), the server builds the GAB B and gamma from
    them and sends both down.

    ``clip_norm``: None (default) clips nothing at epsilon = inf (plain k-means++ patches); with a
    finite epsilon (or epsilon_total) None means 1.0, the norm of fedsim's L2-normalised rows.
    """

    name = "fedmc"
    step_names = ("prototypes", "lgd", "rebuild")
    defaults = {"n_prototypes": 32, "n_base": 256, "n_clusters": 8, "n_components": 4, "n_entries": 32,
                "gamma": "median", "epsilon": math.inf, "delta": 1e-5, "clip_norm": None,
                "target_per_class": 100, "n_per_sample": None, "scale": 1.0, "method": fedmc.DEFAULT_METHOD,
                "formulation": "consistent", "steps": None, "anchored": True, "epsilon_total": None,
                "protocol": "algorithm1"}
    params = {"n_prototypes": Int(1), "n_base": Int(1), "n_clusters": Int(1),
              "n_components": Either(Int(1), Choice("auto")), "n_entries": Int(1), "gamma": Either(Real(0, lo_open=True), Choice("median", "1/D")),
              "epsilon": Real(0, MAX_EPSILON, lo_open=True, inf_ok=True,
                              note="per DP release; a larger one protects nothing: inf = no noise"),
              "delta": Real(0, 1, lo_open=True, hi_open=True),
              "clip_norm": Either(Nothing(), Real(0, lo_open=True, note="row-norm bound of the DP release; "
                                                                        "required with a finite epsilon")),
              "target_per_class": Int(0), "n_per_sample": Either(Nothing(), Int(0)), "scale": Real(0),
              "method": Choice(*fedmc.PREIMAGE_METHODS), "formulation": Choice(*fedmc.FORMULATIONS),
              "steps": Either(Nothing(), Int(1)), "anchored": Bool(),
              "epsilon_total": Either(Nothing(), Real(0, MAX_EPSILON, lo_open=True, inf_ok=True,
                                                      note="the whole budget of a client's DP releases; a larger "
                                                           "one protects nothing: inf = no noise")),
              "protocol": Choice(*FEDMC_PROTOCOLS)}

    def __new__(cls, **params):
        protocol = params.get("protocol", cls.defaults["protocol"])
        if cls is FedMCAugmenter and isinstance(protocol, str):  # its class (an unknown one is refused by __init__)
            cls = _FEDMC_CLASSES.get(protocol, cls)
        return super().__new__(cls)

    def __init__(self, **params):
        super().__init__(**params)
        p = self.p
        if p["protocol"] not in FEDMC_PROTOCOLS:
            raise ValueError(f"augmenter 'fedmc': protocol={p['protocol']!r} is not known; choose one of "
                             f"{list(FEDMC_PROTOCOLS)}")
        budget = sorted(k for k in ("target_per_class", "n_per_sample") if k in params)
        if p["protocol"] == "algorithm1" and budget:
            raise ValueError(f"augmenter 'fedmc': {', '.join(budget)} set(s) the added-sample budget of "
                             "protocol='fixed'; protocol='algorithm1' (the default) trains on one calibrated "
                             "sample per real row, so it does not apply: set protocol = \"fixed\" as well")
        finite = p["epsilon"] != math.inf or p["epsilon_total"] not in (None, math.inf)
        if finite and p["clip_norm"] is None:
            # the DP release needs a bound on the row norms; fedsim's embeddings are L2-normalised
            # (fedsim import and embed normalise; the loop warns about rows that are not)
            p["clip_norm"] = 1.0

    @classmethod
    def controls(cls, p):
        if p["protocol"] == "algorithm1":  # one calibrated row per real row: the same steps as FedAvg's
            return [{"augmenter": "none", "augmenter_params": {}}]
        if p["n_per_sample"] is None:  # fixed: the extra rows of GGEUR's budget rule
            return [{"augmenter": "oversample", "augmenter_params": {"target_per_class": p["target_per_class"]}}]
        return []  # n_per_sample rows per real row: no control has that budget

    # the number of DP calls a client can make (release_epsilon splits epsilon_total over them)
    def _calls(self) -> int:
        raise NotImplementedError

    def release_epsilon(self) -> float:
        """The epsilon of each of a client's DP releases: ``epsilon``, or ``epsilon_total`` split
        over the most releases a client can make (``privacy.split_epsilon``: one noise multiplier
        for all of them): 2 under "fixed" (prototypes, patch centres; as fedmc.setup splits it),
        1 + ``rounds`` under "algorithm1" (prototypes, then patch centres in every round, as a
        client selected in every round makes them). Making fewer, a client spends less."""
        p = self.p
        if p["epsilon_total"] is None:
            return p["epsilon"]
        calls = self._calls()
        total, delta = float(p["epsilon_total"]), float(p["delta"])
        epsilon = _split_epsilon(total, delta, calls)
        if epsilon <= 0:
            # So small a budget calls for noise so large that one release's privacy loss at delta
            # is 0, and a release needs an epsilon > 0. The concrete fix: the first power of ten
            # from 1e-6 up that splits (below 1e-4 none did at any delta tried; each try is one
            # cached accountant call of under a second).
            enough = next((10.0 ** k for k in range(max(math.floor(math.log10(total)) + 1, -6), 4)
                           if _split_epsilon(10.0 ** k, delta, calls) > 0), None)
            raise ValueError(f"augmenter 'fedmc': epsilon_total (--epsilon-total) {total!r} is too small to split "
                             f"over a client's {calls} DP calls ({calls * _DP_ITERS} releases) at delta {delta!r}: "
                             "the noise it calls for leaves each release an epsilon of 0 at that delta, and a "
                             "release needs one > 0. Give a larger --epsilon-total"
                             + (f" ({enough:g} splits here)" if enough else "")
                             + ", a larger delta, fewer rounds, or inf for no noise")
        return epsilon

    def bind(self, **kw):
        super().bind(**kw)
        self.B = self.gamma = self.dictionary = self.prepared = None
        self.gens: dict[int, torch.Generator] = {}  # a client's set-up generator between its two releases

    # ---------------------------------------------------------------- shared steps
    def _upload_prototypes(self, cid: int, data: ClientData) -> dict | None:
        """Step 1 on a client: its DP prototypes (none from a client without rows)."""
        if data.x.shape[0] == 0:
            return None
        p = self.p
        gen = generator(self.seed, 0, cid, SETUP)  # the run's one derivation
        pr = fedmc.setup_client_prototypes(data.x, gen, n_prototypes=p["n_prototypes"], epsilon=self.release_epsilon(),
                                           delta=p["delta"], clip_norm=p["clip_norm"], iters=_DP_ITERS)
        self.gens[cid] = gen
        return {"prototypes": fedmc.PrototypeRelease(*pr)}

    def _accept_prototypes(self, cid: int, payload: dict) -> dict:
        pr = payload["prototypes"]
        if not isinstance(pr, fedmc.PrototypeRelease):
            raise ValueError(f"client {cid}'s FedMC prototypes are a {type(pr).__name__}, not a PrototypeRelease")
        _check_rows(f"client {cid}'s FedMC prototypes", pr.centers, self.dim, self.dtype)
        return payload

    def _basis(self, uploads: dict) -> None:
        """Step 2 on the server: the GAB and gamma from the released prototypes (in cid order)."""
        if not uploads:
            raise RuntimeError("FedMC: no client's prototypes were usable")
        try:
            self.B, self.gamma = fedmc.setup_server_basis(
                [uploads[k]["prototypes"].prototypes() for k in sorted(uploads)], n_base=self.p["n_base"],
                gamma=self.p["gamma"], seed=self.seed)
        except ValueError as exc:
            if self.p["gamma"] not in ("median", "1/D"):
                raise
            raise ValueError(f"augmenter 'fedmc': gamma={self.p['gamma']!r} cannot be resolved on this run's GAB "
                             f"({exc}); set the kernel width yourself: --set fedmc.gamma=VALUE (a number > 0), or "
                             "gamma = VALUE under [params.fedmc] in a config file") from None

    def _accept_lgd(self, cid: int, payload: dict, what: str) -> dict:
        g = payload["lgd"]
        if not isinstance(g, fedmc.LocalGeometry):
            raise ValueError(f"client {cid}'s {what} is a {type(g).__name__}, not a LocalGeometry")
        D = self.B.shape[1]
        if g.centers.shape[1] != D or g.betas.shape[2] != self.B.shape[0] or g.gamma != self.gamma:
            raise ValueError(f"client {cid}'s {what} has D={g.centers.shape[1]}, S={g.betas.shape[2]}, "
                             f"gamma={g.gamma}; the server's GAB has D={D}, S={self.B.shape[0]}, gamma={self.gamma}")
        return payload

    def _lgd(self, data: ClientData, gen: torch.Generator):
        """Step 3 on a client: its LGD of its rows on the GAB, one DP release from ``gen``."""
        p = self.p
        return fedmc.setup_client_geometry(data.x, self.B, self.gamma, gen, n_clusters=p["n_clusters"],
                                           n_components=p["n_components"], epsilon=self.release_epsilon(),
                                           delta=p["delta"], clip_norm=p["clip_norm"], iters=_DP_ITERS)

    def _fuse(self, round: int | None, lgds: dict):
        """Step 4 on the server: the dictionary fused from ``lgds`` (cid -> LGD, in cid order)."""
        if not lgds:
            when = "the set-up" if round is None else f"round {round + 1}"
            raise ValueError(f"FedMC, {when}: no client released a usable LGD (every one is empty or was left "
                             "out), so there is no dictionary to fuse")
        return fedmc.setup_server_fuse([lgds[k] for k in sorted(lgds)], n_entries=self.p["n_entries"], seed=self.seed)

    def _use(self, dictionary) -> None:
        """Calibrate with ``dictionary`` (None: no calibration); its constants are prepared once."""
        if dictionary is None or dictionary is not self.dictionary or self.prepared is None:
            self.prepared = None if dictionary is None else fedmc.prepare(dictionary, self.B)
        self.dictionary = dictionary

    def _state(self) -> dict:
        """What a client holds, as a payload: the GAB and gamma once sent, and the dictionary it
        calibrates with (what goes down, and what a client keeps between messages)."""
        if self.B is None:
            return {}
        return {"gab": fedmc.GAB(self.B), "gamma": self.gamma,
                **({} if self.dictionary is None else {"dictionary": self.dictionary})}

    def _take(self, payload: dict) -> None:
        """A client takes a ``_state`` payload: the GAB and gamma where sent, and the dictionary
        (absent: none)."""
        if "gab" in payload:
            self.B, self.gamma = payload["gab"].basis, float(payload["gamma"])
        self._use(payload.get("dictionary"))

    def download(self, step, cid, payload, *, round):
        self._take(payload)

    def client_state(self, cid, data):
        return self._state()

    def load_client_state(self, cid, state):
        self._take(state)

    def _calibrate(self, data: ClientData, rows: torch.Tensor, generator):
        p = self.p
        if rows.numel() == 0:
            return data.x[:0], data.y[:0]
        Z = fedmc.calibrate(data.x[rows], self.prepared, formulation=p["formulation"], method=p["method"],
                            scale=p["scale"], steps=p["steps"], anchored=p["anchored"], generator=generator)
        return Z, data.y[rows]


class FedMCAlgorithm1(FedMCAugmenter):
    """``protocol="algorithm1"`` (default; the paper's Algorithm 1): the GAB once (DP prototypes of
    every client: step ``"prototypes"``); in every round r the participating clients S_r release
    fresh LGDs (step ``"lgd"``; their own generators (seed, r, k), so round r's geometry follows
    from (seed, r, S_r)), the server fuses them into D_r, and round r + 1's clients calibrate with
    D_r, sent down in that step. A client trains on its calibrated samples only, one x' per x (the
    paper's D-hat_k; ``target_per_class`` and ``n_per_sample`` do not apply). Round 1 has no
    dictionary yet (D_r exists only after round r's uploads), so its clients train on their real
    data. Bytes: round r counts S_r's LGD uploads and D_{r-1}'s download to S_r. Privacy: every
    participation is one more DP release; a client's epsilon composes its prototypes' release and
    all of its patch releases. With ``epsilon_total`` every release gets the share of a client
    that takes part in every round (1 + ``rounds`` releases, one noise multiplier:
    ``release_epsilon``), so no client spends more than epsilon_total, and one selected less often
    spends less. A resumed run rebuilds D_{r-1} first (step ``"rebuild"``: S_{r-1}'s LGDs asked
    again repeat the same draws, so nothing new is spent)."""

    def _calls(self):
        if self.rounds is None:
            raise ValueError("augmenter 'fedmc': protocol='algorithm1' with epsilon_total splits the budget "
                             "over the run's rounds: set the augmenter's rounds before setup")
        return 1 + self.rounds

    def bind(self, **kw):
        super().bind(**kw)
        self.released: list[int] = []  # DP calls per client so far
        self._spent = {0: 0.0}  # DP calls -> composed epsilon (the accountant is slow to ask)
        self.previous = None  # S_{r-1}: what rebuilds D_{r-1} after a resume
        self._next = None  # D_r, fused from this round's LGDs for the next round
        self.replaces_data = False

    def steps(self, round, clients):
        if round is None:
            return [("prototypes", clients)]
        rebuild = self.previous if round > 0 and self._next is None else None
        return ([("rebuild", rebuild)] if rebuild is not None else []) + [("lgd", clients)]

    def upload(self, step, cid, data, *, round):
        if step == "prototypes":
            return self._upload_prototypes(cid, data)
        if data.x.shape[0] == 0:  # a client without rows releases nothing
            return None
        r = round - 1 if step == "rebuild" else round
        return {"lgd": self._lgd(data, generator(self.seed, r, cid, GEOMETRY))}

    def accept(self, step, cid, payload, *, round):
        if step == "prototypes":
            return self._accept_prototypes(cid, payload)
        return self._accept_lgd(cid, payload, f"FedMC LGD of round {round + (0 if step == 'rebuild' else 1)}")

    def aggregate(self, step, uploads, *, round, clients, rejected):
        if step == "prototypes":  # the GAB down to every client; the LGDs follow round by round
            self._basis(uploads)
            self.released = [int(k in uploads) for k in clients]  # DP calls per client (clients: all, in order)
            self.setup_bytes = (sum(nbytes(u["prototypes"].centers, u["prototypes"].counts) for u in uploads.values()),
                                len(clients) * nbytes(self.B))
            return {k: self._state() for k in clients}
        lgds = {k: u["lgd"] for k, u in uploads.items()}
        if step == "rebuild":  # D_{r-1} again, from S_{r-1}'s repeated LGDs
            self._next = self._fuse(round - 1, lgds)
            return {}
        self._use(self._next)  # D_{r-1}: None in round 0
        self._next = self._fuse(round, lgds)
        for k in sorted(set(lgds) | set(rejected)):  # every LGD sent is a release, used or not
            self.released[k] += 1
        self.previous = [int(k) for k in clients]
        d = self.dictionary
        self.round_bytes = (sum(g.nbytes() for g in lgds.values()), 0 if d is None else len(clients) * d.nbytes())
        return {k: ({} if d is None else {"dictionary": d}) for k in clients}  # B and gamma are kept from set-up

    def _use(self, dictionary) -> None:
        super()._use(dictionary)
        self.replaces_data = self.prepared is not None  # with a dictionary, calibrated rows replace real ones

    def state_dict(self):
        return {"released": list(self.released), "previous": self.previous}

    def load_state_dict(self, state):
        if state:
            self.released, self.previous = [int(n) for n in state["released"]], state["previous"]
            self._next = None

    def privacy(self, n_clients):
        for n in set(self.released) - set(self._spent):
            self._spent[n] = fedmc.spent(self.release_epsilon(), self.p["delta"], iters=_DP_ITERS, releases=n)
        eps = [self._spent[n] for n in self.released]
        return {"epsilon_spent": [e if math.isfinite(e) else None for e in eps], "delta": self.p["delta"],
                "releases": max(self.released), "releases_per_client": list(self.released)}

    def augment(self, cid, data, *, generator):
        if self.prepared is None:  # round 1: no dictionary yet, the client trains on its real data
            return data.x[:0], data.y[:0]
        return self._calibrate(data, torch.arange(data.x.shape[0], device=data.x.device), generator)


class FedMCFixed(FedMCAugmenter):
    """``protocol="fixed"``: DP prototypes -> GAB -> local geometry -> fused dictionary, once, from
    every client (steps ``"prototypes"``, then ``"lgd"``: each client's LGD on the GAB, from the
    same set-up generator, the dictionary down to every client); then every round fresh
    calibrated samples labelled like their source, *added* to the client's real data: by default
    the same budget as GGEUR (fill each held class up to ``target_per_class``), or
    ``n_per_sample`` per local sample. It was the default until it measured 0.6-2.1 points below
    Algorithm 1 at every beta (docs/history.md §16): its added rows cost client drift, and neither
    protocol's samples beat its matched-compute control."""

    def _calls(self):
        return 2

    def bind(self, **kw):
        super().bind(**kw)
        self.spent = []

    def steps(self, round, clients):
        return [("prototypes", clients), ("lgd", clients)] if round is None else []

    def upload(self, step, cid, data, *, round):
        if step == "prototypes":
            return self._upload_prototypes(cid, data)
        if cid not in self.gens:  # it released no prototypes (no rows): it releases nothing more
            return None
        return {"lgd": self._lgd(data, self.gens.pop(cid))}  # the generator goes on from its first release

    def accept(self, step, cid, payload, *, round):
        if step == "prototypes":
            return self._accept_prototypes(cid, payload)
        return self._accept_lgd(cid, payload, "FedMC local geometry")

    def aggregate(self, step, uploads, *, round, clients, rejected):
        if step == "prototypes":
            self._basis(uploads)
            self._released = {k: u["prototypes"] for k, u in uploads.items()}
            return {k: self._state() for k in uploads}  # the LGD step asks those that released
        lgds = {k: u["lgd"] for k, u in uploads.items()}
        self._use(self._fuse(None, lgds))
        # two DP releases per client that released; bytes: its prototypes and LGD up, B and D down to all
        total = fedmc.spent(self.release_epsilon(), self.p["delta"], iters=_DP_ITERS, releases=2)
        self.spent = [total if k in self._released else 0.0 for k in clients]  # clients: all, in order
        self.setup_bytes = (sum(nbytes(pr.centers, pr.counts) + (lgds[k].nbytes() if k in lgds else 0)
                                for k, pr in self._released.items()),
                            len(self.spent) * (nbytes(self.B) + self.dictionary.nbytes()))
        return {k: self._state() for k in clients}

    def client_state(self, cid, data):
        state = self._state()
        if cid in self.gens:  # between its two releases
            state["generator"] = self.gens[cid].get_state()
        return state

    def load_client_state(self, cid, state):
        if "generator" in state:
            gen = torch.Generator()
            gen.set_state(state["generator"])
            self.gens[cid] = gen
        self._take(state)

    def privacy(self, n_clients):  # prototypes, then patch centres: two DP releases per client
        return {"epsilon_spent": [e if math.isfinite(e) else None for e in self.spent], "delta": self.p["delta"],
                "releases": 2}

    def augment(self, cid, data, *, generator):
        p = self.p
        if p["n_per_sample"] is not None:
            rows = torch.arange(data.x.shape[0], device=data.x.device).repeat_interleave(p["n_per_sample"])
        else:
            rows = fill_sources(data.y, self.n_classes, p["target_per_class"])
        return self._calibrate(data, rows, generator)


_FEDMC_CLASSES = {"algorithm1": FedMCAlgorithm1, "fixed": FedMCFixed}


AUGMENTERS = {"none": Augmenter, "oversample": OversampleAugmenter, "ggeur": GGEURAugmenter,
              "fedmc": FedMCAugmenter}


def register(cls: type[Augmenter]) -> type[Augmenter]:
    """Add an augmenter class to AUGMENTERS under its ``name``: a new augmenter's one registry line
    (``@register`` above its class; docs/development.md, "Add an FL algorithm or augmenter")."""
    AUGMENTERS[cls.name] = cls
    return cls


def build_augmenter(name: str, **params) -> Augmenter:
    if name not in AUGMENTERS:
        raise ValueError(f"augmenter={name!r} is not known; choose one of {sorted(AUGMENTERS)}")
    return AUGMENTERS[name](**params)
