"""The table's `vs control` column: each augmenter (and FedMP) against its own matched control,
the paired difference over seeds with its range, the same in results.json (issue 31 item 2)."""
from __future__ import annotations

import json

import pytest
from conftest import save_blobs

from fedsim import report, runner
from fedsim.runner import MethodSpec, RunConfig


def _m(name, algorithm="fedavg", augmenter="none", algorithm_params=None, augmenter_params=None):
    return {"name": name, "algorithm": algorithm, "augmenter": augmenter,
            "algorithm_params": algorithm_params or {}, "augmenter_params": augmenter_params or {}}


DEFAULT = [_m("FedAvg"), _m("FedAvg+oversample", augmenter="oversample"), _m("FedAvg+GGEUR", augmenter="ggeur"),
           _m("FedAvg+FedMC", augmenter="fedmc")]


@pytest.mark.parametrize("methods,name,control", [
    (DEFAULT, "FedAvg+GGEUR", "FedAvg+oversample"),
    (DEFAULT, "FedAvg+FedMC", "FedAvg"),  # Algorithm 1: one calibrated row per real row
    (DEFAULT, "FedAvg", None),
    (DEFAULT, "FedAvg+oversample", None),  # a control is not compared with anything
    # the same extra rows: a GGEUR filling to 2000 is not matched by an oversample filling to 100
    ([_m("o", augmenter="oversample"), _m("g", augmenter="ggeur", augmenter_params={"target_per_class": 2000})],
     "g", None),
    ([_m("o", augmenter="oversample", augmenter_params={"target_per_class": 2000}),
      _m("g", augmenter="ggeur", augmenter_params={"target_per_class": 2000})], "g", "o"),
    # FedMC's fixed protocol adds GGEUR's budget of rows: its control is oversample
    (DEFAULT + [_m("fixed", augmenter="fedmc", augmenter_params={"protocol": "fixed"})], "fixed", "FedAvg+oversample"),
    ([_m("a"), _m("n", augmenter="fedmc", augmenter_params={"protocol": "fixed", "n_per_sample": 2})], "n", None),
    # under the same algorithm and algorithm parameters only
    ([_m("FedAvg+oversample", augmenter="oversample"), _m("FedProx+oversample", "fedprox", "oversample"),
      _m("FedProx+GGEUR", "fedprox", "ggeur")], "FedProx+GGEUR", "FedProx+oversample"),
    ([_m("p", "fedprox", "oversample", {"mu": 0.1}), _m("g", "fedprox", "ggeur")], "g", None),
    # FedMP: FedAvg at stage_rounds 1, FedAvg under the same stages otherwise
    ([_m("FedAvg"), _m("FedMP", "fedmp")], "FedMP", "FedAvg"),
    ([_m("FedAvg"), _m("S5", "fedmp", algorithm_params={"stage_rounds": 5}),
      _m("staged S5", "fedmp_cpgma", algorithm_params={"lam_align": 0.0, "stage_rounds": 5}),
      _m("staged S10", "fedmp_cpgma", algorithm_params={"lam_align": 0.0, "stage_rounds": 10})], "S5", "staged S5"),
    ([_m("FedAvg"), _m("S5", "fedmp", algorithm_params={"stage_rounds": 5})], "S5", None),
    ([_m("staged", "fedmp_cpgma", algorithm_params={"lam_align": 0}), _m("FedAvg")], "staged", None),
    ([_m("FedAvg+GGEUR", augmenter="ggeur"), _m("FedMP+GGEUR", "fedmp", "ggeur")], "FedMP+GGEUR", "FedAvg+GGEUR"),
    # an augmenter's control comes first: FedMP+GGEUR against FedMP+oversample where the run has it
    ([_m("FedAvg+GGEUR", augmenter="ggeur"), _m("FedMP+oversample", "fedmp", "oversample"),
      _m("FedMP+GGEUR", "fedmp", "ggeur")], "FedMP+GGEUR", "FedMP+oversample"),
])
def test_control_of(methods, name, control):
    assert report.control_of(next(m for m in methods if m["name"] == name), methods) == control


@pytest.fixture(scope="module")
def blobs(tmp_path_factory):
    return save_blobs(tmp_path_factory.mktemp("data") / "blobs.npz", classes=5, dim=16, noise=0.9,
                      n_train=600, n_test=200, seed=3)


def test_results_and_table_carry_each_augmenters_paired_difference_to_its_control(tmp_path, blobs):
    methods = [MethodSpec("FedAvg"), MethodSpec("FedAvg+oversample", augmenter="oversample"),
               MethodSpec("FedAvg+GGEUR", augmenter="ggeur"), MethodSpec("FedAvg+FedMC", augmenter="fedmc")]
    cfg = RunConfig(dataset=str(blobs), rounds=2, n_clients=4, beta=0.3, batch_size=32, min_size=5, seeds=3,
                    methods=methods, centralised=True)
    res = runner.run(cfg, tmp_path / "o", progress=False)
    assert json.loads((tmp_path / "o" / "results.json").read_text())["methods"] == res["methods"]
    m = res["methods"]
    for name, control in (("FedAvg+GGEUR", "FedAvg+oversample"), ("FedAvg+FedMC", "FedAvg")):
        d = m[name]["summary"]["control_diff"]
        want = {s: m[name]["seeds"][s]["final_accuracy"] - m[control]["seeds"][s]["final_accuracy"] for s in "012"}
        assert d["vs"] == control and d["metric"] == "final_accuracy"
        assert d["per_seed"] == pytest.approx(want)
        assert (d["mean"], d["min"], d["max"]) == pytest.approx((sum(want.values()) / 3, min(want.values()),
                                                                 max(want.values())))
    for name in ("FedAvg", "FedAvg+oversample", "Centralised"):
        assert "control_diff" not in m[name]["summary"], name
    lines = (tmp_path / "o" / "table.txt").read_text().splitlines()
    head = lines[0]
    assert "control" in head and "vs control pp" in head and "vs FedAvg pp" in head
    ggeur = next(line for line in lines if line.startswith("FedAvg+GGEUR"))
    d = m["FedAvg+GGEUR"]["summary"]["control_diff"]
    assert "FedAvg+oversample" in ggeur
    assert f"{100 * d['mean']:+.2f} [{100 * d['min']:+.2f}, {100 * d['max']:+.2f}]" in ggeur
    assert any(line.startswith("vs control:") for line in lines)
