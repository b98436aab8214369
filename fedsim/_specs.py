"""What a run is made of, as plain data: a method (``MethodSpec``), its folder name (``slug``),
the default method list, and the one rule for a plug-in's parameters (``merge_params``).

A leaf: it imports no other fedsim module, so the plug-ins (algorithms, augmenters), the config
checks and the runner can all import it without closing a circle (tests/test_structure.py)."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class MethodSpec:
    name: str
    algorithm: str = "fedavg"
    augmenter: str = "none"
    algorithm_params: dict = field(default_factory=dict)
    augmenter_params: dict = field(default_factory=dict)


def default_methods() -> list[MethodSpec]:
    # the matched-compute controls (docs/design.md note 9): FedAvg+oversample for GGEUR (extra rows),
    # FedAvg itself for FedMC under its default Algorithm 1 (one calibrated row per real row)
    return [MethodSpec("FedAvg"), MethodSpec("FedAvg+oversample", augmenter="oversample"),
            MethodSpec("FedAvg+GGEUR", augmenter="ggeur"), MethodSpec("FedAvg+FedMC", augmenter="fedmc")]


# the name of the ceiling row RunConfig.centralised adds (fedsim run --centralised)
CENTRALISED = "Centralised"


def slug(name: str) -> str:
    """A method's name as a folder name (runs/<slug>-seed<N>)."""
    return "".join(ch if ch.isalnum() else "-" for ch in name).strip("-").lower()


def merge_params(owner: str, noun: str, defaults: dict, given: dict) -> dict:
    """``defaults`` overridden by ``given``; a key ``defaults`` lacks is an error naming ``owner``."""
    unknown = set(given) - set(defaults)
    if unknown:
        raise ValueError(f"{owner} has no {noun}(s) {sorted(unknown)}; it takes {sorted(defaults) or 'none'}")
    return {**defaults, **given}
