"""geomkern's public ops as torch custom operators, ``torch.ops.geomkern.<name>``.

Each public function with a compiled path (``rbf_gram``, ``rbf_matmul``, ``kmeans``,
``kpca_transform``, ``preimage``) is a thin wrapper: it checks what can be checked without
reading tensor values (types and gradients, ``_validate.tensor_arg``; the scalar arguments) and
calls its operator, whose body is the function as it runs eagerly (every value check, then the
dispatched backend). The operator
has a fake (meta) implementation that only computes output shapes, so ``torch.compile`` traces
through a call without a graph break and runs the body at run time, checks included. Eager calls
run the body directly (:class:`Op`).
"""
from __future__ import annotations

from typing import Callable

import torch

LIBRARY = "geomkern"


class Op:
    """A registered operator and its body: calling it runs the body directly in eager mode (no
    dispatcher round trip: a small rbf_gram measured 29 us a call this way, 86 us through the
    operator, whose first call also imports torch._dynamo, ~1 s) and the operator when
    torch.compile traces the call."""

    def __init__(self, body: Callable, custom):
        self.body, self.operator = body, custom

    def __call__(self, *args):
        if torch.compiler.is_compiling():
            return self.operator(*args)
        return self.body(*args)


def op(name: str, schema: str, fake: Callable):
    """Decorator: ``fn`` becomes ``torch.ops.geomkern.<name>`` with ``schema`` (the argument
    names and types of the operator, as torch.library writes them) and shape-only ``fake``;
    returns an :class:`Op`."""
    def register(fn):
        custom = torch.library.custom_op(f"{LIBRARY}::{name}", fn, mutates_args=(), schema=schema)
        custom.register_fake(fake)
        return Op(fn, custom)
    return register

