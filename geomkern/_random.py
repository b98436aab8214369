"""The one rule for ``generator`` arguments (fedmc, ggeur, privacy).

Every function that draws random numbers takes a keyword ``generator``, default None
(``fedmc.client_prototypes``, ``local_geometry``, ``targets``, ``calibrate``; ``ggeur.augment``,
``augment_prototypes``; ``privacy.gaussian_mechanism``, ``dp_lloyd``); ``fedmc.setup`` and its
halves take ``generators``, one entry per client, each under the same rule:

* a ``torch.Generator``: the draw is reproducible from its seed (experiments, tests);
* ``None`` (the default): a fresh generator seeded from the operating system's cryptographic
  source (``secrets``): neither reproducible nor predictable, a new draw at every call. It never
  falls back to torch's global RNG, so ``torch.manual_seed`` does not make it reproducible.

The privacy module is why None means *unpredictable* rather than "some default seed": DP noise
protects only while its seed is secret, so a deployment passes None (or a generator it seeded
secretly), never a generator seeded from a shared experiment seed; it is also why None is a safe
default. fedmc and ggeur follow the same rule so that None means one thing everywhere.
"""
from __future__ import annotations

import secrets

import torch


def resolve(generator, device: str | torch.device = "cpu") -> torch.Generator:
    """``generator`` itself (type-checked), or for None a fresh secretly seeded one on ``device``."""
    if generator is None:
        return torch.Generator(device=device).manual_seed(secrets.randbits(63))
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}; "
                        "None draws a secret seed from the OS (not reproducible)")
    return generator
