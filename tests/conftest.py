"""What every test shares: a printed random seed per test, the ``--runslow`` / ``--seed`` /
``--random-seeds`` options and the ``slow`` / ``gpu`` marks. What only one part of the suite uses
lives beside it: tests/geomkern/conftest.py (the backend, Triton-interpreter and CUDA-emulation
fixtures), tests/geomkern/_oracle.py (tolerances, the relative-error assertion, the oracle
tables), tests/fedsim/_fedsim_helpers.py (fedsim's data files and interrupted runs), and
tests/_ggeur_clients.py (GGEUR client statistics, which both folders use).

Seeds. By default (``make test``, CI) every test's random inputs are fixed: the ``seed`` fixture
gives each test its own seed, derived from its node id (so a parametrized case has its own), the
global torch / NumPy / ``random`` generators are seeded with it before each test, and hypothesis
runs derandomized (the same examples every run). A red run is then a change in the code, never a
draw. ``--random-seeds`` (``make test-random``, opt-in) draws a fresh seed per test and random
hypothesis examples instead, to look for inputs the fixed seeds miss. Either way the seed is
printed (pytest shows captured output of failing tests); rerun with ``--seed=<that seed>``.
"""
from __future__ import annotations

import random
import secrets
import zlib

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, settings

_PROFILE = dict(max_examples=15, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                       HealthCheck.data_too_large])
settings.register_profile("geomkern", derandomize=True, database=None, **_PROFILE)
settings.register_profile("geomkern-random", **_PROFILE)
settings.load_profile("geomkern")

CUDA = torch.cuda.is_available()


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
    """``slow`` tests skip unless --runslow. ``gpu`` tests are left out (deselected) where there is
    no CUDA device, as the oracle tables leave out their CUDA entries there (tests/geomkern/
    _oracle.py): an id that cannot run here is not run, and scripts/gpu_session.sh runs them all
    (``-m gpu``) on a GPU machine. ``early`` tests (a build, a deployment, child runs of a minute)
    and ``xdist_group`` ones (they share an expensive module fixture) come first, the rest in their
    order: ``make test`` spreads the suite over pytest-xdist's workers in collection order, and a
    long test handed out last would be the run's tail."""
    def late(item):
        return item.get_closest_marker("early") is None and item.get_closest_marker("xdist_group") is None
    items.sort(key=late)  # stable: the rest keep their order
    skip_slow = pytest.mark.skip(reason="slow test: opt in with --runslow")
    for item in items:
        if item.get_closest_marker("slow") and not config.getoption("--runslow"):
            item.add_marker(skip_slow)
    if not CUDA:
        gpu = [item for item in items if item.get_closest_marker("gpu")]
        if gpu:
            config.hook.pytest_deselected(items=gpu)
            items[:] = [item for item in items if not item.get_closest_marker("gpu")]


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
