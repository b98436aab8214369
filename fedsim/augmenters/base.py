"""The augmenter interface: the exchange protocol (``Exchange``) and the plug-in base (``Augmenter``).

An augmenter exchanges geometry between the clients and the server through one interface, the
same on every engine (``Exchange``: ``steps``, then per step ``upload`` on each client, ``accept``
and ``aggregate`` on the server, ``download`` on each client; fedsim/engine.py and the Flower apps
call nothing else), once before round 1 (embeddings are frozen, so the clients' geometry only
changes when their data does) and, for FedMC's Algorithm 1 (``fedmc``), again at the start of
every round. It then gives each selected client extra samples every round (``augment``: fresh
perturbations per round), may ask the loop to train on its samples alone (``replaces_data``),
accounts the bytes its exchange moves (``setup_bytes``, ``round_bytes``: (up, down) summed over
clients) and keeps what a resumed run needs in ``state_dict``. docs/flower.md shows the hooks in
a Flower app of one's own; docs/development.md ("Add an FL algorithm or augmenter") the recipe.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, Generic, TypeVar

import torch

from ..config import merge_params
from ..data.clients import ClientData

# An exchange payload: a dict whose values an engine can put in a message (fedsim/flower/codec.py
# writes each by its type): tensors, exchanged containers (geomkern.exchange: validated on
# construction and on receipt), lists of containers, numbers, strings, lists of ints and None. An
# augmenter names its own payloads as TypedDicts (plain dicts at run time, so the wire is the same).
Payload = dict[str, Any]

Up = TypeVar("Up", bound=Mapping[str, Any])  # what a client uploads in a step
Kept = TypeVar("Kept", bound=Mapping[str, Any])  # what the server keeps of an upload (accept)
Down = TypeVar("Down", bound=Mapping[str, Any])  # what goes down to a client in a step


class Exchange(ABC, Generic[Up, Kept, Down]):
    """The exchange protocol, the same on every engine (engine.py drives it in process,
    fedsim/flower/exchange.py over messages): a list of steps; in a step the taking-part clients
    ``upload`` (client side), the server ``accept``s each upload and ``aggregate``s them into what
    goes back to each client, and each client takes its ``download`` (client side).
    ``steps(None, clients)`` is the one-time exchange before round 1, ``steps(r, selected)`` the
    exchange at the start of round r (0-based), before its clients train. Payloads (``Up``,
    ``Kept``, ``Down``) are :data:`Payload` dicts. A client that is rebuilt for each message (a
    Flower SuperNode) keeps what it needs between messages in ``client_state``.
    """

    name: str
    step_names: tuple[str, ...] = ()  # every step ``steps`` can name (a client refuses another)

    @abstractmethod
    def steps(self, round: int | None, clients: list[int]) -> list[tuple[str, list[int]]]:
        """The exchange's steps, each (name, the clients taking part): ``round`` None is the one-time
        exchange (``clients``: all of them), an int the exchange of that round (``clients``: its
        selected ones)."""

    @abstractmethod
    def upload(self, step: str, cid: int, data: ClientData, *, round: int | None) -> Up | None:
        """Client side: what client ``cid`` sends in ``step`` (None: nothing, e.g. it has no rows)."""

    @abstractmethod
    def accept(self, step: str, cid: int, payload: Up, *, round: int | None) -> Kept:
        """Server side: check one client's upload against the run (raise ValueError naming what is
        wrong: the engine leaves that client out) and return what the server keeps of it."""

    @abstractmethod
    def aggregate(self, step: str, uploads: dict[int, Kept], *, round: int | None, clients: list[int],
                  rejected: list[int]) -> dict[int, Down]:
        """Server side: from the accepted uploads (cid -> what ``accept`` kept; ``rejected``: the
        clients whose upload was refused), what goes back to each client (cid -> payload). It also
        counts the step's bytes (``setup_bytes`` / ``round_bytes``)."""

    @abstractmethod
    def download(self, step: str, cid: int, payload: Down, *, round: int | None) -> None:
        """Client side: client ``cid`` takes what the server sent it in ``step``."""

    def client_state(self, cid: int, data: ClientData) -> Payload:
        """Client side: what client ``cid`` (rows ``data``) keeps between messages (a payload);
        empty by default."""
        return {}

    def load_client_state(self, cid: int, state: Payload) -> None:
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


