"""Triton kernels vs the torch reference (eager and torch.compile) and named baselines, on one GPU.

Every case: float32 inputs, the same data for every provider, medians of CUDA-synchronised
calls, ratios only between providers of the same run (benchmarks/conftest.py). Where a provider
has an accuracy knob it is in the name ("tf32x3" = the default, three TF32 products at float32's
accuracy, timed first and compared with the torch baselines at "ieee"; "ieee" = full float32 dot
products, "tf32" = TF32 tensor cores; torch.matmul's TF32 switch is set to match).

  gram           4096 x 4096 RBF Gram at D = 512: triton rbf_gram (symmetric: tiles i <= j only;
                 and the cross form K(X, Y)) vs torch.matmul of the same shape (the GEMM ceiling),
                 eager cdist + exp, the reference (GEMM expansion + exp) eager and torch.compile'd.
  segmented      centred Grams of 30 clusters of 100..2000 points at D = 512: one triton launch
                 (segmented_gram) vs the reference's per-cluster gram_reference + double_center.
  projection     20,000 points in 20 clusters onto 512 basis points, d = 8: triton
                 project_onto_basis (K(X, B) never stored) vs projection_reference.
  preimage       50,000 points, S = 512, D = 512, 100 gradient steps: triton (all steps in one
                 launch) vs gd_reference eager and with its step torch.compile'd.
  rbf_matmul     K(X, Y) @ V, 20,000 x 20,000, D = 64, p = 16: triton vs the chunked reference
                 and pykeops (when importable).
One pytest-benchmark group per workload; accuracy against float64 (or against the eager float32
reference for the pre-image) is in extra_info and asserted: TOL by precision.
Run on a GPU machine: pytest benchmarks/test_triton_gpu.py --benchmark-only [--save-results DIR]
(--save-results: the summary with device name, versions and date). Skipped without CUDA.
"""
from __future__ import annotations

import contextlib

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(),
                       reason="GPU benchmark: needs a CUDA device (torch.cuda.is_available() is False)"),
]
triton = pytest.importorskip("triton", reason="triton is not importable here: pip install triton")

import geomkern as gk  # noqa: E402
from conftest import cuda_bench  # noqa: E402
from geomkern.backends.triton import kpca as tkpca  # noqa: E402
from geomkern.backends.triton import preimage as tpre  # noqa: E402
from geomkern.backends.triton import rbf as trbf  # noqa: E402
from geomkern.ops import kpca as rkpca  # noqa: E402
from geomkern.ops import preimage as rpre  # noqa: E402
from geomkern.ops import rbf as rrbf  # noqa: E402

SUITE = "triton_gpu"
DEV = "cuda"
ROUNDS = 5
# relative error bounds: float32's (tests/geomkern/_oracle.py TOL) for ieee and tf32x3; one TF32 pass
# measured 3.1e-3 (Gram) and 7.3e-4 (rbf_matmul) on an H100
TOL = {"ieee": 1e-5, "tf32x3": 1e-5, "tf32": 1e-2}


@contextlib.contextmanager
def _tf32(enabled: bool):
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old


def _base(precision: str) -> str:
    """The torch baselines' precision of the same accuracy class: tf32x3 meets float32's bound,
    like torch's full float32 ("ieee"); tf32 is one TF32 pass on both sides."""
    return "ieee" if precision == "tf32x3" else precision


def _bench(benchmark, group, fn, *args, rounds=ROUNDS):
    benchmark.group = f"{SUITE}: {group}"
    return cuda_bench(benchmark, fn, *args, rounds=rounds)


def _rel(out, ref, precision=None) -> float:
    """Norm-wise relative error; asserted within TOL[precision] when a precision is given."""
    err = float((out.double() - ref.double()).norm() / ref.double().norm())
    assert precision is None or err <= TOL[precision], f"[{precision}] relative error {err:.2e} > {TOL[precision]:g}"
    return err


def _gen(seed=0):
    return torch.Generator(device=DEV).manual_seed(seed)


# -------------------------------------------------------------------------------------- gram

N_GRAM, D_GRAM = 4096, 512
G_GRAM = "gram 4096 x 4096 x D512"


@pytest.fixture(scope="module")
def gram_data():
    X = torch.randn(N_GRAM, D_GRAM, generator=_gen(0), device=DEV) / D_GRAM ** 0.5
    Y = torch.randn(N_GRAM, D_GRAM, generator=_gen(1), device=DEV) / D_GRAM ** 0.5
    gamma = gk.median_gamma(X)
    return dict(X=X, Y=Y, gamma=gamma, exact=rrbf.gram_reference(X.double(), None, gamma, False))


