"""GGEUR's exchange in memory that grows with what the clients hold, not with clients x C x D x D
(issue 17, scale): the class-by-class pooling, HeldStatistics on the server, the Flower server's
batched exchange and the geometry a Flower client keeps. Every path gives the same numbers as the
dense one, bit for bit."""
from __future__ import annotations

import pytest
import torch

from geomkern import ggeur, pool_moments
from geomkern.ops.moments import pool_moments_by_class


def _stats(K=9, C=5, D=12, seed=0):
    """K clients' ClassStatistics; some classes held by nobody, some clients without rows."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for k in range(K):
        n = 0 if k == 3 else int(torch.randint(2, 30, (1,), generator=g))
        y = torch.randint(0, C - 1, (n,), generator=g)  # class C-1: held by nobody
        x = torch.randn(n, D, generator=g) + y.unsqueeze(1).float()
        out.append(ggeur.local_statistics(x, y, C))
    return out


# (40, 6, 33), (31, 7, 47), (13, 11, 7): shapes where a per-class einsum sums in another order than
# pool_moments' batched product; D = 384: the embedded data's dimension
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("K,C,D,dtype", [(40, 6, 33, torch.float32), (31, 7, 47, torch.float32),
                                         (13, 11, 7, torch.float32), (20, 3, 384, torch.float32),
                                         (40, 6, 33, torch.float64), (9, 5, 12, torch.float64)])
def test_pool_by_class_is_pool_moments_bit_for_bit(threads, K, C, D, dtype):
    g = torch.Generator().manual_seed(K * C * D)
    counts = torch.randint(0, 30, (K, C), generator=g) * (torch.rand(K, C, generator=g) < 0.6)
    means = torch.randn(K, C, D, generator=g, dtype=dtype) * (counts > 0).unsqueeze(-1)
    A = torch.randn(K, C, D, 4, generator=g, dtype=dtype)
    covs = (A @ A.mT) * (counts > 0).view(K, C, 1, 1)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        dense = pool_moments(counts, means, covs)
        by_class = pool_moments_by_class(counts, means, lambda c, out: out.copy_(covs[:, c]))
    finally:
        torch.set_num_threads(old)
    for a, b in zip(dense, by_class):
        assert torch.equal(a, b)


def test_pool_by_class_checks_counts():
    stats = _stats(K=3, C=4, D=5)
    counts = torch.stack([s.counts for s in stats])
    means = torch.stack([s.means for s in stats])
    with pytest.raises(ValueError, match="counts must be a"):
        pool_moments_by_class(counts[:2], means, lambda c, out: None)
    with pytest.raises(ValueError, match="counts must be >= 0"):
        pool_moments_by_class(-counts, means, lambda c, out: None)


def test_held_statistics_keep_the_held_classes_and_aggregate_identically():
    stats = _stats()
    held = [ggeur.HeldStatistics.from_statistics(s) for s in stats]
    for s, h in zip(stats, held):
        assert h.covs.shape[0] == int((s.counts > 0).sum()) < s.n_classes  # only the held classes' D x D
        assert h.nbytes() == s.nbytes()  # the bytes that went up are the dense container's
    full, compact = ggeur.aggregate(stats), ggeur.aggregate(held)
    mixed = ggeur.aggregate([h if k % 2 else s for k, (s, h) in enumerate(zip(stats, held))])
    for g in (compact, mixed):
        for f in ggeur.GlobalGeometry._TENSORS:
            assert torch.equal(getattr(g, f), getattr(full, f))
    groups = list(range(len(stats)))
    for a, b in zip(ggeur.group_prototypes(stats, groups, exclude=[1]),
                    ggeur.group_prototypes(held, groups, exclude=[1])):
        assert torch.equal(a, b)


def test_the_geometry_is_the_dense_pooling_of_the_stacked_statistics():
    """aggregate (now class by class) against pool_moments on the stacked statistics followed by
    aggregate's own steps: the geometry the scale change must not move."""
    from geomkern.ops.eigh import eigh

    stats = _stats(K=12, C=4, D=10, seed=3)
    counts, mu, cov = pool_moments(torch.stack([s.counts for s in stats]), torch.stack([s.means for s in stats]),
                                   torch.stack([s.covs for s in stats]))
    cov = 0.5 * (cov + cov.mT)
    ev, V = eigh(cov, k=cov.shape[-1])
    tol = cov.shape[-1] * torch.finfo(ev.dtype).eps * ev[:, :1].clamp_min(0)
    ev = torch.where(ev > tol, ev, torch.zeros_like(ev))
    g = ggeur.aggregate(stats)
    for a, b in zip((counts, mu, ev, V), (g.counts, g.means, g.eigenvalues, g.eigenvectors)):
        assert torch.equal(a, b)


