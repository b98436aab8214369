"""Hostile inputs for the five ops that are torch operators (issue 44, item 2, first slice).

Hypothesis (derandomized by the project's profile, tests/conftest.py) starts from a good call of
``rbf_gram``, ``rbf_matmul``, ``kmeans``, ``kpca_transform`` and ``preimage``
(tests/geomkern/_operator_specs.py) and replaces up to two arguments with hostile values: NaN,
Inf, overflowing or tiny entries, empty, wrong rank, wrong or mixed dtype, lists and arrays for
tensors, gradients, non-contiguous views; zero, negative, fractional, boolean, textual and
beyond-int64 counts; unknown names; broken offsets and segments. Every case must end in one of
two ways, by the public function and, where the values fit the operator's schema, by
``torch.ops.geomkern.<name>`` alike:

* a result that is correct: against a float64 evaluation of the op's formula (Grams, kernel
  products, kernel-PC scores), the reference backend in float64 (pre-images), or its invariants
  (K-Means: labels in range, finite centers and inertia);
* a ValueError or TypeError whose message names an argument that was changed.

The public functions that are not operators (FUNCTIONS: kpca, eigh, class_moments,
project_onto_basis, sqrtm_psd, median_gamma, gaussian_w2, bures, gaussian_barycenter, pool_moments,
preimage_loss) run the same way, each against a float64 reference written here (W2 and Bures by
eigendecomposition, the barycentre by its fixed-point residual, pooled moments by Eq. 4 and, for the
good call, by the moments of the pooled raw data).

Anything else fails: another exception, a wrong or non-finite result, an operator that answers
otherwise than the function. The reference backend runs in this process; the native backend
(compiled code, where a bad input could crash the process instead of raising) runs the same cases
in a child process with a timeout, so a crash is a failure with its signal, not a lost run.
"""
from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import geomkern as gk
from _operator_specs import B, FIT, OFF, SPECS, X

CHILD = os.environ.get("GEOMKERN_HOSTILE_CHILD") == "1"
BACKEND = "native" if CHILD else "reference"
EXAMPLES = 40  # per op and process; ten times as many with --runslow; `make test-random` draws fresh ones
ROOT = Path(__file__).resolve().parents[2]


# ----- hostile values, by the kind of argument ------------------------------------------------
# A replacement is (label, value, refuse): refuse=True is a value no op may accept (NaN, a
# negative count, an unknown name...): returning anything for it fails the case, even a
# plausible result. refuse=False may end either way (a float16 X, a tensor gamma, steps=0).

def bad(label, value):
    return (label, value, True)


def ok(label, value):
    return (label, value, False)


