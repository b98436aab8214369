"""Issue 21: no run folder that cannot be run again, verified resumes, divergence that stops and
says so, empty clients, value checks of exchanged geometry, the privacy spent, durable writes.
(Bad CLI/TOML values, table-driven: tests/fedsim/test_cli.py.)"""
from __future__ import annotations

import json
import math
import os
import pickle
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from fedsim import runner
from fedsim.data import Dataset, save_dataset
from fedsim.config import ConfigError
from fedsim.runner import MethodSpec, RunConfig, validate

ROOT = Path(__file__).resolve().parents[2]


def _blobs(n, C=6, D=16, seed=0, domains=False):
    g = torch.Generator().manual_seed(seed)
    mu = torch.randn(C, D, generator=g)
    y = torch.randint(0, C, (n,), generator=g)
    x = mu[y] + 0.8 * torch.randn(n, D, generator=g)
    return x / x.norm(dim=1, keepdim=True), y


@pytest.fixture(scope="module")
def blobs(tmp_path_factory):
    """6 classes of unit-norm Gaussian blobs in D=16, saved as a dataset file."""
    xt, yt = _blobs(900)
    xs, ys = _blobs(300, seed=1)
    path = tmp_path_factory.mktemp("data") / "blobs.npz"
    save_dataset(Dataset("blobs", xt, yt, xs, ys, [f"c{i}" for i in range(6)]), path)
    return path


def _cfg(path, **kw):
    base = dict(dataset=str(path), rounds=3, n_clients=3, beta=0.5, batch_size=32, min_size=5,
                methods=[MethodSpec("FedAvg")])
    base.update(kw)
    return RunConfig(**base)


def _text(out):
    return (out / "results.json").read_text()


def _ckpt(out, name="fedavg"):
    return out / "runs" / f"{name}-seed0" / "checkpoint.pt"


# ------------------------------------------------------------------------------ 2: nothing left behind
@pytest.mark.parametrize("change,match", [
    # each of these used to be found only after config.json was written (or not at all)
    (dict(model="mlp", model_params={"hidden": 0}), "hidden"),
    (dict(methods=[MethodSpec("m", augmenter="fedmc", augmenter_params={"n_components": 0})]), "n_components"),
    (dict(methods=[MethodSpec("m", augmenter="fedmc",
                              augmenter_params={"formulation": "paper", "method": "coordinates"})]), "formulation"),
    (dict(methods=[MethodSpec("a b"), MethodSpec("a-b")]), "share the run folder"),
])
def test_rejected_config_leaves_nothing_and_the_same_out_works_after(tmp_path, blobs, change, match):
    out = tmp_path / "new" / "o"
    with pytest.raises(ValueError, match=match):
        runner.run(_cfg(blobs, **change), out, progress=False)
    assert not (tmp_path / "new").exists()
    runner.run(_cfg(blobs, rounds=1), out, progress=False)  # corrected: the same --out
    assert (out / "results.json").is_file()


def test_run_failing_before_its_first_checkpoint_removes_what_it_wrote(tmp_path, blobs):
    out = tmp_path / "o"
    with pytest.raises(RuntimeError, match="diverged in round 1"):
        runner.run(_cfg(blobs, lr=1e30), out, progress=False)
    assert not out.exists()
    runner.run(_cfg(blobs, rounds=1), out, progress=False)
    assert (out / "results.json").is_file()


def test_out_naming_a_file_is_refused_before_anything_is_written(tmp_path, blobs):
    f = tmp_path / "afile"
    f.write_text("x")
    with pytest.raises(ValueError, match="--out .*existing file"):
        runner.run(_cfg(blobs), f, progress=False)
    with pytest.raises(ValueError, match="is a file"):
        runner.run(_cfg(blobs), f / "sub", progress=False)
    assert f.read_text() == "x" and sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


# ------------------------------------------------------------------------------ 3: resume verifies
def _cut(tmp_path, blobs, name="cut", **kw):
    """A run interrupted after round 2 of 3 (no results.json, checkpoint at round 2)."""
    out = tmp_path / name
    runner.run(_cfg(blobs, rounds=2, **kw), out, progress=False)
    cfg = json.loads((out / "config.json").read_text())
    cfg["rounds"] = 3
    (out / "config.json").write_text(json.dumps(cfg))
    (out / "results.json").unlink()
    return out


def _evil_pickle(path, marker):
    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    torch.save({"format": "fedsim.checkpoint", "x": Evil()}, path)


