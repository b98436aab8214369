"""Host time of one Triton launcher call, eager, with its kernel launched through
torch.library.wrap_triton (the launchers from session 10 to 11) against the kernel itself (now,
_common.launch outside a trace). No GPU: each kernel's run() is replaced by a no-op, so what is
timed is everything the launcher does on the host (argument checks, allocations, the shift, the
launch path) on CPU tensors of small shapes. The two paths are timed in turn, several rounds.

    .venv/bin/python studies/launch-overhead/overhead.py
"""
from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
from torch.library import wrap_triton  # noqa: E402

from geomkern.backends.triton import _common as C  # noqa: E402
from geomkern.backends.triton import kmeans as tkm  # noqa: E402
from geomkern.backends.triton import preimage as tpre  # noqa: E402
from geomkern.backends.triton import rbf as trbf  # noqa: E402

for k in (tpre._preimage_kernel, trbf._sym_gram_kernel, trbf._cross_gram_kernel, tkm._assign_kernel):
    k.run = lambda *a, **kw: None

Z0, B, T, lr = torch.randn(300, 64), torch.randn(33, 64), torch.rand(300, 33), torch.full((300,), 0.1)
X, Y = torch.randn(70, 40), torch.randn(50, 40)
Xa, Ca = torch.randn(2, 50, 40), torch.randn(2, 5, 40)
CASES = {"preimage_gd (1 launch)": lambda: tpre.preimage_gd(Z0, B, T, 0.5, 3, lr),
         "rbf_gram symmetric (1 launch)": lambda: trbf.rbf_gram(X, None, 0.5, False),
         "rbf_gram cross (1 launch)": lambda: trbf.rbf_gram(X, Y, 0.5, False),
         "kmeans assign (1 launch)": lambda: tkm.assign(Xa, Ca)}
PATHS = {"wrap_triton": wrap_triton, "kernel itself": lambda k: k}


def per_call_us(f, n=200) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        f()
    return (time.perf_counter() - t0) / n * 1e6


def main() -> int:
    print("| launcher | wrap_triton µs | kernel itself µs | ratio |\n|---|---|---|---|")
    for name, f in CASES.items():
        times = {p: [] for p in PATHS}
        for _ in range(7):  # interleaved rounds
            for p, launch in PATHS.items():
                C.launch = launch
                f()
                times[p].append(per_call_us(f))
        a, b = (statistics.median(times[p]) for p in PATHS)
        print(f"| {name} | {a:.1f} | {b:.1f} | {a / b:.2f} |")
    print(f"\nmedian of 7 interleaved rounds of 200 calls; torch {torch.__version__}, "
          f"{os.cpu_count()} CPUs, host only (no kernel runs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
