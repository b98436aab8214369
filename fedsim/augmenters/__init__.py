"""Feature-calibration plug-ins for the round loop: ``none``, ``oversample``, ``ggeur``, ``fedmc``,
``fedmc-fixed``. ``build_augmenter(name, **params)``.

base.py holds the exchange protocol every engine drives (``Exchange``: ``steps``, ``upload``,
``accept``, ``aggregate``, ``download``) and the plug-in base (``Augmenter``, which is ``none``);
each other augmenter is a module of its own that registers its class (``@register``,
fedsim/augmenters/_registry.py; docs/development.md, "Add an FL algorithm or augmenter").
"""
from __future__ import annotations

from ..data.clients import ClientData
from ._registry import AUGMENTERS, register
from .base import Augmenter, Exchange, Payload, fill_sources


def resolve(name: str, params: dict) -> tuple[str, dict]:
    """The registered name and parameters a method's (augmenter, augmenter_params) run as: the same,
    except for a name kept for old configurations (``fedmc`` with protocol "fixed" runs
    ``fedmc-fixed``: ``Augmenter.resolve``). Unknown names raise, listing the known ones."""
    if name not in AUGMENTERS:
        raise ValueError(f"augmenter={name!r} is not known; choose one of {sorted(AUGMENTERS)}")
    target = AUGMENTERS[name].resolve(params)
    return (name, params) if target is None else target


def augmenter_class(name: str, params: dict) -> type[Augmenter]:
    """The class a method's (augmenter, augmenter_params) builds (``resolve``)."""
    return AUGMENTERS[resolve(name, params)[0]]


def build_augmenter(name: str, **params) -> Augmenter:
    name, params = resolve(name, params)
    return AUGMENTERS[name](**params)


# Each module registers its augmenter with `register`, in this order (none is the base class).
from . import oversample, ggeur, fedmc  # noqa: E402,I001
from .fedmc import FEDMC_PROTOCOLS, FedMCAlgorithm1, FedMCAugmenter, FedMCFixed  # noqa: E402
from .ggeur import GGEURAugmenter  # noqa: E402
from .oversample import OversampleAugmenter  # noqa: E402

__all__ = ["AUGMENTERS", "Augmenter", "ClientData", "Exchange", "FEDMC_PROTOCOLS", "FedMCAlgorithm1", "FedMCAugmenter",
           "FedMCFixed", "GGEURAugmenter", "OversampleAugmenter", "Payload", "augmenter_class", "build_augmenter",
           "fill_sources", "register", "resolve"]
