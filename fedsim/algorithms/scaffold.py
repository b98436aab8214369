"""SCAFFOLD (Karimireddy et al. 2020): control variates correct client drift.

Client i keeps c_i, the server keeps c (both start at zero, one tensor per model entry). Every
local step follows g + (c - c_i). After K local steps at rate lr the client sets (option II)
c_i+ = c_i - c + (w_global - w_local) / (K_eff lr) and uploads delta_c_i = c_i+ - c_i with its
weights. K_eff = K for plain SGD (the paper's option II); with heavy-ball momentum beta (torch's
SGD: v_t = beta v_{t-1} + g_t, w -= lr v_t) the same K steps move w by lr sum_t (1 - beta^t) /
(1 - beta) times a constant gradient, so K_eff is that sum and c_i+ is again the mean corrected
gradient (K lr alone over-stated it 4.1x at beta 0.9 and K = 10, up to 1 / (1 - beta)). The server moves w <- w + global_lr (avg_i w_i - w) (avg sample-weighted, as FedAvg)
and c <- c + (|S|/N) mean_i delta_c_i. Downloads carry w and c; uploads w_i and delta_c_i.
"""
from __future__ import annotations

import torch

from geomkern.exchange import nbytes

from . import register
from .base import Algorithm, ClientContext, Params, weighted_average
from .common import check_slots, float_keys, mean_extra, put, put_clients, take, take_clients


def effective_steps(k: int, momentum: float) -> float:
    """sum_{t=1..k} (1 - beta^t) / (1 - beta): how many lr-sized steps k heavy-ball steps take
    along a constant gradient (k for beta = 0)."""
    if momentum == 0.0:
        return float(k)
    b = momentum
    return (k - b * (1.0 - b ** k) / (1.0 - b)) / (1.0 - b)


@register
class Scaffold(Algorithm):
    name = "scaffold"
    # 0.25 is the GGEUR paper's setting; the SCAFFOLD paper's default is 1.
    defaults = {"global_lr": 0.25}
    download_state = ("c",)

    def __init__(self, **hparams):
        super().__init__(**hparams)
        self.c: Params = {}  # server control variate, over the float entries of the model
        self.c_i: dict[int, Params] = {}  # client control variates by client id

    def _server_c(self, global_params: Params) -> Params:
        if not self.c:
            self.c = {k: torch.zeros_like(global_params[k]) for k in float_keys(global_params)}
        return self.c

    def _client_c(self, cid: int) -> Params:
        return self.c_i.get(cid) or {k: torch.zeros_like(v) for k, v in self.c.items()}

    # ------------------------------------------------------------------ client hooks
    def begin_client(self, ctx: ClientContext) -> None:
        c = self._server_c(ctx.global_params)
        c_i = self._client_c(ctx.cid)
        ctx.scratch["correction"] = {n: c[n] - c_i[n] for n, _ in ctx.model.named_parameters()}

    def before_step(self, ctx: ClientContext) -> None:
        corr = ctx.scratch["correction"]
        for n, p in ctx.model.named_parameters():
            if p.grad is None:
                p.grad = corr[n].clone()
            else:
                p.grad.add_(corr[n])

    def end_client(self, ctx: ClientContext) -> dict[str, torch.Tensor]:
        c, c_old = self.c, self._client_c(ctx.cid)
        local = ctx.model.state_dict()
        if ctx.steps == 0:  # no data, no step: nothing learnt about this client's drift
            c_new = {k: v.clone() for k, v in c_old.items()}
        else:
            scale = 1.0 / (effective_steps(ctx.steps, ctx.momentum) * ctx.lr)
            c_new = {k: c_old[k] - c[k] + (ctx.global_params[k] - local[k].detach()) * scale for k in c}
        self.c_i[ctx.cid] = c_new
        return {f"delta_c/{k}": c_new[k] - c_old[k] for k in c}

    # ------------------------------------------------------------------ server hooks
    def aggregate(self, global_params: Params, updates, *, n_clients: int) -> Params:
        c = self._server_c(global_params)
        avg = weighted_average(updates)
        g = self.hp["global_lr"]
        out = dict(avg)
        for k in float_keys(global_params):
            w = global_params[k].to(torch.float64)
            out[k] = (w + g * (avg[k].to(torch.float64) - w)).to(global_params[k].dtype)
        frac = len(updates) / n_clients
        self.c = {k: (c[k].to(torch.float64) + frac * mean_extra(updates, f"delta_c/{k}")).to(c[k].dtype)
                  for k in c}
        return out

    def download_bytes(self, global_params: Params) -> int:
        c = self._server_c(global_params)
        return super().download_bytes(global_params) + nbytes(*c.values())

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        out: dict = {}
        put(out, "c", self.c)
        put_clients(out, "c_i", self.c_i)
        return out

    def load_state_dict(self, state: dict) -> None:
        check_slots(state, ("c", "c_i"), self.name)
        self.c = take(state, "c")
        self.c_i = take_clients(state, "c_i")
