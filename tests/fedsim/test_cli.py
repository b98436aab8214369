"""Issue 21 item 1: every bad value of `fedsim run` (flag or config-file key) is refused with exit
code 2, one `fedsim: error:` line naming the flag or key, no traceback, and no run folder."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fedsim.cli import main
from fedsim.plugins import validate

ROOT = Path(__file__).resolve().parents[2]

# (extra flags of `fedsim run`, what the message must name)
CLI = [
    (["--beta", "inf"], "--beta"), (["--beta", "nan"], "--beta"), (["--beta", "-1"], "--beta"),
    (["--lr", "inf"], "--lr"), (["--lr", "nan"], "--lr"), (["--lr", "0"], "--lr"),
    (["--fraction", "0"], "--fraction"), (["--fraction", "1.5"], "--fraction"), (["--fraction", "nan"], "--fraction"),
    (["--clients", "0"], "--clients"), (["--clients", "-3"], "--clients"),
    (["--rounds", "0"], "--rounds"), (["--rounds", "2.5"], "--rounds"), (["--rounds", "abc"], "--rounds"),
    (["--epochs", "0"], "--epochs"), (["--batch-size", "0"], "--batch-size"), (["--min-size", "0"], "--min-size"),
    (["--seed", "-1"], "--seed"), (["--seed", "1.5"], "--seed"), (["--seeds", "0"], "--seeds"),
    (["--seed", str(2 ** 63)], "--seed"),
    (["--device", "gpu"], "--device"), (["--device", "cuda:x"], "--device"), (["--device", ""], "--device"),
    (["--device", "cuda:99"], "--device"),
    (["--model", "resnet"], "--model"), (["--partition", "zipf"], "--partition"),
    (["--threads", "-1"], "--threads"), (["--threads", "100000"], "--threads"),
    (["--feature-shift", "inf"], "--feature-shift"), (["--feature-shift", "-1"], "--feature-shift"),
    (["--feature-noise", "nan"], "--feature-noise"),
    # NaN rotations far beyond the range, reported as a divergence blamed on the learning rate
    (["--feature-shift", "1e308"], "--feature-shift"),
    # the DP accountant ran out of memory and the run was killed, leaving its folder
    (["--epsilon-total", "1e308", "--augmenters", "fedmc"], "--epsilon-total"),
    (["--epsilon-total", "101", "--augmenters", "fedmc"], "inf = no noise"),
    (["--set", "fedmc.epsilon=1e6", "--augmenters", "fedmc"], "fedmc.epsilon"),
    (["--algorithms", "fedsgd"], "fedsgd"), (["--augmenters", "mixup"], "mixup"),
    (["--epsilon-total", "0", "--augmenters", "fedmc"], "--epsilon-total"),
    (["--epsilon-total", "nan", "--augmenters", "fedmc"], "--epsilon-total"),
    (["--epsilon-total", "1", "--augmenters", "ggeur"], "--epsilon-total"),
    (["--dataset", "nope.npz"], "nope.npz"), (["--config", "missing.toml"], "missing.toml"),
    (["--resume", "nowhere"], "--resume"),
    (["--set", "fedmc.nbase=3"], "nbase"), (["--set", "mixup.x=1"], "mixup"), (["--set", "fedmc.n_base=0"], "n_base"),
    (["--set", "fedprox.mu=0.1"], "fedprox"), (["--set", "fedmc"], "--set"), (["--preset", "nope"], "nope"),
]

_FEDMC = '[[methods]]\nname = "m"\naugmenter = "fedmc"\n[methods.augmenter_params]\n'
_GGEUR = '[[methods]]\nname = "m"\naugmenter = "ggeur"\n[methods.augmenter_params]\n'


def _algo(name):
    return f'[[methods]]\nname = "m"\nalgorithm = "{name}"\n[methods.algorithm_params]\n'


# (config file text, what the message must name)
TOML = [
    ("device = 5", "device"), ('device = "tpu"', "device"), ('beta = "0.1"', "beta"), ('zero_shot = "no"', "zero_shot"),
    ("seed = 1.5", "seed"), ("seed = -3", "seed"), ("rounds = 2.0", "rounds"), ("n_clients = true", "n_clients"),
    ("lr = inf", "lr"), ("lr = nan", "lr"), ("momentum = 1.5", "momentum"), ("weight_decay = -1", "weight_decay"),
    ("client_fraction = 0", "client_fraction"), ("dataset = 5", "dataset"), ("methods = 3", "methods"),
    ("methods = []", "methods"), ("learning_rate = 3", "learning_rate"), ("rounds = [", "not valid TOML"),
    ('model = "mlp"\n[model_params]\nhidden = 0', "model_params.hidden"),
    ('model = "mlp"\n[model_params]\nhidden = 1.5', "model_params.hidden"),
    ("[model_params]\nbogus = 1", "bogus"), ("model_params = 3", "model_params"),
    ("[model_params]\nscale = inf", "model_params.scale"),
    (_FEDMC + "n_components = 0", "n_components"), (_FEDMC + 'n_components = "all"', "n_components"),
    (_FEDMC + "epsilon = -1.0", "epsilon"), (_FEDMC + "epsilon = nan", "epsilon"), (_FEDMC + "delta = 2.0", "delta"),
    (_FEDMC + 'gamma = "wide"', "gamma"), (_FEDMC + "gamma = 0", "gamma"), (_FEDMC + "clip_norm = inf", "clip_norm"),
    (_FEDMC + "n_base = 0", "n_base"), (_FEDMC + "steps = 0", "steps"), (_FEDMC + 'anchored = "yes"', "anchored"),
    (_FEDMC + 'formulation = "paper"\nmethod = "coordinates"', "formulation"), (_FEDMC + "n_comp = 3", "n_comp"),
    (_FEDMC + "epsilon = 1.0\nepsilon_total = 2.0", "epsilon_total"), (_FEDMC + "epsilon_total = 0", "epsilon_total"),
    (_GGEUR + 'noise = "x"', "noise"), (_GGEUR + "target_per_class = -1", "target_per_class"),
    (_GGEUR + 'prototypes = "some"', "prototypes"),
    (_algo("fedprox") + 'mu = "a"', "mu"), (_algo("fedopt") + "server_lr = inf", "server_lr"),
    (_algo("fedopt") + "beta1 = 1.0", "beta1"), (_algo("feddyn") + "alpha = 0", "alpha"),
    (_algo("moon") + "tau = 0", "tau"), (_algo("scaffold") + "global_lr = nan", "global_lr"),
    (_algo("scaffold") + 'correction = "clip"', "correction"),
    ('[[methods]]\nname = ""', "name"), ("[[methods]]\nname = 5", "name"),
    ('[[methods]]\nname = "m"\nalgorithm = 5', "algorithm"), ('[[methods]]\nname = "m"\naugmenter = "x"', "augmenter"),
    ('[[methods]]\nname = "m"\nalgorithm_params = 3', "algorithm_params"),
    ('[[methods]]\nname = "m"\nbogus = 1', "methods[0]"),
    ('[[methods]]\nname = "a"\n[[methods]]\nname = "a"', "duplicate"),
    ('[[methods]]\nname = "a b"\n[[methods]]\nname = "a-b"', "run folder"),
    ("[params.fedmc]\nnbase = 3", "nbase"), ("[params.mixup]\nx = 1", "mixup"), ("params = 3", "params"),
    ("[params.fedmc]\nn_base = 0", "n_base"), ('[params.ggeur]\nresample = "twice"', "resample"),
    ("[params.ggeur]\nmulti_domain_target = -1", "multi_domain_target"),
]


def _check(rc, err, name, out: Path):
    assert rc == 2, err
    assert "Traceback" not in err, err
    assert name in err, err
    lines = err.strip().splitlines()
    assert lines[-1].startswith(("fedsim: error:", "fedsim run: error:")), err
    if lines[-1].startswith("fedsim: error:"):  # argparse's own errors come after a usage line
        assert len(lines) == 1, err
    assert not out.exists(), "a rejected configuration left a run folder"


def _run(argv, capsys):
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse: usage + "fedsim run: error: argument --x: ..."
        rc = exc.code
    return rc, capsys.readouterr().err


@pytest.mark.parametrize("extra,name", CLI, ids=[" ".join(a) for a, _ in CLI])
def test_bad_flag_values(tmp_path, capsys, monkeypatch, extra, name):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "o"
    rc, err = _run(["run", "--quiet", "--out", str(out)] + extra
                   if "--resume" not in extra else ["run", "--quiet"] + extra, capsys)
    _check(rc, err, name, out)


@pytest.mark.parametrize("text,name", TOML, ids=[t.replace("\n", " ")[-40:] for t, _ in TOML])
def test_bad_config_file_values(tmp_path, capsys, text, name):
    cfg = tmp_path / "c.toml"
    cfg.write_text(text + "\n")
    out = tmp_path / "o"
    rc, err = _run(["run", "--quiet", "--config", str(cfg), "--out", str(out)], capsys)
    _check(rc, err, name, out)


def test_out_naming_an_existing_file(tmp_path, capsys):
    f = tmp_path / "f"
    f.write_text("keep")
    rc, err = _run(["run", "--quiet", "--out", str(f)], capsys)
    _check(rc, err, "--out", tmp_path / "nothing")
    assert f.read_text() == "keep"


def test_other_subcommands_flags(tmp_path, capsys):
    for argv, name in ((["demo", "--n", "0"], "--n"), (["demo", "--steps", "0"], "--steps"),
                       (["demo", "--seed", "-2"], "--seed"), (["demo", "--threads", "-1"], "--threads"),
                       (["import", "--train-x", "a.npy", "--train-y", "b.npy", "--out", str(tmp_path / "d.npz"),
                         "--test-fraction", "1.5"], "--test-fraction")):
        rc, err = _run(argv, capsys)
        _check(rc, err, name, tmp_path / "nothing")


@pytest.mark.parametrize("argv,text,name", [
    (["--beta", "inf"], None, "--beta"),
    ([], "device = 5", "device"),
    ([], '[[methods]]\nname = "m"\naugmenter = "fedmc"\n[methods.augmenter_params]\nn_components = 0',
     "n_components"),
])
def test_the_installed_command_prints_no_traceback(tmp_path, argv, text, name):
    """The real entry point, in a fresh process: exit code 2 and one line on stderr."""
    if text is not None:
        (tmp_path / "c.toml").write_text(text + "\n")
        argv = argv + ["--config", str(tmp_path / "c.toml")]
    proc = subprocess.run([sys.executable, "-m", "fedsim.cli", "run", "--quiet", "--out", str(tmp_path / "o")] + argv,
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and name in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "o").exists()


# ------------------------------------------------------------------------------ presets, --set, help texts
def _config_of(argv):
    from fedsim.config import FLAGS
    from fedsim.cli import build_parser, run_config

    args = build_parser().parse_args(["run"] + argv)
    given = {a: getattr(args, f[2:].replace("-", "_")) for a, f in FLAGS.items()
             if getattr(args, f[2:].replace("-", "_")) is not None}
    return run_config(args, given)


def _params_of(cfg, augmenter):
    return [m.augmenter_params for m in cfg.methods if m.augmenter == augmenter]


def test_presets_list_print_and_load(capsys):
    from fedsim import presets
    from fedsim.runner import RunConfig

    assert main(["presets"]) == 0
    listing = capsys.readouterr().out
    for name in ("fedmc-paper", "ggeur-paper", "flic-paper"):
        assert name in presets.names() and f"{name} " in listing and presets.describe(name) in listing
        assert main(["presets", name]) == 0
        assert capsys.readouterr().out == presets.text(name)
        cfg = validate(_config_of(["--preset", name]))  # every value of a shipped preset is valid
        assert cfg != validate(RunConfig())
    rc, err = _run(["presets", "nope"], capsys)
    assert rc == 2 and "fedmc-paper" in err and "ggeur-paper" in err
    g = _config_of(["--preset", "ggeur-paper"])
    assert (g.rounds, g.local_epochs, g.batch_size) == (100, 10, 64)
    assert _params_of(g, "ggeur")[0] == {"target_per_class": 2000, "multi_domain_target": 500, "n_per_prototype": 500,
                                         "resample": "once", "noise": "sqrt"}
    assert _params_of(g, "oversample")[0] == {"target_per_class": 2000}  # the matched control, same budget
    f = _params_of(_config_of(["--preset", "fedmc-paper"]), "fedmc")[0]
    assert {k: f[k] for k in ("n_base", "n_clusters", "gamma", "formulation", "method")} == \
        {"n_base": 512, "n_clusters": 3, "gamma": "1/D", "formulation": "paper", "method": "gd"}


@pytest.mark.early
def test_flic_paper_preset_values_and_a_tiny_run(tmp_path):
    """The paper's setting reaches both methods (Adam for each), and the preset runs (2 rounds, 1 epoch)."""
    import json

    c = validate(_config_of(["--preset", "flic-paper"]))
    assert (c.rounds, c.client_fraction, c.local_epochs, c.lr, c.n_clients) == (50, 0.1, 10, 0.001, 20)
    params = {m.algorithm: m.algorithm_params for m in c.methods}
    assert set(params) == {"local", "flic"} and params["local"] == {"optimizer": "adam", "final_epochs": 10}
    # where the paper's text is silent, the authors' code: its schedule and its last round (issue 43)
    assert {k: params["flic"][k] for k in ("optimizer", "anchor_cov", "anchor_var", "schedule", "rep_epochs",
                                           "rep_start_round", "final_epochs")} == \
        {"optimizer": "adam", "anchor_cov": "fixed", "anchor_var": 1.0, "schedule": "personal-first", "rep_epochs": 1,
         "rep_start_round": 21, "final_epochs": 10}
    assert "n_classes=20&classes_per_client=3" in c.dataset and c.dataset.endswith("&subsample=1")
    out = tmp_path / "run"
    assert main(["run", "--preset", "flic-paper", "--rounds", "2", "--epochs", "1", "--out", str(out),
                 "--quiet"]) == 0
    res = json.loads((out / "results.json").read_text())
    assert set(res["methods"]) == {"Local", "FLIC"}
    # 2 rounds + the final round in which every client trains
    assert all(len(m["seeds"]["0"]["accuracy"]) == 3 for m in res["methods"].values())


