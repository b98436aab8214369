"""FLIC at a high learning rate: the divergence of docs/flic.md ("Divergence at lr 0.2"), small.

On a 6-client linear-mapping toy, lr 0.2 with the default lam 0.1 blows up within the first
client's local training (with lam 0 the same run trains: 0.36 final loss, measured), and ``max_grad_norm`` keeps it finite
while counting the steps it rescaled."""
from __future__ import annotations

import math

import pytest

from fedsim.algorithms import build_algorithm
from fedsim.client import DivergedError
from fedsim.data.toy import linear_mapping
from fedsim.personal import run_personal_method
from fedsim.runner import MethodSpec, RunConfig


def _run(tmp_path, name, rounds=3, **params):
    ds = linear_mapping(6, seed=0, n_spaces=3, n_train=40, n_test=40)
    spec = MethodSpec("FLIC", "flic", algorithm_params=params)
    cfg = RunConfig(dataset="toy:linear-mapping", n_clients=6, rounds=rounds, local_epochs=3, batch_size=16,
                    lr=0.2, methods=[spec], model="personal")
    return run_personal_method(cfg, spec, 0, ds, tmp_path / name, progress=False)[0]


def test_high_lr_diverges_without_and_trains_with_max_grad_norm(tmp_path):
    with pytest.raises(DivergedError):
        _run(tmp_path, "plain")
    res = _run(tmp_path, "clipped", max_grad_norm=5.0)
    assert all(math.isfinite(v) for v in res["train_loss"]) and res["final_accuracy"] > 0.3
    assert res["clipped_steps"] > 0  # reported, not silent
    assert build_algorithm("flic").run_report() == {}  # off by default: nothing to report


def test_clipped_steps_survive_resume(tmp_path):
    straight = _run(tmp_path, "a", rounds=2, max_grad_norm=5.0)
    _run(tmp_path, "b", rounds=1, max_grad_norm=5.0)
    resumed = _run(tmp_path, "b", rounds=2, max_grad_norm=5.0)
    assert straight == resumed and straight["clipped_steps"] > 0


def test_bad_max_grad_norm_named():
    for bad in (-1.0, float("nan"), "5", True):
        with pytest.raises(ValueError, match="max_grad_norm"):
            build_algorithm("flic", max_grad_norm=bad)
