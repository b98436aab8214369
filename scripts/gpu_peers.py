"""geomkern's default path against every GPU peer, on the same inputs, interleaved (issue 40, items 1-2).

    python scripts/gpu_peers.py --out DIR [--jsonl FILE] [--budget-s 90]   # GPU (the session's peers step)
    python scripts/gpu_peers.py --dry --out DIR                            # CPU, tiny shapes (CI)
    python scripts/gpu_peers.py --check results/gpu/peers-h200-2026-12-01.json

For each op and shape every provider runs on the same float32 inputs; its result is compared with a
float64 evaluation of the op on the same inputs (inputs upcast), and its time is the median of
ROUNDS calls taken in turns (provider 1, 2, ..., 1, 2, ...: a clock or thermal drift hits all alike).

  providers   geomkern            the public op under gk.set_backend("auto") (its "backend" field
                                  says which one auto picked)
              torch_reference     geomkern's torch reference, eager
              torch_compile       torch.compile of the op's formula in plain torch (FORMULAS below:
                                  the reference's math without its row-block loops, which Dynamo
                                  would unroll; the pre-image: one compiled step, the loop eager)
              torch_compile_tf32  the same with torch's TF32 matmuls allowed (both CUDA only)
              cdist_exp           torch.cdist + exp (the Gram ops and rbf_matmul)
              keops               pykeops LazyTensor (rbf_matmul, the Gram-vector product; CUDA only)
              torch_eigh_float32  torch.linalg.eigh without geomkern's float64 upcast (eigh)
              cupy                cupy.linalg.eigh (eigh; CUDA only)
              cublas_floor        the cuBLAS TF32 GEMMs doing the products the op needs at tf32x3:
                                  three per product on hi/lo-split operands, split outside the timing
                                  (a symmetric Gram: the full GEMMs' time halved, its upper half);
                                  its max_err is the error of those products, not of the op
  ops         rbf_gram rbf_gram_cross rbf_matmul projection preimage eigh kmeans_assign kpca
  shapes      CASES below: the headline shapes of docs/gpu-model.md first (one per op, so a cut run
              keeps every op), then small D (3 and 16, KeOps's ground), then FedMC's many small
              clusters; --dry runs DRY_CASES, the same ops at toy sizes on CPU

Records, one per (op, shape, provider), written to the summary file after every case (a run cut by
its limit keeps what it finished) and, with --jsonl, appended there as kind "peer":
  {"op", "shape", "provider", "us", "max_err", "err_bound", "device", "commit"}
  + "backend" (geomkern: what auto ran), "skipped" (why a provider did not run: us and max_err are
  then null), "dry" (true on the CPU dry run: its times mean nothing).
max_err is max |out - exact| / max |exact| (the eigen-solves: over the eigenvalues; kmeans_assign:
the chosen centre's excess squared distance over the best one's, divided by the largest distance).
err_bound is the op's float32 bound (tests/geomkern/_oracle.py TOL, 1e-5), the pre-image's and kpca's
looser ones below. The summary file is DIR/peers-<device>-<date>.json; a real draw's copy goes to
results/gpu/ with its manifest entry.

--check FILE prints, per op and shape, issue 40's three acceptance tests (check() below).
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OPS = ("rbf_gram", "rbf_gram_cross", "rbf_matmul", "projection", "preimage", "eigh", "kmeans_assign", "kpca")
FLOOR_OPS = ("rbf_gram", "rbf_gram_cross", "rbf_matmul", "projection", "kmeans_assign")
FLOOR_RATIO = 1.3
# float32's bound (tests/geomkern/_oracle.py TOL); 100 pre-image steps and a kpca eigen-solve
# compound their rounding, so they are judged at 1e-4 (chosen before any measurement)
BOUND = {op: 1e-5 for op in OPS} | {"preimage": 1e-4, "kpca": 1e-4}
ROUNDS = 5
FIELDS = ("op", "shape", "provider", "us", "max_err", "err_bound", "device", "commit")

# (op, shape label, builder arguments): value order, so a cut run keeps one shape of every op
CASES = [
    ("rbf_gram", "4096^2 x D512", dict(n=4096, d=512)),
    ("rbf_gram_cross", "4096 x 4096 x D512", dict(n=4096, m=4096, d=512)),
    ("rbf_matmul", "20000 x 20000 x D64, p16", dict(n=20000, m=20000, d=64, p=16)),
    ("projection", "20 x 1000 pts, S512 d8 D512", dict(m=20, n=1000, s=512, k=8, d=512)),
    ("kmeans_assign", "10 x 5000 x D512, k64", dict(m=10, n=5000, k=64, d=512)),
    ("preimage", "50000 x S512 x D512, 100 steps", dict(n=50000, s=512, d=512, steps=100)),
    ("eigh", "500 x 100^2", dict(b=500, n=100)),
    ("kpca", "30 clusters 100-2000 x D512, d8", dict(sizes=list(range(100, 2001, 65))[:30], d=512, k=8)),
    # small D, where KeOps is strongest
    ("rbf_matmul", "20000 x 20000 x D3, p16", dict(n=20000, m=20000, d=3, p=16)),
    ("rbf_matmul", "20000 x 20000 x D16, p16", dict(n=20000, m=20000, d=16, p=16)),
    ("rbf_gram", "4096^2 x D3", dict(n=4096, d=3)),
    ("rbf_gram", "4096^2 x D16", dict(n=4096, d=16)),
    ("rbf_gram_cross", "4096 x 4096 x D16", dict(n=4096, m=4096, d=16)),
    ("kmeans_assign", "10 x 5000 x D16, k64", dict(m=10, n=5000, k=64, d=16)),
    ("preimage", "50000 x S512 x D16, 100 steps", dict(n=50000, s=512, d=16, steps=100)),
    # FedMC's many small clusters (batched)
    ("kpca", "200 clusters 50-300 x D512, d8", dict(sizes=[50 + (i * 37) % 251 for i in range(200)], d=512, k=8)),
    ("projection", "200 x 100 pts, S512 d8 D512", dict(m=200, n=100, s=512, k=8, d=512)),
    ("kmeans_assign", "200 x 300 x D512, k8", dict(m=200, n=300, k=8, d=512)),
    ("eigh", "200 x 300^2", dict(b=200, n=300)),
    ("eigh", "64 x 512^2", dict(b=64, n=512)),
    ("rbf_matmul", "20000 x 20000 x D512, p16", dict(n=20000, m=20000, d=512, p=16)),
]
DRY_CASES = [
    ("rbf_gram", "48^2 x D16", dict(n=48, d=16)),
    ("rbf_gram_cross", "40 x 56 x D3", dict(n=40, m=56, d=3)),
    ("rbf_matmul", "64 x 80 x D3, p4", dict(n=64, m=80, d=3, p=4)),
    ("projection", "3 x 20 pts, S16 d3 D8", dict(m=3, n=20, s=16, k=3, d=8)),
    ("kmeans_assign", "4 x 50 x D8, k5", dict(m=4, n=50, k=5, d=8)),
    ("preimage", "40 x S16 x D8, 10 steps", dict(n=40, s=16, d=8, steps=10)),
    ("eigh", "6 x 12^2", dict(b=6, n=12)),
    ("kpca", "3 clusters 20-40 x D8, d3", dict(sizes=[20, 30, 40], d=8, k=3)),
]


# ------------------------------------------------------------------------------------------ helpers

def max_rel(out, exact) -> float:
    """max |out - exact| / max |exact|, in float64."""
    import torch
    out, exact = out.double(), exact.double()
    return float((out - exact).abs().max() / exact.abs().max().clamp_min(torch.finfo(torch.float64).tiny))


@contextlib.contextmanager
def tf32(enabled: bool):
    import torch
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old


def split_tf32(x):
    """x = hi + lo with hi rounded to TF32 (10 mantissa bits, the low 13 bits cleared)."""
    import torch
    hi = (x.contiguous().view(torch.int32) & -8192).view(torch.float32)
    return hi, x - hi


def rand(shape, seed: int, dev, scale: float = 1.0):
    import torch
    g = torch.Generator(device=dev).manual_seed(seed)
    return torch.randn(*shape, generator=g, device=dev) * scale


class Case:
    """One op at one shape: its providers (a callable, or the reason it cannot run), how to score a
    result against the float64 one, and the cuBLAS floor (its GEMM pairs)."""

    def __init__(self, exact, score=max_rel):
        self.exact, self.score, self.providers, self.floor, self.halve = exact, score, {}, None, False
        self.backend = self.formula = None

    def add(self, name: str, fn_or_reason) -> None:
        self.providers[name] = fn_or_reason


def on_cuda(dev) -> str | None:
    return None if str(dev).startswith("cuda") else "needs CUDA (dry run on CPU)"


def compiled(case: Case, fn, dev, wrap=None) -> None:
    """torch_compile and torch_compile_tf32 providers: ``fn`` compiled, or (``wrap`` given)
    ``fn(torch.compile(wrap))``, a loop around a compiled step. CUDA only: Inductor's CPU compile
    takes minutes on a two-core CI machine."""
    import torch
    case.formula = fn if wrap is None else (lambda: fn(wrap))  # uncompiled: the dry run's test scores it
    why = on_cuda(dev)
    for name, allow in (("torch_compile", False), ("torch_compile_tf32", True)):
        if why:
            case.add(name, why)
            continue
        if wrap is None:
            cfn = torch.compile(fn, dynamic=False)
        else:
            step = torch.compile(wrap, dynamic=False)
            cfn = (lambda step=step: fn(step))

        def run(cfn=cfn, allow=allow):
            with tf32(allow):
                return cfn()
        case.add(name, run)


def keops_reason(dev) -> str | None:
    if on_cuda(dev):
        return on_cuda(dev)
    try:
        import pykeops.config
        import pykeops.torch  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - not installed, or no compiler for it
        return f"pykeops not importable: {exc!r}"[:200]
    if not pykeops.config.gpu_available:  # it found no CUDA libraries (nvrtc, libcuda) and went CPU-only
        return "pykeops imported without CUDA (pykeops.config.gpu_available is False)"
    return None


# ------------------------------------------------------------------------------------------ formulas
# The ops' math as a user would write it in torch, for torch.compile: distances on the shifted rows
# (as every geomkern path does), one expression per op.

def gram_formula(X, Y, gamma: float):
    import torch
    mu = Y.mean(0)
    Xs, Ys = X - mu, Y - mu
    d2 = (Xs * Xs).sum(1, keepdim=True) + (Ys * Ys).sum(1) - 2.0 * (Xs @ Ys.T)
    return torch.exp(d2.clamp_min(0.0) * -gamma)


def matmul_formula(X, Y, V, gamma: float):
    return gram_formula(X, Y, gamma) @ V


def projection_formula(Xc, A, B, gamma: float):
    """Xc (m, n, D) equal-size clusters, A (m, n, d) their alphas, B (S, D) -> (m, d, S)."""
    import torch
    mu = Xc.mean(1, keepdim=True)
    Xs, Bs = Xc - mu, B.unsqueeze(0) - mu
    d2 = (Xs * Xs).sum(-1, keepdim=True) + (Bs * Bs).sum(-1).unsqueeze(1) - 2.0 * (Xs @ Bs.transpose(1, 2))
    return A.transpose(1, 2) @ torch.exp(d2.clamp_min(0.0) * -gamma)


def gd_step_formula(z, t, step, B, gamma: float):
    """One gradient step of the pre-image (geomkern.ops.preimage.gd_reference's update)."""
    import torch
    mu = B.mean(0)
    zs, Bs = z - mu, B - mu
    k = torch.exp(((zs * zs).sum(1, keepdim=True) + (Bs * Bs).sum(1) - 2.0 * (zs @ Bs.T)).clamp_min(0.0) * -gamma)
    w = (k - t) * k
    return z + step * (w.sum(1, keepdim=True) * z - w @ B)


# ------------------------------------------------------------------------------------------ the ops

def build(op: str, a: dict, dev) -> Case:
    import torch

    import geomkern as gk
    from geomkern.ops import eigh as reigh
    from geomkern.ops import kmeans as rkm
    from geomkern.ops import kpca as rkpca
    from geomkern.ops import preimage as rpre
    from geomkern.ops import rbf as rrbf

    def auto(fn):
        def run():
            with gk.set_backend("auto"):
                return fn()
        return run

    if op in ("rbf_gram", "rbf_gram_cross"):
        cross = op == "rbf_gram_cross"
        X = rand((a["n"], a["d"]), 1, dev, a["d"] ** -0.5)
        Y = rand((a["m"], a["d"]), 2, dev, a["d"] ** -0.5) if cross else None
        g = gk.median_gamma(X)
        c = Case(rrbf.gram_reference(X.double(), None if Y is None else Y.double(), g, False))
        c.backend = gk.resolve("rbf_gram", X.device.type)
        c.add("geomkern", auto(lambda: gk.rbf_gram(X, Y, gamma=g)))
        c.add("torch_reference", lambda: rrbf.gram_reference(X, Y, g, False))
        Yc = X if Y is None else Y
        compiled(c, lambda: gram_formula(X, Yc, g), dev)
        c.add("cdist_exp", lambda: torch.exp(torch.cdist(X, Yc).square_().mul_(-g)))
        c.add("keops", "KeOps reduces over an axis; it does not materialise a dense Gram (see rbf_matmul)")
        c.floor, c.halve = [(X, Yc.T)], not cross
        return c
    if op == "rbf_matmul":
        X = rand((a["n"], a["d"]), 1, dev, a["d"] ** -0.5)
        Y = rand((a["m"], a["d"]), 2, dev, a["d"] ** -0.5)
        V = rand((a["m"], a["p"]), 3, dev)
        g = gk.median_gamma(X)
        c = Case(rrbf.rbf_matmul_reference(X.double(), Y.double(), V.double(), g))
        c.backend = gk.resolve("rbf_matmul", X.device.type)
        c.add("geomkern", auto(lambda: gk.rbf_matmul(X, Y, V, gamma=g)))
        c.add("torch_reference", lambda: rrbf.rbf_matmul_reference(X, Y, V, g))
        compiled(c, lambda: matmul_formula(X, Y, V, g), dev)
        c.add("cdist_exp", lambda: torch.exp(torch.cdist(X, Y).square_().mul_(-g)) @ V)
        why = keops_reason(dev)
        if why:
            c.add("keops", why)
        else:
            from pykeops.torch import LazyTensor
            x, y = LazyTensor(X[:, None, :]), LazyTensor(Y[None, :, :])
            K = (-g * ((x - y) ** 2).sum(-1)).exp()
            c.add("keops", lambda: K @ V)
        # the products: X Y^T (n x d x m), then K V (n x m x p) on an n x m stand-in for K
        c.floor = [(X, Y.T), (torch.empty(a["n"], a["m"], device=dev).uniform_(), V)]
        return c
    if op == "projection":
        sizes = [a["n"]] * a["m"]
        X = rand((sum(sizes), a["d"]), 1, dev, a["d"] ** -0.5)
        B = rand((a["s"], a["d"]), 2, dev, a["d"] ** -0.5)
        off = torch.tensor([0] + list(torch.tensor(sizes).cumsum(0).tolist()), device=dev)
        g = gk.median_gamma(X)
        fit = gk.kpca(X, off, n_components=a["k"], gamma=g)
        c = Case(rkpca.projection_reference(X.double(), fit.alphas.double(), fit.offsets, B.double(), g))
        c.backend = gk.resolve("project_onto_basis", X.device.type)
        c.add("geomkern", auto(lambda: gk.project_onto_basis(X, fit, B, gamma=g)))
        c.add("torch_reference", lambda: rkpca.projection_reference(X, fit.alphas, fit.offsets, B, g))
        Xc, Ac = X.view(a["m"], a["n"], a["d"]), fit.alphas.reshape(a["m"], a["n"], a["k"])
        compiled(c, lambda: projection_formula(Xc, Ac, B, g), dev)
        for name in ("cdist_exp", "keops"):
            c.add(name, "no dense-Gram or K.V form: the projection contracts each cluster's alphas")
        # the products: X B^T (N x D x S), then alphas_j^T K_j per cluster (m batched d x n x S)
        c.floor = [(X, B.T), (Ac.transpose(1, 2), torch.empty(a["m"], a["n"], a["s"], device=dev).uniform_())]
        return c
    if op == "kmeans_assign":
        P = rand((a["m"], a["n"], a["d"]), 1, dev, a["d"] ** -0.5)
        C = P[:, torch.arange(a["k"], device=dev) * (a["n"] // a["k"])].clone()
        d64 = rkm._bsqdist(P.double(), C.double())

        def score(labels, exact=None):
            best = d64.min(-1).values
            got = d64.gather(-1, labels.long().unsqueeze(-1)).squeeze(-1)
            return float((got - best).max() / d64.max())
        c = Case(None, score)
        c.backend = gk.resolve("kmeans", P.device.type)
        if c.backend == "triton":
            from geomkern.backends.triton import kmeans as tkm
            c.add("geomkern", auto(lambda: tkm.assign(P, C)))
        else:  # the other backends' Lloyd step is the reference assignment (or a whole native kmeans)
            c.add("geomkern", lambda: rkm.assign_reference(P, C))
        c.add("torch_reference", lambda: rkm.assign_reference(P, C))
        compiled(c, lambda: rkm.assign_reference(P, C), dev)
        c.add("cdist_exp", lambda: torch.cdist(P, C).argmin(-1))  # cdist alone: no exp in an assignment
        c.add("keops", "not timed here: KeOps's argmin reduction is a later addition")
        c.floor = [(P, C.transpose(1, 2))]
        return c
    if op == "preimage":
        B = rand((a["s"], a["d"]), 1, dev, a["d"] ** -0.5)
        g = gk.median_gamma(B)
        idx = torch.arange(a["n"], device=dev) % a["s"]
        x = B[idx] + 0.3 * rand((a["n"], a["d"]), 2, dev, a["d"] ** -0.5)
        T = rrbf.gram_reference(x, B, g, False)
        Z0 = x + 0.05 * rand((a["n"], a["d"]), 3, dev, a["d"] ** -0.5)
        lr, st = rpre.default_gd_lr(Z0, B, g), a["steps"]
        c = Case(rpre.gd_reference(Z0.double(), B.double(), T.double(), g, st, lr.double()))
        c.backend = gk.resolve("preimage", Z0.device.type, method="gd")
        c.add("geomkern", auto(lambda: gk.preimage(Z0, B, T, gamma=g, steps=st)))
        c.add("torch_reference", lambda: rpre.gd_reference(Z0, B, T, g, st, lr))
        step_size = (4.0 * g * lr).unsqueeze(1)

        def gd_loop(stepper):
            z = Z0
            for _ in range(st):
                z = stepper(z, T, step_size, B, g)
            return z
        compiled(c, gd_loop, dev, wrap=gd_step_formula)
        for name in ("cdist_exp", "keops"):
            c.add(name, "no single Gram or K.V product: the pre-image is an iteration")
        # per step: Z B^T (n x D x S) and W B (n x S x D); the list is one step, repeated
        W = torch.empty(a["n"], a["s"], device=dev).uniform_()
        c.floor = [(Z0, B.T), (W, B)] * st
        return c
    if op == "eigh":
        P = rand((a["b"], a["n"], 16), 1, dev, 0.25)
        A = rrbf.double_center(torch.exp(-torch.cdist(P, P).square()))
        A = (A + A.transpose(1, 2)) / 2
        exact = torch.linalg.eigh(A.double())[0]
        # geomkern's eigh returns the eigenvalues descending, torch's ascending: scored sorted
        c = Case(exact, lambda vals, exact=exact: max_rel(vals.sort(-1).values, exact))
        c.backend = gk.resolve("eigh", A.device.type)
        c.add("geomkern", auto(lambda: gk.eigh(A)[0]))
        c.add("torch_reference", lambda: reigh.eigh_reference(A, None)[0])
        c.add("torch_eigh_float32", lambda: torch.linalg.eigh(A)[0])
        for name in ("torch_compile", "torch_compile_tf32"):
            c.add(name, "torch.compile does not compile an eigen-solve (graph break to the same call)")
        why = on_cuda(dev)
        if why is None:
            try:
                import cupy
                Ac = cupy.asarray(A)
                c.add("cupy", lambda: torch.as_tensor(cupy.linalg.eigh(Ac)[0], device=dev))
            except Exception as exc:  # noqa: BLE001
                c.add("cupy", f"cupy not usable: {exc!r}"[:200])
        else:
            c.add("cupy", why)
        c.floor = "no GEMM floor: an eigen-solve"
        return c
    if op == "kpca":
        sizes = a["sizes"]
        X = rand((sum(sizes), a["d"]), 1, dev, a["d"] ** -0.5)
        off = torch.tensor([0] + torch.tensor(sizes).cumsum(0).tolist(), device=dev)
        g = gk.median_gamma(X)
        with gk.set_backend("reference"):
            exact = gk.kpca(X.double(), off, n_components=a["k"], gamma=g).eigenvalues
        c = Case(exact, lambda vals, exact=exact: max_rel(vals, exact))
        c.backend = gk.resolve("kpca", X.device.type)
        c.add("geomkern", auto(lambda: gk.kpca(X, off, n_components=a["k"], gamma=g).eigenvalues))

        def ref():
            with gk.set_backend("reference"):
                return gk.kpca(X, off, n_components=a["k"], gamma=g).eigenvalues
        c.add("torch_reference", ref)
        for name in ("torch_compile", "torch_compile_tf32"):
            c.add(name, "torch.compile does not compile an eigen-solve (graph break to the same call)")
        c.floor = "no GEMM floor: the eigen-solve dominates"
        return c
    raise ValueError(f"unknown op {op!r}")


def floor_fn(pairs, dev):
    """The cuBLAS floor: three TF32 GEMMs per product (hi hi, hi lo, lo hi), operands split
    beforehand; returns (run, error of the products against float64)."""
    import torch
    split = [(split_tf32(A), split_tf32(B)) for A, B in pairs[:2]]
    split = [split[i % len(split)] for i in range(len(pairs))]

    def run():
        with tf32(True):
            out = None
            for (ah, al), (bh, bl) in split:
                out = torch.matmul(ah, bh) + torch.matmul(ah, bl) + torch.matmul(al, bh)
            return out
    with tf32(True):
        (ah, al), (bh, bl) = split[0]
        prod = torch.matmul(ah, bh) + torch.matmul(ah, bl) + torch.matmul(al, bh)
    err = max_rel(prod, torch.matmul(pairs[0][0].double(), pairs[0][1].double()))
    return run, err


# ------------------------------------------------------------------------------------------ timing

def sync(dev) -> None:
    import torch
    if str(dev).startswith("cuda"):
        torch.cuda.synchronize()


def time_interleaved(fns: dict, dev, rounds: int) -> dict:
    """Median microseconds of each callable, called in turns from an idle device: CUDA events
    around the call on CUDA (its launches' gaps included), the wall clock on CPU."""
    import torch
    cuda = str(dev).startswith("cuda")
    times = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            sync(dev)
            if cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                times[k].append(start.elapsed_time(end) * 1e3)
            else:
                t = time.perf_counter()
                fn()
                times[k].append((time.perf_counter() - t) * 1e6)
    return {k: statistics.median(v) for k, v in times.items()}


def release(dev) -> None:
    """Between cases: drop the compiled graphs (each case compiles its own; Dynamo's per-function
    recompile limit would otherwise fall back to eager) and the cached GPU memory."""
    import gc

    import torch
    gc.collect()
    if str(dev).startswith("cuda"):
        torch._dynamo.reset()
        torch.cuda.empty_cache()


def commit() -> str | None:
    if os.environ.get("GPU_SESSION_COMMIT"):
        return os.environ["GPU_SESSION_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                             text=True, timeout=10).stdout.strip()
        return out or None
    except Exception:  # noqa: BLE001 - the device machine's copy may have no .git
        return None


def device_slug(dev) -> str:
    """'h200' from 'NVIDIA H200', 'h100' from 'NVIDIA H100 80GB HBM3'; 'cpu' on CPU."""
    import torch
    if not str(dev).startswith("cuda"):
        return "cpu"
    name = torch.cuda.get_device_name(dev)
    m = re.search(r"\b([A-Z]+\d+[A-Za-z]*)\b", name.replace("NVIDIA", ""))
    return (m.group(1) if m else re.sub(r"\W+", "-", name)).lower()


def measure(cases, dev, out_dir: Path, budget_s: float, rounds: int, dry: bool, jsonl: Path | None) -> Path:
    """Run every case within budget_s; rewrite the summary file after each. Returns its path."""
    t0, sha, slug = time.monotonic(), commit(), device_slug(dev)
    date = _dt.datetime.now(_dt.timezone.utc).date().isoformat()
    out = out_dir / f"peers-{slug}-{date}.json"
    records: list[dict] = []

    def record(op, shape, provider, us=None, err=None, **extra) -> None:
        rec = {"op": op, "shape": shape, "provider": provider, "us": None if us is None else round(us, 2),
               "max_err": err, "err_bound": BOUND[op], "device": slug, "commit": sha, **extra}
        if dry:
            rec["dry"] = True
        records.append(rec)
        if jsonl is not None:
            with jsonl.open("a") as fh:
                fh.write(json.dumps({"kind": "peer", **rec}) + "\n")

    for op, shape, args in cases:
        if time.monotonic() - t0 > budget_s:
            record(op, shape, "geomkern", skipped=f"budget ({budget_s:.0f} s) spent")
            continue
        try:
            case = build(op, args, dev)
        except Exception as exc:  # noqa: BLE001 - one op's failure never stops the others
            record(op, shape, "geomkern", skipped=f"set-up failed: {exc!r}"[:300])
            continue
        fns, errs = {}, {}
        for name, fn in case.providers.items():
            if isinstance(fn, str):
                record(op, shape, name, skipped=fn)
                continue
            try:  # the first call: compiles, warms up, and gives the result scored
                errs[name] = case.score(fn(), case.exact)
                fns[name] = fn
            except Exception as exc:  # noqa: BLE001
                record(op, shape, name, skipped=f"failed: {exc!r}"[:300])
        halve = 1.0
        if isinstance(case.floor, list):
            try:
                fns["cublas_floor"], errs["cublas_floor"] = floor_fn(case.floor, dev)
                halve = 0.5 if case.halve else 1.0
            except Exception as exc:  # noqa: BLE001
                record(op, shape, "cublas_floor", skipped=f"failed: {exc!r}"[:300])
        elif case.floor:
            record(op, shape, "cublas_floor", skipped=case.floor)
        try:
            us = time_interleaved(fns, dev, rounds) if fns else {}
        except Exception as exc:  # noqa: BLE001 - e.g. out of memory in a later round
            us, why = {}, f"failed while timed: {exc!r}"[:300]
            for name in fns:
                record(op, shape, name, skipped=why)
        for name in us:
            extra = {"backend": case.backend} if name == "geomkern" else {}
            if name == "cublas_floor" and halve != 1.0:
                extra = {"note": "full GEMMs' time halved: the symmetric Gram's upper half"}
            record(op, shape, name, us[name] * (halve if name == "cublas_floor" else 1.0), errs[name], **extra)
        out.write_text(json.dumps(records, indent=1) + "\n")
        print(f"[peers {time.monotonic() - t0:6.1f}s] {op} {shape}: " + ", ".join(
            f"{k} {us[k]:.0f} us ({errs[k]:.1e})" for k in us), flush=True)
        del case, fns
        release(dev)
    out.write_text(json.dumps(records, indent=1) + "\n")
    return out


# ------------------------------------------------------------------------------------------ acceptance

def check(records: list[dict]) -> list[dict]:
    """Issue 40's acceptance per (op, shape), one row each:
      fastest   geomkern's us <= the smallest us of every other provider (cublas_floor aside: it does
                not compute the op) whose max_err is within its err_bound
      accurate  geomkern's own max_err <= its err_bound
      floor     (FLOOR_OPS only; None elsewhere) geomkern's us <= FLOOR_RATIO x cublas_floor's us
    ok is all three (a missing geomkern or floor record fails). Rows in the records' order."""
    by_case: dict = {}
    for r in records:
        by_case.setdefault((r["op"], r["shape"]), []).append(r)
    rows = []
    for (op, shape), recs in by_case.items():
        gk = next((r for r in recs if r["provider"] == "geomkern" and r.get("us") is not None), None)
        row = {"op": op, "shape": shape, "geomkern_us": gk and gk["us"]}
        if gk is None:
            rows.append({**row, "fastest": False, "accurate": False, "floor": False if op in FLOOR_OPS else None,
                         "ok": False, "why": "no geomkern timing"})
            continue
        peers = [r for r in recs if r["provider"] not in ("geomkern", "cublas_floor") and r.get("us") is not None
                 and r.get("max_err") is not None and r["max_err"] <= r["err_bound"]]
        best = min(peers, key=lambda r: r["us"], default=None)
        row["fastest"] = best is None or gk["us"] <= best["us"]
        row["best_peer"] = best and f"{best['provider']} {best['us']} us"
        row["accurate"] = gk.get("max_err") is not None and gk["max_err"] <= gk["err_bound"]
        if op in FLOOR_OPS:
            fl = next((r for r in recs if r["provider"] == "cublas_floor" and r.get("us") is not None), None)
            row["floor"] = fl is not None and gk["us"] <= FLOOR_RATIO * fl["us"]
            row["floor_ratio"] = fl and round(gk["us"] / fl["us"], 2)
        else:
            row["floor"] = None
        row["ok"] = row["fastest"] and row["accurate"] and row["floor"] is not False
        rows.append(row)
    return rows


def print_check(rows: list[dict]) -> None:
    yn = {True: "yes", False: "NO", None: "-"}
    print(f"{'op':15} {'shape':34} {'geomkern us':>12} {'fastest':>8} {'accurate':>9} {'<=1.3 floor':>12}  best peer")
    for r in rows:
        fl = yn[r["floor"]] + (f" ({r['floor_ratio']}x)" if r.get("floor_ratio") else "")
        print(f"{r['op']:15} {r['shape']:34} {r['geomkern_us'] or '-':>12} {yn[r['fastest']]:>8} "
              f"{yn[r['accurate']]:>9} {fl:>12}  {r.get('best_peer') or r.get('why') or '-'}")
    print(f"{sum(r['ok'] for r in rows)} of {len(rows)} op/shape cases pass")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or ROOT / "gpu-out"))
    ap.add_argument("--jsonl", type=Path, default=None, help="also append each record here (kind 'peer')")
    ap.add_argument("--budget-s", type=float, default=90.0, help="no new case starts after this")
    ap.add_argument("--rounds", type=int, default=ROUNDS)
    ap.add_argument("--dry", action="store_true", help="CPU, DRY_CASES (CI's dry run)")
    ap.add_argument("--check", type=Path, default=None, help="print the acceptance of a peers JSON and exit")
    args = ap.parse_args(argv)
    if args.check:
        rows = check(json.loads(args.check.read_text()))
        print_check(rows)
        return 0 if rows and all(r["ok"] for r in rows) else 1
    import torch
    dev = "cpu" if args.dry or not torch.cuda.is_available() else "cuda"
    if dev == "cpu" and not args.dry:
        print("gpu_peers: no CUDA device; run with --dry for the CPU dry run", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    path = measure(DRY_CASES if args.dry else CASES, dev, args.out, args.budget_s,
                   2 if args.dry else args.rounds, args.dry, args.jsonl)
    print(f"gpu_peers: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
