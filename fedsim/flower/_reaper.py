"""A watchdog that ends the processes a Flower simulation left when fedsim itself died without
running its handlers (SIGKILL, a crash). Ray's runtime (GCS, raylet, its agents and workers)
descends from the fedsim process; killed with SIGKILL, fedsim left ray::DashboardAgent and
ray::RuntimeEnvAgent alive under init (measured: 2 of the 9 processes the run had started).

``start()`` runs this file (standard library only, nothing of fedsim imported) as a small process
in its own session. Every second it records fedsim's descendants (pid and start time, from /proc);
once fedsim is gone, it sends each one still alive (same pid and start time: not a recycled pid)
SIGTERM, then SIGKILL two seconds later, and exits. Linux only (/proc); elsewhere ``start`` does
nothing. tests/fedsim/test_flower.py follows a run's processes with :func:`descendants` and :func:`alive`.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time


def _stat(pid) -> list[str] | None:
    """/proc/<pid>/stat after the command name: state, ppid, ..., start time at [19]."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            s = f.read()
    except OSError:
        return None
    return s[s.rfind(")") + 2:].split()


def alive(pid: int, start: str) -> bool:
    """Whether pid still runs the process that started at ``start`` (not a zombie, not reused)."""
    st = _stat(pid)
    return st is not None and st[19] == start and st[0] not in ("Z", "X")


def descendants(root: int, exclude: int | None = None) -> dict[int, str]:
    """pid -> start time of every live descendant of ``root`` (``exclude`` and its own left out)."""
    kids: dict[int, list] = {}
    for d in os.listdir("/proc"):
        if d.isdigit() and (st := _stat(d)) is not None:
            kids.setdefault(int(st[1]), []).append((int(d), st[19]))
    out: dict[int, str] = {}
    todo = [root]
    while todo:
        for pid, start in kids.get(todo.pop(), []):
            if pid != exclude and pid not in out:
                out[pid] = start
                todo.append(pid)
    return out


def watch(parent: int) -> None:
    """Record ``parent``'s descendants until it is gone, then end the ones still alive."""
    me = os.getpid()
    known: dict[int, str] = {}
    while (st := _stat(parent)) is not None and st[0] not in ("Z", "X"):
        known.update(descendants(parent, exclude=me))
        time.sleep(1.0)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        left = [pid for pid, start in known.items() if alive(pid, start)]
        for pid in left:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        if not left:
            break
        time.sleep(2.0)


def start() -> subprocess.Popen | None:
    """Watch this process (see the module docstring); None where /proc is missing."""
    if not os.path.isdir("/proc"):
        return None
    return subprocess.Popen([sys.executable, os.path.abspath(__file__), str(os.getpid())],
                            start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, close_fds=True)


if __name__ == "__main__":
    watch(int(sys.argv[1]))