def _matrices(t: torch.Tensor, *, empty_ok: bool = False, none_ok: bool = False):
    big = 1e30 if t.dtype == torch.float32 else 1e200
    out = [(bad, "rank-1", t[0]), (bad, "rank-3", t[None]), (bad, "int", t.long()), (bad, "bool", t > 0),
           (bad, "complex", t.to(torch.complex64)), (bad, "requires-grad", t.clone().requires_grad_()),
           (bad, "list", t.tolist()), (bad, "numpy", t.numpy()),
           (ok if empty_ok else bad, "empty", t[:0]), (ok if none_ok else bad, "none", None),
           (ok, "float16", t.half()), (ok, "bfloat16", t.bfloat16()), (ok, "float32", t.float()),
           (ok, "non-contiguous", t.mT.contiguous().mT if t.dim() > 1 else t.repeat(2)[::2]),
           (ok, "one-row", t[:1]), (ok, "tiny", t * 1e-30),
           (ok, "other-D", t[..., :-1] if t.shape[-1] > 1 else torch.cat([t, t], -1))]
    for label, v in (("nan", math.nan), ("inf", math.inf), ("-inf", -math.inf), ("overflow", big)):
        t2 = t.clone()
        t2.view(-1)[t2.numel() // 2] = v
        out.append((bad, label, t2))
    return [tag(label, v) for tag, label, v in out]


def _tagged(bads, oks):
    return [bad(repr(v)[:40], v) for v in bads] + [ok(repr(v)[:40], v) for v in oks]


GAMMAS = _tagged([0.0, -1.0, math.nan, math.inf, -math.inf, "0.5", None, True, torch.tensor([0.5, 0.5])],
                 [torch.tensor(0.5), 1e300, 1e-300, 3])
NAMES = _tagged(["fp8", "", None, "TF32X3", 3], ["ieee", "tf32"])
METHODS = _tagged(["magic", "", None, "GD", "coordinates"], ["fixed_point"])
LRS = _tagged([-1.0, 0.0, math.nan, math.inf, "0.1", torch.tensor(-0.1, dtype=torch.float64),
               torch.full((2,), 0.1, dtype=torch.float64)], [0.1, torch.tensor(0.1, dtype=torch.float64)])


def _counts(*, zero_ok: bool, huge_ok: bool = False):
    """Counts: 2^62 is refused as k (more than the rows) and as iters, n_init or steps (the work
    bound), not as a seed; 2^64 does not fit an int64 anywhere."""
    oks = [1, np.int64(2)] + [0] * zero_ok + [2 ** 62] * huge_ok
    return _tagged([-1, True, 2.5, "3", None, 2 ** 64] + [0] * (not zero_ok) + [2 ** 62] * (not huge_ok), oks)


def _offsets(n: int):
    h = n // 2
    return _tagged([torch.tensor([0, h, n], dtype=torch.int32), torch.tensor([0.0, h, n]), [0, h, n],
                    torch.tensor([0, n, h, n]), torch.tensor([0, h, h, n]), torch.tensor([0, h, n - 1]),
                    torch.tensor([[0, h, n]]), torch.tensor([1, h, n])],
                   [None, torch.tensor([0, n]), torch.tensor([0, h, n])])


def _segments(b: int):
    return _tagged([-1, 2, 0.5, True, "0", None, torch.zeros(b, dtype=torch.int32), torch.zeros(b + 1, dtype=torch.int64),
                    torch.full((b,), 2)], [1, torch.arange(b) % 2])


def _kinds(name: str, good: dict) -> dict:
    """Each argument that the harness changes, with its replacements."""
    kinds = {k: _matrices(v, empty_ok=(name, k) == ("kpca_transform", "Z"))
             for k, v in good.items() if isinstance(v, torch.Tensor)}
    kinds.update({"gamma": GAMMAS, "precision": NAMES})
    if name == "rbf_gram":
        kinds["Y"] = _matrices(SPECS["rbf_matmul"].good["Y"], none_ok=True)
    if name == "kmeans":
        del kinds["gamma"]
        kinds.update(k=_counts(zero_ok=False), iters=_counts(zero_ok=True), n_init=_counts(zero_ok=False),
                     seed=_counts(zero_ok=True, huge_ok=True), offsets=_offsets(good["X"].shape[0]))
    if name == "kpca_transform":
        del kinds["precision"]
        kinds["segment"] = _segments(good["Z"].shape[0])
    if name == "preimage":
        kinds.update(steps=_counts(zero_ok=True), method=METHODS, lr=LRS)
    return kinds


# Public ops that are not operators: a good call, the call, and each changed argument's replacements.
_A = torch.randn(6, 6, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
SPD = _A @ _A.T + torch.eye(6, dtype=torch.float64)
Y_LABELS = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1, 0, 0, 1, 1])
FUNCTIONS = {
    "kpca": (dict(X=X, offsets=OFF, n_components=2, gamma=0.5, solver="auto", precision="tf32x3"),
             lambda kw: gk.kpca(kw["X"], kw["offsets"], n_components=kw["n_components"], gamma=kw["gamma"],
                                solver=kw["solver"], precision=kw["precision"])),
    "eigh": (dict(A=SPD, k=3), lambda kw: gk.eigh(kw["A"], k=kw["k"])),
    "class_moments": (dict(X=X, y=Y_LABELS, n_classes=3), lambda kw: gk.class_moments(kw["X"], kw["y"], kw["n_classes"])),
    "project_onto_basis": (dict(X=X, fit=FIT, B=B, gamma=0.5, precision="tf32x3"),
                           lambda kw: gk.project_onto_basis(kw["X"], kw["fit"], kw["B"], gamma=kw["gamma"],
                                                            precision=kw["precision"])),
    "sqrtm_psd": (dict(A=SPD), lambda kw: gk.sqrtm_psd(kw["A"])),
    "median_gamma": (dict(X=X, max_points=2048, seed=0),
                     lambda kw: gk.median_gamma(kw["X"], max_points=kw["max_points"], seed=kw["seed"])),
}
# The Gaussian ops: a batch of 3 Gaussians in 4-D (batched and broadcasting, differentiable).
_G = torch.Generator().manual_seed(45)
_C = torch.randn(3, 4, 4, generator=_G, dtype=torch.float64)
COVS = _C @ _C.mT + 0.1 * torch.eye(4, dtype=torch.float64)
MEANS = torch.randn(3, 4, generator=_G, dtype=torch.float64)
# pool_moments: 2 clients x 3 classes of raw 3-D data, their class moments, and the pooled data
_RAW = [(torch.randn(9, 3, generator=_G, dtype=torch.float64) * (k + 1) + k, torch.tensor([0, 1, 2] * 3))
        for k in range(2)]
