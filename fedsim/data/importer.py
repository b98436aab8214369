"""Bring your own embeddings: plain arrays on disk -> a fedsim dataset file (``fedsim import``).

Inputs (by suffix; ``FILE:KEY`` names one array, tensor or column inside a file):

- ``.npy`` — one array (read with allow_pickle=False);
- ``.npz`` — one array, or ``file.npz:key``;
- ``.pt`` / ``.pth`` — a tensor, or a dict holding tensors (one, or ``file.pt:key``); read with
  ``torch.load(weights_only=True)``, so a file holding any other pickled object is refused;
- ``.safetensors`` — one tensor, or ``file.safetensors:key``;
- ``.csv`` / ``.parquet`` — features as one column per dimension or one list-valued column
  (a csv cell ``[0.1, 0.2, ...]``); labels and domains as one column. A csv's first row is a header
  when any of its cells is neither a number nor a ``[...]`` list, or when it reads 0,1,...,D-1
  (pandas' names for unnamed columns); in a csv of string labels alone
  that is a guess, which the number of feature rows settles (a file one label short without its
  first line is headerless), and an error says so where it cannot. When the labels (or domains) are
  a column of the features' own table (``--train-y table.csv:label``), that column is not a
  feature. Parquet is read with pyarrow, else pandas. Errors name a csv's line and cell.

Labels are integer class ids (names from ``--class-names``, one per line, else ``class_0`` ...)
or strings (csv/parquet/npy string arrays): strings are mapped to ids in sorted order, or to their
line in ``--class-names``. Domain labels work the same way (names ``domain_0`` ... for ids). Ids
no row carries (labels 3, 7, 100 make 101 classes) are kept, with a warning on stderr; at most
MAX_IDS ids, and the training labels must hold at least 2 classes.
Without a test split of its own, the rows are split with ``fedsim embed``'s seeded stratified split
per (domain, class) (fedsim.embed.datasets.stratified_split). Rows are L2-normalised unless
``normalize=False``, stored as float32. Every error is a ValueError naming the file and the field.
"""
from __future__ import annotations

import csv
import json
import pickle
import re
import sys
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from .split import stratified_split, unit_rows
from .dataset import Dataset

# The most class (or domain) ids a label file may make: integer labels are the ids themselves, and
# every id up to the largest gets a name, an output of the head and a line of the results, so one
# stray 10**9 would take gigabytes (the largest label sets in use have some 10**4 classes).
MAX_IDS = 2 ** 20
SUFFIXES = (".npy", ".npz", ".pt", ".pth", ".safetensors", ".csv", ".parquet")
_TABLES = (".csv", ".parquet")


# --- one input: "path" or "path:key" ---------------------------------------------------------

class _Input:
    def __init__(self, spec, field: str):
        spec = str(spec)
        path, key = Path(spec), None
        if not path.exists() and ":" in spec:
            head, tail = spec.rsplit(":", 1)
            if tail and Path(head).suffix.lower() in SUFFIXES:
                path, key = Path(head), tail
        self.path, self.key, self.field = path, key, field
        self.suffix = path.suffix.lower()

    @property
    def where(self) -> str:
        return f"{self.field} {self.path}" + (f":{self.key}" if self.key else "")

    def error(self, why: str) -> ValueError:
        return ValueError(f"{self.where}: {why}")

    def check_file(self) -> None:
        if self.suffix not in SUFFIXES:
            raise self.error(f"unknown extension {self.path.suffix or '(none)'!r}; supported: {', '.join(SUFFIXES)}")
        if self.path.is_dir():
            raise self.error("is a folder; name the file inside it")
        if not self.path.is_file():
            raise self.error("no such file")
        if self.path.stat().st_size == 0:
            raise self.error("the file is empty")


def _one(inp: _Input, named: dict, what: str):
    """The entry ``inp.key`` of ``named``, or its only entry."""
    if not named:
        raise inp.error(f"the file holds no {what}s")
    if inp.key is not None:
        if inp.key not in named:
            raise inp.error(f"no {what} {inp.key!r}; the file holds {sorted(named)}")
        return named[inp.key]
    if len(named) > 1:
        raise inp.error(f"the file holds {len(named)} {what}s {sorted(named)}; name one: {inp.path}:KEY")
    return next(iter(named.values()))


