"""The augmenters' exchange hooks used directly, as a Flower app of one's own uses them
(fedsim/flower/exchange.py, examples/flower_exchange): misuse gets an error that names the fix."""
from __future__ import annotations

import re

import pytest
import torch

from fedsim.augmenters import ClientData, FedMCAlgorithm1, FedMCFixed, build_augmenter


def _data(seed=0, n=30):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    return ClientData(x / x.norm(dim=1, keepdim=True), torch.randint(0, 3, (n,), generator=g))


SMALL = {"n_prototypes": 4, "n_base": 8, "n_clusters": 2, "n_components": 2, "n_entries": 4}


def test_fedmc_builds_its_protocols_class_and_refuses_a_bad_protocol_by_name():
    assert type(build_augmenter("fedmc", **SMALL)) is FedMCAlgorithm1
    assert type(build_augmenter("fedmc", protocol="fixed", **SMALL)) is FedMCFixed
    assert type(build_augmenter("fedmc-fixed", **SMALL)) is FedMCFixed
    for bad in (3, ["fixed"], "algorithm2"):
        with pytest.raises(ValueError, match=re.escape(f"protocol={bad!r} is not known; choose one of")):
            build_augmenter("fedmc", protocol=bad)


@pytest.mark.parametrize("name,step", [("ggeur", "statistics"), ("fedmc", "prototypes")])
def test_a_hook_before_bind_says_to_bind(name, step):
    aug = build_augmenter(name)
    with pytest.raises(AttributeError, match=f"augmenter '{name}' is not bound to a run: call bind"):
        aug.upload(step, 0, _data(), round=None)


def test_the_hooks_by_hand_give_what_setup_gives():
    """upload -> accept -> aggregate -> download by hand, one object per client (as separate
    processes would hold them), gives every client the geometry the in-process setup gives, and
    the same draws."""
    clients = [_data(k) for k in range(3)]
    ref = build_augmenter("ggeur", target_per_class=20)
    ref.setup(clients, n_classes=3, seed=4)
    server = build_augmenter("ggeur", target_per_class=20)
    server.bind(n_classes=3, seed=4, dim=4, dtype=torch.float32)
    [(step, cids)] = server.steps(None, [0, 1, 2])
    client_objs = {}
    uploads = {}
    for k in cids:
        client_objs[k] = build_augmenter("ggeur", target_per_class=20)
        client_objs[k].bind(n_classes=3, seed=4)
        uploads[k] = server.accept(step, k, client_objs[k].upload(step, k, clients[k], round=None), round=None)
    downloads = server.aggregate(step, uploads, round=None, clients=cids, rejected=[])
    assert server.setup_bytes == ref.setup_bytes and server.setup_bytes[0] > 0
    for k, payload in downloads.items():
        client_objs[k].download(step, k, payload, round=None)
        a = client_objs[k].augment(k, clients[k], generator=torch.Generator().manual_seed(9))
        b = ref.augment(k, clients[k], generator=torch.Generator().manual_seed(9))
        assert all(torch.equal(u, v) for u, v in zip(a, b)) and a[0].shape[0] > 0


def test_an_upload_of_the_wrong_width_is_refused_by_accept():
    server = build_augmenter("ggeur")
    server.bind(n_classes=3, seed=0, dim=5, dtype=torch.float32)
    client = build_augmenter("ggeur")
    client.bind(n_classes=3, seed=0)
    with pytest.raises(ValueError, match="client 2's GGEUR statistics are torch.float32 in D=4; the run has "
                                         "torch.float32 in D=5"):
        server.accept("statistics", 2, client.upload("statistics", 2, _data(), round=None), round=None)


def test_a_gab_whose_median_distance_is_zero_names_the_option_that_fixes_it(tmp_path):
    """Issue 30: every row the same, so the GAB's median pairwise distance is 0: the message names
    --set fedmc.gamma (it said "pass an explicit gamma" without saying where), and the fresh run's
    folder is removed."""
    from fedsim.data import Dataset, save_dataset
    from fedsim.runner import MethodSpec, RunConfig, run

    x = torch.full((80, 4), 0.5)
    y = torch.arange(80) % 2
    save_dataset(Dataset("same", x, y, x[:20], y[:20], ["a", "b"]), tmp_path / "same.npz")
    cfg = RunConfig(dataset=str(tmp_path / "same.npz"), n_clients=2, rounds=1, min_size=5,
                    methods=[MethodSpec("m", augmenter="fedmc", augmenter_params=SMALL)])
    with pytest.raises(ValueError, match=r"gamma='median' cannot be resolved .* --set fedmc.gamma=VALUE"):
        run(cfg, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------------------------------------
# Folded from test_ggeur_memory.py:
# GGEUR's exchange in batches on the Flower server (issue 17, scale): same results as the local
# engine.

@pytest.mark.slow  # ~25 s on the busy machine
def test_flower_exchange_in_batches_and_kept_geometry_give_the_local_results(tmp_path, monkeypatch):
    """The Flower server sends GGEUR's upload and geometry messages in batches (here of 2 clients)
    and each client keeps only its classes' eigenvectors: results identical to the local engine."""
    pytest.importorskip("flwr")
    from _fedsim_helpers import save_blobs
    from test_flower import InProcessGrid, _cfg, _seed_metrics

    from fedsim.flower import exchange
    from fedsim.flower.engine import FlowerEngine
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
