"""`fedsim import`: plain arrays in every supported format -> a fedsim dataset file, and the errors
for every kind of bad input (each names the file and the field)."""
from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from fedsim.cli import main
from fedsim.data import load_dataset, save_dataset
from fedsim.data.importer import format_summary, import_embeddings
from fedsim.embed.datasets import stratified_split

HAS_PARQUET = any(importlib.util.find_spec(m) is not None for m in ("pyarrow", "pandas"))


def _data(rng, n=40, dim=6, n_classes=3):
    x = rng.normal(size=(n, dim)) * rng.uniform(0.5, 4.0, size=(n, 1))
    y = np.arange(n) % n_classes  # every class present
    rng.shuffle(y)
    return x, y


# --- writers: (features, labels) -> (x spec, y spec) in one format ----------------------------

def _csv_cells(row) -> list[str]:
    return [repr(float(v)) for v in row]


def _write(fmt: str, path: Path, x: np.ndarray, y: np.ndarray) -> tuple[str, str]:
    p = str(path)
    if fmt == "npy":
        np.save(p + "_x.npy", x)
        np.save(p + "_y.npy", y)
        return p + "_x.npy", p + "_y.npy"
    if fmt == "npz":
        np.savez(p + "_x.npz", feats=x)
        np.savez(p + "_y.npz", labels=y)
        return p + "_x.npz", p + "_y.npz"
    if fmt == "npz_key":  # features and labels in one archive, picked by key
        np.savez(p + ".npz", emb=x, lab=y)
        return p + ".npz:emb", p + ".npz:lab"
    if fmt == "pt":
        torch.save(torch.from_numpy(x), p + "_x.pt")
        torch.save(torch.from_numpy(y), p + "_y.pth")
        return p + "_x.pt", p + "_y.pth"
    if fmt == "pt_dict":
        torch.save({"embeddings": torch.from_numpy(x)}, p + "_x.pt")
        torch.save({"labels": torch.from_numpy(y), "x": torch.from_numpy(x)}, p + "_y.pt")
        return p + "_x.pt", p + "_y.pt:labels"
    if fmt == "safetensors":
        from safetensors.numpy import save_file

        save_file({"x": np.ascontiguousarray(x), "y": np.ascontiguousarray(y)}, p + ".safetensors")
        return p + ".safetensors:x", p + ".safetensors:y"
    if fmt == "csv_columns":  # no header; one column per dimension
        Path(p + "_x.csv").write_text("".join(",".join(_csv_cells(r)) + "\n" for r in x))
        Path(p + "_y.csv").write_text("".join(f"{int(v)}\n" for v in y))
        return p + "_x.csv", p + "_y.csv"
    if fmt == "csv_table":  # one file with a header: label column + feature columns
        head = "label," + ",".join(f"f{j}" for j in range(x.shape[1]))
        rows = [f"{int(v)}," + ",".join(_csv_cells(r)) for r, v in zip(x, y)]
        Path(p + ".csv").write_text(head + "\n" + "\n".join(rows) + "\n")
        return p + ".csv", p + ".csv:label"
    if fmt == "csv_list":  # a single list-valued column
        rows = ['"[' + ", ".join(_csv_cells(r)) + ']",' + str(int(v)) for r, v in zip(x, y)]
        Path(p + ".csv").write_text("embedding,label\n" + "\n".join(rows) + "\n")
        return p + ".csv:embedding", p + ".csv:label"
    if fmt == "parquet":
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq

            pq.write_table(pa.table({"emb": [list(r) for r in x], "label": y.tolist()}), p + ".parquet")
        except ImportError:
            import pandas as pd

            pd.DataFrame({"emb": [list(r) for r in x], "label": y}).to_parquet(p + ".parquet")
        return p + ".parquet:emb", p + ".parquet:label"
    raise AssertionError(fmt)


FORMATS = ["npy", "npz", "npz_key", "pt", "pt_dict", "safetensors", "csv_columns", "csv_table", "csv_list",
           pytest.param("parquet", marks=pytest.mark.skipif(not HAS_PARQUET, reason="neither pyarrow nor pandas"))]


