"""The clients of a global-model run: the partition of a dataset's training rows
(``make_partition``) and each client's rows as it sees them (``client_data``: its view under a
feature shift, its validation rows carved out), as ``ClientData``. The runner and the Flower
ClientApp build a client's data through the same two calls, so both engines train on the same rows."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .partition import feature_shift, partition
from .split import validation_split


@dataclass
class ClientData:
    """A client's training rows (x, y, domain ids d) and its validation rows (x_val, y_val: carved
    from its training rows by the run, client_data; never seen by training or augmenters)."""

    x: torch.Tensor
    y: torch.Tensor
    d: torch.Tensor | None = None
    x_val: torch.Tensor | None = None
    y_val: torch.Tensor | None = None


def make_partition(cfg, ds, seed: int) -> list[torch.Tensor]:
    """The partition of ds's training rows under ``cfg`` (a RunConfig) for ``seed`` (one index tensor per client)."""
    return partition(cfg.partition, labels=ds.y_train, domains=ds.d_train, n_clients=cfg.n_clients,
                     beta=cfg.beta, seed=seed, min_size=cfg.min_size)


def client_data(cfg, ds, parts, seed: int, *,
                pooled: bool = False) -> tuple[list[ClientData], torch.Tensor]:
    """Every client's data (on cfg.device) from the partition ``parts`` and the test inputs; with a
    feature shift each client's own view, the test rows split among them (seeded by ``seed``). Each
    client's validation rows (cfg.val_fraction) are carved from its rows after the shift, so they
    are seen through its view too. ``pooled``: one client (the centralised row) holding every
    client's training rows and validation rows as that client sees them, in dataset order."""
    dev = torch.device(cfg.device)
    xs, x_test = [ds.x_train[p] for p in parts], ds.x_test
    if cfg.feature_shift or cfg.feature_noise:
        xs, x_test, _ = feature_shift(xs, x_test, angle=cfg.feature_shift, noise=cfg.feature_noise, seed=seed)
    ys = [ds.y_train[p] for p in parts]
    doms = [None if ds.d_train is None else ds.d_train[p] for p in parts]
    split = [tuple(torch.from_numpy(i) for i in validation_split(y.cpu().numpy(), cfg.val_fraction, seed=seed,
                                                                 client=k)) for k, y in enumerate(ys)]
    if pooled:  # every client's rows in dataset order (with no shift and no validation: the dataset itself)
        def pool(ts, which):
            rows = torch.cat([p[s[which]] for p, s in zip(parts, split)])
            return torch.cat([t[s[which]] for t, s in zip(ts, split)])[torch.argsort(rows)]

        d = None if ds.d_train is None else pool(doms, 0)
        return [ClientData(pool(xs, 0).to(dev), pool(ys, 0).to(dev), None if d is None else d.to(dev),
                           pool(xs, 1).to(dev), pool(ys, 1).to(dev))], x_test
    clients = [ClientData(x[tr].to(dev), y[tr].to(dev), None if d is None else d[tr].to(dev), x[va].to(dev),
                          y[va].to(dev)) for x, y, d, (tr, va) in zip(xs, ys, doms, split)]
    return clients, x_test