def test_flags_override_config_file_over_preset(tmp_path):
    """Precedence: RunConfig defaults < --preset < --config < flags (--rounds, --set)."""
    cfg_file = tmp_path / "c.toml"
    cfg_file.write_text("rounds = 7\nlr = 0.2\n[params.ggeur]\nn_per_prototype = 9\n")
    c = _config_of(["--preset", "ggeur-paper", "--config", str(cfg_file)])
    assert (c.rounds, c.lr, c.batch_size) == (7, 0.2, 64)  # file over preset; preset over defaults
    assert _params_of(c, "ggeur")[0]["n_per_prototype"] == 9 and _params_of(c, "ggeur")[0]["target_per_class"] == 2000
    c = _config_of(["--preset", "ggeur-paper", "--config", str(cfg_file), "--rounds", "3", "--batch-size", "8",
                    "--set", "ggeur.target_per_class=300", "--set", "ggeur.n_per_prototype=1"])
    assert (c.rounds, c.batch_size) == (3, 8)
    assert _params_of(c, "ggeur")[0]["target_per_class"] == 300 and _params_of(c, "ggeur")[0]["n_per_prototype"] == 1
    # --algorithms/--augmenters rebuild the methods; the preset's plug-in tables still reach them
    c = _config_of(["--preset", "fedmc-paper", "--algorithms", "fedavg,fedprox", "--augmenters", "none,fedmc"])
    assert [p["n_base"] for p in _params_of(c, "fedmc")] == [512, 512]


