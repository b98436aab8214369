"""Shared test helpers: per-dtype tolerances, a relative-error assertion that says where it failed,
a printed random seed per test, the ``--runslow`` / ``--seed`` options and the ``gpu`` skip.

Seeds. By default (``make test``, CI) every test's random inputs are fixed: the ``seed`` fixture
gives each test its own seed, derived from its node id (so a parametrized case has its own), the
global torch / NumPy / ``random`` generators are seeded with it before each test, and hypothesis
runs derandomized (the same examples every run). A red run is then a change in the code, never a
draw. ``--random-seeds`` (``make test-random``, opt-in) draws a fresh seed per test and random
hypothesis examples instead, to look for inputs the fixed seeds miss. Either way the seed is
printed (pytest shows captured output of failing tests); rerun with ``--seed=<that seed>``.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import importlib.util
import multiprocessing
import os
import random
import secrets
import zlib

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, settings

import geomkern as gk

# Relative error bounds per dtype, for ops whose float64 oracle is exact (docs/design.md conventions):
# float32 outputs are compared with the float64 oracle evaluated on the same float32-rounded inputs.
TOL = {torch.float64: 1e-10, torch.float32: 1e-5}
# float16/bfloat16 results are rounded to the storage format: unit roundoff 2^-11 and 2^-8, so twice
# that bounds the norm-wise error of a result computed in float32 and rounded once.
HALF_TOL = {torch.float16: 2 * 2.0 ** -11, torch.bfloat16: 2 * 2.0 ** -8}
FLOATS = (torch.float64, torch.float32)
SIZES = (1, 7, 33, 257)

_PROFILE = dict(max_examples=15, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                       HealthCheck.data_too_large])
settings.register_profile("geomkern", derandomize=True, database=None, **_PROFILE)
settings.register_profile("geomkern-random", **_PROFILE)
settings.load_profile("geomkern")

CUDA = torch.cuda.is_available()
DEVICES = ("cpu", pytest.param("cuda", marks=pytest.mark.gpu))


def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true", default=False,
                     help="also run tests marked slow")
    parser.addoption("--seed", action="store", type=int, default=None,
                     help="seed for the `seed` fixture (reproduce a failure printed by a test)")
    parser.addoption("--random-seeds", action="store_true", default=False,
                     help="a fresh random seed per test and random hypothesis examples, instead of "
                          "the fixed ones CI runs (make test-random); failures print their seed")


def pytest_configure(config):
    if config.getoption("--random-seeds"):
        settings.load_profile("geomkern-random")


def pytest_collection_modifyitems(config, items):
    skip_slow = pytest.mark.skip(reason="slow test: opt in with --runslow")
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device (torch.cuda.is_available() is False)")
    for item in items:
        if "slow" in item.keywords and not config.getoption("--runslow"):
            item.add_marker(skip_slow)
        if "gpu" in item.keywords and not CUDA:
            item.add_marker(skip_gpu)


def _test_seed(request) -> int:
    """This test's seed: ``--seed``, else a fresh one with ``--random-seeds``, else fixed: a CRC
    of the test's node id (stable across runs and machines, distinct per parametrized case).
    Drawn once per test and cached on its node, so every fixture of the test sees the same one."""
    node = request.node
    if not hasattr(node, "_geomkern_seed"):
        s = request.config.getoption("--seed")
        if s is None:
            s = (secrets.randbits(31) if request.config.getoption("--random-seeds")
                 else zlib.crc32(node.nodeid.encode()) & 0x7FFFFFFF)
        node._geomkern_seed = s
    return node._geomkern_seed


@pytest.fixture(autouse=True)
def _seed_global_generators(request):
    """Every test starts from its own seed in torch's, NumPy's and Python's global generators, so
    a test that draws without an explicit generator is as reproducible as one that takes ``seed``."""
    s = _test_seed(request)
    torch.manual_seed(s)
    np.random.seed(s)
    random.seed(s)


@pytest.fixture
def seed(request) -> int:
    """This test's seed (see the module docstring), printed so a failure can be replayed."""
    s = _test_seed(request)
    print(f"[geomkern tests] {request.node.nodeid}: seed={s} (rerun with --seed={s})")
    return s


@pytest.fixture
def gen(seed) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.fixture
def rng(seed) -> np.random.Generator:
    return np.random.default_rng(seed)


