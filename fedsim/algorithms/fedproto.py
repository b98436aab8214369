"""FedProto (Tan et al. 2022), here with a shared head so every algorithm yields one global model.

After local training a client uploads, per class, the mean of its model's features over its
training inputs (real + augmented) and the count behind each mean. The server averages them per
class weighted by counts into global prototypes, kept and sent down with the weights (which are
FedAvg-averaged). The local loss adds lam * |f(x) - proto[y]|^2 summed over the samples whose class
has a global prototype and divided by the batch's feature entries -- the authors' MSELoss over the
batch with a sample's own features standing in for a missing prototype.

With ``CosineHead`` features are the normalised inputs (no parameter moves them): the term is then
a constant and only the weights' FedAvg remains; FedProto acts on heads with learnt features.
"""
from __future__ import annotations

import torch

from geomkern.exchange import nbytes

from ..config import Real
from ._registry import register
from .base import Algorithm, ClientContext, Params, weighted_average
from .common import check_slots


@register
class FedProto(Algorithm):
    name = "fedproto"
    defaults = {"lam": 2.0}  # the GGEUR paper's setting
    params = {"lam": Real(0)}
    download_state = ("protos", "counts")

    def __init__(self, **hparams):
        super().__init__(**hparams)
        self.protos: torch.Tensor | None = None  # (C, F) global prototypes; rows with count 0 unused
        self.counts: torch.Tensor | None = None  # (C,) samples behind each global prototype

    def extra_loss(self, ctx: ClientContext, x, y, logits, features) -> torch.Tensor | None:
        if self.protos is None:
            return None
        has = self.counts[y] > 0
        if not bool(has.any()):
            return None
        diff = features[has] - self.protos[y[has]]
        return self.hp["lam"] * (diff * diff).sum() / features.numel()

    def end_client(self, ctx: ClientContext) -> dict[str, torch.Tensor]:
        model = ctx.model
        was_training = model.training
        model.eval()
        with torch.no_grad():
            feats = model(ctx.x)[1]
        model.train(was_training)
        counts = torch.bincount(ctx.y, minlength=ctx.n_classes)
        sums = torch.zeros(ctx.n_classes, feats.shape[1], dtype=feats.dtype, device=feats.device)
        sums.index_add_(0, ctx.y, feats)
        protos = sums / counts.clamp(min=1).to(feats.dtype)[:, None]
        return {"proto": protos, "proto_count": counts}

    def aggregate(self, global_params: Params, updates, *, n_clients: int) -> Params:
        counts = sum(u.extras["proto_count"] for u in updates)
        sums = sum(u.extras["proto"].to(torch.float64) * u.extras["proto_count"][:, None] for u in updates)
        self.protos = (sums / counts.clamp(min=1)[:, None]).to(updates[0].extras["proto"].dtype)
        self.counts = counts
        return weighted_average(updates)

    def download_bytes(self, global_params: Params) -> int:
        extra = 0
        if self.protos is not None:
            extra = nbytes(self.protos[self.counts > 0])  # only the classes somebody holds
        return super().download_bytes(global_params) + extra

    def state_dict(self) -> dict:
        if self.protos is None:
            return {}
        return {"protos": self.protos.clone(), "counts": self.counts.clone()}

    def load_state_dict(self, state: dict) -> None:
        check_slots(state, ("protos", "counts"), self.name)
        self.protos = state["protos"].clone() if "protos" in state else None
        self.counts = state["counts"].clone() if "counts" in state else None
