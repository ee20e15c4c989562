"""The one progress bar of pyprefill's long steps (model load, fp16 prewarm, writing a synthetic
model): tqdm counting bytes in scaled units on stderr, off when the caller says so or when stderr
is not a terminal (so logs and CI output stay clean)."""
from __future__ import annotations

from typing import Callable

from tqdm import tqdm


def byte_bar(total: int, desc: str, enabled: bool = True) -> tqdm:
    """A tqdm bar over `total` bytes (B, KiB, MiB, ... with unit_divisor 1024). disable=None
    lets tqdm turn itself off when its stream, stderr, is not a TTY."""
    return tqdm(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024,
                disable=None if enabled else True)


class StageBars:
    """The library's progress callback (stage, done, total bytes) as one bar per stage.

    A bar opens at a stage's first report and closes when done reaches total; the next report of
    a stage opens a new bar (the library reports "load", then "prewarm" at load and again at each
    Model.prewarm()). Nothing is created when `enabled` is False."""

    def __init__(self, enabled: bool = True, make_bar: Callable[[int, str], tqdm] = byte_bar):
        self.enabled = enabled
        self._make_bar = make_bar
        self._stage: str | None = None
        self._bar = None

    def __call__(self, stage: str, done: int, total: int) -> None:
        if not self.enabled:
            return
        if self._bar is None or stage != self._stage:
            self.close()
            self._stage, self._bar = stage, self._make_bar(total, stage)
        self._bar.update(done - self._bar.n)
        if done >= total:
            self.close()

    def close(self) -> None:
        """Closes the open bar, if any (a load that failed half way leaves one open)."""
        if self._bar is not None:
            self._bar.close()
        self._stage, self._bar = None, None
