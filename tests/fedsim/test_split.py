"""The validation rows every global-model run carves from its clients' training rows, the
convergence check that reads them, and the centralised row that pools the clients' views
(issue 31 items 1 and 3)."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from _fedsim_helpers import interrupted_after, save_blobs

from fedsim import report, runner
from fedsim.data import load_dataset
from fedsim.data.clients import client_data, make_partition
from fedsim.data.split import validation_split
from fedsim.metrics import CONVERGENCE_SLOPE, convergence, val_slope
from fedsim.runner import CENTRALISED, MethodSpec, RunConfig, validate


@pytest.fixture(scope="module")
def blobs(tmp_path_factory):
    """5 classes of unit-norm Gaussian blobs in D=16."""
    return save_blobs(tmp_path_factory.mktemp("data") / "blobs.npz", classes=5, dim=16, noise=0.9,
                      n_train=600, n_test=200, seed=3)


def _cfg(path, **kw):
    base = dict(dataset=str(path), rounds=6, n_clients=4, beta=0.3, batch_size=32, min_size=5,
                methods=[MethodSpec("FedAvg")])
    base.update(kw)
    return RunConfig(**base)


# ------------------------------------------------------------------------------ the split
def test_split_is_stratified_disjoint_complete_and_seeded(rng):
    y = rng.integers(0, 6, 500)
    y[:3] = 7  # a class of 3 rows gives none at 0.1 (round(0.3) = 0) ...
    y[3] = 8  # ... and a class of one row keeps it for training
    tr, va = validation_split(y, 0.1, seed=4, client=2)
    assert sorted(np.concatenate([tr, va]).tolist()) == list(range(500))  # disjoint and complete
    for c in np.unique(y):
        n = int((y == c).sum())
        assert int((y[va] == c).sum()) == min(int(np.floor(0.1 * n + 0.5)), n - 1), c
        assert (y[tr] == c).any(), c  # every held class keeps a training row
    again = validation_split(y, 0.1, seed=4, client=2)
    assert all(np.array_equal(a, b) for a, b in zip(again, (tr, va)))
    assert not np.array_equal(validation_split(y, 0.1, seed=5, client=2)[1], va)
    assert not np.array_equal(validation_split(y, 0.1, seed=4, client=3)[1], va)
    tr0, va0 = validation_split(y, 0.0, seed=4, client=2)
    assert va0.size == 0 and np.array_equal(tr0, np.arange(500))
    # at most half: a class of 2 rows gives one, never both
    assert validation_split(np.array([1, 1]), 0.5, seed=0, client=0)[1].size == 1


@pytest.mark.parametrize("shift", [0.0, 1.0])
def test_clients_train_on_the_rest_and_validate_through_their_own_view(blobs, shift):
    ds = load_dataset(str(blobs))
    cfg = validate(_cfg(blobs, feature_shift=shift, feature_noise=0.2 if shift else 0.0))
    parts = make_partition(cfg, ds, 0)
    clients, x_test = client_data(cfg, ds, parts, 0)
    whole, x_test0 = client_data(RunConfig(**{**cfg.to_dict(), "methods": cfg.methods, "val_fraction": 0.0}),
                                        ds, parts, 0)
    assert torch.equal(x_test, x_test0)
    for k, (c, w, p) in enumerate(zip(clients, whole, parts)):
        tr, va = validation_split(ds.y_train[p].numpy(), 0.1, seed=0, client=k)
        assert va.size > 0 and c.x.shape[0] + c.x_val.shape[0] == len(p)
        # the same rows as without the split, each in the client's view (the shift before the carve)
        assert torch.equal(c.x, w.x[tr]) and torch.equal(c.x_val, w.x[va])
        assert torch.equal(c.y_val, ds.y_train[p][va]) and torch.equal(c.y, ds.y_train[p][tr])


# ------------------------------------------------------------------------------ the convergence check
def test_val_slope_is_the_least_squares_slope_of_the_last_five_rounds():
    assert val_slope([0.1, 0.2, 0.3, 0.4]) is None  # fewer rounds than the window: not checked
    assert val_slope([0.9, 0.0, 0.1, 0.2, 0.3, 0.4]) == pytest.approx(0.1)  # only the last five count
    a = [0.5, 0.52, 0.51, 0.55, 0.56]
    assert val_slope(a) == pytest.approx(np.polyfit(np.arange(5), a, 1)[0])
    assert convergence([0.5] * 5) == {"val_slope": 0.0, "converged": True}
    rising = [0.5 + 2 * CONVERGENCE_SLOPE * r for r in range(5)]
    assert convergence(rising)["converged"] is False
    assert convergence([0.5 + 0.5 * CONVERGENCE_SLOPE * r for r in range(5)])["converged"] is True


def test_a_run_records_validation_accuracy_and_convergence(tmp_path, blobs):
    res = runner.run(_cfg(blobs, seeds=2), tmp_path / "o", progress=False)
    m = json.loads((tmp_path / "o" / "results.json").read_text())["methods"]["FedAvg"]
    assert m == res["methods"]["FedAvg"]
    for v in m["seeds"].values():
        assert len(v["val_accuracy"]) == 6 and all(0 <= a <= 1 for a in v["val_accuracy"])
        assert v["val_slope"] == pytest.approx(val_slope(v["val_accuracy"]))
        assert v["converged"] == (v["val_slope"] <= CONVERGENCE_SLOPE)
    conv = m["summary"]["convergence"]
    assert conv["val_slope"] == pytest.approx(np.mean([v["val_slope"] for v in m["seeds"].values()]))
    assert conv["limit"] == CONVERGENCE_SLOPE and conv["window"] == 5


def test_the_table_marks_a_method_still_rising():
    per_seed = {"0": {"final_accuracy": 0.5, "last5_mean": 0.5, "bytes_up": 1, "bytes_down": 1,
                      "val_slope": 3 * CONVERGENCE_SLOPE},
                "1": {"final_accuracy": 0.6, "last5_mean": 0.6, "bytes_up": 1, "bytes_down": 1, "val_slope": 0.0}}
    flat = {s: {**v, "val_slope": 0.0} for s, v in per_seed.items()}
    results = {"config": {"val_fraction": 0.1, "rounds": 30, "methods": []},
               "methods": {"A": {"seeds": per_seed, "summary": report.summarise(per_seed)},
                           "B": {"seeds": flat, "summary": report.summarise(flat)}}}
    assert results["methods"]["A"]["summary"]["convergence"]["converged"] is False  # mean slope 1.5 x the limit
    tim = {s: {"rounds": [{"train_s": 0.1, "geometry_s": 0.0}]} for s in ("0", "1")}
    lines = report.format_table(results, {"A": tim, "B": tim}).splitlines()
    assert lines[2].startswith("A *") and lines[3].startswith("B ") and "*" not in lines[3]
    assert any(line.startswith("* not converged") for line in lines)
    # a run the check could not read says why instead
    for p in per_seed.values():
        del p["val_slope"]
    del results["methods"]["B"]
    results["methods"]["A"]["summary"] = report.summarise(per_seed)
    results["config"]["rounds"] = 3
    assert "convergence not checked: fewer than 5 rounds" in report.format_table(results, {"A": tim})


def test_no_validation_rows_means_no_check_and_the_old_training_rows(tmp_path, blobs):
    a = runner.run(_cfg(blobs, val_fraction=0.0), tmp_path / "a", progress=False)["methods"]["FedAvg"]
    assert "val_accuracy" not in a["seeds"]["0"] and "convergence" not in a["summary"]
    assert "no validation rows (--val-fraction 0)" in (tmp_path / "a" / "table.txt").read_text()
    b = runner.run(_cfg(blobs), tmp_path / "b", progress=False)["methods"]["FedAvg"]
    assert a["seeds"]["0"]["accuracy"] != b["seeds"]["0"]["accuracy"]  # the held-out rows no longer train


def test_a_run_folder_from_before_the_split_resumes_as_it_ran(tmp_path, blobs, monkeypatch):
    """config.json without val_fraction (written before it existed): the resume takes 0 and the
    checkpoints' fingerprints still match, so it continues exactly as that run would have."""
    cfg = _cfg(blobs, val_fraction=0.0)
    runner.run(cfg, tmp_path / "full", progress=False)
    with interrupted_after(monkeypatch, runner, 3), pytest.raises(KeyboardInterrupt):
        runner.run(_cfg(blobs, val_fraction=0.0), tmp_path / "cut", progress=False)
    path = tmp_path / "cut" / "config.json"
    old = {k: v for k, v in json.loads(path.read_text()).items() if k not in ("val_fraction", "tune_lr", "tune_epochs")}
    path.write_text(json.dumps(old))
    runner.run(RunConfig(), tmp_path / "cut", resume=True, progress=False)
    full = json.loads((tmp_path / "full" / "results.json").read_text())
    assert json.loads((tmp_path / "cut" / "results.json").read_text())["methods"] == full["methods"]