_RAW[1] = (_RAW[1][0][:7], _RAW[1][1][:7])  # unequal counts: 3, 3, 3 and 3, 2, 2
_M = [gk.class_moments(x, y, 3) for x, y in _RAW]
POOL_GOOD = dict(counts=torch.stack([m[0] for m in _M]), means=torch.stack([m[1] for m in _M]),
                 covs=torch.stack([m[2] for m in _M]))
POOLED_RAW = gk.class_moments(torch.cat([x for x, _ in _RAW]), torch.cat([y for _, y in _RAW]), 3)
FUNCTIONS.update({
    "gaussian_w2": (dict(m1=MEANS, S1=COVS, m2=MEANS.flip(0), S2=COVS.flip(0)),
                    lambda kw: gk.gaussian_w2(kw["m1"], kw["S1"], kw["m2"], kw["S2"])),
    "bures": (dict(S1=COVS, S2=COVS.flip(0)), lambda kw: gk.bures(kw["S1"], kw["S2"])),
    "gaussian_barycenter": (dict(weights=torch.tensor([0.2, 0.5, 0.3], dtype=torch.float64), means=MEANS, covs=COVS),
                            lambda kw: gk.gaussian_barycenter(kw["weights"], kw["means"], kw["covs"])),
    "pool_moments": (dict(POOL_GOOD), lambda kw: gk.pool_moments(kw["counts"], kw["means"], kw["covs"])),
    "preimage_loss": (dict(Z=SPECS["preimage"].good["Z0"], B=B, targets=SPECS["preimage"].good["targets"], gamma=0.5,
                           proj=None),
                      lambda kw: gk.preimage_loss(kw["Z"], kw["B"], kw["targets"], gamma=kw["gamma"], proj=kw["proj"])),
})
_BATCHED = ("rank-1", "rank-3", "requires-grad", "one-row")  # a batch that broadcasts, a gradient: valid here


