"""The one way fedsim writes a file that must never be seen half-written (checkpoints, results,
datasets, embedding chunks): write a temporary sibling, then rename it over the target."""
from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

TMP_SUFFIX = ".tmp"


@contextmanager
def atomic_write(path) -> Iterator[Path]:
    """Yields a temporary path next to ``path`` to write to; on success it replaces ``path`` in one
    rename (atomic on POSIX within a file system), on an exception it is removed and ``path`` is
    left as it was.

        with atomic_write(out / "results.json") as tmp:
            tmp.write_text(text)
    """
    path = Path(path)
    tmp = path.with_name(path.name + TMP_SUFFIX)
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
