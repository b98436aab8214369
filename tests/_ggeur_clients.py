"""GGEUR client statistics for the tests of geomkern.ggeur and of fedsim's GGEUR augmenter."""
from __future__ import annotations

import torch


def client_statistics(K=9, C=5, D=12, seed=0):
    """K clients' ggeur.ClassStatistics; some classes held by nobody, some clients without rows."""
    from geomkern import ggeur

    g = torch.Generator().manual_seed(seed)
    out = []
    for k in range(K):
        n = 0 if k == 3 else int(torch.randint(2, 30, (1,), generator=g))
        y = torch.randint(0, C - 1, (n,), generator=g)  # class C-1: held by nobody
        x = torch.randn(n, D, generator=g) + y.unsqueeze(1).float()
        out.append(ggeur.local_statistics(x, y, C))
    return out