def _function_kinds(name: str, good: dict) -> dict:
    kinds = {k: _matrices(v) for k, v in good.items() if isinstance(v, torch.Tensor) and v.is_floating_point()}
    if name == "kpca":
        kinds.update(gamma=GAMMAS, precision=NAMES, offsets=_offsets(good["X"].shape[0]),
                     n_components=_counts(zero_ok=False),
                     solver=_tagged(["magic", "", None, "DENSE", 3], ["dense", "subspace", "matrix_free"]))
    if name == "eigh":
        kinds["k"] = [r for r in _counts(zero_ok=False) if r[1] is not None] + [ok("None", None)]
        kinds["A"] = [ok(r[0], r[1]) if r[0] == "rank-3" else r for r in kinds["A"]]  # eigh is batched
        kinds["A"] += [bad("asymmetric", SPD + torch.triu(torch.ones_like(SPD), 1))]
    if name == "project_onto_basis":
        kinds.update(gamma=GAMMAS, precision=NAMES)
    if name == "sqrtm_psd":  # batched and differentiable
        kinds["A"] = [ok(r[0], r[1]) if r[0] in ("rank-3", "requires-grad") else r for r in kinds["A"]]
        kinds["A"] += [bad("negative-definite", -SPD)]
    if name == "class_moments":
        y = Y_LABELS
        kinds["n_classes"] = _counts(zero_ok=False)
        kinds["y"] = _tagged([y.double(), y.bool(), y + 3, y - 1, y[:-1], y.tolist(), None], [y.int(), y.to(torch.uint8)])
    if name in ("gaussian_w2", "bures"):
        for k in kinds:
            kinds[k] = [ok(*r[:2]) if r[0] in _BATCHED else r for r in kinds[k]]
        for k in ("S1", "S2"):
            kinds[k] += [bad("asymmetric", COVS + torch.triu(torch.ones_like(COVS), 1)), bad("indefinite", -COVS),
                         ok("other-size", COVS[..., :3, :3]), ok("rank-deficient", MEANS[:, :, None] * MEANS[:, None])]
    if name == "gaussian_w2":
        for k in ("m1", "m2"):
            kinds[k] = [r for r in kinds[k] if r[0] != "rank-1"] + [bad("scalar", MEANS[0, 0]), ok("one", MEANS[0])]
    if name == "gaussian_barycenter":  # K = 3 along dim 0; a batch behind it
        w = good["weights"]
        kinds = {k: [ok(*r[:2]) if r[0] == "requires-grad" else r for r in v] for k, v in kinds.items()
                 if k != "weights"}
        kinds["covs"] += [bad("asymmetric", COVS + torch.triu(torch.ones_like(COVS), 1)), bad("indefinite", -COVS),
                          ok("rank-deficient", MEANS[:, :, None] * MEANS[:, None] + COVS * 1e-3)]
        kinds["weights"] = _tagged([w.tolist(), -w, w - 0.25, w[:2], w.long(), w.bool(), w.to(torch.complex64),
                                    torch.tensor([0.2, math.nan, 0.3], dtype=torch.float64), w[None], None],
                                   [w * 7, w / 100, w.float(), torch.tensor([0.0, 1.0, 0.0], dtype=torch.float64),
                                    torch.zeros(3, dtype=torch.float64)])
    if name == "pool_moments":
        c = good["counts"]
        # the value checks first: the draws favour the ends of a list
        kinds["covs"] = [bad("asymmetric", good["covs"] + torch.triu(torch.ones_like(good["covs"]), 1)),
                         bad("indefinite", -good["covs"])] + [r for r in kinds["covs"] if r[0] != "other-D"] + [
            bad("other-D", good["covs"][..., :2, :2])]
        kinds["counts"] = _tagged([c.tolist(), -c, c[:1], c[0], c.double().fill_(math.nan), c * 2 ** 40, None],
                                  [c * 0, c.double() / 2, c.int(), torch.tensor([[3, 0, 3], [0, 2, 2]])])
    if name == "preimage_loss":
        kinds.update(gamma=GAMMAS, proj=_tagged([torch.eye(4, dtype=torch.float64), B, "proj"],
                                                [None, torch.eye(5, dtype=torch.float64)]))
    if name == "median_gamma":
        kinds["X"] = [r for r in kinds["X"] if r[0] != "one-row"] + [bad("one-row", X[:1]), bad("equal-rows", X[:1].repeat(4, 1))]
        # max_points bounds a subset: any size from 2 up is a size (2^64 too: no subset)
        kinds.update(max_points=[r if r[1] != 2 ** 64 else ok(r[0], r[1]) for r in _counts(zero_ok=False, huge_ok=True)]
                     + [bad("1", 1), ok("5", 5)],
                     seed=_counts(zero_ok=True, huge_ok=True))
    return kinds


