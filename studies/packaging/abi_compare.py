"""Two builds of geomkern side by side, in one run: today's checkout (``--after``) against an
earlier one (``--before``, e.g. the last commit with the per-torch pybind11 library), each with
its own built ``.venv`` (``make setup``). Measures, interleaved (A B A B ...):

  build     a clean build of the CPU library (setup.py build_ext into scratch folders), wall and CPU s
  wheel     ``pip wheel --no-build-isolation --no-deps``: file name (its tags) and size
  auditwheel  ``auditwheel show``'s platform tag (where the command is there)
  import    ``import geomkern; gk.available_backends()`` in a fresh process, wall s
  call      per-call time of the native rbf_gram on 64 x 8 float32 at one thread: the raw kernel
            (``native._C.rbf_gram``) and the public op (``gk.rbf_gram``), best of 5 x 3,000 calls

    python studies/packaging/abi_compare.py --before /tmp/old-checkout --after . \\
        --out results/packaging/abi-compare.json

The README's install figures quote this file (scripts/check_figures.py checks them).
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CALL = r"""
import time, torch, geomkern as gk
from geomkern.backends import native
torch.set_num_threads(1)
X = torch.randn(64, 8)
out = {}
for name, f in (("raw_us", lambda: native._C.rbf_gram(X, None, 0.1)), ("public_us", lambda: gk.rbf_gram(X, gamma=0.1))):
    for _ in range(300): f()
    best = 1e9
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(3000): f()
        best = min(best, (time.perf_counter() - t) / 3000 * 1e6)
    out[name] = best
print(out)
"""


def _child_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def timed(cmd, cwd, env=None):
    cpu0, t0 = _child_cpu(), time.perf_counter()
    res = subprocess.run(cmd, cwd=cwd, env={**os.environ, **(env or {})}, capture_output=True, text=True)
    wall, cpu = time.perf_counter() - t0, _child_cpu() - cpu0
    if res.returncode != 0:
        sys.exit(f"{' '.join(map(str, cmd))} failed in {cwd}:\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}")
    return wall, cpu, res.stdout


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before", type=Path, required=True)
    ap.add_argument("--after", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--builds", type=int, default=2)
    ap.add_argument("--imports", type=int, default=7)
    ap.add_argument("--auditwheel", default=shutil.which("auditwheel"))
    args = ap.parse_args()
    sides = {"before": args.before.resolve(), "after": args.after.resolve()}
    py = {k: str(v / ".venv" / "bin" / "python") for k, v in sides.items()}
    env = {"GEOMKERN_NO_CUDA": "1", "MAX_JOBS": str(os.cpu_count() or 2)}
    res = {k: {"build_wall_s": [], "build_cpu_s": [], "import_s": [], "calls": []} for k in sides}
    commits = {k: subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=v, capture_output=True,
                                 text=True).stdout.strip() for k, v in sides.items()}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.builds):
            for k, root in sides.items():
                bt, bl = Path(tmp) / f"bt-{k}-{i}", Path(tmp) / f"bl-{k}-{i}"
                wall, cpu, _ = timed([py[k], "setup.py", "build_ext", "--build-temp", bt, "--build-lib", bl],
                                     root, env)
                res[k]["build_wall_s"].append(wall)
                res[k]["build_cpu_s"].append(cpu)
                print(f"build {k}: {wall:.1f} s wall, {cpu:.1f} s CPU", flush=True)
        for k, root in sides.items():
            wd = Path(tmp) / f"wheel-{k}"
            timed([py[k], "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-q", "-w", wd, root], root, env)
            (whl,) = wd.glob("geomkern-*.whl")
            res[k]["wheel"], res[k]["wheel_bytes"] = whl.name, whl.stat().st_size
            if args.auditwheel:
                out = subprocess.run([args.auditwheel, "show", str(whl)], capture_output=True, text=True).stdout
                tag = re.search(r'consistent with\s+the\s+following platform tag:\s+"([^"]+)"', out)
                res[k]["auditwheel_tag"] = tag.group(1) if tag else out[-300:]
            print(f"wheel {k}: {whl.name}, {whl.stat().st_size} bytes, {res[k].get('auditwheel_tag')}", flush=True)
        for _ in range(args.imports):
            for k, root in sides.items():
                wall, _, _ = timed([py[k], "-c", "import geomkern as gk; gk.available_backends()"], root)
                res[k]["import_s"].append(wall)
        for _ in range(3):
            for k, root in sides.items():
                res[k]["calls"].append(eval(timed([py[k], "-c", CALL], root)[2].strip().splitlines()[-1]))
    summary = {}
    for k, r in res.items():
        summary[k] = {"commit": commits[k], "wheel": r.get("wheel"), "wheel_mb": round(r["wheel_bytes"] / 1e6, 2),
                      "auditwheel_tag": r.get("auditwheel_tag"),
                      "build_wall_s": round(statistics.median(r["build_wall_s"]), 1),
                      "build_cpu_s": round(statistics.median(r["build_cpu_s"]), 1),
                      "import_s": round(statistics.median(r["import_s"]), 2),
                      "raw_call_us": round(statistics.median(c["raw_us"] for c in r["calls"]), 1),
                      "public_call_us": round(statistics.median(c["public_us"] for c in r["calls"]), 1)}
    summary["ratio_after_before"] = {m: round(summary["after"][m] / summary["before"][m], 3)
                                     for m in ("build_wall_s", "import_s", "raw_call_us", "public_call_us")}
    record = {"what": "geomkern's CPU library before and after, measured side by side, interleaved",
              "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                          "python": platform.python_version()},
              "summary": summary, "raw": res}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
