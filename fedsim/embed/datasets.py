"""Dataset adapters: a raw dataset on disk -> items, labels, domain ids, class names, train/test split.

``load_source(name, root, ...)`` returns a ``SourceDataset`` whose splits hold *items* (file paths,
or in-memory images for CIFAR), integer labels and domain ids; ``fedsim.embed.extract`` turns it
into embeddings. Images are read with Pillow; nothing here needs torchvision.

Layouts (domain = top-level folder, class = the folder below it, items = the files anywhere below
the class folder, with an image extension, or ``.txt`` for ``textfolder``)::

  office-home    ROOT/{Art,Clipart,Product,Real World}/<class>/...
  office-31      ROOT/{amazon,dslr,webcam}/[images/]<class>/...
  domainnet      ROOT/{clipart,infograph,painting,quickdraw,real,sketch}/<class>/...
                 (+ the official ROOT/<domain>_train.txt, ROOT/<domain>_test.txt if present)
  pacs           ROOT/[kfold/]{art_painting,cartoon,photo,sketch}/<class>/...
                 (+ <domain>_train_kfold.txt, <domain>_crossval_kfold.txt in ROOT or ROOT/splits)
  digits         ROOT/<domain>/[train/|test/]<class>/...   any domains (MNIST, SVHN, USPS, SynthDigits, ...)
  imagefolder    ROOT/<domain>/[train/|test/]<class>/...   any image dataset in this layout
  textfolder     ROOT/<domain>/[train/|test/]<class>/*.txt one UTF-8 text per file (text encoders)
  tiny-imagenet  ROOT/{wnids.txt, [words.txt], train/<wnid>/images/*.JPEG,
                 val/val_annotations.txt, val/images/*.JPEG}
  cifar10        ROOT/cifar-10-batches-py/  (the "python version" archive, as torchvision extracts it)
  cifar100       ROOT/cifar-100-python/

Split rules, in order: the dataset's own split where it has one (CIFAR train/test, Tiny-ImageNet
train/val, DomainNet and PACS split lists, ``train/`` + ``test/`` folders in every domain), else a
**seeded stratified split**: per (domain, class), the items sorted by relative path are permuted
by ``numpy.random.default_rng([seed, crc32("<domain>/<class>")])`` and the first
``n_test = floor(test_fraction * n + 1/2)`` (at least 1 and at most n - 1 when n >= 2) go to test.
Seeding per stratum by name keeps a stratum's split unchanged when other domains or classes are
added or left out. Labels always come from the class folder (a split list's numeric labels are
ignored); class names are sorted folder names, so DomainNet's and PACS's label order is kept.
"""
from __future__ import annotations

import hashlib
import io
import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from ..data.split import stratified_split  # the split rule, shared with fedsim import

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm")
TEXT_EXTENSIONS = (".txt",)


@dataclass
class Split:
    """One split. items: (n,) file paths (str) or in-memory images; labels, domains: (n,) int64."""

    items: Sequence
    labels: np.ndarray
    domains: np.ndarray | None
    fingerprint: str  # sha256 of the items (relative path, size, mtime / pixel bytes), in order

    def __len__(self) -> int:
        return len(self.items)


@dataclass
class SourceDataset:
    name: str
    modality: str  # "image" | "text"
    root: str
    class_names: list[str]
    domain_names: list[str]
    train: Split
    test: Split
    split_rule: str
    class_text_names: list[str] = field(default_factory=list)  # readable names for text prompts

    def __post_init__(self):
        if not self.class_text_names:
            self.class_text_names = [c.replace("_", " ") for c in self.class_names]

    def split(self, name: str) -> Split:
        return {"train": self.train, "test": self.test}[name]

    def counts(self) -> dict:
        out = {}
        for s in ("train", "test"):
            sp = self.split(s)
            out[s] = {"n": len(sp), "per_class": np.bincount(sp.labels, minlength=len(self.class_names)).tolist()}
            if sp.domains is not None:
                out[s]["per_domain"] = np.bincount(sp.domains, minlength=len(self.domain_names)).tolist()
        return out


