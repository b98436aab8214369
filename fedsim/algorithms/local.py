"""Personalised algorithms (each client keeps its own model) and ``local``: every client alone.

A personalised algorithm runs on the personalised path (fedsim/personal.py): each client owns a
``PersonalNet`` (embedding phi_i: its own D_i -> d, representation d -> h, head h -> C) and the
algorithm says which of its parameters are shared (``shares``) and with whom (``group``). The
algorithm also says how a client's round is split into phases (``phases``: which parts of
PersonalNet train, for how many epochs). By default every personalised algorithm follows FedRep's
schedule alike (matched compute): ``head_epochs`` epochs on the head with the rest frozen, then
``local_epochs`` epochs on the rest with the head frozen. ``schedule = "personal-first"`` is the
FLIC authors' code's (github.com/arakotom/flic, Het_Update.py, read only): the parts the algorithm
does not share train first, then the shared ones alone. Evaluation is per client, on the client's
own test split.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..config import Int, Str
from ._registry import register
from .base import Algorithm

PARTS = ("embed", "body", "head")  # PersonalNet's modules, the units a phase trains


@dataclass(frozen=True)
class Phase:
    """One phase of a client's local round: the PersonalNet modules that train (the others are
    frozen) and for how many epochs."""
    train: tuple[str, ...]
    epochs: int


def _count(name: str, key: str, v, lo: int) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise ValueError(f"{name}: {key} must be an integer >= {lo}, got {v!r}")


class PersonalAlgorithm(Algorithm):
    personal = True
    shared_prefixes: tuple[str, ...] = ()  # parameter-name prefixes of PersonalNet that are averaged
    # optimizer: the local optimiser, "sgd" (the run's lr and momentum) or "adam" (the run's lr;
    # the FLIC paper's choice for every method, presets/flic-paper.toml)
    # schedule: "fedrep" (head_epochs on the head, then local_epochs on the rest) or "personal-first"
    # (local_epochs - rep_epochs on the parts not shared, then rep_epochs on the shared parts alone;
    # in the rounds before rep_start_round all local_epochs on the parts not shared, the shared ones
    # frozen; with nothing shared, one phase on everything). head_epochs belongs to the first,
    # rep_epochs and rep_start_round to the second.
    # final_epochs: > 0 adds the FLIC authors' last round (main_flic.py and main_het_competitor.py:
    # after the T regular rounds, one more in which *every* client trains): each client trains what
    # it does not share for final_epochs epochs, the shared parts frozen, and nothing is averaged
    # after it. Their value is local_ep for Local and max(10, local_ep - local_rep_ep) for FLIC
    # (Het_Update.py), both 10 at their M = 10 (presets/flic-paper.toml).
    defaults = {"head_epochs": 1, "optimizer": "sgd", "schedule": "fedrep", "rep_epochs": 1, "rep_start_round": 0,
                "final_epochs": 0}
    # kinds only: the ranges and choices are checked by __init__ (its messages name the fix)
    params = {"head_epochs": Int(), "optimizer": Str(), "schedule": Str(), "rep_epochs": Int(),
              "rep_start_round": Int(), "final_epochs": Int()}

    def __init__(self, **hparams):
        super().__init__(**hparams)
        _count(self.name, "head_epochs", self.hp["head_epochs"], 0)
        if self.hp["optimizer"] not in ("sgd", "adam"):
            raise ValueError(f"{self.name}: optimizer must be 'sgd' or 'adam', got {self.hp['optimizer']!r} "
                             f"(--set {self.name}.optimizer=adam)")
        if self.hp["schedule"] not in ("fedrep", "personal-first"):
            raise ValueError(f"{self.name}: schedule must be 'fedrep' or 'personal-first', got "
                             f"{self.hp['schedule']!r} (--set {self.name}.schedule=personal-first)")
        _count(self.name, "rep_epochs", self.hp["rep_epochs"], 1)
        _count(self.name, "rep_start_round", self.hp["rep_start_round"], 0)
        _count(self.name, "final_epochs", self.hp["final_epochs"], 0)
        # a setting the chosen schedule ignores is a mistake, not a no-op
        rep = sorted({"rep_epochs", "rep_start_round"} & set(hparams))
        if rep and not self.shared_prefixes:
            raise ValueError(f"{self.name}: shares nothing, so {rep} have no shared phase to time; drop them")
        fedrep = self.hp["schedule"] == "fedrep"
        unused = rep if fedrep else sorted({"head_epochs"} & set(hparams))
        if unused:
            raise ValueError(f"{self.name}: {unused} do not apply to schedule={self.hp['schedule']!r}; drop them "
                             f"or set schedule={'personal-first' if fedrep else 'fedrep'}")

    def check_run(self, local_epochs: int) -> None:
        rep = self.hp["rep_epochs"]
        if self.hp["schedule"] == "personal-first" and self.shared_prefixes and rep > local_epochs:
            raise ValueError(f"{self.name}: rep_epochs ({rep}) must be at most the run's local_epochs "
                             f"({local_epochs}); lower --set {self.name}.rep_epochs or raise --epochs")

    def shares(self, key: str) -> bool:
        return bool(self.shared_prefixes) and key.startswith(self.shared_prefixes)

    def phases(self, round: int, local_epochs: int, model) -> list[Phase]:
        """The phases of a client's local update of ``model`` (a PersonalNet) in round ``round``
        (0-based), in order; a phase of 0 epochs is skipped. personal._train runs them, each
        through client.local_train. Under "personal-first" a model with no shared parameter (local;
        FLIC-Class, whose PersonalNet has no body) trains everything for all local_epochs, as the
        official code's clients with no global layer do."""
        if self.hp["schedule"] == "fedrep":
            return [Phase(("head",), self.hp["head_epochs"]), Phase(("embed", "body"), local_epochs)]
        shared, own = self._split(model)
        if not shared:
            return [Phase(own, local_epochs)]
        self.check_run(local_epochs)  # (RunConfig.validate asks first; this is for a direct caller)
        rep = self.hp["rep_epochs"]
        if round < self.hp["rep_start_round"]:
            return [Phase(own, local_epochs)]
        return [Phase(own, local_epochs - rep), Phase(shared, rep)]

    def final_phases(self, model) -> list[Phase]:
        """The final round's one phase (``final_epochs`` > 0): what ``model`` does not share."""
        return [Phase(self._split(model)[1], self.hp["final_epochs"])]

    def _split(self, model) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(the PersonalNet modules with a shared parameter, the others)."""
        shared = tuple(m for m in PARTS if any(self.shares(f"{m}.{k}") for k, _ in
                                               getattr(model, m).named_parameters()))
        return shared, tuple(m for m in PARTS if m not in shared)

    def group(self, cid: int, space: str) -> str:
        """The federation a client belongs to: clients of one group average their shared parameters."""
        return "all"

    def setup(self, *, n_classes: int, embed_dim: int, seed: int, device) -> None:
        """Server state that depends on the problem (FLIC's anchors); called before round 0."""

    def run_report(self) -> dict:
        """Per-seed counters the algorithm adds to its results.json entry (FLIC: clipped steps)."""
        return {}


@register
class Local(PersonalAlgorithm):
    """Each client trains its own model on its own data; nothing leaves the client."""

    name = "local"

    def group(self, cid, space):
        return f"client{cid}"
