"""A small terminal for tests of line-redrawing output (``halfcast watch``).

:class:`Screen` is a terminal of a fixed width that wraps like xterm (a character past the
last column goes to the next row) and understands the sequences a line-redrawing program
sends (``\\r``, ``\\n``, erase in line, cursor up); :class:`FakeTerminal` is a file that
says it is a terminal.
"""

from __future__ import annotations

import io
import re

CSI = re.compile(r"\x1b\[([?0-9;]*)([A-Za-z])")


class Screen:
    """The rows a terminal ``width`` columns wide shows after ``feed``; ``wraps`` counts automatic line wraps."""

    def __init__(self, width: int) -> None:
        self.width = width
        self.rows: list[list[str]] = [[]]
        self.row = self.col = self.wraps = 0
        self.pending_wrap = False

    def feed(self, text: str) -> None:
        """Play ``text``: printable characters, ``\\r``, ``\\n`` and CSI sequences (colours and cursor visibility ignored)."""
        position = 0
        while position < len(text):
            match = CSI.match(text, position)
            if match is not None:
                self._csi(match.group(1), match.group(2))
                position = match.end()
                continue
            self._char(text[position])
            position += 1

    def _char(self, char: str) -> None:
        if char == "\r":
            self.col, self.pending_wrap = 0, False
        elif char == "\n":
            self._down()
            self.col, self.pending_wrap = 0, False
        elif char.isprintable():
            if self.pending_wrap:
                self.wraps += 1
                self._down()
                self.col, self.pending_wrap = 0, False
            line = self.rows[self.row]
            line.extend(" " * (self.col + 1 - len(line)))
            line[self.col] = char
            if self.col == self.width - 1:
                self.pending_wrap = True  # xterm: the cursor stays in the last column until the next character
            else:
                self.col += 1

    def _down(self) -> None:
        self.row += 1
        if self.row == len(self.rows):
            self.rows.append([])

    def _csi(self, params: str, final: str) -> None:
        if final == "K":  # erase in line: 0 (default) to the end, 2 the whole line
            line = self.rows[self.row]
            self.rows[self.row] = [] if params == "2" else line[: self.col]
        elif final == "A":  # cursor up
            self.row = max(0, self.row - int(params or "1"))
        self.pending_wrap = False if final in "KA" else self.pending_wrap

    def lines(self) -> list[str]:
        """The rows, right-trimmed, without trailing empty rows."""
        rows = ["".join(row).rstrip() for row in self.rows]
        while rows and not rows[-1]:
            rows.pop()
        return rows


class FakeTerminal(io.StringIO):
    """What ``watch`` writes to, posing as a terminal."""

    def isatty(self) -> bool:
        return True