class ArrayImages(Sequence):
    """(n, H, W, 3) uint8 pixels as a sequence of PIL images (CIFAR); cheap to send to workers."""

    def __init__(self, pixels: np.ndarray):
        self.pixels = pixels

    def __len__(self) -> int:
        return len(self.pixels)

    def __getitem__(self, i):
        from PIL import Image

        return Image.fromarray(self.pixels[i])


# --- helpers ------------------------------------------------------------------------------------

def _files_fingerprint(root: Path, paths: Sequence[Path]) -> str:
    h = hashlib.sha256()
    for p in paths:
        st = p.stat()
        h.update(f"{p.relative_to(root).as_posix()}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def _split_of(root: Path, entries: list[tuple[Path, int, int]], domains: bool) -> Split:
    """entries: (path, label, domain) in order -> Split."""
    paths = [p for p, _, _ in entries]
    return Split(items=[str(p) for p in paths], labels=np.array([e[1] for e in entries], dtype=np.int64),
                 domains=np.array([e[2] for e in entries], dtype=np.int64) if domains else None,
                 fingerprint=_files_fingerprint(root, paths))


def _missing(root: Path, name: str, layout: str, why: str) -> FileNotFoundError:
    return FileNotFoundError(f"{name}: {why}\nexpected layout under {root}:\n{layout}")


def _class_folders(dirpath: Path, exts: tuple[str, ...], name: str, root: Path, layout: str) -> dict[str, list[Path]]:
    classes = sorted(d for d in dirpath.iterdir() if d.is_dir() and not d.name.startswith("."))
    if not classes:
        raise _missing(root, name, layout, f"{dirpath} holds no class folders")
    out = {}
    for c in classes:
        files = sorted(p for p in c.rglob("*") if p.is_file() and p.suffix.lower() in exts
                       and not p.name.startswith("."))
        if not files:
            raise _missing(root, name, layout, f"class folder {c} holds no files ending in {', '.join(exts)}")
        out[c.name] = files
    return out


# --- folder datasets (domain / class / files) --------------------------------------------------------

@dataclass
class _FolderSpec:
    name: str
    layout: str
    modality: str = "image"
    expected_domains: tuple[str, ...] | None = None  # None: every folder under the root is a domain
    class_subdir: str | None = None  # Office-31: <domain>/images/<class>
    image_root_subdir: str | None = None  # PACS: ROOT/kfold/<domain>
    split_dirs: bool = False  # <domain>/train/<class> + <domain>/test/<class>
    # domain -> (train list, test list) file names, looked up in these folders (relative to ROOT)
    list_files: Callable[[str], tuple[str, str]] | None = None
    list_dirs: tuple[str, ...] = (".",)


def _folder_source(spec: _FolderSpec, root: Path, *, seed: int, test_fraction: float,
                   domains: Sequence[str] | None) -> SourceDataset:
    name, layout = spec.name, spec.layout
    exts = TEXT_EXTENSIONS if spec.modality == "text" else IMAGE_EXTENSIONS
    if not root.is_dir():
        raise _missing(root, name, layout, f"the dataset folder {root} does not exist")
    image_root = root
    if spec.image_root_subdir and (root / spec.image_root_subdir).is_dir():
        image_root = root / spec.image_root_subdir
    found = sorted(d.name for d in image_root.iterdir() if d.is_dir() and not d.name.startswith("."))
    if spec.image_root_subdir:
        found = [d for d in found if d != spec.image_root_subdir]
    wanted = list(domains) if domains else list(spec.expected_domains or found)
    if not wanted:
        raise _missing(root, name, layout, f"{image_root} holds no domain folders")
    absent = [d for d in wanted if d not in found]
    if absent:
        raise _missing(root, name, layout, f"domain folder(s) {absent} missing from {image_root} (found: {found})")

    def domain_dir(d: str) -> Path:
        p = image_root / d
        if spec.class_subdir and (p / spec.class_subdir).is_dir():
            p = p / spec.class_subdir
        return p

    has_split = {d: (domain_dir(d) / "train").is_dir() and (domain_dir(d) / "test").is_dir() for d in wanted}
    own_dirs = spec.split_dirs and any(has_split.values())
    if own_dirs and not all(has_split.values()):
        raise _missing(root, name, layout, "some domains have train/ and test/ folders and some do not: "
                       f"{[d for d in wanted if not has_split[d]]} lack them")
    # tree[part][domain][class] = files; part is "train"/"test" with own folders, else "all"
    parts = ("train", "test") if own_dirs else ("all",)
    tree = {part: {d: _class_folders(domain_dir(d) / part if own_dirs else domain_dir(d), exts, name, root, layout)
                   for d in wanted} for part in parts}
    class_names = sorted({c for part in tree.values() for per in part.values() for c in per})
    for part, per_domain in tree.items():
        for d, classes in per_domain.items():
            lacking = [c for c in class_names if c not in classes]
            if lacking:
                where = f"{d}/{part}" if own_dirs else d
                raise _missing(root, name, layout, f"incomplete: domain {where!r} lacks class folder(s) "
                               f"{lacking[:10]}{' ...' if len(lacking) > 10 else ''} that other domains have")
    cidx = {c: i for i, c in enumerate(class_names)}
    didx = {d: i for i, d in enumerate(wanted)}
    entries = {"train": [], "test": []}
    if own_dirs:
        rule = "the dataset's own split: <domain>/train/ and <domain>/test/ folders"
        for part in parts:
            for d in wanted:
                for c in class_names:
                    entries[part] += [(p, cidx[c], didx[d]) for p in tree[part][d][c]]
    else:
        lists = _split_lists(spec, root, wanted)
        if lists is not None:
            rule = ("the dataset's own split lists: " + ", ".join(
                f"{t.relative_to(root)} / {s.relative_to(root)}" for t, s in lists.values())
                    + " (labels from the class folders; files in neither list are not used)")
            where = {p: (cidx[c], didx[d]) for d in wanted for c in class_names for p in tree["all"][d][c]}
            _read_split_lists(lists, image_root, where, entries, name, root, layout)
        else:
            rule = (f"seeded stratified split per (domain, class): test_fraction={test_fraction}, seed={seed} "
                    "(fedsim.embed.datasets.stratified_split)")
            for d in wanted:
                for c in class_names:
                    files = tree["all"][d][c]
                    tr, te = stratified_split(len(files), test_fraction, seed, f"{d}/{c}")
                    entries["train"] += [(files[i], cidx[c], didx[d]) for i in tr]
                    entries["test"] += [(files[i], cidx[c], didx[d]) for i in te]
    for s in ("train", "test"):
        if not entries[s]:
            raise _missing(root, name, layout, f"the {s} split is empty (too few files per class?)")
    return SourceDataset(name=name, modality=spec.modality, root=str(root), class_names=class_names,
                         domain_names=wanted, train=_split_of(image_root, entries["train"], True),
                         test=_split_of(image_root, entries["test"], True), split_rule=rule)


def _split_lists(spec: _FolderSpec, root: Path, domains: list[str]) -> dict[str, tuple[Path, Path]] | None:
    """The split list files of every domain, None if there are none; an error if only some exist."""
    if spec.list_files is None:
        return None
    found, seen_any = {}, False
    for d in domains:
        pair = []
        for fname in spec.list_files(d):
            hits = [root / sub / fname for sub in spec.list_dirs if (root / sub / fname).is_file()]
            pair.append(hits[0].resolve() if hits else None)
            seen_any |= bool(hits)
        if all(pair):
            found[d] = (pair[0], pair[1])
    if not seen_any:
        return None
    if len(found) != len(domains):
        lacking = [f"{d}: {' + '.join(spec.list_files(d))}" for d in domains if d not in found]
        raise _missing(root, spec.name, spec.layout, "incomplete split lists: give both list files for every "
                       f"domain (or none, for the seeded split); missing: {lacking}")
    return found


def _read_split_lists(lists, image_root: Path, where: dict, entries: dict, name: str, root: Path, layout: str):
    seen = {}
    for d, files in lists.items():
        for part, listfile in zip(("train", "test"), files):
            for lineno, line in enumerate(listfile.read_text(encoding="utf-8").splitlines(), 1):
                line = line.strip()
                if not line:
                    continue
                rel, _, last = line.rpartition(" ")
                if not rel or not last.lstrip("-").isdigit():
                    rel = line  # no trailing numeric label
                path = image_root / rel
                if path not in where:
                    raise _missing(root, name, layout, f"{listfile}:{lineno} lists {rel!r}, which is not a file "
                                   f"under {image_root}/<domain>/<class>/ (incomplete download?)")
                if path in seen:
                    raise ValueError(f"{name}: {rel!r} is listed twice ({seen[path]} and {listfile}:{lineno})")
                seen[path] = f"{listfile}:{lineno}"
                label, dom = where[path]
                entries[part].append((path, label, dom))


_FOLDERS = {
    "office-home": _FolderSpec(
        "office-home", "  ROOT/{Art,Clipart,Product,Real World}/<class>/<image files>  (65 classes per domain)",
        expected_domains=("Art", "Clipart", "Product", "Real World")),
    "office-31": _FolderSpec(
        "office-31", "  ROOT/{amazon,dslr,webcam}/images/<class>/<image files>  (images/ optional; 31 classes)",
        expected_domains=("amazon", "dslr", "webcam"), class_subdir="images"),
    "domainnet": _FolderSpec(
        "domainnet", "  ROOT/{clipart,infograph,painting,quickdraw,real,sketch}/<class>/<image files>\n"
        "  optional official split: ROOT/<domain>_train.txt and ROOT/<domain>_test.txt "
        "(lines '<domain>/<class>/<file> <label>')",
        expected_domains=("clipart", "infograph", "painting", "quickdraw", "real", "sketch"),
        list_files=lambda d: (f"{d}_train.txt", f"{d}_test.txt")),
    "pacs": _FolderSpec(
        "pacs", "  ROOT/[kfold/]{art_painting,cartoon,photo,sketch}/<class>/<image files>\n"
        "  optional official split: <domain>_train_kfold.txt and <domain>_crossval_kfold.txt in ROOT or "
        "ROOT/splits (lines '<domain>/<class>/<file> <label>', relative to the image folder)",
        expected_domains=("art_painting", "cartoon", "photo", "sketch"), image_root_subdir="kfold",
        list_files=lambda d: (f"{d}_train_kfold.txt", f"{d}_crossval_kfold.txt"), list_dirs=(".", "splits")),
    "digits": _FolderSpec(
        "digits", "  ROOT/<domain>/<class>/<image files>  or  ROOT/<domain>/{train,test}/<class>/<image files>\n"
        "  (domains e.g. MNIST, SVHN, USPS, SynthDigits, MNIST_M; classes 0..9)", split_dirs=True),
    "imagefolder": _FolderSpec(
        "imagefolder", "  ROOT/<domain>/<class>/<image files>  or  ROOT/<domain>/{train,test}/<class>/<image files>",
        split_dirs=True),
    "textfolder": _FolderSpec(
        "textfolder", "  ROOT/<domain>/<class>/<name>.txt  or  ROOT/<domain>/{train,test}/<class>/<name>.txt\n"
        "  (one UTF-8 text per file)", modality="text", split_dirs=True),
}


# --- Tiny-ImageNet ---------------------------------------------------------------------------------

TINY_LAYOUT = ("  ROOT/wnids.txt, ROOT/words.txt (optional: readable class names)\n"
               "  ROOT/train/<wnid>/images/<image files>\n"
               "  ROOT/val/val_annotations.txt ('<file>\\t<wnid>\\t...') and ROOT/val/images/<file>\n"
               "  (ROOT = the extracted tiny-imagenet-200 folder, or its parent)")


def tiny_imagenet(root: Path) -> SourceDataset:
    name = "tiny-imagenet"
    if (root / "tiny-imagenet-200").is_dir():
        root = root / "tiny-imagenet-200"
    for need in ("wnids.txt", "train", "val/val_annotations.txt", "val/images"):
        if not (root / need).exists():
            raise _missing(root, name, TINY_LAYOUT, f"{root / need} does not exist")
    wnids = sorted({w.strip() for w in (root / "wnids.txt").read_text().split() if w.strip()})
    cidx = {w: i for i, w in enumerate(wnids)}
    train = []
    for w in wnids:
        files = sorted(p for p in (root / "train" / w).rglob("*")
                       if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS) if (root / "train" / w).is_dir() else []
        if not files:
            raise _missing(root, name, TINY_LAYOUT, f"incomplete: no training images for class {w} "
                           f"under {root / 'train' / w / 'images'}")
        train += [(p, cidx[w], 0) for p in files]
    test = []
    ann = root / "val" / "val_annotations.txt"
    for lineno, line in enumerate(ann.read_text().splitlines(), 1):
        if not line.strip():
            continue
        cols = line.split("\t")
        if len(cols) < 2 or cols[1] not in cidx:
            raise ValueError(f"{name}: {ann}:{lineno} is not '<file>\\t<wnid>\\t...' with a wnid from wnids.txt")
        path = root / "val" / "images" / cols[0]
        if not path.is_file():
            raise _missing(root, name, TINY_LAYOUT, f"incomplete: {ann}:{lineno} names {path}, which does not exist")
        test.append((path, cidx[cols[1]], 0))
    if not test:
        raise _missing(root, name, TINY_LAYOUT, f"{ann} lists no validation images")
    words = {}
    if (root / "words.txt").is_file():
        for line in (root / "words.txt").read_text(encoding="utf-8").splitlines():
            w, _, names = line.partition("\t")
            words[w.strip()] = names.split(",")[0].strip()
    return SourceDataset(name=name, modality="image", root=str(root), class_names=wnids, domain_names=[],
                         train=_split_of(root, train, False), test=_split_of(root, test, False),
                         split_rule="the dataset's own split: train/ = train, val/ = test (the official "
                                    "test images have no labels)",
                         class_text_names=[words.get(w) or w for w in wnids])


# --- CIFAR -------------------------------------------------------------------------------------------

_CIFAR = {
    "cifar10": dict(folder="cifar-10-batches-py", train=[f"data_batch_{i}" for i in range(1, 6)],
                    test=["test_batch"], meta="batches.meta", names="label_names", labels="labels",
                    url="https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz", tv="CIFAR10"),
    "cifar100": dict(folder="cifar-100-python", train=["train"], test=["test"], meta="meta",
                     names="fine_label_names", labels="fine_labels",
                     url="https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz", tv="CIFAR100"),
}


class _CifarUnpickler(pickle.Unpickler):
    """The CIFAR batches are pickles: load them with only the globals that numpy arrays need, so
    a tampered file cannot run code."""

    ALLOWED = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
               ("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode")}

    def find_class(self, module, name):
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"global {module}.{name} is not allowed in a CIFAR batch")
        if module == "numpy.core.multiarray":
            module = "numpy._core.multiarray" if hasattr(np, "_core") else module
        return super().find_class(module, name)


