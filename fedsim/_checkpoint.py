"""A (method, seed)'s checkpoint: written after every round, verified before a resume trusts it.

``checkpoint.pt`` is a ``torch.save`` dict read back with ``weights_only=True`` (tensors, numbers,
strings, lists and dicts only: a pickle payload is never executed). Besides the round's state it
carries a format marker and version, a fingerprint of the run's configuration (all of it but the
number of rounds, plus the method and seed it belongs to) and a checksum of the dataset. A resume
refuses a checkpoint that is unreadable (truncated, garbage, a pickle payload), of another format
version, of another configuration or dataset, or whose weights or history are not finite, and says
which file and what to do.
"""
from __future__ import annotations

import hashlib
import json
import math
import pickle
from pathlib import Path

import torch

from ._io import atomic_write

FORMAT = "fedsim.checkpoint"
VERSION = 1
# configuration keys a resume may change without invalidating the checkpoints (plugins.RESUMABLE)
_NOT_FINGERPRINTED = ("rounds",)
# RunConfig keys added after checkpoints of this version were first written, each with the value
# that runs as the run folders from before it did (no validation rows, no tuning): left out of the
# fingerprint at that value, so such a folder still resumes (config.read_config_json
# gives its config.json that value)
_ADDED = {"val_fraction": 0.0, "tune_lr": [], "tune_epochs": []}


class CheckpointError(ValueError):
    """A checkpoint a resume cannot trust."""


def fingerprint(cfg, method: str, seed: int, *, data: str | None = None) -> str:
    """sha256 of the configuration (without the number of rounds), the method's name and the seed;
    ``data``: what a method trains on where the configuration alone does not say it (the
    centralised row's pooled client views, runner.run_method)."""
    c = {k: v for k, v in cfg.to_dict().items()
         if k not in _NOT_FINGERPRINTED and not (k in _ADDED and v == _ADDED[k])}
    key = {"config": c, "method": method, "seed": seed, **({"data": data} if data else {})}
    text = json.dumps(key, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()


def _hash_tensor(h, name: str, t: torch.Tensor) -> None:
    t = t.detach().cpu().contiguous()
    h.update(f"{name}:{t.dtype}:{tuple(t.shape)}:".encode())
    h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")


def dataset_checksum(ds) -> str:
    """sha256 of the dataset's arrays (names, dtypes, shapes, bytes) and class names. A
    PersonalDataset (``clients``) hashes every client's four arrays and feature-space name."""
    h = hashlib.sha256()
    if hasattr(ds, "clients"):
        for i, c in enumerate(ds.clients):
            for name in ("x_train", "y_train", "x_test", "y_test"):
                _hash_tensor(h, f"client{i}.{name}", getattr(c, name))
            h.update(f"client{i}.space:{c.space}:{c.n_classes}:".encode())
    else:
        for name in ("x_train", "y_train", "x_test", "y_test", "d_train", "d_test", "class_text"):
            t = getattr(ds, name)
            if t is not None:
                _hash_tensor(h, name, t)
    h.update(json.dumps(list(ds.class_names)).encode())
    return h.hexdigest()


def save(path: Path, state: dict, *, fingerprint: str, dataset: str) -> None:
    with atomic_write(path) as tmp:
        torch.save({"format": FORMAT, "version": VERSION, "fingerprint": fingerprint, "dataset": dataset,
                    **state}, tmp)


def _unreadable(exc: BaseException) -> str:
    # torch's own messages advise weights_only=False, i.e. running the file's code: never repeated
    if isinstance(exc, pickle.UnpicklingError) and "global" in str(exc).lower():  # "Unsupported global", "GLOBAL x.y"
        return "it names code to run (a pickle payload, not tensors and numbers), so it was not loaded"
    return f"it is truncated or not a checkpoint file ({type(exc).__name__} while reading it)"


def _finite(obj) -> bool:
    """Every float tensor and float in a nested dict/list is finite."""
    if isinstance(obj, torch.Tensor):
        return not obj.is_floating_point() or bool(torch.isfinite(obj).all())
    if isinstance(obj, float):
        return math.isfinite(obj)
    if isinstance(obj, dict):
        return all(_finite(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return all(_finite(v) for v in obj)
    return True


def load(path: Path, *, fingerprint: str, dataset: str, template: dict | None, rounds: int, device, redo: str,
         weights: tuple[str, ...] = ("global",)) -> dict:
    """The verified state of ``path``. ``template`` is the model's state_dict (keys, shapes, dtypes
    the weights must have; None for the personalised path, whose per-client models differ in
    shape); ``rounds`` the run's number of rounds; ``redo`` says how to recover (it ends every
    error); ``weights`` the state's keys that hold model weights (the personalised path's
    "personal" and "shared")."""
    def bad(why: str):
        raise CheckpointError(f"cannot resume from {path}: {why}; {redo}")

    try:
        state = torch.load(path, weights_only=True, map_location=device)
    except Exception as exc:  # noqa: BLE001 - torch raises many types for a damaged file
        bad(_unreadable(exc))
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        bad("it is not a fedsim checkpoint (no format marker: written by another program or an older fedsim)")
    if state.get("version") != VERSION:
        bad(f"it has checkpoint format version {state.get('version')!r}; this fedsim reads version {VERSION}")
    if state.get("fingerprint") != fingerprint:
        bad("it belongs to another configuration, method or seed than this run folder's config.json")
    if state.get("dataset") != dataset:
        bad("it was written for other data: the dataset's checksum differs (the dataset file changed since); "
            "restore the dataset it was run on")
    r, history, glob = state.get("round"), state.get("history"), state.get("global")
    if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r <= rounds:
        bad(f"its round {r!r} is not a round of this run (0 to {rounds})")
    if not isinstance(history, list) or len(history) != r or not all(isinstance(h, dict) for h in history):
        bad(f"its history does not hold one entry per round ({r})")
    if template is not None and (not isinstance(glob, dict) or set(glob) != set(template) or any(
            not isinstance(glob[k], torch.Tensor) or glob[k].shape != template[k].shape
            or glob[k].dtype != template[k].dtype for k in template)):
        bad("its model weights do not fit this run's model")
    if any(not isinstance(state.get(w), (dict, list)) for w in weights):
        bad(f"it lacks the model weights ({', '.join(weights)})")
    if not isinstance(state.get("algorithm"), dict) or not isinstance(state.get("timings"), dict):
        bad("it lacks the algorithm state or the timings")
    for what in (*weights, "algorithm", "history"):
        if not _finite(state[what]):
            bad(f"its {'model weights' if what in weights else what} hold NaN/Inf values")
    return state


def discard_unstarted(out: Path, created: list[Path]) -> None:
    """After a fresh run failed before any round was checkpointed: remove what it wrote (config.json,
    its empty run folders, and the folders it created), so the same --out can be used again."""
    if any(out.glob("runs/*/checkpoint.pt")):
        return
    (out / "config.json").unlink(missing_ok=True)
    runs = out / "runs"
    if runs.is_dir():
        for d in runs.iterdir():
            if d.is_dir() and not any(d.iterdir()):
                d.rmdir()
        if not any(runs.iterdir()):
            runs.rmdir()
    for d in created:  # deepest first
        if d.is_dir() and not any(d.iterdir()):
            d.rmdir()
