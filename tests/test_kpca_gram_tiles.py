"""The kpca Gram built from upper-triangle row blocks straight into its bucket slot
(geomkern.ops.kpca.centred_gram_into over geomkern.ops.rbf.sym_gram_into, which rbf_gram's
symmetric case shares) and the thread-count-independent fit fingerprint (issue 20).

Small GRAM_TILE_ROWS (monkeypatched) so odd and ragged sizes cover every block layout in a fast
test: one block, several, a last block of exactly the short-GEMM limit (_MKL_ROWS rows) and one
of fewer (merged into the block before it).
"""
from __future__ import annotations

import pytest
import torch
from sklearn.metrics.pairwise import rbf_kernel

import geomkern as gk
import geomkern.ops.kpca as kpca_mod
import geomkern.ops.rbf as rbf_mod
from conftest import FLOATS, TOL, assert_close_rel, offsets_from_sizes

TILE = 16
SIZES = (1, 5, 11, 12, 16, 17, 27, 28, 45, 100)  # TILE + 11 = 27 merges, TILE + 12 = 28 does not


@pytest.fixture
def small_tiles(monkeypatch):
    monkeypatch.setattr(rbf_mod, "GRAM_TILE_ROWS", TILE)


def _threads(n):
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    return before


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("n", SIZES)
def test_centred_gram_into_its_slot_matches_float64(small_tiles, n, dtype, gen):
    D, g, pad = 7, 0.3, 3
    X = (torch.randn(n, D, generator=gen, dtype=torch.float64) + 3.0).to(dtype)
    buf = torch.full((n + pad, n + pad + 2), float("nan"), dtype=dtype)
    colmean = kpca_mod.centred_gram_into(buf[:n, 1:n + 1], X, g)
    K = rbf_kernel(X.double().numpy(), gamma=g)
    Kc = K - K.mean(0, keepdims=True) - K.mean(1, keepdims=True) + K.mean()
    assert_close_rel(buf[:n, 1:n + 1], Kc, TOL[dtype], "H K H in the slot")
    assert_close_rel(colmean, K.mean(0), TOL[dtype], "column means of K")
    # nothing outside the slot was written
    outside = torch.ones_like(buf, dtype=torch.bool)
    outside[:n, 1:n + 1] = False
    assert bool(buf[outside].isnan().all())


@pytest.mark.parametrize("dtype", FLOATS)
def test_the_uncentred_blocks_are_exactly_symmetric_with_a_unit_diagonal(small_tiles, dtype, gen, monkeypatch):
    """Before centring, K is the mirrored upper triangle: bitwise symmetric, unit diagonal."""
    n, D, g = 45, 6, 0.2
    X = torch.randn(n, D, generator=gen, dtype=dtype)
    captured = {}
    real_mean = torch.Tensor.mean

    def spy(self, *args, **kwargs):  # the row means are taken of the finished, uncentred K
        if self.shape == (n, n) and "K" not in captured:
            captured["K"] = self.clone()
        return real_mean(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "mean", spy)
    kpca_mod.centred_gram_into(torch.empty(n, n, dtype=dtype), X, g)
    monkeypatch.undo()
    K = captured["K"]
    assert torch.equal(K, K.T)
    assert torch.equal(K.diagonal(), torch.ones(n, dtype=dtype))
    assert_close_rel(K, rbf_kernel(X.double().numpy(), gamma=g), TOL[dtype], "K")


@pytest.mark.parametrize("solver", ["auto", "dense", "subspace"])
def test_kpca_of_ragged_clusters_has_the_same_bits_at_1_and_2_threads(small_tiles, solver, gen):
    """Blocks of 5-11 rows (a whole small cluster) go through the padded GEMM, longer clusters
    never end in such a block, so the fit and the projection do not depend on the thread count.
    subspace: a Krylov block of k = d + 8 = 11 columns; its small products (MKL's GEMMs of 5-11
    rows gave other alphas at 2 threads before block_krylov_top ran them on one thread)."""
    sizes = [7, 27, 100, 45, 11, 64]
    d, D, g = 3, 8, 0.1
    X = torch.randn(sum(sizes), D, generator=gen)
    B = torch.randn(9, D, generator=gen)
    off = offsets_from_sizes(sizes)
    out = {}
    before = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            fit = gk.kpca(X, off, n_components=d, gamma=g, solver=solver)
            out[n] = (fit, gk.project_onto_basis(X, fit, B, gamma=g))
    finally:
        torch.set_num_threads(before)
    for name in ("eigenvalues", "alphas", "mean_projection", "fingerprint"):
        assert torch.equal(getattr(out[1][0], name), getattr(out[2][0], name)), name
    assert torch.equal(out[1][1], out[2][1])


