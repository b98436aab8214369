"""geomkern's public ops as torch custom operators, ``torch.ops.geomkern.<name>``.

Each public function with a compiled path (``rbf_gram``, ``rbf_matmul``, ``kmeans``,
``kpca_transform``, ``preimage``) is a thin wrapper that translates its keyword arguments into
the operator's (``fit`` into its tensors, ``lr`` into a float or a tensor) and calls an
:class:`Op`. Every call, by the function or straight through ``torch.ops.geomkern.<name>``, runs
the op family's one argument ``check`` (every check that reads no tensor values: names, counts,
ranks, dtypes, devices, shapes; geomkern/_validate.py) and then the ``body`` (the value checks,
then the dispatched backend). The fake (meta) implementation runs the same ``check`` before it
computes the output shapes, so ``torch.compile`` refuses a bad name or count while it traces, and
runs the body, value checks included, at run time without a graph break.
"""
from __future__ import annotations

import functools
from typing import Callable

import torch

LIBRARY = "geomkern"


class Op:
    """A registered operator, its argument check and its body. Calling it in eager mode runs the
    check, then the body (no dispatcher round trip: a small rbf_gram measured 29 us a call this
    way, 86 us through the operator, whose first call also imports torch._dynamo, ~1 s); while
    torch.compile traces, it calls the operator, whose fake runs the check."""

    def __init__(self, check: Callable, body: Callable, custom):
        self.check, self.body, self.operator = check, body, custom

    def __call__(self, *args):
        if torch.compiler.is_compiling():
            return self.operator(*args)
        return self.body(*self.check(*args))


def op(name: str, schema: str, *, check: Callable, fake: Callable):
    """Decorator: the body ``fn`` becomes ``torch.ops.geomkern.<name>`` with ``schema`` (the
    argument names and types of the operator, as torch.library writes them). ``check`` takes the
    operator's arguments, raises on what it refuses and returns them normalised (e.g. ``gamma`` as
    a float), reading no tensor values; the operator runs it before ``fn`` and before the
    shape-only ``fake``. Returns an :class:`Op`."""
    def register(fn):
        @functools.wraps(fn)
        def checked(*args):
            return fn(*check(*args))

        @functools.wraps(fake)
        def checked_fake(*args):
            return fake(*check(*args))

        custom = torch.library.custom_op(f"{LIBRARY}::{name}", checked, mutates_args=(), schema=schema)
        custom.register_fake(checked_fake)
        return Op(check, fn, custom)
    return register