def test_set_applies_to_every_method_using_the_plugin():
    c = _config_of(["--algorithms", "fedavg,fedprox", "--augmenters", "none,fedmc", "--set", "fedmc.n_base=64",
                    "--set", "fedprox.mu=0.5", "--set", "fedmc.gamma=1/D", "--set", "fedmc.epsilon=inf",
                    "--set", 'fedmc.method="gd"'])
    for m in c.methods:
        assert m.algorithm_params == ({"mu": 0.5} if m.algorithm == "fedprox" else {})
        want = {"n_base": 64, "gamma": "1/D", "epsilon": float("inf"), "method": "gd"}
        assert m.augmenter_params == (want if m.augmenter == "fedmc" else {})
    validate(c)
    with pytest.raises(ValueError, match="nbase.*it takes .*n_base"):  # names the key, lists the known ones
        _config_of(["--set", "fedmc.nbase=3"])
    with pytest.raises(ValueError, match="neither an algorithm nor an augmenter.*fedprox.*ggeur"):
        _config_of(["--set", "mixup.alpha=1"])


def test_preset_and_set_are_refused_with_resume(tmp_path, capsys):
    for extra, name in ((["--preset", "ggeur-paper"], "--preset"), (["--set", "fedmc.n_base=8"], "--set")):
        rc, err = _run(["run", "--quiet", "--resume", str(tmp_path)] + extra, capsys)
        assert rc == 2 and name in err and "--resume" in err


