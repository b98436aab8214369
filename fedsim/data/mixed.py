"""``--dataset wordnet:mixed``: the embedded WordNet data with clients in two real feature spaces.

The same texts (WordNet noun synsets, ``"<lemma>: <gloss>"``) in two representations of the same
rows: the MiniLM sentence embeddings (384-d, ``wordnet_minilm.npz``) and a TF-IDF of character
n-grams reduced by truncated SVD (100-d, ``wordnet_tfidf.npz``, built from the same synsets by
scripts/build_tfidf_view.py, fitted on synsets outside the dataset). A seeded share ``tfidf`` of
the clients holds TF-IDF rows, the others MiniLM rows.

Coordinate pruning, as the FLIC paper's TextCaps setup: each client keeps a random number of
its representation's D coordinates, drawn uniformly in [ceil((1 - prune) D), D], picked at random
and in a random order, so no two clients share a feature space (``space`` names the client).
``prune=0`` keeps every coordinate in its order: the clients of one representation then share it
(space ``minilm`` or ``tfidf``), and FedRep can share within it.

Rows: train and test pooled, partitioned by the run's ``--partition``/``--beta``, each client's
rows split 80/20 into its train and test split (``fedsim.personal.personal_dataset``), exactly as
for a homogeneous dataset on the personalised path. Options (fedsim/data/spec.py):

    --dataset 'wordnet:mixed'                     tfidf=0.5, prune=0.05
    --dataset 'wordnet:mixed?prune=0&tfidf=0.3'
"""
from __future__ import annotations

import math

import numpy as np
import torch

from .dataset import EMBEDDED_DIR, Dataset, load_dataset
from .spec import parse, split

NAME = "wordnet:mixed"
TFIDF_FILE = "wordnet_tfidf.npz"
DEFAULTS = {"tfidf": 0.5, "prune": 0.05}
OPTIONS = {
    "tfidf": (float, lambda v: 0.0 <= v <= 1.0, "a share of the clients in [0, 1]"),
    "prune": (float, lambda v: 0.0 <= v < 1.0, "a fraction of coordinates in [0, 1)"),
}
_SEED_TAG = 0x313C  # the pruning and the TF-IDF clients' draw: SeedSequence([seed, tag, ...])


def is_mixed(name) -> bool:
    return isinstance(name, str) and name.partition("?")[0] == NAME


def options(name: str) -> dict:
    base, given = split(name)
    if base != NAME:
        raise ValueError(f"dataset {name!r} is not {NAME}")
    return {**DEFAULTS, **parse(name, given, OPTIONS)}


def load_views() -> tuple[Dataset, Dataset]:
    """(MiniLM, TF-IDF) datasets, checked to hold the same rows, labels and classes."""
    minilm = load_dataset("default")
    path = EMBEDDED_DIR / TFIDF_FILE
    if not path.is_file():
        raise FileNotFoundError(f"dataset {NAME!r} needs {path}, which is missing from this installation; "
                                "rebuild it with scripts/build_tfidf_view.py")
    tfidf = load_dataset(path)
    if (list(tfidf.class_names) != list(minilm.class_names) or not torch.equal(tfidf.y_train, minilm.y_train)
            or not torch.equal(tfidf.y_test, minilm.y_test)):
        raise ValueError(f"dataset {NAME!r}: {path} does not hold the rows of the embedded MiniLM dataset "
                         "(labels or classes differ); rebuild it with scripts/build_tfidf_view.py")
    return minilm, tfidf


def client_views(n_clients: int, seed: int, *, tfidf: float, prune: float, dims: dict[str, int]):
    """Per client: (representation name, kept coordinates (LongTensor) or None for all, space name).
    The TF-IDF clients are round(tfidf * K) of them, a seeded draw."""
    rng = np.random.default_rng([seed, _SEED_TAG])
    n_tfidf = int(round(tfidf * n_clients))
    is_tfidf = np.zeros(n_clients, dtype=bool)
    is_tfidf[rng.permutation(n_clients)[:n_tfidf]] = True
    out = []
    for cid in range(n_clients):
        rep = "tfidf" if is_tfidf[cid] else "minilm"
        if prune == 0:
            out.append((rep, None, rep))
            continue
        crng = np.random.default_rng([seed, _SEED_TAG, cid + 1])
        D = dims[rep]
        keep = int(crng.integers(math.ceil((1.0 - prune) * D), D + 1))
        cols = torch.from_numpy(crng.permutation(D)[:keep].astype(np.int64))
        out.append((rep, cols, f"{rep}-c{cid}"))
    return out
