"""What a run reports beyond accuracy: sample std and paired differences, per-class / per-client
accuracy and the confusion matrix, the plots, plain progress lines in a pipe, and results that do
not depend on the thread count."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from _fedsim_helpers import save_blobs

from fedsim import report, runner
from fedsim.metrics import final_report
from fedsim.runner import MethodSpec, RunConfig


@pytest.fixture(scope="module")
def blobs(tmp_path_factory):
    """5 classes of unit-norm Gaussian blobs in D=16."""
    return save_blobs(tmp_path_factory.mktemp("data") / "blobs.npz", classes=5, dim=16, noise=0.9,
                      n_train=600, n_test=200, seed=3)


def _cfg(path, **kw):
    base = dict(dataset=str(path), rounds=1, n_clients=4, beta=0.3, batch_size=32, min_size=5,
                methods=[MethodSpec("FedAvg"), MethodSpec("FedProx", algorithm="fedprox")])
    base.update(kw)
    return RunConfig(**base)


def test_summary_uses_the_sample_std_and_paired_differences():
    per_seed = {"0": {"final_accuracy": 0.5, "last5_mean": 0.4, "bytes_up": 1, "bytes_down": 1},
                "1": {"final_accuracy": 0.7, "last5_mean": 0.6, "bytes_up": 1, "bytes_down": 1}}
    s = report.summarise(per_seed)
    assert s["final_accuracy"]["std"] == pytest.approx(np.std([0.5, 0.7], ddof=1))  # 0.1414, not 0.1
    assert report.summarise({"0": per_seed["0"]})["final_accuracy"]["std"] is None  # one seed: no spread
    other = {"0": {**per_seed["0"], "final_accuracy": 0.55}, "1": {**per_seed["1"], "final_accuracy": 0.65}}
    results = {"methods": {"A": {"seeds": per_seed, "summary": s},
                           "B": {"seeds": other, "summary": report.summarise(other)}}}
    report.paired_differences(results)
    d = results["methods"]["B"]["summary"]["paired_diff"]
    assert d["vs"] == "A" and d["per_seed"] == pytest.approx({"0": 0.05, "1": -0.05})
    assert (d["mean"], d["min"], d["max"]) == pytest.approx((0.0, -0.05, 0.05))
    assert "paired_diff" not in results["methods"]["A"]["summary"]


def test_final_report_counts_classes_and_clients():
    class Fixed(torch.nn.Module):  # predicts class (x[:, 0]) as given
        def forward(self, x):
            return torch.nn.functional.one_hot(x[:, 0].long(), 3).float(), x

    y = torch.tensor([0, 0, 1, 1, 2, 2])
    pred = torch.tensor([0, 1, 1, 1, 0, 2])
    out = final_report(Fixed(), pred.view(-1, 1).float(), y, [torch.tensor([0, 0, 1]), torch.tensor([2])], 3)
    assert out["confusion"] == [[1, 1, 0], [0, 2, 0], [1, 0, 1]]
    assert out["per_class"] == [0.5, 1.0, 0.5] and out["worst_class_accuracy"] == 0.5
    c0, c1 = out["per_client"]
    assert c0["classes"] == [0, 1] and c0["own_accuracy"] == pytest.approx(3 / 4)
    assert c0["missing_accuracy"] == pytest.approx(1 / 2)
    assert c1["classes"] == [2] and c1["own_accuracy"] == pytest.approx(1 / 2)
    assert c1["missing_accuracy"] == pytest.approx(3 / 4)
    assert out["own_class_accuracy"] == pytest.approx(5 / 8)


def test_run_reports_per_class_clients_confusion_and_plots(tmp_path, blobs):
    res = runner.run(_cfg(blobs, seeds=2), tmp_path / "o", progress=False)
    on_disk = json.loads((tmp_path / "o" / "results.json").read_text())
    for name in ("FedAvg", "FedProx"):
        m = on_disk["methods"][name]
        for v in m["seeds"].values():
            conf = np.array(v["confusion"])
            assert conf.shape == (5, 5) and conf.sum() == 200
            # the confusion matrix's diagonal is the final accuracy
            assert np.trace(conf) / conf.sum() == pytest.approx(v["final_accuracy"])
            assert len(v["per_class"]) == 5 and len(v["per_client"]) == 4
        assert len(m["summary"]["per_class"]["mean"]) == 5
    d = on_disk["methods"]["FedProx"]["summary"]["paired_diff"]
    assert d["vs"] == "FedAvg" and set(d["per_seed"]) == {"0", "1"}
    assert res["methods"]["FedProx"]["summary"]["paired_diff"] == d  # the returned results agree
    table = (tmp_path / "o" / "table.txt").read_text()
    assert "sample std (ddof = 1)" in table and "vs FedAvg pp" in table and "per class" in table
    for f in ("accuracy.png", "partition.png", "per_class.png"):
        assert (tmp_path / "o" / f).stat().st_size > 1000, f


def test_progress_in_a_pipe_is_plain_lines():
    """A real pipe (not a StringIO): the rounds bar writes plain lines, no carriage returns."""
    code = ("from fedsim._progress import progress_bar\n"
            "for _ in progress_bar(range(50), desc='rounds', unit='round'):\n    pass\n")
    err = subprocess.run([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True, check=True).stderr
    assert "\r" not in err
    lines = err.splitlines()
    assert 2 <= len(lines) <= 12 and lines[-1].startswith("rounds: 50/50 rounds (100%)")


@pytest.mark.parametrize("augmenter", ["ggeur", pytest.param("fedmc", marks=pytest.mark.slow)])
def test_results_do_not_depend_on_the_thread_count(tmp_path_factory, augmenter):
    """D = 160 >= 128, where MKL's threaded eigensolver splits its work by thread count: before
    geomkern ran it on one thread, GGEUR's eigenbasis (and so its samples) differed at 1 and 2
    threads. FedMC's training loss differed in the 10th digit until geomkern padded 5-11-row
    float32 GEMM operands (MKL picks a thread-dependent kernel for them: geomkern/ops/rbf.py
    _MKL_ROWS; docs/history.md §13, "Threads")."""
    tmp = tmp_path_factory.mktemp("threads")
    data = save_blobs(tmp / "wide.npz", classes=3, dim=160, noise=1.0, n_train=300, n_test=60, seed=1)
    cfg = dict(dataset=str(data), rounds=1, n_clients=2, beta=1.0, min_size=5,
               methods=[MethodSpec("m", augmenter=augmenter)])
    before = torch.get_num_threads()
    out = {}
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            out[n] = runner.run(RunConfig(**cfg), tmp / f"t{n}", progress=False)["methods"]["m"]["seeds"]["0"]
    finally:
        torch.set_num_threads(before)
    assert out[1]["accuracy"] == out[2]["accuracy"]
    assert out[1]["train_loss"] == out[2]["train_loss"]


def test_centralised_row_is_one_client_with_all_data(tmp_path, blobs):
    res = runner.run(_cfg(blobs, methods=[MethodSpec("FedAvg")], centralised=True), tmp_path / "o", progress=False)
    assert list(res["methods"]) == ["FedAvg", "Centralised"]  # the ceiling comes last
    c = res["methods"]["Centralised"]
    assert (c["algorithm"], c["augmenter"]) == ("fedavg", "none")
    (client,) = c["seeds"]["0"]["per_client"]  # one client, holding every class
    assert client["classes"] == list(range(5))
    assert len(res["methods"]["FedAvg"]["seeds"]["0"]["per_client"]) == 4
    assert json.loads((tmp_path / "o" / "config.json").read_text())["centralised"] is True
    with pytest.raises(ValueError, match="Centralised"):
        runner.run(_cfg(blobs, methods=[MethodSpec("centralised")], centralised=True), tmp_path / "p",
                   progress=False)


def test_beta_is_recorded_only_where_the_partition_uses_it(tmp_path, blobs, capsys):
    from fedsim.cli import main
    from fedsim.data.partition import SCHEMES, USES_BETA, partition

    # USES_BETA is what partition() does: beta changes exactly those schemes' partitions
    g = torch.Generator().manual_seed(0)
    labels, domains = torch.randint(0, 5, (400,), generator=g), torch.randint(0, 2, (400,), generator=g)
    for scheme in SCHEMES:
        a, b = (partition(scheme, labels=labels, domains=domains, n_clients=4, beta=beta, min_size=5)
                for beta in (0.1, 100.0))
        assert any(not torch.equal(x, y) for x, y in zip(a, b)) == (scheme in USES_BETA), scheme
    base = ["run", "--dataset", str(blobs), "--clients", "4", "--rounds", "1", "--min-size", "5",
            "--algorithms", "fedavg", "--augmenters", "none", "--quiet", "--threads", "1"]
    assert main(base + ["--partition", "iid", "--beta", "0.7", "--out", str(tmp_path / "iid")]) == 0
    assert "partition iid, 4 clients" in capsys.readouterr().out
    assert "beta" not in json.loads((tmp_path / "iid" / "results.json").read_text())["config"]
    assert json.loads((tmp_path / "iid" / "config.json").read_text())["beta"] == 0.7  # what --resume verifies
    assert main(base + ["--beta", "0.7", "--out", str(tmp_path / "dir")]) == 0
    assert "partition dirichlet beta=0.7, 4 clients" in capsys.readouterr().out
    assert json.loads((tmp_path / "dir" / "results.json").read_text())["config"]["beta"] == 0.7


def test_timings_hold_each_methods_wall_time(tmp_path, blobs):
    out = tmp_path / "o"
    methods = [MethodSpec("FedAvg"), MethodSpec("FedAvg+GGEUR", augmenter="ggeur")]
    runner.run(_cfg(blobs, methods=methods, seeds=2, centralised=True), out, progress=False)
    wall = {name: {s: t["wall_s"] for s, t in per_seed.items()}
            for name, per_seed in json.loads((out / "timings.json").read_text()).items()}
    assert set(wall) == {"FedAvg", "FedAvg+GGEUR", "Centralised"}
    assert all(set(w) == {"0", "1"} and all(v > 0 for v in w.values()) for w in wall.values()), wall
    # a resume finds FedAvg finished and does not run it: its wall time stays the one recorded
    (out / "results.json").unlink()
    shutil.rmtree(out / "runs" / "fedavg-ggeur-seed1")
    runner.run(RunConfig(), out, resume=True, progress=False)
    again = json.loads((out / "timings.json").read_text())
    assert {s: t["wall_s"] for s, t in again["FedAvg"].items()} == wall["FedAvg"]
    assert again["FedAvg+GGEUR"]["1"]["wall_s"] > 0
    # the personalised path records it too
    runner.run(_cfg(blobs, methods=[MethodSpec("Local", algorithm="local")]), tmp_path / "p", progress=False)
    assert json.loads((tmp_path / "p" / "timings.json").read_text())["Local"]["0"]["wall_s"] > 0


def test_thread_default_follows_cpus_quota_and_work(tmp_path, monkeypatch):
    from fedsim import _threads

    (tmp_path / "cpu.max").write_text("150000 100000\n")  # 1.5 CPUs
    assert _threads.cgroup_cpus(tmp_path) == 1.5
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert _threads.cgroup_cpus(tmp_path) is None
    monkeypatch.setattr(_threads, "cgroup_cpus", lambda: 1.5)
    assert _threads.usable_cpus() == min(len(__import__("os").sched_getaffinity(0)), 2)
    W = _threads.WORK_PER_THREAD
    assert _threads.default_threads(_threads.step_work(64, 384, 25), cpus=16) == 1  # the embedded linear head
    assert _threads.default_threads(_threads.step_work(64, 384, 25, hidden=256), cpus=16) == 1
    assert _threads.default_threads(3 * W, cpus=16) == 3 and _threads.default_threads(3 * W, cpus=2) == 2


# ------------------------------------------------------------------------------------------------
# Folded from test_vs_control.py:
# The table's `vs control` column: each augmenter (and FedMP) against its own matched control,
# the paired difference over seeds with its range, the same in results.json (issue 31 item 2).

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
    # fedmc-fixed by its own name: the same control, and its fixed-protocol spelling is the same method
    (DEFAULT + [_m("fixed", augmenter="fedmc-fixed")], "fixed", "FedAvg+oversample"),
    ([_m("a"), _m("n", augmenter="fedmc-fixed", augmenter_params={"n_per_sample": 2})], "n", None),
    ([_m("FedAvg+F", augmenter="fedmc", augmenter_params={"protocol": "fixed"}),
      _m("FedMP+F", "fedmp", "fedmc-fixed")], "FedMP+F", "FedAvg+F"),
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
