"""FedMP: prototype EMA (Eq. 6-7), the feature bank's sampling, the alignment loss, the adaptive
weights, resume, bytes, the feature-shift partition option and bad configurations."""
from __future__ import annotations

import json

import pytest
import torch
from _fedsim_helpers import interrupted_after, save_blobs
from torch.nn import functional as F

from fedsim import runner
from fedsim._seeds import generator
from fedsim.algorithms import build_algorithm
from fedsim.data.clients import make_partition
from fedsim.algorithms.base import ClientContext, ClientUpdate, params_of
from fedsim.algorithms.fedmp import BANK_SAMPLE, adaptive_weights, alignment_loss
from fedsim.client import local_train
from fedsim.data.partition import feature_shift
from fedsim.models import CosineHead, MLPHead
from fedsim.runner import MethodSpec, RunConfig
from geomkern import fedmp as gfedmp


@pytest.fixture(scope="module")
def blobs(tmp_path_factory):
    """5 classes of unit-norm Gaussian blobs in D=12, saved as a dataset file."""
    return save_blobs(tmp_path_factory.mktemp("data") / "blobs.npz", classes=5, dim=12, noise=0.7,
                      n_train=600, n_test=200, seed=1)


def _cfg(path, methods, **kw):
    # val_fraction 0: every row of the partition trains (the tests count the rows and bytes of each client's partition)
    base = dict(dataset=str(path), rounds=3, n_clients=4, beta=0.5, batch_size=32, min_size=5, model="mlp",
                model_params={"hidden": 16}, lr=0.2, methods=methods, val_fraction=0.0)
    base.update(kw)
    return RunConfig(**base)


# ------------------------------------------------------------------------------ Eq. 6-7
def test_prototype_ema_matches_eq_6_and_7_by_hand():
    # client (Eq. 6), momentum 0.25: class 0 has old and new, class 1 only new, class 2 only old
    prev = torch.tensor([[4.0, 0.0], [9.0, 9.0], [1.0, 2.0]])
    prev_has = torch.tensor([True, False, True])
    new = torch.tensor([[0.0, 8.0], [3.0, 5.0], [7.0, 7.0]])
    new_has = torch.tensor([True, True, False])
    p, has = gfedmp.ema_prototypes(prev, prev_has, new, new_has, momentum=0.25)
    torch.testing.assert_close(p, torch.tensor([[0.25 * 4 + 0.75 * 0, 0.25 * 0 + 0.75 * 8], [3.0, 5.0], [1.0, 2.0]]))
    assert has.tolist() == [True, True, True]
    p0, has0 = gfedmp.ema_prototypes(None, None, new, new_has, momentum=0.25)  # first round: no EMA from 0
    torch.testing.assert_close(p0, torch.tensor([[0.0, 8.0], [3.0, 5.0], [0.0, 0.0]]))
    assert has0.tolist() == [True, True, False]

    # server (Eq. 7), momentum 0.5: count-weighted mean of the clients' prototypes, then the EMA
    local = torch.tensor([[[2.0, 0.0], [0.0, 0.0]],  # client a: class 0 (3 samples)
                          [[6.0, 4.0], [1.0, 1.0]]])  # client b: class 0 (1 sample), class 1 (2)
    counts = torch.tensor([[3, 0], [1, 2]])
    g, gh = gfedmp.global_prototypes(None, None, local, counts, momentum=0.5)
    torch.testing.assert_close(g, torch.tensor([[(3 * 2 + 6) / 4, 4 / 4], [1.0, 1.0]]))
    g2, _ = gfedmp.global_prototypes(g, gh, local[:1], counts[:1], momentum=0.5)  # only a reports
    torch.testing.assert_close(g2, torch.tensor([[0.5 * 3 + 0.5 * 2, 0.5 * 1 + 0.5 * 0], [1.0, 1.0]]))


def _update(cid, proto, count, bank_x=None, bank_y=None):
    extras = {"proto": proto, "proto_count": count}
    if bank_x is not None:
        extras.update(bank_x=bank_x, bank_y=bank_y)
    return ClientUpdate(cid=cid, params={"w": torch.zeros(1)}, n_samples=1, loss=0.0, extras=extras)


