"""The one rule for ``generator`` arguments (fedmc, ggeur, privacy).

Every function that draws random numbers takes a keyword ``generator``, default None
(``fedmc.client_prototypes``, ``local_geometry``, ``targets``, ``calibrate``; ``ggeur.augment``,
``augment_prototypes``; ``privacy.gaussian_mechanism``, ``dp_lloyd``); ``fedmc.setup`` and its
halves take ``generators``, one entry per client, each under the same rule:

* a ``torch.Generator``: the draw is reproducible from its seed (experiments, tests);
* ``None`` (the default): a fresh generator seeded from the operating system's cryptographic
  source (``secrets``): neither reproducible nor predictable, a new draw at every call. It never
  falls back to torch's global RNG, so ``torch.manual_seed`` does not make it reproducible.

Where the numbers are drawn: on the generator's device, whatever device the data is on; they are
then moved to the data's device (:func:`randn`). So one seed gives the same numbers for CPU and
CUDA data: a CPU generator with CUDA data draws on the CPU and pays one host-to-device copy per
draw; a generator on the data's device pays nothing. Any generator device works with any data
device, and the result is always on the data's device. None makes its generator on the data's
device (no copy: its numbers are secret, so where they come from cannot be told apart).

The privacy module is why None means *unpredictable* rather than "some default seed": DP noise
protects only while its seed is secret, so a deployment passes None (or a generator it seeded
secretly), never a generator seeded from a shared experiment seed; it is also why None is a safe
default. fedmc and ggeur follow the same rule so that None means one thing everywhere.
"""
from __future__ import annotations

import secrets

import torch


def resolve(generator, device: str | torch.device = "cpu") -> torch.Generator:
    """``generator`` itself (type-checked), or for None a fresh secretly seeded one on ``device``
    (the data's device)."""
    if generator is None:
        return torch.Generator(device=device).manual_seed(secrets.randbits(63))
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}; "
                        "None draws a secret seed from the OS (not reproducible)")
    return generator


def randn(shape, generator: torch.Generator, *, dtype: torch.dtype,
          device: str | torch.device | None = None) -> torch.Tensor:
    """Standard normal draws of ``shape`` from a resolved ``generator``, on the generator's device
    and then moved to ``device`` (the data's; None keeps them on the generator's)."""
    out = torch.randn(shape, generator=generator, dtype=dtype, device=generator.device)
    return out if device is None else out.to(device)


def seed(generator) -> int:
    """An int seed in [0, 2**62) for an op that takes one (``geomkern.kmeans``): drawn from
    ``generator`` (on its device), or a secret one for None."""
    if generator is None:
        return secrets.randbits(62)
    gen = resolve(generator)
    return int(torch.randint(0, 2 ** 62, (1,), generator=gen, device=gen.device))
