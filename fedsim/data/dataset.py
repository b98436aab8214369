"""The fedsim dataset: frozen embeddings + labels (+ optional domain ids), a train/test split.

On disk: ``.npz`` (numpy, loaded with allow_pickle=False) or ``.safetensors`` (metadata as JSON),
with keys x_train (n, D) float, y_train (n,) int, x_test, y_test, optional d_train/d_test domain
ids, optional class_text (C, D_text) float (class-name text embeddings, e.g. a CLIP zero-shot
head; ``meta["class_text"]`` says how they were made), and metadata: class_names, domain_names (or
empty), and a free-form ``meta`` dict (provenance, encoder, whether embeddings are L2-normalised).
"""
from __future__ import annotations

import json
import math
import os
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from .._io import atomic_write, check_can_create

EMBEDDED_DIR = Path(__file__).parent
EMBEDDED = {"default": "wordnet_minilm.npz"}


@dataclass
class Dataset:
    name: str
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    class_names: list[str]
    d_train: torch.Tensor | None = None
    d_test: torch.Tensor | None = None
    domain_names: list[str] = field(default_factory=list)
    meta: dict = field(default_factory=dict)
    class_text: torch.Tensor | None = None

    @property
    def n_classes(self) -> int:
        return len(self.class_names)

    @property
    def dim(self) -> int:
        return self.x_train.shape[1]

    @property
    def n_domains(self) -> int:
        return len(self.domain_names)

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        where = f"dataset {self.name!r}"
        for split in ("train", "test"):
            x, y = getattr(self, f"x_{split}"), getattr(self, f"y_{split}")
            if not isinstance(x, torch.Tensor) or x.dim() != 2 or not x.dtype.is_floating_point:
                raise ValueError(f"{where}: x_{split} must be a 2-D float tensor")
            if x.shape[0] == 0:
                raise ValueError(f"{where}: x_{split} is empty")
            if not isinstance(y, torch.Tensor) or y.shape != (x.shape[0],) or y.dtype.is_floating_point:
                raise ValueError(f"{where}: y_{split} must be integer labels of shape ({x.shape[0]},)")
            if not bool(torch.isfinite(x).all()):
                raise ValueError(f"{where}: x_{split} contains NaN/Inf")
            # Scale: the heads and the geometry compute in float32 with squared norms and distances
            # (|x|^2 + |y|^2 - 2<x, y> <= 4 D max|x|^2); above this bound they would overflow to Inf and
            # turn into NaN or silently zero logits (geomkern refuses such inputs with the same bound).
            limit = math.sqrt(torch.finfo(torch.float32).max / (4.0 * max(x.shape[1], 1)))
            biggest = float(x.abs().max()) if x.numel() else 0.0
            if biggest > limit:
                raise ValueError(f"{where}: x_{split} has values up to {biggest:.3g}; squared norms of rows of "
                                 f"{x.shape[1]} such values overflow float32 (|values| must stay below {limit:.3g}): "
                                 "rescale the embeddings (fedsim import L2-normalises rows by default)")
            if int(y.min()) < 0 or int(y.max()) >= len(self.class_names):
                raise ValueError(f"{where}: y_{split} has labels outside [0, {len(self.class_names)}) "
                                 "(class_names lists fewer classes than the labels use)")
            d = getattr(self, f"d_{split}")
            if d is not None:
                if d.shape != (x.shape[0],) or d.dtype.is_floating_point:
                    raise ValueError(f"{where}: d_{split} must be integer domain ids of shape ({x.shape[0]},)")
                if int(d.min()) < 0 or int(d.max()) >= max(1, len(self.domain_names)):
                    raise ValueError(f"{where}: d_{split} has ids outside the {len(self.domain_names)} domain_names")
        if self.x_train.shape[1] != self.x_test.shape[1]:
            raise ValueError(f"{where}: train and test embeddings differ in dimension "
                             f"({self.x_train.shape[1]} vs {self.x_test.shape[1]})")
        if (self.d_train is None) != (self.d_test is None):
            raise ValueError(f"{where}: domain ids must be given for both splits or neither")
        ct = self.class_text
        if ct is not None and (not isinstance(ct, torch.Tensor) or ct.dim() != 2 or not ct.dtype.is_floating_point
                               or ct.shape[0] != len(self.class_names) or not bool(torch.isfinite(ct).all())):
            raise ValueError(f"{where}: class_text must be a finite 2-D float tensor with one row per class "
                             f"({len(self.class_names)})")

    def summary(self) -> str:
        dom = f", {self.n_domains} domains" if self.n_domains else ""
        return (f"{self.name}: {self.x_train.shape[0]} train / {self.x_test.shape[0]} test, "
                f"D={self.dim}, {self.n_classes} classes{dom}")