def test_help_defaults_agree_with_runconfig():
    """Every `(default X)` in `fedsim run --help` equals RunConfig's field, and every config flag
    states its default; --algorithms names the methods a bare run runs."""
    import re

    from fedsim.config import FLAGS
    from fedsim.cli import build_parser
    from fedsim.runner import RunConfig, default_methods

    run_parser = next(a for a in build_parser()._actions if a.dest == "command").choices["run"]
    helps = {opt: a.help for a in run_parser._actions for opt in a.option_strings}
    cfg = RunConfig()
    for attr, flag in FLAGS.items():
        value = getattr(cfg, attr)
        m = re.search(r"\(default ([^,;:)]+)", helps[flag])
        if isinstance(value, bool):
            continue  # an on/off flag (--zero-shot): off unless given
        if value is None:  # the model's default (models.RUN_DEFAULTS): the help states each model's
            from fedsim.models import RUN_DEFAULTS

            assert "(default per model" in helps[flag], flag
            for model, d in RUN_DEFAULTS.items():
                assert f"{model} {d[attr]:g}" in helps[flag], f"{flag}: help lacks {model}'s default {d[attr]}"
            continue
        assert m, f"{flag}: its help does not state its default ({value!r})"
        stated = m.group(1).strip()
        if isinstance(value, list):  # a grid (--tune-lr): "none" for the empty list
            assert stated == (",".join(f"{v:g}" for v in value) or "none"), f"{flag}: help says {stated}, {value}"
        elif isinstance(value, (int, float)):
            assert float(stated) == value, f"{flag}: help says default {stated}, RunConfig.{attr} = {value}"
        else:
            assert stated == value, f"{flag}: help says default {stated}, RunConfig.{attr} = {value!r}"
    for spec in default_methods():
        assert spec.name in helps["--algorithms"], f"--algorithms help does not name {spec.name}"


