"""Reading log files in bounded memory: the last lines of a file, and new lines as they are written.

Lines are split on ``\\n`` (a trailing ``\\r`` is dropped) and decoded as UTF-8 with
invalid bytes replaced. A *partial* last line (no ``\\n`` yet: the writer is in the
middle of it) is handled explicitly: :func:`read_tail` can leave it out, and
:class:`LineFollower` holds it back until its newline arrives or :meth:`LineFollower.flush`
is called once the writer is done. Files are never loaded whole.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

#: Most bytes :func:`read_tail` reads from the end of a file (earlier lines are not returned).
MAX_TAIL_BYTES = 4 << 20
#: Block size when reading backwards from the end, bytes.
BLOCK_BYTES = 64 << 10
#: Most bytes :meth:`LineFollower.read` reads in one call (the rest is read by the next call).
CHUNK_BYTES = 1 << 20
#: A line longer than this (bytes) is cut into pieces of this size (bounds the held-back partial line).
MAX_LINE_BYTES = 64 << 10


def decode_line(raw: bytes) -> str:
    """One line's bytes as text: UTF-8 (invalid bytes replaced), without a trailing ``\\r``."""
    return raw.removesuffix(b"\r").decode("utf-8", errors="replace")


@dataclass(frozen=True)
class Tail:
    """The last lines of a file and ``end``, the byte offset just after the last line returned."""

    lines: list[str]
    end: int


def read_tail(path: Path, lines: int, *, complete_only: bool = False, max_bytes: int = MAX_TAIL_BYTES) -> Tail:
    """The last ``lines`` lines of ``path``, reading at most its last ``max_bytes`` bytes backwards.

    With ``complete_only`` a partial last line (no ``\\n`` yet) is left out and
    ``end`` is the offset after the last ``\\n``, where a :class:`LineFollower` can
    carry on; otherwise the partial line is the last one returned and ``end`` is the
    file's size. Fewer lines come back when the file has fewer, or when they do not
    fit in ``max_bytes`` (a line cut by that limit is dropped). Raises
    ``FileNotFoundError`` (and other ``OSError``) when the file cannot be read;
    ``ValueError`` for a negative ``lines``.
    """
    if lines < 0:
        raise ValueError(f"lines must be >= 0, not {lines}")
    with path.open("rb") as handle:
        size = handle.seek(0, os.SEEK_END)
        start, data = _read_backwards(handle, size, lines, max_bytes)
    end = size
    if complete_only:
        cut = data.rfind(b"\n") + 1
        end = start + cut
        data = data[:cut]
    pieces = data.split(b"\n")
    if pieces[-1] == b"":
        pieces.pop()  # the text ends with a newline: no partial line
    if start > 0 and pieces:
        pieces.pop(0)  # data starts one byte before the window: that piece is cut or only its newline
    return Tail([decode_line(piece) for piece in pieces[-lines:]] if lines else [], end)


def _read_backwards(handle: BinaryIO, size: int, lines: int, max_bytes: int) -> tuple[int, bytes]:
    """``(start, data)``: the file from ``start`` to its end, read in blocks from the end.

    Stops once the data holds more than ``lines`` newlines (enough for ``lines``
    whole lines), at the file's start, or past ``max_bytes``. When ``start > 0`` the
    data begins one byte early (the byte before the window), so a line starting
    exactly at the window's edge is recognised as whole.
    """
    limit = max(0, size - max_bytes)
    start, data = size, b""
    while start > limit and data.count(b"\n") <= lines:
        step = min(BLOCK_BYTES, start - limit)
        start -= step
        handle.seek(start)
        data = handle.read(step) + data
    if start > 0:
        handle.seek(start - 1)
        data = handle.read(1) + data
        start -= 1
    return start, data


def _cut(raw: bytes) -> list[bytes]:
    """``raw`` in pieces of at most :data:`MAX_LINE_BYTES` (one piece, possibly empty, when it fits)."""
    if len(raw) <= MAX_LINE_BYTES:
        return [raw]
    return [raw[i : i + MAX_LINE_BYTES] for i in range(0, len(raw), MAX_LINE_BYTES)]


class LineFollower:
    """New complete lines of a growing file, read from ``offset`` on (``tail -f`` without the loop).

    :meth:`read` returns the lines completed since the last call, reading at most
    :data:`CHUNK_BYTES` per call (``behind`` tells whether more was already there);
    a missing file reads as no lines (it may not exist yet). The partial last line is
    held back (at most :data:`MAX_LINE_BYTES`; a longer one is passed on in pieces)
    until its newline arrives or :meth:`flush` releases it.
    """

    def __init__(self, path: Path, offset: int = 0) -> None:
        self.path = path
        self.offset = offset
        self.behind = False
        self._partial = b""

    def read(self) -> list[str]:
        """Lines completed since the last call (oldest first). Raises ``OSError`` other than a missing file."""
        try:
            with self.path.open("rb") as handle:
                handle.seek(self.offset)
                data = handle.read(CHUNK_BYTES)
                self.behind = len(data) == CHUNK_BYTES
        except FileNotFoundError:
            self.behind = False
            return []
        self.offset += len(data)
        pieces = (self._partial + data).split(b"\n")
        self._partial = pieces.pop()
        while len(self._partial) > MAX_LINE_BYTES:
            pieces.append(self._partial[:MAX_LINE_BYTES])
            self._partial = self._partial[MAX_LINE_BYTES:]
        return [decode_line(cut) for piece in pieces for cut in _cut(piece)]

    def flush(self) -> list[str]:
        """The held-back partial last line (once the writer is done), or nothing."""
        partial, self._partial = self._partial, b""
        return [decode_line(partial)] if partial else []