def _identity_trunk() -> MLPHead:
    """An MLP head whose trunk is ReLU(identity) on 2-D inputs: its features are the inputs."""
    model = MLPHead(2, 2, hidden=2)
    with torch.no_grad():
        model.fc1.weight.copy_(torch.eye(2))
        model.fc1.bias.zero_()
    return model


def test_algorithm_keeps_local_and_global_ema_across_rounds():
    algo = build_algorithm("fedmp_cpgma", local_momentum=0.5, global_momentum=0.75)
    model = _identity_trunk()
    x = torch.tensor([[1.0, 0.0], [3.0, 0.0], [0.0, 2.0]])
    y = torch.tensor([0, 0, 1])

    def client_round(x):
        ctx = ClientContext(cid=0, round=0, model=model, global_params=params_of(model), x=x, y=y, n_real=3,
                            n_classes=2, lr=0.1)
        return algo.end_client(ctx)

    up1 = client_round(x)  # trunk = ReLU(identity): class means (2, 0) and (0, 2)
    torch.testing.assert_close(up1["proto"], torch.tensor([[2.0, 0.0], [0.0, 2.0]]))
    algo.aggregate({}, [ClientUpdate(0, {"w": torch.zeros(1)}, 3, 0.0, up1)], n_clients=1)
    torch.testing.assert_close(algo.protos, torch.tensor([[2.0, 0.0], [0.0, 2.0]]))
    up2 = client_round(2 * x)  # new means (4, 0), (0, 4): local EMA 0.5 old + 0.5 new
    torch.testing.assert_close(up2["proto"], torch.tensor([[3.0, 0.0], [0.0, 3.0]]))
    algo.aggregate({}, [ClientUpdate(0, {"w": torch.zeros(1)}, 3, 0.0, up2)], n_clients=1)
    torch.testing.assert_close(algo.protos, torch.tensor([[0.75 * 2 + 0.25 * 3, 0.0], [0.0, 0.75 * 2 + 0.25 * 3]]))


# ------------------------------------------------------------------------------ the bank
def test_bank_sample_never_returns_own_rows_and_is_reproducible():
    owners = torch.arange(5).repeat_interleave(torch.tensor([30, 2, 40, 1, 25]))
    for k in range(5):
        for r in range(6):
            def draw():
                return gfedmp.sample_bank(owners, 20, client=k, exclude_own=True,
                                          generator=generator(3, r, k, BANK_SAMPLE))

            rows, again = draw(), draw()
            assert rows.numel() == 20 and rows.unique().numel() == 20
            assert not bool((owners[rows] == k).any())
            assert torch.equal(rows, again)
    a = gfedmp.sample_bank(owners, 20, client=0, exclude_own=True, generator=generator(3, 0, 0, BANK_SAMPLE))
    b = gfedmp.sample_bank(owners, 20, client=0, exclude_own=True, generator=generator(3, 1, 0, BANK_SAMPLE))
    assert not torch.equal(a, b)  # a fresh sample every round
    # without the option the client's own rows (30 of 98) do come back
    own = sum(int((owners[gfedmp.sample_bank(owners, 20, client=0, exclude_own=False,
                                             generator=generator(3, r, 0, BANK_SAMPLE))] == 0).sum())
              for r in range(6))
    assert own > 0
    assert gfedmp.sample_bank(owners, 500, client=2, exclude_own=True, generator=torch.Generator()).numel() == 58


def test_algorithm_sends_other_clients_features_only():
    algo = build_algorithm("fedmp_sfmc", bank_size=6, bank_exclude_own=True)
    algo.seed = 7
    # client k's features are all equal to k + 1, so a row tells its owner
    ups = [_update(k, torch.zeros(2, 3), torch.zeros(2, dtype=torch.int64),
                   torch.full((5, 3), float(k + 1)), torch.tensor([0, 1, 0, 1, 0])) for k in range(3)]
    for u in ups:
        del u.extras["proto"], u.extras["proto_count"]
    algo.aggregate({}, ups, n_clients=3)
    model = MLPHead(4, 2, hidden=3)

    def received(cid, rnd):
        ctx = ClientContext(cid=cid, round=rnd, model=model, global_params=params_of(model), x=torch.zeros(8, 4),
                            y=torch.zeros(8, dtype=torch.long), n_real=8, n_classes=2, lr=0.1)
        algo.begin_client(ctx)
        return ctx.scratch["recv"][0]

    for cid in range(3):
        rx = received(cid, 1)
        assert rx.shape == (6, 3) and not bool((rx == cid + 1).any())
        assert torch.equal(rx, received(cid, 1))
    extra = algo.download_bytes({"w": torch.zeros(1)}) - 4
    assert extra == 6 * 3 * 4 + 6 * 8  # the received features and their int64 labels


