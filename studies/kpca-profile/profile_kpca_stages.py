"""KPCA + projection at the benchmark's size, timed stage by stage (issue 20, docs/history.md §15e).

The same work as ``gk.kpca(X, off, n_components=8, gamma=g)`` + ``gk.project_onto_basis`` on the
client-pipeline clusters (3 clusters of 1,650-1,750, D 512, d 8, S 512, float32), cut into its
stages with a perf_counter around each (no profiler overhead): the Gram's GEMM, its elementwise
passes and exp, centring, the copy into the padded bucket, the eigen-solve (which solver auto
picks, how many Krylov passes, the time in the passes' GEMMs vs the rest), normalisation, the
projection, the fingerprints. Next to it, in the same process and interleaved, the benchmark's
floor (three ``gk.rbf_gram``) and the whole pipeline through the public calls.

Run: .venv/bin/python studies/kpca-profile/profile_kpca_stages.py --threads 1 --runs 5 [--path before]
(busy machine: read the ratios; the minimum over runs is the least disturbed)
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))  # the suites' workloads
import geomkern as gk  # noqa: E402
from geomkern.ops import kpca as K  # noqa: E402
from geomkern.ops.rbf import double_center_  # noqa: E402
from test_client_pipeline import N_COMPONENTS, make_data  # noqa: E402


class Clock:
    def __init__(self):
        self.t = defaultdict(float)
        self.last = time.perf_counter()

    def lap(self, stage: str):
        now = time.perf_counter()
        self.t[stage] += now - self.last
        self.last = now


def staged(X, off_t, B, g, d, clock: Clock, info: dict, new: bool):
    """The auto path, stage by stage: ``new`` the code of geomkern/ops/kpca.py now, else the one
    before §15e's changes (full GEMM, symmetrise, centre, copy into the bucket)."""
    K.fingerprint(X)
    clock.lap("fingerprint x2 (fit + check)")
    off = off_t.tolist()
    m = len(off) - 1
    sizes = [off[j + 1] - off[j] for j in range(m)]
    info["kpca op backend"] = gk._dispatch.resolve("kpca", "cpu")
    clock.lap("setup")
    for bucket in K.buckets(sizes, K.CPU_BUCKET_RATIO):
        info["buckets"] = info.get("buckets", []) + [[sizes[j] for j in bucket]]
        nmax = sizes[bucket[0]]
        Kc = torch.empty(len(bucket), nmax, nmax, dtype=X.dtype)
        clock.lap("copies/alloc (padded bucket)")
        colmeans = []
        for t, j in enumerate(bucket):
            n = sizes[j]
            Kc[t, n:].zero_()
            Kc[t, :n, n:].zero_()
            Xj = X[off[j]:off[j + 1]]
            if new:  # the upper-triangle blocks straight into the slot (K.centred_gram_into)
                out = Kc[t, :n, :n]
                Xc = Xj - Xj.mean(0)
                sq = (Xc * Xc).sum(1)
                starts = list(range(0, n, K.GRAM_TILE_ROWS))
                for a, b in zip(starts, starts[1:] + [n]):
                    blk = out[a:b, a:]
                    torch.add(sq[a:b, None], sq[a:], out=blk)
                    blk.addmm_(Xc[a:b], Xc[a:].T, alpha=-2.0)
                    clock.lap("Gram GEMM (upper blocks, incl. xx+yy fill)")
                    blk.clamp_min_(0.0).mul_(-g).exp_()
                    clock.lap("Gram exp (incl. clamp, scale)")
                    diag = out[a:b, a:b]
                    diag.diagonal().fill_(1.0)
                    low = diag.T.tril(-1)
                    diag.triu_().add_(low)
                    out[b:, a:b] = out[a:b, b:].T
                    clock.lap("Gram mirror into the lower triangle")
                r = out.mean(1)
                out.sub_(r).sub_((r - r.mean()).unsqueeze(1))
                colmeans.append(r)
                clock.lap("centring")
                continue
            Xc = Xj - Xj.mean(0)
            xx = (Xc * Xc).sum(1, keepdim=True)
            D2 = torch.empty(n, n, dtype=X.dtype)
            torch.add(xx, xx.T, out=D2)
            clock.lap("Gram: centre X, norms, xx+yy fill")
            D2.addmm_(Xc, Xc.T, alpha=-2.0)
            clock.lap("Gram GEMM")
            D2.clamp_min_(0.0).mul_(-g)
            clock.lap("Gram elementwise (clamp, scale)")
            D2.exp_()
            clock.lap("Gram exp")
            D2.diagonal().fill_(1.0)
            Kg = (D2 + D2.T).mul_(0.5)
            clock.lap("Gram symmetrise (fresh n x n)")
            colmeans.append(Kg.mean(0))
            double_center_(Kg)
            clock.lap("centring")
            Kc[t, :n, :n] = Kg
            clock.lap("copies/alloc (padded bucket)")
        passes = [0]
        gemm = [0.0]

        def apply(Y):
            t0 = time.perf_counter()
            out = (Kc @ Y.to(Kc.dtype)).to(torch.float64)
            gemm[0] += time.perf_counter() - t0
            passes[0] += 1
            return out

        n = Kc.shape[-1]
        dense = n < K.DENSE_BELOW_BLOCKS * K.krylov_block(n, d)
        info["auto solver"] = "dense eigh" if dense else f"block Krylov (block {K.krylov_block(n, d)})"
        if dense:
            with K.thread_independent(Kc.device):
                mu, U = torch.linalg.eigh(Kc)
            mu, U = mu.flip(-1)[:, :d], U.flip(-1)[:, :, :d]
        else:
            mu, U = K.block_krylov_top(apply, Kc.shape[0], n, d, device=Kc.device,
                                       tol=K.krylov_tol(Kc.dtype))
            mu, U = mu.to(Kc.dtype), U.to(Kc.dtype)
        info["Krylov passes (K x block)"] = passes[0]
        clock.lap("eigen-solve (all)")
        clock.t["  of which Krylov pass GEMMs"] += gemm[0]
        ev, alphas_b, mp = K.normalise_eigenpairs(mu, U, colmeans, [sizes[j] for j in bucket])
        alphas = torch.zeros(X.shape[0], d, dtype=X.dtype)
        for t, j in enumerate(bucket):
            alphas[off[j]:off[j + 1]] = alphas_b[t]
        clock.lap("normalise + scatter")
    K.fingerprint(X)
    clock.lap("fingerprint x2 (fit + check)")
    out = torch.empty(m, d, B.shape[0], dtype=X.dtype)
    for j in range(m):
        Xj = X[off[j]:off[j + 1]]
        mu = Xj.mean(0)
        Kj = K._sqdist(Xj - mu, B - mu)
        clock.lap("projection Gram (GEMM, n x S)")
        Kj.mul_(-g).exp_()
        clock.lap("projection exp")
        torch.mm(alphas[off[j]:off[j + 1]].T, Kj, out=out[j])
        clock.lap("projection alphas^T K")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--path", choices=("now", "before"), default="now",
                    help="the stages of the code now, or of the path before docs/history.md §15e's changes "
                         "(its Gram stages; the eigen-solve is the current one)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    data = make_data()
    X, off, B, g = data["X"], data["offsets"], data["B"], data["gamma"]
    o = off.tolist()
    d = N_COMPONENTS

    def pipeline():
        fit = gk.kpca(X, off, n_components=d, gamma=g)
        return gk.project_onto_basis(X, fit, B, gamma=g)

    def floor():
        return [gk.rbf_gram(X[o[j]:o[j + 1]], gamma=g) for j in range(len(o) - 1)]

    ref = pipeline()
    info: dict = {}
    staged(X, off, B, g, d, Clock(), info, args.path == "now")  # warm-up
    walls, floors, stagewise = [], [], defaultdict(list)
    for _ in range(args.runs):
        t0 = time.perf_counter(); floor(); floors.append(time.perf_counter() - t0)
        t0 = time.perf_counter(); pipeline(); walls.append(time.perf_counter() - t0)
        clock = Clock()
        out = staged(X, off, B, g, d, clock, {}, args.path == "now")
        for k, v in clock.t.items():
            stagewise[k].append(v)
    err = float((out - ref).abs().max() / ref.abs().max())
    fl, wall = min(floors), min(walls)
    print(f"path {args.path}, threads {args.threads}, runs {args.runs}, min over runs (busy machine: "
          f"ratios only); staged copy vs public betas: max rel. diff {err:.1e}")
    print(f"  {info}")
    print(f"  floor (3 x gk.rbf_gram) {fl * 1e3:7.1f} ms (median {statistics.median(floors) * 1e3:.1f})")
    print(f"  pipeline (public calls) {wall * 1e3:7.1f} ms (median {statistics.median(walls) * 1e3:.1f}) "
          f"= {wall / fl:.2f}x the floor")
    total = sum(min(v) for k, v in stagewise.items() if not k.startswith(" "))
    print(f"  staged total            {total * 1e3:7.1f} ms = {total / fl:.2f}x the floor")
    print(f"  {'stage':<40} {'ms':>8} {'share':>7} {'x floor':>8}")
    for k, v in stagewise.items():
        t = min(v)
        print(f"  {k:<40} {t * 1e3:8.1f} {100 * t / total:6.1f}% {t / fl:8.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
