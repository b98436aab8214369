"""Geometry demo: the FedMC geometry pipeline on an S-curve embedded in D dims, one client.

Stages: FedMC's set-up recipe (``fedmc.setup``: prototypes -> GAB -> gamma -> K-Means patches,
kernel PCA of every patch in one call and betas -> fused dictionary), pre-images that recover
held-out points from their kernel values with each solver, and calibrated samples around them.
Prints what each stage cost on each backend and how well the pre-images recover the points.
"""
from __future__ import annotations

import time

import numpy as np
import torch

import geomkern as gk
from geomkern import fedmc

from ._progress import progress_bar


def s_curve(n: int, dim: int, noise: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """An S-curve (sklearn) isometrically embedded in ``dim`` dims by a random rotation.

    Returns the noisy points (n, dim) and the position along the curve (n,).
    """
    from sklearn.datasets import make_s_curve

    pts, t = make_s_curve(n, noise=0.0, random_state=seed)
    rng = np.random.default_rng(seed)
    Q, _ = np.linalg.qr(rng.standard_normal((dim, 3)))
    X = pts @ Q.T + noise * rng.standard_normal((n, dim))
    return torch.from_numpy(X), torch.from_numpy(t)


def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def run_demo(*, n: int = 6000, dim: int = 64, clusters: int = 8, components: int = 4,
             basis: int = 128, holdout: int = 500, steps: int = 100, dtype: str = "float32",
             seed: int = 0) -> list[dict]:
    torch.manual_seed(seed)
    X64, _ = s_curve(n + holdout, dim, noise=0.01, seed=seed)
    X = X64.to(getattr(torch, dtype))
    train, held = X[:n], X[n:]
    rows: list[dict] = []
    backends = [b for b in ("reference", "native") if b in gk.available_backends()]
    stages = progress_bar(total=len(backends) * 4, desc="geometry demo", unit="stage")
    clip = float(train.norm(dim=1).max())  # no DP here: clipping must not bend the curve
    for backend in backends:
        with gk.set_backend(backend):
            res, t = _timed(lambda: fedmc.setup(
                [train], generators=[torch.Generator().manual_seed(seed)], n_prototypes=basis, n_base=basis,
                n_clusters=clusters, n_components=components, n_entries=clusters, clip_norm=clip, seed=seed))
            B, gamma, lgd = res.basis, res.gamma, res.lgds[0]
            sizes = lgd.counts.round().long().tolist()
            rows.append(dict(backend=backend, stage="fedmc.setup", seconds=t,
                             detail=f"S={B.shape[0]}, gamma={gamma:.4g}, {len(sizes)} patches of "
                                    f"{min(sizes)}-{max(sizes)}, d={lgd.betas.shape[1]}, "
                                    f"{res.dictionary.betas.shape[0]} entries"))
            stages.update()
            targets = gk.rbf_gram(held, B, gamma=gamma)
            start = held + 0.3 / gamma ** 0.5 * torch.randn_like(held) / dim ** 0.5
            for method in ("gd", "fixed_point"):
                (Z, loss), t = _timed(lambda: gk.preimage(start, B, targets, gamma=gamma, method=method,
                                                          steps=steps, return_loss=True))
                err = float(((Z - held).norm(dim=1) / (start - held).norm(dim=1)).median())
                rows.append(dict(backend=backend, stage=f"preimage {method}", seconds=t,
                                 detail=f"{holdout} pts, {steps} steps, mean loss {float(loss.mean()):.2e}, "
                                        f"median error/start error {err:.3f}"))
                stages.update()
            prepared = fedmc.prepare(res.dictionary, B)
            Zc, t = _timed(lambda: fedmc.calibrate(held, prepared, generator=torch.Generator().manual_seed(seed)))
            rows.append(dict(backend=backend, stage="fedmc.calibrate", seconds=t,
                             detail=f"{holdout} pts, mean |x' - x| {float((Zc - held).norm(dim=1).mean()):.3g}"))
            stages.update()
    stages.close()
    return rows


def format_table(rows: list[dict]) -> str:
    head = f"{'backend':<10} {'stage':<20} {'seconds':>8}  detail"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['backend']:<10} {r['stage']:<20} {r['seconds']:>8.3f}  {r['detail']}")
    return "\n".join(lines)