@st.composite
def hostile_calls(draw, name: str):
    """(keywords of a public call, 'argument=replacement' labels, whether it must be refused)."""
    kw = dict(SPECS[name].good if name in SPECS else FUNCTIONS[name][0])
    kinds = _kinds(name, kw) if name in SPECS else _function_kinds(name, kw)
    changed = draw(st.lists(st.sampled_from(sorted(kinds)), min_size=1, max_size=2, unique=True))
    hostile = draw(st.booleans())  # else only values that may pass: half the cases reach a result check
    labels, refuse = [], False
    for arg in changed:
        pool = [r for r in kinds[arg] if r[2] == hostile] or kinds[arg]
        label, kw[arg], must = pool[draw(st.integers(0, len(pool) - 1))]
        labels.append(f"{arg}={label}")
        refuse |= must
    return kw, labels, refuse


# ----- what a correct result is ----------------------------------------------------------------

def _tol(dtype: torch.dtype) -> float:
    return {torch.float64: 1e-9, torch.float32: 2e-5, torch.float16: 4e-3, torch.bfloat16: 2e-2}[dtype]


def _gram64(A, Bm, gamma: float) -> torch.Tensor:
    A, Bm = A.double(), Bm.double()
    return torch.exp(-gamma * torch.cdist(A, Bm).square())


def _close(out: torch.Tensor, ref: torch.Tensor, scale: float, what: str):
    assert torch.isfinite(out).all(), f"{what}: non-finite result"
    err = float((out.double() - ref).norm())
    assert err <= _tol(out.dtype) * max(scale, 1e-300) * 4, f"{what}: error {err:.3g} against scale {scale:.3g}"


def _tr(M: torch.Tensor) -> torch.Tensor:
    return M.diagonal(dim1=-2, dim2=-1).sum(-1)


def _sqrtm64(A: torch.Tensor) -> torch.Tensor:
    """The symmetric PSD square root in float64 by eigendecomposition (negative round-off to 0)."""
    lam, U = torch.linalg.eigh(0.5 * (A + A.mT).double())
    return (U * lam.clamp_min(0).sqrt().unsqueeze(-2)) @ U.mT


