"""FLIC, FedRep, local and the personalised path: toy generators, feature-space isolation, resume,
refusals, personalised evaluation in results.json."""
from __future__ import annotations

import json
import math

import pytest
import torch

import geomkern as gk
from fedsim.algorithms import build_algorithm
from fedsim.algorithms.base import ClientContext
from fedsim.algorithms.flic import FLIC
from fedsim.algorithms.local import Phase
from fedsim.client import DivergedError
from fedsim.data.dataset import ClientSplit, PersonalDataset
from fedsim.data.toy import linear_mapping, load_toy, noisy_features
from fedsim.models import PersonalNet
from fedsim.personal import personal_dataset, run_personal_method
from fedsim.runner import MethodSpec, RunConfig, run


# ------------------------------------------------------------------------------ toy generators
@pytest.mark.parametrize("make", [noisy_features, linear_mapping])
def test_toy_reproduces_from_seed(make):
    a, b, c = make(9, seed=5, n_spaces=3), make(9, seed=5, n_spaces=3), make(9, seed=6, n_spaces=3)
    for ca, cb in zip(a.clients, b.clients):
        for k in ("x_train", "y_train", "x_test", "y_test"):
            assert torch.equal(getattr(ca, k), getattr(cb, k))
    assert any(not torch.equal(ca.x_train, cc.x_train) for ca, cc in zip(a.clients, c.clients)
               if ca.dim == cc.dim) or [x.dim for x in a.clients] != [x.dim for x in c.clients]


@pytest.mark.parametrize("make", [noisy_features, linear_mapping])
def test_toy_dimensions_and_class_structure(make):
    ds = make(12, seed=1, n_spaces=4, dim_range=(12, 30), latent_dim=6, n_classes=4, n_train=60, n_test=300)
    assert len(ds.clients) == 12 and ds.n_classes == 4 and len(ds.spaces) == 4
    for cid, c in enumerate(ds.clients):
        assert c.space == f"s{cid % 4}"  # round robin
        assert 12 <= c.dim <= 30 and c.x_test.shape[1] == c.dim and c.x_train.shape == (60, c.dim)
        assert ds.spaces[c.space] == c.dim
        assert set(c.y_test.tolist()) == set(range(4))
    # one space, one map: its clients' rows span the latent dimension (linear) or carry the latent
    # coordinates first (noisy); the classes are separable by nearest class mean on the test rows
    for c in ds.clients:
        x = torch.cat([c.x_train, c.x_test]).double()
        if make is linear_mapping:
            assert int(torch.linalg.matrix_rank(x, rtol=1e-5)) == 6  # float32 rows
        else:
            tail = x[:, 6:]
            assert abs(float(tail.std()) - 1.0) < 0.1  # pure N(0, 1) noise dimensions
        mu = torch.stack([c.x_train[c.y_train == k].mean(0) for k in range(4)])
        pred = torch.cdist(c.x_test, mu).argmin(1)
        assert float((pred == c.y_test).float().mean()) > 0.5  # chance is 0.25


def test_toy_label_skew():
    ds = linear_mapping(8, seed=2, n_spaces=8, n_classes=10, classes_per_client=2, n_train=30, n_test=30)
    subsets = [set(c.y_train.tolist()) for c in ds.clients]
    assert all(len(sub) == 2 and set(c.y_test.tolist()) == sub for sub, c in zip(subsets, ds.clients))
    assert len({tuple(sorted(sub)) for sub in subsets}) > 1 and ds.n_classes == 10


def test_toy_subsample_keeps_a_share_of_each_clients_rows():
    """subsample=1: each client keeps 5-100 % of its training rows (drawn from them, with
    replacement), sizes differ between clients; test rows, dimensions and every other draw unchanged."""
    name = "toy:noisy-features?n_spaces=40&n_train=200&n_test=30"
    full = load_toy(name, n_clients=40, seed=3)
    sub = load_toy(name + "&subsample=1", n_clients=40, seed=3)
    assert sub.meta["subsample"] == 1 and "subsample" not in full.meta
    sizes = [c.x_train.shape[0] for c in sub.clients]
    assert all(10 <= k <= 200 for k in sizes) and len(set(sizes)) > 10
    assert sum(k <= 70 for k in sizes) > 10  # about half the clients keep 15-35 %
    for a, b in zip(full.clients, sub.clients):
        assert torch.equal(a.x_test, b.x_test) and a.dim == b.dim
        rows = {tuple(r) for r in a.x_train.tolist()}
        assert all(tuple(r) in rows for r in b.x_train.tolist())
    again = load_toy(name + "&subsample=1", n_clients=40, seed=3)
    assert all(torch.equal(a.x_train, b.x_train) for a, b in zip(sub.clients, again.clients))
    with pytest.raises(ValueError, match="subsample"):
        load_toy(name + "&subsample=2", n_clients=40, seed=3)


def test_toy_name_errors():
    with pytest.raises(ValueError, match="unknown toy problem"):
        load_toy("toy:spiral", n_clients=3, seed=0)


# ------------------------------------------------------------------------------ dataset refusals
def _split(n_classes=3, n_train=6, n_test=4, dim=5, space="0"):
    g = torch.Generator().manual_seed(0)
    return ClientSplit(torch.randn(n_train, dim, generator=g), torch.arange(n_train) % n_classes,
                       torch.randn(n_test, dim, generator=g), torch.arange(n_test) % n_classes,
                       n_classes=n_classes, space=space)


