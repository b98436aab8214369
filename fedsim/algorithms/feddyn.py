"""FedDyn (Acar et al. 2021): dynamic regularisation aligns local and global stationary points.

Client i keeps grad_i (zero at first). Its local loss adds -<grad_i, w> + alpha/2 |w - w_global|^2
(per batch, as the authors' code does); after training grad_i <- grad_i - alpha (w_i - w_global).
The server keeps h (zero at first): h <- h - alpha (1/N) sum_{i in S} (w_i - w_global) and
w <- avg_i w_i - h / alpha. avg is sample-weighted as in FedAvg here (the paper's is uniform;
they agree when clients hold equally many samples).
"""
from __future__ import annotations

import torch

from ..config import Real
from ._registry import register
from .base import Algorithm, ClientContext, Params, weighted_average
from .common import check_slots, float_keys, put, put_clients, take, take_clients


@register
class FedDyn(Algorithm):
    name = "feddyn"
    defaults = {"alpha": 0.5}  # the GGEUR paper's setting
    params = {"alpha": Real(0, lo_open=True)}

    def __init__(self, **hparams):
        super().__init__(**hparams)
        self.h: Params = {}  # server state, float64, over the float entries of the model
        self.grad: dict[int, Params] = {}  # grad_i by client id, over the model's parameters

    def _client_grad(self, ctx: ClientContext) -> Params:
        return self.grad.get(ctx.cid) or {n: torch.zeros_like(p) for n, p in ctx.model.named_parameters()}

    def begin_client(self, ctx: ClientContext) -> None:
        ctx.scratch["grad_i"] = self._client_grad(ctx)

    def extra_loss(self, ctx: ClientContext, x, y, logits, features) -> torch.Tensor:
        g, wg, alpha = ctx.scratch["grad_i"], ctx.global_params, self.hp["alpha"]
        linear = sum((g[n] * p).sum() for n, p in ctx.model.named_parameters())
        quad = sum(((p - wg[n]) ** 2).sum() for n, p in ctx.model.named_parameters())
        return -linear + 0.5 * alpha * quad

    def end_client(self, ctx: ClientContext) -> dict[str, torch.Tensor]:
        g, alpha = ctx.scratch["grad_i"], self.hp["alpha"]
        self.grad[ctx.cid] = {n: g[n] - alpha * (p.detach() - ctx.global_params[n])
                              for n, p in ctx.model.named_parameters()}
        return {}

    def aggregate(self, global_params: Params, updates, *, n_clients: int) -> Params:
        alpha = self.hp["alpha"]
        keys = float_keys(global_params)
        if not self.h:
            self.h = {k: torch.zeros_like(global_params[k], dtype=torch.float64) for k in keys}
        avg = weighted_average(updates)
        out = dict(avg)
        for k in keys:
            w = global_params[k].to(torch.float64)
            drift = sum(u.params[k].to(torch.float64) - w for u in updates)
            self.h[k] = self.h[k] - (alpha / n_clients) * drift
            out[k] = (avg[k].to(torch.float64) - self.h[k] / alpha).to(global_params[k].dtype)
        return out

    def state_dict(self) -> dict:
        out: dict = {}
        put(out, "h", self.h)
        put_clients(out, "grad", self.grad)
        return out

    def load_state_dict(self, state: dict) -> None:
        check_slots(state, ("h", "grad"), self.name)
        self.h = take(state, "h")
        self.grad = take_clients(state, "grad")
