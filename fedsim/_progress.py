"""The one progress indicator of fedsim's long loops (rounds, clients, demo stages, extraction).

On a terminal it is a tqdm bar. When the stream is not a terminal (a log file, CI, a pipe),
tqdm's redraws would land in the log as hundreds of carriage-return lines, so it writes plain
lines instead: one when the loop starts, then one whenever another 10% of the total is done or
``interval`` seconds have passed since the last line (whichever comes first), and one at the end.
A loop of any length thus writes at most about 12 + (its duration / interval) lines.
"""
from __future__ import annotations

import sys
import time
from typing import Iterable, TextIO


class _LogLines:
    """The non-terminal stand-in for tqdm: the subset fedsim uses (iterate, update, set_postfix,
    close, context manager)."""

    def __init__(self, iterable, *, total, initial, desc, unit, stream, interval, silent):
        self._iterable = iterable
        self.total = total
        self.n = initial
        self._desc, self._unit, self._stream = desc, unit, stream
        self._interval, self._silent = interval, silent
        self._postfix = ""
        self._t0 = time.monotonic()
        self._last_t, self._last_n = self._t0, initial
        self._closed = False
        self._line()

    def _line(self) -> None:
        if self._silent:
            return
        done = f"{self.n}/{self.total}" if self.total else f"{self.n}"
        pct = f" ({100 * self.n / self.total:.0f}%)" if self.total else ""
        elapsed = time.monotonic() - self._t0
        prefix = f"{self._desc}: " if self._desc else ""
        unit = self._unit if self.n == 1 else self._unit + "s"
        self._stream.write(f"{prefix}{done} {unit}{pct}, {elapsed:.1f} s{self._postfix}\n")
        self._stream.flush()

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.monotonic()
        step = self.total / 10 if self.total else None
        if now - self._last_t >= self._interval or (step and self.n - self._last_n >= step):
            self._last_t, self._last_n = now, self.n
            if not (self.total and self.n >= self.total):  # the end line comes from close()
                self._line()

    def set_postfix(self, **kw) -> None:
        self._postfix = "".join(f", {k}={v}" for k, v in kw.items())

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._line()

    def __iter__(self):
        try:
            for item in self._iterable:
                yield item
                self.update()
        finally:
            self.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def progress_bar(iterable: Iterable | None = None, *, total: int | None = None, initial: int = 0,
             desc: str = "", unit: str = "it", enabled: bool = True, nested: bool = False,
             stream: TextIO | None = None, interval: float = 30.0):
    """A progress bar over ``iterable`` (or advanced by hand with ``update(n)`` when None).

    On a terminal the bar is transient (erased when done: the caller prints the results).
    ``nested``: an inner loop of another bar's loop; in a log it writes nothing (a set of lines
    per outer step would flood it). ``stream`` defaults to stderr; ``enabled=False`` shows nothing.
    """
    stream = sys.stderr if stream is None else stream
    if total is None and hasattr(iterable, "__len__"):
        total = len(iterable)
    isatty = getattr(stream, "isatty", None)
    if enabled and isatty is not None and isatty():
        from tqdm import tqdm

        return tqdm(iterable, total=total, initial=initial, desc=desc, unit=unit, file=stream,
                    leave=False, dynamic_ncols=True)
    return _LogLines(iterable, total=total, initial=initial, desc=desc, unit=unit, stream=stream,
                     interval=interval, silent=not enabled or nested)
