"""The one way fedsim writes a file that must never be seen half-written (checkpoints, results,
datasets, embedding chunks): write a temporary sibling, flush it to the disk, then rename it over
the target and flush the folder; and the one way it writes a run's JSON files (``json_text``)."""
from __future__ import annotations

import json
import math
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from .config import ConfigError

TMP_SUFFIX = ".tmp"


def _fsync(path: Path, *, folder: bool = False) -> None:
    fd = os.open(path, os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if folder else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_write(path) -> Iterator[Path]:
    """Yields a temporary path next to ``path`` to write to; on success it replaces ``path`` in one
    rename (atomic on POSIX within a file system), on an exception it is removed and ``path`` is
    left as it was. The temporary file is fsynced before the rename and the folder after it: a
    rename can reach the disk before the data it names, so without the first a power loss could
    leave ``path`` renamed but empty, and without the second the rename itself could be lost.

        with atomic_write(out / "results.json") as tmp:
            tmp.write_text(text)
    """
    path = Path(path)
    tmp = path.with_name(path.name + TMP_SUFFIX)
    try:
        yield tmp
        _fsync(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if os.name == "posix":  # a folder cannot be opened for fsync on Windows
        _fsync(path.parent, folder=True)


def check_can_create(path, flag: str) -> None:
    """Raise ValueError naming ``flag`` unless ``path`` (a file or folder that may not exist yet) can
    be made: its nearest existing ancestor is a writable folder, and neither ``path`` nor a missing
    folder above it is a symbolic link to nothing: such a name exists as a link but not as a folder
    or file, so a mkdir under it fails with "File exists", and a rename onto it replaces the link
    instead of writing where it points."""
    path = Path(path)
    p = path
    while not p.exists():
        if p.is_symlink():
            raise ValueError(f"{flag} {path}: {p} is a symbolic link to {os.readlink(p)}, which does not exist; "
                             f"remove the link (or make what it points to), or name another {flag}")
        p = p.parent
    if p != path:
        if not p.is_dir():
            raise ValueError(f"{flag} {path}: {p} is a file, so no folder can be made under it")
        if not os.access(p, os.W_OK | os.X_OK):
            raise ValueError(f"{flag} {path}: the folder {p} is not writable")


def check_out(out, *, resume: bool) -> Path:
    """``--out`` (or ``--resume``'s folder) can hold a run: a folder, or a path whose nearest
    existing ancestor is a writable folder; else a ConfigError naming the flag."""
    flag = "--resume" if resume else "--out"
    out = Path(out)
    if resume:
        if not out.is_dir():
            raise ConfigError(f"{flag} {out}: {'it is a file, not' if out.exists() else 'there is no'} "
                              "run folder there")
        return out
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{flag} {out} is an existing file; name a folder (new or holding no run)")
    if out.is_dir() and not os.access(out, os.W_OK | os.X_OK):
        raise ConfigError(f"{flag} {out}: the folder is not writable")
    try:
        check_can_create(out, flag)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return out


def remove_stale_tmp(folder) -> list[Path]:
    """Delete the ``*.tmp`` files an interrupted :func:`atomic_write` left under ``folder`` (a
    process killed between writing and renaming); returns what was removed. Their targets still
    hold the last complete version."""
    removed = []
    for p in sorted(Path(folder).rglob("*" + TMP_SUFFIX)):
        if p.is_file():
            p.unlink(missing_ok=True)
            removed.append(p)
    return removed


def json_text(obj) -> str:
    """``obj`` as strict JSON text (indented) for a run's files (config.json, results.json,
    timings.json). JSON has no infinity, and Python's own ``Infinity`` token is refused by strict
    readers (jq, JavaScript), so an infinite float, which a configuration may hold (fedmc's
    ``epsilon`` and ``epsilon_total`` accept inf: no DP noise), is written as the string "inf"
    (or "-inf"); ``config.read_config_json`` turns it back into a float. NaN has no
    meaning in these files: it raises ValueError."""
    def encode(v):
        if isinstance(v, float) and math.isinf(v):
            return str(v)
        if isinstance(v, dict):
            return {k: encode(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [encode(x) for x in v]
        return v

    return json.dumps(encode(obj), indent=2, allow_nan=False)
