"""FedOpt (Reddi et al. 2021): the server treats Delta = avg_i w_i - w as a pseudo-gradient.

``server_opt`` picks the server optimiser (Reddi et al. Algorithm 2; no bias correction, v
starts at tau^2 as the paper's v_{-1} >= tau^2):
  adam: m <- b1 m + (1-b1) Delta;  v <- b2 v + (1-b2) Delta^2;                    w <- w + lr m / (sqrt(v) + tau)
  yogi: m as adam;                 v <- v - (1-b2) Delta^2 sign(v - Delta^2);      w as adam
  avgm: m <- b1 m + Delta;  w <- w + lr m   (FedAvgM, Hsu et al. 2019: b1 is the server momentum)
Clients train as in FedAvg; avg is sample-weighted. "fedadam", "fedyogi" and "fedavgm" fix it.
"""
from __future__ import annotations

import torch

from ..config import Real, Str
from ._registry import register
from .base import Algorithm, Params, weighted_average
from .common import check_slots, float_keys, put, take

SERVER_OPTS = ("adam", "yogi", "avgm")


@register
class FedOpt(Algorithm):
    name = "fedopt"
    # server_lr 0.5 is the GGEUR paper's setting; betas and tau as in Reddi et al.
    defaults = {"server_opt": "adam", "server_lr": 0.5, "beta1": 0.9, "beta2": 0.99, "tau": 1e-3}
    params = {"server_opt": Str(), "server_lr": Real(0, lo_open=True), "beta1": Real(0, 1, hi_open=True),
              "beta2": Real(0, 1, hi_open=True), "tau": Real(0, lo_open=True)}
    fixed_opt: str | None = None  # set by the subclasses that name one server optimiser

    def __init__(self, **hparams):
        super().__init__(**hparams)
        self.server_opt = self.fixed_opt or self.hp["server_opt"]
        if self.server_opt not in SERVER_OPTS:
            raise ValueError(f"{self.name}: server_opt={self.server_opt!r} is not known; "
                             f"choose one of {list(SERVER_OPTS)}")
        self.m: Params = {}  # server moments, float64
        self.v: Params = {}

    def aggregate(self, global_params: Params, updates, *, n_clients: int) -> Params:
        avg = weighted_average(updates)
        out = dict(avg)
        lr, b1 = self.hp["server_lr"], self.hp["beta1"]
        for k in float_keys(global_params):
            w = global_params[k].to(torch.float64)
            delta = avg[k].to(torch.float64) - w
            m = self.m.get(k, torch.zeros_like(delta))
            if self.server_opt == "avgm":
                self.m[k] = b1 * m + delta
                step = self.m[k]
            else:
                b2, tau = self.hp["beta2"], self.hp["tau"]
                v = self.v.get(k, torch.full_like(delta, tau * tau))
                self.m[k] = b1 * m + (1 - b1) * delta
                d2 = delta * delta
                if self.server_opt == "adam":
                    self.v[k] = b2 * v + (1 - b2) * d2
                else:
                    self.v[k] = v - (1 - b2) * d2 * torch.sign(v - d2)
                step = self.m[k] / (self.v[k].sqrt() + tau)
            out[k] = (w + lr * step).to(global_params[k].dtype)
        return out

    def state_dict(self) -> dict:
        out: dict = {}
        put(out, "m", self.m)
        put(out, "v", self.v)
        return out

    def load_state_dict(self, state: dict) -> None:
        check_slots(state, ("m", "v"), self.name)
        self.m, self.v = take(state, "m"), take(state, "v")


def _fixed(*unused: str) -> dict:
    """FedOpt's hyper-parameters less server_opt (fixed by the class) and those it does not use."""
    return {k: v for k, v in FedOpt.defaults.items() if k != "server_opt" and k not in unused}


@register
class FedAdam(FedOpt):
    name, fixed_opt, defaults = "fedadam", "adam", _fixed()
    params = {k: FedOpt.params[k] for k in defaults}


@register
class FedYogi(FedOpt):
    name, fixed_opt, defaults = "fedyogi", "yogi", _fixed()
    params = {k: FedOpt.params[k] for k in defaults}


@register
class FedAvgM(FedOpt):
    name, fixed_opt, defaults = "fedavgm", "avgm", _fixed("beta2", "tau")
    params = {k: FedOpt.params[k] for k in defaults}
