"""``fedmc`` and ``fedmc-fixed``: FedMC's two protocols, each a registered augmenter over the shared
steps here (``FedMCAugmenter``): DP prototypes -> the GAB (global anonymous basis) -> local geometry
(LGD) on it -> the dictionary fused from the LGDs -> calibrated samples.

``fedmc`` is the paper's Algorithm 1 (a dictionary from every round's clients, calibrated samples
only); ``fedmc-fixed`` the one-time protocol (one dictionary before round 1, calibrated samples added
to the real ones). Configurations written before the two names (augmenter "fedmc" with protocol
"fixed") still run ``fedmc-fixed``: ``FedMCAlgorithm1.resolve``, which build_augmenter follows.
"""
from __future__ import annotations

import functools
import math
from abc import abstractmethod
from typing import TypedDict, Union

import torch

from geomkern import fedmc, privacy
from geomkern.exchange import nbytes

from .._seeds import GEOMETRY, SETUP, generator
from ..config import MAX_EPSILON, Bool, Choice, Either, Int, Nothing, Real
from ..data.clients import ClientData
from ._registry import register
from .base import Augmenter, check_rows, fill_sources

FEDMC_PROTOCOLS = ("fixed", "algorithm1")  # fedmc's protocol parameter, as configurations before fedmc-fixed set it
_DP_ITERS = 5  # noisy Lloyd releases per DP K-Means (fedmc's default)


@functools.lru_cache(maxsize=64)  # the accountant is slow to ask (seconds), and every client asks the same
def _split_epsilon(epsilon_total: float, delta: float, calls: int) -> float:
    return privacy.split_epsilon(epsilon_total, delta, calls=calls, releases=_DP_ITERS)


class PrototypesUpload(TypedDict):
    """Up in step "prototypes": a client's DP prototypes (centres and counts)."""

    prototypes: fedmc.PrototypeRelease


class LGDUpload(TypedDict):
    """Up in steps "lgd" and "rebuild": a client's local geometry on the GAB (one DP release)."""

    lgd: fedmc.LocalGeometry


class FedMCDownload(TypedDict, total=False):
    """Down (and what a client keeps between messages): the GAB and its kernel width gamma once
    sent, and the dictionary the client calibrates with (absent: none yet)."""

    gab: fedmc.GAB
    gamma: float
    dictionary: fedmc.GeometryDictionary


class FixedClientState(FedMCDownload, total=False):
    """What a fedmc-fixed client keeps between its two releases: also its set-up generator's state."""

    generator: torch.Tensor


FedMCUpload = Union[PrototypesUpload, LGDUpload]

# the parameters both protocols take
_DEFAULTS = {"n_prototypes": 32, "n_base": 256, "n_clusters": 8, "n_components": 4, "n_entries": 32,
             "gamma": "median", "epsilon": math.inf, "delta": 1e-5, "clip_norm": None, "scale": 1.0,
             "method": fedmc.DEFAULT_METHOD, "formulation": "consistent", "steps": None, "anchored": True,
             "epsilon_total": None}
_PARAMS = {"n_prototypes": Int(1), "n_base": Int(1), "n_clusters": Int(1),
           "n_components": Either(Int(1), Choice("auto")), "n_entries": Int(1),
           "gamma": Either(Real(0, lo_open=True), Choice("median", "1/D")),
           "epsilon": Real(0, MAX_EPSILON, lo_open=True, inf_ok=True,
                           note="per DP release; a larger one protects nothing: inf = no noise"),
           "delta": Real(0, 1, lo_open=True, hi_open=True),
           "clip_norm": Either(Nothing(), Real(0, lo_open=True, note="row-norm bound of the DP release; "
                                                                     "required with a finite epsilon")),
           "scale": Real(0), "method": Choice(*fedmc.PREIMAGE_METHODS), "formulation": Choice(*fedmc.FORMULATIONS),
           "steps": Either(Nothing(), Int(1)), "anchored": Bool(),
           "epsilon_total": Either(Nothing(), Real(0, MAX_EPSILON, lo_open=True, inf_ok=True,
                                                   note="the whole budget of a client's DP releases; a larger "
                                                        "one protects nothing: inf = no noise"))}
# fedmc-fixed's added-sample budget: fill each held class up to target_per_class, or n_per_sample per row
_BUDGET_DEFAULTS = {"target_per_class": 100, "n_per_sample": None}
_BUDGET_PARAMS = {"target_per_class": Int(0), "n_per_sample": Either(Nothing(), Int(0))}