@pytest.mark.parametrize("damage,match", [
    ("truncated", "truncated"),
    ("garbage", "truncated or not a checkpoint"),
    ("pickle", "pickle payload"),
    ("plain pickle", "pickle payload"),
    ("nan weights", "NaN/Inf"),
    ("old format", "no format marker"),
    ("other version", "format version"),
    ("other config", "another configuration"),
    ("other dataset", "other data"),
])
def test_resume_refuses_a_checkpoint_it_cannot_trust(tmp_path, blobs, damage, match):
    out = _cut(tmp_path, blobs)
    ck = _ckpt(out)
    marker = tmp_path / "pwned"
    good = ck.read_bytes()
    if damage == "truncated":
        ck.write_bytes(good[: len(good) // 2])
    elif damage == "garbage":
        ck.write_bytes(bytes(range(256)) * 8)
    elif damage == "pickle":
        _evil_pickle(ck, marker)
    elif damage == "plain pickle":
        ck.write_bytes(pickle.dumps(_EvilPlain(str(marker)), protocol=2))
    elif damage in ("nan weights", "old format", "other version"):
        state = torch.load(ck, weights_only=True)
        if damage == "nan weights":
            state["global"]["weight"][0, 0] = float("nan")
        elif damage == "old format":
            del state["format"]
        else:
            state["version"] = 99
        torch.save(state, ck)
    elif damage == "other config":  # a checkpoint of the same method and seed, but another lr
        other = _cut(tmp_path, blobs, name="other", lr=0.01)
        ck.write_bytes(_ckpt(other).read_bytes())
    else:  # the dataset file changed since (a copy of it: the fixture's file stays as it is)
        data = tmp_path / "data.npz"
        data.write_bytes(blobs.read_bytes())
        out = _cut(tmp_path, data, name="cut2")
        ck = _ckpt(out)
        save_dataset(Dataset("blobs", *_blobs(900, seed=5), *_blobs(300, seed=1), [f"c{i}" for i in range(6)]),
                     data)
    with pytest.raises(ValueError) as info:
        runner.run(RunConfig(), out, resume=True, progress=False)
    msg = str(info.value)
    assert match in msg and str(ck) in msg and "delete the folder" in msg, msg
    assert "weights_only" not in msg and not marker.exists()
    assert not (out / "results.json").exists()


class _EvilPlain:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_resume_refuses_a_damaged_config_json(tmp_path, blobs):
    out = _cut(tmp_path, blobs)
    cfg = json.loads((out / "config.json").read_text())
    cfg["beta"] = "0.1"
    (out / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"config\.json.*beta \(--beta\) must be a finite number"):
        runner.run(RunConfig(), out, resume=True, progress=False)
    (out / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="config.json is not readable JSON"):
        runner.run(RunConfig(), out, resume=True, progress=False)


def test_resume_with_flags_applies_more_rounds_and_refuses_the_rest(tmp_path, blobs, capsys):
    from fedsim.cli import main

    full = tmp_path / "full"
    out = tmp_path / "o"
    base = ["run", "--dataset", str(blobs), "--clients", "3", "--beta", "0.5", "--batch-size", "32",
            "--min-size", "5", "--algorithms", "fedavg", "--augmenters", "none", "--quiet"]
    # the uninterrupted run through the same CLI, so at the same thread count (--threads 0's rule): the
    # head's float32 weight gradient differs in the last bit between 1 and 2 threads on some batch sizes
    assert main(base + ["--rounds", "4", "--out", str(full)]) == 0
    assert main(base + ["--rounds", "2", "--out", str(out)]) == 0
    capsys.readouterr()
    for extra, flag in ((["--lr", "0.01"], "--lr"), (["--rounds", "1"], "--rounds"), (["--out", str(out)], "--out"),
                        (["--augmenters", "ggeur"], "--augmenters"), (["--seed", "3"], "--seed")):
        assert main(["run", "--resume", str(out), "--quiet"] + extra) == 2
        err = capsys.readouterr().err
        assert flag in err and "Traceback" not in err, err
    assert main(["run", "--resume", str(out), "--quiet"]) == 2  # finished, and nothing asks for more
    assert "already finished" in capsys.readouterr().err
    # the run's own value again is accepted; more rounds continue the finished run exactly
    assert main(["run", "--resume", str(out), "--quiet", "--lr", "0.05", "--rounds", "4"]) == 0
    assert _text(out) == _text(full)
    assert json.loads((out / "config.json").read_text())["rounds"] == 4


def _strict_json(path):
    """The file as JSON, refusing the NaN / Infinity tokens that are not JSON (RFC 8259)."""
    def refuse(token):
        raise AssertionError(f"{path.name} holds {token}")

    return json.loads(path.read_text(), parse_constant=refuse)


def test_infinite_epsilon_total_runs_end_to_end_and_resumes(tmp_path, blobs):
    """--epsilon-total inf (allowed by --help: no noise) used to train and then fail writing
    results.json, leaving a folder --resume could not finish either. Infinities are the string
    "inf" in config.json and results.json, read back as inf by --resume."""
    from fedsim.cli import main

    out = tmp_path / "o"
    flags = ["--quiet", "--threads", "1"]
    assert main(["run", "--dataset", str(blobs), "--clients", "3", "--rounds", "1", "--min-size", "5",
                 "--algorithms", "fedavg", "--augmenters", "fedmc", "--epsilon-total", "inf",
                 "--out", str(out)] + flags) == 0
    cfg, res = _strict_json(out / "config.json"), _strict_json(out / "results.json")
    assert cfg["methods"][0]["augmenter_params"] == {"epsilon_total": "inf"}
    assert res["config"]["methods"][0]["augmenter_params"] == {"epsilon_total": "inf"}
    assert res["methods"]["FedAvg+FedMC"]["seeds"]["0"]["privacy"]["epsilon_spent"] == [None] * 3  # no noise
    # a resumed run reads "inf" back as inf: more rounds continue the finished run
    assert main(["run", "--resume", str(out), "--rounds", "2"] + flags) == 0
    res = _strict_json(out / "results.json")
    assert res["config"]["rounds"] == 2 and len(res["methods"]["FedAvg+FedMC"]["seeds"]["0"]["accuracy"]) == 2
    assert _strict_json(out / "config.json")["methods"][0]["augmenter_params"] == {"epsilon_total": "inf"}
    # the folder the failure left behind (config.json with Python's Infinity token, no results.json)
    # is finished by --resume
    old = json.loads((out / "config.json").read_text())
    old["methods"][0]["augmenter_params"]["epsilon_total"] = math.inf
    del old["engine"]
    (out / "config.json").write_text(json.dumps(old))
    (out / "results.json").unlink()
    assert main(["run", "--resume", str(out)] + flags) == 0
    assert _strict_json(out / "results.json")["config"]["methods"][0]["augmenter_params"] == {"epsilon_total": "inf"}


def test_run_json_files_write_infinity_as_inf_and_config_json_reads_it_back(tmp_path):
    from fedsim._io import json_text
    from fedsim.config import read_config_json

    text = json_text({"a": [math.inf, -math.inf, 1.5], "b": {"c": math.inf}})
    assert json.loads(text) == {"a": ["inf", "-inf", 1.5], "b": {"c": "inf"}}
    with pytest.raises(ValueError):  # NaN has no meaning in a run's files
        json_text({"a": math.nan})
    cfg = RunConfig(dataset="inf", methods=[MethodSpec("inf", augmenter="fedmc",
                                                       augmenter_params={"epsilon": math.inf})])
    path = tmp_path / "config.json"
    runner.write_config_json(cfg, tmp_path, "local")
    stored, engine = read_config_json(path)
    assert engine == "local" and RunConfig.from_dict(stored) == cfg  # names "inf" stay names
    assert stored["methods"][0]["augmenter_params"]["epsilon"] == math.inf


def test_config_json_records_the_engine(tmp_path, blobs):
    from fedsim.config import read_config_json

    out = tmp_path / "o"
    runner.run(_cfg(blobs, rounds=1), out, progress=False)
    assert json.loads((out / "config.json").read_text())["engine"] == "local"
    # a resume reads it (it is a record, not a RunConfig key) and keeps it when --rounds grows
    runner.run(RunConfig(), out, resume=True, progress=False, changes={"rounds": 2})
    stored, engine = read_config_json(out / "config.json")
    assert engine == "local" and stored["rounds"] == 2 and "engine" not in stored
    cfg = json.loads((out / "config.json").read_text())
    cfg["engine"] = "ray"
    (out / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"config\.json.*engine must be one of .*'local'.*got 'ray'"):
        runner.run(RunConfig(), out, resume=True, progress=False, changes={"rounds": 3})


# ------------------------------------------------------------------------------ 4: divergence
def test_divergence_stops_naming_round_client_and_cause(tmp_path, blobs):
    with pytest.raises(RuntimeError) as info:
        runner.run(_cfg(blobs, lr=1e30), tmp_path / "o", progress=False)
    msg = str(info.value)
    assert "diverged in round 1, client" in msg and "lr = 1e+30" in msg and "learning rate" in msg


def test_huge_embeddings_divergence_names_their_scale(tmp_path):
    xt, yt = _blobs(600)
    xs, ys = _blobs(200, seed=1)
    path = tmp_path / "huge.npz"
    save_dataset(Dataset("huge", xt * 1e15, yt, xs * 1e15, ys, [f"c{i}" for i in range(6)]), path)
    with pytest.raises(RuntimeError, match=r"diverged in round 1.*row norms up to 1e\+15"):
        runner.run(_cfg(path, model="mlp"), tmp_path / "o", progress=False)


def test_server_side_divergence_names_the_aggregation(tmp_path, blobs):
    spec = MethodSpec("opt", algorithm="fedopt", algorithm_params={"server_lr": 1e300})
    with pytest.raises(RuntimeError, match="round 1, the server's aggregation"):
        runner.run(_cfg(blobs, methods=[spec]), tmp_path / "o", progress=False)


def test_datasets_are_checked_for_scale():
    x, y = _blobs(50)
    Dataset("ok", x * 1e6, y, x, y, [f"c{i}" for i in range(6)])  # large but computable
    with pytest.raises(ValueError, match="x_train has values up to .*e\\+29.*overflow float32"):
        Dataset("big", x * 1e30, y, x, y, [f"c{i}" for i in range(6)])


def test_results_json_holds_no_nan(tmp_path):
    """A domain without test rows: its accuracy is null (it used to be NaN, which is not JSON)."""
    xt, yt = _blobs(600)
    xs, ys = _blobs(200, seed=1)
    dt = torch.arange(600) % 2
    path = tmp_path / "d.npz"
    save_dataset(Dataset("d", xt, yt, xs, ys, [f"c{i}" for i in range(6)], d_train=dt,
                         d_test=torch.zeros(200, dtype=torch.int64), domain_names=["a", "b"]), path)
    runner.run(_cfg(path, rounds=1), tmp_path / "o", progress=False)

    def refuse(token):
        raise AssertionError(f"results.json holds {token}")

    res = json.loads(_text(tmp_path / "o"), parse_constant=refuse)
    pd = res["methods"]["FedAvg"]["seeds"]["0"]["per_domain"]
    assert pd["b"] is None and 0 <= pd["a"] <= 1


# ------------------------------------------------------------------------------ 5: empty clients
def test_partition_leaving_a_client_empty_is_refused_with_the_fix():
    from fedsim.data.partition import partition

    d = torch.tensor([0] * 50 + [1] * 2)
    with pytest.raises(ValueError, match=r"client\(s\) \[5\] of 6 without samples.*--clients"):
        partition("domain", labels=torch.zeros(52, dtype=torch.int64), domains=d, n_clients=6)
    assert len(partition("domain", labels=torch.zeros(52, dtype=torch.int64), domains=d, n_clients=4)) == 4


def test_fedmc_setup_skips_an_empty_client():
    from geomkern import fedmc

    g = torch.Generator().manual_seed(0)
    X = torch.randn(300, 6, generator=g, dtype=torch.float64)
    full = [X[:150], X[150:]]
    kw = dict(n_prototypes=8, n_base=12, n_clusters=3, n_components=2, n_entries=4, epsilon=2.0, clip_norm=10.0)
    ref = fedmc.setup(full, generators=[torch.Generator().manual_seed(i) for i in (1, 2)], **kw)
    res = fedmc.setup([full[0], X[:0], full[1]], generators=[torch.Generator().manual_seed(i) for i in (1, 9, 2)],
                      **kw)
    assert res.prototypes[1] is None and res.lgds[1] is None
    assert res.epsilon == [ref.epsilon[0], 0.0, ref.epsilon[1]]
    assert torch.equal(res.basis, ref.basis) and torch.equal(res.dictionary.betas, ref.dictionary.betas)


def test_ggeur_ignores_an_empty_client():
    from geomkern import ggeur

    x, y = _blobs(200)
    x = x.double()
    s = [ggeur.local_statistics(x[:100], y[:100], 6), ggeur.local_statistics(x[100:], y[100:], 6)]
    empty = ggeur.local_statistics(x[:0], y[:0], 6)
    a, b = ggeur.aggregate(s), ggeur.aggregate([s[0], empty, s[1]])
    assert torch.equal(a.counts, b.counts) and torch.allclose(a.covariances(), b.covariances(), atol=1e-12)
    assert ggeur.prototypes([s[0], empty, s[1]], exclude=0)[0].shape[0] == int((s[1].counts > 0).sum())


# ------------------------------------------------------------------------------ 7: exchanged values
def _lgd(**kw):
    from geomkern.fedmc import LocalGeometry

    m, d, S, D = 3, 2, 4, 5
    f64 = dict(dtype=torch.float64)
    base = dict(centers=torch.randn(m, D, **f64), counts=torch.tensor([5.0, -1.0, 9.0], **f64),  # noisy counts
                eigenvalues=torch.ones(m, d, **f64), variances=torch.full((m, d), 0.1, **f64),
                betas=torch.randn(m, d, S, **f64), gamma=0.5, epsilon=1.0, delta=1e-5)
    base.update(kw)
    return LocalGeometry(**base)


@pytest.mark.parametrize("change,match", [
    (dict(variances=-torch.full((3, 2), 0.1, dtype=torch.float64)), "LocalGeometry.variances must be >= 0"),
    (dict(eigenvalues=-torch.ones(3, 2, dtype=torch.float64)), "LocalGeometry.eigenvalues must be >= 0"),
    (dict(gamma=float("nan")), "gamma must be a finite number"),
    (dict(gamma=float("inf")), "gamma must be a finite number"),
    (dict(epsilon=1.0, delta=0.0), "impossible"),
    (dict(epsilon=float("nan")), "epsilon must be > 0"),
    (dict(delta=1.5), "delta in"),
    (dict(epsilon="1"), "must be numbers"),
])
def test_fedmc_containers_reject_impossible_values(tmp_path, change, match):
    from geomkern import fedmc
    from safetensors.torch import save_file

    with pytest.raises((ValueError, TypeError), match=match):
        _lgd(**change)
    # the same values in a file: load gives a ValueError naming the file and the field
    ok = _lgd()
    tensors = {k: v for k, v in ok.to_dict().items() if isinstance(v, torch.Tensor)}
    scalars = {"gamma": 0.5, "epsilon": 1.0, "delta": 1e-5}
    for k, v in change.items():
        (tensors if isinstance(v, torch.Tensor) else scalars)[k] = v
    if isinstance(scalars["epsilon"], str):
        return
    meta = {"format": "geomkern.fedmc", "version": "1", "kind": "local_geometry",
            "scalars": json.dumps({k: (v if math.isfinite(v) else str(v)) for k, v in scalars.items()})}
    save_file(tensors, str(tmp_path / "lgd.safetensors"), metadata=meta)
    with pytest.raises(ValueError, match=match) as info:
        fedmc.LocalGeometry.load(tmp_path / "lgd.safetensors")
    assert "lgd.safetensors" in str(info.value)


def test_fedmc_dictionary_rejects_negative_variances_and_weights():
    from geomkern import fedmc

    D = fedmc.fuse([_lgd(), _lgd()], n_entries=2)
    for field, match in (("variances", "variances must be >= 0"), ("weights", "weights must be >= 0")):
        v = D.to_dict()[field].clone()
        v.view(-1)[0] = -0.5
        with pytest.raises(ValueError, match=match):
            fedmc.GeometryDictionary(**{**D.to_dict(), field: v})


def _stats():
    from geomkern import ggeur

    x, y = _blobs(300)
    return ggeur.local_statistics(x, y, 6)  # float32, as a client computes them


def test_ggeur_statistics_reject_asymmetric_and_indefinite_covariances():
    from geomkern import ggeur
    from geomkern.ggeur import VALUE_RTOL, ClassStatistics

    s = _stats()
    ClassStatistics.from_dict(s.to_dict())  # honest float32 statistics are well inside the tolerance
    covs = s.covs.clone()
    covs[2, 0, 1] += 10 * VALUE_RTOL * float(covs[2].abs().max())
    with pytest.raises(ValueError, match=r"covs\[2\] is not symmetric"):
        ClassStatistics(s.counts, s.means, covs)
    low, big = float(torch.linalg.eigvalsh(s.covs[4].double())[0]), float(s.covs[4].abs().max())
    covs = s.covs.clone()  # its smallest eigenvalue moved to -10 x the tolerance
    covs[4] -= (low + 10 * VALUE_RTOL * big) * torch.eye(16)
    with pytest.raises(ValueError, match=r"covs\[4\] is not positive semi-definite"):
        ClassStatistics(s.counts, s.means, covs)
    covs = s.covs.clone()  # to -0.1 x the tolerance: accepted
    covs[4] -= (low + 0.1 * VALUE_RTOL * big) * torch.eye(16)
    ClassStatistics(s.counts, s.means, covs)
    with pytest.raises(ValueError, match="not positive semi-definite"):
        ggeur.aggregate([ClassStatistics.from_dict({**s.to_dict(), "covs": -s.covs})])


def test_ggeur_geometry_rejects_non_orthonormal_eigenvectors(tmp_path):
    from geomkern import ggeur
    from geomkern.ggeur import VALUE_RTOL, GlobalGeometry

    g = ggeur.aggregate([_stats()])
    assert float((g.eigenvectors.mT @ g.eigenvectors - torch.eye(16)).abs().max()) < VALUE_RTOL / 10
    GlobalGeometry.from_dict(g.to_dict())
    for bad in (2 * g.eigenvectors, g.eigenvectors[:, :, [0, 0] + list(range(2, 16))]):
        with pytest.raises(ValueError, match=r"eigenvectors\[0\] are not orthonormal"):
            GlobalGeometry(g.counts, g.means, g.eigenvalues, bad.contiguous())
    bad = GlobalGeometry(g.counts, g.means, g.eigenvalues, g.eigenvectors)
    bad.eigenvectors = bad.eigenvectors * 1.01  # bypass the constructor, then send it
    bad.save(tmp_path / "g.safetensors")
    with pytest.raises(ValueError, match="g.safetensors.*not orthonormal"):
        GlobalGeometry.load(tmp_path / "g.safetensors")
    g.to(dtype=torch.float64)  # a float32 geometry cast to float64 still passes


# ------------------------------------------------------------------------------ 8: privacy spent
def test_privacy_spent_is_reported_per_method_seed_and_client(tmp_path, blobs, capsys):
    from geomkern import privacy
    from fedsim.cli import main

    toml = tmp_path / "c.toml"
    toml.write_text(f'dataset = "{blobs}"\nrounds = 1\nn_clients = 3\nmin_size = 5\nbeta = 0.5\n'
                    '[[methods]]\nname = "plain"\n'
                    '[[methods]]\nname = "gg"\naugmenter = "ggeur"\n'
                    '[[methods]]\nname = "mc"\naugmenter = "fedmc"\n'
                    '[methods.augmenter_params]\nepsilon = 1.0\nprotocol = "fixed"\n')
    assert main(["run", "--config", str(toml), "--out", str(tmp_path / "o"), "--quiet", "--threads", "1"]) == 0
    table = capsys.readouterr().out
    res = json.loads(_text(tmp_path / "o"))["methods"]
    z = privacy.noise_multiplier(1.0, 1e-5, releases=5)
    both = privacy.compose_epsilon([(z, 5), (z, 5)], 1e-5)
    assert 1.3 < both < 2.0  # two releases of epsilon 1 each
    assert res["mc"]["seeds"]["0"]["privacy"] == {"epsilon_spent": [both] * 3, "delta": 1e-5, "releases": 2}
    assert res["gg"]["seeds"]["0"]["privacy"]["epsilon_spent"] == [None] * 3  # sent without noise
    assert res["plain"]["seeds"]["0"]["privacy"]["epsilon_spent"] == [0.0] * 3
    rows = {line.split()[0]: line.split()[-1] for line in table.splitlines()
            if line.split()[:1] in (["plain"], ["gg"], ["mc"])}
    assert rows == {"plain": "-", "gg": "inf", "mc": f"{both:.3g}"} and "max eps" in table


def test_epsilon_total_splits_the_budget_over_both_releases(tmp_path, blobs, capsys):
    from geomkern import privacy
    from fedsim.cli import main

    assert main(["run", "--dataset", str(blobs), "--clients", "3", "--rounds", "1", "--min-size", "5",
                 "--algorithms", "fedavg", "--augmenters", "fedmc", "--epsilon-total", "2",
                 "--out", str(tmp_path / "o"), "--quiet", "--threads", "1"]) == 0
    spent = json.loads(_text(tmp_path / "o"))["methods"]["FedAvg+FedMC"]["seeds"]["0"]["privacy"]["epsilon_spent"]
    assert all(0.99 * 2 <= e <= 2.0 for e in spent), spent
    e = privacy.split_epsilon(2.0, 1e-5, calls=2, releases=5)
    z = privacy.noise_multiplier(e, 1e-5, releases=5)
    assert privacy.compose_epsilon([(z, 5), (z, 5)], 1e-5) <= 2.0 and e < 2.0
    assert privacy.split_epsilon(math.inf, 1e-5, calls=2, releases=5) == math.inf


# ------------------------------------------------------------------------------ 9: durable writes
def test_atomic_write_fsyncs_the_file_and_its_folder(tmp_path, monkeypatch):
    from fedsim import _io

    synced = []
    real = os.fsync

    def fsync(fd):
        synced.append(stat.S_ISDIR(os.fstat(fd).st_mode))
        return real(fd)

    monkeypatch.setattr(_io.os, "fsync", fsync)
    with _io.atomic_write(tmp_path / "f.json") as tmp:
        tmp.write_text("x")
    assert synced == [False, True]  # the file before the rename, the folder after it


def test_kill_during_a_checkpoint_write_resumes_byte_identically(tmp_path, blobs, monkeypatch):
    """In-process: the third checkpoint write dies half-way (KeyboardInterrupt after half the
    bytes): round 2's checkpoint stays intact, the half-written file is gone, the resume matches."""
    from fedsim import _checkpoint

    spec = [MethodSpec("m", augmenter="fedmc")]
    runner.run(_cfg(blobs, rounds=4, methods=spec), tmp_path / "full", progress=False)
    real, calls = torch.save, {"n": 0}

    def dying_save(obj, path):
        calls["n"] += 1
        if calls["n"] == 3:
            real(obj, path)
            data = Path(path).read_bytes()
            Path(path).write_bytes(data[: len(data) // 2])
            raise KeyboardInterrupt
        return real(obj, path)

    monkeypatch.setattr(_checkpoint.torch, "save", dying_save)
    with pytest.raises(KeyboardInterrupt):
        runner.run(_cfg(blobs, rounds=4, methods=spec), tmp_path / "cut", progress=False)
    monkeypatch.setattr(_checkpoint.torch, "save", real)
    ck = _ckpt(tmp_path / "cut", "m")
    assert torch.load(ck, weights_only=True)["round"] == 2 and not list((tmp_path / "cut").rglob("*.tmp"))
    runner.run(RunConfig(), tmp_path / "cut", resume=True, progress=False)
    assert _text(tmp_path / "cut") == _text(tmp_path / "full")


def test_process_killed_before_the_rename_leaves_a_stale_tmp_that_resume_removes(tmp_path, blobs, capsys):
    """A subprocess SIGKILLs itself between writing checkpoint.pt.tmp and renaming it (third
    checkpoint): the resume removes the stale .tmp and continues to the uninterrupted result."""
    cfg = _cfg(blobs, rounds=4)
    runner.run(cfg, tmp_path / "full", progress=False)
    (tmp_path / "cfg.json").write_text(json.dumps(cfg.to_dict()))
    threads = torch.get_num_threads()  # the same float summation order as this process
    script = textwrap.dedent(f"""
        import json, os, signal, sys
        sys.path.insert(0, {str(ROOT)!r})
        from fedsim import _io, runner
        from fedsim.runner import RunConfig
        import torch
        torch.set_num_threads({threads})
        real, n = os.replace, [0]
        def replace(src, dst):
            if str(dst).endswith("checkpoint.pt"):
                n[0] += 1
                if n[0] == 3:
                    os.kill(os.getpid(), signal.SIGKILL)
            return real(src, dst)
        _io.os.replace = replace
        cfg = RunConfig.from_dict(json.loads(open({str(tmp_path / "cfg.json")!r}).read()))
        runner.run(cfg, {str(tmp_path / "cut")!r}, progress=False)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == -9, proc.stderr
    cut = tmp_path / "cut"
    stale = _ckpt(cut).with_name("checkpoint.pt.tmp")
    assert stale.is_file() and torch.load(_ckpt(cut), weights_only=True)["round"] == 2
    capsys.readouterr()
    runner.run(RunConfig(), cut, resume=True, progress=False)
    assert f"removed {stale}, left by an interrupted write" in capsys.readouterr().err  # before any round ran
    assert not stale.exists() and _text(cut) == _text(tmp_path / "full")


# ------------------------------------------------------------------------------ model memory, epsilon splits, --out links
def test_mlp_memory_check_counts_the_parameters_and_refuses_only_what_does_not_fit(monkeypatch):
    from fedsim import models
    from fedsim.models import MLPHead, mlp_parameters

    for dim, c, h, d in ((12, 5, 8, 1), (384, 25, 64, 3), (7, 2, 1, 4)):
        assert mlp_parameters(dim, c, hidden=h, depth=d) == sum(p.numel() for p in MLPHead(dim, c, hidden=h, depth=d)
                                                               .parameters())
    cfg = RunConfig(model="mlp", model_params={"hidden": 64, "depth": 1000}, n_clients=10, batch_size=32)
    # 5 working copies + SGD momentum + 10 selected clients' updates, and two activations per layer
    need = 4 * (16 * mlp_parameters(16, 6, hidden=64, depth=1000) + 2 * 32 * 64 * 1000)
    monkeypatch.setattr(models, "available_memory", lambda device: (need, "of memory available"))
    models.check_model_memory(cfg, 16, 6)
    monkeypatch.setattr(models, "available_memory", lambda device: (need - 1, "of memory available"))
    with pytest.raises(ConfigError, match=r"--model mlp:64x1000: .* at least 16 float32 copies.*"
                                                           r"at most 999 hidden layer\(s\) fit \(mlp:64x999\)"):
        models.check_model_memory(cfg, 16, 6)
    models.check_model_memory(RunConfig(model="linear"), 10 ** 6, 10 ** 6)  # only the mlp is sized


def test_run_with_an_mlp_too_large_writes_nothing(tmp_path, blobs, monkeypatch):
    from fedsim import models

    monkeypatch.setattr(models, "available_memory", lambda device: (10 ** 6, "of memory available"))
    out = tmp_path / "o" / "run"
    with pytest.raises(ValueError, match="--model mlp:64x100"):
        runner.run(_cfg(blobs, model="mlp", model_params={"hidden": 64, "depth": 100}), out, progress=False)
    assert not (tmp_path / "o").exists()


def test_epsilon_total_too_small_to_split_is_refused_by_validate(blobs):
    for protocol in ("algorithm1", "fixed"):
        cfg = _cfg(blobs, methods=[MethodSpec("m", augmenter="fedmc",
                                              augmenter_params={"epsilon_total": 1e-9, "protocol": protocol})])
        with pytest.raises(ValueError, match=r"epsilon_total \(--epsilon-total\) 1e-09 is too small to split"):
            validate(cfg)


def test_out_through_a_dangling_symlink_is_refused_before_anything_is_written(tmp_path, blobs):
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "missing")
    with pytest.raises(ValueError, match="is a symbolic link to .*missing, which does not exist"):
        runner.run(_cfg(blobs), link / "run", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link"]


def test_a_dataset_of_one_class_is_refused_before_anything_is_written(tmp_path):
    """A run on it reported a trivial 100 %: every prediction of a one-class head is right."""
    x, _ = _blobs(200)
    y = torch.zeros(200, dtype=torch.int64)
    path = tmp_path / "one.npz"
    save_dataset(Dataset("one", x[:150], y[:150], x[150:], y[150:], ["only"]), path)
    with pytest.raises(ValueError, match=r"one\.npz \(--dataset\): every training row has the class 'only'.*at least 2 "
                                         r"classes.*trivial 100 %"):
        runner.run(_cfg(path), tmp_path / "o", progress=False)
    assert not (tmp_path / "o").exists()


def test_resume_checks_more_rounds_with_the_rounds_kind_a_new_run_uses(tmp_path):
    # --resume --rounds N was checked as any integer >= 1, so it passed the upper bound a new run refuses
    from fedsim.config import MAX_ROUNDS
    from fedsim.plugins import apply_resume_changes

    cfg = RunConfig(rounds=3, methods=[MethodSpec("FedAvg")])
    with pytest.raises(ConfigError, match=rf"rounds \(--rounds\) must be an integer in \[1, {MAX_ROUNDS}\]"):
        apply_resume_changes(cfg, {"rounds": MAX_ROUNDS + 1}, tmp_path)
    assert cfg.rounds == 3
    assert apply_resume_changes(cfg, {"rounds": MAX_ROUNDS}, tmp_path) == [f"rounds 3 -> {MAX_ROUNDS}"]
