"""FedMC's Algorithm 1 under a total privacy budget (issue 14 item 3, ``--epsilon-total``): every
release gets the share of a client selected in every round (1 + rounds releases, one noise
multiplier), so no client spends more than the total and one selected less often spends less."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from conftest import save_blobs

from fedsim._validate_config import ConfigError, apply_resume_changes
from fedsim.augmenters import ClientData, FedMCAugmenter
from fedsim.runner import MethodSpec, RunConfig
from geomkern import fedmc, privacy

_SMALL = dict(n_prototypes=8, n_base=16, n_clusters=3, n_components=2, n_entries=6, protocol="algorithm1")


def _clients(n=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for k in range(n):
        x = torch.randn(60, 5, generator=g, dtype=torch.float64) + 3.0 * k
        out.append(ClientData(x / x.norm(dim=1, keepdim=True), torch.randint(0, 3, (60,), generator=g)))
    return out


def test_algorithm1_epsilon_total_bounds_every_client_and_fewer_rounds_spend_less():
    """3 rounds, S_r = {0,1}, {0,2}, {0,1}: client 0 makes 1 + 3 releases (the most possible),
    clients 1, 2, 3 make 3, 2, 1. Each release is a DP K-Means at the split epsilon; client 0 spends
    (nearly) all of the total, the others strictly less, in order."""
    total, clients = 3.0, _clients()
    a = FedMCAugmenter(**_SMALL, epsilon_total=total)
    a.rounds = 3
    a.setup(clients, n_classes=3, seed=5)
    for r, sel in enumerate(([0, 1], [0, 2], [0, 1])):
        a.begin_round(r, sel, clients, n_classes=3, seed=5)
        # what went up this round was released at the split epsilon (the LGD states what it spent)
        assert all(lgd.epsilon <= a.release_epsilon() for lgd in (a.upload("lgd", k, clients[k], round=r)["lgd"] for k in sel))
    per_release = privacy.split_epsilon(total, 1e-5, calls=4, releases=5)
    assert a.release_epsilon() == per_release < total
    priv = a.privacy(4)
    assert priv["releases_per_client"] == [4, 3, 2, 1]
    spent = priv["epsilon_spent"]
    assert all(e <= total for e in spent), spent
    assert spent[0] >= 0.99 * total  # the budget is used, not wasted
    assert spent[0] > spent[1] > spent[2] > spent[3]
    z = privacy.noise_multiplier(per_release, 1e-5, releases=5)  # what every call calibrates to
    assert spent == pytest.approx([privacy.compose_epsilon([(z, 5)] * n, 1e-5) for n in (4, 3, 2, 1)], rel=1e-12)


def test_algorithm1_epsilon_total_needs_the_rounds_and_inf_means_no_noise():
    a = FedMCAugmenter(**_SMALL, epsilon_total=2.0)
    with pytest.raises(ValueError, match="over the run's rounds"):
        a.setup(_clients(), n_classes=3, seed=0)
    b = FedMCAugmenter(**_SMALL, epsilon_total=math.inf)
    b.rounds = 30
    assert b.release_epsilon() == math.inf and b.p["clip_norm"] is None


def test_resume_cannot_grow_the_rounds_a_budget_was_split_over(tmp_path):
    spec = MethodSpec("a1", augmenter="fedmc", augmenter_params={"protocol": "algorithm1", "epsilon_total": 2.0})
    cfg = RunConfig(rounds=3, methods=[spec])
    with pytest.raises(ConfigError, match=r"--rounds 5: methods \['a1'\] split epsilon_total"):
        apply_resume_changes(cfg, {"rounds": 5}, tmp_path)
    ok = RunConfig(rounds=3, methods=[MethodSpec("f", augmenter="fedmc", augmenter_params={"epsilon_total": 2.0})])
    assert apply_resume_changes(ok, {"rounds": 5}, tmp_path) == ["rounds 3 -> 5"]  # fixed: two releases, any rounds


@pytest.mark.slow  # one short run (~10 s on a busy 2-core machine: the accountant's calibration)
def test_cli_epsilon_total_with_algorithm1_reports_what_each_client_spent(tmp_path):
    from fedsim.cli import main

    data = save_blobs(tmp_path / "blobs.npz", classes=4, dim=8, noise=0.6, n_train=240, n_test=80, seed=0)
    assert main(["run", "--dataset", str(data), "--clients", "4", "--rounds", "3", "--fraction", "0.5",
                 "--min-size", "5", "--algorithms", "fedavg", "--augmenters", "fedmc",
                 "--set", "fedmc.protocol=algorithm1", "--epsilon-total", "2", "--out", str(tmp_path / "o"),
                 "--quiet", "--threads", "1"]) == 0
    res = json.loads((tmp_path / "o" / "results.json").read_text())
    priv = res["methods"]["FedAvg+FedMC"]["seeds"]["0"]["privacy"]
    picks = [0] * 4  # the loop's client selection, round by round
    for r in range(3):
        for k in np.random.default_rng([0, r, 17]).choice(4, 2, replace=False).tolist():
            picks[k] += 1
    assert priv["releases_per_client"] == [1 + n for n in picks]
    spent = priv["epsilon_spent"]
    assert all(e <= 2.0 for e in spent), spent
    for i in range(4):
        for j in range(4):
            if picks[i] < picks[j]:
                assert spent[i] < spent[j]
    e = privacy.split_epsilon(2.0, 1e-5, calls=4, releases=5)
    assert spent == pytest.approx([fedmc.spent(e, 1e-5, iters=5, releases=1 + n) for n in picks], rel=1e-12)
