"""FLIC (Personalised Federated Learning On Heterogeneous Feature Spaces, TMLR 2024).

Each client i maps its own feature space (dimension D_i) into a common d-dimensional space with
a personal embedding phi_i (PersonalNet.embed, never shared); a FedRep-style model works in that
space: the representation (PersonalNet.body) is averaged over *all* clients, the heads stay
personal. What makes the common space common are class anchors on the server, one Gaussian
N(v_c, Sigma_c) per class: a client's loss adds

    lam * mean_c W2^2( N(m_c, S_c), N(v_c, Sigma_c) )

over the classes c with >= 2 samples in the batch, (m_c, S_c) the batch's class-conditional mean
and covariance of phi_i(x) (closed form, gk.gaussian_w2, batched over classes; S_c gets
``ridge`` * I because a batch holds fewer samples of a class than d, and the square root is not
differentiable at a rank-deficient matrix). After local training a client uploads, per class,
the count, mean and covariance (+ ridge * I) of phi_i over its training rows (d-dimensional: D_i never leaves
the client); the server replaces each anchor by the count-weighted W2 barycentre of the clients'
class Gaussians (gk.gaussian_barycenter), a class nobody holds keeping its anchor. Anchors start
at v_c ~ N(0, anchor_scale^2 I_d), Sigma_c = anchor_var * I_d, drawn from the run's seed.

Optional (``anchor_ce`` > 0, default 0; the official code has such a term, the issue's method
text does not): the loss also adds anchor_ce * CE of representation + head on one sample drawn
from the anchor of each row's class, so the shared representation learns the anchors' classes.

``align_epochs`` (default 300; the official code's alignment phase, not in the issue's method
text): at its first participation a client first fits phi_i to the anchors alone (W2 term only,
that many full-batch steps). The default was chosen on validation rows (studies/flic-defaults/,
docs/flic.md "FLIC's defaults"): at fedsim's run defaults it was the one FLIC setting that moved
FLIC against Local (-4.1 points without it, +20.9 with it); 0 turns it off.

Optional (``anchor_cov = "fixed"``, default "learned"): the anchors keep Sigma_c = anchor_var * I,
only their means move (the count-weighted mean of the clients' class means, which is the W2
barycentre when the covariances are fixed): the paper's anchors (presets/flic-paper.toml).

Optional (``optimizer = "adam"``, default "sgd", PersonalAlgorithm's): Adam at the run's lr for the
local steps and the alignment phase, as the paper trains every method.

Optional (``schedule = "personal-first"``, default "fedrep", PersonalAlgorithm's): the official
code's local schedule (Het_Update.py): ``local_epochs - rep_epochs`` epochs on phi_i and the head,
then ``rep_epochs`` on the representation alone, which does not train at all before round
``rep_start_round`` (0-based; the official ``start_optimize_rep = 20`` trains it from round 21).

Optional (``max_grad_norm`` > 0, default 0 = off): each local step's gradient is rescaled to at most
that norm, and the rescaled steps are counted (``clipped_steps`` in results.json): what keeps FLIC
from diverging at lr 0.2 on wordnet:mixed (docs/flic.md).

Shared: the representation weights and the anchors (C x (d + d^2) numbers). Not shared: phi_i,
the heads, the raw features and their dimension.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from torch.nn import functional as F

import geomkern as gk
from geomkern.exchange import nbytes

from ..config import Int, Real, Str
from ._registry import register
from .base import ClientContext, DivergedError, Params, make_optimizer, weighted_average
from .local import PersonalAlgorithm


@register
class FLIC(PersonalAlgorithm):
    name = "flic"
    shared_prefixes = ("body.",)
    # lam: the W2 term is a sum over d coordinates; lam = 1 made local SGD (lr 0.05, momentum 0.9)
    # diverge within round 0 on the toy problems, 0.1 and 0.01 did not (docs/flic.md)
    # max_grad_norm: 0 = off (docs/flic.md "Divergence at lr 0.2": a client whose personal head no
    # longer fits the freshly averaged representation takes a cross-entropy spike, gradient norm
    # 15-150 against < 5 elsewhere; at lr 0.2 / momentum 0.9 the step inflates phi_i, the W2 mean
    # term's curvature grows with phi_i's scale and runs away, and the anchor barycentre carries
    # that client's blown-up class statistics to everyone)
    # anchor_cov: "learned" (Sigma_c the W2 barycentre of the clients' class covariances) or
    # "fixed" (Sigma_c = anchor_var * I throughout, the barycentre then the count-weighted mean of
    # the class means: the paper's anchors, learnable means with identity covariance)
    defaults = {**PersonalAlgorithm.defaults, "lam": 0.1, "ridge": 1e-2, "anchor_scale": 1.0, "anchor_var": 0.1,
                "anchor_ce": 0.0, "align_epochs": 300, "max_grad_norm": 0.0, "anchor_cov": "learned"}
    params = {**PersonalAlgorithm.params, "lam": Real(0), "ridge": Real(), "anchor_scale": Real(),
              "anchor_var": Real(), "anchor_ce": Real(), "align_epochs": Int(), "max_grad_norm": Real(),
              "anchor_cov": Str()}

    def __init__(self, **hparams):
        super().__init__(**hparams)
        for key, lo in (("lam", 0.0), ("anchor_ce", 0.0), ("max_grad_norm", 0.0), ("ridge", None), ("anchor_scale", None),
                        ("anchor_var", None)):
            v = self.hp[key]
            ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and \
                (v >= lo if lo is not None else v > 0)
            if not ok:
                raise ValueError(f"flic: {key} must be a finite number {'>= 0' if lo is not None else '> 0'}, got {v!r}")
        self.anchor_means: torch.Tensor | None = None  # (C, d) float64
        self.anchor_covs: torch.Tensor | None = None  # (C, d, d) float64
        self.aligned: set[int] = set()  # clients whose phi_i went through the alignment phase
        self.clipped = 0  # local steps whose gradient max_grad_norm rescaled (reported, never silent)
        if self.hp["anchor_cov"] not in ("learned", "fixed"):
            raise ValueError(f"flic: anchor_cov must be 'learned' or 'fixed', got {self.hp['anchor_cov']!r} "
                             "(--set flic.anchor_cov=fixed keeps the anchors' covariance at anchor_var * I)")
        a = self.hp["align_epochs"]
        if isinstance(a, bool) or not isinstance(a, int) or a < 0:
            raise ValueError(f"flic: align_epochs must be an integer >= 0, got {a!r}")

    def setup(self, *, n_classes, embed_dim, seed, device):
        g = torch.Generator().manual_seed(int(np.random.SeedSequence([seed, 0xF11C]).generate_state(1)[0]))
        self.anchor_means = (self.hp["anchor_scale"] * torch.randn(n_classes, embed_dim, generator=g,
                                                                   dtype=torch.float64)).to(device)
        self.anchor_covs = (self.hp["anchor_var"] * torch.eye(embed_dim, dtype=torch.float64)
                            ).expand(n_classes, embed_dim, embed_dim).clone().to(device)

    # ------------------------------------------------------------------ client
    def begin_client(self, ctx: ClientContext) -> None:
        if self.hp["align_epochs"] and ctx.cid not in self.aligned:
            self._pre_align(ctx)
        if self.hp["anchor_ce"] > 0:  # one stream per (seed, round, client, phase): resume-exact
            key = np.random.SeedSequence([self.seed, ctx.round, ctx.cid, 0xF11C, ctx.steps]).generate_state(1)[0]
            ctx.scratch["anchor_gen"] = torch.Generator(device=ctx.x.device).manual_seed(int(key))
            ctx.scratch["anchor_chol"] = torch.linalg.cholesky(self.anchor_covs)

    def before_step(self, ctx: ClientContext) -> None:
        """max_grad_norm > 0: rescale the step's gradient (all trainable parameters together) to at
        most that norm, and count the step (``clipped_steps`` in results.json)."""
        m = self.hp["max_grad_norm"]
        if m > 0:
            params = [p for p in ctx.model.parameters() if p.grad is not None]
            if float(torch.nn.utils.clip_grad_norm_(params, m)) > m:
                self.clipped += 1

    def run_report(self) -> dict:
        return {"clipped_steps": self.clipped} if self.hp["max_grad_norm"] > 0 else {}

    def extra_loss(self, ctx: ClientContext, x, y, logits, features):
        terms = [t for t in (self._alignment(ctx, y, features), self._anchor_ce(ctx, y)) if t is not None]
        return sum(terms) if terms else None

    def _pre_align(self, ctx: ClientContext) -> None:
        """At a client's first participation: ``align_epochs`` full-batch SGD steps (the run's lr and
        momentum) on phi_i alone, loss = the W2 alignment term only (the official code's alignment
        phase before federated training)."""
        embed = ctx.model.embed
        flags = [p.requires_grad for p in embed.parameters()]
        for p in embed.parameters():
            p.requires_grad_(True)
        opt = make_optimizer(embed, self.hp["optimizer"], lr=ctx.lr, momentum=ctx.momentum)
        x, y = ctx.real()
        for step in range(self.hp["align_epochs"]):
            z = embed(x)
            if not bool(torch.isfinite(z).all()):
                raise DivergedError(f"flic's alignment phase (align_epochs={self.hp['align_epochs']}, the run's lr "
                                    f"{ctx.lr:g}) made client {ctx.cid}'s embedding non-finite at step {step + 1}; "
                                    f"lower --lr, or --set flic.align_epochs=0 to skip the phase")
            loss = self._alignment(ctx, y, z)
            if loss is None:
                break
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        for p, f in zip(embed.parameters(), flags):
            p.requires_grad_(f)
        self.aligned.add(ctx.cid)

    def _anchor_ce(self, ctx: ClientContext, y):
        """anchor_ce * CE of representation + head on one anchor sample z' ~ N(v_y, Sigma_y) per row."""
        if self.hp["anchor_ce"] == 0:
            return None
        eps = torch.randn(y.shape[0], self.anchor_means.shape[1], generator=ctx.scratch["anchor_gen"],
                          dtype=torch.float64, device=y.device)
        z = self.anchor_means[y] + (ctx.scratch["anchor_chol"][y] @ eps.unsqueeze(-1)).squeeze(-1)
        model = ctx.model
        logits = model.head(model.body(z.to(next(model.parameters()).dtype)))
        return self.hp["anchor_ce"] * F.cross_entropy(logits, y)

    def _alignment(self, ctx: ClientContext, y, features):
        if self.hp["lam"] == 0 or not any(p.requires_grad for p in ctx.model.embed.parameters()):
            return None  # the head phase: phi_i is frozen, the term has no gradient
        z = features.to(torch.float64)
        onehot = F.one_hot(y, ctx.n_classes).to(torch.float64).T  # (C, b)
        n = onehot.sum(1)
        keep = n >= 2
        if not bool(keep.any()):
            return None
        onehot, n = onehot[keep], n[keep]
        mean = onehot @ z / n[:, None]  # (c, d)
        zc = (z.unsqueeze(0) - mean.unsqueeze(1)) * onehot.unsqueeze(-1)  # (c, b, d), zero off-class
        eye = torch.eye(z.shape[1], dtype=z.dtype, device=z.device)
        cov = zc.mT @ zc / n[:, None, None] + self.hp["ridge"] * eye
        # the anchor first: bures' gradient is exact in its second argument (see gk.bures)
        w2 = gk.gaussian_w2(self.anchor_means[keep], self.anchor_covs[keep], mean, cov)
        return self.hp["lam"] * w2.mean().to(features.dtype)

    @torch.no_grad()
    def end_client(self, ctx: ClientContext) -> dict[str, torch.Tensor]:
        x, y = ctx.real()
        ctx.model.eval()
        z = ctx.model(x)[1].to(torch.float64)
        ctx.model.train()
        counts, means, covs = gk.class_moments(z, y, ctx.n_classes)
        if self.hp["anchor_cov"] == "fixed":  # the server only moves the means: the covariances stay here
            return {"class_counts": counts.to(torch.float64), "class_means": means.float()}
        # the loss's ridge here too: anchors (barycentres of these) then stay >= ridge * I, which
        # bounds the square root's backward (1 / (s_i + s_j)) when the anchor is the first argument
        covs = covs + self.hp["ridge"] * torch.eye(z.shape[1], dtype=covs.dtype, device=covs.device)
        return {"class_counts": counts.to(torch.float64), "class_means": means.float(), "class_covs": covs.float()}

    # ------------------------------------------------------------------ server
    def aggregate(self, global_params: Params, updates, *, n_clients: int) -> Params:
        counts = torch.stack([u.extras["class_counts"] for u in updates]).to(self.anchor_means.device)
        means = torch.stack([u.extras["class_means"] for u in updates]).to(self.anchor_means)
        held = counts.sum(0) > 0
        if self.hp["anchor_cov"] == "fixed":  # equal covariances: the W2 barycentre's mean is the weighted mean
            v = (counts[..., None] * means).sum(0) / counts.sum(0).clamp_min(1)[:, None]
            self.anchor_means = torch.where(held[:, None], v, self.anchor_means)
            return weighted_average(updates)
        covs = torch.stack([u.extras["class_covs"] for u in updates]).to(self.anchor_means)
        covs = 0.5 * (covs + covs.mT)  # float32 upload round-off
        v, S = gk.gaussian_barycenter(counts, means, covs)
        self.anchor_means = torch.where(held[:, None], v, self.anchor_means)
        self.anchor_covs = torch.where(held[:, None, None], S, self.anchor_covs)
        return weighted_average(updates)

    def download_bytes(self, global_params: Params) -> int:
        if self.hp["anchor_cov"] == "fixed":  # anchor_var * I is a setting, not sent
            return nbytes(*global_params.values()) + nbytes(self.anchor_means.float())
        return nbytes(*global_params.values()) + nbytes(self.anchor_means.float(), self.anchor_covs.float())

    def state_dict(self) -> dict:
        return {"anchor_means": self.anchor_means, "anchor_covs": self.anchor_covs,
                "aligned": torch.tensor(sorted(self.aligned), dtype=torch.int64),
                "clipped": torch.tensor(self.clipped, dtype=torch.int64)}

    def load_state_dict(self, state: dict) -> None:
        self.anchor_means, self.anchor_covs = state["anchor_means"], state["anchor_covs"]
        self.aligned = set(state["aligned"].tolist())
        self.clipped = int(state["clipped"]) if "clipped" in state else 0  # checkpoints before max_grad_norm