_ARRAYS = ("x_train", "y_train", "x_test", "y_test", "d_train", "d_test", "class_text")
# What every loader error points at: the layout, and the command that builds it from plain arrays.
_LAYOUT = ("a fedsim dataset holds arrays x_train (n, D) float, y_train (n,) int, x_test (m, D), y_test (m,) "
           "and a JSON header with class_names; build one from plain arrays with `fedsim import` "
           "(docs/own-embeddings.md)")
_FLOAT_ARRAYS = ("x_train", "x_test", "class_text")


def check_dataset_out(out, *, overwrite: bool, flag: str = "--out") -> Path:
    """``out`` can receive a dataset file (``fedsim import`` / ``fedsim embed``), checked before
    anything is read or written: a .npz or .safetensors name, not a folder (``--overwrite`` replaces
    a file; the atomic rename could not replace a folder, and only after all the work), no existing
    file unless ``overwrite``, and a place it can be made (_io.check_can_create)."""
    out = Path(out)
    if out.suffix not in (".npz", ".safetensors"):
        raise ValueError(f"{flag} {out}: the dataset file must end in .npz or .safetensors")
    if out.is_dir():
        raise ValueError(f"{flag} {out} is a folder; the dataset is one file (--overwrite replaces a file, never a "
                         f"folder): name a file, e.g. {flag} {out / ('dataset' + out.suffix)}")
    if out.exists():
        if not overwrite:
            raise ValueError(f"{flag} {out} already exists (pass --overwrite to replace it)")
        if not os.access(out.parent, os.W_OK | os.X_OK):  # the new file is renamed into it
            raise ValueError(f"{flag} {out}: the folder {out.parent} is not writable")
    else:
        check_can_create(out, flag)
    return out


def save_dataset(ds: Dataset, path) -> Path:
    """Write ``ds`` as .npz or .safetensors (by suffix); embeddings keep their dtype."""
    path = Path(path)
    arrays = {k: getattr(ds, k).cpu().numpy() for k in _ARRAYS if getattr(ds, k) is not None}
    header = {"name": ds.name, "class_names": list(ds.class_names),
              "domain_names": list(ds.domain_names), "meta": ds.meta}
    if path.suffix not in (".npz", ".safetensors"):
        raise ValueError(f"dataset file {path} must end in .npz or .safetensors")
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(path) as tmp:  # never leave a half-written file under the final name
        if path.suffix == ".npz":
            with open(tmp, "wb") as f:
                np.savez_compressed(f, header=np.array(json.dumps(header)), **arrays)
        else:
            from safetensors.numpy import save_file

            save_file({k: np.ascontiguousarray(v) for k, v in arrays.items()}, str(tmp),
                      metadata={"fedsim_dataset": json.dumps(header)})
    return path


