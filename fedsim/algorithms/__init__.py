"""FL algorithms as hook sets over one round loop. ``build_algorithm(name, **hparams)``."""
from __future__ import annotations

from .base import Algorithm, ClientContext, ClientUpdate, FedAvg, FedProx

ALGORITHMS: dict[str, type[Algorithm]] = {"fedavg": FedAvg, "fedprox": FedProx}


def register(cls: type[Algorithm]) -> type[Algorithm]:
    ALGORITHMS[cls.name] = cls
    return cls


def build_algorithm(name: str, **hparams) -> Algorithm:
    key = name.lower()
    if key not in ALGORITHMS:
        raise ValueError(f"algorithm={name!r} is not known; choose one of {sorted(ALGORITHMS)}")
    return ALGORITHMS[key](**hparams)


__all__ = ["ALGORITHMS", "Algorithm", "ClientContext", "ClientUpdate", "build_algorithm", "register"]

# Imported last: each module registers its algorithms with the `register` defined above.
from . import feddyn, fedmp, fedntd, fedopt, fedproto, moon, scaffold  # noqa: E402,F401
from . import fedrep, flic, local  # noqa: E402,F401  (personalised: fedsim/personal.py)