def triton_entries() -> list:
    """The oracle tables' two Triton entries: the kernels under the interpreter on CPU tensors,
    and compiled on a GPU (GPU-marked); both skipped where triton does not import."""
    no_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                   reason="triton is not importable here: pip install triton")
    return [pytest.param("triton-cpu", id="triton-cpu", marks=no_triton),
            pytest.param("triton-cuda", id="triton-cuda", marks=[no_triton, pytest.mark.gpu])]


def no_native(op: str):
    """Skip mark for an oracle table's native entries where geomkern._C has no kernel for ``op``."""
    built = "native" in gk.available_backends() and "native" in gk.registered_ops().get(op, ())
    return pytest.mark.skipif(not built, reason="geomkern._C (native CPU kernels) is not built")


def backends_for(*ops: str) -> list[str]:
    """The reference plus every backend built here that implements one of ``ops``: parametrize an
    oracle test with these (indirectly, through the ``backend`` fixture) so the same oracle table
    drives every backend."""
    reg = gk.registered_ops()
    return [b for b in gk.available_backends()
            if b == "reference" or any(b in reg.get(op, ()) for op in ops)]


@pytest.fixture
def backend(request):
    """Runs the test under the backend named by the (indirect) parameter, "reference" if none."""
    name = getattr(request, "param", "reference")
    with gk.set_backend(name):
        yield name


def _np64(a) -> np.ndarray:
    if isinstance(a, torch.Tensor):
        return a.detach().to("cpu", torch.float64).numpy()
    return np.asarray(a, dtype=np.float64)


def rel_error(out, ref) -> float:
    """Norm-wise relative error |out - ref| / |ref| (absolute when ref is all zero)."""
    o, r = _np64(out), _np64(ref)
    den = np.linalg.norm(r)
    num = np.linalg.norm(o - r)
    return float(num / den) if den > 0 else float(num)


def assert_close_rel(out, ref, tol: float, name: str = "output") -> None:
    """Assert |out - ref| / |ref| <= tol (norm-wise; absolute when ref == 0).

    Reports the relative error, the largest absolute error and where it is, the first index
    whose error exceeds tol * max|ref|, and any NaN/Inf that appears in only one of the two.
    """
    o, r = _np64(out), _np64(ref)
    assert o.shape == r.shape, f"{name}: shape {o.shape} != reference shape {r.shape}"
    bad_o, bad_r = ~np.isfinite(o), ~np.isfinite(r)
    if (bad_o != bad_r).any():
        idx = np.argwhere(bad_o != bad_r)
        first = tuple(int(i) for i in idx[0])
        raise AssertionError(
            f"{name}: NaN/Inf mismatch at {len(idx)} position(s), first {first}: "
            f"out={float(o[first])!r}, ref={float(r[first])!r}")
    if bad_r.any():  # both non-finite at the same places: those must agree exactly
        same = (o[bad_r] == r[bad_r]) | (np.isnan(o[bad_r]) & np.isnan(r[bad_r]))
        assert same.all(), f"{name}: non-finite values differ"
        o, r = np.where(bad_r, 0.0, o), np.where(bad_r, 0.0, r)
    err = rel_error(o, r)
    if not err <= tol:
        diff = np.abs(o - r)
        worst = tuple(int(i) for i in np.unravel_index(int(np.argmax(diff)), diff.shape))
        scale = np.abs(r).max() if r.size else 0.0
        over = np.argwhere(diff > tol * max(scale, np.finfo(np.float64).tiny))
        first = tuple(int(i) for i in over[0]) if len(over) else None
        msg = (f"{name}: relative error {err:.3e} > tol {tol:.1e}; max |out-ref| = "
               f"{diff.max():.3e} at {worst} (out={float(o[worst])!r}, ref={float(r[worst])!r}); "
               f"{len(over)} element(s) off by more than tol*max|ref|")
        if first is not None:
            msg += f", first at {first} (out={float(o[first])!r}, ref={float(r[first])!r})"
        raise AssertionError(msg)


def match_signs(out, ref) -> np.ndarray:
    """Per-column signs s (+-1) so that out * s best matches ref (columns along the last axis...
    of 2-D (rows, components) arrays). Columns that are zero in either keep +1."""
    o, r = _np64(out), _np64(ref)
    s = np.sign((o * r).sum(0))
    s[s == 0] = 1.0
    return s


