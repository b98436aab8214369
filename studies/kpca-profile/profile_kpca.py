"""Where the KPCA + projection time goes, per stage (issue 20): torch.profiler over the client-
pipeline workload (3 clusters of ~1,700, D 512, d 8, S 512, float32), stages tagged with
record_function, medians of several profiled runs next to the Gram floor measured in the same
process. Results: docs/history.md §15a.

Run: .venv/bin/python studies/kpca-profile/profile_kpca.py [--threads 2] [--runs 5]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))  # the suites' workloads
import geomkern as gk  # noqa: E402
from test_client_pipeline import N_COMPONENTS, make_data  # noqa: E402

# aten op -> stage of the pipeline it belongs to (the one place the table is kept)
STAGE_OF = {
    "aten::addmm_": "Gram GEMM", "aten::mm": "GEMM (Krylov/projection)", "aten::bmm": "GEMM (Krylov/projection)",
    "aten::matmul": None, "aten::exp_": "exp", "aten::exp": "exp",
    "aten::mul_": "elementwise (scale, clamp, add)", "aten::clamp_min_": "elementwise (scale, clamp, add)",
    "aten::add": "elementwise (scale, clamp, add)", "aten::add_": "centring", "aten::sub_": "centring",
    "aten::mean": "centring", "aten::_linalg_eigh": "eigen-solve (Rayleigh-Ritz / dense eigh)",
    "aten::sum": "reductions (row norms, fingerprint, residuals)", "aten::mul": "elementwise (scale, clamp, add)",
    "aten::normal_": "Krylov start (randn)", "aten::sub": "elementwise (scale, clamp, add)",
    "aten::linalg_qr": "Krylov orthogonalisation (QR)",
    "aten::linalg_householder_product": "Krylov orthogonalisation (QR)", "aten::geqrf": "Krylov orthogonalisation (QR)", "aten::copy_": "copies",
    "aten::empty": "allocation", "aten::zero_": "copies", "aten::fill_": "copies",
}


def stage_table(prof) -> dict[str, float]:
    """Self CPU time (s) per stage from the profiler's top-level ops."""
    out: dict[str, float] = defaultdict(float)
    for ev in prof.key_averages():
        stage = STAGE_OF.get(ev.key, "other" if ev.key.startswith("aten::") else None)
        if stage is not None:
            out[stage] += ev.self_cpu_time_total / 1e6
    return dict(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    data = make_data()
    X, off, B, g = data["X"], data["offsets"], data["B"], data["gamma"]
    o = off.tolist()

    def pipeline():
        with torch.profiler.record_function("kpca"):
            fit = gk.kpca(X, off, n_components=N_COMPONENTS, gamma=g)
        with torch.profiler.record_function("projection"):
            gk.project_onto_basis(X, fit, B, gamma=g)

    def floor():
        return [gk.rbf_gram(X[o[j]:o[j + 1]], gamma=g) for j in range(3)]

    pipeline(), floor()  # warm-up
    walls, floors, stages = [], [], defaultdict(list)
    blocks, others = defaultdict(list), defaultdict(list)
    for _ in range(args.runs):  # interleaved: floor, pipeline, profiled pipeline
        t0 = time.perf_counter(); floor(); floors.append(time.perf_counter() - t0)
        t0 = time.perf_counter(); pipeline(); walls.append(time.perf_counter() - t0)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            pipeline()
        for k, v in stage_table(prof).items():
            stages[k].append(v)
        for ev in prof.key_averages():
            if ev.key in ("kpca", "projection"):
                blocks[ev.key].append(ev.cpu_time_total / 1e6)
            elif ev.key.startswith("aten::") and ev.key not in STAGE_OF:
                others[ev.key].append(ev.self_cpu_time_total / 1e6)
    wall, fl = statistics.median(walls), statistics.median(floors)
    print(f"threads {args.threads}, runs {args.runs} (busy machine: ratios only)")
    print(f"pipeline wall {wall * 1e3:.1f} ms; Gram floor (3 Grams) {fl * 1e3:.1f} ms; "
          f"ratio {wall / fl:.2f}x the floor")
    for k in ("kpca", "projection"):
        print(f"  block {k:<12} {statistics.median(blocks[k]) * 1e3:8.1f} ms (profiled)")
    total = sum(statistics.median(v) for v in stages.values())
    for k, v in sorted(stages.items(), key=lambda kv: -statistics.median(kv[1])):
        m = statistics.median(v)
        print(f"  {k:<38} {m * 1e3:8.1f} ms  {100 * m / total:5.1f}%  {m / fl:5.2f}x floor")
    print("  'other', largest ops:")
    for k, v in sorted(others.items(), key=lambda kv: -statistics.median(kv[1]))[:8]:
        print(f"    {k:<36} {statistics.median(v) * 1e3:8.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
