"""A pytest plugin that writes, per test, the CPU seconds of the test process itself and of the
children it waited for (resource.getrusage), and the wall time, to
$CPU_PROBE_DIR/cpu-<xdist worker>.jsonl; summarise.py --cpu-probe reads them. A child reaped
during another test (a session fixture's process pool) is counted in that test.

    CPU_PROBE_DIR=/tmp/probe PYTHONPATH=studies/test-time .venv/bin/python -m pytest -p cpuprof ...
"""
from __future__ import annotations

import json
import os
import resource
import time

import pytest

_out = None


def _cpu() -> tuple[float, float]:
    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    global _out
    if _out is None:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        _out = open(os.path.join(os.environ.get("CPU_PROBE_DIR", "."), f"cpu-{worker}.jsonl"), "a")
    s0, c0 = _cpu()
    t0 = time.monotonic()
    yield
    s1, c1 = _cpu()
    _out.write(json.dumps({"id": item.nodeid, "self": s1 - s0, "children": c1 - c0,
                           "wall": time.monotonic() - t0}) + "\n")
    _out.flush()