def test_disagreeing_class_counts_rejected():
    with pytest.raises(ValueError, match="disagree on the number of classes"):
        PersonalDataset("bad", [_split(3), _split(2)], class_names=["a", "b", "c"])


def test_empty_split_rejected():
    with pytest.raises(ValueError, match="client 1 has an empty test split"):
        PersonalDataset("bad", [_split(), _split(n_test=0)], class_names=["a", "b", "c"])
    with pytest.raises(ValueError, match="client 0 has an empty train split"):
        PersonalDataset("bad", [_split(n_train=0)], class_names=["a", "b", "c"])


def test_space_with_two_dimensions_rejected():
    with pytest.raises(ValueError, match="differ in dimension"):
        PersonalDataset("bad", [_split(dim=5), _split(dim=6)], class_names=["a", "b", "c"])


# ------------------------------------------------------------------------------ FLIC's loss
def test_flic_alignment_term_is_the_closed_form_w2():
    algo = build_algorithm("flic", lam=0.5, ridge=0.01)
    algo.setup(n_classes=3, embed_dim=4, seed=0, device="cpu")
    model = PersonalNet(7, 3, embed_dim=4, embed_hidden=8, hidden=8)
    ctx = ClientContext(cid=0, round=0, model=model, global_params={}, x=torch.zeros(1, 7), y=torch.zeros(1),
                        n_real=1, n_classes=3, lr=0.1)
    g = torch.Generator().manual_seed(1)
    z = torch.randn(9, 4, generator=g, requires_grad=True)
    y = torch.tensor([0, 0, 0, 1, 1, 2, 0, 1, 1])  # class 2 has one sample: no covariance, skipped
    got = algo.extra_loss(ctx, None, y, None, z)
    want = []
    for c in (0, 1):
        zc = z[y == c].double()
        m = zc.mean(0)
        S = (zc - m).T @ (zc - m) / len(zc) + 0.01 * torch.eye(4, dtype=torch.float64)
        want.append(gk.gaussian_w2(algo.anchor_means[c], algo.anchor_covs[c], m, S))
    assert torch.allclose(got.double(), 0.5 * torch.stack(want).mean(), rtol=1e-5)
    got.backward()
    assert bool(torch.isfinite(z.grad).all()) and float(z.grad[y == 2].abs().max()) == 0
    for p in model.embed.parameters():  # the head phase: phi frozen, no term
        p.requires_grad_(False)
    assert algo.extra_loss(ctx, None, y, None, z) is None


# ------------------------------------------------------------------------------ the personalised path
# FLIC's default alignment phase (300 full-batch steps per client, docs/flic.md "FLIC's defaults")
# would cost every small run below minutes; they align briefly instead, and
# test_flic_default_alignment covers the default itself
SHORT = {"align_epochs": 3}


def test_flic_default_alignment(monkeypatch):
    """The default FLIC aligns each client once, at its first participation, for 300 steps."""
    flic = build_algorithm("flic")
    assert flic.hp["align_epochs"] == 300
    ds = linear_mapping(2, seed=0, n_spaces=2, n_train=12, n_test=4)
    flic.setup(n_classes=ds.n_classes, embed_dim=16, seed=0, device="cpu")
    steps = []
    monkeypatch.setattr(FLIC, "_alignment", lambda self, ctx, y, z: steps.append(1) or z.sum() * 0)
    c = ds.clients[0]
    for r in (0, 1):
        ctx = ClientContext(cid=0, round=r, model=PersonalNet(c.dim, ds.n_classes), global_params={}, x=c.x_train,
                            y=c.y_train, n_real=c.x_train.shape[0], n_classes=ds.n_classes, lr=0.05)
        ctx.momentum = 0.9
        flic.begin_client(ctx)
    assert len(steps) == 300 and flic.aligned == {0}


def _cfg(**kw):
    base = dict(dataset="toy:linear-mapping", n_clients=6, rounds=3, local_epochs=1, batch_size=32, lr=0.05,
                methods=[MethodSpec("Local", "local"), MethodSpec("FedRep", "fedrep"),
                         MethodSpec("FLIC", "flic", algorithm_params=SHORT)],
                model="personal", model_params={"embed_dim": 4, "embed_hidden": 8, "hidden": 8})
    base.update(kw)
    return RunConfig(**base)


def test_dimension_never_leaks(monkeypatch, tmp_path):
    """A client's D_i appears in its own data and phi_i only: never in what it uploads, what the
    server holds or what another client holds."""
    ds = linear_mapping(6, seed=0, n_spaces=6, dim_range=(41, 60), n_train=20, n_test=20)
    dims = {c.dim for c in ds.clients}
    assert len(dims) > 1 and not dims & {4, 8, ds.n_classes}
    uploads = []
    orig = FLIC.aggregate

    def recording(self, global_params, updates, *, n_clients):
        uploads.extend(updates)
        return orig(self, global_params, updates, n_clients=n_clients)

    monkeypatch.setattr(FLIC, "aggregate", recording)
    cfg = _cfg(rounds=1)
    run_personal_method(cfg, cfg.methods[2], 0, ds, tmp_path, progress=False)
    state = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert len(uploads) == 6
    for u in uploads:
        for k, t in {**u.params, **u.extras}.items():
            assert not set(t.shape) & dims, (k, tuple(t.shape))
    for t in [*state["shared"]["all"].values(), *state["algorithm"].values()]:
        assert not set(t.shape) & dims
    for cid, c in enumerate(ds.clients):
        shapes = {s for t in state["personal"][cid].values() for s in t.shape}
        assert c.dim in shapes and not (shapes & (dims - {c.dim}))
        assert not any(k.startswith("body.") for k in state["personal"][cid])  # the shared part is not personal