@pytest.mark.parametrize("fmt", FORMATS)
def test_round_trip_every_format(tmp_path, rng, fmt):
    x, y = _data(rng)
    xt, yt = _data(rng, n=15)
    trx, try_ = _write(fmt, tmp_path / "train", x, y)
    tex, tey = _write(fmt, tmp_path / "test", xt, yt)
    ds = import_embeddings(trx, try_, test_x=tex, test_y=tey, normalize=False, name="rt")
    out = save_dataset(ds, tmp_path / "rt.npz")
    back = load_dataset(out)
    for got, want in ((back.x_train, x), (back.x_test, xt)):
        assert got.dtype == torch.float32
        assert torch.equal(got, torch.from_numpy(want.astype(np.float32)))
    assert torch.equal(back.y_train, torch.from_numpy(y)) and torch.equal(back.y_test, torch.from_numpy(yt))
    assert back.class_names == ["class_0", "class_1", "class_2"]
    assert back.meta["normalised"] is False and back.meta["split"].startswith("the files' own split")


def test_string_labels_map_to_sorted_ids_or_to_the_class_names_file(tmp_path, rng):
    x, _ = _data(rng, n=9)
    words = np.array(["zebra", "ant", "moth"] * 3)
    path = tmp_path / "t.csv"
    path.write_text("species," + ",".join(f"f{j}" for j in range(6)) + "\n"
                    + "\n".join(f"{w}," + ",".join(_csv_cells(r)) for w, r in zip(words, x)) + "\n")
    ds = import_embeddings(str(path), f"{path}:species", test_fraction=0.34, seed=1)
    assert ds.class_names == ["ant", "moth", "zebra"]
    names = tmp_path / "names.txt"
    names.write_text("moth\nzebra\nant\n")
    ds2 = import_embeddings(str(path), f"{path}:species", test_fraction=0.34, seed=1, class_names=str(names),
                            normalize=False)
    assert ds2.class_names == ["moth", "zebra", "ant"]
    assert ds2.x_train.shape == (6, 6)  # the label column is not a feature
    got = [ds2.class_names[int(i)] for i in torch.cat([ds2.y_train, ds2.y_test])]
    rows = {tuple(np.float32(r)): w for r, w in zip(x, words)}
    have = [rows[tuple(r)] for r in torch.cat([ds2.x_train, ds2.x_test]).numpy()]
    assert got == have


# --- the seeded stratified split -----------------------------------------------------------------

def test_split_is_fedsim_embeds_stratified_split(tmp_path, rng, seed):
    n, frac = 103, 0.25
    x, y = _data(rng, n=n, n_classes=4)
    x[:, 0] = np.arange(n)  # row ids survive normalize=False exactly in float32
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    args = (str(tmp_path / "x.npy"), str(tmp_path / "y.npy"))
    ds = import_embeddings(*args, test_fraction=frac, seed=seed, normalize=False)
    again = import_embeddings(*args, test_fraction=frac, seed=seed, normalize=False)
    other = import_embeddings(*args, test_fraction=frac, seed=seed + 1, normalize=False)
    assert torch.equal(ds.x_test, again.x_test) and torch.equal(ds.y_train, again.y_train)
    assert not torch.equal(ds.x_test, other.x_test)
    train_ids = ds.x_train[:, 0].long().numpy()
    test_ids = ds.x_test[:, 0].long().numpy()
    assert sorted(np.concatenate([train_ids, test_ids]).tolist()) == list(range(n))
    for c, name in enumerate(ds.class_names):
        rows = np.flatnonzero(y == c)
        tr, te = stratified_split(len(rows), frac, seed, name)
        assert sorted(test_ids[ds.y_test.numpy() == c]) == sorted(rows[te].tolist())
        assert sorted(train_ids[ds.y_train.numpy() == c]) == sorted(rows[tr].tolist())
        assert len(te) == int(np.floor(frac * len(rows) + 0.5))
    assert np.array_equal(y[test_ids], ds.y_test.numpy())


