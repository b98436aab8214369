"""MOON (Li et al. 2021): model-contrastive learning on the model's features.

Per batch, with z the local model's features, z_glob the round's global model's and z_prev those of
this client's previous local model (the global model on a client's first participation):
mu * -log( e^{sim(z, z_glob)/tau} / (e^{sim(z, z_glob)/tau} + e^{sim(z, z_prev)/tau}) ),
sim = cosine, averaged over the batch. Aggregation is FedAvg's.

With ``CosineHead`` the features are the normalised inputs, which no parameter changes, so the
term is the constant mu log 2 there; MOON acts only on heads with learnt features (``MLPHead``).
"""
from __future__ import annotations

import torch
from torch.nn import functional as F

from ..config import Real
from ._registry import register
from .base import Algorithm, ClientContext, Params, params_of
from .common import check_slots, frozen_copy, put_clients, take_clients


@register
class Moon(Algorithm):
    name = "moon"
    defaults = {"mu": 1.0, "tau": 0.5}  # the GGEUR paper's settings
    params = {"mu": Real(0), "tau": Real(0, lo_open=True)}

    def __init__(self, **hparams):
        super().__init__(**hparams)
        self.prev: dict[int, Params] = {}  # each client's last local weights

    def begin_client(self, ctx: ClientContext) -> None:
        ctx.scratch["global_model"] = frozen_copy(ctx.model)
        ctx.scratch["prev_model"] = frozen_copy(ctx.model, self.prev.get(ctx.cid))

    def extra_loss(self, ctx: ClientContext, x, y, logits, features) -> torch.Tensor:
        with torch.no_grad():
            z_glob = ctx.scratch["global_model"](x)[1]
            z_prev = ctx.scratch["prev_model"](x)[1]
        tau = self.hp["tau"]
        sims = torch.stack([F.cosine_similarity(features, z_glob, dim=1),
                            F.cosine_similarity(features, z_prev, dim=1)], dim=1) / tau
        # -log softmax of the positive pair, i.e. cross-entropy with target 0.
        target = torch.zeros(len(x), dtype=torch.long, device=x.device)
        return self.hp["mu"] * F.cross_entropy(sims, target)

    def end_client(self, ctx: ClientContext) -> dict[str, torch.Tensor]:
        self.prev[ctx.cid] = params_of(ctx.model)
        return {}

    def state_dict(self) -> dict:
        out: dict = {}
        put_clients(out, "prev", self.prev)
        return out

    def load_state_dict(self, state: dict) -> None:
        check_slots(state, ("prev",), self.name)
        self.prev = take_clients(state, "prev")