def test_resume_equals_uninterrupted(tmp_path):
    """Three rounds straight vs. one round, then the same run continued from its checkpoint to three."""
    ds = linear_mapping(6, seed=0, n_spaces=3, n_train=24, n_test=30)
    # FedRep (per-space groups), FLIC (anchors: server state), FLIC drawing anchor samples (random streams)
    extra = MethodSpec("FLIC-ce", "flic", algorithm_params={"anchor_ce": 0.5, "align_epochs": 5})
    # the official code's schedule, its representation starting to train after the resume point
    first = MethodSpec("FLIC-pf", "flic", algorithm_params={**SHORT, "schedule": "personal-first", "rep_start_round": 2})
    for spec in _cfg().methods[1:] + [extra, first]:
        a, b = tmp_path / f"a-{spec.name}", tmp_path / f"b-{spec.name}"
        straight, _ = run_personal_method(_cfg(rounds=3), spec, 0, ds, a, progress=False)
        run_personal_method(_cfg(rounds=1), spec, 0, ds, b, progress=False)
        resumed, _ = run_personal_method(_cfg(rounds=3), spec, 0, ds, b, progress=False)
        assert straight == resumed
        sa, sb = (torch.load(d / "checkpoint.pt", weights_only=True) for d in (a, b))
        for pa, pb in zip(sa["personal"], sb["personal"]):
            assert all(torch.equal(pa[k], pb[k]) for k in pa)
        for g in sa["shared"]:
            assert all(torch.equal(sa["shared"][g][k], sb["shared"][g][k]) for k in sa["shared"][g])
        for k, v in sa["algorithm"].items():
            assert torch.equal(v, sb["algorithm"][k])


def test_personalised_results_and_table(tmp_path):
    cfg = _cfg(rounds=2, seeds=2)
    cfg.methods = [cfg.methods[0], cfg.methods[2]]
    res = run(cfg, tmp_path / "r", progress=False)
    on_disk = json.loads((tmp_path / "r" / "results.json").read_text())
    for name in ("Local", "FLIC"):
        for s in ("0", "1"):
            v = on_disk["methods"][name]["seeds"][s]
            assert len(v["client_accuracy"]) == 6 and all(0 <= a <= 1 for a in v["client_accuracy"])
            assert v["final_accuracy"] == pytest.approx(sum(v["client_accuracy"]) / 6)
        assert "client_accuracy_std" in on_disk["methods"][name]["summary"]
    assert res["methods"]["Local"]["summary"]["bytes_up"]["mean"] == 0  # nothing leaves a local client
    assert res["methods"]["FLIC"]["summary"]["bytes_up"]["mean"] > 0
    assert "client acc std %" in (tmp_path / "r" / "table.txt").read_text()


def test_global_model_methods_refused_on_heterogeneous_spaces(tmp_path):
    with pytest.raises(ValueError, match="different feature spaces"):
        run(_cfg(methods=[MethodSpec("FedAvg"), MethodSpec("FLIC", "flic", algorithm_params=SHORT)]), tmp_path / "x",
            progress=False)
    assert not (tmp_path / "x" / "config.json").exists()


def test_fedrep_on_homogeneous_data(tmp_path):
    cfg = _cfg(dataset="default", partition="iid", n_clients=4, rounds=1,
               methods=[MethodSpec("FedRep", "fedrep")])
    ds = personal_dataset(cfg, 0)
    assert len(ds.spaces) == 1 and all(c.x_test.shape[0] > 0 for c in ds.clients)
    res = run(cfg, tmp_path / "h", progress=False)
    assert len(res["methods"]["FedRep"]["seeds"]["0"]["client_accuracy"]) == 4


def test_bad_hyper_parameters_named():
    for name, kw, word in (("flic", {"ridge": 0.0}, "ridge"), ("flic", {"lam": -1.0}, "lam"),
                           ("flic", {"anchor_var": float("nan")}, "anchor_var"), ("fedrep", {"head_epochs": -1}, "head_epochs"),
                           ("local", {"head_epochs": 1.5}, "head_epochs"),
                           ("flic", {"align_epochs": -2}, "align_epochs"), ("local", {"optimizer": "rmsprop"}, "optimizer"),
                           ("flic", {"optimizer": "Adam"}, "optimizer"), ("flic", {"anchor_cov": "diag"}, "anchor_cov")):
        with pytest.raises(ValueError, match=word):
            build_algorithm(name, **kw)
    with pytest.raises(ValueError, match="model='personal'"):
        run(_cfg(model="mlp", model_params={}), "/nonexistent/never-written", progress=False)