class Augmenter(Exchange[Up, Kept, Down]):
    """An augmenter plug-in: ``name``, ``defaults`` and ``params`` (the kind of each default), the
    exchange protocol (here: no exchange; the ``none`` augmenter) and ``augment``.

    The in-process engine uses one object as the server and every client; so does ``setup`` /
    ``begin_round``, which run the exchange here for a given list of ClientData.
    """

    name = "none"
    # one line for `fedsim run --help` (generated from the registry: cli._augmenters_help); every
    # registered augmenter gives its own (tests/test_structure.py)
    summary = "no augmentation"
    defaults: dict = {}
    # the kind of each parameter (config.py's Int, Real, Choice, ...), checked before anything is written;
    # one entry per key of defaults
    params: dict = {}

    def __init__(self, **params):
        self.p = merge_params(f"augmenter {self.name!r}", "parameter", self.defaults, params)
        self.setup_bytes = (0, 0)
        self.round_bytes = (0, 0)  # (up, down) of the exchange of the current round
        self.replaces_data = False  # True: this round's clients train on augment's samples alone
        # the run's number of rounds, set by the loop before setup (FedMC's algorithm1 splits
        # epsilon_total over the releases a client can make in them)
        self.rounds: int | None = None
        self._run: tuple[int, int] | None = None  # (n_classes, seed) once bound
        # what accept checks uploads against (bind); None: not checked
        self.dim: int | None = None
        self.dtype: torch.dtype | None = None

    @classmethod
    def resolve(cls, params: dict) -> tuple[str, dict] | None:
        """The registered name and parameters that ``params`` select instead of this class (a name
        kept for old configurations: ``fedmc`` with protocol "fixed" is ``fedmc-fixed``); None: this
        class. build_augmenter and the report follow it."""
        return None

    @classmethod
    def controls(cls, p: dict) -> list[dict]:
        """This augmenter's matched-compute controls (parameters ``p``, defaults merged in; docs/design.md
        note 9), in order of preference: each {"augmenter": name, "augmenter_params": values it must
        have}, under the same algorithm (report.control_of); none by default (none, oversample)."""
        return []

    # ---------------------------------------------------------------- the run it serves
    def bind(self, *, n_classes: int, seed: int, dim: int | None = None, dtype: torch.dtype | None = None) -> None:
        """The run this object serves (server or client side): classes, seed, and the rows' width and
        dtype that uploads are checked against. Every engine calls it before the exchange."""
        self._run, self.dim, self.dtype = (n_classes, seed), dim, dtype

    def _bound(self) -> tuple[int, int]:
        if self._run is None:
            raise AttributeError(f"augmenter {self.name!r} is not bound to a run: call bind(n_classes=..., seed=...) "
                                 "(or setup) before its exchange hooks and augment")
        return self._run

    @property
    def n_classes(self) -> int:
        return self._bound()[0]

    @property
    def seed(self) -> int:
        return self._bound()[1]

    # ---------------------------------------------------------------- the exchange: none
    def steps(self, round, clients):
        return []

    def upload(self, step, cid, data, *, round):
        raise NotImplementedError(f"augmenter {self.name!r} has no exchange step {step!r}")

    def accept(self, step, cid, payload, *, round):
        return payload

    def aggregate(self, step, uploads, *, round, clients, rejected):
        return {}

    def download(self, step, cid, payload, *, round):
        pass

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


def check_rows(what: str, t: torch.Tensor, dim: int | None, dtype) -> None:
    """An uploaded container's rows must be the run's width and dtype."""
    if dim is not None and (t.shape[-1] != dim or t.dtype != dtype):
        raise ValueError(f"{what} are {t.dtype} in D={t.shape[-1]}; the run has {dtype} in D={dim}")


def fill_sources(y: torch.Tensor, n_classes: int, target: int) -> torch.Tensor:
    """Rows to calibrate so every class the client holds reaches ``target`` samples: for class c
    with n_c local samples, max(0, target - n_c) rows taken round-robin from c's samples in local
    order (the same budget rule as ggeur.augment's target_per_class; oversample and fedmc-fixed
    use it)."""
    out = []
    for c in range(n_classes):
        rows = torch.nonzero(y == c).squeeze(1)
        need = target - rows.numel()
        if rows.numel() and need > 0:
            out.append(rows[torch.arange(need, device=rows.device) % rows.numel()])
    return torch.cat(out) if out else y.new_zeros(0)
