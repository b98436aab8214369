"""Options of a generated dataset, written into its name: ``NAME?key=value&key=value``.

One way for every generated dataset (``toy:noisy-features``, ``toy:linear-mapping``,
``wordnet:mixed``): the options travel with ``--dataset`` and with ``dataset = "..."`` in a TOML
file, they are part of the configuration (so of the checkpoint fingerprint), and an unknown key
or a bad value is an error naming the key and the dataset. The number of clients is ``--clients``
as for every dataset.

    --dataset 'toy:linear-mapping?n_spaces=20&dims=3-99&n_classes=20'
    --dataset 'wordnet:mixed?prune=0&tfidf=0.5'
"""
from __future__ import annotations

import math


def split(name: str) -> tuple[str, dict[str, str]]:
    """``"toy:linear-mapping?noise=2&dims=10-40"`` -> ``("toy:linear-mapping", {"noise": "2", "dims": "10-40"})``."""
    base, sep, query = name.partition("?")
    opts: dict[str, str] = {}
    if sep:
        for item in query.split("&"):
            key, eq, value = item.partition("=")
            if not eq or not key or not value:
                raise ValueError(f"dataset {name!r}: option {item!r} must read key=value "
                                 "(options: NAME?key=value&key=value)")
            if key in opts:
                raise ValueError(f"dataset {name!r}: option {key!r} is given twice")
            opts[key] = value
    return base, opts


def parse(name: str, given: dict[str, str], kinds: dict[str, tuple]) -> dict:
    """Typed options. ``kinds``: key -> (type, check, what) with type int, float or "range" (two
    ints LO-HI, returned as a tuple), ``check(value) -> bool`` and ``what`` the allowed values in
    words (for the error)."""
    unknown = sorted(set(given) - set(kinds))
    if unknown:
        raise ValueError(f"dataset {name!r}: unknown option(s) {unknown}; it takes {sorted(kinds)}")
    out = {}
    for key, text in given.items():
        kind, check, what = kinds[key]
        try:
            if kind == "range":
                lo, dash, hi = text.partition("-")
                if not dash:
                    raise ValueError
                value = (int(lo), int(hi))
            else:
                value = kind(text)
        except ValueError:
            form = "LO-HI (two integers)" if kind == "range" else kind.__name__
            raise ValueError(f"dataset {name!r}: option {key}={text!r} must be {form}") from None
        if (isinstance(value, float) and not math.isfinite(value)) or not check(value):
            raise ValueError(f"dataset {name!r}: option {key}={text} must be {what}")
        out[key] = value
    return out
