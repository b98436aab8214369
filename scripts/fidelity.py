"""Manifold fidelity: do calibrated samples stay on the data manifold?

An S-curve and a Swiss roll (scikit-learn's parametrisations) are embedded isometrically in D
dims (a random orthonormal Q: (D, 3)) with small isotropic noise and split across clients by
position along the curve (each client holds one stretch: heterogeneous). Every method generates
one sample per training point; the perturbation scale of each method is tuned so that the mean
displacement |x' - x| equals one target (matched displacement), and we report

    ratio = mean distance of the samples to the noise-free manifold / mean displacement

(lower is better; a sample moved purely along the manifold scores ~0 beyond the data's own noise).
Distance to the manifold = sqrt(|z - Q Q^T z|^2 + dist_3D(Q^T z, M)^2), with dist_3D from a KD-tree
on a fine grid of the noise-free surface.

Methods: GGEUR (global covariance eigenbasis), local PCA (per-patch linear PCA, the obvious
baseline), FedMC with each pre-image solver and formulation: "consistent" (the default), "paper"
(Eq. 10-13 literally: the target is built from the perturbed kernel-PC coordinates alone, solved
by gd from x as Eq. 14, not anchored) and "hybrid" (the paper's perturbation added to k(x, B)).

Run: python scripts/fidelity.py [--size full|small|tiny] [--out FILE] [--plot DIR]
(--plot: one PNG per manifold, the clean manifold and every method's samples in 3-D, the ratio in
each panel's title: DIR/fidelity-scurve.png, DIR/fidelity-swissroll.png)
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass

import numpy as np
import torch
from scipy.spatial import cKDTree

import geomkern as gk
from geomkern import fedmc, ggeur


# ------------------------------------------------------------------------------------ manifolds
def _surface(name: str, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """scikit-learn's S-curve / Swiss roll as functions of (u, v) in [0, 1]^2."""
    if name == "s_curve":
        t = 3 * np.pi * (u - 0.5)
        return np.stack([np.sin(t), 2.0 * v, np.sign(t) * (np.cos(t) - 1)], axis=-1)
    if name == "swiss_roll":
        t = 1.5 * np.pi * (1 + 2 * u)
        return np.stack([t * np.cos(t), 21.0 * v, t * np.sin(t)], axis=-1)
    raise ValueError(f"unknown manifold {name!r}")


@dataclass
class Manifold:
    name: str
    X: np.ndarray  # (n, D) noisy embedded points
    u: np.ndarray  # (n,) position along the curve
    Q: np.ndarray  # (D, 3)
    tree: cKDTree  # on a fine grid of the noise-free 3-D surface

    def distance(self, Z: np.ndarray) -> np.ndarray:
        inside = Z @ self.Q  # (b, 3)
        perp = Z - inside @ self.Q.T
        d3, _ = self.tree.query(inside)
        return np.sqrt((perp ** 2).sum(1) + d3 ** 2)


