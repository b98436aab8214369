"""The one seed derivation of a fedsim run.

Every random stream is a ``torch.Generator`` seeded from numpy's ``SeedSequence`` over a key
``(seed, round, client, purpose)``: streams are statistically independent of each other and of any
global RNG state, and a run resumed from a checkpoint draws exactly what an uninterrupted one does.
The purposes below keep the streams of one (seed, round, client) apart.
"""
from __future__ import annotations

import numpy as np
import torch

AUGMENT = 1  # an augmenter's samples for one client and round
TRAIN = 2  # local training (batch order) of one client and round
SETUP = 3  # an augmenter's one-time geometry exchange, per client (round 0)
GEOMETRY = 4  # an augmenter's per-round geometry exchange, per client and round (FedMC algorithm1)


def generator(seed: int, round: int, client: int, purpose: int, *, device="cpu") -> torch.Generator:
    """The generator for ``(seed, round, client, purpose)``, on ``device``."""
    seq = np.random.SeedSequence([seed, round, client, purpose])
    return torch.Generator(device=device).manual_seed(int(seq.generate_state(1, dtype=np.uint64)[0] >> 1))