def test_resume_with_validation_rows_equals_the_uninterrupted_run(tmp_path, blobs, monkeypatch):
    cfg = dict(feature_shift=1.0, centralised=True, methods=[MethodSpec("m", augmenter="ggeur")])
    runner.run(_cfg(blobs, **cfg), tmp_path / "full", progress=False)
    with interrupted_after(monkeypatch, runner, 9), pytest.raises(KeyboardInterrupt):  # in Centralised's round 4
        runner.run(_cfg(blobs, **cfg), tmp_path / "cut", progress=False)
    runner.run(RunConfig(), tmp_path / "cut", resume=True, progress=False)
    assert (tmp_path / "cut" / "results.json").read_text() == (tmp_path / "full" / "results.json").read_text()


# ------------------------------------------------------------------------------ the centralised row
def test_centralised_pools_every_clients_view_and_is_tested_like_them(blobs):
    from fedsim.data.partition import client_rotation

    ds = load_dataset(str(blobs))
    cfg = validate(_cfg(blobs, feature_shift=1.0, centralised=True))
    parts = make_partition(cfg, ds, 0)
    clients, x_test = client_data(cfg, ds, parts, 0)
    (one,), x_test_c = client_data(cfg, ds, parts, 0, pooled=True)
    assert torch.equal(x_test_c, x_test)  # the federated methods' per-client test views
    rows = torch.cat([p[torch.from_numpy(validation_split(ds.y_train[p].numpy(), 0.1, seed=0, client=k)[0])]
                      for k, p in enumerate(parts)])
    order = torch.argsort(rows)
    assert torch.equal(one.x, torch.cat([c.x for c in clients])[order])  # each row in its own client's view
    assert torch.equal(one.y, ds.y_train[rows[order]])
    assert one.x_val.shape[0] == sum(c.x_val.shape[0] for c in clients) > 0
    # not every row through client 0's rotation (the row before 2026-12): client 1's rows were turned by R_1
    r0 = client_rotation(ds.dim, 1.0, seed=0, client=0)
    raw = ds.x_train[parts[1]][torch.from_numpy(validation_split(ds.y_train[parts[1]].numpy(), 0.1, seed=0,
                                                                 client=1)[0])]
    assert not torch.allclose(clients[1].x.double(), raw.double() @ r0.T, atol=1e-3)


def test_without_a_shift_the_centralised_row_holds_the_dataset_in_order(blobs):
    ds = load_dataset(str(blobs))
    cfg = validate(_cfg(blobs, centralised=True, val_fraction=0.0))
    (one,), x_test = client_data(cfg, ds, make_partition(cfg, ds, 0), 0, pooled=True)
    assert torch.equal(one.x, ds.x_train) and torch.equal(one.y, ds.y_train) and torch.equal(x_test, ds.x_test)


def test_centralised_row_under_a_shift_runs_and_has_a_ceiling_check(tmp_path, blobs):
    res = runner.run(_cfg(blobs, feature_shift=1.0, centralised=True), tmp_path / "o", progress=False)
    c = res["methods"][CENTRALISED]["seeds"]["0"]
    assert len(c["per_client"]) == 1 and "val_accuracy" in c
