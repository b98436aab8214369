"""The one way fedsim writes a file that must never be seen half-written (checkpoints, results,
datasets, embedding chunks): write a temporary sibling, flush it to the disk, then rename it over
the target and flush the folder."""
from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

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
