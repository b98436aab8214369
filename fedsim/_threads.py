"""The default torch thread count of `fedsim run`: from the CPUs this process may use and the work.

A local step of the heads here is one small matrix product per layer (a 64 x 384 batch through a
384 x 25 or 384 x 256 layer): splitting it over threads saves microseconds, and when other
processes hold the cores the threads wait on each other (the same run took 241 s at 2 threads
and 14 s at 1 on a busy 2-core machine, issue 19). So a thread is added only per
``WORK_PER_THREAD`` multiply-adds of a step's forward pass, and never more than the CPUs the
process may run on (its affinity mask and its cgroup CPU quota, whichever is smaller).
"""
from __future__ import annotations

import math
import os
from pathlib import Path

# multiply-adds of one forward pass per thread: 2**24 keeps the embedded data's heads (0.6 M
# linear, 6.7 M mlp at batch 64) on one thread and gives a 768-d CLIP mlp at batch 256 (~57 M) 3
WORK_PER_THREAD = 2 ** 24


def cgroup_cpus(root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """The CPU quota of this process's cgroup in CPUs (quota / period; cgroup v2 cpu.max or v1
    cpu.cfs_quota_us), None when there is none or it cannot be read."""
    try:
        text = (root / "cpu.max").read_text().split()
        if text and text[0] != "max":
            return int(text[0]) / int(text[1])
        return None
    except (OSError, ValueError, IndexError):
        pass
    try:
        quota = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return quota / period if quota > 0 and period > 0 else None
    except (OSError, ValueError):
        return None


def usable_cpus() -> int:
    """CPUs this process may use: its affinity mask, capped by its cgroup quota (rounded up)."""
    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    quota = cgroup_cpus()
    if quota is not None:
        n = min(n, math.ceil(quota))
    return max(1, n)


def step_work(batch_size: int, dim: int, n_classes: int, hidden: int | None = None) -> int:
    """Multiply-adds of one forward pass of a local step: batch x (dim x classes) for the linear
    head, batch x (dim x hidden + hidden x classes) with a hidden layer."""
    per_row = dim * n_classes if hidden is None else dim * hidden + hidden * n_classes
    return batch_size * per_row


def default_threads(work: int, cpus: int | None = None) -> int:
    """One thread per WORK_PER_THREAD multiply-adds of ``work``, at least 1, at most ``cpus``
    (default: :func:`usable_cpus`)."""
    cpus = usable_cpus() if cpus is None else cpus
    return max(1, min(cpus, work // WORK_PER_THREAD))
