"""The one local-training loop every algorithm runs through its hooks."""
from __future__ import annotations

import math
import time

import torch
from torch.nn import functional as F

from ._seeds import AUGMENT, TRAIN, generator
from .algorithms.base import (Algorithm, ClientContext, ClientUpdate, DivergedError,  # noqa: F401 (re-exported)
                              make_optimizer, params_of)


def local_train(algo: Algorithm, ctx: ClientContext, *, epochs: int, batch_size: int,
                momentum: float = 0.9, weight_decay: float = 0.0,
                generator: torch.Generator | None = None,
                optimizer: str | torch.optim.Optimizer = "sgd") -> ClientUpdate:
    """``optimizer``: a name for make_optimizer (fresh state each call), or an optimizer over
    ctx.model's parameters that the caller keeps across calls (personal._train: one per client
    round, its phases sharing it)."""
    model = ctx.model
    model.train()
    opt = make_optimizer(model, optimizer, lr=ctx.lr, momentum=momentum, weight_decay=weight_decay) \
        if isinstance(optimizer, str) else optimizer
    ctx.momentum = momentum
    algo.begin_client(ctx)
    n = ctx.x.shape[0]
    total, count = 0.0, 0
    for _ in range(epochs):
        perm = torch.randperm(n, generator=generator).to(ctx.x.device)
        for i in range(0, n, batch_size):
            idx = perm[i:i + batch_size]
            xb, yb = ctx.x[idx], ctx.y[idx]
            logits, feats = model(xb)
            loss = F.cross_entropy(logits, yb)
            extra = algo.extra_loss(ctx, xb, yb, logits, feats)
            if extra is not None:
                loss = loss + extra
            opt.zero_grad(set_to_none=True)
            loss.backward()
            algo.before_step(ctx)
            opt.step()
            ctx.steps += 1
            value = float(loss.detach())
            if not math.isfinite(value):
                raise DivergedError(f"the training loss became {value} at local step {ctx.steps}")
            total += value * len(idx)
            count += len(idx)
    extras = algo.end_client(ctx)
    params = params_of(model)
    bad = [k for k, v in params.items() if v.is_floating_point() and not bool(torch.isfinite(v).all())]
    if bad:
        raise DivergedError(f"the local weights {bad} became NaN/Inf")
    return ClientUpdate(cid=ctx.cid, params=params, n_samples=ctx.n_real,
                        loss=total / max(count, 1), extras=extras)


def client_round(cfg, algo, augmenter, model, global_params, client, *, seed: int,
                 round: int, cid: int, n_classes: int):
    """One client's part of one round, the same in every engine (engine.LocalEngine and the Flower
    ClientApp, fedsim/flower/client_app.py): the augmenter's samples for (seed, round, cid), then
    local training from ``global_params`` through the algorithm's client hooks (``algo`` holds this
    client's state).
    ``model`` is any model of the run's architecture (loaded here). Returns (ClientUpdate, seconds
    spent augmenting, seconds training); a diverging client raises DivergedError."""
    c = client
    t0 = time.perf_counter()
    # on the run's device: the augmenters draw where the data is (same numbers on CPU)
    xa, ya = augmenter.augment(cid, c, generator=generator(seed, round, cid, AUGMENT, device=c.x.device))
    t_geom = time.perf_counter() - t0
    model.load_state_dict(global_params)
    ctx = ClientContext(cid=cid, round=round, model=model,
                        global_params={k: v.detach().clone() for k, v in global_params.items()},
                        x=xa.to(c.x.dtype) if augmenter.replaces_data else torch.cat([c.x, xa.to(c.x.dtype)]),
                        y=ya if augmenter.replaces_data else torch.cat([c.y, ya]),
                        n_real=c.x.shape[0], n_classes=n_classes, lr=cfg.lr,
                        x_real=c.x if augmenter.replaces_data else None, y_real=c.y if augmenter.replaces_data else None)
    t0 = time.perf_counter()
    upd = local_train(algo, ctx, epochs=cfg.local_epochs, batch_size=cfg.batch_size, momentum=cfg.momentum,
                      weight_decay=cfg.weight_decay, generator=generator(seed, round, cid, TRAIN))
    return upd, t_geom, time.perf_counter() - t0