def offsets_from_sizes(sizes) -> torch.Tensor:
    off = [0]
    for s in sizes:
        off.append(off[-1] + int(s))
    return torch.tensor(off, dtype=torch.int64)


@contextlib.contextmanager
def interrupted_after(monkeypatch, runner_module, rounds: int):
    """Inside the block, fedsim's round loop stops with a KeyboardInterrupt (a user's Ctrl-C) in
    round ``rounds``, after ``rounds`` rounds were checkpointed: ``runner_module.evaluate`` raises
    on its call number ``rounds + 1``. The real evaluate is back after the block."""
    real, calls = runner_module.evaluate, {"n": 0}

    def crash(*a, **k):
        calls["n"] += 1
        if calls["n"] == rounds + 1:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(runner_module, "evaluate", crash)
    try:
        yield
    finally:
        monkeypatch.setattr(runner_module, "evaluate", real)


def client_statistics(K=9, C=5, D=12, seed=0):
    """K clients' ggeur.ClassStatistics; some classes held by nobody, some clients without rows."""
    from geomkern import ggeur

    g = torch.Generator().manual_seed(seed)
    out = []
    for k in range(K):
        n = 0 if k == 3 else int(torch.randint(2, 30, (1,), generator=g))
        y = torch.randint(0, C - 1, (n,), generator=g)  # class C-1: held by nobody
        x = torch.randn(n, D, generator=g) + y.unsqueeze(1).float()
        out.append(ggeur.local_statistics(x, y, C))
    return out


def save_blobs(path, *, classes: int, dim: int, noise: float, n_train: int, n_test: int, seed: int,
               domain_names=None):
    """A fedsim dataset file of unit-norm Gaussian blobs: one mean per class (shared by both
    splits), each row mean + noise * N(0, I), L2-normalised; with ``domain_names`` every row also
    gets a uniformly drawn domain. Returns ``path``."""
    from fedsim.data import Dataset, save_dataset

    g = torch.Generator().manual_seed(seed)
    mu = torch.randn(classes, dim, generator=g)

    def make(n):
        y = torch.randint(0, classes, (n,), generator=g)
        x = mu[y] + noise * torch.randn(n, dim, generator=g)
        d = None if domain_names is None else torch.randint(0, len(domain_names), (n,), generator=g)
        return x / x.norm(dim=1, keepdim=True), y, d

    (xt, yt, dt), (xs, ys, ds) = make(n_train), make(n_test)
    save_dataset(Dataset("blobs", xt, yt, xs, ys, [f"c{i}" for i in range(classes)], d_train=dt, d_test=ds,
                         domain_names=[] if domain_names is None else list(domain_names)), path)
    return path


@pytest.fixture(scope="session")
def emu_lib(tmp_path_factory) -> str:
    """csrc/cuda's kernels built against the host emulation (tests/_cuda_emu.py), once a session;
    skips where g++ or the CUDA headers are missing."""
    import _cuda_emu

    if _cuda_emu.UNAVAILABLE:
        pytest.skip(_cuda_emu.UNAVAILABLE)
    return _cuda_emu.build(tmp_path_factory.mktemp("cuda_emu"))


# Triton's CPU cases: the kernels must be decorated in interpreter mode, so they run in one spawned
# worker started with TRITON_INTERPRET=1 (tests/geomkern/test_triton.py's docstring says why);
# shared by test_triton.py and the oracle tables that take Triton as one of their backends.
@pytest.fixture(scope="session")
def _triton_interpreter_worker():
    """One spawned process that imports geomkern with TRITON_INTERPRET=1 (inherited from the
    environment at spawn: the kernels must be decorated in interpreter mode)."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        yield None
        return
    old = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        pool = concurrent.futures.ProcessPoolExecutor(
            max_workers=1, mp_context=multiprocessing.get_context("spawn"))
        pool.submit(os.getpid).result()  # start it now, while the variable is set
    finally:
        if old is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = old
    yield pool
    pool.shutdown()


@pytest.fixture
def triton_run(_triton_interpreter_worker):
    """run(check, device, *args): the check on CUDA here, on CPU in the interpreter worker."""

    def _run(check, device, *args):
        if device == "cpu" and _triton_interpreter_worker is not None:
            return _triton_interpreter_worker.submit(check, device, *args).result()
        return check(device, *args)

    return _run