def _unpickle(path: Path) -> dict:
    try:
        with open(path, "rb") as f:
            return _CifarUnpickler(io.BytesIO(f.read()), encoding="latin1").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError) as exc:
        raise ValueError(f"{path} is not a CIFAR python-version batch ({exc})") from None


def cifar(name: str, root: Path, *, download: bool = False) -> SourceDataset:
    spec = _CIFAR[name]
    folder = root if root.name == spec["folder"] else root / spec["folder"]
    layout = (f"  ROOT/{spec['folder']}/{{{','.join(spec['train'] + spec['test'] + [spec['meta']])}}}\n"
              f"  (extract {spec['url']} into ROOT, or pass --download)")
    needed = spec["train"] + spec["test"] + [spec["meta"]]
    if any(not (folder / f).is_file() for f in needed) and download:
        try:
            import torchvision.datasets as tvd
        except Exception as exc:  # a torchvision that does not match torch raises RuntimeError
            raise RuntimeError(f"{name}: --download uses torchvision, which did not import "
                               f"({type(exc).__name__}: {exc}); download {spec['url']} yourself and "
                               f"extract it into {root} (tar -xzf)") from None
        for train in (True, False):
            getattr(tvd, spec["tv"])(str(folder.parent), train=train, download=True)
    absent = [f for f in needed if not (folder / f).is_file()]
    if absent:
        raise _missing(root, name, layout, f"{folder} lacks {absent}")
    meta = _unpickle(folder / spec["meta"])
    class_names = [str(c) for c in meta[spec["names"]]]
    splits = {}
    for part in ("train", "test"):
        xs, ys = [], []
        for f in spec[part]:
            batch = _unpickle(folder / f)
            data = np.asarray(batch["data"], dtype=np.uint8)
            if data.ndim != 2 or data.shape[1] != 3072:
                raise ValueError(f"{folder / f}: data has shape {data.shape}, expected (n, 3072)")
            xs.append(data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))
            ys.append(np.asarray(batch[spec["labels"]], dtype=np.int64))
        pixels = np.ascontiguousarray(np.concatenate(xs))
        labels = np.concatenate(ys)
        if len(labels) != len(pixels) or labels.min() < 0 or labels.max() >= len(class_names):
            raise ValueError(f"{name}: {part} labels do not match the images or the {len(class_names)} classes")
        splits[part] = Split(items=ArrayImages(pixels), labels=labels, domains=None,
                             fingerprint=hashlib.sha256(pixels.tobytes()).hexdigest())
    return SourceDataset(name=name, modality="image", root=str(folder), class_names=class_names,
                         domain_names=[], train=splits["train"], test=splits["test"],
                         split_rule="the dataset's own split: the official train and test batches")


