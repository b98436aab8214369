"""Hyper-parameter handling shared by the algorithm and augmenter plug-ins."""
from __future__ import annotations


def merge_params(owner: str, noun: str, defaults: dict, given: dict) -> dict:
    """``defaults`` overridden by ``given``; a key ``defaults`` lacks is an error naming ``owner``."""
    unknown = set(given) - set(defaults)
    if unknown:
        raise ValueError(f"{owner} has no {noun}(s) {sorted(unknown)}; it takes {sorted(defaults) or 'none'}")
    return {**defaults, **given}
