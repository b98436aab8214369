"""Issue 44 item 2: a hostile-input harness over ``fedsim run``'s flags, its TOML config file and
``--set`` values. Every case runs the CLI in a child process (one per module, fed one case at a
time, each with a timeout; a crash of the child fails the case) on a tiny valid run with one to
three of its arguments replaced by generated values, each drawn good or bad from a table below.
A case with only good values must finish (exit 0) with results.json recording them; a case with a
bad one must exit 2 with one error line naming a bad argument (its flag, key or plug-in key), no
traceback, and no --out folder left. Derandomized hypothesis (tests/conftest.py); ``--runslow``
runs 10x the cases.

Found by this harness and fixed in fedsim/config.py: ``--lr`` beyond float32's range (1e308) was
accepted by the checks and failed in the first optimizer step with "value cannot be converted to
type float without overflow", naming no argument; counts without an upper bound (``rounds``,
``seeds`` = 2**70 or 1e11) were accepted and the run started what cannot finish. The test at the end
holds the bounds (config.MAX_LR, MAX_ROUNDS, MAX_EPOCHS, MAX_SEEDS)."""
from __future__ import annotations

import json
import os
import selectors
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from _fedsim_helpers import save_blobs
from hypothesis import given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(os.name != "posix", reason="waits on the child's pipe with selectors (POSIX)")

# the child: reads one argv (JSON) per line, runs fedsim.cli.main on it, writes one JSON line back
SERVER = textwrap.dedent("""
    import contextlib, io, json, sys, traceback
    from fedsim.cli import main
    for line in sys.stdin:
        out, err, tb = io.StringIO(), io.StringIO(), None
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = main(json.loads(line))
            except SystemExit as e:  # argparse
                rc = e.code if isinstance(e.code, int) else 1
            except BaseException:
                rc, tb = None, traceback.format_exc()
        print(json.dumps({"rc": rc, "err": err.getvalue()[-4000:], "tb": tb}), flush=True)
""")

# flag -> (RunConfig field or None, good values, bad values, words that name it)
FLAGS = {
    "--clients": ("n_clients", ["2", "3", "4"], ["0", "-1", "abc", "1.5", "1000000"], ["--clients", "clients"]),
    "--rounds": ("rounds", ["1", "2"], ["0", "-2", "x", "2.0"], ["--rounds"]),
    "--fraction": ("client_fraction", ["0.5", "1"], ["0", "nan", "1.5", "-1", "inf"], ["--fraction"]),
    "--lr": ("lr", ["0.05", "0.001", "10"], ["0", "-1", "nan", "inf", "-0.0", "x"], ["--lr"]),
    "--beta": ("beta", ["0.5", "0.001"], ["0", "-1", "nan", "inf"], ["--beta"]),
    "--batch-size": ("batch_size", ["8", "1000000000000000000"], ["0", "-4", "1.5"], ["--batch-size"]),
    "--min-size": ("min_size", ["1", "5"], ["0", "-1", "1000000000"], ["--min-size", "min_size"]),
    "--seed": ("seed", ["0", "7", str(2 ** 63 - 1)], ["-1", str(2 ** 63), "x"], ["--seed"]),
    "--epochs": ("local_epochs", ["1", "2"], ["0", "-3"], ["--epochs"]),
    "--val-fraction": ("val_fraction", ["0", "0.2", "0.5"], ["-0.1", "0.6", "nan", "1"], ["--val-fraction"]),
    "--feature-shift": ("feature_shift", ["0", "0.5"], ["nan", "-1", "1e6"], ["--feature-shift"]),
    "--feature-noise": ("feature_noise", ["0", "0.1"], ["-1", "nan", "inf"], ["--feature-noise"]),
    "--model": (None, ["linear", "mlp:8x1"], ["mlp:0x1", "mlp:axb", "nope", "mlp:999999999x999"], ["--model"]),
    "--partition": (None, ["iid", "dirichlet"], ["bogus", ""], ["--partition"]),
    "--device": (None, ["cpu"], ["tpu", "cuda:99"], ["--device"]),
    "--tune-lr": (None, ["0.01,0.1"], ["0.01,abc", "-1", "0,1", ""], ["--tune-lr"]),
    "--epsilon-total": (None, [], ["-1", "0", "nan", "1"], ["--epsilon-total"]),  # no fedmc method: never valid
    "--dataset": (None, [], ["/nonexistent.npz", "toy:nope", ""], ["dataset"]),
    "--set": (None, [], ["fedavg.mu=1", "fedprox.mu=0.01", "nope.x=1", "fedavg", "=1", "fedavg.x=\"abc\""],
              ["--set"]),
}