# ------------------------------------------------------------------------------ model sizes, dataset folders, --out links
@pytest.mark.parametrize("spec,text", [
    ("mlp:0x2", "WIDTH 0"), ("mlp:2x0", "DEPTH 0"), ("mlp:0", "WIDTH 0"),
    ("mlp:\u00b2", "mlp:WIDTHxDEPTH"),  # "²".isdigit() is True, int("²") is not
])
def test_mlp_sizes_that_make_no_layer_are_refused_by_name(tmp_path, capsys, spec, text):
    rc, err = _run(["run", "--quiet", "--out", str(tmp_path / "o"), "--model", spec], capsys)
    _check(rc, err, "--model", tmp_path / "o")
    assert text in err, err


def test_mlp_too_large_for_the_memory_is_refused_before_the_run_folder(tmp_path, capsys, monkeypatch):
    """--model mlp:64x100000 allocated past 4.5 GB and left a run folder behind; with 4.5 GB free it
    is refused naming the flag, the bytes it needs, what fits and what to change."""
    from fedsim import models

    monkeypatch.setattr(models, "available_memory", lambda device: (4_500_000_000, "of memory available"))
    out = tmp_path / "o"
    rc, err = _run(["run", "--quiet", "--out", str(out), "--model", "mlp:64x100000"], capsys)
    _check(rc, err, "--model mlp:64x100000", out)
    assert "GB, more than the 4.5 GB of memory available" in err and "(mlp:64x" in err and "--fraction" in err, err


def test_an_absurd_mlp_is_refused_on_any_machine(tmp_path, capsys):
    rc, err = _run(["run", "--quiet", "--out", str(tmp_path / "o"), "--model", "mlp:100000x100000"], capsys)
    _check(rc, err, "--model mlp:100000x100000", tmp_path / "o")
    assert "1,000,000,040,900,025 parameters" in err, err  # 384 inputs and 25 classes of the embedded data


