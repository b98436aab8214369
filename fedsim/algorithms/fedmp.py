"""FedMP (Zhou et al. 2025): stochastic feature-manifold completion (SFMC) and class-prototype
guided manifold alignment (cPGMA), on a model that is a trunk f and a classifier g.

The model must split into ``trunk`` and ``classify`` (``MLPHead``: f = fc1 + ReLU, g = fc2); the
features the loop hands to ``extra_loss`` are f's outputs.

SFMC. At the end of its local update a client uploads f(x) of its real samples (and their labels)
under its final local trunk -- the paper uploads the embeddings of the last local epoch; here they
are computed once after it, so they are deterministic and all from one trunk. The server keeps the
latest upload of every client as the feature bank. At the start of round r it sends client k
``bank_size`` rows drawn uniformly from the bank (never k's own rows with ``bank_exclude_own``),
drawn from the run's seed derivation at (seed, r, k). During local training every step adds, beside
the loop's cross-entropy on the own batch, a cross-entropy of g on a chunk of the received rows
(ceil(received / batches-per-epoch) rows, so one epoch covers the received set about once): g is
trained on own and received features mixed, f only on the client's own data. The number of
optimiser steps does not change (the loop's batches are the client's own): FedAvg at the same
epochs is the matched-steps control.

cPGMA. Per class a client keeps an EMA prototype of its trunk features, p_k <- m_l p_k +
(1 - m_l) mean_k (Eq. 6), the server an EMA of their count-weighted mean, P <- m_g P + (1 - m_g)
sum_k n_k p_k / sum_k n_k (Eq. 7) (``geomkern.fedmp``). The alignment loss (Eq. 8) is the batch
mean of |f(x_i) - P_{y_i}|^2 over the samples whose class has a global prototype (0 for the others).

Weighting (the role of the paper's Eq. 1, whose exact form is not available here). With
``weighting="adaptive"`` the local loss is CE + sum_k lam_k w_k L_k with w_k = min(max_weight,
sg(CE) / (sg(L_k) + 1e-8)), sg = stop-gradient: every auxiliary term enters at the magnitude of the
cross-entropy whatever its units (the alignment loss is a squared distance in trunk units, which
drift as the trunk trains), and no gradient flows through the weights. ``max_weight`` bounds the
weight as L_k -> 0 (embeddings already on their prototypes), where sg(CE)/sg(L) would make the
pull grow like 1/distance. ``weighting="fixed"``: CE + sum_k lam_k L_k.

Bytes. Up: the model, f(x) (n_k, F) and labels (n_k,) for SFMC, the local prototypes (C, F) and
counts (C,) for cPGMA. Down: the model, the received rows and their labels, the global prototypes
of the classes that have one. The embeddings dominate: they are private data's features, sent in
the clear (no DP).

Few-shot schedule (``stage_rounds`` = S > 1; the paper's optional schedule: a stage of local
training, one exchange of models, embeddings and prototypes, a second stage, the exchange
repeating). Rounds form stages of S rounds. Inside a stage a client continues from its own
weights of its previous round in the stage (``begin_client`` loads them; they never leave the
client), keeps the bank sample and prototypes it received at the stage's start (the sample is
drawn at (seed, first round of the stage, client)), and sends nothing: upload and download bytes
are 0, the server's model, bank and prototypes do not change, and the round's reported accuracy
is the last exchanged model's. The last round of a stage is the exchange: the clients upload
weights, features and prototypes as in every round of the default schedule, the server averages
and refreshes the bank and prototypes, and the next stage starts from them. Stage 1 has no bank
and no prototypes yet: it is plain local training. ``--rounds 2S`` is stage, exchange, stage,
exchange (the final model is the second exchange's average). The local optimiser (its momentum
buffer) restarts every round, inside a stage too. ``stage_rounds = 1`` is the default schedule.

Registered as ``fedmp`` (both modules) and the ablations ``fedmp_sfmc`` and ``fedmp_cpgma``.
"""
from __future__ import annotations

import math

import torch
from torch.nn import functional as F

from geomkern import fedmp as gfedmp
from geomkern.exchange import nbytes

from .._seeds import generator
from ..config import Bool, Int, Real, Str
from ..models import has_trunk
from ._registry import register
from .base import Algorithm, ClientContext, ClientUpdate, Params, params_of, weighted_average
from .common import check_slots, put, put_clients, take, take_clients

