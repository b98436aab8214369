"""Geometry demo: the client-side FedMC geometry pipeline on an S-curve embedded in D dims.

Stages (each one gk call over all clusters at once): K-Means patches, kernel PCA on every patch,
a shared basis by K-Means, betas by basis projection, then pre-images that recover held-out
points from their kernel values with each solver. Prints what each stage cost on each backend
and how well the pre-images recover the points.
"""
from __future__ import annotations

import time

import numpy as np
import torch
from tqdm import tqdm

import geomkern as gk


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
    stages = tqdm(total=len(backends) * 7, desc="geometry demo", unit="stage", leave=False)
    for backend in backends:
        with gk.set_backend(backend):
            gamma, t = _timed(lambda: gk.median_gamma(train))
            rows.append(dict(backend=backend, stage="median_gamma", seconds=t, detail=f"gamma={gamma:.4g}"))
            stages.update()
            (labels, _), t = _timed(lambda: gk.kmeans(train, clusters, seed=seed))
            order = torch.argsort(labels, stable=True)
            Xs = train[order]
            offsets = torch.zeros(clusters + 1, dtype=torch.int64)
            offsets[1:] = torch.cumsum(torch.bincount(labels, minlength=clusters), 0)
            sizes = (offsets[1:] - offsets[:-1]).tolist()
            rows.append(dict(backend=backend, stage="kmeans patches", seconds=t,
                             detail=f"{clusters} patches, sizes {min(sizes)}-{max(sizes)}"))
            stages.update()
            fit, t = _timed(lambda: gk.kpca(Xs, offsets, n_components=components, gamma=gamma))
            # Total feature-space variance of a patch is tr(H K H)/n = 1 - mean(K).
            total = torch.stack([1.0 - gk.rbf_gram(Xs[offsets[j]:offsets[j + 1]], gamma=gamma).mean()
                                 for j in range(clusters)])
            share = (fit.variances.sum(1) / total).mean()
            rows.append(dict(backend=backend, stage="kpca (all patches)", seconds=t,
                             detail=f"top-{components} variance share {float(share):.2f}"))
            stages.update()
            (_, B), t = _timed(lambda: gk.kmeans(train, basis, seed=seed + 1, iters=20))
            rows.append(dict(backend=backend, stage="basis (kmeans)", seconds=t, detail=f"S={basis}"))
            stages.update()
            betas, t = _timed(lambda: gk.project_onto_basis(Xs, fit, B, gamma=gamma))
            rows.append(dict(backend=backend, stage="project_onto_basis", seconds=t,
                             detail=f"betas {tuple(betas.shape)}"))
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
    stages.close()
    return rows


def format_table(rows: list[dict]) -> str:
    head = f"{'backend':<10} {'stage':<20} {'seconds':>8}  detail"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['backend']:<10} {r['stage']:<20} {r['seconds']:>8.3f}  {r['detail']}")
    return "\n".join(lines)