def _tensor_to_numpy(t: torch.Tensor) -> np.ndarray:
    if t.dtype in (torch.bfloat16, torch.float16):
        t = t.to(torch.float32)
    return t.detach().cpu().numpy()


def _read_array(inp: _Input) -> np.ndarray:
    """An array file (.npy/.npz/.pt/.pth/.safetensors) -> numpy array."""
    try:
        if inp.suffix == ".npy":
            if inp.key is not None:
                raise inp.error("a .npy file holds one array: drop the ':KEY'")
            return np.load(inp.path, allow_pickle=False)
        if inp.suffix == ".npz":
            with np.load(inp.path, allow_pickle=False) as z:
                return np.asarray(z[_one(inp, {k: k for k in z.files}, "array")])
        if inp.suffix in (".pt", ".pth"):
            try:
                obj = torch.load(inp.path, map_location="cpu", weights_only=True)
            except pickle.UnpicklingError as exc:
                found = re.search(r"Unsupported global: GLOBAL ([\w.]+)", str(exc))
                what = f" ({found.group(1)})" if found else ""
                raise inp.error("torch.load(weights_only=True) refused it: it holds a pickled object other "
                                f"than tensors{what}; save a tensor or a dict of tensors") from None
            if isinstance(obj, torch.Tensor):
                if inp.key is not None:
                    raise inp.error("the file holds one tensor, not a dict: drop the ':KEY'")
                return _tensor_to_numpy(obj)
            if isinstance(obj, dict):
                tensors = {str(k): v for k, v in obj.items() if isinstance(v, torch.Tensor)}
                return _tensor_to_numpy(_one(inp, tensors, "tensor"))
            raise inp.error(f"holds a {type(obj).__name__}; expected a tensor or a dict of tensors")
        from safetensors import safe_open

        with safe_open(str(inp.path), framework="pt") as f:
            key = _one(inp, {k: k for k in f.keys()}, "tensor")
            return _tensor_to_numpy(f.get_tensor(key))
    except ValueError as exc:
        if str(exc).startswith(inp.where):
            raise
        raise _read_error(inp, exc) from None
    except Exception as exc:  # a foreign file: every reader fails in its own way
        raise _read_error(inp, exc) from None


def _read_error(inp: _Input, exc: Exception) -> ValueError:
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if "Object arrays cannot be loaded" in msg:
        msg = ("it holds a Python object array (ragged rows or mixed types?), which would need pickle; "
               "save a 2-D numeric array")
    kind = {".pth": ".pt"}.get(inp.suffix, inp.suffix)
    return inp.error(f"cannot be read as a {kind} file: {msg}")


# --- tables: csv and parquet -------------------------------------------------------------------

def _number(cell: str) -> bool:
    try:
        float(cell)
        return True
    except ValueError:
        return False


def _is_value(cell: str) -> bool:
    cell = cell.strip()
    return _number(cell) or (cell.startswith("[") and cell.endswith("]"))


def _at(lines: list[int] | None, i: int) -> str:
    """Where data row ``i`` of a table is: the line of the file a csv row starts on, else its row index."""
    return f"line {lines[i]}" if lines is not None else f"row {i}"


