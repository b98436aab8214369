"""SCAFFOLD (Karimireddy et al. 2020): control variates correct client drift.

Client i keeps c_i, the server keeps c (both start at zero, one tensor per model entry). Every
local step follows the paper's g + (c - c_i) (Algorithm 1, line 10), g the raw minibatch gradient,
with the local optimiser's heavy-ball momentum beta (torch's SGD: v_t = beta v_{t-1} + g_t,
w -= lr v_t). ``correction`` says where c - c_i enters:

- "momentum": added to the gradient, so it goes through the velocity and K steps move w
  by K_eff lr (c - c_i), K_eff = sum_t (1 - beta^t) / (1 - beta) (up to K / (1 - beta)): the drift
  correction at the strength of the momentum-amplified gradient it corrects.
- "step" (default): w -= lr (c - c_i) beside the optimiser's step on g, the paper's plain step: K steps move
  w by K lr (c - c_i), K / K_eff of the above (0.12 at beta 0.9, K = 60).

Either way, after K steps the client sets (option II, solved for the mean gradient)
c_i+ = ((w_global - w_local) / lr - S (c - c_i)) / K_eff with S = K_eff ("momentum") or K ("step"):
the displacement less the correction's own, over K_eff lr. For beta = 0 both are the paper's
c_i - c + (w_global - w_local) / (K lr). Since K heavy-ball steps move w by lr sum_s a_s g_s with
a_s = (1 - beta^(K-s+1)) / (1 - beta) and sum_s a_s = K_eff, c_i+ is exactly a weighted mean of the
raw minibatch gradients of the round (no larger than the largest). It uploads
delta_c_i = c_i+ - c_i with its weights. The server moves w <- w + global_lr (avg_i w_i - w) (avg
sample-weighted, as FedAvg) and c <- c + (|S|/N) mean_i delta_c_i. Downloads carry w and c;
uploads w_i and delta_c_i.

Which to use (docs/history.md §13): where the local steps overshoot (lr 0.5 with
momentum 0.9 on an mlp) "momentum" diverges, since c - c_i, a difference of last round's mean
gradients, is replayed with the amplified strength (global loss 9e2-2e4 after 8 rounds of the toy
problem of tests/fedsim/test_algorithms.py, 13 % vs 54 % test accuracy with the mlp head at lr 1.0 on the
embedded data), while "step" stays bounded in every setting measured. "step" is the default:
SCAFFOLD must not collapse where FedAvg recovers. It costs accuracy where "momentum" is stable:
at the defaults (cosine head, lr 0.05, beta 0.1, seeds 0-2) 63.70 +- 0.78 % against 66.46 +- 0.57 % in one run
(FedAvg 61.93 +- 1.00 % in an earlier run); ``--set scaffold.correction=momentum`` is there for that.
"""
from __future__ import annotations

import torch

from geomkern.exchange import nbytes

from ..config import Choice, Real
from ._registry import register
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
    # 0.25 is the GGEUR paper's setting; the SCAFFOLD paper's default is 1. correction: module docstring.
    defaults = {"global_lr": 0.25, "correction": "step"}
    params = {"global_lr": Real(0, lo_open=True), "correction": Choice("momentum", "step")}
    CORRECTIONS = ("momentum", "step")
    download_state = ("c",)

    def __init__(self, **hparams):
        super().__init__(**hparams)
        if self.hp["correction"] not in self.CORRECTIONS:
            raise ValueError(f"{self.name}: correction={self.hp['correction']!r} is not known; "
                             f"choose one of {list(self.CORRECTIONS)}")
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
        if self.hp["correction"] == "momentum":  # into the gradient, so through the optimiser's momentum
            for n, p in ctx.model.named_parameters():
                if p.grad is None:
                    p.grad = corr[n].clone()
                else:
                    p.grad.add_(corr[n])
            return
        # "step": w -= lr (c - c_i) beside the optimiser's step on the raw gradient, which was taken
        # before this move, as in w -= lr (v_t + c - c_i)
        with torch.no_grad():
            for n, p in ctx.model.named_parameters():
                p.sub_(corr[n], alpha=ctx.lr)

    def end_client(self, ctx: ClientContext) -> dict[str, torch.Tensor]:
        c, c_old = self.c, self._client_c(ctx.cid)
        local = ctx.model.state_dict()
        if ctx.steps == 0:  # no data, no step: nothing learnt about this client's drift
            c_new = {k: v.clone() for k, v in c_old.items()}
        elif self.hp["correction"] == "momentum":  # the correction moved w by K_eff lr (c - c_i)
            scale = 1.0 / (effective_steps(ctx.steps, ctx.momentum) * ctx.lr)
            c_new = {k: c_old[k] - c[k] + (ctx.global_params[k] - local[k].detach()) * scale for k in c}
        else:  # "step": it moved w by K lr (c - c_i), on the parameters (buffers: not at all)
            corr, k_eff = ctx.scratch["correction"], effective_steps(ctx.steps, ctx.momentum)
            c_new = {}
            for k in c:
                moved = (ctx.global_params[k] - local[k].detach()) / ctx.lr
                if k in corr:
                    moved = moved - ctx.steps * corr[k]
                c_new[k] = moved / k_eff
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
