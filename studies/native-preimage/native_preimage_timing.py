"""Pre-image loops on CPU: torch reference vs the fused native kernel (csrc/cpu/preimage.cpp).

Plain script, prints a table:   .venv/bin/python studies/native-preimage/native_preimage_timing.py
Options: --b --S --D --steps --repeats (defaults: the recorded configuration below),
--json PATH to also write the numbers with the machine description.

Workload: b points, basis B (S, D), targets T = k(x, B) perturbed by 5%, start Z0 = x + noise,
gamma from the median heuristic on B; gk.preimage(..., method=m, steps=steps) with the default
lr for gd and the default ridge for fixed_point, called through the public API under
gk.set_backend("reference") and gk.set_backend("native"), torch.get_num_threads() left at its
default (--threads N to change it). Each backend's call is repeated --repeats times, the two
backends alternating so that load from other processes hits both alike; the table shows the
median wall time, the ratio reference / native (of wall medians), the median process CPU time
(all threads) and the relative difference of the two results. The load average before and after
is printed: on a shared machine compare wall times only at low load; with --threads 1 the CPU
time of the single busy thread stays meaningful under load (it excludes time spent descheduled).

Recorded 2026-11-21: 2-core AMD EPYC (Zen 4, AVX-512; native built with -march=native),
torch 2.13.0+cpu (MKL); b=5000, S=D=512, steps=100, median of 3. The machine was shared with
other people's jobs during every full run (load average 5-8 on 2 cores), so:

--threads 1: the process CPU time (the two 'cpu s' columns) is the robust number here; the
three repeats of each agreed within 1-2%:

    method       dtype     reference s   native s  speedup  ref cpu s  nat cpu s  rel diff
    gd           float32        16.809     11.797    1.42x      6.811      4.902   3.3e-07
    fixed_point  float32        17.992     14.082    1.28x      6.679      4.982   5.4e-07
    gd           float64        45.831     29.573    1.55x     15.925     10.187   7.9e-16
    fixed_point  float64        34.541     25.085    1.38x     14.752      9.996   1.5e-15

    CPU-time ratio reference / native: 1.39x, 1.34x, 1.56x, 1.48x. The native kernel runs at
    107 GFLOP/s (float32) and 52 GFLOP/s (float64) on one core, counting 4 b S D flops per step.

default threads (2), wall time under that load (torch's per-step 2-thread OpenMP regions suffer
far more from oversubscription than the one long native call, so these ratios overstate the
gain on an idle machine; columns as in an older version of this script, without CPU time):

    gd           float32        62.536     13.022    4.80x   3.3e-07
    fixed_point  float32        57.732     13.243    4.36x   5.4e-07
    gd           float64        92.026     25.991    3.54x   7.9e-16
    fixed_point  float64        56.907     20.462    2.78x   1.5e-15

For scale, on the nearly idle machine earlier that day (2 threads, separate runs, not this
script, similar random data):
reference 3.5 s (gd) / 3.3 s (fixed_point) float32 and 9.9 s / 6.9 s float64, and the native
kernel sustained 210 GFLOP/s float32 and 107 GFLOP/s float64 on both cores, i.e. about 2.5 s and
4.9 s for this workload.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

import torch

import geomkern as gk


def _problem(b, S, D, dtype, gen):
    B = torch.randn(S, D, generator=gen, dtype=torch.float64)
    X = torch.randn(b, D, generator=gen, dtype=torch.float64)
    gamma = gk.median_gamma(B)
    K = torch.exp(-gamma * torch.cdist(X, B).square())
    T = (K * (1 + 0.05 * torch.randn(b, S, generator=gen, dtype=torch.float64))).clamp_min(0)
    Z0 = X + 0.3 * torch.randn(b, D, generator=gen, dtype=torch.float64)
    return Z0.to(dtype), B.to(dtype), T.to(dtype), gamma


def _run(backend, Z0, B, T, gamma, method, steps):
    with gk.set_backend(backend):
        t0, c0 = time.perf_counter(), time.process_time()
        Z = gk.preimage(Z0, B, T, gamma=gamma, method=method, steps=steps)
        return time.perf_counter() - t0, time.process_time() - c0, Z


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--b", type=int, default=5000)
    ap.add_argument("--S", type=int, default=512)
    ap.add_argument("--D", type=int, default=512)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None,
                    help="torch.set_num_threads(N) first (default: leave torch's default)")
    ap.add_argument("--json", default=None, help="also write the results to this JSON file")
    args = ap.parse_args()
    if "native" not in gk.available_backends():
        raise SystemExit("the native backend is not built: pip install --no-build-isolation -e .")

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                if line.startswith("model name")), platform.processor()) \
        if os.path.exists("/proc/cpuinfo") else platform.processor()
    print(f"cpu: {cpu}, {os.cpu_count()} logical cores; torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; b={args.b} S={args.S} D={args.D} "
          f"steps={args.steps}, median of {args.repeats}")
    load0 = os.getloadavg() if hasattr(os, "getloadavg") else None
    print(f"load average before: {load0}")

    rows = []
    header = (f"{'method':<12} {'dtype':<8} {'reference s':>12} {'native s':>10} {'speedup':>8} "
              f"{'ref cpu s':>10} {'nat cpu s':>10} {'rel diff':>9}")
    print(header)
    print("-" * len(header))
    for dtype in (torch.float32, torch.float64):
        Z0, B, T, gamma = _problem(args.b, args.S, args.D, dtype, gen)
        for method in ("gd", "fixed_point"):
            times = {"reference": [], "native": []}
            cpu_times = {"reference": [], "native": []}
            outs = {}
            for _ in range(args.repeats):
                for backend in ("reference", "native"):
                    dt, ct, outs[backend] = _run(backend, Z0, B, T, gamma, method, args.steps)
                    times[backend].append(dt)
                    cpu_times[backend].append(ct)
            ref, nat = (statistics.median(times[k]) for k in ("reference", "native"))
            ref_c, nat_c = (statistics.median(cpu_times[k]) for k in ("reference", "native"))
            r, n = outs["reference"].double(), outs["native"].double()
            rel = ((n - r).norm() / r.norm()).item()
            name = str(dtype).replace("torch.", "")
            print(f"{method:<12} {name:<8} {ref:>12.3f} {nat:>10.3f} {ref / nat:>7.2f}x "
                  f"{ref_c:>10.3f} {nat_c:>10.3f} {rel:>9.1e}", flush=True)
            rows.append({"method": method, "dtype": name, "reference_s": times["reference"],
                         "native_s": times["native"], "reference_cpu_s": cpu_times["reference"],
                         "native_cpu_s": cpu_times["native"], "reference_median_s": ref,
                         "native_median_s": nat, "speedup": ref / nat, "rel_diff": rel})
    load1 = os.getloadavg() if hasattr(os, "getloadavg") else None
    print(f"load average after: {load1}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"suite": "native_preimage_timing",
                       "machine": {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "cpu": cpu,
                                   "cores": os.cpu_count(), "torch": torch.__version__,
                                   "torch_threads": torch.get_num_threads(),
                                   "load_before": load0, "load_after": load1},
                       "config": vars(args), "results": rows}, f, indent=2)


if __name__ == "__main__":
    main()
