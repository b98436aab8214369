"""FedMC as the paper writes it (issue 14 items 2, 3, 6): the literal Eq. 10-13 target, the
Algorithm 1 protocol in the round loop, and plain K-Means without clipping at epsilon = inf."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from _fedsim_helpers import interrupted_after, save_blobs
from _ggeur_clients import client_statistics

import geomkern as gk
from fedsim import client as client_module  # local_train: what client.client_round calls
from fedsim import runner
from fedsim.augmenters import ClientData, FedMCAlgorithm1, FedMCAugmenter, FedMCFixed, build_augmenter
from fedsim.config import ConfigError
from fedsim.data.clients import client_data
from fedsim.data.partition import partition
from fedsim.plugins import apply_resume_changes
from fedsim.runner import MethodSpec, RunConfig, validate
from geomkern import fedmc, ggeur, privacy

F64 = dict(dtype=torch.float64)


# ------------------------------------------------------------------ item 2: the literal paper target
def _tiny():
    """D = 1, basis b = (0, 1), gamma = ln 2, so k(0, 1) = 1/2 and G = [[1, .5], [.5, 1]]; one entry
    with d = 1, Gram eigenvalue mu = 4 (variance 0.4) and beta = (0.6, 0.8)."""
    B = torch.tensor([[0.0], [1.0]], **F64)
    D = fedmc.GeometryDictionary(prototypes=torch.tensor([[0.5]], **F64), weights=torch.tensor([10.0], **F64),
                                 eigenvalues=torch.tensor([[4.0]], **F64), variances=torch.tensor([[0.4]], **F64),
                                 betas=torch.tensor([[[0.6, 0.8]]], **F64), gamma=math.log(2.0))
    return fedmc.prepare(D, B)


def test_paper_target_is_eq_10_13_computed_by_hand():
    """By hand: beta G = (0.6 + 0.8/2, 0.6/2 + 0.8) = (1.0, 1.1). x = 0: k(x, B) = (1, .5),
    p = 0.6 + 0.4 = 1.0; x = 1: k(x, B) = (.5, 1), p = 0.3 + 0.8 = 1.1. With no perturbation
    T = p beta G: (1.0, 1.1) and (1.1, 1.21); with eps: p' = p + eps sqrt(mu) = p + 2 eps."""
    prep = _tiny()
    x = torch.tensor([[0.0], [1.0]], **F64)
    T, T0 = fedmc.targets(x, prep, formulation="paper", scale=0.0, generator=torch.Generator().manual_seed(0))
    hand = torch.tensor([[1.0, 1.1], [1.1, 1.21]], **F64)
    torch.testing.assert_close(T, hand, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(T0, hand, rtol=1e-12, atol=1e-12)
    T, T0 = fedmc.targets(x, prep, formulation="paper", scale=1.0, generator=torch.Generator().manual_seed(7))
    eps = torch.randn(2, 1, generator=torch.Generator().manual_seed(7), **F64)[:, 0]  # the one draw per row
    p_new = torch.tensor([1.0, 1.1], **F64) + 2.0 * eps
    torch.testing.assert_close(T, p_new[:, None] * torch.tensor([1.0, 1.1], **F64), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(T0, hand, rtol=1e-12, atol=1e-12)
    # hybrid: x's own kernel values plus the same perturbation, (1, .5) + 2 eps (1.0, 1.1) at x = 0
    Th, T0h = fedmc.targets(x[:1], prep, formulation="hybrid", scale=1.0, generator=torch.Generator().manual_seed(7))
    torch.testing.assert_close(T0h, torch.tensor([[1.0, 0.5]], **F64), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(Th, torch.tensor([[1.0, 0.5]], **F64) + 2.0 * eps[0] * torch.tensor([[1.0, 1.1]], **F64),
                               rtol=1e-12, atol=1e-12)


def test_paper_gd_pre_image_meets_the_literal_target_and_anchoring_cancels_it():
    """calibrate hands gd exactly these targets: unanchored, the scale-0 sample is the pre-image of
    p beta G (x = 0 moves: its target (1.0, 1.1) is not k(0, B) = (1, .5)); anchored it is x."""
    prep = _tiny()
    x = torch.tensor([[0.0], [1.0]], **F64)
    T, _ = fedmc.targets(x, prep, formulation="paper", scale=0.0, generator=None)
    z = fedmc.calibrate(x, prep, formulation="paper", method="gd", scale=0.0, anchored=False, steps=500,
                        generator=None)
    direct = gk.preimage(x, prep.basis, T, gamma=prep.gamma, method="gd", steps=500)
    torch.testing.assert_close(z, direct, rtol=0, atol=0)
    assert float((z - x).abs().max()) > 1e-3
    a = fedmc.calibrate(x, prep, formulation="paper", method="gd", scale=0.0, generator=None)
    torch.testing.assert_close(a, x, rtol=0, atol=1e-12)


# ------------------------------------------------------------------ item 6: epsilon = inf is plain K-Means
def test_infinite_epsilon_is_plain_kmeanspp_without_clipping():
    g = torch.Generator().manual_seed(3)
    X = torch.randn(300, 6, generator=g, **F64)
    X = 10.0 * X / X.norm(dim=1, keepdim=True)  # rows of norm 10
    X[:150] += 4.0  # two groups, so the centres are far from the origin
    protos = fedmc.client_prototypes(X, 5, epsilon=math.inf, delta=1e-5, generator=torch.Generator().manual_seed(11))
    seed = int(torch.randint(0, 2 ** 62, (1,), generator=torch.Generator().manual_seed(11)))  # the documented draw
    labels, centers = gk.kmeans(X, 5, seed=seed)
    torch.testing.assert_close(protos.centers, centers, rtol=0, atol=0)
    torch.testing.assert_close(protos.counts, torch.bincount(labels, minlength=5).to(X.dtype), rtol=0, atol=0)
    assert float(protos.centers.norm(dim=1).min()) > 1.5  # not collapsed into the unit ball
    assert math.isinf(protos.epsilon)
    B = protos.centers
    lgd = fedmc.local_geometry(X, B, n_clusters=5, n_components=2, gamma=0.01,
                               generator=torch.Generator().manual_seed(11))
    torch.testing.assert_close(lgd.centers, centers, rtol=0, atol=0)
    # clipping only when asked
    clipped = fedmc.client_prototypes(X, 5, epsilon=math.inf, delta=1e-5, clip_norm=1.0,
                                      generator=torch.Generator().manual_seed(11))
    assert float(clipped.centers.norm(dim=1).max()) <= 1.0 + 1e-12


def test_finite_epsilon_requires_clip_norm():
    X = torch.randn(50, 4, **F64)
    with pytest.raises(ValueError, match="clip_norm is required"):
        fedmc.client_prototypes(X, 3, epsilon=2.0, delta=1e-5, generator=None)
    with pytest.raises(ValueError, match="clip_norm is required"):
        fedmc.local_geometry(X, X[:8], n_clusters=3, n_components=2, gamma=0.5, epsilon=2.0, generator=None)
    with pytest.raises(ValueError, match="clip_norm is required"):
        fedmc.setup([X, X], generators=[None, None], n_prototypes=4, n_base=6, n_clusters=2, n_components=2,
                    n_entries=3, epsilon_total=4.0)
    # fedsim's documented default: a finite epsilon without clip_norm clips at 1.0 (unit-norm rows)
    assert FedMCAlgorithm1(epsilon=1.0).p["clip_norm"] == 1.0 and FedMCAlgorithm1().p["clip_norm"] is None
    assert FedMCAlgorithm1(epsilon_total=3.0).p["clip_norm"] == 1.0
    assert FedMCAlgorithm1(epsilon=1.0, clip_norm=5.0).p["clip_norm"] == 5.0
    res = fedmc.client_prototypes(X, 3, epsilon=2.0, delta=1e-5, clip_norm=1.0, generator=None)
    assert res.epsilon <= 2.0 and float(res.centers.norm(dim=1).max()) <= 1.0 + 1e-12


# ------------------------------------------------------------------ item 3: Algorithm 1
def _clients(n=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for k in range(n):
        x = torch.randn(60, 5, generator=g, **F64) + 3.0 * k
        out.append(ClientData(x / x.norm(dim=1, keepdim=True), torch.randint(0, 3, (60,), generator=g)))
    return out


_SMALL = dict(n_prototypes=8, n_base=16, n_clusters=3, n_components=2, n_entries=6, protocol="algorithm1")


def test_algorithm1_round_geometry_comes_from_the_round_clients_only():
    clients = _clients()
    a = FedMCAlgorithm1(**_SMALL)
    a.setup(clients, n_classes=3, seed=5)
    a.begin_round(0, [0, 2], clients, n_classes=3, seed=5)
    assert a.prepared is None and not a.replaces_data  # round 1: no dictionary yet, real data
    x, y = a.augment(0, clients[0], generator=torch.Generator().manual_seed(0))
    assert x.shape[0] == 0
    D0 = a._next
    # the same round with other data on the clients outside S_0 fuses the same dictionary
    changed = [c if k in (0, 2) else ClientData(torch.randn_like(c.x), c.y) for k, c in enumerate(clients)]
    b = FedMCAlgorithm1(**_SMALL)
    b.setup(clients, n_classes=3, seed=5)
    b.begin_round(0, [0, 2], changed, n_classes=3, seed=5)
    assert torch.equal(b._next.betas, D0.betas) and torch.equal(b._next.prototypes, D0.prototypes)
    c = FedMCAlgorithm1(**_SMALL)  # a client inside S_0 does change it
    c.setup(clients, n_classes=3, seed=5)
    c.begin_round(0, [0, 2], [changed[1], changed[1], clients[2], clients[3]], n_classes=3, seed=5)
    assert not torch.equal(c._next.prototypes, D0.prototypes)
    # bytes: round 0 uploads S_0's LGDs and downloads nothing; round 1 sends D_0 to S_1
    up0 = a.round_bytes[0]
    assert up0 > 0 and a.round_bytes[1] == 0
    a.begin_round(1, [1, 3], clients, n_classes=3, seed=5)
    assert a.dictionary is D0 and a.replaces_data
    assert a.round_bytes[1] == 2 * D0.nbytes()
    # training set: one calibrated x' per x, none of them a real row
    x, y = a.augment(1, clients[1], generator=torch.Generator().manual_seed(0))
    assert x.shape == clients[1].x.shape and torch.equal(y, clients[1].y)
    assert float((x - clients[1].x).norm(dim=1).min()) > 0
    assert a.released == [2, 2, 2, 2]  # prototypes + one patch release each


def test_algorithm1_is_the_default_and_refuses_the_fixed_protocols_budget():
    """fedmc is Algorithm 1 (it measured above "fixed" at every beta, docs/history.md §16); the added-
    sample budget exists only under fedmc-fixed, so setting it on fedmc is refused by name rather
    than ignored; a configuration written before fedmc-fixed (fedmc, protocol "fixed") builds it."""
    assert build_augmenter("fedmc").p["protocol"] == "algorithm1"
    for knob in (dict(target_per_class=200), dict(n_per_sample=1)):
        with pytest.raises(ValueError, match=f"{next(iter(knob))}.*fedmc-fixed.*protocol = \"fixed\""):
            build_augmenter("fedmc", **knob)
        with pytest.raises(ValueError, match=next(iter(knob))):
            build_augmenter("fedmc", protocol="algorithm1", **knob)
        old, new = build_augmenter("fedmc", protocol="fixed", **knob), build_augmenter("fedmc-fixed", **knob)
        assert type(old) is type(new) is FedMCFixed and old.p == new.p and "protocol" not in new.p
    with pytest.raises(ValueError, match="protocol='fixed' is the augmenter 'fedmc-fixed'"):
        FedMCAlgorithm1(protocol="fixed")  # the class itself is Algorithm 1 only
    with pytest.raises(TypeError, match="abstract"):
        FedMCAugmenter()  # the shared steps are no augmenter of their own


@pytest.fixture(scope="module")
def blobs(tmp_path_factory):
    return save_blobs(tmp_path_factory.mktemp("data") / "blobs.npz", classes=4, dim=8, noise=0.6,
                      n_train=400, n_test=100, seed=0)


def _cfg(path, rounds=3, **aug):
    return RunConfig(dataset=str(path), rounds=rounds, n_clients=4, beta=0.5, batch_size=32, min_size=5,
                     client_fraction=0.5, methods=[MethodSpec("a1", augmenter="fedmc",
                                                              augmenter_params={**_SMALL, **aug})])


def test_algorithm1_resumes_from_its_state_exactly():
    """A fresh augmenter given the state after round 2 (what the checkpoint keeps) rebuilds D_1 from
    (seed, 1, S_1) and goes on exactly as the uninterrupted one: same dictionary, samples, bytes."""
    clients = _clients()
    rounds = ([0, 1], [1, 3], [0, 2])
    a = FedMCAlgorithm1(**_SMALL)
    a.setup(clients, n_classes=3, seed=5)
    for r, sel in enumerate(rounds[:2]):
        a.begin_round(r, sel, clients, n_classes=3, seed=5)
    state = a.state_dict()
    a.begin_round(2, rounds[2], clients, n_classes=3, seed=5)
    b = FedMCAlgorithm1(**_SMALL)
    b.setup(clients, n_classes=3, seed=5)
    b.load_state_dict(state)
    b.begin_round(2, rounds[2], clients, n_classes=3, seed=5)
    for x, y in ((a.dictionary, b.dictionary), (a._next, b._next)):
        assert all(torch.equal(getattr(x, k), getattr(y, k)) for k in ("prototypes", "weights", "variances", "betas"))
    assert a.round_bytes == b.round_bytes and a.privacy(4) == b.privacy(4)
    za, _ = a.augment(2, clients[2], generator=torch.Generator().manual_seed(1))
    zb, _ = b.augment(2, clients[2], generator=torch.Generator().manual_seed(1))
    assert torch.equal(za, zb)


@pytest.mark.slow  # three short runs (~10 s on a busy 2-core machine)
def test_algorithm1_in_the_loop_calibrated_only_exact_resume_composed_privacy(tmp_path, blobs, monkeypatch):
    """One run: every client trains on one calibrated x' per real x (round 1: its real data); the
    run interrupted after round 2 and resumed writes the same results.json; results.json reports
    each client's releases (the epsilon they compose to: test_algorithm1_privacy_composes)."""
    seen = []
    real = client_module.local_train

    def spy(algo, ctx, **kw):
        seen.append((ctx.round, ctx.cid, ctx.x.clone(), ctx.n_real))
        return real(algo, ctx, **kw)

    monkeypatch.setattr(client_module, "local_train", spy)
    full = runner.run(_cfg(blobs), tmp_path / "full", progress=False)
    monkeypatch.setattr(client_module, "local_train", real)
    ds = runner.load_dataset(str(blobs))
    parts = partition("dirichlet", labels=ds.y_train, domains=None, n_clients=4, beta=0.5, seed=0, min_size=5)
    # each client's training rows: its part less its validation rows (data.clients.client_data)
    clients, _ = client_data(validate(_cfg(blobs)), ds, parts, 0)
    assert {r for r, *_ in seen} == {0, 1, 2}
    for r, cid, x, n_real in seen:
        own = clients[cid].x.to(x.dtype)
        assert x.shape[0] == n_real == own.shape[0]  # one sample per real row, nothing added
        if r == 0:
            assert torch.equal(x, own)
        else:  # calibrated only: row i is x'_i, calibrated from real row i
            assert bool(((x - own).norm(dim=1) > 0).all())

    with interrupted_after(monkeypatch, runner, 2), pytest.raises(KeyboardInterrupt):
        runner.run(_cfg(blobs), tmp_path / "cut", progress=False)
    runner.run(RunConfig(), tmp_path / "cut", resume=True, progress=False)
    a = json.loads((tmp_path / "full" / "results.json").read_text())
    b = json.loads((tmp_path / "cut" / "results.json").read_text())
    assert a == b

    picks = [0] * 4  # the loop's client selection, round by round
    for r in range(3):
        for k in np.random.default_rng([0, r, 17]).choice(4, 2, replace=False).tolist():
            picks[k] += 1
    priv = full["methods"]["a1"]["seeds"]["0"]["privacy"]
    assert priv["releases_per_client"] == [1 + n for n in picks]
    assert priv["epsilon_spent"] == [None] * 4  # epsilon = inf: nothing claimed
    assert len(set(picks)) > 1


def test_algorithm1_privacy_composes_over_rounds():
    """Every round a client takes part in is one more DP release of its patches; its epsilon is
    the PLD accountant's total over those and its prototypes' release (same z each call)."""
    from geomkern import privacy

    clients = _clients()
    a = FedMCAlgorithm1(**_SMALL, epsilon=2.0, clip_norm=1.0)
    a.setup(clients, n_classes=3, seed=5)
    for r, sel in enumerate(([0, 1], [0, 2], [0, 1])):
        a.begin_round(r, sel, clients, n_classes=3, seed=5)
    priv = a.privacy(4)
    assert priv["releases_per_client"] == [4, 3, 2, 1]
    z = privacy.noise_multiplier(2.0, 1e-5, releases=5)
    want = [privacy.compose_epsilon([(z, 5)] * n, 1e-5) for n in (4, 3, 2, 1)]
    assert priv["epsilon_spent"] == pytest.approx(want, rel=1e-12)
    assert want[0] > want[1] > want[2] > want[3] and want[3] <= 2.0


# ------------------------------------------------------------------------------------------------
# Folded from test_fedmc_algorithm1_budget.py:
# FedMC's Algorithm 1 under a total privacy budget (issue 14 item 3, ``--epsilon-total``): every
# release gets the share of a client selected in every round (1 + rounds releases, one noise
# multiplier), so no client spends more than the total and one selected less often spends less.

def test_algorithm1_epsilon_total_bounds_every_client_and_fewer_rounds_spend_less():
    """3 rounds, S_r = {0,1}, {0,2}, {0,1}: client 0 makes 1 + 3 releases (the most possible),
    clients 1, 2, 3 make 3, 2, 1. Each release is a DP K-Means at the split epsilon; client 0 spends
    (nearly) all of the total, the others strictly less, in order."""
    total, clients = 3.0, _clients()
    a = FedMCAlgorithm1(**_SMALL, epsilon_total=total)
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
    a = FedMCAlgorithm1(**_SMALL, epsilon_total=2.0)
    with pytest.raises(ValueError, match="over the run's rounds"):
        a.setup(_clients(), n_classes=3, seed=0)
    b = FedMCAlgorithm1(**_SMALL, epsilon_total=math.inf)
    b.rounds = 30
    assert b.release_epsilon() == math.inf and b.p["clip_norm"] is None


@pytest.mark.parametrize("params", ({"protocol": "algorithm1"}, {}), ids=("protocol-given", "default-protocol"))
def test_resume_cannot_grow_the_rounds_a_budget_was_split_over(tmp_path, params):
    # the default protocol, left unset (as --augmenters fedmc --epsilon-total writes it), was let through
    spec = MethodSpec("a1", augmenter="fedmc", augmenter_params={**params, "epsilon_total": 2.0})
    cfg = RunConfig(rounds=3, methods=[spec])
    with pytest.raises(ConfigError, match=r"--rounds 5: methods \['a1'\] split epsilon_total"):
        apply_resume_changes(cfg, {"rounds": 5}, tmp_path)
    # the one-time protocol: two releases, whatever the rounds (the "ok" case here was "fedmc" without a
    # protocol, written when that meant "fixed"; after the default became algorithm1 it let the bug through)
    for name, extra in (("fedmc-fixed", {}), ("fedmc", {"protocol": "fixed"})):
        ok = RunConfig(rounds=3, methods=[MethodSpec("f", augmenter=name, augmenter_params={**extra, "epsilon_total": 2.0})])
        assert apply_resume_changes(ok, {"rounds": 5}, tmp_path) == ["rounds 3 -> 5"]


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


# ------------------------------------------------------------------------------------------------
# Folded from test_ggeur_memory.py:
# GGEUR's geometry a client keeps between messages (issue 17, scale).

def test_a_client_keeps_the_eigenvectors_it_samples_and_draws_the_same():
    """GGEURAugmenter.client_state / load_client_state (what a Flower client keeps between
    messages): the classes of the client's rows and of its prototypes (multi-domain step), nothing
    else; the same draws as with the whole geometry."""
    from fedsim.augmenters import ClientData, build_augmenter

    stats = client_statistics(K=4, C=6, D=12)  # class 5: held by nobody
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
