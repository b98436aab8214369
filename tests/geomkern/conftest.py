"""The geomkern tests' fixtures: the backend a public-op test runs under, Triton's kernels under
its interpreter on CPU, and csrc/cuda's kernels under the host emulation. The tolerances, the
relative-error assertion and the oracle tables' entries are plain helpers in _oracle.py."""
from __future__ import annotations

import concurrent.futures
import multiprocessing
import os

import pytest

import geomkern as gk


@pytest.fixture
def backend(request):
    """Runs the test under the backend named by the (indirect) parameter, "reference" if none;
    parametrize with ``_oracle.entries(op)``: every backend built here that has the op."""
    name = getattr(request, "param", "reference")
    with gk.set_backend(name):
        yield name


@pytest.fixture(scope="session")
def emu_lib(tmp_path_factory) -> str:
    """csrc/cuda's kernels built against the host emulation (tests/_cuda_emu.py), once a session
    (tests that take it are generated only where g++ and the CUDA headers are: _oracle.entries)."""
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
