"""FedNTD (Lee et al. 2022): not-true distillation keeps the global model's view of other classes.

Per batch: beta tau^2 KL(softmax(g_nt / tau) || softmax(l_nt / tau)), with g_nt / l_nt the global /
local logits with the true class's logit removed (so the softmax runs over the C-1 others), KL
averaged over the batch (the authors' ``batchmean``). The global model is a frozen copy taken at
begin_client. Aggregation is FedAvg's. No state across rounds.
"""
from __future__ import annotations

import torch
from torch.nn import functional as F

from ..config import Real
from ._registry import register
from .base import Algorithm, ClientContext
from .common import frozen_copy


def not_true_logits(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """(b, C) logits -> (b, C-1): each row without the entry of its true class y."""
    keep = torch.ones_like(logits, dtype=torch.bool).scatter_(1, y[:, None], False)
    return logits[keep].view(logits.shape[0], logits.shape[1] - 1)


@register
class FedNTD(Algorithm):
    name = "fedntd"
    defaults = {"beta": 1.0, "tau": 1.0}  # the paper's settings
    params = {"beta": Real(0), "tau": Real(0, lo_open=True)}

    def begin_client(self, ctx: ClientContext) -> None:
        ctx.scratch["global_model"] = frozen_copy(ctx.model)

    def extra_loss(self, ctx: ClientContext, x, y, logits, features) -> torch.Tensor:
        tau = self.hp["tau"]
        with torch.no_grad():
            log_p_glob = F.log_softmax(not_true_logits(ctx.scratch["global_model"](x)[0], y) / tau, dim=1)
        log_p_local = F.log_softmax(not_true_logits(logits, y) / tau, dim=1)
        # Both sides as log-probabilities: the KL is exactly 0 when local == global.
        kl = F.kl_div(log_p_local, log_p_glob, reduction="batchmean", log_target=True)
        return self.hp["beta"] * tau * tau * kl
