"""Personalised algorithms (each client keeps its own model) and ``local``: every client alone.

A personalised algorithm runs on the personalised path (fedsim/personal.py): each client owns a
``PersonalNet`` (embedding phi_i: its own D_i -> d, representation d -> h, head h -> C) and the
algorithm says which of its parameters are shared (``shares``) and with whom (``group``). Local
training follows FedRep's schedule for every personalised algorithm alike (matched compute):
``head_epochs`` epochs on the head with the rest frozen, then ``local_epochs`` epochs on the rest
with the head frozen. Evaluation is per client, on the client's own test split.
"""
from __future__ import annotations

from ._registry import register
from .base import Algorithm


class PersonalAlgorithm(Algorithm):
    personal = True
    shared_prefixes: tuple[str, ...] = ()  # parameter-name prefixes of PersonalNet that are averaged
    # optimizer: the local optimiser, "sgd" (the run's lr and momentum) or "adam" (the run's lr;
    # the FLIC paper's choice for every method, presets/flic-paper.toml)
    defaults = {"head_epochs": 1, "optimizer": "sgd"}

    def __init__(self, **hparams):
        super().__init__(**hparams)
        h = self.hp["head_epochs"]
        if isinstance(h, bool) or not isinstance(h, int) or h < 0:
            raise ValueError(f"{self.name}: head_epochs must be an integer >= 0, got {h!r}")
        if self.hp["optimizer"] not in ("sgd", "adam"):
            raise ValueError(f"{self.name}: optimizer must be 'sgd' or 'adam', got {self.hp['optimizer']!r} "
                             f"(--set {self.name}.optimizer=adam)")

    def shares(self, key: str) -> bool:
        return bool(self.shared_prefixes) and key.startswith(self.shared_prefixes)

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
