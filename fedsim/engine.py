"""How the round loop reaches its clients: an engine, handed to ``runner.run`` / ``run_method``.

The loop (runner.GlobalFederation) asks an engine for three things per (method, seed): ``start``
(the clients' data and the augmenter of this method and seed), ``exchange`` (run the augmenter's
exchange steps for a round: its hooks, Augmenter.steps / upload / accept / aggregate / download)
and ``train`` (the selected clients' local rounds, each ``runner.client_round``). ``LocalEngine``
runs every client in this process; fedsim/flower's ``FlowerEngine`` runs them on Flower SuperNodes
and imports this module, never the reverse. An engine names itself (``name``, recorded in
config.json and timings.json) and says what it cannot do: ``check`` refuses a configuration by
name, ``resumable`` and ``tunes`` say whether ``--resume`` and ``--tune`` run on it.
"""
from __future__ import annotations

from ._progress import progress_bar
from .client import DivergedError, client_round


class Engine:
    name = "local"
    resumable = True  # a run on it can be resumed from its checkpoints
    tunes = True  # --tune runs on it

    def check(self, cfg) -> None:
        """Refuse, naming it, a configuration this engine cannot run."""

    def open(self, cfg, ds) -> None:
        """Before the run's first method (after every check): connect to the clients."""

    def start(self, cfg, spec, seed: int, clients: list, augmenter, model, n_classes: int) -> None:
        """Before the exchange of one (method, seed): every client's data (the local view; an engine
        whose clients hold their own data may ignore it), its augmenter (the server's, already
        bound to the run) and a model of the run's architecture."""
        raise NotImplementedError

    def exchange(self, augmenter, round: int | None, clients: list[int]) -> None:
        """The augmenter's exchange of ``round`` (None: the one-time set-up) with ``clients``."""
        raise NotImplementedError

    def train(self, spec, seed: int, round: int, selected: list[int], global_params: dict, algo) -> list:
        """Each selected client's (ClientUpdate, seconds augmenting, seconds training), in cid order;
        a diverging client raises client.DivergedError(what, cid)."""
        raise NotImplementedError

    def finish(self, spec, seed: int, global_params: dict, timings: dict) -> None:
        """After one (method, seed): what the engine adds to its timings."""


class LocalEngine(Engine):
    """Every client in this process, one after the other; the augmenter object serves as the server
    and as every client (Augmenter.exchange)."""

    def __init__(self, *, progress: bool = False):
        self.progress = progress

    def start(self, cfg, spec, seed, clients, augmenter, model, n_classes):
        self.cfg, self.seed, self.clients, self.augmenter, self.model = cfg, seed, clients, augmenter, model
        self.n_classes = n_classes

    def exchange(self, augmenter, round, clients):
        augmenter.exchange(round, clients, self.clients)

    def train(self, spec, seed, round, selected, global_params, algo):
        done = []
        for cid in progress_bar(selected, desc="clients", unit="client", enabled=self.progress, nested=True):
            try:
                done.append(client_round(self.cfg, algo, self.augmenter, self.model, global_params,
                                         self.clients[cid], seed=seed, round=round, cid=cid, n_classes=self.n_classes))
            except DivergedError as exc:
                raise DivergedError(str(exc), cid) from None
        return done