# Purposes in the run's seed derivation (fedsim/_seeds.py keeps 1-3 for the loop's own streams).
BANK_SAMPLE = 11  # which bank rows the server sends client k in round r
BANK_CHUNKS = 12  # which received rows each local step of client k in round r uses

WEIGHTINGS = ("adaptive", "fixed")
_EPS = 1e-8


def adaptive_weights(ce: torch.Tensor, terms: list[torch.Tensor], *, max_weight: float) -> list[torch.Tensor]:
    """w_k = min(max_weight, sg(ce) / (sg(L_k) + 1e-8)) for each auxiliary loss L_k: detached
    scalars, so the weighted sum's gradient is sum_k w_k grad L_k (no gradient through w_k)."""
    ref = ce.detach()
    return [torch.clamp(ref / (t.detach() + _EPS), max=max_weight) for t in terms]


def alignment_loss(features: torch.Tensor, y: torch.Tensor, prototypes: torch.Tensor,
                   has: torch.Tensor) -> torch.Tensor | None:
    """Eq. 8: sum over the batch samples whose class has a prototype of |f_i - P_{y_i}|^2, divided
    by the batch size. None when no sample's class has one."""
    sel = has[y]
    if not bool(sel.any()):
        return None
    diff = features[sel] - prototypes[y[sel]]
    return (diff * diff).sum() / features.shape[0]


def _check(name: str, ok: bool, why: str, value) -> None:
    if not ok:
        raise ValueError(f"fedmp: hyper-parameter {name} {why}, got {value!r}")