def test_a_folder_as_dataset_names_the_files_in_it(tmp_path, capsys):
    folder = tmp_path / "embeddings"
    folder.mkdir()
    rc, err = _run(["run", "--quiet", "--out", str(tmp_path / "o"), "--dataset", str(folder)], capsys)
    _check(rc, err, "is a folder, not a dataset file", tmp_path / "o")
    assert "does not exist" not in err and "fedsim embed" in err, err
    (folder / "mine.npz").write_bytes(b"")
    rc, err = _run(["run", "--quiet", "--out", str(tmp_path / "o"), "--dataset", str(folder)], capsys)
    _check(rc, err, str(folder / "mine.npz"), tmp_path / "o")


def test_out_a_dangling_symlink_is_refused_naming_the_link(tmp_path, capsys):
    link = tmp_path / "out"
    link.symlink_to(tmp_path / "gone" / "deeper")
    for out in (link, link / "sub"):
        rc, err = _run(["run", "--quiet", "--out", str(out)], capsys)
        assert rc == 2 and "Traceback" not in err and "File exists" not in err, err
        assert f"{link} is a symbolic link to {tmp_path / 'gone' / 'deeper'}, which does not exist" in err, err
    assert link.is_symlink() and not (tmp_path / "gone").exists()


def test_epsilon_total_too_small_to_split_names_its_value_and_a_budget_that_works(tmp_path, capsys):
    out = tmp_path / "o"
    rc, err = _run(["run", "--quiet", "--out", str(out), "--augmenters", "fedmc", "--rounds", "1",
                    "--epsilon-total", "1e-9"], capsys)
    _check(rc, err, "--epsilon-total", out)
    assert "1e-09 is too small" in err and "0.001 splits here" in err and "got 0.0" not in err, err


@pytest.mark.parametrize("overwrite", [[], ["--overwrite"]])
def test_import_out_naming_a_folder_is_refused_before_reading(tmp_path, capsys, overwrite):
    folder = tmp_path / "data.npz"
    folder.mkdir()
    # the inputs do not exist: the --out error comes first, before anything is read
    rc, err = _run(["import", "--train-x", str(tmp_path / "x.npy"), "--train-y", str(tmp_path / "y.npy"),
                    "--out", str(folder)] + overwrite, capsys)
    _check(rc, err, f"--out {folder} is a folder", tmp_path / "nothing")
    assert "Is a directory" not in err and folder.is_dir() and not list(folder.iterdir()), err


def test_import_out_a_dangling_symlink_is_not_replaced(tmp_path, capsys):
    import numpy as np

    np.save(tmp_path / "x.npy", np.random.default_rng(0).normal(size=(20, 4)))
    np.save(tmp_path / "y.npy", np.arange(20) % 2)
    link = tmp_path / "d.npz"
    link.symlink_to(tmp_path / "gone" / "d.npz")
    for extra in ([], ["--overwrite"]):
        rc, err = _run(["import", "--train-x", str(tmp_path / "x.npy"), "--train-y", str(tmp_path / "y.npy"),
                        "--out", str(link)] + extra, capsys)
        _check(rc, err, "is a symbolic link to", tmp_path / "nothing")
    assert link.is_symlink()


def test_an_empty_name_list_is_refused_not_read_as_the_defaults(tmp_path, capsys):
    # issue 44's harness: --algorithms "" ran the default methods without a word
    for flag in ("--algorithms", "--augmenters"):
        assert main(["run", flag, " , ", "--out", str(tmp_path / "o")]) == 2
        assert f"{flag} ' , ': give at least one name" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_a_params_table_is_checked_even_where_no_method_uses_it(tmp_path, capsys):
    # issue 44's harness: [params.fedprox] mu = -1 passed when no method ran FedProx (--set refused it)
    cfg = tmp_path / "c.toml"
    cfg.write_text("rounds = 1\n[params.fedprox]\nmu = -1\n")
    assert main(["run", "--config", str(cfg), "--out", str(tmp_path / "o")]) == 2
    assert "[params.fedprox].mu must be a finite number >= 0, got -1" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