class FedMCAugmenter(Augmenter[FedMCUpload, FedMCUpload, FedMCDownload]):
    """FedMC's steps shared by its two protocols (:class:`FedMCAlgorithm1`, ``fedmc``, and
    :class:`FedMCFixed`, ``fedmc-fixed``; this class is not registered). Both start with the same
    step, ``"prototypes"``: every client releases DP prototypes (its set-up generator
    (seed, 0, cid)), the server builds the GAB B and gamma from them and sends both down.

    ``clip_norm``: None (default) clips nothing at epsilon = inf (plain k-means++ patches); with a
    finite epsilon (or epsilon_total) None means 1.0, the norm of fedsim's L2-normalised rows.
    """

    def __init__(self, **params):
        super().__init__(**params)
        p = self.p
        finite = p["epsilon"] != math.inf or p["epsilon_total"] not in (None, math.inf)
        if finite and p["clip_norm"] is None:
            # the DP release needs a bound on the row norms; fedsim's embeddings are L2-normalised
            # (fedsim import and embed normalise; the loop warns about rows that are not)
            p["clip_norm"] = 1.0

    @abstractmethod
    def _calls(self) -> int:
        """The number of DP calls a client can make (release_epsilon splits epsilon_total over them)."""

    def release_epsilon(self) -> float:
        """The epsilon of each of a client's DP releases: ``epsilon``, or ``epsilon_total`` split
        over the most releases a client can make (``privacy.split_epsilon``: one noise multiplier
        for all of them): 2 under fedmc-fixed (prototypes, patch centres; as fedmc.setup splits it),
        1 + ``rounds`` under fedmc (Algorithm 1) (prototypes, then patch centres in every round, as a
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
            raise ValueError(f"augmenter {self.name!r}: epsilon_total (--epsilon-total) {total!r} is too small to "
                             f"split over a client's {calls} DP calls ({calls * _DP_ITERS} releases) at delta "
                             f"{delta!r}: the noise it calls for leaves each release an epsilon of 0 at that delta, "
                             "and a release needs one > 0. Give a larger --epsilon-total"
                             + (f" ({enough:g} splits here)" if enough else "")
                             + ", a larger delta, fewer rounds, or inf for no noise")
        return epsilon

    def bind(self, **kw):
        super().bind(**kw)
        self.B = self.gamma = self.dictionary = self.prepared = None
        self.gens: dict[int, torch.Generator] = {}  # a client's set-up generator between its two releases

    # ---------------------------------------------------------------- shared steps
    def _upload_prototypes(self, cid: int, data: ClientData) -> PrototypesUpload | None:
        """Step 1 on a client: its DP prototypes (none from a client without rows)."""
        if data.x.shape[0] == 0:
            return None
        p = self.p
        gen = generator(self.seed, 0, cid, SETUP)  # the run's one derivation
        pr = fedmc.setup_client_prototypes(data.x, gen, n_prototypes=p["n_prototypes"], epsilon=self.release_epsilon(),
                                           delta=p["delta"], clip_norm=p["clip_norm"], iters=_DP_ITERS)
        self.gens[cid] = gen
        return {"prototypes": fedmc.PrototypeRelease(*pr)}

    def _accept_prototypes(self, cid: int, payload: PrototypesUpload) -> PrototypesUpload:
        pr = payload["prototypes"]
        if not isinstance(pr, fedmc.PrototypeRelease):
            raise ValueError(f"client {cid}'s FedMC prototypes are a {type(pr).__name__}, not a PrototypeRelease")
        check_rows(f"client {cid}'s FedMC prototypes", pr.centers, self.dim, self.dtype)
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
            raise ValueError(f"augmenter {self.name!r}: gamma={self.p['gamma']!r} cannot be resolved on this run's "
                             f"GAB ({exc}); set the kernel width yourself: --set {self.name}.gamma=VALUE (a number "
                             f"> 0), or gamma = VALUE under [params.{self.name}] in a config file") from None

    def _accept_lgd(self, cid: int, payload: LGDUpload, what: str) -> LGDUpload:
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

    def _state(self) -> FedMCDownload:
        """What a client holds, as a payload: the GAB and gamma once sent, and the dictionary it
        calibrates with (what goes down, and what a client keeps between messages)."""
        if self.B is None:
            return {}
        return {"gab": fedmc.GAB(self.B), "gamma": self.gamma,
                **({} if self.dictionary is None else {"dictionary": self.dictionary})}

    def _take(self, payload: FedMCDownload) -> None:
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


@register
class FedMCAlgorithm1(FedMCAugmenter):
    """``fedmc`` (the paper's Algorithm 1; FedMC's default): the GAB once (DP prototypes of
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
    again repeat the same draws, so nothing new is spent).

    ``protocol`` is kept for configurations written before ``fedmc-fixed`` had its own name:
    "algorithm1" (the default) is this class, "fixed" selects ``fedmc-fixed`` (``resolve``; the
    added-sample budget ``target_per_class`` / ``n_per_sample`` is accepted for that alone)."""

    name = "fedmc"
    summary = ("FedMC as the paper's Algorithm 1: one calibrated sample per real row, so its matched-compute "
               "control is the algorithm alone")
    step_names = ("prototypes", "lgd", "rebuild")
    defaults = {**_DEFAULTS, **_BUDGET_DEFAULTS, "protocol": "algorithm1"}
    params = {**_PARAMS, **_BUDGET_PARAMS, "protocol": Choice(*FEDMC_PROTOCOLS)}

    @classmethod
    def resolve(cls, params):
        if params.get("protocol") == "fixed":
            return FedMCFixed.name, {k: v for k, v in params.items() if k != "protocol"}
        return None

    def __init__(self, **params):
        super().__init__(**params)
        protocol = self.p["protocol"]
        if protocol == "fixed":  # build_augmenter resolves it to fedmc-fixed; this is the class called directly
            raise ValueError("augmenter 'fedmc': protocol='fixed' is the augmenter 'fedmc-fixed': build that one "
                             "(build_augmenter('fedmc-fixed', ...) or build_augmenter('fedmc', protocol='fixed'); "
                             "--augmenters fedmc-fixed)")
        if protocol != "algorithm1":
            raise ValueError(f"augmenter 'fedmc': protocol={protocol!r} is not known; choose one of "
                             f"{list(FEDMC_PROTOCOLS)}")
        budget = sorted(k for k in _BUDGET_DEFAULTS if k in params)
        if budget:
            raise ValueError(f"augmenter 'fedmc': {', '.join(budget)} set(s) the added-sample budget of the "
                             "one-time protocol; fedmc (the paper's Algorithm 1) trains on one calibrated sample "
                             "per real row, so it does not apply: use the augmenter 'fedmc-fixed' "
                             "(--augmenters fedmc-fixed; in a config that names fedmc, protocol = \"fixed\")")

    @classmethod
    def controls(cls, p):  # one calibrated row per real row: the same steps as FedAvg's
        return [{"augmenter": "none", "augmenter_params": {}}]

    def _calls(self):
        if self.rounds is None:
            raise ValueError("augmenter 'fedmc' with epsilon_total splits the budget "
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

    def upload(self, step, cid, data, *, round) -> FedMCUpload | None:
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

    def aggregate(self, step, uploads, *, round, clients, rejected) -> dict[int, FedMCDownload]:
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


@register
class FedMCFixed(FedMCAugmenter):
    """``fedmc-fixed``, the one-time protocol: DP prototypes -> GAB -> local geometry -> fused
    dictionary, once, from every client (steps ``"prototypes"``, then ``"lgd"``: each client's LGD on
    the GAB, from the same set-up generator, the dictionary down to every client); then every round
    fresh calibrated samples labelled like their source, *added* to the client's real data: by
    default the same budget as GGEUR (fill each held class up to ``target_per_class``), or
    ``n_per_sample`` per local sample. It was FedMC's default (``protocol="fixed"``, which still
    selects it) until it measured 0.6-2.1 points below Algorithm 1 at every beta
    (docs/history.md §16): its added rows cost client drift, and neither protocol's samples beat
    its matched-compute control."""

    name = "fedmc-fixed"
    summary = "FedMC's one-time protocol: calibrated samples added to the real ones (control: oversample)"
    step_names = ("prototypes", "lgd")
    defaults = {**_DEFAULTS, **_BUDGET_DEFAULTS}
    params = {**_PARAMS, **_BUDGET_PARAMS}

    @classmethod
    def controls(cls, p):
        if p["n_per_sample"] is None:  # the extra rows of GGEUR's budget rule
            return [{"augmenter": "oversample", "augmenter_params": {"target_per_class": p["target_per_class"]}}]
        return []  # n_per_sample rows per real row: no control has that budget

    def _calls(self):
        return 2

    def bind(self, **kw):
        super().bind(**kw)
        self.spent = []

    def steps(self, round, clients):
        return [("prototypes", clients), ("lgd", clients)] if round is None else []

    def upload(self, step, cid, data, *, round) -> FedMCUpload | None:
        if step == "prototypes":
            return self._upload_prototypes(cid, data)
        if cid not in self.gens:  # it released no prototypes (no rows): it releases nothing more
            return None
        return {"lgd": self._lgd(data, self.gens.pop(cid))}  # the generator goes on from its first release

    def accept(self, step, cid, payload, *, round):
        if step == "prototypes":
            return self._accept_prototypes(cid, payload)
        return self._accept_lgd(cid, payload, "FedMC local geometry")

    def aggregate(self, step, uploads, *, round, clients, rejected) -> dict[int, FedMCDownload]:
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

    def client_state(self, cid, data) -> FixedClientState:
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