def _read_csv(inp: _Input, *, header: bool | None = None) -> tuple[dict[str, list], list[int], bool]:
    """(columns, the line each data row starts on, whether the header was a guess). ``header``: None
    guesses it: the first row is a header when any of its cells is not a value; a guess, since a
    column of strings (labels) cannot tell its name from its first value, unless a column of values
    stands under a name."""
    try:
        # utf-8-sig: a byte-order mark (Excel writes one) would otherwise make the first cell a
        # non-number, and the first row a header
        with open(inp.path, newline="", encoding="utf-8-sig") as f:
            reader = csv.reader(f)
            rows, lines, start = [], [], 1
            for r in reader:  # blank lines are skipped, and a quoted cell may span lines
                if r and any(c.strip() for c in r):
                    rows.append(r)
                    lines.append(start)
                start = reader.line_num + 1
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise _read_error(inp, exc) from None
    if not rows:
        raise inp.error("the file has no rows")
    for r, line in zip(rows[:2], lines):  # the first data row is one of these, below a header or not
        sep = next((c for c in ";\t" if len(r) == 1 and c in r[0]), None)
        if sep and all(_number(v) for v in r[0].split(sep)):
            raise inp.error(f"line {line} is one cell of numbers separated by {sep!r}; fedsim reads comma-separated "
                            "values: write the file with ',' between the values (pandas: df.to_csv(path, index=False))")
    names_like = [j for j, c in enumerate(rows[0]) if not _is_value(c)]
    # "0,1,...,D-1" is the header pandas writes for a frame of unnamed columns (pd.DataFrame(x)),
    # not a first row of embeddings
    numbered = len(rows[0]) > 1 and [c.strip() for c in rows[0]] == [str(j) for j in range(len(rows[0]))]
    has_header = (bool(names_like) or numbered) if header is None else header
    guessed = header is None and has_header and len(rows) > 1 and not any(
        all(_is_value(r[j]) for r in rows[1:] if j < len(r)) for j in names_like)
    names = [c.strip() for c in rows[0]] if has_header else [f"column_{i}" for i in range(len(rows[0]))]
    head_line = lines[0]
    body, lines = (rows[1:], lines[1:]) if has_header else (rows, lines)
    if not body:
        raise inp.error("the file has a header row and no data rows")
    width = len(names)
    for r, line in zip(body, lines):
        if len(r) != width:
            first = "header" if has_header else "first row"
            raise inp.error(f"ragged rows: line {line} has {len(r)} cells, the {first} (line {head_line}) has {width}")
    cols: dict[str, list] = {}
    for j, name in enumerate(names):
        cells = [r[j].strip() for r in body]
        if all(c.startswith("[") for c in cells):
            vals = []
            for c, line in zip(cells, lines):
                try:
                    vals.append(json.loads(c))
                except json.JSONDecodeError:
                    raise inp.error(f"column {name!r} line {line}: {c[:40]!r} is not a list of numbers") from None
            cols[name] = vals
        elif all(_number(c) for c in cells):
            cols[name] = [float(c) for c in cells]
        else:
            empty = [line for c, line in zip(cells, lines) if not c]
            if empty:
                raise inp.error(f"column {name!r} line {empty[0]} is empty")
            cols[name] = cells
    return cols, lines, guessed


def _read_parquet(inp: _Input) -> dict[str, list]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        pq = None
    try:
        if pq is not None:
            table = pq.read_table(inp.path)
            return {name: table.column(name).to_pylist() for name in table.column_names}
        try:
            import pandas as pd
        except ImportError:
            raise inp.error("reading .parquet needs pyarrow (pip install pyarrow) or pandas with a parquet "
                            "engine; neither is installed (or save the arrays as .npy)") from None
        df = pd.read_parquet(inp.path)
        return {str(c): [v.tolist() if hasattr(v, "tolist") else v for v in df[c]] for c in df.columns}
    except ValueError as exc:
        if str(exc).startswith(inp.where):
            raise
        raise _read_error(inp, exc) from None
    except Exception as exc:
        raise _read_error(inp, exc) from None


def _read_table(inp: _Input, *, header: bool | None = None) -> tuple[dict[str, list], list[int] | None, bool]:
    """(columns, the csv line of each data row (None: a parquet's, named by row index), whether a
    csv's header row was a guess: _read_csv)."""
    if inp.suffix == ".csv":
        cols, lines, guessed = _read_csv(inp, header=header)
    else:
        cols, lines, guessed = _read_parquet(inp), None, False
    if not cols:
        raise inp.error("the file has no columns")
    if not len(next(iter(cols.values()))):
        raise inp.error("the file has no rows")
    return cols, lines, guessed