def test_a_nonzero_covariance_of_an_unheld_class_is_kept():
    """HeldStatistics stays exact for statistics that break the zero-covariance convention."""
    s = _stats(K=1, C=4, D=6)[0]
    covs = s.covs.clone()
    covs[3] = torch.eye(6)  # class 3 has count 0
    odd = ggeur.ClassStatistics(s.counts, s.means, covs)
    h = ggeur.HeldStatistics.from_statistics(odd)
    assert 3 in h.classes.tolist()
    out = torch.zeros(6, 6)
    h.class_covariance(3, out)
    assert torch.equal(out, torch.eye(6))


# ---------------------------------------------------------------------- Flower (the extra)
@pytest.mark.slow  # ~25 s on the busy machine
def test_flower_exchange_in_batches_and_kept_geometry_give_the_local_results(tmp_path, monkeypatch):
    """The Flower server sends GGEUR's upload and geometry messages in batches (here of 2 clients)
    and each client keeps only its classes' eigenvectors: results identical to the local engine."""
    pytest.importorskip("flwr")
    from conftest import save_blobs
    from test_flower import InProcessGrid, _cfg, _seed_metrics

    from fedsim.flower import exchange
    from fedsim.flower.server_app import FlowerEngine
    from fedsim.runner import MethodSpec, run

    blobs = save_blobs(tmp_path / "blobs.npz", classes=6, dim=8, noise=0.6, n_train=150, n_test=60, seed=1)
    methods = [MethodSpec("FedAvg+GGEUR", augmenter="ggeur")]
    cfg = dict(n_clients=5, beta=0.1, min_size=3, client_fraction=0.6, rounds=1)
    local = run(_cfg(blobs, methods, **cfg), tmp_path / "local", progress=False)
    monkeypatch.setattr(exchange, "EXCHANGE_BATCH", 2)
    sent = []
    grid = InProcessGrid(5)
    send = grid.send_and_receive
    def counted(msgs, **kw):
        sent.append((msgs[0].metadata.message_type, len(msgs)))
        return send(msgs, **kw)

    grid.send_and_receive = counted
    flower = run(_cfg(blobs, methods, **cfg), tmp_path / "flower", progress=False, engine=FlowerEngine(grid))
    assert _seed_metrics(flower) == _seed_metrics(local)
    assert [n for kind, n in sent if kind == "query.upload"] == [2, 2, 1]
    assert [n for kind, n in sent if kind == "query.download"] == [2, 2, 1]
    for ctx in grid.contexts.values():  # what a node keeps: the eigenvectors of the classes it samples
        kept = ctx.state.array_records["0.0.aug.arrays"].to_torch_state_dict()
        assert kept["eigenvectors"].shape[0] == kept["classes"].numel() < 6
        assert "0.0.aug" not in ctx.state.config_records or not ctx.state.config_records["0.0.aug"]


def test_a_client_keeps_the_eigenvectors_it_samples_and_draws_the_same():
    """GGEURAugmenter.client_state / load_client_state (what a Flower client keeps between
    messages): the classes of the client's rows and of its prototypes (multi-domain step), nothing
    else; the same draws as with the whole geometry."""
    from fedsim.augmenters import ClientData, build_augmenter

    stats = _stats(K=4, C=6, D=12)  # class 5: held by nobody
    geometry = ggeur.aggregate(stats)
    g = torch.Generator().manual_seed(2)
    data = ClientData(torch.randn(7, 12, generator=g), torch.tensor([0, 0, 2, 2, 2, 0, 0]))
    for others in (None, (torch.randn(2, 12, generator=g), torch.tensor([1, 4]))):
        down = {"geometry": geometry, **({} if others is None else {"prototypes": others[0], "labels": others[1]})}
        full = build_augmenter("ggeur", prototypes=others is not None)
        full.bind(n_classes=6, seed=0)
        full.download("statistics", 1, down, round=None)
        kept = full.client_state(1, data)
        want = [0, 2] if others is None else [0, 1, 2, 4]
        assert kept["classes"].tolist() == want and kept["eigenvectors"].shape == (len(want), 12, 12)
        again = build_augmenter("ggeur", prototypes=others is not None)
        again.bind(n_classes=6, seed=0)
        again.load_client_state(1, kept)
        for a, b in zip(full.augment(1, data, generator=torch.Generator().manual_seed(5)),
                        again.augment(1, data, generator=torch.Generator().manual_seed(5))):
            assert torch.equal(a, b) and a.numel()
