"""Shared benchmark plumbing on top of pytest-benchmark.

Every test sets ``benchmark.group`` to its workload and records its provider through the
``recorder`` fixture, which puts the provider's name and its quality check into
``benchmark.extra_info`` and, once both sides of a named ratio are measured, the ratio
(``extra_info["speedup"]``). Ratios are only ever taken between providers of the same run.

A run writes nothing by itself: pytest-benchmark's own ``--benchmark-json PATH`` /
``--benchmark-autosave`` (into ``.benchmarks/``) hold its results, and the session ends by
printing the medians and ratios. ``--save-results DIR`` also writes the project's summary,
``DIR/<suite>-<machine>.json``; only that option ever touches the results store.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

_RECORDERS: dict[str, "Recorder"] = {}


def describe_machine() -> dict:
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


def _commit() -> str | None:
    """HEAD of the checkout the suites run from, with "+dirty" when tracked files differ."""
    root = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+dirty" if dirty else "")


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
    """One suite's providers (name -> median, min, rounds, quality) and its named ratios."""

    def __init__(self, suite: str):
        self.suite = suite
        self.results: dict[str, dict] = {}
        self._ratios: list[tuple[str, str, str]] = []
        self._rounds: dict[str, list[float]] = {}
        self._benchmarks: dict[str, list] = {}  # provider -> the pytest-benchmark fixtures it reports through

    def add(self, provider: str, benchmark, **quality):
        """``provider`` measured by ``benchmark`` (all its rounds); ``quality`` is its check."""
        if benchmark.stats is None:  # --benchmark-disable: the check ran, nothing was timed
            benchmark.extra_info.update(provider=provider, **quality)
            return
        s = benchmark.stats.stats
        self._store(provider, benchmark, {"median_s": s.median, "min_s": s.min, "rounds": s.rounds}, quality)

    def add_round(self, provider: str, benchmark, **quality):
        """One round of ``provider`` (tests that interleave providers round by round, each round its
        own pytest-benchmark test); the summary shows the median over its rounds."""
        if benchmark.stats is None:
            benchmark.extra_info.update(provider=provider, **quality)
            return
        times = self._rounds.setdefault(provider, [])
        times.append(benchmark.stats.stats.median)
        self._store(provider, benchmark, {"median_s": statistics.median(times), "min_s": min(times),
                                          "rounds": len(times)}, quality)

    def derive(self, provider: str, benchmark, median_s: float, min_s: float, how: str, **info):
        """A provider computed from measured ones (a sum, an extrapolation), not timed itself; its
        ratios go into ``benchmark``'s extra_info under their labels."""
        if benchmark.stats is None:
            return
        self._store(provider, benchmark, {"median_s": median_s, "min_s": min_s, "derived": how}, info,
                    own=False)

    def ratio(self, label: str, baseline: str, ours: str):
        """Report baseline / ours (how many times faster ``ours`` is than ``baseline``)."""
        if (label, baseline, ours) not in self._ratios:
            self._ratios.append((label, baseline, ours))
        self._refresh()

    def ratios(self) -> list[dict]:
        out = []
        for label, baseline, ours in self._ratios:
            if baseline in self.results and ours in self.results:
                out.append({"label": label, "baseline": baseline, "ours": ours,
                            "speedup": self.results[baseline]["median_s"] / self.results[ours]["median_s"]})
        return out

    def _store(self, provider, benchmark, timing, quality, own=True):
        self.results[provider] = {**timing, **quality}
        if own:
            benchmark.extra_info.update(provider=provider, **quality)
        if benchmark not in self._benchmarks.setdefault(provider, []):
            self._benchmarks[provider].append(benchmark)
        self._refresh()

    def _refresh(self):
        # a ratio's value changes while rounds of either side come in: rewrite it each time, the
        # fixtures' extra_info is serialised when the session ends
        for r in self.ratios():
            for bench in self._benchmarks[r["ours"]]:
                bench.extra_info.setdefault("speedup", {})[r["label"]] = r["speedup"]


def pytest_addoption(parser):
    group = parser.getgroup("geomkern benchmarks")
    group.addoption("--threads", type=int, default=None,
                    help="torch.set_num_threads for the benchmarks that read it (test_cpu_floor.py: default 2)")
    group.addoption("--save-results", metavar="DIR", default=None,
                    help="also write each suite's summary (medians, quality, same-run ratios, machine, "
                         "commit, command) to DIR/<suite>-<machine>.json; without it a run writes nothing "
                         "but what pytest-benchmark's own --benchmark-json / --benchmark-autosave ask for")
    group.addoption("--smoke", action="store_true",
                    help="tiny workloads (test_ggeur_speed.py, test_client_pipeline.py, test_cpu_floor.py): "
                         "checks that a suite runs and reports in seconds; its times mean nothing")


@pytest.fixture(scope="module")
def recorder(request):
    suite = request.module.SUITE
    return _RECORDERS.setdefault(suite, Recorder(suite))


@pytest.fixture(scope="module")
def threads(request):
    """torch's thread count for a CPU suite's module (``--threads``, default 2), restored after;
    a suite takes it with ``pytestmark = pytest.mark.usefixtures("threads")``."""
    import torch

    n = request.config.getoption("--threads") or 2
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    yield n
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def smoke(request) -> bool:
    return request.config.getoption("--smoke")


def pytest_benchmark_update_machine_info(config, machine_info):
    """pytest-benchmark's JSON gets the versions and thread count the ratios depend on."""
    machine_info["geomkern_bench"] = {k: v for k, v in describe_machine().items() if k != "date"}


def pytest_terminal_summary(terminalreporter, config):
    recorders = [r for r in _RECORDERS.values() if r.results]
    if not recorders:
        return
    save = config.getoption("--save-results")
    info = describe_machine() if save else None
    for rec in recorders:
        tr = terminalreporter
        tr.section(f"{rec.suite}: medians and ratios (same run)")
        for name, r in rec.results.items():
            extra = {k: v for k, v in r.items() if k not in ("median_s", "min_s", "rounds")}
            tr.line(f"  {name:<42} {r['median_s']:>9.4f} s   {json.dumps(extra) if extra else ''}")
        ratios = rec.ratios()
        for r in ratios:
            tr.line(f"  {r['label']:<60} {r['speedup']:>8.2f}x")
        if save:
            out_dir = Path(save)
            out_dir.mkdir(parents=True, exist_ok=True)
            tag = "cpu" if info["device"] == "cpu" else info["device"].replace(" ", "_")
            path = out_dir / f"{rec.suite}-{tag}.json"
            command = shlex.join([Path(sys.executable).name, "-m", "pytest", *config.invocation_params.args])
            path.write_text(json.dumps({"suite": rec.suite, "command": command, "commit": _commit(),
                                        "smoke": config.getoption("--smoke"), "machine": info,
                                        "results": rec.results, "ratios": ratios}, indent=2) + "\n")
            tr.line(f"  wrote {path}")