# TOML key -> (good values, bad values, words that name it); values are TOML text
TOML = {
    "rounds": (["1", "2"], ["0", '"x"', "1.5", "true", "-1"], ["rounds"]),
    "lr": (["0.05"], ["nan", "inf", "-1e-3", "1e400", '"0.1"'], ["lr"]),
    "beta": (["0.3"], ["inf", "0", "[]"], ["beta"]),
    "val_fraction": (["0.1"], ["0.9", "nan"], ["val_fraction"]),
    "model_params": (["{}"], ["{hidden = 0}", "{scale = -1}", "3", '{x = 1}'], ["model_params"]),
    "no_such_key": ([], ["1", '"x"'], ["no_such_key"]),
    "methods": ([], ["3", '[{name = "M", algorithm = "nope"}]', '[{name = "A"}, {name = "A"}]',
                     '[{name = "A", augmenter = "fedmc", augmenter_params = {n_components = -1}}]', "[]"],
                ["methods", "method"]),
}
BROKEN_TOML = ["rounds = = 1", "[unclosed", 'lr = "a', "rounds = 1\nrounds = 2"]


@pytest.fixture(scope="module")
def cli(tmp_path_factory):
    """(run one argv -> {rc, err, tb}, the data file, a scratch folder) over one child process."""
    d = tmp_path_factory.mktemp("hostile-cli")
    blobs = save_blobs(d / "blobs.npz", classes=4, dim=8, noise=1.0, n_train=240, n_test=80, seed=0)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    state = {}

    def start():
        state["p"] = subprocess.Popen([sys.executable, "-c", SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=subprocess.DEVNULL, text=True, env=env, cwd=d)

    def call(argv, timeout=120):
        p = state["p"]
        p.stdin.write(json.dumps(argv) + "\n")
        p.stdin.flush()
        sel = selectors.DefaultSelector()
        sel.register(p.stdout, selectors.EVENT_READ)
        if not sel.select(timeout):
            p.kill()
            p.wait()
            start()
            pytest.fail(f"fedsim run {argv} did not end in {timeout} s")
        line = p.stdout.readline()
        if not line:
            rc = p.wait()
            start()
            pytest.fail(f"fedsim run {argv} crashed the process (exit {rc})")
        return json.loads(line)

    start()
    yield call, blobs, d
    state["p"].stdin.close()
    state["p"].wait(timeout=30)


BASE = {"--clients": "3", "--rounds": "1", "--min-size": "5"}


def _check(result, out: Path, bad_names: list[list[str]], argv, given: dict | None):
    err = result["err"]
    assert result["tb"] is None and "Traceback" not in err, f"{argv}: a traceback\n{result['tb'] or err}"
    if not bad_names:
        assert result["rc"] == 0, f"{argv}: valid values refused: {err[-1500:]}"
        config = json.loads((out / "results.json").read_text())["config"]
        for field, text in (given or {}).items():
            if field in config:  # beta is not recorded where the partition draws none
                want = int(text) if isinstance(config[field], int) else float(text)
                assert config[field] == want, f"{argv}: {field} recorded {config[field]!r}, given {text!r}"
        return
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert result["rc"] == 2, f"{argv}: exit {result['rc']} with bad values ({bad_names}): {err[-1500:]}"
    assert lines and ("error:" in lines[-1]), f"{argv}: no error line: {err[-1500:]}"
    assert any(any(w in lines[-1] for w in names) for names in bad_names), \
        f"{argv}: the refusal names none of {bad_names}: {lines[-1]}"
    assert not out.exists(), f"{argv}: refused, yet {out} was left: {sorted(p.name for p in out.iterdir())}"


@st.composite
def flag_cases(draw):
    chosen = draw(st.lists(st.sampled_from(sorted(FLAGS)), min_size=1, max_size=3, unique=True))
    args, bad, given = dict(BASE), [], {}
    for flag in chosen:
        field, good, badv, names = FLAGS[flag]
        if good and draw(st.booleans()):
            args[flag] = draw(st.sampled_from(good))
            if field:
                given[field] = args[flag]
        else:
            args[flag] = draw(st.sampled_from(badv))
            bad.append(names)
    return args, bad, given


def _flags_case(cli, case):
    call, blobs, d = cli
    args, bad, given = case
    out = d / "out"
    shutil.rmtree(out, ignore_errors=True)
    argv = ["run", "--dataset", str(blobs), "--algorithms", "fedavg", "--augmenters", "none", "--threads", "1",
            "--quiet", "--out", str(out)]
    if "--dataset" in args:
        argv[1:3] = []
    for flag, v in args.items():
        argv += [f"{flag}={v}"] if v.startswith("-") or not v else [flag, v]
    _check(call(argv), out, bad, argv, given)


@st.composite
def toml_cases(draw):
    chosen = draw(st.lists(st.sampled_from(sorted(TOML)), min_size=1, max_size=3, unique=True))
    lines, bad, given = [], [], {}
    for key in chosen:
        good, badv, names = TOML[key]
        if good and draw(st.booleans()):
            lines.append(f"{key} = {draw(st.sampled_from(good))}")
            if key != "model_params":
                given[key] = lines[-1].split("=", 1)[1].strip()
        else:
            lines.append(f"{key} = {draw(st.sampled_from(badv))}")
            bad.append(names)
    if draw(st.integers(0, 9)) == 0:
        lines.append(draw(st.sampled_from(BROKEN_TOML)))
        bad.append(["not valid TOML"])
    return lines, bad, given


def _toml_case(cli, case):
    call, blobs, d = cli
    lines, bad, given = case
    out, path = d / "out", d / "hostile.toml"
    shutil.rmtree(out, ignore_errors=True)
    keys = {ln.split("=")[0].strip() for ln in lines}
    head = [f'dataset = "{blobs}"', "n_clients = 3", "min_size = 5"] + ([] if "rounds" in keys else ["rounds = 1"])
    if "methods" not in keys:
        head.append('methods = [{name = "FedAvg"}]')
    path.write_text("\n".join(head + lines) + "\n")
    argv = ["run", "--config", str(path), "--threads", "1", "--quiet", "--out", str(out)]
    # a broken file is refused naming the file; a bad key by its name
    names = [n + [str(path)] if n == ["not valid TOML"] else n for n in bad]
    _check(call(argv), out, names, argv + [path.read_text()], given)


def test_every_bad_flag_and_toml_value_alone_is_refused_by_name(cli):
    """The sweep under the generated cases: each bad value of the tables once, alone on the valid
    run (what sampling may miss in the default run's cases)."""
    for flag, (_, _, badv, names) in FLAGS.items():
        for v in badv:
            _flags_case(cli, ({**BASE, flag: v}, [names], {}))
    for key, (_, badv, names) in TOML.items():
        for v in badv:
            _toml_case(cli, ([f"{key} = {v}"], [names], {}))


FLAG_CASES, TOML_CASES = 30, 20  # per default run; ten times as many with --runslow


@given(case=flag_cases())
@settings(max_examples=FLAG_CASES)
def test_flags_end_in_a_result_or_a_named_refusal(cli, case):
    _flags_case(cli, case)


@given(case=toml_cases())
@settings(max_examples=TOML_CASES)
def test_toml_ends_in_a_result_or_a_named_refusal(cli, case):
    _toml_case(cli, case)


@pytest.mark.slow
@given(case=flag_cases())
@settings(max_examples=10 * FLAG_CASES)
def test_flags_deep(cli, case):
    _flags_case(cli, case)


@pytest.mark.slow
@given(case=toml_cases())
@settings(max_examples=10 * TOML_CASES)
def test_toml_deep(cli, case):
    _toml_case(cli, case)


@pytest.mark.parametrize("field,value", [("lr", 1e308), ("rounds", 2 ** 70), ("seeds", 10 ** 11),
                                         ("local_epochs", 10 ** 9), ("tune_lr", [0.1, 1e300])])
def test_values_beyond_what_a_run_can_do_are_refused_naming_them(tmp_path, field, value):
    from fedsim import plugins
    from fedsim.config import RunConfig

    blobs = save_blobs(tmp_path / "b.npz", classes=4, dim=8, noise=1.0, n_train=240, n_test=80, seed=0)
    cfg = RunConfig(dataset=str(blobs), n_clients=3, rounds=1, min_size=5)
    setattr(cfg, field, value)
    with pytest.raises(ValueError, match=field):
        plugins.validate(cfg)


def _reliability_row(surface: str) -> str:
    """The row of docs/reliability.md's harness table for ``surface``: its counts are this file's."""
    rows = [ln for ln in (ROOT / "docs" / "reliability.md").read_text().splitlines() if ln.startswith(f"| {surface} |")]
    assert len(rows) == 1, f"docs/reliability.md has {len(rows)} rows for {surface!r}"
    return rows[0]


def test_the_reliability_page_states_these_cases():
    swept = sum(len(v[2]) for v in FLAGS.values()) + sum(len(v[1]) for v in TOML.values())
    assert f"| {FLAG_CASES + TOML_CASES} generated + {swept} swept |" in _reliability_row(
        "`fedsim run` flags, TOML, `--set`")