# ------------------------------------------------------------------------------ losses
def test_alignment_loss_is_zero_on_the_prototypes():
    P = torch.randn(4, 6)
    has = torch.tensor([True, True, False, True])
    y = torch.tensor([0, 1, 3, 3, 1])
    feats = P[y].clone().requires_grad_(True)
    loss = alignment_loss(feats, y, P, has)
    assert float(loss.detach()) == 0.0
    loss.backward()
    assert float(feats.grad.abs().max()) == 0.0
    moved = P[y] + 0.1
    assert float(alignment_loss(moved, y, P, has)) == pytest.approx(5 * 6 * 0.01 / 5)
    # a class without a global prototype contributes nothing, and none at all gives None
    assert float(alignment_loss(torch.randn(2, 6), torch.tensor([2, 2]), P, has) or 0.0) == 0.0
    assert alignment_loss(torch.randn(2, 6), torch.tensor([2, 2]), P, has) is None


def test_adaptive_weights_are_detached():
    torch.manual_seed(0)
    w = torch.randn(5, requires_grad=True)
    ce = (w ** 2).sum() + 1.0
    aux = [(w - 1).abs().sum(), (3 * w).sum() ** 2]
    ws = adaptive_weights(ce, aux, max_weight=1e6)
    assert all(not t.requires_grad for t in ws)
    total = sum(a * b for a, b in zip(ws, aux))
    (g,) = torch.autograd.grad(total, w, retain_graph=True)
    consts = [float(ce.detach()) / float(t.detach()) for t in aux]  # the same weights as plain numbers
    want = torch.autograd.grad(sum(c * t for c, t in zip(consts, aux)), w, retain_graph=True)[0]
    torch.testing.assert_close(g, want)
    # the gradient a weight with the graph attached would give is different, so the check can fail
    live = sum((ce / t) * t for t in aux)
    assert not torch.allclose(torch.autograd.grad(live, w)[0], g)
    assert float(adaptive_weights(ce, [torch.tensor(0.0)], max_weight=10.0)[0]) == 10.0  # bounded


def test_fedmp_takes_as_many_steps_as_fedavg():
    model = MLPHead(4, 3, hidden=5)
    x, y = torch.randn(70, 4), torch.randint(0, 3, (70,))
    steps = {}
    for name in ("fedavg", "fedmp"):
        algo = build_algorithm(name)
        if name == "fedmp":  # a bank and global prototypes, so both terms are active
            ups = [_update(k, torch.randn(3, 5), torch.tensor([3, 3, 3]), torch.randn(40, 5),
                           torch.randint(0, 3, (40,))) for k in (1, 2)]
            algo.aggregate({}, ups, n_clients=3)
        m = MLPHead(4, 3, hidden=5)
        m.load_state_dict(model.state_dict())
        ctx = ClientContext(cid=0, round=1, model=m, global_params=params_of(m), x=x, y=y, n_real=70,
                            n_classes=3, lr=0.1)
        upd = local_train(algo, ctx, epochs=2, batch_size=16, generator=torch.Generator().manual_seed(0))
        steps[name] = ctx.steps
        assert torch.isfinite(torch.tensor(upd.loss))
    assert steps["fedavg"] == steps["fedmp"] == 2 * 5