def test_fingerprint_does_not_depend_on_the_thread_count(gen):
    """200,000 rows: a single sum over X splits by thread count and its bits differed at 1 and
    2 threads; a fit made at one thread count must be recognised at another."""
    X = torch.randn(200_000, 64, generator=gen)
    before = torch.get_num_threads()
    try:
        fps = []
        for n in (1, 2):
            torch.set_num_threads(n)
            fps.append(kpca_mod.fingerprint(X))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(fps[0], fps[1])
    # still a checksum: one value, or two rows swapped, change it
    Y = X.clone()
    Y[123, 4] += 1e-3
    assert not torch.equal(kpca_mod.fingerprint(Y), fps[0])
    Y = X.clone()
    Y[[5, 6]] = X[[6, 5]]
    assert not torch.equal(kpca_mod.fingerprint(Y), fps[0])


@pytest.mark.slow  # ~10-20 s on the shared 2-core machine
def test_a_fit_made_at_2_threads_projects_at_1(gen):
    """End to end: project_onto_basis checks X against the fit's fingerprint; at another thread
    count than the fit's it must not call the same X a different one."""
    X = torch.randn(40_000, 64, generator=gen)  # its old one-sum fingerprint differed at 1 and 2
    off = torch.arange(0, 40_001, 40)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        fit = gk.kpca(X, off, n_components=2, gamma=0.01, solver="dense")
        torch.set_num_threads(1)
        betas = gk.project_onto_basis(X, fit, X[:3], gamma=0.01)
    finally:
        torch.set_num_threads(before)
    assert betas.shape == (1000, 2, 3)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("n", SIZES)
def test_rbf_gram_from_the_same_blocks_matches_float64_at_1_and_2_threads(small_tiles, n, dtype, gen):
    """gk.rbf_gram (reference) builds its symmetric Gram with the same blocks as kpca, on the
    common shift, and its cross Gram in row blocks: every block layout matches float64 on an
    offset cloud, the symmetric one bitwise symmetric with a unit diagonal, both (float32) with
    the same bits at 1 and 2 threads."""
    D, g = 7, 0.3
    X = (0.5 * torch.randn(n, D, generator=gen, dtype=torch.float64) + 40.0).to(dtype)
    Y = (0.5 * torch.randn(n + 3, D, generator=gen, dtype=torch.float64) + 40.0).to(dtype)
    outs = []
    for threads in (1, 2):
        before = _threads(threads)
        try:
            with gk.set_backend("reference"):
                outs.append((gk.rbf_gram(X, gamma=g), gk.rbf_gram(X, Y, gamma=g)))
        finally:
            torch.set_num_threads(before)
    (K, KY), (K2, KY2) = outs
    if dtype == torch.float32:  # float64: MKL's dgemm itself varies (see rbf._MKL_ROWS)
        assert torch.equal(K, K2) and torch.equal(KY, KY2), "bits depend on the thread count"
    assert torch.equal(K, K.T) and torch.equal(K.diagonal(), torch.ones(n, dtype=dtype))
    # offset 40, spread 0.5: without the shift float32 loses ~|x|^2 eps = 1e-2 here
    assert_close_rel(K, rbf_kernel(X.double().numpy(), gamma=g), TOL[dtype], "K(X, X)")
    assert_close_rel(KY, rbf_kernel(X.double().numpy(), Y.double().numpy(), gamma=g), TOL[dtype], "K(X, Y)")
