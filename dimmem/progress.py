"""Progress on long work, readable where it lands: tqdm's bar on a terminal, and off one (a log file, CI)
a plain line every `LOG_EVERY` seconds and at the end, instead of carriage returns or nothing."""

from __future__ import annotations

import sys

from tqdm import tqdm

LOG_EVERY = 30.0  # seconds between progress lines off a terminal


class _Lines(tqdm):
    """tqdm that writes each refresh as a line of its own, once there is progress to tell."""

    def display(self, msg: str | None = None, pos: int | None = None) -> bool:
        if not self.n:  # the 0% line at the start, or a bar closed by an error before any step
            return True
        self.fp.write((msg or str(self)).strip() + "\n")
        self.fp.flush()
        return True


def progress(iterable=None, *, enabled: bool = True, **kwargs) -> tqdm:
    """A progress bar (tqdm's arguments: desc, unit, total, ...): a bar on a terminal, periodic lines
    elsewhere, nothing when not `enabled`."""
    if not enabled:
        return tqdm(iterable, disable=True, **kwargs)
    if sys.stderr.isatty():
        return tqdm(iterable, **kwargs)
    return _Lines(iterable, file=sys.stderr, mininterval=LOG_EVERY, maxinterval=LOG_EVERY * 4, **kwargs)
