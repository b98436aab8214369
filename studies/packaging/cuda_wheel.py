"""The one wheel (issue 42): geomkern built from its sdist twice in one run, without the CUDA kernels
(GEOMKERN_NO_CUDA=1) and with them (geomkern._C_cuda on torch's stable ABI, nvcc for
TORCH_CUDA_ARCH_LIST 8.0;9.0+PTX, no GPU needed), each a clean ``pip wheel --no-build-isolation
--no-deps`` (wall and CPU s), each wheel's size, libraries and ``auditwheel show`` summary (where
auditwheel is given), and the loaded _C_cuda's NEEDED list (readelf).

    CUDA_HOME=/usr/local/cuda python studies/packaging/cuda_wheel.py \\
        --out results/packaging/cuda-wheel.json --auditwheel /tmp/aw/bin/auditwheel

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
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run(cmd, env=None, cwd=None) -> subprocess.CompletedProcess:
    res = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env, cwd=cwd, timeout=3600)
    if res.returncode != 0:
        sys.exit(f"{' '.join(map(str, cmd))} failed:\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}")
    return res


def timed_wheel(sdist: Path, out: Path, cuda: bool) -> dict:
    env = {**os.environ, "GEOMKERN_NO_CUDA": "0" if cuda else "1", "MAX_JOBS": os.environ.get("MAX_JOBS", "2")}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-q", "-w", out, sdist], env=env)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    (wheel,) = out.glob("geomkern-*.whl")
    with zipfile.ZipFile(wheel) as z:
        libs = {i.filename.split("/")[-1]: i.file_size for i in z.infolist() if i.filename.endswith(".so")}
    return {"wheel": wheel.name, "wheel_mb": round(wheel.stat().st_size / 1e6, 2), "libraries_bytes": libs,
            "build_wall_s": round(wall, 1),
            "build_cpu_s": round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 1),
            "path": str(wheel)}


def auditwheel_show(tool: str | None, wheel: str) -> dict:
    if not tool:
        return {"auditwheel": None}
    text = subprocess.run([tool, "show", wheel], capture_output=True, text=True, timeout=600).stdout
    flat = " ".join(text.split())
    tag = re.search(r'consistent with the following platform tag: "([^"]+)"', flat)
    constrained = re.search(r'constrains the platform tag to "([^"]+)"', flat)
    external = re.search(r"external shared libraries are required by the wheel: (.*?)(?: The wheel| This|$)", flat)
    return {"auditwheel_tag": tag.group(1) if tag else None,
            "auditwheel_constrained_to": constrained.group(1) if constrained else None,
            "auditwheel_external": external.group(1) if external else "none listed",
            "auditwheel_show": flat}


def needed(wheel: str, name: str, tmp: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as z:
        member = next((n for n in z.namelist() if n.endswith("/" + name)), None)
        if member is None:
            return []
        path = Path(z.extract(member, tmp / "x"))
    out = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--auditwheel", default=None, help="the auditwheel command (optional)")
    args = ap.parse_args()
    import torch

    with tempfile.TemporaryDirectory() as tmp_:
        tmp = Path(tmp_)
        run([sys.executable, "-m", "build", "--sdist", "--no-isolation", "--outdir", tmp / "dist", ROOT])
        (sdist,) = (tmp / "dist").glob("geomkern-*.tar.gz")
        nvcc = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / "nvcc"
        rec = {"what": __doc__.split("\n\n")[0].replace("\n", " "),
               "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
               "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                        text=True).stdout.strip(),
               "machine": {"cpu": platform.machine(), "cores": os.cpu_count(), "python": platform.python_version(),
                           "torch": torch.__version__, "loadavg_1m_start": round(os.getloadavg()[0], 2),
                           "nvcc": run([nvcc, "--version"]).stdout.strip().splitlines()[-1]}}
        summary = {}
        for name, cuda in (("cpu_only", False), ("cpu_and_cuda", True)):
            w = timed_wheel(sdist, tmp / name, cuda)
            w.update(auditwheel_show(args.auditwheel, w["path"]))
            if cuda:
                w["C_cuda_needed"] = needed(w["path"], "_C_cuda.abi3.so", tmp)
            w.pop("path")
            summary[name] = w
        rec["machine"]["loadavg_1m_end"] = round(os.getloadavg()[0], 2)
        summary["cuda_extra_wall_s"] = round(summary["cpu_and_cuda"]["build_wall_s"] - summary["cpu_only"]["build_wall_s"], 1)
        summary["cuda_extra_mb"] = round(summary["cpu_and_cuda"]["wheel_mb"] - summary["cpu_only"]["wheel_mb"], 2)
        rec["summary"] = summary
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rec, indent=1) + "\n")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
