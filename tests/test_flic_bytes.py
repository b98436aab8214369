"""Byte accounting on the personalised path: a federation of one exchanges nothing."""
from __future__ import annotations

import torch

from fedsim.data.toy import linear_mapping
from fedsim.models import PersonalNet
from fedsim.personal import run_personal_method
from fedsim.runner import MethodSpec, RunConfig

SIZES = {"embed_dim": 4, "embed_hidden": 8, "hidden": 8}


def _cfg(rounds=2):
    return RunConfig(dataset="toy:linear-mapping", n_clients=6, rounds=rounds, local_epochs=1, batch_size=32,
                     lr=0.05, methods=[MethodSpec("Local", "local"), MethodSpec("FedRep", "fedrep")],
                     model="personal", model_params=SIZES)


def _shared_bytes(dim, n_classes):
    net = PersonalNet(dim, n_classes, **SIZES)
    return sum(v.numel() * v.element_size() for k, v in net.state_dict().items() if k.startswith(("embed.", "body.")))


def test_fedrep_group_of_one_sends_nothing(tmp_path):
    """Every client alone in its feature space: FedRep has nobody to average with, counts 0 bytes
    and trains exactly as local-only training does."""
    ds = linear_mapping(6, seed=0, n_spaces=6, n_train=20, n_test=20)
    cfg = _cfg()
    local, _ = run_personal_method(cfg, cfg.methods[0], 0, ds, tmp_path / "local", progress=False)
    fedrep, _ = run_personal_method(cfg, cfg.methods[1], 0, ds, tmp_path / "fedrep", progress=False)
    assert fedrep["bytes_up"] == 0 and fedrep["bytes_down"] == 0
    assert fedrep["client_accuracy"] == local["client_accuracy"] and fedrep["train_loss"] == local["train_loss"]


def test_fedrep_pairs_count_their_round_trip(tmp_path):
    """Two clients per space: each selected client uploads and downloads its space's shared part
    (embed + body, float32) every round, exactly."""
    ds = linear_mapping(6, seed=0, n_spaces=3, n_train=20, n_test=20)
    cfg = _cfg(rounds=2)
    res, _ = run_personal_method(cfg, cfg.methods[1], 0, ds, tmp_path / "fedrep", progress=False)
    per_round = sum(_shared_bytes(c.dim, ds.n_classes) for c in ds.clients)
    assert per_round > 0 and res["bytes_up"] == 2 * per_round and res["bytes_down"] == 2 * per_round


def test_mixed_group_sizes_count_only_the_shared(tmp_path):
    """Spaces of 1 and of several clients in one run: only clients with a partner count bytes."""
    ds = linear_mapping(6, seed=1, n_spaces=4, n_train=20, n_test=20)  # round robin: sizes 2, 2, 1, 1
    sizes = {s: sum(c.space == s for c in ds.clients) for s in ds.spaces}
    assert sorted(sizes.values()) == [1, 1, 2, 2]
    cfg = _cfg(rounds=1)
    res, _ = run_personal_method(cfg, cfg.methods[1], 0, ds, tmp_path / "fedrep", progress=False)
    expected = sum(_shared_bytes(c.dim, ds.n_classes) for c in ds.clients if sizes[c.space] > 1)
    assert res["bytes_up"] == expected == res["bytes_down"]
    assert torch.tensor(expected) > 0
