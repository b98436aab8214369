"""A batched symmetric eigen-decomposition checked against a float64 LAPACK oracle (scipy), shared
by tests/geomkern/test_cuda_emulated.py (the CUDA kernels under host emulation) and
tests/geomkern/test_cuda_native.py (the same kernels on a GPU)."""
from __future__ import annotations

import numpy as np
import scipy.linalg

_TINY = np.finfo(np.float64).tiny


def check_eigh(A, w, V, tol: float, name: str = "eigh") -> dict:
    """Assert that (w, V) is an eigen-decomposition of every A[i], to ``tol``.

    A: (batch, n, n) exactly as the solver saw it (float32 input: the float32 values); w (batch, n)
    descending; V (batch, n, n), eigenvectors in columns. Per matrix, against scipy.linalg.eigh in
    float64 on the same values:
      eigenvalues      ||w - w*|| / ||w*||                          <= tol
      reconstruction   ||A V - V diag(w)||_F / ||A||_F              <= tol
      orthogonality    ||V^T V - I||_F / sqrt(n)                    <= tol
      eigenvectors     |sin angle(v_i, v*_i)| (any sign)            <= tol * max(1, ||A||_2 / gap_i)
    (an eigenvector is only determined to roundoff / gap_i, gap_i = distance from lambda_i to the
    rest of the spectrum: the bound grows where eigenvalues cluster and says nothing at a repeat).
    Returns the worst value of each measure (eigenvectors: sin / max(1, ||A||_2 / gap_i)).
    """
    A, w, V = (np.asarray(x, dtype=np.float64) for x in (A, w, V))
    batch, n, _ = A.shape
    assert w.shape == (batch, n) and V.shape == (batch, n, n), (w.shape, V.shape)
    assert np.isfinite(w).all() and np.isfinite(V).all(), f"{name}: non-finite output"
    worst = dict(eigenvalues=0.0, reconstruction=0.0, orthogonality=0.0, eigenvectors=0.0)
    for i in range(batch):
        a = A[i]
        ref_w, ref_v = scipy.linalg.eigh(a)
        ref_w, ref_v = ref_w[::-1], ref_v[:, ::-1]
        assert np.all(np.diff(w[i]) <= 0), f"{name}[{i}]: eigenvalues not descending: {w[i]}"
        norm_a = max(np.linalg.norm(a), _TINY)
        two_norm = max(np.abs(ref_w).max(), _TINY)
        errs = {
            "eigenvalues": np.linalg.norm(w[i] - ref_w) / max(np.linalg.norm(ref_w), _TINY),
            "reconstruction": np.linalg.norm(a @ V[i] - V[i] * w[i]) / norm_a,
            "orthogonality": np.linalg.norm(V[i].T @ V[i] - np.eye(n)) / np.sqrt(n),
        }
        for key, err in errs.items():
            assert err <= tol, f"{name}[{i}] (n={n}): {key} error {err:.3e} > {tol:.1e}"
            worst[key] = max(worst[key], err)
        for j in range(n):
            gap = np.abs(np.delete(ref_w, j) - ref_w[j]).min() if n > 1 else np.inf
            if gap == 0:
                continue  # a repeated eigenvalue: only its eigenspace is determined
            bound = tol * max(1.0, two_norm / gap)
            v, u = V[i][:, j], ref_v[:, j]
            # the part of v orthogonal to u: accurate for tiny angles, unlike sqrt(1 - cos^2)
            sin = np.linalg.norm(v - (v @ u) * u) / max(np.linalg.norm(v), _TINY)
            assert sin <= bound, (f"{name}[{i}] (n={n}): eigenvector {j} is {sin:.3e} (sin of the angle) "
                                  f"from the oracle's, bound {bound:.3e} (gap {gap:.3e}, ||A||_2 {two_norm:.3e})")
            worst["eigenvectors"] = max(worst["eigenvectors"], sin * tol / bound)  # in units of the bound's scale
    return worst
