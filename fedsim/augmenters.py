"""Feature-calibration plug-ins for the round loop: ``none``, ``ggeur``, ``fedmc``.

An augmenter runs its geometry exchange once (``setup``: embeddings are frozen, so the clients'
geometry only changes when their data does) and then gives each selected client extra samples
every round (``augment``: fresh perturbations per round). It accounts the bytes its exchange
moves: ``setup_bytes`` (up, down) summed over clients. An augmenter whose geometry changes per
round (FedMC's ``protocol="algorithm1"``) does that exchange in ``begin_round`` (called by the
loop before the round's clients train; its bytes in ``round_bytes``), may ask the loop to train on
its samples alone (``replaces_data``), and keeps what a resumed run needs in ``state_dict``.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from geomkern import fedmc, ggeur, privacy
from geomkern.exchange import nbytes

from ._params import merge_params
from ._seeds import GEOMETRY, SETUP, generator
from ._seeds import AUGMENT
from ._seeds import generator as _generator  # augment()'s argument is named generator


@dataclass
class ClientData:
    """A client's training rows (x, y, domain ids d) and its validation rows (x_val, y_val: carved
    from its training rows by the run, runner.client_data; never seen by training or augmenters)."""

    x: torch.Tensor
    y: torch.Tensor
    d: torch.Tensor | None = None
    x_val: torch.Tensor | None = None
    y_val: torch.Tensor | None = None


class Augmenter:
    name = "none"
    defaults: dict = {}

    def __init__(self, **params):
        self.p = merge_params(f"augmenter {self.name!r}", "parameter", self.defaults, params)
        self.setup_bytes = (0, 0)
        self.round_bytes = (0, 0)  # (up, down) of the exchange of the current round's begin_round
        self.replaces_data = False  # True: this round's clients train on augment's samples alone
        # the run's number of rounds, set by the loop before setup (FedMC's algorithm1 splits
        # epsilon_total over the releases a client can make in them)
        self.rounds: int | None = None

    @classmethod
    def controls(cls, p: dict) -> list[dict]:
        """This augmenter's matched-compute controls (parameters ``p``, defaults merged in; docs/design.md
        note 9), in order of preference: each {"augmenter": name, "augmenter_params": values it must
        have}, under the same algorithm (report.control_of); none by default (none, oversample)."""
        return []

    def setup(self, clients: list[ClientData], *, n_classes: int, seed: int) -> None:
        pass

    def begin_round(self, round: int, selected: list[int], clients: list[ClientData], *, n_classes: int,
                    seed: int) -> None:
        """Called by the loop at the start of round ``round`` (0-based), before the ``selected``
        clients train: a per-round exchange goes here (it sets ``round_bytes`` and may set
        ``replaces_data``). Its randomness must follow from (seed, round, selected) alone, so that a
        resumed run repeats it. No-op by default."""

    def state_dict(self) -> dict:
        """What a resumed run needs besides (seed, round): plain ints, floats, strings, lists and
        dicts, stored in the checkpoint after every round. Empty by default."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` (after ``setup``) when a run resumes."""

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
    to ``target_per_class``; the paper fills to 2,000 on single-domain data). Multi-domain data (or
    ``prototypes=True``): clients also upload class prototypes and sample ``n_per_prototype``
    around every prototype of the *other domains* (the paper's Algorithm 2, M = 500 there): one
    pooled class mean per (domain, class), never one of the client's own domains; step 1 then
    fills to ``multi_domain_target`` (unset: ``target_per_class``; 500 in the paper). Without
    domain ids (``prototypes=True`` on single-domain data) each client counts as its own domain.

    ``resample``: "round" draws fresh samples every round (default); "once" is the paper's one-shot
    augmentation (Algorithms 1-2): a client's samples are drawn once, from the stream of round 0,
    and the same fixed set is used every round (and again, identically, after a resume)."""

    name = "ggeur"
    defaults = {"target_per_class": 100, "n_per_prototype": 5, "prototypes": "auto", "noise": "sqrt",
                "multi_domain_target": None, "resample": "round"}

    @classmethod
    def controls(cls, p):
        # the same extra rows per held class, copies of real rows (on multi-domain data GGEUR also adds
        # n_per_prototype rows around each other domain's prototype, which the control does not)
        return [{"augmenter": "oversample", "augmenter_params": {"target_per_class": p["target_per_class"]}}]

    def setup(self, clients, *, n_classes, seed):
        self.seed, self.cache = seed, {}
        self.combine([self.held(self.upload(c, n_classes)) for c in clients])

    def upload(self, data: ClientData, n_classes: int) -> dict:
        """Client side of the exchange: what one client sends (``combine`` takes one per client):
        ``stats`` (its ClassStatistics), ``domains`` (the domain ids it holds, sorted; None without
        domain ids) and ``per_domain`` (one ClassStatistics per held domain, only from a client of
        several domains that may need the multi-domain step; else None)."""
        doms = None if data.d is None else sorted(set(data.d.tolist()))
        per_domain = None
        if doms and len(doms) > 1 and self.p["prototypes"] is not False:
            per_domain = [ggeur.local_statistics(data.x[data.d == d], data.y[data.d == d], n_classes) for d in doms]
        return {"stats": ggeur.local_statistics(data.x, data.y, n_classes), "domains": doms, "per_domain": per_domain}

    @staticmethod
    def held(upload: dict) -> dict:
        """An ``upload`` as the server keeps it until ``combine``: its statistics as
        ggeur.HeldStatistics (the held classes' covariances only; the same geometry, bit for bit),
        so that the server's memory grows with what the clients hold, not with clients x C x D x D."""
        per = upload["per_domain"]
        return {**upload, "stats": ggeur.HeldStatistics.from_statistics(upload["stats"]),
                "per_domain": None if per is None else [ggeur.HeldStatistics.from_statistics(s) for s in per]}

    def combine(self, uploads: list[dict]) -> None:
        """Server side of the exchange, from every client's ``upload`` (or its ``held`` form): the
        global geometry, whether the multi-domain step runs, each client's prototypes of the other
        domains (``others``) and the bytes moved (``setup_bytes``)."""
        stats = [u["stats"] for u in uploads]
        self.geometry = ggeur.aggregate(stats)
        doms = [u["domains"] for u in uploads]
        use_protos = self.p["prototypes"]
        if use_protos == "auto":  # the multi-domain step, when the data has several domains
            use_protos = len({d for ds in doms if ds for d in ds}) > 1
        self.use_protos = bool(use_protos)
        up = sum(s.nbytes() for s in stats)
        down = len(uploads) * self.geometry.nbytes()
        if self.use_protos:
            if any(ds is None for ds in doms):  # no domain ids: every client is its own domain
                entries, groups, own = stats, list(range(len(uploads))), [[k] for k in range(len(uploads))]
            elif all(len(ds) <= 1 for ds in doms):  # one domain per client: its statistics carry the means
                entries, groups, own = stats, [ds[0] if ds else -1 for ds in doms], doms
            else:  # clients holding several domains upload one set of class means per domain they hold
                entries, groups = [], []
                for u, ds in zip(uploads, doms):  # a one-domain client's statistics are its domain's
                    entries += u["per_domain"] if len(ds) > 1 else [u["stats"]] * len(ds)
                    groups += ds
                up += sum(nbytes(e.means, e.counts) for e in entries)
                own = doms
            self.others = [ggeur.group_prototypes(entries, groups, exclude=own[k])[:2] for k in range(len(uploads))]
            down += sum(nbytes(p, l) for p, l in self.others)
        self.setup_bytes = (up, down)

    def receive(self, cid: int, geometry, others, *, seed: int) -> None:
        """Client side after the exchange (a client of a real federation, which has no
        ``combine``): the global geometry and, for the multi-domain step, the prototypes (P, L) the
        server sent client ``cid`` (None: no such step). ``augment(cid, ...)`` then draws exactly what
        it draws after ``setup``."""
        self.seed, self.cache = seed, {}
        self.geometry, self.use_protos = geometry, others is not None
        self.others = {cid: others} if others is not None else None

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

    def setup(self, clients, *, n_classes, seed):
        self.n_classes = n_classes  # nothing is exchanged: setup_bytes stay (0, 0)

    def augment(self, cid, data, *, generator):
        rows = fill_sources(data.y, self.n_classes, self.p["target_per_class"])
        return data.x[rows], data.y[rows]


FEDMC_PROTOCOLS = ("fixed", "algorithm1")
_DP_ITERS = 5  # noisy Lloyd releases per DP K-Means (fedmc's default)


@functools.lru_cache(maxsize=64)  # the accountant is slow to ask (seconds), and every client asks the same
def _split_epsilon(epsilon_total: float, delta: float, calls: int) -> float:
    return privacy.split_epsilon(epsilon_total, delta, calls=calls, releases=_DP_ITERS)


class FedMCAugmenter(Augmenter):
    """FedMC, in one of two protocols (``protocol``):

    ``"algorithm1"`` (default; the paper's Algorithm 1): the GAB once (DP prototypes of every
    client); in every round r the participating clients S_r release fresh LGDs (their own generators
    (seed, r, k), so round r's geometry follows from (seed, r, S_r)), the server fuses them into
    D_r, and round r + 1's clients calibrate with D_r. A client trains on its calibrated samples
    only, one x' per x (the paper's D-hat_k; ``target_per_class`` and ``n_per_sample`` do not
    apply). Round 1 has no dictionary yet (D_r exists only after round r's uploads), so its clients
    train on their real data. Bytes: round r counts S_r's LGD uploads and D_{r-1}'s download to
    S_r. Privacy: every participation is one more DP release; a client's epsilon composes its
    prototypes' release and all of its patch releases. With ``epsilon_total`` every release gets
    the share of a client that takes part in every round (1 + ``rounds`` releases, one noise
    multiplier: ``release_epsilon``), so no client spends more than epsilon_total, and one selected
    less often spends less. The engines share the protocol: ``start_rounds`` and ``round_exchange``
    (server), ``round_lgd`` and ``receive_round`` (client); ``begin_round`` is them in one process.

    ``"fixed"``: DP prototypes -> GAB -> local geometry -> fused dictionary, once, from every
    client; then every round fresh calibrated samples labelled like their source, *added* to the
    client's real data: by default the same budget as GGEUR (fill each held class up to
    ``target_per_class``), or ``n_per_sample`` per local sample. It was the default until it
    measured 0.6-2.1 points below Algorithm 1 at every beta (docs/history.md §16): its added
    rows cost client drift, and neither protocol's samples beat its matched-compute control.

    ``clip_norm``: None (default) clips nothing at epsilon = inf (plain k-means++ patches); with a
    finite epsilon (or epsilon_total) None means 1.0, the norm of fedsim's L2-normalised rows.
    """

    name = "fedmc"
    defaults = {"n_prototypes": 32, "n_base": 256, "n_clusters": 8, "n_components": 4, "n_entries": 32,
                "gamma": "median", "epsilon": math.inf, "delta": 1e-5, "clip_norm": None,
                "target_per_class": 100, "n_per_sample": None, "scale": 1.0, "method": fedmc.DEFAULT_METHOD,
                "formulation": "consistent", "steps": None, "anchored": True, "epsilon_total": None,
                "protocol": "algorithm1"}

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

    def _geometry_params(self) -> dict:
        p = self.p
        return dict(n_clusters=p["n_clusters"], n_components=p["n_components"], n_entries=p["n_entries"],
                    epsilon=p["epsilon"], delta=p["delta"], clip_norm=p["clip_norm"])

    @classmethod
    def controls(cls, p):
        if p["protocol"] == "algorithm1":  # one calibrated row per real row: the same steps as FedAvg's
            return [{"augmenter": "none", "augmenter_params": {}}]
        if p["n_per_sample"] is None:  # fixed: the extra rows of GGEUR's budget rule
            return [{"augmenter": "oversample", "augmenter_params": {"target_per_class": p["target_per_class"]}}]
        return []  # n_per_sample rows per real row: no control has that budget

    def setup(self, clients, *, n_classes, seed):
        p = self.p
        self.n_classes = n_classes
        gens = [generator(seed, 0, k, SETUP) for k in range(len(clients))]  # the run's one derivation
        if p["protocol"] == "algorithm1":
            protos, B, gamma = fedmc.setup_basis(
                [c.x for c in clients], generators=gens, n_prototypes=p["n_prototypes"], n_base=p["n_base"],
                gamma=p["gamma"], epsilon=self.release_epsilon(), delta=p["delta"], clip_norm=p["clip_norm"],
                iters=_DP_ITERS, seed=seed)
            self.start_rounds(protos, B, gamma, seed=seed)
            return
        # the data stays on its device: geomkern's steps return tensors where their inputs are
        res = fedmc.setup([c.x for c in clients], generators=gens, n_prototypes=p["n_prototypes"],
                          n_base=p["n_base"], gamma=p["gamma"], seed=seed, epsilon_total=p["epsilon_total"],
                          **self._geometry_params())
        self.receive(res.basis, res.gamma, res.dictionary, n_classes=n_classes)
        # a client without data (None) sends nothing
        sent = [c for c, pr in enumerate(res.prototypes) if pr is not None]
        self.account({c: res.prototypes[c] for c in sent}, {c: res.lgds[c] for c in sent}, res.epsilon, res.delta)

    def account(self, prototypes: dict, lgds: dict, spent: list, delta: float) -> None:
        """What the one-time exchange (``protocol="fixed"``) moved and spent, the same for every
        engine (this setup and fedsim/flower's server): ``prototypes`` / ``lgds`` map the id of each
        client that released them to what it sent; ``spent``: each client's composed epsilon (one
        per client); after ``receive``, whose B and dictionary every client downloads."""
        self.spent, self.delta = spent, delta
        up = sum(nbytes(pr.centers, pr.counts) + (lgds[c].nbytes() if c in lgds else 0)
                 for c, pr in prototypes.items())
        self.setup_bytes = (up, len(spent) * (nbytes(self.B) + self.dictionary.nbytes()))

    def receive(self, B, gamma: float, dictionary, *, n_classes: int) -> None:
        """Client side after the one-time exchange (``protocol="fixed"``): the GAB B (S, D), the
        shared gamma and the fused dictionary; calibrate's constants are prepared once here."""
        self.n_classes = n_classes
        self.B, self.gamma, self.dictionary = B, gamma, dictionary
        self.prepared = fedmc.prepare(dictionary, B)

    def release_epsilon(self) -> float:
        """The epsilon of each of a client's DP releases: ``epsilon``, or ``epsilon_total`` split
        over the most releases a client can make (``privacy.split_epsilon``: one noise multiplier
        for all of them): 2 under "fixed" (prototypes, patch centres; as fedmc.setup splits it),
        1 + ``rounds`` under "algorithm1" (prototypes, then patch centres in every round, as a
        client selected in every round makes them). Making fewer, a client spends less."""
        p = self.p
        if p["epsilon_total"] is None:
            return p["epsilon"]
        calls = 2
        if p["protocol"] == "algorithm1":
            if self.rounds is None:
                raise ValueError("augmenter 'fedmc': protocol='algorithm1' with epsilon_total splits the budget "
                                 "over the run's rounds: set the augmenter's rounds before setup")
            calls = 1 + self.rounds
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

    # ---------------------------------------------------------------- protocol="algorithm1"
    def start_rounds(self, prototypes: list, B, gamma: float, *, seed: int) -> None:
        """Server side of algorithm1's one-time part, the same for every engine: ``prototypes`` one
        per client (None: it released none), the GAB ``B`` and ``gamma`` built from them; counts
        the prototypes up and B down to every client (``setup_bytes``)."""
        self.B, self.gamma, self.seed, self.delta = B, gamma, seed, self.p["delta"]
        self.dictionary = self.prepared = self._next = None
        self.released = [int(pr is not None) for pr in prototypes]  # DP calls per client so far
        self._spent = {0: 0.0}  # DP calls -> composed epsilon (the accountant is slow to ask)
        self.previous = None  # S_{r-1}: what rebuilds D_{r-1} after a resume
        self.setup_bytes = (sum(nbytes(pr.centers, pr.counts) for pr in prototypes if pr is not None),
                            len(prototypes) * nbytes(B))

    def receive_round(self, B, gamma: float, dictionary, *, n_classes: int, seed: int) -> None:
        """Client side of an algorithm1 round: the GAB, gamma and the dictionary D_{r-1} to
        calibrate with (None in round 1: the client trains on its real data)."""
        self.B, self.gamma, self.seed, self.n_classes = B, gamma, seed, n_classes
        self._use(dictionary)

    def _use(self, dictionary) -> None:
        self.dictionary = dictionary
        self.prepared = None if dictionary is None else fedmc.prepare(dictionary, self.B)
        self.replaces_data = self.prepared is not None

    def round_lgd(self, cid: int, x: torch.Tensor, round: int):
        """Client side of algorithm1's round ``round``: client ``cid``'s LGD of its rows ``x`` on the
        GAB, one DP release at ``release_epsilon`` from its own generator (seed, round, cid), so the
        same request gives the same LGD; None for a client without rows (it releases nothing)."""
        if x.shape[0] == 0:
            return None
        p = self.p
        return fedmc.setup_client_geometry(x, self.B, self.gamma, generator(self.seed, round, cid, GEOMETRY),
                                           n_clusters=p["n_clusters"], n_components=p["n_components"],
                                           epsilon=self.release_epsilon(), delta=p["delta"],
                                           clip_norm=p["clip_norm"], iters=_DP_ITERS)

    def rebuild_from(self, round: int) -> list[int] | None:
        """After a resume: the clients S_{r-1} whose round r-1 LGDs rebuild D_{r-1} (asked again,
        they repeat the same draws: nothing new is spent); None when nothing needs rebuilding."""
        return self.previous if round > 0 and self._next is None else None

    def round_exchange(self, round: int, selected, lgds: dict, *, rebuild: dict | None = None,
                       released=None) -> None:
        """Server side of algorithm1's round ``round``, the same for every engine: ``lgds`` maps each
        client of S_r (``selected``) whose LGD is used to it. D_{r-1} becomes the dictionary of this
        round (``rebuild``: S_{r-1}'s LGDs again, see ``rebuild_from``), D_r is fused from ``lgds``
        for the next one; the releases (``released``: the clients that sent an LGD, used or
        rejected; default ``lgds``' clients), S_r and the round's bytes are counted."""
        if rebuild is not None:
            self._next = self._fuse(round - 1, rebuild)
        self._use(self._next)  # D_{r-1}: None in round 0
        self._next = self._fuse(round, lgds)
        for k in (lgds if released is None else released):
            self.released[k] += 1
        self.previous = [int(k) for k in selected]
        down = 0 if self.dictionary is None else len(selected) * self.dictionary.nbytes()
        self.round_bytes = (sum(lgds[k].nbytes() for k in lgds), down)

    def _fuse(self, round: int, lgds: dict):
        if not lgds:
            raise ValueError(f"FedMC algorithm1, round {round + 1}: no selected client released an LGD (every "
                             "one is empty or was left out), so there is no dictionary to fuse")
        return fedmc.setup_server_fuse([lgds[k] for k in sorted(lgds)], n_entries=self.p["n_entries"], seed=self.seed)

    def _round_lgds(self, round: int, cids, clients) -> dict:
        lgds = {k: self.round_lgd(k, clients[k].x, round) for k in cids}
        return {k: g for k, g in lgds.items() if g is not None}

    def begin_round(self, round, selected, clients, *, n_classes, seed):
        if self.p["protocol"] != "algorithm1":
            return
        previous = self.rebuild_from(round)
        self.round_exchange(round, selected, self._round_lgds(round, selected, clients),
                            rebuild=None if previous is None else self._round_lgds(round - 1, previous, clients))

    def state_dict(self) -> dict:
        if self.p["protocol"] != "algorithm1":
            return {}
        return {"released": list(self.released), "previous": self.previous}

    def load_state_dict(self, state: dict) -> None:
        if self.p["protocol"] == "algorithm1" and state:
            self.released, self.previous = [int(n) for n in state["released"]], state["previous"]
            self._next = None

    def privacy(self, n_clients: int) -> dict:
        if self.p["protocol"] != "algorithm1":  # prototypes, then patch centres: two DP releases per client
            return {"epsilon_spent": [e if math.isfinite(e) else None for e in self.spent], "delta": self.delta,
                    "releases": 2}
        for n in set(self.released) - set(self._spent):
            self._spent[n] = fedmc.spent(self.release_epsilon(), self.delta, iters=_DP_ITERS, releases=n)
        eps = [self._spent[n] for n in self.released]
        return {"epsilon_spent": [e if math.isfinite(e) else None for e in eps], "delta": self.delta,
                "releases": max(self.released), "releases_per_client": list(self.released)}

    def augment(self, cid, data, *, generator):
        p = self.p
        if p["protocol"] == "algorithm1":
            if self.prepared is None:  # round 1: no dictionary yet, the client trains on its real data
                return data.x[:0], data.y[:0]
            rows = torch.arange(data.x.shape[0], device=data.x.device)  # one x' per x
        elif p["n_per_sample"] is not None:
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