@pytest.mark.parametrize("precision", ["ieee", "tf32"])
def test_gram_matmul_ceiling(benchmark, recorder, gram_data, precision):
    X = gram_data["X"]
    with _tf32(precision == "tf32"):
        _bench(benchmark, G_GRAM, torch.matmul, X, X.T)
    recorder.add(f"gram: torch.matmul 4096x512x4096 [{precision}]", benchmark,
                 tflops=2 * N_GRAM * N_GRAM * D_GRAM / benchmark.stats.stats.median / 1e12)


@pytest.mark.parametrize("precision", ["ieee", "tf32"])
def test_gram_reference_eager(benchmark, recorder, gram_data, precision):
    X, g = gram_data["X"], gram_data["gamma"]
    with _tf32(precision == "tf32"):
        K = _bench(benchmark, G_GRAM, rrbf.gram_reference, X, None, g, False)
    recorder.add(f"gram: reference eager [{precision}]", benchmark,
                 rel_err=_rel(K, gram_data["exact"], precision))


def test_gram_cdist_exp(benchmark, recorder, gram_data):
    X, g = gram_data["X"], gram_data["gamma"]
    K = _bench(benchmark, G_GRAM, lambda: torch.exp(-g * torch.cdist(X, X).square()))
    recorder.add("gram: eager cdist + exp", benchmark, rel_err=_rel(K, gram_data["exact"], "ieee"))


@pytest.mark.parametrize("precision", ["ieee", "tf32"])
def test_gram_torch_compile(benchmark, recorder, gram_data, precision):
    X, g = gram_data["X"], gram_data["gamma"]
    compiled = torch.compile(rrbf.gram_reference)
    with _tf32(precision == "tf32"):
        compiled(X, None, g, False)  # compile outside the timing
        K = _bench(benchmark, G_GRAM, compiled, X, None, g, False)
    recorder.add(f"gram: torch.compile(reference) [{precision}]", benchmark,
                 rel_err=_rel(K, gram_data["exact"], precision))


@pytest.mark.parametrize("precision", ["tf32x3", "ieee", "tf32"])  # the default first
@pytest.mark.parametrize("form", ["symmetric", "cross"])
def test_gram_triton(benchmark, recorder, gram_data, form, precision):
    X, g = gram_data["X"], gram_data["gamma"]
    Y = None if form == "symmetric" else gram_data["Y"]
    K = _bench(benchmark, G_GRAM, trbf.rbf_gram, X, Y, g, False, precision)
    name = f"gram: triton rbf_gram {form} [{precision}]"
    extra = {"rel_err": _rel(K, gram_data["exact"], precision)} if form == "symmetric" else {}
    recorder.add(name, benchmark, **extra)
    recorder.ratio(f"gram {form} [{precision}]: triton vs reference eager",
                   f"gram: reference eager [{_base(precision)}]", name)
    recorder.ratio(f"gram {form} [{precision}]: triton vs torch.compile(reference)",
                   f"gram: torch.compile(reference) [{_base(precision)}]", name)
    recorder.ratio(f"gram {form} [{precision}]: triton vs eager cdist + exp",
                   "gram: eager cdist + exp", name)
    recorder.ratio(f"gram {form} [{precision}]: triton vs the bare GEMM (>1: faster than matmul)",
                   f"gram: torch.matmul 4096x512x4096 [{_base(precision)}]", name)


# ----------------------------------------------------------------------------- segmented Grams

G_SEG = "segmented centred Grams, 30 clusters of 100..2000 x D512"
G_KPCA = "kpca dense, 30 clusters"


@pytest.fixture(scope="module")
def segmented_data():
    sizes = torch.linspace(100, 2000, 30).round().long()
    X = torch.randn(int(sizes.sum()), 512, generator=_gen(2), device=DEV) / 512 ** 0.5
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), sizes.cumsum(0)]).to(DEV)
    return dict(X=X, offsets=offsets, gamma=gk.median_gamma(X))


def _reference_centred_grams(X, offsets, gamma):
    off = offsets.tolist()
    return [rrbf.double_center(rrbf.gram_reference(X[off[j]:off[j + 1]], None, gamma, False))
            for j in range(len(off) - 1)]


def test_segmented_reference(benchmark, recorder, segmented_data):
    _bench(benchmark, G_SEG, _reference_centred_grams, segmented_data["X"], segmented_data["offsets"],
           segmented_data["gamma"])
    recorder.add("segmented: reference per cluster (30 centred Grams)", benchmark)


