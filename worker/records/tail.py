"""Incremental reading of a run's ``records.jsonl`` (docs/architecture.md, "The run directory").

The trainer's rank 0 appends one JSON object per line and flushes per line. The
worker reads the file while it grows, so a read may end in the middle of a line:
:class:`RecordTail` keeps the byte offset of the first unread byte and only ever
returns complete lines; the partial rest is read again on the next call.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from halfcast.contracts.records import StepRecord, parse_record

log = logging.getLogger(__name__)

#: Bytes read per call at most, so one poll never loads a huge backlog at once.
DEFAULT_MAX_BYTES = 8 << 20


class RecordTail:
    """Reads the complete new lines of a JSON-lines file, call after call.

    ``path`` may not exist yet (the trainer has not started): :meth:`read_new`
    then returns ``[]``. A complete line that is not a JSON object is logged and
    skipped; it is never returned and never read again.
    """

    def __init__(self, path: Path, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.offset = 0

    def read_new(self) -> list[dict[str, object]]:
        """Return the JSON objects of every complete line written since the last call (as read: not validated).

        Returns at most ``max_bytes`` worth of lines; call again until it returns
        ``[]`` to drain a backlog (see :meth:`drain`).
        """
        size = self.max_bytes
        chunk = self._read_chunk(size)
        while b"\n" not in chunk and len(chunk) == size:
            size *= 2  # one line longer than max_bytes: read further rather than stall
            chunk = self._read_chunk(size)
        end = chunk.rfind(b"\n")
        if end < 0:
            return []
        complete = chunk[: end + 1]
        self.offset += len(complete)
        return [record for line in complete.splitlines() if (record := _parse(line)) is not None]

    def drain(self) -> list[dict[str, object]]:
        """Return every complete record not read yet, however many calls that takes."""
        records: list[dict[str, object]] = []
        while batch := self.read_new():
            records.extend(batch)
        return records

    def _read_chunk(self, size: int) -> bytes:
        try:
            with self.path.open("rb") as handle:
                handle.seek(self.offset)
                return handle.read(size)
        except FileNotFoundError:
            return b""


def step_records_up_to(path: Path, step: int) -> list[StepRecord]:
    """The step records of a finished run's ``records.jsonl`` with ``step <= step``, in step order.

    When a step appears more than once (a precision switch rewound and re-ran it) the last
    occurrence wins: it is the one the run continued from. ``[]`` when the file does not exist.
    """
    latest: dict[int, StepRecord] = {}
    for line in RecordTail(path).drain():
        if line.get("type") == "step" and isinstance(record := parse_record(line), StepRecord) and record.step <= step:
            latest[record.step] = record
    return [latest[number] for number in sorted(latest)]


def _parse(line: bytes) -> dict[str, object] | None:
    text = line.strip()
    if not text:
        return None
    try:
        record = json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError):
        log.warning("skipping a malformed record line: %.200r", text)
        return None
    if not isinstance(record, dict):
        log.warning("skipping a record line that is not a JSON object: %.200r", text)
        return None
    return record