def test_domains_stratify_and_are_stored(tmp_path, rng, seed):
    n = 80
    x, y = _data(rng, n=n, n_classes=2)
    x[:, 0] = np.arange(n)
    dom = np.where(np.arange(n) % 4 == 0, "sketch", "photo")
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    np.save(tmp_path / "d.npy", dom)
    ds = import_embeddings(str(tmp_path / "x.npy"), str(tmp_path / "y.npy"), domains=str(tmp_path / "d.npy"),
                           test_fraction=0.5, seed=seed, normalize=False)
    assert ds.domain_names == ["photo", "sketch"]
    test_ids = ds.x_test[:, 0].long().numpy()
    assert [ds.domain_names[i] for i in ds.d_test.tolist()] == dom[test_ids].tolist()
    for di, dname in enumerate(ds.domain_names):
        for c, cname in enumerate(ds.class_names):
            rows = np.flatnonzero((y == c) & (dom == dname))
            _, te = stratified_split(len(rows), 0.5, seed, f"{dname}/{cname}")
            assert sorted(test_ids[(ds.y_test.numpy() == c) & (ds.d_test.numpy() == di)]) == sorted(rows[te].tolist())
    back = load_dataset(save_dataset(ds, tmp_path / "d.safetensors"))
    assert back.domain_names == ds.domain_names and torch.equal(back.d_train, ds.d_train)


# --- normalisation -------------------------------------------------------------------------------

def test_normalisation_on_and_off(tmp_path, rng):
    x, y = _data(rng)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    kw = dict(test_x=str(tmp_path / "x.npy"), test_y=str(tmp_path / "y.npy"))
    on = import_embeddings(str(tmp_path / "x.npy"), str(tmp_path / "y.npy"), **kw)
    off = import_embeddings(str(tmp_path / "x.npy"), str(tmp_path / "y.npy"), normalize=False, **kw)
    unit = x / np.linalg.norm(x, axis=1, keepdims=True)
    np.testing.assert_allclose(on.x_train.numpy(), unit, rtol=1e-6, atol=1e-7)
    assert torch.equal(off.x_train, torch.from_numpy(x.astype(np.float32)))
    assert on.meta["normalised"] is True and off.meta["normalised"] is False
    before = on.meta["row_norms_min_median_max"]["train"]["before"]
    norms = np.linalg.norm(x, axis=1)
    assert before == pytest.approx([norms.min(), np.median(norms), norms.max()])
    assert on.meta["row_norms_min_median_max"]["train"]["after"] == pytest.approx([1, 1, 1], abs=1e-6)
    text = format_summary(on)
    assert "L2-normalised" in text and f"{norms.max():.4g}" in text


def test_zero_row_cannot_be_normalised(tmp_path, rng):
    x, y = _data(rng)
    x[3] = 0
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    with pytest.raises(ValueError, match=r"--train-x .*x\.npy.*--no-normalize.*1 zero rows"):
        import_embeddings(str(tmp_path / "x.npy"), str(tmp_path / "y.npy"))
    ds = import_embeddings(str(tmp_path / "x.npy"), str(tmp_path / "y.npy"), normalize=False)
    assert min(v["before"][0] for v in ds.meta["row_norms_min_median_max"].values()) == 0


# --- bad inputs: each error names the file and the field ---------------------------------------

class _Payload:
    """Unpickling this would set the flag: weights_only must refuse before it ever runs."""
    ran = False

    def __setstate__(self, state):
        _Payload.ran = True