# ------------------------------------------------------------------------------ the round loop
def test_resume_equals_uninterrupted_with_fedmp(tmp_path, blobs, monkeypatch):
    cfg = _cfg(blobs, [MethodSpec("m", algorithm="fedmp", algorithm_params={"bank_size": 40})], rounds=4,
               feature_shift=0.7, feature_noise=0.2)
    runner.run(cfg, tmp_path / "full", progress=False)
    with interrupted_after(monkeypatch, runner, 2), pytest.raises(KeyboardInterrupt):
        runner.run(cfg, tmp_path / "cut", progress=False)
    state = torch.load(tmp_path / "cut" / "runs" / "m-seed0" / "checkpoint.pt", weights_only=True)
    assert state["round"] == 2
    keys = state["algorithm"].keys()
    assert "global/proto" in keys
    assert any(k.startswith("bank/") for k in keys) and any(k.startswith("local/") for k in keys)
    runner.run(RunConfig(), tmp_path / "cut", resume=True, progress=False)
    full = json.loads((tmp_path / "full" / "results.json").read_text())
    assert json.loads((tmp_path / "cut" / "results.json").read_text()) == full
    # and the bank really was used: the run differs from one without it
    other = runner.run(_cfg(blobs, [MethodSpec("m", algorithm="fedmp_cpgma")], rounds=4, feature_shift=0.7,
                            feature_noise=0.2), tmp_path / "cpgma", progress=False)
    assert other["methods"]["m"]["seeds"]["0"]["accuracy"] != full["methods"]["m"]["seeds"]["0"]["accuracy"]


def test_bytes_count_the_embeddings(tmp_path, blobs):
    hidden, C = 16, 5
    methods = [MethodSpec("a"), MethodSpec("p", algorithm="fedmp", algorithm_params={"bank_size": 50})]
    res = runner.run(_cfg(blobs, methods, rounds=2), tmp_path / "o", progress=False)
    hist = {m: torch.load(tmp_path / "o" / "runs" / f"{m}-seed0" / "checkpoint.pt", weights_only=True)["history"]
            for m in ("a", "p")}
    n_train = 600
    # up, every round: features (n_k, hidden) float32 + labels int64 + prototypes (C, hidden) + counts (C,)
    per_round_up = n_train * (hidden * 4 + 8) + 4 * (C * hidden * 4 + C * 8)
    for r in range(2):
        assert hist["p"][r]["bytes_up"] - hist["a"][r]["bytes_up"] == per_round_up
    assert hist["p"][0]["bytes_down"] == hist["a"][0]["bytes_down"]  # nothing to send in round 1
    # round 2: 50 bank rows (+ labels) and the 5 global prototypes to each of the 4 clients
    assert hist["p"][1]["bytes_down"] - hist["a"][1]["bytes_down"] == 4 * (50 * (hidden * 4 + 8) + C * hidden * 4)
    assert res["methods"]["p"]["seeds"]["0"]["bytes_up"] == sum(h["bytes_up"] for h in hist["p"])


@pytest.mark.parametrize("change,match", [
    (dict(methods=[MethodSpec("x", algorithm="fedmp", algorithm_params={"bank_size": 0})]), "bank_size"),
    (dict(methods=[MethodSpec("x", algorithm="fedmp", algorithm_params={"local_momentum": 1.0})]), "local_momentum"),
    (dict(methods=[MethodSpec("x", algorithm="fedmp_cpgma", algorithm_params={"global_momentum": -0.1})]),
     "global_momentum"),
    (dict(methods=[MethodSpec("x", algorithm="fedmp", algorithm_params={"weighting": "softmax"})]), "weighting"),
    (dict(methods=[MethodSpec("x", algorithm="fedmp", algorithm_params={"sfmc": False, "cpgma": False})]), "sfmc"),
    (dict(methods=[MethodSpec("x", algorithm="fedmp")], model="linear"), "model"),
    (dict(methods=[MethodSpec("x", algorithm="fedmp_sfmc")], feature_shift=-1.0), "feature_shift"),
])
def test_bad_fedmp_configs_are_rejected_before_anything_is_written(tmp_path, blobs, change, match):
    with pytest.raises(ValueError, match=match):
        runner.run(_cfg(blobs, **{"methods": [MethodSpec("x")], **change}), tmp_path / "o", progress=False)
    assert not (tmp_path / "o").exists()


