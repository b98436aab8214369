"""The data splits: two rules shared by ``fedsim embed`` (fedsim/embed/) and ``fedsim import``
(fedsim/data/importer.py), kept here so the embedding pipeline imports them downward, and the
validation rows of a run (fedsim/runner.py).

* :func:`stratified_split`: the seeded stratified train/test split of one stratum (a class, or a
  (domain, class) pair): the stratum's n items, in a fixed order, are permuted by
  ``numpy.random.default_rng([seed, crc32(stratum)])`` and the first
  ``n_test = floor(test_fraction * n + 1/2)`` (at least 1 and at most n - 1 when n >= 2) go to
  test. Seeding per stratum by name keeps a stratum's split unchanged when other strata are added
  or left out.
* :func:`unit_rows`: L2-normalised float32 rows, refusing zero rows by name.
* :func:`validation_split`: the seeded stratified validation rows a `fedsim run` carves from each
  client's training rows (``--val-fraction``): per class the client holds, ``floor(fraction * n + 1/2)``
  of its n rows, at most n - 1 (a client keeps at least one training row of every class it holds,
  so the classes it holds, and what the augmenters see of them, stay the same), drawn by a
  permutation seeded from (seed, client, class). A class of 1-4 rows at the default 0.1 gives none:
  "stratified where possible".
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


_VALIDATION = 0x7A1  # key of the validation split's streams (apart from the partition's and the shift's)


def validation_split(labels, fraction: float, *, seed: int, client: int) -> tuple[np.ndarray, np.ndarray]:
    """(train positions, validation positions), sorted, into one client's rows of labels ``labels``
    (see the module docstring); ``fraction`` 0 keeps every row for training."""
    y = np.asarray(labels)
    train, val = [np.zeros(0, dtype=np.int64)], [np.zeros(0, dtype=np.int64)]
    for c in np.unique(y):
        rows = np.nonzero(y == c)[0]
        n_val = min(math.floor(fraction * len(rows) + 0.5), len(rows) - 1)
        order = np.random.default_rng([seed, client, int(c), _VALIDATION]).permutation(len(rows))
        val.append(rows[order[:n_val]])
        train.append(rows[order[n_val:]])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(val))


def unit_rows(x: np.ndarray, what: str) -> np.ndarray:
    """Rows of x scaled to unit L2 norm, as float32; ``what`` names the data in the error."""
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    if (norms == 0).any():
        raise ValueError(f"{what}: {int((norms == 0).sum())} zero rows cannot be L2-normalised")
    return (x / norms).astype(np.float32)