def make_manifold(name: str, n: int, dim: int, noise: float, seed: int, grid: int = 1200) -> Manifold:
    rng = np.random.default_rng(seed)
    u, v = rng.random(n), rng.random(n)
    P = _surface(name, u, v)
    scale = np.sqrt(((P - P.mean(0)) ** 2).sum(1).mean())  # RMS radius: noise is relative to it
    Q = np.linalg.qr(rng.standard_normal((dim, 3)))[0]
    X = P @ Q.T + noise * scale / np.sqrt(dim) * rng.standard_normal((n, dim))
    gu, gv = np.meshgrid(np.linspace(0, 1, grid), np.linspace(0, 1, grid // 4), indexing="ij")
    tree = cKDTree(_surface(name, gu.ravel(), gv.ravel()))
    return Manifold(name, X, u, Q, tree)


# ------------------------------------------------------------------------------------- methods
def _match(sample, target: float, lo: float = 0.0, hi: float = 4.0, tol: float = 0.02, iters: int = 30):
    """Bisection on the scale s so the mean displacement of sample(s) is within tol of target."""
    Z, disp = sample(hi)
    while disp < target and hi < 1e3:
        lo, hi = hi, hi * 4
        Z, disp = sample(hi)
    if disp < target:
        return Z, disp, hi  # cannot reach it: report at the largest scale tried
    best = (Z, disp, hi)
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        Z, disp = sample(mid)
        best = min(best, (Z, disp, mid), key=lambda b: abs(b[1] - target))
        if abs(disp - target) <= tol * target:
            return Z, disp, mid
        lo, hi = (mid, hi) if disp < target else (lo, mid)
    return best


def _linear_match(X, delta, target):
    """Methods whose displacement is linear in the scale: rescale exactly."""
    s = target / np.linalg.norm(delta, axis=1).mean()
    return X + s * delta


def ggeur_samples(clients, target, seed):
    stats = [ggeur.local_statistics(torch.from_numpy(C), torch.zeros(len(C), dtype=torch.int64), 1)
             for C in clients]
    geom = ggeur.aggregate(stats)
    X = np.concatenate(clients)
    gen = torch.Generator().manual_seed(seed)
    new, _ = ggeur.augment(torch.from_numpy(X), torch.zeros(len(X), dtype=torch.int64), geom,
                           n_per_sample=1, generator=gen)
    return _linear_match(X, new.numpy() - X, target)


def local_pca_samples(clients, target, seed, n_clusters, d):
    rng = np.random.default_rng(seed)
    deltas = []
    for C in clients:
        Ct = torch.from_numpy(C)
        labels, _ = gk.kmeans(Ct, n_clusters, seed=seed)
        labels = labels.numpy()
        delta = np.zeros_like(C)
        for j in range(n_clusters):
            P = C[labels == j]
            if len(P) < 2:
                continue
            w, V = np.linalg.eigh(np.cov(P.T, bias=True))
            w, V = w[::-1][:d].clip(min=0), V[:, ::-1][:, :d]
            delta[labels == j] = (rng.standard_normal((len(P), d)) * np.sqrt(w)) @ V.T
        deltas.append(delta)
    return _linear_match(np.concatenate(clients), np.concatenate(deltas), target)


def fedmc_setup(clients, *, n_clusters, d, n_base, n_entries, gamma, seed):
    """FedMC's set-up recipe (fedmc.setup) at epsilon = inf (plain K-Means, no clipping); enough
    prototypes per client for the server's K-Means into n_base."""
    res = fedmc.setup([torch.from_numpy(C) for C in clients],
                      generators=[torch.Generator().manual_seed(seed + i) for i in range(len(clients))],
                      n_prototypes=-(-2 * n_base // len(clients)), n_base=n_base, n_clusters=n_clusters,
                      n_components=d, n_entries=n_entries, gamma=gamma, epsilon=math.inf, seed=seed)
    return res.basis, res.dictionary


def fedmc_samples(clients, target, seed, B, dictionary, *, formulation, method, steps=None, anchored=False):
    X = torch.from_numpy(np.concatenate(clients))
    prepared = fedmc.prepare(dictionary, B)  # once for the whole bisection

    def sample(scale):
        Z = fedmc.calibrate(X, prepared, formulation=formulation, method=method, scale=scale,
                            steps=steps, anchored=anchored, generator=torch.Generator().manual_seed(seed))
        return Z.numpy(), float((Z - X).norm(dim=1).mean())

    Z, disp, scale = _match(sample, target)
    return Z, scale


# ------------------------------------------------------------------------------------- driver
SIZES = {
    "tiny": dict(n=400, dims=(8,), clients=3, n_clusters=3, d=2, n_base=24, n_entries=6, grid=200),  # tests of the driver
    "small": dict(n=1200, dims=(16,), clients=5, n_clusters=4, d=2, n_base=48, n_entries=12, grid=600),
    "full": dict(n=5000, dims=(16, 64), clients=5, n_clusters=6, d=2, n_base=256, n_entries=20, grid=1500),
}

FEDMC_VARIANTS = (  # label, formulation, method, anchored
    ("fedmc consistent/coordinates", "consistent", "coordinates", False),
    ("fedmc consistent/gd", "consistent", "gd", False),
    ("fedmc consistent/fixed_point", "consistent", "fixed_point", False),
    ("fedmc default (fixed_point, anchored)", "consistent", "fixed_point", True),
    ("fedmc hybrid/gd", "hybrid", "gd", False),
    ("fedmc paper/gd", "paper", "gd", False),
    ("fedmc paper/gd, anchored", "paper", "gd", True),
)
# the rows a --plot figure shows, each in its own panel (with the clean manifold first)
PLOTTED = ("ggeur", "local pca", "fedmc default (fixed_point, anchored)", "fedmc hybrid/gd", "fedmc paper/gd")


def split_problem(name: str, dim: int, cfg: dict, seed: int, noise: float, displacement: float):
    """The manifold, its points split over cfg["clients"] clients by position along the curve,
    all points in client order, and the target mean displacement (a fraction of the RMS radius)."""
    M = make_manifold(name, cfg["n"], dim, noise, seed, grid=cfg["grid"])
    order = np.argsort(M.u)
    clients = [M.X[idx] for idx in np.array_split(order, cfg["clients"])]
    X = np.concatenate(clients)
    radius = np.sqrt(((X - X.mean(0)) ** 2).sum(1).mean())
    return M, clients, X, displacement * radius


def run(size: str = "full", *, seed: int = 0, gamma="median", noise: float = 0.01,
        displacement: float = 0.1, manifolds=("s_curve", "swiss_roll"), variants=FEDMC_VARIANTS,
        progress: bool = True, plot_dir=None) -> list[dict]:
    """One row per (manifold, D, method). ``displacement`` is the target mean |x' - x| as a
    fraction of the manifold's RMS radius. ``plot_dir``: also write one PNG per manifold (its
    smallest D) there (:func:`plot_manifold`); returns the rows either way."""
    cfg = SIZES[size]
    rows = []
    for name in manifolds:
        for dim in cfg["dims"]:
            M, clients, X, target = split_problem(name, dim, cfg, seed, noise, displacement)
            base = float(M.distance(X).mean())
            samples = {}  # method -> (Z, ratio), for the figure

            def add(method, Z, seconds, **extra):
                disp = float(np.linalg.norm(Z - X, axis=1).mean())
                dist = float(M.distance(Z).mean())
                samples[method] = (Z, dist / disp)
                rows.append(dict(manifold=name, D=dim, method=method, ratio=dist / disp,
                                 mean_distance=dist, mean_displacement=disp, target_displacement=target,
                                 data_distance=base, seconds=seconds, **extra))
                if progress:
                    print(f"  {name:<10} D={dim:<3} {method:<30} ratio {dist / disp:.3f} "
                          f"(disp {disp:.3f}, target {target:.3f}) {seconds:.1f}s", file=sys.stderr)

            t0 = time.perf_counter()
            add("ggeur", ggeur_samples(clients, target, seed), time.perf_counter() - t0)
            t0 = time.perf_counter()
            add("local pca", local_pca_samples(clients, target, seed, cfg["n_clusters"], cfg["d"]),
                time.perf_counter() - t0)
            t0 = time.perf_counter()
            B, dictionary = fedmc_setup(clients, n_clusters=cfg["n_clusters"], d=cfg["d"],
                                        n_base=cfg["n_base"], n_entries=cfg["n_entries"], gamma=gamma,
                                        seed=seed)
            setup = time.perf_counter() - t0
            for label, formulation, method, anchored in variants:
                t0 = time.perf_counter()
                Z, scale = fedmc_samples(clients, target, seed, B, dictionary, formulation=formulation,
                                         method=method, anchored=anchored)
                add(label, Z, time.perf_counter() - t0 + setup, scale=scale, gamma=dictionary.gamma)
            if plot_dir is not None and dim == cfg["dims"][0]:
                path = plot_manifold(M, X, samples, plot_dir, dim=dim, seed=seed)
                if progress:
                    print(f"  wrote {path}", file=sys.stderr)
    return rows


FIGURE_NAMES = {"s_curve": "fidelity-scurve.png", "swiss_roll": "fidelity-swissroll.png"}


def plot_manifold(M: Manifold, X: np.ndarray, samples: dict, out_dir, *, dim: int, seed: int = 0,
                  n_points: int = 1500):
    """One PNG for manifold M: the clean (noise-free) manifold, then each method's samples in its
    own panel (the methods of PLOTTED first), seen along the surface's straight axis (v): the
    D-dim samples are mapped to M's 3-D coordinates (Q^T z) and drawn in the (x, z) plane, where
    the manifold is the curve drawn in every panel and a sample off it is off the manifold (only
    the out-of-plane part |z - Q Q^T z| is not visible). Points are coloured by the position along
    the curve of the point each sample came from; each title gives the fidelity ratio and the mean
    displacement (the same for every method where the scale could match it). Returns the path (``out_dir``/FIGURE_NAMES[M.name])."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from pathlib import Path

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    pick = np.random.default_rng(seed).choice(len(X), min(n_points, len(X)), replace=False)
    colour = np.sort(M.u)[pick]  # X is in client order = sorted by u (split_problem)
    t = np.linspace(0, 1, 400)
    curve = _surface(M.name, t, np.zeros_like(t))[:, [0, 2]]
    methods = [m for m in PLOTTED if m in samples] + [m for m in samples if m not in PLOTTED]
    uc, vc = np.random.default_rng(seed).random((2, len(pick)))
    panels = [("clean manifold", _surface(M.name, uc, vc)[:, [0, 2]], uc, "")]
    for m in methods:
        Z, ratio = samples[m]
        disp = float(np.linalg.norm(Z - X, axis=1).mean())
        P = (Z[pick] @ M.Q)[:, [0, 2]]
        panels.append((m, P, colour, f"ratio {ratio:.3f}, displacement {disp:.3g}"))
    cols = min(5, len(panels))
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.3 * cols, 3.2 * rows), squeeze=False)
    lo, hi = curve.min(0), curve.max(0)
    pad = 0.2 * (hi - lo)
    for ax, (title, P, c, sub) in zip(axes.ravel(), panels):
        ax.plot(curve[:, 0], curve[:, 1], color="0.6", lw=0.8, zorder=1)
        ax.scatter(P[:, 0], P[:, 1], c=c, cmap="viridis", s=3, linewidths=0, zorder=2)
        outside = int((((P < lo - pad) | (P > hi + pad)).any(1)).sum())
        note = f"\n{outside} of {len(P)} outside the frame" if outside else ""
        ax.set_title(f"{title}\n{sub}{note}" if sub else title, fontsize=8)
        ax.set_xlim(lo[0] - pad[0], hi[0] + pad[0])
        ax.set_ylim(lo[1] - pad[1], hi[1] + pad[1])
        ax.set_aspect("equal")
        ax.tick_params(labelsize=6)
    for ax in axes.ravel()[len(panels):]:
        ax.axis("off")
    fig.suptitle(f"{M.name.replace('_', ' ')}, D = {dim}, seen along its straight axis: samples at matched mean "
                 "displacement (ratio = distance to the manifold / displacement, lower is better)", fontsize=9)
    fig.tight_layout()
    path = out / FIGURE_NAMES[M.name]
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def format_rows(rows: list[dict]) -> str:
    lines = [f"{'manifold':<11} {'D':>3}  {'method':<38} {'ratio':>7} {'vs ggeur':>9} {'disp':>7} {'target':>7}"]
    ggeur_ratio = {(r["manifold"], r["D"]): r["ratio"] for r in rows if r["method"] == "ggeur"}
    for r in rows:
        rel = r["ratio"] / ggeur_ratio[(r["manifold"], r["D"])]
        lines.append(f"{r['manifold']:<11} {r['D']:>3}  {r['method']:<38} {r['ratio']:>7.3f} {rel:>8.2f}x "
                     f"{r['mean_displacement']:>7.3f} {r['target_displacement']:>7.3f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", choices=tuple(SIZES), default="full")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--gamma", default="median", help='"median", "1/D" or a number')
    p.add_argument("--displacement", type=float, default=0.1)
    p.add_argument("--out", default="")
    p.add_argument("--plot", default=None, metavar="DIR",
                   help="write one PNG per manifold (clean manifold + each method's samples) into DIR")
    a = p.parse_args(argv)
    gamma = a.gamma if a.gamma in ("median", "1/D") else float(a.gamma)
    rows = run(a.size, seed=a.seed, gamma=gamma, displacement=a.displacement, plot_dir=a.plot)
    print(format_rows(rows))
    if a.out:
        from pathlib import Path

        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        with open(a.out, "w") as f:
            json.dump(rows, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
