"""--tune: each method's learning rate (and local epochs where asked) chosen on the validation
rows, recorded in results.json, and the run reported at the chosen values (issue 31 item 1)."""
from __future__ import annotations

import contextlib
import json

import numpy as np
import pytest
import torch
from _fedsim_helpers import interrupted_after, save_blobs

from fedsim import client as client_module  # local_train: what client.client_round calls
from fedsim import runner
from fedsim.cli import main
from fedsim.data import Dataset, load_dataset, save_dataset
from fedsim.runner import CENTRALISED, MethodSpec, RunConfig


@pytest.fixture(scope="module")
def blobs(tmp_path_factory):
    return save_blobs(tmp_path_factory.mktemp("data") / "blobs.npz", classes=5, dim=16, noise=1.2,
                      n_train=500, n_test=200, seed=7)


def _cfg(path, **kw):
    base = dict(dataset=str(path), rounds=5, n_clients=3, beta=0.5, batch_size=32, min_size=5,
                methods=[MethodSpec("FedAvg"), MethodSpec("FedAvg+GGEUR", augmenter="ggeur")],
                tune_lr=[0.005, 0.05, 0.5], seeds=2)
    base.update(kw)
    return RunConfig(**base)


def test_each_method_takes_the_grid_point_with_the_best_validation_score(tmp_path, blobs):
    res = runner.run(_cfg(blobs, centralised=True), tmp_path / "o", progress=False)
    assert json.loads((tmp_path / "o" / "results.json").read_text())["methods"] == res["methods"]
    for name in ("FedAvg", "FedAvg+GGEUR", CENTRALISED):
        m = res["methods"][name]
        t = m["tuning"]
        assert [p["lr"] for p in t["grid"]] == [0.005, 0.05, 0.5] and all(p["local_epochs"] == 1 for p in t["grid"])
        for p in t["grid"]:  # the score is the validation accuracy of the last 5 rounds, mean over seeds
            assert set(p["per_seed"]) == {"0", "1"}
            assert p["score"] == pytest.approx(np.mean(list(p["per_seed"].values())))
        assert t["lr"] == max(t["grid"], key=lambda p: p["score"])["lr"]
        # a choice at an end of the grid is said to be one
        assert t.get("at_edge") == ({"lr": {0.005: "min", 0.5: "max"}[t["lr"]]} if t["lr"] != 0.05 else None)
        point = next(p for p in t["grid"] if p["lr"] == t["lr"])
        for s, v in m["seeds"].items():
            assert np.mean(v["val_accuracy"]) == pytest.approx(point["per_seed"][s])
    # the reported row is a plain run at the chosen lr, digit for digit
    lr = res["methods"]["FedAvg+GGEUR"]["tuning"]["lr"]
    plain = runner.run(_cfg(blobs, tune_lr=[], lr=lr, methods=[MethodSpec("FedAvg+GGEUR", augmenter="ggeur")]),
                       tmp_path / "plain", progress=False)
    assert plain["methods"]["FedAvg+GGEUR"]["seeds"] == res["methods"]["FedAvg+GGEUR"]["seeds"]
    table = (tmp_path / "o" / "table.txt").read_text()
    assert " lr " in table.splitlines()[0] and "chosen per method" in table


def test_the_test_rows_play_no_part_in_the_choice(tmp_path, blobs):
    """The same data with the test labels shuffled: the same scores, the same choice."""
    ds = load_dataset(str(blobs))
    g = torch.Generator().manual_seed(0)
    shuffled = tmp_path / "shuffled.npz"
    y_test = ds.y_test[torch.randperm(len(ds.y_test), generator=g)]
    save_dataset(Dataset("blobs", ds.x_train, ds.y_train, ds.x_test, y_test, ds.class_names), shuffled)
    a = runner.run(_cfg(blobs, seeds=1), tmp_path / "a", progress=False)
    b = runner.run(_cfg(shuffled, seeds=1), tmp_path / "b", progress=False)
    for name in a["methods"]:
        assert a["methods"][name]["tuning"] == b["methods"][name]["tuning"]
        assert a["methods"][name]["seeds"]["0"]["accuracy"] != b["methods"][name]["seeds"]["0"]["accuracy"]


