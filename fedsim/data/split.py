"""Two data rules shared by ``fedsim embed`` (fedsim/embed/) and ``fedsim import``
(fedsim/data/importer.py), kept here so the embedding pipeline imports them downward.

* :func:`stratified_split`: the seeded stratified train/test split of one stratum (a class, or a
  (domain, class) pair): the stratum's n items, in a fixed order, are permuted by
  ``numpy.random.default_rng([seed, crc32(stratum)])`` and the first
  ``n_test = floor(test_fraction * n + 1/2)`` (at least 1 and at most n - 1 when n >= 2) go to
  test. Seeding per stratum by name keeps a stratum's split unchanged when other strata are added
  or left out.
* :func:`unit_rows`: L2-normalised float32 rows, refusing zero rows by name.
"""
from __future__ import annotations

import math
import zlib

import numpy as np


def stratified_split(n: int, test_fraction: float, seed: int, stratum: str) -> tuple[np.ndarray, np.ndarray]:
    """(train indices, test indices) of one stratum of n items (see the module docstring)."""
    n_test = math.floor(test_fraction * n + 0.5)
    if n >= 2:
        n_test = min(max(n_test, 1), n - 1)
    else:
        n_test = 0
    order = np.random.default_rng([seed, zlib.crc32(stratum.encode())]).permutation(n)
    return np.sort(order[n_test:]), np.sort(order[:n_test])


def unit_rows(x: np.ndarray, what: str) -> np.ndarray:
    """Rows of x scaled to unit L2 norm, as float32; ``what`` names the data in the error."""
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    if (norms == 0).any():
        raise ValueError(f"{what}: {int((norms == 0).sum())} zero rows cannot be L2-normalised")
    return (x / norms).astype(np.float32)
