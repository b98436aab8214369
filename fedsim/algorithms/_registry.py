"""The algorithm registry, apart from the package's __init__ so that each algorithm module can
register itself without importing the package that imports it (no import cycle, issue 30)."""
from __future__ import annotations

from .base import Algorithm, FedAvg, FedProx

ALGORITHMS: dict[str, type[Algorithm]] = {"fedavg": FedAvg, "fedprox": FedProx}


def register(cls: type[Algorithm]) -> type[Algorithm]:
    ALGORITHMS[cls.name] = cls
    return cls


def personal_algorithms() -> str:
    """The registered algorithms of the personalised path (their class sets ``personal = True``),
    as the error messages name them: "fedhenn, fedrep, flic, local"."""
    return ", ".join(sorted(n for n, c in ALGORITHMS.items() if getattr(c, "personal", False)))