def test_local_epochs_are_tuned_with_the_learning_rate_and_a_diverging_point_is_skipped(tmp_path, blobs, monkeypatch):
    from fedsim.client import DivergedError

    real = client_module.local_train

    def diverging(algo, ctx, **kw):  # lr 1e30 diverges (whether the head's loss overflows depends on the data)
        if ctx.lr == 1e30:
            raise DivergedError("the training loss became nan at local step 1")
        return real(algo, ctx, **kw)

    monkeypatch.setattr(client_module, "local_train", diverging)
    one = dict(seeds=1, methods=[MethodSpec("FedAvg")])
    res = runner.run(_cfg(blobs, tune_lr=[0.05, 1e30], tune_epochs=[2, 1], **one), tmp_path / "o", progress=False)
    t = res["methods"]["FedAvg"]["tuning"]
    assert [(p["local_epochs"], p["lr"]) for p in t["grid"]] == [(1, 0.05), (1, 1e30), (2, 0.05), (2, 1e30)]
    assert all(p["diverged"] == "seed 0" and "score" not in p for p in t["grid"] if p["lr"] == 1e30)
    assert t["lr"] == 0.05 and t["local_epochs"] in (1, 2)
    assert json.loads((tmp_path / "o" / "results.json").read_text())["config"]["tune_epochs"] == [1, 2]
    with pytest.raises(RuntimeError, match="every grid point"):
        runner.run(_cfg(blobs, tune_lr=[1e30], **one), tmp_path / "x", progress=False)


def test_a_tuned_run_resumes_exactly(tmp_path, blobs, monkeypatch):
    cfg = dict(seeds=1, methods=[MethodSpec("FedAvg")])
    runner.run(_cfg(blobs, **cfg), tmp_path / "full", progress=False)
    with interrupted_after(monkeypatch, runner, 7), pytest.raises(KeyboardInterrupt):  # in the second grid point
        runner.run(_cfg(blobs, **cfg), tmp_path / "cut", progress=False)
    runner.run(RunConfig(), tmp_path / "cut", resume=True, progress=False)
    assert (tmp_path / "cut" / "results.json").read_text() == (tmp_path / "full" / "results.json").read_text()


def test_cli_tune_uses_a_grid_around_the_run_lr(tmp_path, blobs, capsys):
    base = ["run", "--dataset", str(blobs), "--clients", "3", "--rounds", "5", "--min-size", "5", "--quiet",
            "--threads", "1", "--algorithms", "fedavg", "--augmenters", "none"]
    assert main(base + ["--tune", "--lr", "0.1", "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    assert "chosen per method" in out
    t = json.loads((tmp_path / "o" / "results.json").read_text())["methods"]["FedAvg"]["tuning"]
    assert [p["lr"] for p in t["grid"]] == [0.025, 0.05, 0.1, 0.2, 0.4]


@pytest.mark.parametrize("extra,words", [
    (["--tune", "--val-fraction", "0"], ["--val-fraction", "> 0"]),
    (["--tune-lr", "0.1,x"], ["--tune-lr", "comma list"]),
    (["--tune-lr", "0.1,-1"], ["tune_lr", "--tune-lr"]),
    (["--tune-epochs", "0"], ["tune_epochs", "--tune-epochs"]),
    (["--tune", "--algorithms", "local"], ["personalised", "drop the tuning flags"]),
])
def test_bad_tuning_flags_are_refused_by_name(tmp_path, blobs, capsys, extra, words):
    base = ["run", "--dataset", str(blobs), "--clients", "3", "--rounds", "2", "--min-size", "5", "--quiet",
            "--threads", "1", "--out", str(tmp_path / "o")]
    with pytest.raises(SystemExit) if extra[1] == "0.1,x" else contextlib.nullcontext():  # argparse's own exit
        assert main(base + extra) == 2
    err = capsys.readouterr().err
    assert all(w in err for w in words), err
    assert not (tmp_path / "o" / "config.json").exists()


def test_tuning_is_refused_on_the_flower_engine(tmp_path, blobs):
    pytest.importorskip("flwr")
    from fedsim.flower.engine import FlowerEngine

    with pytest.raises(ValueError, match="drop --engine flower"):
        runner.run(_cfg(blobs), tmp_path / "o", progress=False, engine=FlowerEngine(None))
    assert not (tmp_path / "o").exists()