def test_fedmp_refuses_a_model_without_trunk_when_called_directly():
    algo = build_algorithm("fedmp")
    m = CosineHead(4, 3)
    ctx = ClientContext(cid=0, round=0, model=m, global_params=params_of(m), x=torch.randn(5, 4),
                        y=torch.zeros(5, dtype=torch.long), n_real=5, n_classes=3, lr=0.1)
    with pytest.raises(TypeError, match="trunk"):
        algo.begin_client(ctx)


# ------------------------------------------------------------------------------ feature shift
def test_feature_shift_views():
    g = torch.Generator().manual_seed(0)
    xs = [F.normalize(torch.randn(n, 10, generator=g), dim=1) for n in (7, 9, 4)]
    xt = F.normalize(torch.randn(11, 10, generator=g), dim=1)
    keep = [x.clone() for x in xs]
    v, t, owner = feature_shift(xs, xt, angle=1.0, noise=0.0, seed=3)
    assert all(torch.equal(a, b) for a, b in zip(xs, keep))  # the data is not modified
    for k in range(3):  # a pure rotation: Gram matrices (and norms) are kept, the rows move
        torch.testing.assert_close(v[k] @ v[k].T, xs[k] @ xs[k].T, atol=1e-5, rtol=0)
        assert float((v[k] - xs[k]).norm()) > 0.1
    assert sorted(owner.bincount().tolist()) == [3, 4, 4]
    # a client's test rows go through the same rotation as its train rows
    k = int(owner[0])
    xt2 = xt.clone()
    xt2[0] = xs[k][2]
    _, t_same, _ = feature_shift(xs, xt2, angle=1.0, noise=0.0, seed=3)
    torch.testing.assert_close(t_same[0], v[k][2])
    v2, t2, _ = feature_shift(xs, xt, angle=1.0, noise=0.3, seed=3)
    again, t3, _ = feature_shift(xs, xt, angle=1.0, noise=0.3, seed=3)
    assert all(torch.equal(a, b) for a, b in zip(v2, again)) and torch.equal(t2, t3)  # fixed per seed
    torch.testing.assert_close(v2[1].norm(dim=1), torch.ones(9))
    z, tz, _ = feature_shift(xs, xt, angle=0.0, noise=0.0, seed=3)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(z, xs)) and torch.allclose(tz, xt, atol=1e-6)
    other, _, _ = feature_shift(xs, xt, angle=1.0, noise=0.0, seed=4)
    assert not torch.allclose(other[0], v[0])


# ------------------------------------------------------------------------------ few-shot schedule
def test_few_shot_schedule_exchanges_once_per_stage(tmp_path, blobs):
    """stage_rounds=2, 4 rounds: stage 1 (local), exchange, stage 2 (with bank and prototypes),
    exchange. Between exchanges nothing is sent, the server's model does not move and each client
    continues from its own weights."""
    hidden, C, n_train = 16, 5, 600
    methods = [MethodSpec("a"), MethodSpec("p", algorithm="fedmp", algorithm_params={"bank_size": 50, "stage_rounds": 2})]
    runner.run(_cfg(blobs, methods, rounds=4), tmp_path / "o", progress=False)
    hist = {m: torch.load(tmp_path / "o" / "runs" / f"{m}-seed0" / "checkpoint.pt", weights_only=True)["history"]
            for m in ("a", "p")}
    a, p = hist["a"], hist["p"]
    model = a[0]["bytes_down"] // 4  # the model, per client (4 clients, all selected)
    feats = n_train * (hidden * 4 + 8) + 4 * (C * hidden * 4 + C * 8)
    assert [h["bytes_up"] for h in p] == [0, a[1]["bytes_up"] + feats, 0, a[3]["bytes_up"] + feats]
    assert [h["bytes_down"] for h in p] == [4 * model, 0, 4 * (model + 50 * (hidden * 4 + 8) + C * hidden * 4), 0]
    acc = [h["accuracy"] for h in p]
    assert acc[2] == acc[1] and acc[1] != acc[0]  # mid-stage rounds report the last exchanged model