def _bad_case(case: str, d: Path, rng):
    """-> (import kwargs, regex the error must match)."""
    x, y = _data(rng, n=12)
    np.save(d / "x.npy", x)
    np.save(d / "y.npy", y)
    X, Y = str(d / "x.npy"), str(d / "y.npy")
    if case == "nan":
        x[5, 2] = np.nan
        np.save(d / "xn.npy", x)
        return dict(train_x=str(d / "xn.npy"), train_y=Y), r"--train-x .*xn\.npy: 1 row\(s\) contain NaN/Inf.*row 5"
    if case == "inf_csv":
        rows = [",".join(_csv_cells(r)) for r in x]
        rows[7] = rows[7].replace(rows[7].split(",")[1], "inf", 1)
        (d / "x.csv").write_text("\n".join(rows) + "\n")
        return dict(train_x=str(d / "x.csv"), train_y=Y), r"--train-x .*x\.csv: .*NaN/Inf.*row 7"
    if case == "ragged_csv":
        rows = [",".join(_csv_cells(r)) for r in x]
        rows[4] = ",".join(_csv_cells(x[4][:-1]))
        (d / "x.csv").write_text("\n".join(rows) + "\n")
        return dict(train_x=str(d / "x.csv"), train_y=Y), r"--train-x .*x\.csv: ragged rows: line 5 has 5 cells"
    if case == "ragged_list":
        rows = ['"[' + ", ".join(_csv_cells(r if i != 3 else r[:4])) + ']"' for i, r in enumerate(x)]
        (d / "x.csv").write_text("emb\n" + "\n".join(rows) + "\n")
        return dict(train_x=str(d / "x.csv"), train_y=Y), r"--train-x .*x\.csv: ragged rows: column 'emb' row 3"
    if case == "ragged_npy":  # an object array: loading it would take pickle
        np.save(d / "xo.npy", np.array([list(r) for r in x[:3]] + [[1.0]], dtype=object), allow_pickle=True)
        return dict(train_x=str(d / "xo.npy"), train_y=Y), r"--train-x .*xo\.npy: .*object array"
    if case == "count":
        np.save(d / "y11.npy", y[:11])
        return dict(train_x=X, train_y=str(d / "y11.npy")), r"--train-y .*y11\.npy: 11 labels for 12 feature rows"
    if case == "outside_names":
        (d / "names.txt").write_text("a\nb\n")
        return (dict(train_x=X, train_y=Y, class_names=str(d / "names.txt")),
                r"--train-y .*y\.npy: label 2 .*outside the 2 names of --class-names .*names\.txt")
    if case == "unknown_string":
        np.save(d / "ys.npy", np.array(["a", "b", "c"] * 4))
        (d / "names.txt").write_text("a\nb\n")
        return (dict(train_x=X, train_y=str(d / "ys.npy"), class_names=str(d / "names.txt")),
                r"--train-y .*ys\.npy: labels \['c'\] are not in the 2 names of --class-names")
    if case == "test_dim":
        np.save(d / "xt.npy", x[:, :4])
        return (dict(train_x=X, train_y=Y, test_x=str(d / "xt.npy"), test_y=Y),
                r"--test-x .*xt\.npy: test features have dimension 4, the train features .* 6")
    if case == "empty":
        (d / "e.npy").write_bytes(b"")
        return dict(train_x=str(d / "e.npy"), train_y=Y), r"--train-x .*e\.npy: the file is empty"
    if case == "empty_rows":
        np.save(d / "e.npy", np.zeros((0, 6)))
        return dict(train_x=str(d / "e.npy"), train_y=Y), r"--train-x .*e\.npy: no features"
    if case == "header_only_csv":
        (d / "y.csv").write_text("label\n")
        return dict(train_x=X, train_y=str(d / "y.csv")), r"--train-y .*y\.csv: .*no data rows"
    if case == "empty_names":
        (d / "names.txt").write_text("\n")
        return dict(train_x=X, train_y=Y, class_names=str(d / "names.txt")), r"--class-names .*names\.txt: .*empty"
    if case == "extension":
        (d / "x.txt").write_text("1 2 3\n")
        return dict(train_x=str(d / "x.txt"), train_y=Y), r"--train-x .*x\.txt: unknown extension '\.txt'"
    if case == "two_arrays":
        np.savez(d / "two.npz", a=x, b=x)
        return dict(train_x=str(d / "two.npz"), train_y=Y), r"--train-x .*two\.npz: .*2 arrays \['a', 'b'\]; name one"
    if case == "float_labels":
        np.save(d / "yf.npy", y + 0.5)
        return dict(train_x=X, train_y=str(d / "yf.npy")), r"--train-y .*yf\.npy: labels must be integers"
    if case == "pickled_object":
        torch.save({"x": torch.from_numpy(x), "extra": _Payload()}, d / "x.pt")
        return dict(train_x=str(d / "x.pt"), train_y=Y), r"--train-x .*x\.pt: torch\.load\(weights_only=True\) refused it.*_Payload"
    raise AssertionError(case)


BAD = ["nan", "inf_csv", "ragged_csv", "ragged_list", "ragged_npy", "count", "outside_names", "unknown_string",
       "test_dim", "empty", "empty_rows", "header_only_csv", "empty_names", "extension", "two_arrays",
       "float_labels", "pickled_object"]