# --- registry ----------------------------------------------------------------------------------------

ADAPTERS = ("cifar10", "cifar100", "tiny-imagenet", "office-home", "office-31", "domainnet", "pacs",
            "digits", "imagefolder", "textfolder")


def _canonical(name: str) -> str:
    key = name.lower().replace("_", "").replace("-", "")
    for a in ADAPTERS:
        if a.replace("-", "") == key:
            return a
    raise ValueError(f"unknown dataset {name!r}; known: {', '.join(ADAPTERS)}")


def load_source(name: str, root, *, seed: int = 0, test_fraction: float = 0.2,
                domains: Sequence[str] | None = None, download: bool = False) -> SourceDataset:
    """The adapter ``name`` (see ``ADAPTERS``) applied to the folder ``root``.

    seed, test_fraction: the seeded stratified split (folder datasets without their own split);
    domains: use only these domain folders; download: fetch CIFAR through torchvision if absent.
    """
    name = _canonical(name)
    root = Path(root).expanduser().resolve()
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must lie in (0, 1), got {test_fraction}")
    if domains is not None and name not in _FOLDERS:
        raise ValueError(f"{name} has no domains to select (--domains is for the folder datasets)")
    if download and not name.startswith("cifar"):
        raise ValueError(f"--download is available for cifar10 and cifar100 only, not {name}")
    if name.startswith("cifar"):
        return cifar(name, root, download=download)
    if name == "tiny-imagenet":
        return tiny_imagenet(root)
    return _folder_source(_FOLDERS[name], root, seed=seed, test_fraction=test_fraction, domains=domains)
