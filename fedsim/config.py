"""The kinds of a configuration value (``Int``, ``Real``, ``Choice``, ...) and the error a bad one
raises (``ConfigError``). A leaf: it imports no other fedsim module and no registry, so every
plug-in can declare its ``params`` with these kinds beside its ``defaults`` (tests/test_structure.py).
"""
from __future__ import annotations

import math
import numbers


class ConfigError(ValueError):
    """A configuration value fedsim cannot run with."""


# the largest seed: torch.manual_seed takes 64-bit seeds, numpy's SeedSequence any non-negative int
MAX_SEED = 2 ** 63 - 1
# The largest finite DP epsilon (per release or in total): a bound of e^100 on the likelihood ratio
# protects nothing, and the PLD accountant that calibrates the noise grows with epsilon (2.6 s at
# 100, 30 s at 1000; at 1e4 it ran out of memory and --epsilon-total 1e308 had the run killed).
# inf, not a huge number, is how a run asks for no noise.
MAX_EPSILON = 100.0


def _show(v) -> str:
    if isinstance(v, str):
        return f"{v!r} (a string)"
    if isinstance(v, bool):
        return f"{v} (true/false)"
    if isinstance(v, (dict, list, tuple)):
        return f"{v!r} (a {'table' if isinstance(v, dict) else 'list'})"
    if v is None:
        return "nothing (None)"
    return repr(v) if isinstance(v, numbers.Number) else f"{v!r} (a {type(v).__name__})"


def fail(where: str, what: str, v) -> None:
    raise ConfigError(f"config: {where} must be {what}, got {_show(v)}")


# ------------------------------------------------------------------------------ value kinds
class Int:
    def __init__(self, minimum: int | None = None, maximum: int | None = None):
        self.minimum, self.maximum = minimum, maximum

    def describe(self) -> str:
        lo, hi = self.minimum, self.maximum
        return "an integer" + (f" in [{lo}, {hi}]" if lo is not None and hi is not None
                               else f" >= {lo}" if lo is not None else f" <= {hi}" if hi is not None else "")

    def ok(self, v) -> bool:
        return (isinstance(v, numbers.Integral) and not isinstance(v, bool)
                and (self.minimum is None or v >= self.minimum) and (self.maximum is None or v <= self.maximum))

    def norm(self, v):
        return int(v)


class Real:
    """A real number in a range; finite unless ``inf_ok`` (then +inf is allowed too)."""

    def __init__(self, lo=None, hi=None, *, lo_open=False, hi_open=False, inf_ok=False, note=""):
        self.lo, self.hi, self.lo_open, self.hi_open, self.inf_ok, self.note = lo, hi, lo_open, hi_open, inf_ok, note

    def describe(self) -> str:
        if self.lo is not None and self.hi is not None:
            rng = f" in {'(' if self.lo_open else '['}{self.lo:g}, {self.hi:g}{')' if self.hi_open else ']'}"
        elif self.lo is not None:
            rng = f" {'>' if self.lo_open else '>='} {self.lo:g}"
        elif self.hi is not None:
            rng = f" {'<' if self.hi_open else '<='} {self.hi:g}"
        else:
            rng = ""
        kind = "a number" + rng + " (inf allowed)" if self.inf_ok else "a finite number" + rng
        return kind + (f" ({self.note})" if self.note else "")

    def ok(self, v) -> bool:
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            return False
        v = float(v)
        if math.isnan(v) or (math.isinf(v) and not (self.inf_ok and v > 0)):
            return False
        if math.isinf(v):  # inf_ok: +inf stands apart from the finite range (an epsilon's "no noise")
            return True
        if self.lo is not None and (v <= self.lo if self.lo_open else v < self.lo):
            return False
        return self.hi is None or (v < self.hi if self.hi_open else v <= self.hi)

    def norm(self, v):
        return v if isinstance(v, (int, float)) else float(v)


class Bool:
    def describe(self) -> str:
        return "true or false"

    def ok(self, v) -> bool:
        return isinstance(v, bool)

    def norm(self, v):
        return v


class Choice:
    def __init__(self, *values):
        self.values = values

    def describe(self) -> str:
        return "one of " + ", ".join(repr(v) for v in self.values)

    def ok(self, v) -> bool:
        return isinstance(v, str) and v in self.values

    def norm(self, v):
        return v


class Str:
    def describe(self) -> str:
        return "a non-empty string"

    def ok(self, v) -> bool:
        return isinstance(v, str) and v.strip() != ""

    def norm(self, v):
        return v


class Either:
    def __init__(self, *kinds):
        self.kinds = kinds

    def describe(self) -> str:
        return " or ".join(k.describe() for k in self.kinds)

    def ok(self, v) -> bool:
        return any(k.ok(v) for k in self.kinds)

    def norm(self, v):
        return next(k for k in self.kinds if k.ok(v)).norm(v)


class ListOf:
    """A list (possibly empty) of values of one kind."""

    def __init__(self, kind):
        self.kind = kind

    def describe(self) -> str:
        return f"a list of values each {self.kind.describe()}"

    def ok(self, v) -> bool:
        return isinstance(v, list) and all(self.kind.ok(x) for x in v)

    def norm(self, v):
        return [self.kind.norm(x) for x in v]


class Nothing:
    """None (a Python caller's "not set"; TOML has no null, so a file leaves the key out)."""

    def describe(self) -> str:
        return "unset"

    def ok(self, v) -> bool:
        return v is None

    def norm(self, v):
        return v


def check(where: str, kind, v):
    if not kind.ok(v):
        fail(where, kind.describe(), v)
    return kind.norm(v)


def _kind_of_default(default):
    """What a parameter without a table entry must be: its default's type."""
    if isinstance(default, bool):
        return Bool()
    if isinstance(default, numbers.Integral):
        return Int()
    if isinstance(default, numbers.Real):
        return Real(inf_ok=math.isinf(default))
    if isinstance(default, str):
        return Str()
    return None  # None, containers: nothing to infer
