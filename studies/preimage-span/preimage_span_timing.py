"""Prototype of the gd pre-image iterated in span(z0, B), in plain torch (measured before the
native span kernel, csrc/cpu, made the same form the CPU default; docs/history.md §8, §15b).

Every gd step of the paper's Eq. 14 moves z by a combination of z and the basis rows, so
z_t = a_t z0 + C_t B with a scalar a_t and coefficients C_t (b, S) per point. With P = z0 B^T and
G = B B^T computed once, z . b_s = a P + C G and |z|^2 = a^2 |z0|^2 + 2a <C, P> + <C, C G>, so a
step costs one (b, S) x (S, S) product instead of the two (b, S) x (S, D) products of the
reference: half the flops at S = D, a third at S = 256, D = 384 (FedMC's defaults on MiniLM).

Run: .venv/bin/python studies/preimage-span/preimage_span_timing.py    (the client-pipeline workload:
5,000 points, S = D = 512, 100 steps, float32; prints loss, max deviation and best-of-3 times
next to the torch reference and the native kernel, same process). Results: docs/history.md §8.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))  # the suites' workloads
import geomkern as gk  # noqa: E402
from geomkern.ops.preimage import _CHUNK, gd_reference  # noqa: E402
from test_client_pipeline import make_data  # noqa: E402


def gd_span(Z0, B, T, gamma: float, steps: int, lr: torch.Tensor) -> torch.Tensor:
    """Same iterates as gd_reference up to roundoff; z_t = a_t z0 + C_t B."""
    G = B @ B.T
    bb = (B * B).sum(1)
    out = torch.empty_like(Z0)
    for i in range(0, Z0.shape[0], _CHUNK):
        z0 = Z0[i:i + _CHUNK]
        t, step = T[i:i + _CHUNK], (4.0 * gamma * lr[i:i + _CHUNK]).unsqueeze(1)
        P = z0 @ B.T
        zz0 = (z0 * z0).sum(1, keepdim=True)
        a = torch.ones_like(zz0)
        C = torch.zeros_like(P)
        Q = torch.zeros_like(P)  # C G
        for _ in range(steps):
            zb = a * P + Q
            zz = a * a * zz0 + 2 * a * (C * P).sum(1, keepdim=True) + (C * Q).sum(1, keepdim=True)
            k = (zz + bb - 2 * zb).clamp_min_(0).mul_(-gamma).exp_()
            w = (k - t).mul_(k)
            f = 1 + step * w.sum(1, keepdim=True)  # z + step (W z - w B)
            a = a * f
            C = C * f - step * w
            Q = C @ G
        out[i:i + _CHUNK] = a * z0 + C @ B
    return out


def main() -> int:
    data = make_data()
    B, g, T, z0, lr = data["B"], data["gamma"], data["targets"], data["z0"], data["lr"]

    def native():
        with gk.set_backend("native"):
            return gk.preimage(z0, B, T, gamma=g, method="gd", steps=100, lr=lr)

    runs = {"reference": lambda: gd_reference(z0, B, T, g, 100, lr),
            "span": lambda: gd_span(z0, B, T, g, 100, lr), "native": native}
    out = {k: f() for k, f in runs.items()}
    for k, Z in out.items():
        loss = float(gk.preimage_loss(Z, B, T, gamma=g).mean())
        dev = float((Z - out["reference"]).abs().max())
        best = min(_timed(runs[k]) for _ in range(3))
        print(f"{k:<10} {best:7.2f} s   mean loss {loss:.6g}   max |z - z_ref| {dev:.1e}")
    return 0


def _timed(f) -> float:
    t0 = time.perf_counter()
    f()
    return time.perf_counter() - t0


if __name__ == "__main__":
    raise SystemExit(main())