def _check_result(name: str, kw: dict, out):
    gamma = float(kw["gamma"]) if "gamma" in kw else None
    if name == "rbf_gram":
        X, Y = kw["X"], kw["Y"]
        K = _gram64(X, X if Y is None else Y, gamma)
        assert out.shape == K.shape and out.dtype == X.dtype
        if kw.get("center"):
            n = K.shape[0]
            H = torch.eye(n, dtype=torch.float64) - 1.0 / n
            K = H @ K @ H
        _close(out, K, float(K.norm()) + 1.0, "rbf_gram")
    elif name == "rbf_matmul":
        K = _gram64(kw["X"], kw["Y"], gamma)
        V = kw["V"].double()
        assert out.shape == (kw["X"].shape[0], V.shape[1])
        _close(out, K @ V, float(K.norm() * V.norm()), "rbf_matmul")
    elif name == "kmeans":
        labels, centers = out
        X, k, off = kw["X"], int(kw["k"]), kw["offsets"]
        assert labels.shape == (X.shape[0],) and labels.dtype == torch.int64
        assert int(labels.min()) >= 0 and int(labels.max()) < k
        assert centers.shape == ((k, X.shape[1]) if off is None else (off.shape[0] - 1, k, X.shape[1]))
        assert torch.isfinite(centers).all() and torch.isfinite(out.inertia).all() and bool((out.inertia >= 0).all())
    elif name == "kpca_transform":
        fit, Z, X, seg = kw["fit"], kw["Z"], kw["X"], kw["segment"]
        seg = torch.full((Z.shape[0],), seg) if not isinstance(seg, torch.Tensor) else seg
        off = fit.offsets.tolist()
        ref = torch.empty(Z.shape[0], fit.n_components, dtype=torch.float64)
        for i in range(Z.shape[0]):
            j = int(seg[i])
            ref[i] = _gram64(Z[i:i + 1], X[off[j]:off[j + 1]], gamma)[0] @ fit.alphas[off[j]:off[j + 1]].double() \
                - fit.mean_projection[j].double()
        assert out.shape == ref.shape
        _close(out, ref, float(fit.alphas.double().norm()) * max(1, Z.shape[0]) ** 0.5, "kpca_transform")
    elif name == "kpca":
        Xd, off, d = kw["X"].double(), kw["offsets"], int(kw["n_components"])
        off = [0, Xd.shape[0]] if off is None else off.tolist()
        for j in range(len(off) - 1):
            K = _gram64(Xd[off[j]:off[j + 1]], Xd[off[j]:off[j + 1]], gamma)
            n = K.shape[0]
            H = torch.eye(n, dtype=torch.float64) - 1.0 / n
            mu = torch.linalg.eigvalsh(H @ K @ H).flip(0)[:d].clamp_min(0)
            _close(out.eigenvalues[j], mu, float(K.norm()), f"kpca cluster {j} eigenvalues")
    elif name == "eigh":
        vals, vecs = out
        A = kw["A"].double()
        k = A.shape[-1] if kw["k"] is None else int(kw["k"])
        _close(vals, torch.linalg.eigvalsh(A).flip(-1)[..., :k], float(A.norm()), "eigh eigenvalues")
        _close(vecs * vals.unsqueeze(-2), A @ vecs.double(), float(A.norm()), "eigh vectors")  # A v = lambda v
    elif name == "class_moments":
        counts, means, covs = out
        Xd, y, C = kw["X"].double(), kw["y"].long(), int(kw["n_classes"])
        assert torch.equal(counts, torch.bincount(y, minlength=C))
        for c in range(C):
            rows = Xd[y == c]
            if rows.shape[0]:
                mu = rows.mean(0)
                _close(means[c], mu, float(rows.norm()) + 1.0, "class_moments means")
                _close(covs[c], (rows - mu).T @ (rows - mu) / rows.shape[0], float(rows.norm()) ** 2 + 1.0,
                       "class_moments covariances")
    elif name == "project_onto_basis":
        fit, Xd, Bd = kw["fit"], kw["X"].double(), kw["B"].double()
        off = fit.offsets.tolist()
        for j in range(len(off) - 1):
            alphas = fit.alphas[off[j]:off[j + 1]].double()
            K = _gram64(Xd[off[j]:off[j + 1]], Bd, gamma)
            _close(out[j], alphas.T @ K, float(alphas.norm() * K.norm()), f"project_onto_basis cluster {j}")
    elif name == "sqrtm_psd":
        A, R = kw["A"].detach().double(), out.detach()
        _close(R @ R, A, float(A.norm()) * 10, "sqrtm_psd R @ R")
        _close(R, R.mT.double(), float(R.norm()), "sqrtm_psd symmetry")
    elif name == "median_gamma":
        Xd = kw["X"].double()
        assert Xd.shape[0] <= int(kw["max_points"]) or isinstance(out, float)
        if Xd.shape[0] <= int(kw["max_points"]):
            want = 1.0 / float(torch.quantile(torch.pdist(Xd).square(), 0.5))
            assert math.isclose(out, want, rel_tol=1e-9), f"median_gamma {out} != {want}"
    elif name in ("gaussian_w2", "bures"):
        S1, S2 = kw["S1"].detach().double(), kw["S2"].detach().double()
        ref = _tr(S1) + _tr(S2) - 2 * _tr(_sqrtm64(_sqrtm64(S1) @ S2 @ _sqrtm64(S1)))
        scale = float((_tr(S1) + _tr(S2)).abs().max())
        if name == "gaussian_w2":
            dm = kw["m1"].detach().double() - kw["m2"].detach().double()
            ref = ref + dm.square().sum(-1)
            scale += float(dm.square().sum(-1).max())
        assert out.shape == ref.shape, f"{name}: shape {tuple(out.shape)}, want {tuple(ref.shape)}"
        _close(out.detach(), ref, scale * max(1, ref.numel()) ** 0.5 * 10, name)
    elif name == "gaussian_barycenter":
        mean, S = out
        w = kw["weights"].double()
        means, covs = kw["means"].detach().double(), kw["covs"].detach().double()
        if float(w.sum()) == 0:
            assert not S.any() and not mean.any(), "gaussian_barycenter: all-zero weights must give zeros"
            return
        w = w / w.sum()
        _close(mean, (w[:, None] * means).sum(0), float(means.norm()), "gaussian_barycenter mean")
        # the barycentre is the fixed point S = sum_k w_k (S^1/2 C_k S^1/2)^1/2
        R = _sqrtm64(S.double())
        _close(S, (w[:, None, None] * _sqrtm64(R @ covs @ R)).sum(0), float(covs.norm()) * 10,
               "gaussian_barycenter fixed-point residual")
    elif name == "pool_moments":
        n, mu, cov = (t.double() for t in out)
        c, m, S = kw["counts"].double(), kw["means"].double(), kw["covs"].double()
        N = c.sum(0)
        ref_mu = torch.zeros_like(mu)
        ref_cov = torch.zeros_like(cov)
        for j in range(c.shape[1]):
            if N[j] > 0:
                ref_mu[j] = sum(c[k, j] * m[k, j] for k in range(c.shape[0])) / N[j]
                ref_cov[j] = sum(c[k, j] * (S[k, j] + torch.outer(m[k, j] - ref_mu[j], m[k, j] - ref_mu[j]))
                                 for k in range(c.shape[0])) / N[j]
        assert torch.equal(n, N), f"pool_moments counts {n} != {N}"
        _close(out[1], ref_mu, float(m.norm()) + 1e-300, "pool_moments means")
        _close(out[2], ref_cov, float(S.norm() + m.norm() ** 2) + 1e-300, "pool_moments covariances")
        if all(kw[k] is POOL_GOOD[k] for k in POOL_GOOD):  # the moments of the pooled raw data
            assert torch.equal(out[0], POOLED_RAW[0])
            _close(out[1], POOLED_RAW[1], float(POOLED_RAW[1].norm()), "pool_moments vs the raw data's means")
            _close(out[2], POOLED_RAW[2], float(POOLED_RAW[2].norm()), "pool_moments vs the raw data's covariances")
    elif name == "preimage_loss":
        k = _gram64(kw["Z"], kw["B"], gamma)
        r = k - kw["targets"].double() if kw["proj"] is None else k @ kw["proj"].double().T - kw["targets"].double()
        ref = r.square().sum(1)
        assert out.shape == ref.shape and out.dtype == kw["Z"].dtype
        _close(out, ref, float(ref.norm()) + float(k.norm()) ** 2 + 1.0, "preimage_loss")
    elif name == "preimage":
        assert out.shape == kw["Z0"].shape and out.dtype == kw["Z0"].dtype
        args = {k: (v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v) for k, v in kw.items()}
        with gk.set_backend("reference"):
            ref = SPECS["preimage"].public(args)
        _close(out, ref, float(ref.norm()), "preimage")