def test_few_shot_stage_1_is_local_training(blobs):
    """Inside stage 1 a client has no bank and no prototypes (plain CE) and keeps its weights:
    its second round starts where its first ended."""
    from fedsim.data import load_dataset

    ds = load_dataset(str(blobs))
    algo = build_algorithm("fedmp", bank_size=20, stage_rounds=3)
    algo.seed = 0
    m = MLPHead(12, 5, hidden=8)
    start = params_of(m)
    x, y = ds.x_train[:64], ds.y_train[:64]
    ends = []
    for r in range(2):
        m.load_state_dict(start)  # what the runner does: the server's (unchanged) model
        ctx = ClientContext(cid=1, round=r, model=m, global_params=start, x=x, y=y, n_real=64, n_classes=5, lr=0.1)
        if r == 1:
            algo.begin_client(ctx)
            assert all(torch.equal(v, ends[0][k]) for k, v in params_of(m).items())  # continued, not restarted
            assert "recv" not in ctx.scratch and algo.protos is None
        upd = local_train(algo, ctx, epochs=1, batch_size=32, generator=torch.Generator().manual_seed(r))
        assert upd.extras == {} and algo.upload_bytes(upd) == 0 and algo.download_bytes(start) == (
            sum(v.numel() * v.element_size() for v in start.values()) if r == 0 else 0)
        ends.append(upd.params)
        assert algo.aggregate(start, [upd], n_clients=1) is start


def test_resume_mid_stage_equals_uninterrupted(tmp_path, blobs, monkeypatch):
    cfg = _cfg(blobs, [MethodSpec("m", algorithm="fedmp", algorithm_params={"bank_size": 40, "stage_rounds": 2})],
               rounds=4)
    runner.run(cfg, tmp_path / "full", progress=False)
    with interrupted_after(monkeypatch, runner, 3), pytest.raises(KeyboardInterrupt):
        runner.run(cfg, tmp_path / "cut", progress=False)  # stopped inside stage 2
    state = torch.load(tmp_path / "cut" / "runs" / "m-seed0" / "checkpoint.pt", weights_only=True)
    assert state["round"] == 3 and any(k.startswith("stage/") for k in state["algorithm"])
    runner.run(RunConfig(), tmp_path / "cut", resume=True, progress=False)
    assert (json.loads((tmp_path / "cut" / "results.json").read_text())
            == json.loads((tmp_path / "full" / "results.json").read_text()))


@pytest.mark.parametrize("bad", [0, 1.5, True])
def test_bad_stage_rounds_named(bad):
    with pytest.raises(ValueError, match="stage_rounds"):
        build_algorithm("fedmp", stage_rounds=bad)


# ------------------------------------------------------------------------------ composition, trunk size
@pytest.mark.parametrize("augmenter", ["ggeur"])
def test_fedmp_composes_with_augmenters_real_rows_only_in_the_bank(tmp_path, blobs, augmenter):
    cfg = _cfg(blobs, [MethodSpec("m", algorithm="fedmp", augmenter=augmenter, algorithm_params={"bank_size": 40})],
               rounds=2)
    res = runner.run(cfg, tmp_path / "o", progress=False)
    state = torch.load(tmp_path / "o" / "runs" / "m-seed0" / "checkpoint.pt", weights_only=True)["algorithm"]
    parts = make_partition(cfg, runner.load_dataset(cfg.dataset), 0)
    for cid, p in enumerate(parts):  # the bank holds each client's real rows, never the augmented ones
        assert state[f"bank/{cid}/x"].shape == (len(p), 16) and state[f"local/{cid}/proto"].shape == (5, 16)
    assert all(0 <= a <= 1 for a in res["methods"]["m"]["seeds"]["0"]["accuracy"])


