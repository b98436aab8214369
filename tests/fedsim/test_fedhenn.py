"""FedHeNN on the personalised path: the pruned RAD, the CKA distance, that the alignment term is
what moves it away from Local, resume, what travels, refusals."""
from __future__ import annotations

import json

import pytest
import torch

from fedsim.algorithms import build_algorithm
from fedsim.algorithms.fedhenn import cka_distance, centred_kernel, rad
from fedsim.cli import main
from fedsim.data.toy import linear_mapping, noisy_features
from fedsim.personal import run_personal_method
from fedsim.report import control_of
from fedsim.runner import MethodSpec, RunConfig

SMALL = {"embed_dim": 4, "embed_hidden": 8, "hidden": 8}


def _go(tmp_path, name, ds, rounds=4, algorithm="fedhenn", **params):
    spec = MethodSpec(name, algorithm, algorithm_params={"optimizer": "adam", **params})
    cfg = RunConfig(dataset="toy:linear-mapping", n_clients=len(ds.clients), rounds=rounds, local_epochs=2,
                    batch_size=16, lr=0.01, client_fraction=0.5, methods=[spec], model="personal", model_params=SMALL)
    return run_personal_method(cfg, spec, 0, ds, tmp_path / name, progress=False)[0]


def _toy(make):
    return make(6, seed=0, n_spaces=6, n_train=24, n_test=24, n_classes=4)


def test_rad_is_one_draw_pruned_to_each_dimension():
    """A client of dimension D reads the first D coordinates of the run's one draw, whatever the others' D."""
    wide, narrow = rad(3, 30, 10), rad(3, 7, 10)
    assert narrow.shape == (10, 7) and torch.equal(narrow, wide[:, :7])
    assert not torch.equal(rad(4, 7, 10), narrow)  # drawn from the run's seed


def test_cka_distance_is_zero_on_itself_scale_and_rotation_free():
    g = torch.Generator().manual_seed(0)
    A, B = torch.randn(12, 5, generator=g, dtype=torch.float64), torch.randn(12, 5, generator=g, dtype=torch.float64)
    Q = torch.linalg.qr(torch.randn(5, 5, generator=g, dtype=torch.float64))[0]
    K = centred_kernel(A)
    assert float(cka_distance(A, K)) == pytest.approx(0.0, abs=1e-12)
    assert float(cka_distance(3.0 * A @ Q + 1.0, K)) == pytest.approx(0.0, abs=1e-12)  # scale, rotation, shift
    H = torch.eye(12, dtype=torch.float64) - 1.0 / 12
    L = H @ B @ B.T @ H
    cka = (L * K).sum() / (L.norm() * K.norm())  # the textbook form, (n, n) matrices
    assert float(cka_distance(B, K)) == pytest.approx(1.0 - float(cka), rel=1e-12)
    assert 0.0 < float(cka_distance(B, K)) < 1.0
    assert float(cka_distance(torch.ones(12, 5), K)) == 1.0  # no spread: far, not NaN


@pytest.mark.parametrize("make", [linear_mapping, noisy_features])
def test_alignment_term_is_what_differs_from_local(tmp_path, make):
    """eta = 0 trains exactly as Local (same streams); eta > 0 changes the training, and its clients'
    representations end closer to the global kernel than without the term, closer as rounds go on."""
    ds = _toy(make)
    local = _go(tmp_path, "local", ds, algorithm="local")
    off = _go(tmp_path, "off", ds, eta=0.0)
    on = _go(tmp_path, "on", ds, eta=5.0)
    assert off["accuracy"] == local["accuracy"] and off["train_loss"] == local["train_loss"]
    assert on["train_loss"][1:] != off["train_loss"][1:]
    assert on["train_loss"][0] == off["train_loss"][0]  # round 0: no global kernel yet
    d_on, d_off = on["rad_distance"], off["rad_distance"]
    assert len(d_on) == len(d_off) == 3  # from round 1
    assert all(a < b for a, b in zip(d_on, d_off)) and d_on[-1] < d_on[0]


def test_resume_equals_uninterrupted(tmp_path):
    ds = _toy(linear_mapping)
    straight = _go(tmp_path, "a", ds, rounds=3)
    _go(tmp_path, "b", ds, rounds=1)
    resumed = _go(tmp_path, "b", ds, rounds=3)
    assert straight == resumed and len(straight["rad_distance"]) == 2
    sa, sb = (torch.load(tmp_path / d / "checkpoint.pt", weights_only=True) for d in "ab")
    for pa, pb in zip(sa["personal"], sb["personal"]):
        assert all(torch.equal(pa[k], pb[k]) for k in pa)
    assert set(sa["algorithm"]) == set(sb["algorithm"]) >= {"features", "kernel"}
    for k, v in sa["algorithm"].items():
        assert torch.equal(v, sb["algorithm"][k])


def test_what_travels(tmp_path):
    """Up: each participant's RAD representation (rad_size x hidden float32); down: the global kernel,
    from round 1 on. No weight leaves a client."""
    ds = _toy(noisy_features)
    res = _go(tmp_path, "h", ds, rounds=2, rad_size=10)
    per_round = 3  # client_fraction 0.5 of 6
    assert res["bytes_up"] == 2 * per_round * 10 * SMALL["hidden"] * 4
    assert res["bytes_down"] == per_round * 10 * 10 * 4
    state = torch.load(tmp_path / "h" / "checkpoint.pt", weights_only=True)
    assert state["shared"] == {"all": {}}


def test_bad_parameters_name_the_flag():
    for key, bad in (("eta", -0.1), ("eta", float("nan")), ("eta", "0.1"), ("eta", True),
                     ("rad_size", 1), ("rad_size", 2.5), ("rad_size", False)):
        with pytest.raises(ValueError, match=f"--set fedhenn.{key}="):
            build_algorithm("fedhenn", **{key: bad})
    with pytest.raises(ValueError, match="shares nothing"):  # the personal-first schedule's shared phase
        build_algorithm("fedhenn", schedule="personal-first", rep_epochs=2)


def test_cli_preset_run_table_and_refusal(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["run", "--preset", "flic-paper", "--algorithms", "local,fedhenn", "--clients", "6", "--rounds", "2",
                 "--epochs", "1", "--dataset", "toy:noisy-features?n_classes=4&n_spaces=6&n_train=30&n_test=30",
                 "--out", str(out), "--quiet"]) == 0
    res = json.loads((out / "results.json").read_text())
    assert set(res["methods"]) == {"Local", "FedHeNN"}
    spec = {m["name"]: m for m in res["config"]["methods"]}["FedHeNN"]
    # the preset's Adam, the official eta and the official last round
    assert spec["algorithm_params"] == {"optimizer": "adam", "eta": 0.1, "final_epochs": 10}
    assert control_of(spec, res["config"]["methods"]) == "Local"
    assert main(["run", "--preset", "flic-paper", "--algorithms", "local,fedhenn", "--set", "fedhenn.eta=-1",
                 "--out", str(tmp_path / "bad"), "--quiet"]) != 0
    assert "--set fedhenn.eta" in capsys.readouterr().err and not (tmp_path / "bad" / "config.json").exists()