# ----- the operator form of a call --------------------------------------------------------------

def _fits(value, type_name: str) -> bool:
    """Whether ``value`` passes torch's schema parsing for an argument of type ``type_name``."""
    if type_name.startswith("Optional["):
        if value is None:
            return True
        type_name = type_name[len("Optional["):-1]
    if type_name == "Tensor":
        return isinstance(value, torch.Tensor)
    if type_name == "float":
        return type(value) in (float, int)
    if type_name == "int":
        return type(value) is int and -2 ** 63 <= value < 2 ** 63
    if type_name == "bool":
        return type(value) is bool
    if type_name == "str":
        return type(value) is str
    return False


def _operator_args(name: str, kw: dict):
    """The operator's arguments for this call, or None where a value does not fit its schema (the
    dispatcher refuses those before geomkern runs; the function is tested with them all the same)."""
    try:
        args = SPECS[name].operator_args(kw)
    except (AttributeError, TypeError):  # e.g. a fit that is not a KPCAFit: no operator form
        return None
    schema = getattr(torch.ops.geomkern, name).default._schema
    if all(_fits(a, str(s.type)) for a, s in zip(args, schema.arguments)):
        return args
    return None


def _outcome(fn):
    try:
        return fn(), None
    except Exception as exc:  # judged by the caller
        return None, exc