@pytest.mark.parametrize("precision", ["tf32x3", "ieee", "tf32"])  # the default first
def test_segmented_triton(benchmark, recorder, segmented_data, precision):
    _bench(benchmark, G_SEG, tkpca.segmented_gram, segmented_data["X"], segmented_data["offsets"],
           segmented_data["gamma"], True, precision)
    name = f"segmented: triton segmented_gram, one launch [{precision}]"
    recorder.add(name, benchmark)
    recorder.ratio(f"segmented [{precision}]: triton vs reference",
                   "segmented: reference per cluster (30 centred Grams)", name)


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_kpca_end_to_end(benchmark, recorder, segmented_data, backend):
    with gk.set_backend(backend):
        _bench(benchmark, G_KPCA, lambda: gk.kpca(segmented_data["X"], segmented_data["offsets"],
                                          n_components=8, gamma=segmented_data["gamma"],
                                          solver="dense"), rounds=3)
    recorder.add(f"kpca dense, 30 clusters [{backend}]", benchmark)
    recorder.ratio("kpca dense: triton Grams vs reference", "kpca dense, 30 clusters [reference]",
                   "kpca dense, 30 clusters [triton]")


# ---------------------------------------------------------------------------------- projection

G_PROJ = "projection 20,000 x 512 basis, d 8"


@pytest.fixture(scope="module")
def projection_data():
    X = torch.randn(20000, 512, generator=_gen(3), device=DEV) / 512 ** 0.5
    offsets = torch.arange(0, 20001, 1000, device=DEV)
    alphas = torch.randn(20000, 8, generator=_gen(4), device=DEV)
    B = torch.randn(512, 512, generator=_gen(5), device=DEV) / 512 ** 0.5
    return dict(X=X, offsets=offsets, alphas=alphas, B=B, gamma=gk.median_gamma(B))


def test_projection_reference(benchmark, recorder, projection_data):
    d = projection_data
    _bench(benchmark, G_PROJ, rkpca.projection_reference, d["X"], d["alphas"], d["offsets"], d["B"], d["gamma"])
    recorder.add("projection: reference (per cluster K then GEMM)", benchmark)


@pytest.mark.parametrize("precision", ["tf32x3", "ieee", "tf32"])  # the default first
def test_projection_triton(benchmark, recorder, projection_data, precision):
    d = projection_data
    _bench(benchmark, G_PROJ, tkpca.project_onto_basis, d["X"], d["alphas"], d["offsets"], d["B"],
           d["gamma"], precision)
    name = f"projection: triton, K never stored [{precision}]"
    recorder.add(name, benchmark)
    recorder.ratio(f"projection [{precision}]: triton vs reference",
                   "projection: reference (per cluster K then GEMM)", name)


# ------------------------------------------------------------------------------------ pre-image

N_PRE, S_PRE, D_PRE, STEPS = 50000, 512, 512, 100
G_PRE = "preimage gd 50,000 x S512 x D512, 100 steps"


@pytest.fixture(scope="module")
def preimage_data():
    B = torch.randn(S_PRE, D_PRE, generator=_gen(6), device=DEV) / D_PRE ** 0.5
    gamma = gk.median_gamma(B)
    idx = torch.randint(0, S_PRE, (N_PRE,), generator=_gen(7), device=DEV)
    x = B[idx] + 0.3 * torch.randn(N_PRE, D_PRE, generator=_gen(8), device=DEV) / D_PRE ** 0.5
    T = gk.rbf_gram(x, B, gamma=gamma)
    Z0 = x + 0.05 * torch.randn(N_PRE, D_PRE, generator=_gen(9), device=DEV) / D_PRE ** 0.5
    return dict(Z0=Z0, B=B, T=T, gamma=gamma, lr=rpre.default_gd_lr(Z0, B, gamma))


def _gd_step(z, t, step, B, gamma: float):
    k = torch.exp(rrbf._sqdist(z, B).mul_(-gamma))
    w = (k - t).mul_(k)
    return z + step * (w.sum(1, keepdim=True) * z - w @ B)


def _gd_with(step_fn, Z0, B, T, gamma, steps, lr):
    """gd_reference's loop (chunks of 4096 points) around a given step function."""
    out = torch.empty_like(Z0)
    for i in range(0, Z0.shape[0], 4096):
        z, t = Z0[i:i + 4096], T[i:i + 4096]
        step = (4.0 * gamma * lr[i:i + 4096]).unsqueeze(1)
        for _ in range(steps):
            z = step_fn(z, t, step, B, gamma)
        out[i:i + 4096] = z
    return out


