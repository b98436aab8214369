"""FedHeNN (Makhija et al. 2022, "Architecture agnostic federated learning for neural networks"),
the FLIC paper's representation-alignment baseline on heterogeneous feature spaces.

Every client trains its own PersonalNet; nothing of its weights is shared. The clients meet only
through their representations (the head's input, PersonalNet.body(embed(x)), the penultimate layer
the FLIC authors' code aligns) of a small shared Representation Alignment Dataset (RAD). A client
adds to its loss

    eta * (1 - CKA(K_i, K))

with K_i = A_i A_i^T the linear kernel of its representation A_i (rad_size, h) of the RAD, K the
server's global kernel and CKA the centred kernel alignment <H K_i H, H K H>_F / (|H K_i H|_F
|H K H|_F) (scale-free, in [0, 1]). After local training a client uploads A_i; the server keeps
each client's latest one and K is the unweighted mean of their centred kernels over every client
heard from so far. A client's network changes only when it trains, so that table is the kernel of
every client's current network, which is what the official code recomputes each round from all
clients' networks (a server reaching non-participants, which a federation cannot do). Round 0
has no global kernel yet: its clients train as Local.

The RAD here: the clients hold different input dimensions D_i, so no data set of real rows can be
fed to all of them. As the FLIC authors' code does for its toys (github.com/arakotom/flic,
main_het_competitor.py, read only), the RAD is public Gaussian noise N(0, I) of the largest
dimension, "pruned" to each client's D_i: client i reads its first D_i coordinates. On the
noisy-features toy those are the latent coordinates every client shares, then noise; on the
linear-mapping toy the coordinates of two clients mean nothing in common, so the RAD carries no
shared meaning there. It is drawn once per run from the run's seed (no client's data enters it;
the official code redraws it every round, which needs every client's kernel on the new draw), a
row-major draw so that every D_i reads the same prefix whatever the largest dimension.

Deviation, stated: the official code adds + mu * cos(K^2, K_i^2) (an uncentred similarity, not a
distance) to the loss; here the term is the distance the paper describes, 1 - CKA.

Defaults follow the official code's FedHeNN: eta 0.1 (its mu), rad_size 100 (its Xrad_size).
Shared: the clients' RAD representations up (rad_size x h numbers), the global kernel down
(rad_size^2). Not shared: weights, raw features, their dimension.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from geomkern.exchange import nbytes

from ..config import Int, Real
from ._registry import register
from .base import ClientContext, Params
from .local import PersonalAlgorithm


def rad(seed: int, dim: int, size: int) -> torch.Tensor:
    """The run's RAD as a client of input dimension ``dim`` sees it: (size, dim) float32, the first
    ``dim`` coordinates of one N(0, I) draw (row j of the draw is coordinate j, so a prefix)."""
    g = np.random.default_rng(np.random.SeedSequence([seed, 0xFE0E]))
    return torch.from_numpy(g.standard_normal((dim, size)).T.astype(np.float32))


def centred_kernel(A: torch.Tensor) -> torch.Tensor:
    """H (A A^T) H of representations ``A`` (n, h), float64."""
    A = A.to(torch.float64)
    A = A - A.mean(0)
    return A @ A.T


def cka_distance(A: torch.Tensor, K: torch.Tensor) -> torch.Tensor:
    """1 - CKA between the linear kernel of ``A`` (n, h) and the centred kernel ``K`` (n, n), float64.
    A representation with no spread (all rows equal, e.g. dead ReLUs) is at distance 1."""
    A = A.to(torch.float64)
    A = A - A.mean(0)
    # <A A^T, K>_F = tr(A^T K A) and |A A^T|_F = |A^T A|_F: (h, h) products, not (n, n)
    inner = torch.einsum("ih,ij,jh->", A, K, A)
    return 1.0 - inner / ((A.T @ A).norm() * K.norm()).clamp_min(1e-300)


@register
class FedHeNN(PersonalAlgorithm):
    name = "fedhenn"
    defaults = {**PersonalAlgorithm.defaults, "eta": 0.1, "rad_size": 100}
    params = {**PersonalAlgorithm.params, "eta": Real(), "rad_size": Int()}

    def __init__(self, **hparams):
        super().__init__(**hparams)
        eta, n = self.hp["eta"], self.hp["rad_size"]
        if isinstance(eta, bool) or not isinstance(eta, (int, float)) or not math.isfinite(eta) or eta < 0:
            raise ValueError(f"fedhenn: eta must be a finite number >= 0 (the alignment weight; 0 trains as "
                             f"local), got {eta!r} (--set fedhenn.eta=0.1)")
        if isinstance(n, bool) or not isinstance(n, int) or n < 2:
            raise ValueError(f"fedhenn: rad_size must be an integer >= 2 (a centred kernel of one row is zero), "
                             f"got {n!r} (--set fedhenn.rad_size=100)")
        self.features: dict[int, torch.Tensor] = {}  # cid -> its latest RAD representation (rad_size, h)
        self.kernel: torch.Tensor | None = None  # the global centred kernel (rad_size, rad_size) float64
        self.distance: list[float] = []  # per round from round 1: the participants' mean 1 - CKA after training
        self._round: list[float] = []
        self._rads: dict[tuple, torch.Tensor] = {}

    @classmethod
    def controls(cls, hp: dict) -> list[dict]:
        """Local under the same optimiser and schedule: FedHeNN adds only the alignment term."""
        if hp["eta"] == 0:
            return []
        return [{"algorithm": "local", "algorithm_params": {k: hp[k] for k in ("optimizer", "schedule", "head_epochs")}}]

    def group(self, cid, space):
        return "all"  # one federation: everybody's kernel goes into the global one

    def _rad(self, ctx: ClientContext) -> torch.Tensor:
        key = (ctx.x.shape[1], ctx.x.device)
        if key not in self._rads:
            self._rads[key] = rad(self.seed, ctx.x.shape[1], self.hp["rad_size"]).to(ctx.x.device)
        return self._rads[key]

    @staticmethod
    def _representation(model, x):
        return model.body(model.embed(x))

    # ------------------------------------------------------------------ client
    def extra_loss(self, ctx: ClientContext, x, y, logits, features):
        model = ctx.model
        if self.hp["eta"] == 0 or self.kernel is None or not any(
                p.requires_grad for m in (model.embed, model.body) for p in m.parameters()):
            return None  # nothing to align to yet, or the head phase (the term has no gradient)
        d = cka_distance(self._representation(model, self._rad(ctx)), self.kernel)
        return self.hp["eta"] * d.to(logits.dtype)

    @torch.no_grad()
    def end_client(self, ctx: ClientContext) -> dict[str, torch.Tensor]:
        model = ctx.model
        model.eval()
        A = self._representation(model, self._rad(ctx))
        model.train()
        if self.kernel is not None:
            self._round.append(float(cka_distance(A, self.kernel)))
        return {"rad_features": A.float()}

    # ------------------------------------------------------------------ server
    def aggregate(self, global_params: Params, updates, *, n_clients: int) -> Params:
        if self._round:
            self.distance.append(float(np.mean(self._round)))
        self._round = []
        for u in updates:
            self.features[u.cid] = u.extras["rad_features"]
        K = [centred_kernel(self.features[c]) for c in sorted(self.features)]
        self.kernel = torch.stack(K).mean(0)
        return {}

    def download_bytes(self, global_params: Params) -> int:
        return 0 if self.kernel is None else nbytes(self.kernel.float())

    def run_report(self) -> dict:
        """``rad_distance``: per round from round 1, the participants' mean 1 - CKA to the global
        kernel at the end of their local training (what the term pulls down)."""
        return {"rad_distance": list(self.distance)}

    def state_dict(self) -> dict:
        cids = sorted(self.features)
        out = {"cids": torch.tensor(cids, dtype=torch.int64), "distance": torch.tensor(self.distance, dtype=torch.float64)}
        if cids:
            out["features"] = torch.stack([self.features[c] for c in cids])
            out["kernel"] = self.kernel
        return out

    def load_state_dict(self, state: dict) -> None:
        cids = state["cids"].tolist()
        self.features = {c: f for c, f in zip(cids, state["features"])} if cids else {}
        self.kernel = state["kernel"] if cids else None
        self.distance = state["distance"].tolist()
        self._round = []