def load_dataset(source) -> Dataset:
    """Load a dataset from a file path, or an embedded one by name (``"default"``)."""
    if isinstance(source, Dataset):
        return source
    if isinstance(source, str) and source in EMBEDDED:
        path = EMBEDDED_DIR / EMBEDDED[source]
        if not path.is_file():
            raise FileNotFoundError(f"the embedded dataset {source!r} ({path}) is missing from this "
                                    "installation; rebuild it with scripts/build_default_dataset.py")
    else:
        path = Path(source)
    if path.is_dir():
        try:
            found = sorted(p.name for p in path.iterdir() if p.suffix in (".npz", ".safetensors") and p.is_file())
        except OSError:  # an unreadable folder: the message still says what to give
            found = []
        inside = (f"; the folder holds {', '.join(found[:3])}{', ...' if len(found) > 3 else ''}: e.g. "
                  f"{path / found[0]}" if found else "")
        raise ValueError(f"dataset {path} (--dataset) is a folder, not a dataset file: name the .npz or .safetensors "
                         f"file that fedsim import or fedsim embed wrote{inside}. A folder of images or texts becomes "
                         f"one with fedsim embed --dataset imagefolder|textfolder --root {path} --out FILE.npz")
    if not path.is_file():
        raise FileNotFoundError(f"dataset file {path} does not exist (embedded names: {sorted(EMBEDDED)})")
    bad = f"{path} is not a valid fedsim dataset"
    if path.suffix not in (".npz", ".safetensors"):
        raise ValueError(f"{bad}: the file must end in .npz or .safetensors; plain arrays (.npy, .pt, .csv, "
                         "...) become one with `fedsim import`")
    if path.suffix == ".npz" and not zipfile.is_zipfile(path):
        # np.load would otherwise read a non-zip as .npy or pickle and fail with an odd message.
        raise ValueError(f"{bad}: not a zip archive (an .npz is one)")
    try:
        if path.suffix == ".npz":
            with np.load(path, allow_pickle=False) as z:
                if "header" not in z.files:
                    plain = all(k in z.files for k in ("x_train", "y_train", "x_test", "y_test"))
                    raise ValueError(f"the archive lacks the 'header' entry (it holds {sorted(z.files)}); "
                                     + _LAYOUT + (f"; here: fedsim import --train-x {path}:x_train --train-y "
                                                  f"{path}:y_train --test-x {path}:x_test --test-y {path}:y_test "
                                                  f"--out {path.stem}-fedsim.npz" if plain else ""))
                header = json.loads(str(z["header"]))
                arrays = {k: z[k] for k in _ARRAYS if k in z.files}
        else:
            from safetensors import SafetensorError, safe_open

            try:
                with safe_open(str(path), framework="np") as f:
                    if "fedsim_dataset" not in (f.metadata() or {}):
                        raise ValueError("the file lacks the 'fedsim_dataset' metadata entry (the header; it "
                                         f"holds tensors {sorted(f.keys())}); " + _LAYOUT)
                    header = json.loads((f.metadata() or {})["fedsim_dataset"])
                    arrays = {k: f.get_tensor(k) for k in f.keys()}
            except SafetensorError as exc:
                raise ValueError(str(exc)) from None
    except (KeyError, ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:
        raise ValueError(f"{bad}: {exc}") from None
    if not isinstance(header, dict) or not isinstance(header.get("class_names"), list):
        raise ValueError(f"{bad}: its header has no class_names list; {_LAYOUT}")
    missing = [k for k in ("x_train", "y_train", "x_test", "y_test") if k not in arrays]
    if missing:
        raise ValueError(f"{bad}: missing arrays {missing}; {_LAYOUT}")
    for k, a in arrays.items():
        # Check kinds before the casts below, which would turn float labels into silent integers.
        want = "f" if k in _FLOAT_ARRAYS else "iu"
        if a.dtype.kind not in want:
            raise ValueError(f"{bad}: {k} has dtype {a.dtype}, expected "
                             f"{'floating point' if want == 'f' else 'integer'}")

    def t(k, dtype=None):
        if k not in arrays:
            return None
        a = torch.from_numpy(np.array(arrays[k]))
        if dtype is None and a.dtype == torch.float16:
            dtype = torch.float32  # stored compactly; computed on in float32
        return a.to(dtype) if dtype is not None else a

    try:
        return Dataset(name=header.get("name", path.stem), x_train=t("x_train"),
                       y_train=t("y_train", torch.int64), x_test=t("x_test"),
                       y_test=t("y_test", torch.int64), class_names=list(header["class_names"]),
                       d_train=t("d_train", torch.int64), d_test=t("d_test", torch.int64),
                       domain_names=list(header.get("domain_names", [])), meta=dict(header.get("meta", {})),
                       class_text=t("class_text"))
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None


# ------------------------------------------------------------------------------ per-client feature spaces
@dataclass
class ClientSplit:
    """One client's own data in its own feature space: x_train (n, D_i), x_test (m, D_i).

    ``space`` names the feature space (encoder, map, dimension): clients with the same space can
    share a model on raw features (FedRep restricted to a space); ``n_classes`` is the number of
    classes the client's label space has (every client of a dataset must agree on it).
    """

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    n_classes: int
    space: str = "0"

    @property
    def dim(self) -> int:
        return self.x_train.shape[1]


@dataclass
class PersonalDataset:
    """Clients that each hold their own train/test split, possibly in different feature spaces
    (FLIC's setting). Evaluated per client on its own test split (personalised evaluation)."""

    name: str
    clients: list[ClientSplit]
    class_names: list[str]
    meta: dict = field(default_factory=dict)

    def __post_init__(self):
        self.validate()

    @property
    def n_classes(self) -> int:
        return len(self.class_names)

    @property
    def spaces(self) -> dict[str, int]:
        """space name -> its dimension."""
        return {c.space: c.dim for c in self.clients}

    @property
    def y_train(self) -> torch.Tensor:
        """All clients' training labels, client after client (``parts`` indexes it)."""
        return torch.cat([c.y_train for c in self.clients])

    @property
    def parts(self) -> list[torch.Tensor]:
        ends = np.cumsum([0] + [c.y_train.shape[0] for c in self.clients])
        return [torch.arange(int(a), int(b)) for a, b in zip(ends[:-1], ends[1:])]

    def validate(self) -> None:
        where = f"dataset {self.name!r}"
        if not self.clients:
            raise ValueError(f"{where}: it has no clients")
        counts = sorted({c.n_classes for c in self.clients})
        if len(counts) > 1 or counts[0] != len(self.class_names):
            per = ", ".join(f"client {i}: {c.n_classes}" for i, c in enumerate(self.clients))
            raise ValueError(f"{where}: the clients disagree on the number of classes ({per}; class_names "
                             f"lists {len(self.class_names)}); every client must use the same label space")
        dims: dict[str, int] = {}
        for i, c in enumerate(self.clients):
            for split in ("train", "test"):
                x, y = getattr(c, f"x_{split}"), getattr(c, f"y_{split}")
                if not isinstance(x, torch.Tensor) or x.dim() != 2 or not x.dtype.is_floating_point:
                    raise ValueError(f"{where}: client {i} x_{split} must be a 2-D float tensor")
                if x.shape[0] == 0:
                    raise ValueError(f"{where}: client {i} has an empty {split} split; every client needs "
                                     "training and test rows (personalised evaluation)")
                if not isinstance(y, torch.Tensor) or y.shape != (x.shape[0],) or y.dtype.is_floating_point:
                    raise ValueError(f"{where}: client {i} y_{split} must be integer labels of shape ({x.shape[0]},)")
                if int(y.min()) < 0 or int(y.max()) >= c.n_classes:
                    raise ValueError(f"{where}: client {i} y_{split} has labels outside [0, {c.n_classes})")
                if not bool(torch.isfinite(x).all()):
                    raise ValueError(f"{where}: client {i} x_{split} contains NaN/Inf")
            if c.x_test.shape[1] != c.dim:
                raise ValueError(f"{where}: client {i} train and test features differ in dimension "
                                 f"({c.dim} vs {c.x_test.shape[1]})")
            if dims.setdefault(c.space, c.dim) != c.dim:
                raise ValueError(f"{where}: clients of space {c.space!r} differ in dimension "
                                 f"({dims[c.space]} vs {c.dim} at client {i})")

    def summary(self) -> str:
        dims = sorted(self.spaces.values())
        n_tr = sum(c.x_train.shape[0] for c in self.clients)
        n_te = sum(c.x_test.shape[0] for c in self.clients)
        return (f"{self.name}: {len(self.clients)} clients in {len(dims)} feature spaces (D={min(dims)}..{max(dims)}), "
                f"{n_tr} train / {n_te} test, {self.n_classes} classes")