def _names(arg: str) -> str:
    return rf"(?<![A-Za-z0-9_]){re.escape(arg)}(?![A-Za-z0-9_])"


def _judge(name: str, kw: dict, labels: list, refuse: bool):
    """``labels``: 'argument=replacement' for each argument changed; ``refuse``: whether one of
    the replacements must be refused."""
    changed = labels
    args = [label.split("=", 1)[0] for label in labels]
    call = SPECS[name].public if name in SPECS else FUNCTIONS[name][1]
    out, exc = _outcome(lambda: call(kw))
    op_args = _operator_args(name, kw) if name in SPECS else None
    if exc is not None:
        assert type(exc) in (ValueError, TypeError), f"{name} {changed}: {type(exc).__name__}: {exc}"
        assert any(re.search(_names(a), str(exc)) for a in args), f"{name} {changed}: not named in: {exc}"
        if op_args is not None:
            _, op_exc = _outcome(lambda: getattr(torch.ops.geomkern, name)(*op_args))
            assert type(op_exc) is type(exc) and str(op_exc) == str(exc), \
                f"{name} {changed}: operator answered {type(op_exc).__name__}: {op_exc}; function: {exc}"
        return
    assert not refuse, f"{name} {changed}: accepted (returned a result instead of refusing)"
    _check_result(name, kw, out)
    if op_args is not None:
        op_out = getattr(torch.ops.geomkern, name)(*op_args)
        mine = list(out) if isinstance(out, tuple) else [out]
        theirs = list(op_out) if isinstance(op_out, (tuple, list)) else [op_out]
        if name == "kmeans" and kw["offsets"] is None:
            theirs = [theirs[0], theirs[1][0]]
        for a, b in zip(mine, theirs):
            assert torch.equal(a, b), f"{name} {changed}: the operator's result differs from the function's"


@pytest.mark.parametrize("name", sorted(SPECS) + sorted(FUNCTIONS))
def test_hostile_calls(name, request):
    examples = EXAMPLES * (10 if request.config.getoption("--runslow") else 1)

    @settings(max_examples=examples, deadline=None)  # the first calls import torch._dynamo
    @given(hostile_calls(name))
    def run(case):
        _judge(name, *case)

    with gk.set_backend(BACKEND):
        run()


@pytest.mark.skipif(CHILD, reason="the child itself")
@pytest.mark.skipif(bool(gk.why_not("native", "cpu")), reason="the native CPU backend is not built")
def test_hostile_calls_on_the_native_backend_in_a_child(request):
    """The same cases on the compiled CPU kernels, in a child process with a timeout: a crash
    (a signal) or a hang fails here with the child's output."""
    # the ops with a native CPU kernel (kpca_transform's body is torch; kpca's Grams run natively)
    native = " or ".join(f"[{n}]" for n in ("kmeans", "kpca", "preimage", "rbf_gram", "rbf_matmul"))
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", f"{__file__}::test_hostile_calls",
           "-k", native]
    cmd += ["--runslow"] * request.config.getoption("--runslow")
    env = {**os.environ, "GEOMKERN_HOSTILE_CHILD": "1"}
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the native-backend child hung (over {exc.timeout} s): {exc.stdout}")
    tail = (proc.stdout + proc.stderr)[-4000:]
    assert proc.returncode == 0, (f"native-backend child ended with {proc.returncode}"
                                  f"{' (killed by signal %d)' % -proc.returncode if proc.returncode < 0 else ''}:\n{tail}")
