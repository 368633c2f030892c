"""A progress bar on stderr for uploads of more than a few MB (``halfcast datasets upload``, ``models upload``).

On a terminal the bar is redrawn in place (``\\r``); piped, one line is written per tenth of the
upload, so a log shows it moving without a flood. Uploads under :data:`MIN_BYTES` show none.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import TextIO

from halfcast.cli.checkpoints import format_size

#: Uploads smaller than this get no bar.
MIN_BYTES = 4 << 20
#: Width of the bar in characters.
WIDTH = 30


@dataclass
class UploadProgress:
    """``progress(sent, total)`` for :class:`halfcast.client.HalfcastClient` uploads, drawing on ``stream``."""

    what: str
    stream: TextIO = field(default_factory=lambda: sys.stderr)
    started: float = field(default_factory=time.monotonic)
    _tenths: int = -1
    _drawn: bool = False

    def __call__(self, sent: int, total: int) -> None:
        if total < MIN_BYTES:
            return
        if self.stream.isatty():
            self._redraw(sent, total)
        elif (tenth := sent * 10 // total) > self._tenths:
            self._tenths = tenth
            self.stream.write(self._line(sent, total) + "\n")

    def _line(self, sent: int, total: int) -> str:
        done = sent * WIDTH // total
        rate = sent / max(time.monotonic() - self.started, 1e-6)
        bar = "#" * done + "-" * (WIDTH - done)
        amount = f"{format_size(sent)} of {format_size(total)} ({format_size(int(rate))}/s)"
        return f"{self.what} [{bar}] {sent * 100 // total:3d}% {amount}"

    def _redraw(self, sent: int, total: int) -> None:
        self.stream.write("\r" + self._line(sent, total))
        self._drawn = True
        if sent >= total:
            self.stream.write("\n")
            self._drawn = False
        self.stream.flush()

    def close(self) -> None:
        """End a bar left mid-line (an upload that failed)."""
        if self._drawn:
            self.stream.write("\n")
            self._drawn = False