def test_schedule_phases():
    """FedRep's schedule by default; 'personal-first' trains what the algorithm does not share, then
    the shared part alone, and only what it does not share before rep_start_round; with nothing
    shared (local, or no representation layer: hidden=0) one phase trains everything."""
    net = PersonalNet(7, 5)
    assert build_algorithm("flic").phases(0, 10, net) == [Phase(("head",), 1), Phase(("embed", "body"), 10)]
    assert build_algorithm("local", head_epochs=3).phases(7, 5, net) == [Phase(("head",), 3), Phase(("embed", "body"), 5)]
    flic = build_algorithm("flic", schedule="personal-first", rep_start_round=21)
    assert flic.phases(20, 10, net) == [Phase(("embed", "head"), 10)]
    assert flic.phases(21, 10, net) == [Phase(("embed", "head"), 9), Phase(("body",), 1)]
    assert flic.phases(21, 10, PersonalNet(7, 5, hidden=0)) == [Phase(("embed", "body", "head"), 10)]
    fedrep = build_algorithm("fedrep", schedule="personal-first", rep_epochs=2)
    assert fedrep.phases(0, 10, net) == [Phase(("head",), 8), Phase(("embed", "body"), 2)]
    assert build_algorithm("flic", schedule="personal-first", rep_epochs=3).phases(0, 3, net) == \
        [Phase(("embed", "head"), 0), Phase(("body",), 3)]
    assert build_algorithm("local", schedule="personal-first").phases(30, 10, net) == \
        [Phase(("embed", "body", "head"), 10)]


def test_schedule_runs_its_phases(monkeypatch, tmp_path):
    """_train freezes exactly what each phase leaves out: the modules with gradients in every
    local_train call, round by round; the shared part stays at its initial value while frozen."""
    import fedsim.personal as personal
    calls, orig = [], personal.local_train

    def recording(algo, ctx, **kw):
        trains = tuple(m for m in ("embed", "body", "head")
                       if all(p.requires_grad for p in getattr(ctx.model, m).parameters()))
        assert not any(p.requires_grad for m in {"embed", "body", "head"} - set(trains)
                       for p in getattr(ctx.model, m).parameters())
        calls.append((ctx.round, trains, kw["epochs"]))
        return orig(algo, ctx, **kw)

    monkeypatch.setattr(personal, "local_train", recording)
    ds = linear_mapping(6, seed=0, n_spaces=6, n_train=24, n_test=20)
    spec = MethodSpec("FLIC", "flic", algorithm_params={"schedule": "personal-first", "rep_start_round": 1,
                                                        "rep_epochs": 1, "align_epochs": 2, "anchor_ce": 0.5})
    run_personal_method(_cfg(rounds=1, local_epochs=3), spec, 0, ds, tmp_path / "one", progress=False)
    assert calls and set(calls) == {(0, ("embed", "head"), 3)}
    state = torch.load(tmp_path / "one" / "checkpoint.pt", weights_only=True)
    with torch.random.fork_rng(devices=[]):  # client 0's initial model: the group's shared start
        torch.manual_seed(personal._init_seed(0, 0))
        init = PersonalNet(ds.clients[0].dim, ds.n_classes, embed_dim=4, embed_hidden=8, hidden=8).state_dict()
    (shared,) = state["shared"].values()
    for k, v in shared.items():  # the body never trained: only the average's round-off moves it
        torch.testing.assert_close(v, init[k], rtol=1e-6, atol=1e-7)
    calls.clear()
    run_personal_method(_cfg(rounds=2, local_epochs=3), spec, 0, ds, tmp_path / "two", progress=False)
    assert {c for c in calls if c[0] == 1} == {(1, ("embed", "head"), 2), (1, ("body",), 1)}


def test_flic_class_shares_only_the_anchors(tmp_path):
    """hidden=0 (FLIC-Class): the head reads phi_i(x); FLIC then shares no weights, only the anchors,
    which still move; the official schedule trains everything in one phase."""
    net = PersonalNet(7, 5, embed_dim=4, hidden=0)
    assert not any(k.startswith("body.") for k in net.state_dict()) and net.head.in_features == 4
    ds = linear_mapping(6, seed=0, n_spaces=6, n_train=24, n_test=20)
    spec = MethodSpec("FLIC", "flic", algorithm_params={**SHORT, "schedule": "personal-first", "anchor_ce": 0.5})
    cfg = _cfg(rounds=2, model_params={"embed_dim": 4, "embed_hidden": 8, "hidden": 0})
    res, _ = run_personal_method(cfg, spec, 0, ds, tmp_path, progress=False)
    state = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert state["shared"] == {"all": {}}
    init = build_algorithm("flic")
    init.setup(n_classes=ds.n_classes, embed_dim=4, seed=0, device="cpu")
    assert not torch.equal(state["algorithm"]["anchor_means"], init.anchor_means)
    assert res["bytes_up"] > 0
    with pytest.raises(ValueError, match="hidden must be an integer >= 0"):
        PersonalNet(7, 5, hidden=-1)
    # phi_i's widths: 0 built empty layers that failed inside training, not at the config check
    for key, bad in (("embed_dim", 0), ("embed_hidden", 0), ("embed_dim", 2.0), ("embed_hidden", True)):
        with pytest.raises(ValueError, match=f"model_params: {key} must be an integer >= 1"):
            PersonalNet(7, 5, **{key: bad})