@pytest.mark.parametrize("case", BAD)
def test_bad_input_names_file_and_field(tmp_path, rng, case):
    kwargs, pattern = _bad_case(case, tmp_path, rng)
    with pytest.raises(ValueError, match=pattern):
        import_embeddings(**kwargs)
    assert not _Payload.ran


def test_parquet_without_a_reader_says_what_to_install(tmp_path, rng, monkeypatch):
    for mod in ("pyarrow", "pyarrow.parquet", "pandas"):
        monkeypatch.setitem(sys.modules, mod, None)  # import now raises ImportError
    (tmp_path / "x.parquet").write_bytes(b"PAR1" + b"\0" * 16 + b"PAR1")
    np.save(tmp_path / "y.npy", np.zeros(3, np.int64))
    with pytest.raises(ValueError, match=r"--train-x .*x\.parquet: reading \.parquet needs pyarrow \(pip install "
                                         r"pyarrow\)"):
        import_embeddings(str(tmp_path / "x.parquet"), str(tmp_path / "y.npy"))


def test_loader_error_on_a_plain_npz_points_at_fedsim_import(tmp_path, rng):
    x, y = _data(rng)
    np.savez(tmp_path / "plain.npz", x_train=x, y_train=y, x_test=x, y_test=y)
    with pytest.raises(ValueError) as err:
        load_dataset(tmp_path / "plain.npz")
    msg = str(err.value)
    assert "lacks the 'header'" in msg and "fedsim import" in msg and "class_names" in msg
    assert "is not a file in the archive" not in msg
    # the command the message suggests works
    cmd = msg.split("here: fedsim ")[1].split()
    out = tmp_path / "converted.npz"
    assert main(cmd[:-1] + [str(out)]) == 0
    assert torch.equal(load_dataset(out).y_test, torch.from_numpy(y))


# --- the command line ------------------------------------------------------------------------------

def test_cli_bad_input_exits_2_without_traceback(tmp_path, rng):
    kwargs, pattern = _bad_case("nan", tmp_path, rng)
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    proc = subprocess.run([sys.executable, "-m", "fedsim.cli", "import", "--train-x", kwargs["train_x"],
                           "--train-y", kwargs["train_y"], "--out", str(tmp_path / "o.npz")],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith("fedsim: error: --train-x ") and "NaN/Inf" in proc.stderr
    assert not (tmp_path / "o.npz").exists()


def test_cli_import_then_run(tmp_path, rng, capsys):
    x, y = _data(rng, n=60, dim=8)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    out = tmp_path / "mine.npz"
    common = ["import", "--train-x", str(tmp_path / "x.npy"), "--train-y", str(tmp_path / "y.npy")]
    assert main(common + ["--test-fraction", "0.25", "--seed", "3", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    ds = load_dataset(out)
    assert ds.x_train.shape == (45, 8) and ds.x_test.shape == (15, 8)
    for c in range(3):  # 20 rows per class: 15 train, 5 test
        assert re.search(rf"^\s*class_{c}\s+15\s+5$", text, re.M), text
    assert re.search(r"^\s*total\s+45\s+15$", text, re.M) and f"wrote {out}" in text
    assert main(common + ["--out", str(out)]) == 2  # never replaces a file silently
    assert "--overwrite" in capsys.readouterr().err

    run_args = ["run", "--dataset", str(out), "--rounds", "1", "--clients", "2", "--partition", "iid",
                "--min-size", "1", "--augmenters", "none,ggeur", "--quiet"]
    assert main(run_args + ["--out", str(tmp_path / "run")]) == 0
    captured = capsys.readouterr()
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert set(results["methods"]) == {"FedAvg", "FedAvg+GGEUR"}
    assert "not unit-norm" not in captured.err

    raw = tmp_path / "raw.npz"
    assert main(common + ["--no-normalize", "--out", str(raw)]) == 0
    capsys.readouterr()
    assert main(["run", "--dataset", str(raw), "--rounds", "1", "--clients", "2", "--partition", "iid",
                 "--min-size", "1", "--augmenters", "none", "--quiet", "--out", str(tmp_path / "run3")]) == 0
    warn = [ln for ln in capsys.readouterr().err.splitlines() if "not unit-norm" in ln]
    assert len(warn) == 1 and "GGEUR and FedMC work on the raw vectors" in warn[0]
