"""Wall time and peak memory of `fedsim run` on the local and the Flower engine (docs/flower.md).

Each measured command runs in its own session; every 0.5 s this script sums the resident memory
of all processes of that session (/proc: the run, and with --engine flower Ray's GCS, raylet and
workers, which a plain getrusage of the child would miss) and keeps the peak. The runs go one after
another (never two at once), each with --threads 1.

    python scripts/flower_scale.py --clients 100 500 --out results/flower-scale/flower-scale.json
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path


def _session_rss(sid: int) -> int:
    """Resident bytes summed over the processes of session ``sid`` (shared pages count in each)."""
    page, total = os.sysconf("SC_PAGE_SIZE"), 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            fields = stat[stat.rindex(")") + 2:].split()
            if int(fields[3]) != sid:  # field 6 of stat: session id
                continue
            total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * page
        except (OSError, ValueError, IndexError):
            continue
    return total


def measure(cmd: list[str], timeout: float) -> dict:
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    peak = 0
    out = []
    import threading

    reader = threading.Thread(target=lambda: out.append(p.stdout.read()), daemon=True)
    reader.start()
    while p.poll() is None:
        peak = max(peak, _session_rss(p.pid))
        if time.perf_counter() - t0 > timeout:
            os.killpg(p.pid, 9)
            p.wait()
            return {"cmd": cmd, "timed_out": True, "wall_s": time.perf_counter() - t0, "peak_rss_mb": peak / 2**20}
        time.sleep(0.5)
    wall = time.perf_counter() - t0
    try:
        os.killpg(p.pid, 9)  # Ray's daemons, if any outlived the run
    except ProcessLookupError:
        pass
    reader.join(5)
    tail = (out[0] if out else b"").decode(errors="replace")[-600:]
    return {"cmd": cmd, "rc": p.returncode, "wall_s": wall, "peak_rss_mb": peak / 2**20, "tail": tail}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, nargs="+", default=[100, 500])
    ap.add_argument("--engines", nargs="+", default=["local", "flower"])
    ap.add_argument("--augmenters", default="none")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--fraction", type=float, default=0.1)
    ap.add_argument("--min-size", type=int, default=2)
    ap.add_argument("--beta", type=float, default=0.5)
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("--work", default="/tmp/fedsim-flower-scale")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    fedsim = str(Path(sys.executable).parent / "fedsim")
    rows = []
    for n in a.clients:
        for eng in a.engines:
            out = Path(a.work) / f"{eng}-{n}-{a.augmenters}-{time.strftime('%H%M%S')}"
            cmd = [fedsim, "run", "--engine", eng, "--clients", str(n), "--fraction", str(a.fraction),
                   "--rounds", str(a.rounds), "--min-size", str(a.min_size), "--beta", str(a.beta), "--algorithms", "fedavg",
                   "--augmenters", a.augmenters, "--threads", "1", "--quiet", "--out", str(out)]
            r = measure(cmd, a.timeout)
            r.update(engine=eng, clients=n, augmenters=a.augmenters)
            if r.get("rc") == 0:
                res = json.loads((out / "results.json").read_text())
                r["accuracy"] = [m["seeds"][str(res["config"]["seed"])]["accuracy"] for m in res["methods"].values()]
            print(json.dumps({k: v for k, v in r.items() if k != "tail"}), flush=True)
            rows.append(r)
            Path(a.out).parent.mkdir(parents=True, exist_ok=True)
            Path(a.out).write_text(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                               "cpus": os.cpu_count(), "note": "shared machine (other jobs running)",
                                               "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