def test_schedule_errors_name_the_setting(tmp_path):
    for name, kw, word in (("flic", {"schedule": "official"}, "schedule must be"),
                           ("local", {"schedule": "personal-first", "rep_epochs": 2}, "shares nothing.*rep_epochs"),
                           ("flic", {"schedule": "personal-first", "rep_epochs": 0}, "rep_epochs"),
                           ("fedrep", {"schedule": "personal-first", "rep_start_round": -1}, "rep_start_round"),
                           ("flic", {"schedule": "personal-first", "head_epochs": 2}, "head_epochs.*schedule=fedrep"),
                           ("flic", {"rep_epochs": 2}, "rep_epochs.*schedule=personal-first")):
        with pytest.raises(ValueError, match=word):
            build_algorithm(name, **kw)
    spec = MethodSpec("FLIC", "flic", algorithm_params={"schedule": "personal-first", "rep_epochs": 4,
                                                        "rep_start_round": 5})
    ds = linear_mapping(6, seed=0, n_spaces=6, n_train=24, n_test=20)
    with pytest.raises(ValueError, match=r"rep_epochs \(4\) must be at most the run's local_epochs \(3\)"):
        run_personal_method(_cfg(rounds=1, local_epochs=3), spec, 0, ds, tmp_path, progress=False)
    # a whole run refuses it while checking its configuration, before anything is written
    from fedsim.runner import RunConfig, run

    cfg = RunConfig(dataset="toy:linear-mapping", model="personal", n_clients=4, rounds=1, local_epochs=3,
                    methods=[spec])
    with pytest.raises(ValueError, match=r"methods\[FLIC\].algorithm_params do not fit the run: flic: rep_epochs "
                                         r"\(4\) must be at most the run's local_epochs \(3\)"):
        run(cfg, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def test_fixed_anchors_move_only_their_means_and_adam_is_used(monkeypatch, tmp_path):
    """anchor_cov='fixed': covariances stay anchor_var * I and are neither uploaded nor counted; each
    held class's anchor becomes the count-weighted mean of the uploaded class means. optimizer='adam'
    builds Adam for the local steps and the alignment phase, never SGD."""
    ds = linear_mapping(6, seed=0, n_spaces=6, n_train=24, n_test=20)
    seen, built = [], []
    orig = FLIC.aggregate

    def recording(self, global_params, updates, *, n_clients):
        seen.append(updates)
        return orig(self, global_params, updates, n_clients=n_clients)

    monkeypatch.setattr(FLIC, "aggregate", recording)
    for name in ("Adam", "SGD"):
        cls = getattr(torch.optim, name)
        monkeypatch.setattr(torch.optim, name, lambda *a, _c=cls, _n=name, **k: built.append(_n) or _c(*a, **k))
    spec = MethodSpec("FLIC", "flic", algorithm_params={"anchor_cov": "fixed", "anchor_var": 1.0, "optimizer": "adam",
                                                        "anchor_ce": 0.5, "align_epochs": 2})
    cfg = _cfg(rounds=2, lr=0.01)
    run_personal_method(cfg, spec, 0, ds, tmp_path, progress=False)
    assert built and set(built) == {"Adam"}
    state = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    covs, means = state["algorithm"]["anchor_covs"], state["algorithm"]["anchor_means"]
    assert torch.equal(covs, torch.eye(4, dtype=covs.dtype).expand_as(covs))
    last = seen[-1]
    assert all("class_covs" not in u.extras for u in last)
    counts = torch.stack([u.extras["class_counts"] for u in last])
    expect = (counts[..., None] * torch.stack([u.extras["class_means"] for u in last]).double()).sum(0)
    held = counts.sum(0) > 0
    assert bool(held.any())
    torch.testing.assert_close(means[held], (expect / counts.sum(0)[:, None])[held])
    # downloads count the shared weights and the means only (C x d), not the fixed covariances
    algo = build_algorithm("flic", anchor_cov="fixed")
    algo.setup(n_classes=5, embed_dim=4, seed=0, device="cpu")
    learned = build_algorithm("flic")
    learned.setup(n_classes=5, embed_dim=4, seed=0, device="cpu")
    assert learned.download_bytes({}) - algo.download_bytes({}) == 5 * 4 * 4 * 4


# ------------------------------------------------------------------------------ personalised checkpoints
def test_personal_resume_refuses_other_data_or_config(tmp_path):
    """A personalised checkpoint carries the configuration's fingerprint and the dataset's checksum,
    like the global path's: another toy draw, another option or a damaged file is refused by name."""
    from fedsim._checkpoint import CheckpointError, dataset_checksum

    spec = MethodSpec("FLIC", "flic", algorithm_params=SHORT)
    ds = linear_mapping(6, seed=0, n_spaces=3, n_train=24, n_test=30)
    d = tmp_path / "r"
    run_personal_method(_cfg(rounds=1), spec, 0, ds, d, progress=False)
    other = linear_mapping(6, seed=1, n_spaces=3, n_train=24, n_test=30)  # other data, same shapes per space?
    assert dataset_checksum(other) != dataset_checksum(ds)
    with pytest.raises(CheckpointError, match="other data"):
        run_personal_method(_cfg(rounds=2), spec, 0, other, d, progress=False)
    with pytest.raises(CheckpointError, match="another configuration"):
        run_personal_method(_cfg(rounds=2, lr=0.1), spec, 0, ds, d, progress=False)
    with pytest.raises(CheckpointError, match="another configuration"):
        run_personal_method(_cfg(rounds=2), spec, 1, ds, d, progress=False)  # another seed
    (d / "checkpoint.pt").write_bytes((d / "checkpoint.pt").read_bytes()[:100])
    with pytest.raises(CheckpointError, match="truncated"):
        run_personal_method(_cfg(rounds=2), spec, 0, ds, d, progress=False)


# ------------------------------------------------------------------------------ dataset options, wordnet:mixed
def test_toy_options_in_the_dataset_name(tmp_path):
    ds = load_toy("toy:linear-mapping?n_spaces=6&dims=5-9&n_classes=3&n_train=10&n_test=7&latent_dim=4",
                  n_clients=6, seed=0)
    assert len(ds.spaces) == 6 and ds.n_classes == 3 and all(5 <= c.dim <= 9 for c in ds.clients)
    assert all(c.x_train.shape[0] == 10 and c.x_test.shape[0] == 7 for c in ds.clients)
    ref = linear_mapping(6, seed=0, n_spaces=6, dim_range=(5, 9), n_classes=3, n_train=10, n_test=7, latent_dim=4)
    assert all(torch.equal(a.x_train, b.x_train) for a, b in zip(ds.clients, ref.clients))
    noisy = load_toy("toy:noisy-features?noise=3&classes_per_client=2", n_clients=4, seed=0)
    assert all(len(set(c.y_train.tolist())) <= 2 for c in noisy.clients)
    for bad, word in (("toy:linear-mapping?colour=red", "unknown option"), ("toy:linear-mapping?dims=9-5", "dims"),
                      ("toy:linear-mapping?n_classes=x", "n_classes"), ("toy:noisy-features?noise=nan", "noise"),
                      ("toy:linear-mapping?n_spaces", "key=value"), ("toy:linear-mapping?n_spaces=9", "n_spaces"),
                      ("toy:linear-mapping?noise=1", "noise"), ("toy:noisy-features?dims=4-9", "latent_dim"),
                      ("toy:linear-mapping?classes_per_client=6", "classes_per_client")):
        with pytest.raises(ValueError, match=word):
            load_toy(bad, n_clients=4, seed=0)
    # from the CLI: a bad option stops the run before anything is written, naming it
    from fedsim.cli import main

    assert main(["run", "--dataset", "toy:linear-mapping?n_spaces=0", "--algorithms", "local", "--rounds", "1",
                 "--out", str(tmp_path / "x")]) == 2
    assert not (tmp_path / "x").exists()


def test_wordnet_mixed_two_real_representations():
    from fedsim.data import load_dataset, mixed

    minilm, tfidf = mixed.load_views()
    assert tfidf.dim != minilm.dim and torch.equal(tfidf.y_train, minilm.y_train)
    assert tfidf.meta["rows_of"]["file"] == "wordnet_minilm.npz"
    cfg = _cfg(dataset="wordnet:mixed", n_clients=6, partition="iid")
    ds = personal_dataset(cfg, 3)
    assert ds.meta["clients"] == personal_dataset(cfg, 3).meta["clients"]  # from the seed
    reps = [c["representation"] for c in ds.meta["clients"]]
    assert reps.count("tfidf") == 3 and len(ds.spaces) == 6  # pruned: every client its own space
    pool = {"minilm": torch.cat([minilm.x_train, minilm.x_test]).float(),
            "tfidf": torch.cat([tfidf.x_train, tfidf.x_test]).float()}
    plan = mixed.client_views(6, 3, tfidf=0.5, prune=0.05, dims={k: v.shape[1] for k, v in pool.items()})
    y = torch.cat([minilm.y_train, minilm.y_test])
    for c, rep, (rep2, cols, space) in zip(ds.clients, reps, plan):
        D = pool[rep].shape[1]
        assert rep2 == rep and c.space == space and int(0.95 * D) <= c.dim <= D and c.dim == cols.numel()
        # every row of the client is a row of its representation seen through its kept coordinates
        seen = pool[rep][:, cols]
        for xr, yr in zip(c.x_train[:5], c.y_train[:5]):
            i = int(torch.cdist(xr[None], seen).argmin())
            assert torch.equal(seen[i], xr) and int(y[i]) == int(yr)
    shared = personal_dataset(_cfg(dataset="wordnet:mixed?prune=0&tfidf=0.5", n_clients=6, partition="iid"), 3)
    assert sorted(shared.spaces.items()) == [("minilm", 384), ("tfidf", tfidf.dim)]
    with pytest.raises(ValueError, match="prune"):
        personal_dataset(_cfg(dataset="wordnet:mixed?prune=1", n_clients=6), 0)
    with pytest.raises(ValueError, match="unknown option"):
        personal_dataset(_cfg(dataset="wordnet:mixed?dim=3", n_clients=6), 0)
    assert load_dataset("default").dim == 384


# ------------------------------------------------------------------------------------------------
# Folded from test_flic_bytes.py:
# Byte accounting on the personalised path: a federation of one exchanges nothing.

SIZES = {"embed_dim": 4, "embed_hidden": 8, "hidden": 8}


def _bytes_cfg(rounds=2):
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
    cfg = _bytes_cfg()
    local, _ = run_personal_method(cfg, cfg.methods[0], 0, ds, tmp_path / "local", progress=False)
    fedrep, _ = run_personal_method(cfg, cfg.methods[1], 0, ds, tmp_path / "fedrep", progress=False)
    assert fedrep["bytes_up"] == 0 and fedrep["bytes_down"] == 0
    assert fedrep["client_accuracy"] == local["client_accuracy"] and fedrep["train_loss"] == local["train_loss"]


def test_fedrep_pairs_count_their_round_trip(tmp_path):
    """Two clients per space: each selected client uploads and downloads its space's shared part
    (embed + body, float32) every round, exactly."""
    ds = linear_mapping(6, seed=0, n_spaces=3, n_train=20, n_test=20)
    cfg = _bytes_cfg(rounds=2)
    res, _ = run_personal_method(cfg, cfg.methods[1], 0, ds, tmp_path / "fedrep", progress=False)
    per_round = sum(_shared_bytes(c.dim, ds.n_classes) for c in ds.clients)
    assert per_round > 0 and res["bytes_up"] == 2 * per_round and res["bytes_down"] == 2 * per_round


def test_mixed_group_sizes_count_only_the_shared(tmp_path):
    """Spaces of 1 and of several clients in one run: only clients with a partner count bytes."""
    ds = linear_mapping(6, seed=1, n_spaces=4, n_train=20, n_test=20)  # round robin: sizes 2, 2, 1, 1
    sizes = {s: sum(c.space == s for c in ds.clients) for s in ds.spaces}
    assert sorted(sizes.values()) == [1, 1, 2, 2]
    cfg = _bytes_cfg(rounds=1)
    res, _ = run_personal_method(cfg, cfg.methods[1], 0, ds, tmp_path / "fedrep", progress=False)
    expected = sum(_shared_bytes(c.dim, ds.n_classes) for c in ds.clients if sizes[c.space] > 1)
    assert res["bytes_up"] == expected == res["bytes_down"]
    assert torch.tensor(expected) > 0


# ------------------------------------------------------------------------------------------------
# Folded from test_flic_stability.py:
# FLIC at a high learning rate: the divergence of docs/flic.md ("Divergence at lr 0.2"), small.
#
# On a 6-client linear-mapping toy, lr 0.2 with the default lam 0.1 blows up within the first
# client's local training (with lam 0 the same run trains: 0.36 final loss, measured), and ``max_grad_norm`` keeps it finite
# while counting the steps it rescaled.

def _run(tmp_path, name, rounds=3, **params):
    """lr 0.2: local training diverges without max_grad_norm (the alignment phase, which it does not
    cap, is off unless asked for)."""
    ds = linear_mapping(6, seed=0, n_spaces=3, n_train=40, n_test=40)
    spec = MethodSpec("FLIC", "flic", algorithm_params={"align_epochs": 0, **params})
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


def test_alignment_divergence_is_named(tmp_path):
    """The alignment phase (on by default) at a learning rate it cannot take stops the run with
    DivergedError naming the phase and the way out, not with a NaN refusal from deep in the W2."""
    with pytest.raises(DivergedError, match=r"alignment phase \(align_epochs=300.*flic.align_epochs=0"):
        _run(tmp_path, "align", align_epochs=300)


def test_clipped_steps_survive_resume(tmp_path):
    straight = _run(tmp_path, "a", rounds=2, max_grad_norm=5.0)
    _run(tmp_path, "b", rounds=1, max_grad_norm=5.0)
    resumed = _run(tmp_path, "b", rounds=2, max_grad_norm=5.0)
    assert straight == resumed and straight["clipped_steps"] > 0


def test_bad_max_grad_norm_named():
    for bad in (-1.0, float("nan"), "5", True):
        with pytest.raises(ValueError, match="max_grad_norm"):
            build_algorithm("flic", max_grad_norm=bad)


def test_settings_the_personalised_path_ignores_are_refused_and_not_recorded(tmp_path):
    """A flag the personalised path never reads is a mistake, not a no-op: set away from its
    default it stops the run before anything is written, naming it; results.json records only what
    played a part (a toy generates its own clients: no partition; the model is PersonalNet)."""
    import json

    from fedsim.runner import ConfigError

    for kw, flags in (({"feature_shift": 1.0}, "--feature-shift"), ({"zero_shot": True}, "--zero-shot"),
                      ({"partition": "iid"}, "--partition"), ({"beta": 0.5, "min_size": 3}, "--beta, --min-size")):
        out = tmp_path / f"x{len(flags)}"
        with pytest.raises(ConfigError, match=f"config: {flags} play\\(s\\) no part on the personalised path"):
            run(_cfg(rounds=1, **kw), out, progress=False)
        assert not out.exists()
    res = run(_cfg(rounds=1, methods=[MethodSpec("Local", "local")], model="linear", model_params={}),
              tmp_path / "toy", progress=False)
    cfg = json.loads((tmp_path / "toy" / "results.json").read_text())["config"]
    assert res["config"] == cfg and cfg["model"] == "personal"
    assert not {"partition", "beta", "min_size", "feature_shift", "feature_noise", "zero_shot", "val_fraction"} & set(cfg)
    # a dataset file's rows are partitioned by the run's scheme: those fields stay
    mixed = run(_cfg(dataset="wordnet:mixed", n_clients=4, partition="iid", rounds=1,
                     methods=[MethodSpec("Local", "local")]), tmp_path / "mixed", progress=False)["config"]
    assert mixed["partition"] == "iid" and "beta" not in mixed and "feature_shift" not in mixed


def test_refusals_name_every_registered_personalised_algorithm(tmp_path):
    """The personalised path's refusals list its algorithms from the registry, so a new one
    (FedHeNN) is named without editing each message."""
    from fedsim.algorithms import ALGORITHMS, personal_algorithms
    from fedsim.runner import ConfigError

    names = personal_algorithms().split(", ")
    assert names == sorted(n for n, c in ALGORITHMS.items() if getattr(c, "personal", False))
    assert {"local", "fedrep", "flic", "fedhenn"} <= set(names)
    with pytest.raises(ConfigError) as err:
        run(_cfg(rounds=1, feature_shift=1.0), tmp_path / "x", progress=False)
    assert all(n in str(err.value) for n in names), str(err.value)


def test_final_round_trains_every_client_on_what_it_does_not_share(monkeypatch, tmp_path):
    """final_epochs > 0 (the FLIC authors' last round): after the regular rounds one more in which
    every client trains its own parts for final_epochs epochs; nothing shared moves and nothing is
    averaged or counted; its history entry is marked final, final_accuracy reads it, last5_mean
    the regular rounds; a run resumed after it refuses more rounds, one resumed before it runs it."""
    import fedsim.personal as personal
    from fedsim._checkpoint import CheckpointError
    calls, orig = [], personal.local_train

    def recording(algo, ctx, **kw):
        calls.append((ctx.round, ctx.cid, tuple(m for m in ("embed", "body", "head")
                                                if all(p.requires_grad for p in getattr(ctx.model, m).parameters())),
                      kw["epochs"]))
        return orig(algo, ctx, **kw)

    monkeypatch.setattr(personal, "local_train", recording)
    ds = linear_mapping(6, seed=0, n_spaces=6, n_train=24, n_test=20)
    spec = MethodSpec("FLIC", "flic", algorithm_params={**SHORT, "schedule": "personal-first", "final_epochs": 2})
    cfg = _cfg(rounds=2, local_epochs=3, client_fraction=0.34)
    metrics, _ = run_personal_method(cfg, spec, 0, ds, tmp_path / "a", progress=False)
    final = [c for c in calls if c[0] == 2]
    assert sorted(c[1] for c in final) == list(range(6)) and {c[2:] for c in final} == {(("embed", "head"), 2)}
    assert len({c[1] for c in calls if c[0] < 2}) < 6  # the regular rounds sample 2 of 6
    state = torch.load(tmp_path / "a" / "checkpoint.pt", weights_only=True)
    hist = state["history"]
    assert len(hist) == 3 and hist[-1]["final"] and not any(h.get("final") for h in hist[:2])
    assert hist[-1]["bytes_up"] == hist[-1]["bytes_down"] == 0
    assert metrics["final_accuracy"] == hist[-1]["accuracy"] and len(metrics["accuracy"]) == 3
    assert metrics["last5_mean"] == pytest.approx(sum(h["accuracy"] for h in hist[:2]) / 2)
    # interrupted before the final round: the resume runs it and equals the straight run
    real_round = personal.PersonalFederation.round

    def interrupted(self, r, selected):
        if r == cfg.rounds:
            raise KeyboardInterrupt
        return real_round(self, r, selected)

    monkeypatch.setattr(personal.PersonalFederation, "round", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_personal_method(cfg, spec, 0, ds, tmp_path / "b", progress=False)
    assert len(torch.load(tmp_path / "b" / "checkpoint.pt", weights_only=True)["history"]) == 2
    monkeypatch.setattr(personal.PersonalFederation, "round", real_round)
    resumed, _ = run_personal_method(cfg, spec, 0, ds, tmp_path / "b", progress=False)
    assert resumed == metrics
    with pytest.raises(CheckpointError, match="final round"):
        run_personal_method(_cfg(rounds=4, local_epochs=3, client_fraction=0.34), spec, 0, ds, tmp_path / "a",
                            progress=False)
    with pytest.raises(ValueError, match="final_epochs must be an integer >= 0"):
        build_algorithm("local", final_epochs=-1)


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
@pytest.mark.parametrize("schedule", ["fedrep", "personal-first"])
def test_one_optimizer_per_round_equals_one_per_phase(monkeypatch, tmp_path, optimizer, schedule):
    """personal._train keeps one optimizer across a round's phases (as the FLIC authors' client
    does); the phases train disjoint modules, so a fresh optimizer per phase gives the same weights
    bit for bit (issue 43: the 'fresh Adam per phase' difference makes none)."""
    import fedsim.personal as personal
    ds = linear_mapping(6, seed=0, n_spaces=6, n_train=24, n_test=20)
    spec = MethodSpec("FLIC", "flic", algorithm_params={**SHORT, "schedule": schedule, "optimizer": optimizer,
                                                        "anchor_ce": 0.5})
    cfg = _cfg(rounds=2, local_epochs=3, weight_decay=1e-3)
    one, _ = run_personal_method(cfg, spec, 0, ds, tmp_path / "one", progress=False)
    orig = personal.local_train
    monkeypatch.setattr(personal, "local_train",
                        lambda algo, ctx, **kw: orig(algo, ctx, **{**kw, "optimizer": algo.hp["optimizer"]}))
    fresh, _ = run_personal_method(cfg, spec, 0, ds, tmp_path / "fresh", progress=False)
    assert one == fresh
    a, b = (torch.load(tmp_path / d / "checkpoint.pt", weights_only=True) for d in ("one", "fresh"))
    for pa, pb in zip(a["personal"], b["personal"]):
        assert all(torch.equal(pa[k], pb[k]) for k in pa)
