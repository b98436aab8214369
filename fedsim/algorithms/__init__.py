"""FL algorithms as hook sets over one round loop. ``build_algorithm(name, **hparams)``."""
from __future__ import annotations

from ._registry import ALGORITHMS, personal_algorithms, register
from .base import Algorithm, ClientContext, ClientUpdate


def build_algorithm(name: str, **hparams) -> Algorithm:
    key = name.lower()
    if key not in ALGORITHMS:
        raise ValueError(f"algorithm={name!r} is not known; choose one of {sorted(ALGORITHMS)}")
    return ALGORITHMS[key](**hparams)


__all__ = ["ALGORITHMS", "Algorithm", "ClientContext", "ClientUpdate", "build_algorithm", "personal_algorithms",
           "register"]

# Each module registers its algorithms with `register` (fedsim/algorithms/_registry.py).
from . import feddyn, fedmp, fedntd, fedopt, fedproto, moon, scaffold  # noqa: E402,F401
from . import fedhenn, fedrep, flic, local  # noqa: E402,F401  (personalised: fedsim/personal.py)
