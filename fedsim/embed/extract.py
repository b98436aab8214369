"""Embedding extraction: a ``SourceDataset`` through a frozen encoder into a fedsim dataset file.

Per split: look the embeddings up in the cache; on a miss, a DataLoader (worker processes read
and preprocess the items) feeds the encoder batch by batch, and every ``chunk_size`` rows are
written to the work folder ``<out>.work/`` (one ``.npy`` per chunk, atomically, plus a
``manifest.json`` saying what is being extracted); the finished split goes to the cache. Then the
splits are (optionally) L2-normalised, class-name text embeddings added, and the file written with
``save_dataset``; the work folder is removed.

Resume: an interrupted extraction leaves its complete chunks behind; the same command continues
from the first missing chunk. Chunk and batch boundaries depend only on the item index, so the
result equals an uninterrupted run. A work folder made with other settings is an error, never
mixed in.

Cache: ``<cache_dir>/embeddings/<key>.npy`` (+ ``.json`` describing it), key = sha256 of the
dataset name, split name, the split's item fingerprint (relative paths, sizes and mtimes, or the
pixels) and the encoder description (name = model + weights, its ``identity``, and the
preprocessing: ``repr(preprocess)`` for images). The cache holds raw embeddings; normalisation
and storage dtype are applied afterwards, so they never cause a second extraction.

Images and texts go through the same code: an image dataset needs an ``ImageEncoder`` (items are
opened with Pillow, converted to RGB and passed through ``encoder.preprocess`` in the workers);
a text dataset (``textfolder``) a ``TextEncoder`` (items are UTF-8 files, read in the workers).
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
from functools import partial
from importlib import metadata
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from .._io import atomic_write
from .._progress import progress_bar
from ..data import Dataset, save_dataset
from ..data.dataset import check_dataset_out
from ..data.split import unit_rows
from .datasets import SourceDataset, Split
from .encoders import ImageEncoder, TextEncoder

WORK_FORMAT = "fedsim-embed-work/1"
TEXT_RULE = "UTF-8 file contents, surrounding whitespace stripped"
SPLITS = ("train", "test")


def default_cache_dir() -> Path:
    """``$FEDSIM_CACHE``, else ``$XDG_CACHE_HOME/fedsim``, else ``~/.cache/fedsim``."""
    if os.environ.get("FEDSIM_CACHE"):
        return Path(os.environ["FEDSIM_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "fedsim"


def _save_npy(path: Path, array: np.ndarray) -> None:
    with atomic_write(path) as tmp, open(tmp, "wb") as f:
        np.save(f, array)


class EmbeddingCache:
    """Raw split embeddings by key: ``<root>/embeddings/<key[:2]>/<key>.npy`` + ``<key>.json``."""

    def __init__(self, root):
        self.root = Path(root).expanduser()

    def _path(self, key: str) -> Path:
        return self.root / "embeddings" / key[:2] / f"{key}.npy"

    def get(self, key: str, shape: tuple[int, int]) -> np.ndarray | None:
        path = self._path(key)
        if not path.is_file():
            return None
        try:
            x = np.load(path, allow_pickle=False)
        except (OSError, ValueError):
            return None  # unreadable entry: recompute (and overwrite it)
        return x if x.shape == shape and x.dtype == np.float32 else None

    def put(self, key: str, x: np.ndarray, info: dict) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        _save_npy(path, x)
        with atomic_write(path.with_suffix(".json")) as tmp:
            tmp.write_text(json.dumps(info, indent=1, sort_keys=True))


def describe_encoder(encoder, modality: str) -> dict:
    """Everything about the encoder that determines the embeddings (part of the cache key and the meta)."""
    if modality == "image":
        if not isinstance(encoder, ImageEncoder):
            raise TypeError(f"an image dataset needs an ImageEncoder (name, dim, identity, preprocess, "
                            f"encode(images)); got {type(encoder).__name__}")
        pre = repr(encoder.preprocess)
        if " at 0x" in pre:
            raise ValueError(f"repr(preprocess) of {encoder.name} names a memory address ({pre!r}); the "
                             "embedding cache keys on it, so give the transform a __repr__ listing its parameters")
        desc = {"preprocess": pre}
    elif modality == "text":
        if isinstance(encoder, ImageEncoder) or not isinstance(encoder, TextEncoder):
            raise TypeError(f"a text dataset needs a TextEncoder (name, dim, encode(texts)); got "
                            f"{type(encoder).__name__}")
        desc = {"text": TEXT_RULE}
    else:
        raise ValueError(f"unknown modality {modality!r}")
    return {"name": encoder.name, "dim": int(encoder.dim), **desc, **dict(getattr(encoder, "identity", {}) or {})}


def cache_key(source: SourceDataset, split: str, encoder_desc: dict) -> str:
    blob = json.dumps({"dataset": source.name, "split": split, "items": source.split(split).fingerprint,
                       "encoder": encoder_desc}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


# --- items -> batches (runs in DataLoader workers) ------------------------------------------------

def _load_image(item, preprocess):
    from PIL import Image

    try:
        if isinstance(item, (str, os.PathLike)):
            with Image.open(item) as im:
                image = im.convert("RGB")
        else:
            image = item.convert("RGB")
    except (OSError, ValueError) as exc:  # PIL.UnidentifiedImageError is an OSError
        raise ValueError(f"cannot read image {item}: {exc}") from None
    return preprocess(image)


def _load_text(item) -> str:
    if not isinstance(item, (str, os.PathLike)):
        raise TypeError(f"text items are file paths, got {type(item).__name__}")
    try:
        text = Path(item).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read text file {item}: {exc}") from None
    if not text:
        raise ValueError(f"text file {item} is empty")
    return text


class _Items(torch.utils.data.Dataset):
    def __init__(self, items: Sequence, start: int, load):
        self.items, self.start, self.load = items, start, load

    def __len__(self) -> int:
        return len(self.items) - self.start

    def __getitem__(self, i):
        return self.load(self.items[self.start + i])


# --- one split, resumable -------------------------------------------------------------------------

def _read_chunk(path: Path, rows: int, dim: int) -> np.ndarray | None:
    if not path.is_file():
        return None
    try:
        x = np.load(path, allow_pickle=False)
    except (OSError, ValueError):
        return None
    return x if x.shape == (rows, dim) and x.dtype == np.float32 else None


def encode_split(split: Split, encoder, modality: str, work: Path, tag: str, *, batch_size: int,
                 chunk_size: int, num_workers: int, progress: bool, desc: str) -> np.ndarray:
    """(n, dim) float32 raw embeddings of ``split``; complete chunks already in ``work`` are reused."""
    n, dim = len(split), int(encoder.dim)
    n_chunks = math.ceil(n / chunk_size)
    rows = lambda i: min(chunk_size, n - i * chunk_size)  # noqa: E731
    path = lambda i: work / f"{tag}-{i:06d}.npy"  # noqa: E731
    start = 0
    while start < n_chunks and _read_chunk(path(start), rows(start), dim) is not None:
        start += 1
    if start < n_chunks:
        if modality == "image":
            load, collate = partial(_load_image, preprocess=encoder.preprocess), torch.stack
        else:
            load, collate = _load_text, list
        device = getattr(encoder, "device", None)
        loader = torch.utils.data.DataLoader(
            _Items(split.items, start * chunk_size, load), batch_size=batch_size, shuffle=False,
            num_workers=num_workers, collate_fn=collate,
            pin_memory=isinstance(device, torch.device) and device.type == "cuda")
        chunk, buf, filled = start, [], 0
        with progress_bar(total=n, initial=start * chunk_size, desc=desc, unit="item",
                          enabled=progress) as bar:
            for batch in loader:
                b = len(batch)
                e = encoder.encode(batch) if modality == "image" else encoder.encode(batch, batch_size=b)
                e = torch.as_tensor(e).detach().to("cpu", torch.float32)
                if e.shape != (b, dim):
                    raise RuntimeError(f"{encoder.name} returned shape {tuple(e.shape)} for a batch of {b}, "
                                       f"expected ({b}, {dim})")
                if not bool(torch.isfinite(e).all()):
                    raise RuntimeError(f"{encoder.name} returned NaN/Inf embeddings in {desc}, items "
                                       f"{chunk * chunk_size + filled}..{chunk * chunk_size + filled + b - 1}")
                buf.append(e.numpy())
                filled += b
                bar.update(b)
                if filled == rows(chunk):
                    _save_npy(path(chunk), np.concatenate(buf))
                    chunk, buf, filled = chunk + 1, [], 0
        if chunk != n_chunks:
            raise RuntimeError(f"{desc}: the loader stopped after chunk {chunk} of {n_chunks}")
    return np.concatenate([_read_chunk(path(i), rows(i), dim) for i in range(n_chunks)])


# --- class-name text embeddings ----------------------------------------------------------------------

def class_text_embeddings(text_encoder, names: Sequence[str], prompts: Sequence[str]) -> np.ndarray:
    """(C, dim): per class, the mean of its L2-normalised prompt embeddings, L2-normalised (the
    usual zero-shot prompt ensemble; with one prompt simply its normalised embedding)."""
    if not prompts or any("{}" not in p for p in prompts):
        raise ValueError(f"prompts must be templates with a '{{}}' for the class name, got {list(prompts)}")
    per_prompt = [unit_rows(torch.as_tensor(text_encoder.encode([p.format(c) for c in names])).float().numpy(),
                             "class text") for p in prompts]
    return unit_rows(np.mean(per_prompt, axis=0), "class text")


# --- the whole dataset ------------------------------------------------------------------------------

def _versions() -> dict:
    out = {}
    for pkg in ("geomkern", "torch", "numpy", "pillow"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            pass
    return out


def _open_work(work: Path, manifest: dict) -> None:
    path = work / "manifest.json"
    if path.is_file():
        old = json.loads(path.read_text())
        if old != json.loads(json.dumps(manifest)):  # compare as JSON (tuples come back as lists)
            raise ValueError(
                f"{work} holds a partial extraction with other settings (dataset items, encoder, batch or "
                f"chunk size differ: it has {json.dumps(old, sort_keys=True)}); re-run with the settings it was "
                f"made with to resume it, or delete {work} to start over")
        return
    work.mkdir(parents=True, exist_ok=True)
    with atomic_write(path) as tmp:
        tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True))


def extract(source: SourceDataset, encoder, out, *, cache_dir=None, use_cache: bool = True,
            normalize: bool = True, dtype: str = "float32", batch_size: int = 256,
            chunk_size: int | None = None, num_workers: int | None = None, text_encoder=None,
            prompts: Sequence[str] = ("{}",), progress: bool = True, overwrite: bool = False) -> Dataset:
    """Embed ``source`` with ``encoder`` and write the dataset file ``out`` (.npz or .safetensors).

    normalize: L2-normalise every embedding (recorded as ``meta["normalised"]``); dtype: storage
    dtype, float32 or float16; chunk_size: rows per resumable chunk (a multiple of batch_size,
    default 16 batches); num_workers: DataLoader processes (default min(8, CPUs)); text_encoder +
    prompts: also store ``class_text`` (C, dim_text), the class names' prompt embeddings.
    Returns the dataset as written.
    """
    out = check_dataset_out(Path(out).expanduser(), overwrite=overwrite)
    if dtype not in ("float32", "float16"):
        raise ValueError(f"dtype must be float32 or float16, got {dtype!r}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    chunk_size = 16 * batch_size if chunk_size is None else chunk_size
    if chunk_size < batch_size or chunk_size % batch_size:
        raise ValueError(f"chunk_size ({chunk_size}) must be a positive multiple of batch_size ({batch_size}): "
                         "resuming relies on every chunk holding whole batches")
    if num_workers is None:
        num_workers = min(8, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
    enc_desc = describe_encoder(encoder, source.modality)
    keys = {s: cache_key(source, s, enc_desc) for s in SPLITS}
    cache = EmbeddingCache(cache_dir if cache_dir is not None else default_cache_dir()) if use_cache else None
    work = out.with_name(out.name + ".work")
    manifest = {"format": WORK_FORMAT, "encoder": enc_desc,
                "splits": {s: {"key": keys[s], "n": len(source.split(s)), "batch_size": batch_size,
                               "chunk_size": chunk_size} for s in SPLITS}}
    xs, hits = {}, {}
    for s in SPLITS:
        split = source.split(s)
        shape = (len(split), int(encoder.dim))
        x = cache.get(keys[s], shape) if cache else None
        hits[s] = x is not None
        if x is None:
            _open_work(work, manifest)
            x = encode_split(split, encoder, source.modality, work, s, batch_size=batch_size,
                             chunk_size=chunk_size, num_workers=num_workers, progress=progress,
                             desc=f"{source.name} {s}")
            if cache:
                cache.put(keys[s], x, {"dataset": source.name, "split": s, "root": source.root,
                                       "items": split.fingerprint, "n": len(split), "encoder": enc_desc})
        xs[s] = x
    if progress:
        for s in SPLITS:
            if hits[s]:
                print(f"{source.name} {s}: {len(source.split(s))} embeddings from the cache ({cache.root})")
    if normalize:
        xs = {s: unit_rows(x, f"{source.name} {s}") for s, x in xs.items()}
    store = torch.float16 if dtype == "float16" else torch.float32
    meta = {
        "description": f"{source.name} embedded with {encoder.name}",
        "source": {"dataset": source.name, "root": source.root, "modality": source.modality,
                   "split": source.split_rule, "items_sha256": {s: source.split(s).fingerprint for s in SPLITS},
                   "counts": source.counts()},
        "encoder": enc_desc,
        "normalised": bool(normalize),
        "dtype_on_disk": dtype,
        "builder": "fedsim embed (fedsim.embed.extract)",
        "versions": _versions(),
    }
    class_text = None
    if text_encoder is not None:
        ct = class_text_embeddings(text_encoder, source.class_text_names, prompts)
        class_text = torch.from_numpy(ct).to(store)
        meta["class_text"] = {"encoder": text_encoder.name, "dim": int(ct.shape[1]), "prompts": list(prompts),
                              "names": list(source.class_text_names),
                              "identity": dict(getattr(text_encoder, "identity", {}) or {}),
                              "rule": "per class: mean of the L2-normalised prompt embeddings, L2-normalised"}

    def split_arrays(s):
        sp = source.split(s)
        d = None if sp.domains is None else torch.from_numpy(sp.domains)
        return torch.from_numpy(xs[s]).to(store), torch.from_numpy(sp.labels), d

    x_train, y_train, d_train = split_arrays("train")
    x_test, y_test, d_test = split_arrays("test")
    ds = Dataset(name=out.stem, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test,
                 class_names=list(source.class_names), d_train=d_train, d_test=d_test,
                 domain_names=list(source.domain_names), meta=meta, class_text=class_text)
    save_dataset(ds, out)
    if work.is_dir():
        shutil.rmtree(work)
    return ds