@register
class FedMP(Algorithm):
    name = "fedmp"
    # The paper gives none of these values for embeddings. lam_sfmc, lam_align and bank_size were
    # chosen on seeds 10-11 (not the reported 0-2) of both benchmark settings (docs/fedmp.md):
    # lam_align 1 collapses the trunk to chance, lam_sfmc 1 or bank_size 128 lose 4-7 points under
    # label skew. The momenta: 0, 0.5 and 0.9 each (the other at 0.5) measured on seeds 10-11 in both
    # settings, none better than the default by more than the seed spread (docs/fedmp.md); 0.5 kept.
    # max_weight was not tuned.
    defaults = {"sfmc": True, "cpgma": True, "bank_size": 512, "bank_exclude_own": True,
                "local_momentum": 0.5, "global_momentum": 0.5, "weighting": "adaptive",
                "lam_sfmc": 0.3, "lam_align": 0.1, "max_weight": 10.0, "stage_rounds": 1}
    # kinds only: the ranges (momenta in [0, 1), bank_size >= 1, ...) are checked by __init__
    params = {"sfmc": Bool(), "cpgma": Bool(), "bank_size": Int(), "bank_exclude_own": Bool(), "local_momentum": Real(),
              "global_momentum": Real(), "weighting": Str(), "lam_sfmc": Real(), "lam_align": Real(),
              "max_weight": Real(), "stage_rounds": Int()}
    needs_trunk = True  # RunConfig.validate rejects a model without trunk/classify
    seed = 0  # the run's seed; the runner sets it (bank samples come from (seed, round, client))

    def __init__(self, **hparams):
        super().__init__(**hparams)
        hp = self.hp
        for k in ("sfmc", "cpgma", "bank_exclude_own"):
            _check(k, isinstance(hp[k], bool), "must be true or false", hp[k])
        _check("sfmc/cpgma", hp["sfmc"] or hp["cpgma"], "must enable at least one module",
               (hp["sfmc"], hp["cpgma"]))
        b = hp["bank_size"]
        _check("bank_size", isinstance(b, int) and not isinstance(b, bool) and b >= 1,
               "must be an integer >= 1 (bank rows sent to a client per round)", b)
        s = hp["stage_rounds"]
        _check("stage_rounds", isinstance(s, int) and not isinstance(s, bool) and s >= 1,
               "must be an integer >= 1 (rounds per local stage; 1 = exchange every round)", s)
        for k in ("local_momentum", "global_momentum"):
            v = hp[k]
            _check(k, isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and 0 <= v < 1,
                   "must lie in [0, 1)", v)
        _check("weighting", hp["weighting"] in WEIGHTINGS, f"must be one of {WEIGHTINGS}", hp["weighting"])
        for k in ("lam_sfmc", "lam_align", "max_weight"):
            v = hp[k]
            _check(k, isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0,
                   "must be a finite number >= 0", v)
        self.bank: dict[int, Params] = {}  # client -> {"x": (n_k, F) trunk features, "y": (n_k,)}
        self.local: dict[int, Params] = {}  # client -> {"proto": (C, F), "has": (C,) bool}
        self.protos: torch.Tensor | None = None  # (C, F) global prototypes
        self.has: torch.Tensor | None = None  # (C,) bool: classes with a global prototype
        # per client trained this round, in training order: (starts from the server's model, extra bytes
        # sent to it); download_bytes reads them first-in first-out, as the loop asks after each client
        # or after all of them (the loop calls it once per update, in the clients' order)
        self._sent: list[tuple[bool, int]] = []
        self.stage: dict[int, Params] = {}  # few-shot schedule: each client's own weights inside a stage
        self._round = 0  # the round being trained

    @classmethod
    def controls(cls, hp: dict) -> list[dict]:
        """The matched-steps control (the bank and prototypes add no optimiser step): FedAvg under the
        same schedule, i.e. FedAvg itself at stage_rounds 1, else fedmp_cpgma with its only term at
        weight 0 and the same stage_rounds (it trains exactly as FedAvg would under the stages:
        studies/fedmp/schedule_*.toml). That control itself has none."""
        if (not hp["sfmc"] or hp["lam_sfmc"] == 0) and (not hp["cpgma"] or hp["lam_align"] == 0):
            return []
        staged = {"algorithm": "fedmp_cpgma",
                  "algorithm_params": {"lam_align": 0.0, "stage_rounds": hp["stage_rounds"]}}
        return ([{"algorithm": "fedavg", "algorithm_params": {}}] if hp["stage_rounds"] == 1 else []) + [staged]

    def _exchanges(self, r: int) -> bool:
        """Whether round r ends with an exchange (every round unless the few-shot schedule is on)."""
        return (r + 1) % self.hp["stage_rounds"] == 0

    # ------------------------------------------------------------------ client hooks
    def begin_client(self, ctx: ClientContext) -> None:
        if not has_trunk(ctx.model):
            raise TypeError(f"fedmp needs a model with a trunk and a classifier (trunk/classify), got "
                            f"{type(ctx.model).__name__}; use --model mlp")
        self._round = ctx.round
        own = self.stage.get(ctx.cid)
        fresh, down = own is None, 0
        if own is not None:  # few-shot schedule: the client continues its stage from its own weights
            ctx.model.load_state_dict(own)
        first = ctx.round - ctx.round % self.hp["stage_rounds"]  # the stage's first round (r when S = 1)
        if self.hp["sfmc"] and self.bank:
            cids = sorted(self.bank)
            xs = torch.cat([self.bank[c]["x"] for c in cids])
            ys = torch.cat([self.bank[c]["y"] for c in cids])
            owners = torch.cat([torch.full((self.bank[c]["y"].numel(),), c, dtype=torch.int64) for c in cids])
            rows = gfedmp.sample_bank(owners, self.hp["bank_size"], client=ctx.cid,
                                      exclude_own=self.hp["bank_exclude_own"],
                                      generator=generator(self.seed, first, ctx.cid, BANK_SAMPLE))
            if rows.numel():
                rx, ry = xs[rows.to(xs.device)], ys[rows.to(ys.device)]
                ctx.scratch["recv"] = (rx.to(ctx.x.device), ry.to(ctx.x.device))
                ctx.scratch["chunks"] = generator(self.seed, ctx.round, ctx.cid, BANK_CHUNKS)
                if fresh:  # sent once per stage
                    down += nbytes(rx, ry)
        if self.hp["cpgma"] and self.protos is not None and fresh:
            down += nbytes(self.protos[self.has])
        self._sent.append((fresh, down))

    def extra_loss(self, ctx: ClientContext, x, y, logits, features) -> torch.Tensor | None:
        terms, lams = [], []
        recv = ctx.scratch.get("recv")
        if recv is not None:
            rx, ry = recv
            # The loop's first batch is a full one: it fixes the batches per epoch.
            per_epoch = math.ceil(ctx.x.shape[0] / ctx.scratch.setdefault("batch", x.shape[0]))
            chunk = math.ceil(rx.shape[0] / per_epoch)
            idx = torch.randperm(rx.shape[0], generator=ctx.scratch["chunks"])[:chunk].to(rx.device)
            terms.append(F.cross_entropy(ctx.model.classify(rx[idx]), ry[idx]))
            lams.append(self.hp["lam_sfmc"])
        if self.hp["cpgma"] and self.protos is not None:
            align = alignment_loss(features, y, self.protos.to(features.dtype), self.has)
            if align is not None:
                terms.append(align)
                lams.append(self.hp["lam_align"])
        if not terms:
            return None
        if self.hp["weighting"] == "adaptive":
            ws = adaptive_weights(F.cross_entropy(logits.detach(), y), terms, max_weight=self.hp["max_weight"])
        else:
            ws = [1.0] * len(terms)
        return sum(lam * w * t for lam, w, t in zip(lams, ws, terms))

    def end_client(self, ctx: ClientContext) -> dict[str, torch.Tensor]:
        if not self._exchanges(ctx.round):  # inside a stage: the weights stay on the client
            self.stage[ctx.cid] = params_of(ctx.model)
            return {}
        model = ctx.model
        was_training = model.training
        model.eval()
        x, y = ctx.real()  # the bank and the prototypes hold real rows only, whatever trained
        with torch.no_grad():
            h = model.trunk(x)
        model.train(was_training)
        out: dict[str, torch.Tensor] = {}
        if self.hp["sfmc"]:
            out["bank_x"], out["bank_y"] = h, y.clone()
        if self.hp["cpgma"]:
            counts, means = gfedmp.class_prototypes(h, y, ctx.n_classes)
            prev = self.local.get(ctx.cid)
            p_old, has_old = (prev["proto"], prev["has"]) if prev else (None, None)
            proto, has = gfedmp.ema_prototypes(p_old, has_old, means, counts > 0, momentum=self.hp["local_momentum"])
            self.local[ctx.cid] = {"proto": proto, "has": has}  # the client's own state (Eq. 6)
            out["proto"], out["proto_count"] = proto, counts
        return out

    # ------------------------------------------------------------------ server hooks
    def aggregate(self, global_params: Params, updates, *, n_clients: int) -> Params:
        self._sent.clear()  # the loop has read the round's download bytes by now
        if not self._exchanges(self._round):  # inside a stage nothing reaches the server
            return global_params
        self.stage.clear()  # the next stage starts from the exchanged model
        if self.hp["sfmc"]:
            for u in updates:  # a client's latest features replace its older ones
                self.bank[u.cid] = {"x": u.extras["bank_x"].clone(), "y": u.extras["bank_y"].clone()}
        if self.hp["cpgma"]:
            local = torch.stack([u.extras["proto"] for u in updates])
            counts = torch.stack([u.extras["proto_count"] for u in updates])
            self.protos, self.has = gfedmp.global_prototypes(self.protos, self.has, local, counts,
                                                             momentum=self.hp["global_momentum"])
        return weighted_average(updates)

    def upload_bytes(self, update: ClientUpdate) -> int:
        return update.upload_bytes() if self._exchanges(self._round) else 0

    def download_bytes(self, global_params: Params) -> int:
        fresh, extra = self._sent.pop(0) if self._sent else (True, 0)
        return (super().download_bytes(global_params) if fresh else 0) + extra

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        out: dict = {}
        put_clients(out, "bank", self.bank)
        put_clients(out, "local", self.local)
        put_clients(out, "stage", self.stage)
        if self.protos is not None:
            put(out, "global", {"proto": self.protos, "has": self.has})
        return out

    def load_state_dict(self, state: dict) -> None:
        check_slots(state, ("bank", "local", "global", "stage"), self.name)
        self.bank = take_clients(state, "bank")
        self.local = take_clients(state, "local")
        self.stage = take_clients(state, "stage")
        g = take(state, "global")
        self.protos, self.has = (g["proto"], g["has"]) if g else (None, None)


@register
class FedMPSFMC(FedMP):
    """Ablation: SFMC only (no prototypes, no alignment loss)."""

    name = "fedmp_sfmc"
    defaults = {**FedMP.defaults, "cpgma": False}


@register
class FedMPCPGMA(FedMP):
    """Ablation: cPGMA only (no feature bank)."""

    name = "fedmp_cpgma"
    defaults = {**FedMP.defaults, "sfmc": False}
