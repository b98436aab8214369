"""Shared pre-image test problems (the oracle table of tests/geomkern/test_preimage.py, the CUDA
launch tests of test_cuda_emulated.py and test_cuda_native.py use the same ones)."""
from __future__ import annotations

import math

import torch


def preimage_problem(b, S, D, seed):
    """Basis B, starting points near x, targets = k(x, B) perturbed: a pre-image to recover.

    For D < 4 the basis is a jittered grid, so G = K(B, B) stays well conditioned: with random
    points on a line G is nearly singular, the fixed-point coefficients A = (G + ridge I)^-1 T get
    huge entries of both signs, and the iteration amplifies rounding so much that the float64
    reference and any reordering of its sums differ at 1e-3 (a property of the problem, not of
    the kernel).
    """
    g = torch.Generator().manual_seed(seed)
    B = torch.randn(S, D, generator=g, dtype=torch.float64)
    if D < 4:
        grid = (torch.arange(S, dtype=torch.float64) - (S - 1) / 2) * (1.5 / math.sqrt(D))
        B = grid.unsqueeze(1).expand(S, D) + 0.1 * B
    X = torch.randn(b, D, generator=g, dtype=torch.float64)
    gamma = 1.0 / (2 * D)
    K = torch.exp(-gamma * torch.cdist(X, B).square())
    T = (K * (1 + 0.05 * torch.randn(b, S, generator=g, dtype=torch.float64))).clamp_min(0)
    Z0 = X + 0.3 * torch.randn(b, D, generator=g, dtype=torch.float64)
    return Z0, B, T, gamma


def near_basis_problem(b, S, D, seed):
    """Points near a cloud of basis points, exact targets k(x, B) and positive expansion
    coefficients A: z stays a weighted mean of basis points, so the fixed-point iteration is well
    conditioned and float32 can track float64 (the Triton tests' problem). float64, CPU."""
    g = torch.Generator().manual_seed(seed)
    B = torch.randn(S, D, generator=g, dtype=torch.float64)
    X = B[torch.randint(0, S, (b,), generator=g)] + 0.3 * torch.randn(b, D, generator=g, dtype=torch.float64)
    gamma = 1.0 / (2.0 * D)
    T = torch.exp(-gamma * torch.cdist(X, B).square())
    Z0 = X + 0.1 * torch.randn(b, D, generator=g, dtype=torch.float64)
    A = 0.1 + torch.rand(b, S, generator=g, dtype=torch.float64)
    return Z0, B, T, A, gamma
