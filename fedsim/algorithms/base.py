"""The algorithm interface: a small set of client and server hooks over one round loop.

The loop (fedsim/client.py for the local part, fedsim/runner.py for rounds) calls, per client:
``begin_client`` -> for each batch: loss = CE + ``extra_loss`` -> backward -> ``before_step`` ->
optimiser step -> ``end_client`` (returns what the client uploads besides its weights); then on
the server ``aggregate``. All algorithm state (server and per-client) goes through
``state_dict``/``load_state_dict`` so a run can resume exactly.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from geomkern.exchange import nbytes

from ..config import merge_params
from ..config import Real


class DivergedError(RuntimeError):
    """Training produced a non-finite loss or weights (the runner adds the likely cause). Here, below
    fedsim.client, so that an algorithm's own training phase (FLIC's alignment) can raise it."""


def make_optimizer(model: nn.Module, optimizer: str, *, lr: float, momentum: float = 0.9,
                   weight_decay: float = 0.0) -> torch.optim.Optimizer:
    """An optimizer over ``model``'s parameters. ``optimizer``: "sgd" (with ``momentum``) or "adam"
    (``momentum`` unused): the personalised methods' ``optimizer`` hyper-parameter (the FLIC paper
    trains with Adam). Used by client.local_train, personal._train and FLIC's alignment phase."""
    if optimizer == "adam":
        return torch.optim.Adam(model.parameters(), lr=lr, weight_decay=weight_decay)
    if optimizer == "sgd":
        return torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay)
    raise ValueError(f"local_train: optimizer must be 'sgd' or 'adam', got {optimizer!r}")


Params = dict[str, torch.Tensor]


@dataclass
class ClientContext:
    """What a client sees during its local update."""

    cid: int
    round: int
    model: nn.Module  # holds the global weights at begin_client
    global_params: Params  # detached copy of the global weights
    x: torch.Tensor  # (n, D) local training inputs (real + augmented)
    y: torch.Tensor  # (n,)
    n_real: int  # real (non-augmented) samples: the aggregation weight
    n_classes: int
    lr: float
    steps: int = 0  # optimiser steps taken (filled in by the loop)
    momentum: float = 0.0  # the local optimiser's heavy-ball momentum (set by the loop)
    scratch: dict = field(default_factory=dict)  # per-update working state of the algorithm
    # the client's real rows where x does not begin with them (an augmenter that replaces the data,
    # FedMC's Algorithm 1); None: the first n_real rows of x
    x_real: torch.Tensor | None = None
    y_real: torch.Tensor | None = None

    def real(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The client's real (x, y): what FedMP's bank and prototypes and FLIC's moments are made of."""
        if self.x_real is not None:
            return self.x_real, self.y_real
        return self.x[:self.n_real], self.y[:self.n_real]


@dataclass
class ClientUpdate:
    cid: int
    params: Params
    n_samples: int
    loss: float
    extras: dict[str, torch.Tensor] = field(default_factory=dict)

    def upload_bytes(self) -> int:
        return nbytes(*self.params.values(), *self.extras.values())


def params_of(model: nn.Module) -> Params:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def weighted_average(updates: list[ClientUpdate]) -> Params:
    total = float(sum(u.n_samples for u in updates))
    out = {}
    for k in updates[0].params:
        out[k] = sum(u.params[k].to(torch.float64) * (u.n_samples / total) for u in updates).to(
            updates[0].params[k].dtype)
    return out


class Algorithm:
    """FedAvg: plain local SGD and a sample-weighted average. Other algorithms override hooks."""

    name = "fedavg"
    defaults: dict = {}
    # the kind of each hyper-parameter (config.py's Int, Real, Choice, ...): --set, [params] tables and
    # config files are checked against it before anything is written; one entry per key of defaults
    params: dict = {}
    # The slots of state_dict that are server state a client reads in its hooks (sent down with the
    # weights, counted by download_bytes): what an engine whose clients run elsewhere (Flower) sends.
    # A slot keyed "<slot>/<cid>/<param>" is one client's own state and stays with that client.
    download_state: tuple[str, ...] = ()

    def __init__(self, **hparams):
        self.hp = merge_params(self.name, "hyper-parameter", self.defaults, hparams)

    def check_run(self, local_epochs: int) -> None:
        """Refuse, naming the setting, hyper-parameters that cannot run with the run's values
        (RunConfig.validate calls it, before anything is written); nothing by default."""

    @classmethod
    def controls(cls, hp: dict) -> list[dict]:
        """The controls of this algorithm (hyper-parameters ``hp``, defaults merged in) for the
        table's ``vs control`` column, in order of preference: each {"algorithm": name,
        "algorithm_params": values it must have}, under the same augmenter (report.control_of). An
        algorithm that only adds to FedAvg's steps has FedAvg-like controls (FedMP); none by default."""
        return []

    # ------------------------------------------------------------------ client hooks
    def begin_client(self, ctx: ClientContext) -> None:
        pass

    def extra_loss(self, ctx: ClientContext, x, y, logits, features) -> torch.Tensor | None:
        return None

    def before_step(self, ctx: ClientContext) -> None:
        pass

    def end_client(self, ctx: ClientContext) -> dict[str, torch.Tensor]:
        return {}

    # ------------------------------------------------------------------ server hooks
    def aggregate(self, global_params: Params, updates: list[ClientUpdate], *, n_clients: int) -> Params:
        return weighted_average(updates)

    def upload_bytes(self, update: ClientUpdate) -> int:
        """Bytes a client sends the server this round (its weights and extras by default; FedMP's
        few-shot schedule sends nothing in the rounds between two exchanges)."""
        return update.upload_bytes()

    def download_bytes(self, global_params: Params) -> int:
        """Bytes the server sends each selected client per round (the global model by default)."""
        return nbytes(*global_params.values())

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class FedAvg(Algorithm):
    pass


class FedProx(Algorithm):
    """Local proximal term mu/2 |w - w_global|^2 (Li et al. 2020)."""

    name = "fedprox"
    defaults = {"mu": 0.01}
    params = {"mu": Real(0)}

    def extra_loss(self, ctx, x, y, logits, features):
        prox = sum(((p - ctx.global_params[n]) ** 2).sum() for n, p in ctx.model.named_parameters())
        return 0.5 * self.hp["mu"] * prox