def test_preimage_reference_eager(benchmark, recorder, preimage_data):
    d = preimage_data
    _bench(benchmark, G_PRE, rpre.gd_reference, d["Z0"], d["B"], d["T"], d["gamma"], STEPS, d["lr"], rounds=3)
    recorder.add("preimage gd: reference eager", benchmark)


def test_preimage_reference_compiled(benchmark, recorder, preimage_data):
    d = preimage_data
    step = torch.compile(_gd_step, dynamic=False)
    args = (d["Z0"], d["B"], d["T"], d["gamma"], STEPS, d["lr"])
    _gd_with(step, *args)  # compile (both chunk shapes) outside the timing
    Z = _bench(benchmark, G_PRE, _gd_with, step, *args, rounds=3)
    recorder.add("preimage gd: reference, torch.compile'd step", benchmark,
                 rel_diff_vs_eager=_rel(Z, rpre.gd_reference(*args), "ieee"))


@pytest.mark.parametrize("precision", ["tf32x3", "ieee", "tf32"])  # the default first
def test_preimage_triton(benchmark, recorder, preimage_data, precision):
    d = preimage_data
    args = (d["Z0"], d["B"], d["T"], d["gamma"], STEPS, d["lr"])
    Z = _bench(benchmark, G_PRE, tpre.preimage_gd, *args, precision, rounds=3)
    name = f"preimage gd: triton, all steps in one launch [{precision}]"
    loss = rpre.preimage_loss(Z, d["B"], d["T"], gamma=d["gamma"])
    recorder.add(name, benchmark, rel_diff_vs_eager=_rel(Z, rpre.gd_reference(*args), precision),
                 mean_final_loss=float(loss.mean()))
    recorder.ratio(f"preimage [{precision}]: triton vs reference eager",
                   "preimage gd: reference eager", name)
    recorder.ratio(f"preimage [{precision}]: triton vs torch.compile'd reference",
                   "preimage gd: reference, torch.compile'd step", name)


# ----------------------------------------------------------------------------------- rbf_matmul

G_MM = "rbf_matmul 20,000 x 20,000 x D64, p 16"


@pytest.fixture(scope="module")
def matmul_data():
    X = torch.randn(20000, 64, generator=_gen(10), device=DEV) / 8.0
    Y = torch.randn(20000, 64, generator=_gen(11), device=DEV) / 8.0
    V = torch.randn(20000, 16, generator=_gen(12), device=DEV)
    return dict(X=X, Y=Y, V=V, gamma=gk.median_gamma(Y))


def test_rbf_matmul_reference(benchmark, recorder, matmul_data):
    d = matmul_data
    _bench(benchmark, G_MM, rrbf.rbf_matmul_reference, d["X"], d["Y"], d["V"], d["gamma"])
    recorder.add("rbf_matmul: reference (chunked K then GEMM)", benchmark)


@pytest.mark.parametrize("precision", ["tf32x3", "ieee", "tf32"])  # the default first
def test_rbf_matmul_triton(benchmark, recorder, matmul_data, precision):
    d = matmul_data
    out = _bench(benchmark, G_MM, trbf.rbf_matmul, d["X"], d["Y"], d["V"], d["gamma"], precision)
    name = f"rbf_matmul: triton, K never stored [{precision}]"
    recorder.add(name, benchmark, rel_err=_rel(out, rrbf.rbf_matmul_reference(
        d["X"].double(), d["Y"].double(), d["V"].double(), d["gamma"]), precision))
    recorder.ratio(f"rbf_matmul [{precision}]: triton vs reference",
                   "rbf_matmul: reference (chunked K then GEMM)", name)
    recorder.ratio(f"rbf_matmul [{precision}]: triton vs pykeops", "rbf_matmul: pykeops", name)


def test_rbf_matmul_pykeops(benchmark, recorder, matmul_data):
    keops = pytest.importorskip("pykeops.torch", reason="pykeops is not importable here")
    d = matmul_data
    x = keops.LazyTensor(d["X"][:, None, :])
    y = keops.LazyTensor(d["Y"][None, :, :])
    K = (-d["gamma"] * ((x - y) ** 2).sum(-1)).exp()
    _bench(benchmark, G_MM, lambda: K @ d["V"])
    recorder.add("rbf_matmul: pykeops", benchmark)