def test_fedmp_bank_takes_the_real_rows_when_the_augmenter_replaces_them(tmp_path, blobs, monkeypatch):
    """Under FedMC's Algorithm 1 a client trains on calibrated rows alone; FedMP's bank and
    prototypes still hold its real rows (ctx.real()), not the calibrated ones."""
    algo = build_algorithm("fedmp")
    model = _identity_trunk()
    real = torch.tensor([[1.0, 0.0], [3.0, 0.0], [0.0, 2.0]])
    y = torch.tensor([0, 0, 1])
    ctx = ClientContext(cid=0, round=0, model=model, global_params=params_of(model), x=real + 5.0, y=y, n_real=3,
                        n_classes=2, lr=0.1, x_real=real, y_real=y)
    up = algo.end_client(ctx)
    torch.testing.assert_close(up["bank_x"], real)  # trunk = ReLU(identity)
    torch.testing.assert_close(up["proto"], torch.tensor([[2.0, 0.0], [0.0, 2.0]]))
    # and through the loop: the run's contexts carry the real rows when the augmenter replaces them
    seen = []
    orig = type(algo).end_client

    def spy(self, ctx):
        seen.append((ctx.x.clone(), ctx.real()[0].clone()))
        return orig(self, ctx)

    monkeypatch.setattr(type(algo), "end_client", spy)
    cfg = _cfg(blobs, [MethodSpec("m", algorithm="fedmp", augmenter="fedmc", augmenter_params=dict(
        n_prototypes=8, n_base=16, n_clusters=3, n_components=2, n_entries=6))], rounds=2)
    runner.run(cfg, tmp_path / "o", progress=False)
    ds = runner.load_dataset(str(blobs))
    parts = make_partition(cfg, ds, 0)
    second = seen[len(seen) // 2:]  # round 2: calibrated rows trained on, real rows in the bank
    assert len(second) == 4
    for (x, xr), p in zip(second, parts):
        assert torch.equal(xr, ds.x_train[p].to(xr.dtype)) and not torch.equal(x, xr)


def test_trunk_width_and_depth(tmp_path, blobs):
    from fedsim.models import parse_model

    assert parse_model("mlp:512x2") == ("mlp", {"hidden": 512, "depth": 2})
    assert parse_model("mlp:64") == ("mlp", {"hidden": 64}) and parse_model("linear") == ("linear", {})
    for bad in ("mlp:0x2", "mlp:8y2", "linear:8", "mlp:8x", "mlp:8x0"):
        with pytest.raises(ValueError, match="--model"):
            parse_model(bad)
    torch.manual_seed(0)
    one = MLPHead(12, 5, hidden=8)
    torch.manual_seed(0)
    assert list(one.state_dict()) == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
    deep = MLPHead(12, 5, hidden=8, depth=3)
    assert torch.equal(deep.fc1.weight, one.fc1.weight) and len(deep.deep) == 2
    x = torch.randn(4, 12)
    h = torch.relu(deep.deep[1](torch.relu(deep.deep[0](torch.relu(deep.fc1(x))))))
    torch.testing.assert_close(deep.trunk(x), h)
    # FedMP's bank stores the deep trunk's outputs
    cfg = _cfg(blobs, [MethodSpec("m", algorithm="fedmp", algorithm_params={"bank_size": 40})], rounds=1,
               model_params={"hidden": 8, "depth": 2})
    runner.run(cfg, tmp_path / "o", progress=False)
    state = torch.load(tmp_path / "o" / "runs" / "m-seed0" / "checkpoint.pt", weights_only=True)
    assert state["algorithm"]["bank/0/x"].shape[1] == 8 and "deep.0.weight" in state["global"]
    with pytest.raises(ValueError, match="depth"):
        runner.run(_cfg(blobs, [MethodSpec("m", algorithm="fedmp")], model_params={"hidden": 8, "depth": 0}),
                   tmp_path / "bad", progress=False)
    assert not (tmp_path / "bad").exists()


def test_cli_model_sizes_and_fedmp_set(tmp_path, blobs):
    from fedsim.cli import main

    out = tmp_path / "c"
    assert main(["run", "--dataset", str(blobs), "--model", "mlp:8x2", "--algorithms", "fedmp", "--augmenters", "none",
                 "--set", "fedmp.stage_rounds=2", "--set", "fedmp.local_momentum=0.9", "--rounds", "2", "--clients",
                 "3", "--quiet", "--out", str(out)]) == 0
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model"] == "mlp" and cfg["model_params"] == {"hidden": 8, "depth": 2}
    assert cfg["methods"][0]["algorithm_params"] == {"stage_rounds": 2, "local_momentum": 0.9}
    assert main(["run", "--dataset", str(blobs), "--model", "mlp:8y2", "--out", str(tmp_path / "x")]) == 2
    assert main(["run", "--dataset", str(blobs), "--algorithms", "fedmp", "--model", "mlp",
                 "--set", "fedmp.stage_rounds=0", "--out", str(tmp_path / "y")]) == 2
