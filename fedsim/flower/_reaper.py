"""A watchdog that ends the processes a Flower simulation left when fedsim itself died without
running its handlers (SIGKILL, a crash). Ray's runtime (GCS, raylet, its agents and workers)
descends from the fedsim process; killed with SIGKILL, fedsim left ray::DashboardAgent and
ray::RuntimeEnvAgent alive under init (measured: 2 of the 9 processes the run had started).

``start()`` launches a small stdlib-only Python process in its own session. Every second it
records fedsim's descendants (pid and start time, from /proc); once fedsim is gone, it sends each
one still alive (same pid and start time: not a recycled pid) SIGTERM, then SIGKILL two seconds
later, and exits. Linux only (/proc); elsewhere ``start`` does nothing.
"""
from __future__ import annotations

import os
import subprocess
import sys

_CODE = r"""
import os, signal, sys, time
parent, me = int(sys.argv[1]), os.getpid()

def stat(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            s = f.read()
    except OSError:
        return None
    return s[s.rfind(")") + 2:].split()  # state, ppid, ..., starttime at [19]

def gone(pid):
    st = stat(pid)
    return st is None or st[0] in ("Z", "X")

def descendants(root):
    kids = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            st = stat(d)
            if st is not None:
                kids.setdefault(int(st[1]), []).append((int(d), st[19]))
    out, todo = {}, [root]
    while todo:
        for pid, start in kids.get(todo.pop(), []):
            if pid != me and pid not in out:
                out[pid] = start
                todo.append(pid)
    return out

known = {}
while not gone(parent):
    known.update(descendants(parent))
    time.sleep(1.0)
for sig in (signal.SIGTERM, signal.SIGKILL):
    left = [pid for pid, start in known.items() if (stat(pid) or [None] * 20)[19] == start and not gone(pid)]
    for pid in left:
        try:
            os.kill(pid, sig)
        except OSError:
            pass
    if not left:
        break
    time.sleep(2.0)
"""


def start() -> subprocess.Popen | None:
    """Watch this process (see the module docstring); None where /proc is missing."""
    if not os.path.isdir("/proc"):
        return None
    return subprocess.Popen([sys.executable, "-c", _CODE, str(os.getpid())], start_new_session=True,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            close_fds=True)
