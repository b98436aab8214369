"""The augmenter registry, apart from the package's __init__ so that each augmenter module can
register itself without importing the package that imports it (no import cycle; as
fedsim/algorithms/_registry.py)."""
from __future__ import annotations

from .base import Augmenter

AUGMENTERS: dict[str, type[Augmenter]] = {"none": Augmenter}


def register(cls: type[Augmenter]) -> type[Augmenter]:
    """Add an augmenter class to AUGMENTERS under its ``name``: a new augmenter's one registry line
    (``@register`` above its class; docs/development.md, "Add an FL algorithm or augmenter")."""
    AUGMENTERS[cls.name] = cls
    return cls
