"""fedsim's test helpers: a dataset file of Gaussian blobs, and a run interrupted after a given
round. Imported as ``_fedsim_helpers`` (tests/fedsim is on sys.path under pytest's prepend import
mode; see tests/geomkern/_oracle.py for why not from a conftest)."""
from __future__ import annotations

import contextlib

import torch


@contextlib.contextmanager
def interrupted_after(monkeypatch, runner_module, rounds: int):
    """Inside the block, fedsim's round loop stops with a KeyboardInterrupt (a user's Ctrl-C) in
    round ``rounds``, after ``rounds`` rounds were checkpointed: ``runner_module.evaluate`` raises
    on its call number ``rounds + 1``. The real evaluate is back after the block."""
    real, calls = runner_module.evaluate, {"n": 0}

    def crash(*a, **k):
        calls["n"] += 1
        if calls["n"] == rounds + 1:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(runner_module, "evaluate", crash)
    try:
        yield
    finally:
        monkeypatch.setattr(runner_module, "evaluate", real)


def save_blobs(path, *, classes: int, dim: int, noise: float, n_train: int, n_test: int, seed: int,
               domain_names=None):
    """A fedsim dataset file of unit-norm Gaussian blobs: one mean per class (shared by both
    splits), each row mean + noise * N(0, I), L2-normalised; with ``domain_names`` every row also
    gets a uniformly drawn domain. Returns ``path``."""
    from fedsim.data import Dataset, save_dataset

    g = torch.Generator().manual_seed(seed)
    mu = torch.randn(classes, dim, generator=g)

    def make(n):
        y = torch.randint(0, classes, (n,), generator=g)
        x = mu[y] + noise * torch.randn(n, dim, generator=g)
        d = None if domain_names is None else torch.randint(0, len(domain_names), (n,), generator=g)
        return x / x.norm(dim=1, keepdim=True), y, d

    (xt, yt, dt), (xs, ys, ds) = make(n_train), make(n_test)
    save_dataset(Dataset("blobs", xt, yt, xs, ys, [f"c{i}" for i in range(classes)], d_train=dt, d_test=ds,
                         domain_names=[] if domain_names is None else list(domain_names)), path)
    return path
