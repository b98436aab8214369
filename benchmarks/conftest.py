"""Shared benchmark plumbing: each test records its median time under a named provider, and the
session ends by printing ratio tables and writing benchmarks/results/<suite>-<machine>.json.
Ratios are only ever taken between providers measured in the same run."""
from __future__ import annotations

import datetime as _dt
import json
import os
import platform
from pathlib import Path

import pytest

_RESULTS: dict[str, dict] = {}
_RATIOS: dict[str, list[tuple[str, str, str]]] = {}


def machine_info() -> dict:
    import numpy
    import scipy
    import sklearn
    import torch

    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "scipy": scipy.__version__,
        "sklearn": sklearn.__version__,
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
    }
    import geomkern

    info["geomkern"] = geomkern.__version__
    info["geomkern_backends"] = geomkern.available_backends()
    return info


def cuda_bench(benchmark, fn, *args, rounds: int = 5):
    """pytest-benchmark of ``fn(*args)`` with a CUDA synchronise inside every timed call (one
    warm-up round), so asynchronous launches are timed to completion. Returns fn's result."""
    import torch

    def call():
        out = fn(*args)
        torch.cuda.synchronize()
        return out

    return benchmark.pedantic(call, rounds=rounds, warmup_rounds=1)


class Recorder:
    def __init__(self, suite: str):
        self.suite = suite
        _RESULTS.setdefault(suite, {})
        _RATIOS.setdefault(suite, [])
        self._rounds: dict[str, list[float]] = {}

    def add(self, provider: str, benchmark, **extra):
        stats = benchmark.stats.stats
        _RESULTS[self.suite][provider] = {"median_s": stats.median, "min_s": stats.min,
                                          "rounds": stats.rounds, **extra}

    def add_round(self, provider: str, seconds: float, **extra):
        """One round of ``provider`` (tests that interleave providers round by round: each
        round its own pytest-benchmark test); the table shows the median over its rounds."""
        import statistics

        times = self._rounds.setdefault(provider, [])
        times.append(seconds)
        _RESULTS[self.suite][provider] = {"median_s": statistics.median(times), "min_s": min(times),
                                          "rounds": len(times), **extra}

    def ratio(self, label: str, slow: str, fast: str):
        """Report slow/fast (how many times faster ``fast`` is than ``slow``)."""
        _RATIOS[self.suite].append((label, slow, fast))


def pytest_addoption(parser):
    parser.addoption("--threads", type=int, default=None,
                     help="torch.set_num_threads for the benchmarks that read it (test_cpu_floor.py: default 2)")


@pytest.fixture(scope="module")
def recorder(request):
    return Recorder(request.module.SUITE)


def pytest_terminal_summary(terminalreporter):
    if not _RESULTS:
        return
    out_dir = Path(__file__).parent / "results"
    out_dir.mkdir(exist_ok=True)
    info = machine_info()
    for suite, res in _RESULTS.items():
        tr = terminalreporter
        tr.section(f"{suite}: medians and ratios (same run)")
        for name, r in res.items():
            extra = {k: v for k, v in r.items() if k not in ("median_s", "min_s", "rounds")}
            tr.line(f"  {name:<42} {r['median_s']:>9.4f} s   {json.dumps(extra) if extra else ''}")
        ratios = []
        for label, slow, fast in _RATIOS[suite]:
            if slow in res and fast in res:
                val = res[slow]["median_s"] / res[fast]["median_s"]
                ratios.append({"label": label, "baseline": slow, "ours": fast, "speedup": val})
                tr.line(f"  {label:<60} {val:>8.2f}x")
        tag = "cpu" if info["device"] == "cpu" else info["device"].replace(" ", "_")
        path = out_dir / f"{suite}-{tag}.json"
        path.write_text(json.dumps({"suite": suite, "machine": info, "results": res,
                                    "ratios": ratios}, indent=2))
        tr.line(f"  wrote {path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path}")