def _list_column(inp: _Input, name: str, values: list) -> np.ndarray:
    """A list-valued column -> (n, D); ragged rows and non-numbers are errors."""
    dims = [len(v) if isinstance(v, (list, tuple)) else -1 for v in values]
    bad = [i for i, d in enumerate(dims) if d < 0]
    if bad:
        raise inp.error(f"column {name!r} row {bad[0]}: {values[bad[0]]!r} is not a list")
    if len(set(dims)) > 1:
        i = next(i for i, d in enumerate(dims) if d != dims[0])
        raise inp.error(f"ragged rows: column {name!r} row {i} has {dims[i]} values, row 0 has {dims[0]}")
    try:
        return np.array(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise inp.error(f"column {name!r} holds lists with non-numeric values") from None


# --- features, labels ---------------------------------------------------------------------------

def read_features(spec, field: str, *, exclude: Sequence[str] = ()) -> np.ndarray:
    """(n, D) float64 features from one input; ``exclude``: columns of a table that are not features."""
    inp = _Input(spec, field)
    inp.check_file()
    if inp.suffix in _TABLES:
        cols, lines, _ = _read_table(inp)
        if inp.key is not None:
            values = _one(inp, cols, "column")
            cols = {inp.key: values}
        else:
            cols = {k: v for k, v in cols.items() if k not in exclude}
            if not cols:
                raise inp.error("no feature columns are left once the label/domain columns are taken out")
            if list(cols.get("", ())) == list(range(len(next(iter(cols.values()))))):
                # it would be taken for one more dimension of every row
                raise inp.error("its column without a name holds 0, 1, 2, ...: the row index pandas writes "
                                "(df.to_csv without index=False), not a feature; write the file with "
                                "df.to_csv(path, index=False)")
        lists = [k for k, v in cols.items() if v and isinstance(v[0], (list, tuple))]
        if lists:
            if len(cols) > 1:
                raise inp.error(f"a list-valued column ({lists[0]!r}) must be the only feature column; the file "
                                f"also has {[k for k in cols if k != lists[0]]} (name it: {inp.path}:{lists[0]})")
            x = _list_column(inp, lists[0], cols[lists[0]])
        else:
            for k, v in cols.items():
                # a csv column with one bad cell holds its numbers as strings too: name the cell that is none
                bad = [i for i, c in enumerate(v) if not (isinstance(c, str) and _number(c)) and
                       (not isinstance(c, (int, float)) or isinstance(c, bool))]
                if len(bad) == len(v):
                    raise inp.error(f"column {k!r} is not numeric (holds {v[0]!r}); if it holds the labels or "
                                    f"domains, name it: --train-y {inp.path}:{k}")
                if bad:
                    raise inp.error(f"{_at(lines, bad[0])}, column {k!r}: the cell {v[bad[0]]!r} is not a number "
                                    f"({len(bad)} such cell(s) in the column); fix it or drop that row")
            x = np.array([cols[k] for k in cols], dtype=np.float64).T
    else:
        x = _read_array(inp)
    if x.dtype.kind not in "fiub":
        raise inp.error(f"features must be numbers, got dtype {x.dtype}")
    if x.ndim != 2:
        raise inp.error(f"features must be a 2-D array (n, D), got shape {tuple(x.shape)}")
    if x.shape[0] == 0 or x.shape[1] == 0:
        raise inp.error(f"no features: shape {tuple(x.shape)}")
    x = x.astype(np.float64)
    finite = np.isfinite(x)
    if not finite.all():
        rows = np.flatnonzero(~finite.all(axis=1))
        raise inp.error(f"{len(rows)} row(s) contain NaN/Inf (first: row {rows[0]})")
    return x


def read_labels(spec, field: str, *, n_rows: int | None = None) -> np.ndarray:
    """(n,) labels from one input: int64 ids, or strings (dtype str). ``n_rows``: the number of
    feature rows they label, which settles whether the first line of a csv of string labels is a
    header (_read_csv can only guess it)."""
    inp = _Input(spec, field)
    inp.check_file()
    lines = None
    if inp.suffix in _TABLES:
        cols, lines, guessed = _read_table(inp)
        if guessed and n_rows is not None and len(next(iter(cols.values()))) == n_rows - 1:
            # one label short if line 1 is a header: it is the first label, unless it occurs nowhere
            # else in its column, where a header with a label missing below it reads the same
            data = _read_table(inp, header=False)
            first = next(iter(data[0].values()))[0]
            if first not in next(iter(data[0].values()))[1:]:
                raise inp.error(f"line {data[1][0]} ({first!r}) is either a header or the first label: read as "
                                f"a header, the file holds {n_rows - 1} labels for {n_rows} feature rows. If it is "
                                "a label, add a header line (e.g. 'label') above it; if it is a header, a label "
                                "is missing")
            cols, lines, guessed = data
        if inp.key is None and len(cols) > 1:
            raise inp.error(f"the file has {len(cols)} columns {list(cols)}; name the label column: "
                            f"{inp.path}:COLUMN")
        values = _one(inp, cols, "column")
        if any(v is None for v in values):
            raise inp.error(f"{_at(lines, values.index(None))} has no label")
        if any(isinstance(v, (list, tuple)) for v in values):
            raise inp.error("labels must be one value per row, not lists")
        words = [i for i, v in enumerate(values) if isinstance(v, str) and not _number(v)]
        if words and len(words) < len(values):
            # integer ids with a stray word would otherwise all turn into strings, sorted as text
            i = words[0]
            raise inp.error(f"{_at(lines, i)}: the label {values[i]!r} is not a number while "
                            f"{len(values) - len(words)} other label(s) are; use integer ids or names throughout")
        y = np.array(values) if words else np.array(values, dtype=np.float64)
    else:
        y = _read_array(inp)
        if y.ndim == 2 and y.shape[1] == 1:
            y = y[:, 0]
        if y.ndim != 1:
            raise inp.error(f"labels must be a 1-D array (n,), got shape {tuple(y.shape)}")
    if y.shape[0] == 0:
        raise inp.error("no labels (0 rows)")
    if y.dtype.kind in "US":
        return y.astype(str)
    if y.dtype.kind == "b":
        return y.astype(np.int64)
    if y.dtype.kind not in "fiu":
        raise inp.error(f"labels must be integers or strings, got dtype {y.dtype}")
    if y.dtype.kind == "f":
        bad = np.flatnonzero(~np.isfinite(y) | (y != np.round(y)))
        if len(bad):
            raise inp.error(f"labels must be integers; {_at(lines, bad[0])} is {y[bad[0]]}")
    if (y < 0).any():
        i = int(np.flatnonzero(y < 0)[0])
        raise inp.error(f"labels must be >= 0; {_at(lines, i)} is {int(y[i])}")
    if y.max() >= MAX_IDS:  # before the cast: a float beyond int64 would wrap around
        i = int(np.argmax(y))
        raise inp.error(f"{_at(lines, i)} is {y[i]:.15g}: labels are used as ids (one class per id from 0 up to the "
                        f"largest), and fedsim takes ids below {MAX_IDS}; number them 0..K-1 "
                        "(np.unique(labels, return_inverse=True)[1]) or give them as strings (mapped to ids in "
                        "sorted order)")
    return y.astype(np.int64)


def read_names(path, field: str) -> list[str]:
    """Names, one per line (surrounding whitespace stripped; blank lines at the end ignored)."""
    inp = _Input(path, field)
    if inp.path.is_dir():
        raise inp.error("is a folder; name the file inside it")
    if not inp.path.is_file():
        raise inp.error("no such file")
    try:
        lines = inp.path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise _read_error(inp, exc) from None
    names = [ln.strip() for ln in lines]
    while names and not names[-1]:
        names.pop()
    if not names:
        raise inp.error("the file is empty (expected one name per line)")
    if "" in names:
        raise inp.error(f"line {names.index('') + 1} is empty")
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise inp.error(f"duplicate names {dup[:5]}")
    return names


def _to_ids(labels: list[tuple[np.ndarray, _Input]], names: list[str] | None, names_field: str,
            default: str) -> tuple[list[np.ndarray], list[str]]:
    """Labels of several splits -> int64 ids over one list of names. Names that no row carries
    (integer labels with gaps, or unused lines of a names file) are kept, with a warning on stderr."""
    kinds = {y.dtype.kind == "U" for y, _ in labels}
    if len(kinds) > 1:
        raise labels[-1][1].error("labels are strings in one file and integers in another: use one kind")
    if kinds == {True}:
        if names is None:
            names = sorted(set().union(*(set(y.tolist()) for y, _ in labels)))
        index = {n: i for i, n in enumerate(names)}
        out = []
        for y, inp in labels:
            unknown = sorted(set(y.tolist()) - set(index))
            if unknown:
                raise inp.error(f"labels {unknown[:5]} are not in the {len(names)} names of {names_field}")
            out.append(np.array([index[v] for v in y.tolist()], dtype=np.int64))
        _warn_empty(out, names, labels[0][1], f"the names of {names_field} make", default)
        return out, names
    top = max(int(y.max()) for y, _ in labels)
    given = names is not None
    if names is None:
        names = [f"{default}_{i}" for i in range(top + 1)]
    for y, inp in labels:
        if int(y.max()) >= len(names):
            i = int(np.flatnonzero(y >= len(names))[0])
            raise inp.error(f"label {y[i]} (row {i}) is outside the {len(names)} names of {names_field} "
                            f"(ids 0..{len(names) - 1})")
    out = [y for y, _ in labels]
    _warn_empty(out, names, labels[0][1], f"the names of {names_field} make" if given else
                f"the labels are used as {default} ids, so ids 0..{top} make", default)
    return out, names


def _warn_empty(ids: list[np.ndarray], names: list[str], inp: _Input, made: str, default: str) -> None:
    """One stderr line when some of ``names`` have no row in ``ids``: a class without rows still gets
    an output of the head and a line of the per-class results, and nothing would say why."""
    used = np.zeros(len(names), dtype=bool)
    for y in ids:
        used[y] = True
    empty = np.flatnonzero(~used)
    if not len(empty):
        return
    kind = "classes" if default == "class" else "domains"
    shown = ", ".join(str(i) for i in empty[:5]) + (", ..." if len(empty) > 5 else "")
    print(f"fedsim: warning: {inp.where}: {made} {len(names)} {kind}, and {len(empty)} of them (ids {shown}) "
          f"have no rows; they still count as {kind} of the dataset"
          + (" (the head has an output for each)" if kind == "classes" else "") + ". "
          f"To have only the {int(used.sum())} {kind} that occur, number them 0..{int(used.sum()) - 1} "
          "(np.unique(labels, return_inverse=True)[1]) or give them as strings (mapped to ids in sorted order)",
          file=sys.stderr)


def _norm_stats(x: np.ndarray) -> list[float]:
    n = np.linalg.norm(x.astype(np.float64), axis=1)
    return [float(n.min()), float(np.median(n)), float(n.max())]


def import_embeddings(train_x, train_y, *, test_x=None, test_y=None, test_fraction: float | None = None,
                      class_names=None, domains=None, test_domains=None, normalize: bool = True,
                      seed: int = 0, name: str = "imported") -> Dataset:
    """Read features and labels (and optional test split, class names, domain labels) into a Dataset.

    train_x, test_x: feature inputs (n, D) / (m, D); train_y, test_y: label inputs (n,) / (m,);
    without test_x/test_y the rows are split with the seeded stratified split (test_fraction,
    default 0.2; seed). class_names: a file, one name per line. domains / test_domains: domain
    label inputs like the labels. The Dataset's meta records the inputs, the split rule,
    ``normalised`` and the row norms before/after (min, median, max per split).
    """
    if (test_x is None) != (test_y is None):
        raise ValueError("give both --test-x and --test-y (or neither, for a seeded split)")
    own_split = test_x is not None
    if own_split and test_fraction is not None:
        raise ValueError("give either --test-x/--test-y or --test-fraction, not both")
    if test_domains is not None and not own_split:
        raise ValueError("--test-domains goes with --test-x/--test-y; with --test-fraction, --domains covers "
                         "every row")
    if own_split and (domains is None) != (test_domains is None):
        raise ValueError("with an own test split give both --domains and --test-domains (or neither)")
    test_fraction = 0.2 if test_fraction is None else float(test_fraction)
    if not own_split and not 0 < test_fraction < 1:
        raise ValueError(f"--test-fraction must lie in (0, 1), got {test_fraction}")

    def same_table_columns(x_spec, *others):
        xi = _Input(x_spec, "")
        if xi.suffix not in _TABLES or xi.key is not None:
            return ()
        cols = []
        for o in others:
            oi = _Input(o, "") if o is not None else None
            if oi is not None and oi.key is not None and oi.path.resolve() == xi.path.resolve():
                cols.append(oi.key)
        return tuple(cols)

    splits = [("train", "--train-x", train_x, "--train-y", train_y, "--domains", domains)]
    if own_split:
        splits.append(("test", "--test-x", test_x, "--test-y", test_y, "--test-domains", test_domains))
    xs, ys, ds = {}, [], []
    for s, xf, xv, yf, yv, df, dv in splits:
        xs[s] = read_features(xv, xf, exclude=same_table_columns(xv, yv, dv))
        y = read_labels(yv, yf, n_rows=xs[s].shape[0])
        if y.shape[0] != xs[s].shape[0]:
            raise _Input(yv, yf).error(f"{y.shape[0]} labels for {xs[s].shape[0]} feature rows in {xv}")
        ys.append((y, _Input(yv, yf)))
        if dv is not None:
            d = read_labels(dv, df, n_rows=xs[s].shape[0])
            if d.shape[0] != xs[s].shape[0]:
                raise _Input(dv, df).error(f"{d.shape[0]} domain labels for {xs[s].shape[0]} feature rows in {xv}")
            ds.append((d, _Input(dv, df)))
    if own_split and xs["test"].shape[1] != xs["train"].shape[1]:
        raise _Input(test_x, "--test-x").error(f"test features have dimension {xs['test'].shape[1]}, the train "
                                               f"features ({train_x}) {xs['train'].shape[1]}")
    cnames = read_names(class_names, "--class-names") if class_names is not None else None
    classes = np.unique(ys[0][0])
    if len(classes) < 2:
        raise ys[0][1].error(f"every training row has the label {classes[0].item()!r}: a classifier needs at least "
                             "2 classes (with one, every prediction is right and a run reports a trivial 100 % "
                             "accuracy); add the rows of the other classes to this file and to --train-x")
    y_ids, cnames = _to_ids(ys, cnames, f"--class-names {class_names}" if class_names else "the labels",
                            "class")
    d_ids, dnames = _to_ids(ds, None, "the domain labels", "domain") if ds else ([None] * len(splits), [])

    if own_split:
        rule = "the files' own split (--test-x/--test-y)"
        parts = {"train": (xs["train"], y_ids[0], d_ids[0]), "test": (xs["test"], y_ids[1], d_ids[1])}
    else:
        rule = (f"seeded stratified split per {'(domain, class)' if ds else 'class'}: test_fraction={test_fraction}, "
                f"seed={seed} (fedsim.embed.datasets.stratified_split)")
        x, y, d = xs["train"], y_ids[0], d_ids[0]
        tr, te = [], []
        for di in (range(len(dnames)) if ds else [None]):
            for ci in range(len(cnames)):
                mask = (y == ci) if di is None else (y == ci) & (d == di)
                rows = np.flatnonzero(mask)
                stratum = cnames[ci] if di is None else f"{dnames[di]}/{cnames[ci]}"
                a, b = stratified_split(len(rows), test_fraction, seed, stratum)
                tr.append(rows[a])
                te.append(rows[b])
        tr, te = np.sort(np.concatenate(tr)), np.sort(np.concatenate(te))
        if len(te) == 0:
            raise ValueError(f"--test-fraction {test_fraction}: the test split is empty (each class needs at "
                             "least 2 rows)")
        parts = {s: (x[i], y[i], None if d is None else d[i]) for s, i in (("train", tr), ("test", te))}

    norms, out = {}, {}
    for s, (x, y, d) in parts.items():
        before = _norm_stats(x)
        src = f"--test-x {test_x}" if s == "test" and own_split else f"--train-x {train_x}"
        if normalize:
            x = unit_rows(x, f"{src} ({s} rows; pass --no-normalize to keep raw rows)")
        else:
            # the bound Dataset.validate holds raw rows to, checked here to name the file (the float32
            # cast below would otherwise turn larger values into Inf, reported as Inf in the input)
            limit = np.sqrt(np.finfo(np.float32).max / (4.0 * x.shape[1]))
            if np.abs(x).max() > limit:
                raise ValueError(f"{src} ({s} rows): values up to {np.abs(x).max():.3g}; fedsim stores rows as "
                                 f"float32 and computes on their squared norms, which overflow above {limit:.3g} "
                                 f"at D={x.shape[1]}: rescale the rows, or drop --no-normalize (rows are then "
                                 "L2-normalised)")
        x = x.astype(np.float32)
        norms[s] = {"before": before, "after": _norm_stats(x)}
        out[s] = (torch.from_numpy(x), torch.from_numpy(y), None if d is None else torch.from_numpy(d))
    inputs = {"train_x": str(train_x), "train_y": str(train_y)}
    for k, v in (("test_x", test_x), ("test_y", test_y), ("class_names", class_names), ("domains", domains),
                 ("test_domains", test_domains)):
        if v is not None:
            inputs[k] = str(v)
    meta = {"description": f"embeddings imported from {train_x}", "inputs": inputs, "split": rule,
            "normalised": bool(normalize), "row_norms_min_median_max": norms,
            "builder": "fedsim import (fedsim.data.importer)"}
    return Dataset(name=name, x_train=out["train"][0], y_train=out["train"][1], x_test=out["test"][0],
                   y_test=out["test"][1], class_names=list(cnames), d_train=out["train"][2],
                   d_test=out["test"][2], domain_names=list(dnames), meta=meta)


def format_summary(ds: Dataset, max_rows: int = 20) -> str:
    """Counts per class (and domain) and split, dimension, row norms before/after."""
    m = ds.meta
    lines = [f"{ds.name}: D={ds.dim}, {ds.n_classes} classes"
             + (f", {ds.n_domains} domains" if ds.n_domains else "")
             + f", float32, {'L2-normalised' if m.get('normalised') else 'raw rows (not normalised)'}",
             f"split: {m.get('split', '?')}"]

    def table(title, names, a, b):
        w = max([len(title)] + [len(n) for n in names[:max_rows]] + [5])
        ca = np.bincount(a.numpy(), minlength=len(names))
        cb = np.bincount(b.numpy(), minlength=len(names))
        rows = [f"  {title:<{w}}  {'train':>7}  {'test':>7}"]
        rows += [f"  {n:<{w}}  {ca[i]:>7}  {cb[i]:>7}" for i, n in enumerate(names[:max_rows])]
        if len(names) > max_rows:
            rows.append(f"  ... {len(names) - max_rows} more {title}es" if title == "class" else
                        f"  ... {len(names) - max_rows} more")
        rows.append(f"  {'total':<{w}}  {int(ca.sum()):>7}  {int(cb.sum()):>7}")
        return rows

    lines += table("class", ds.class_names, ds.y_train, ds.y_test)
    if ds.n_domains:
        lines += table("domain", ds.domain_names, ds.d_train, ds.d_test)
    lines.append("  row norms (min / median / max)")
    for s, v in m.get("row_norms_min_median_max", {}).items():
        for when in ("before", "after"):
            lo, med, hi = v[when]
            lines.append(f"  {s + ' ' + when:<13} {lo:.4g} / {med:.4g} / {hi:.4g}")
    return "\n".join(lines)
