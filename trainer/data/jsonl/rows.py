"""Rows of a JSON-lines or CSV dataset file, read streaming, each with its physical line number.

JSON lines: one JSON object per line; blank lines are skipped; a UTF-8 byte-order
mark at the start and CRLF line ends are accepted. CSV: a header row, then one row per
record (quoted fields may span lines; a row's line is the one it starts on); blank
lines are skipped. Every problem is a :class:`TrainerError` (``data_unavailable``)
naming the file, the 1-based line and, where one is at fault, the field.
"""

from __future__ import annotations

import codecs
import csv
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

from halfcast.contracts.status import FailureReason
from trainer.data.sources import open_data_file
from trainer.errors import TrainerError

_BOM = codecs.BOM_UTF8
#: Longest CSV field accepted (set as the csv module's process-wide limit when a CSV is read).
CSV_FIELD_LIMIT = 1 << 30


@dataclass(frozen=True)
class Row:
    """One record: the file it came from (as given in the spec), its first line, its fields."""

    file: str
    line: int
    fields: dict[str, object]


class RowError(TrainerError):
    """A bad row (``data_unavailable``), with the ``line``, the ``field`` at fault (``None``: the row
    itself) and ``what`` is wrong, so the API can name them in its ``422`` (``POST /datasets``)."""

    def __init__(self, file: str, line: int, field: str | None, what: str) -> None:
        where = f"file {file}, line {line}: " + (f"field {field}: " if field is not None else "")
        super().__init__(FailureReason.DATA_UNAVAILABLE, where + what)
        self.file = file
        self.line = line
        self.field = field
        self.what = what


def row_error(file: str, line: int, field: str | None, what: str) -> RowError:
    """``data_unavailable``: ``file <file>, line <line>: field <field>: <what>`` (no field part when ``None``)."""
    return RowError(file, line, field, what)


def read_rows(relative: str, file_format: str, max_bytes: int) -> Iterator[Row]:
    """The rows of the data file ``relative`` (under a data root), in file order.

    ``file_format`` is ``"jsonl"`` or ``"csv"``. Raises :class:`TrainerError`
    (``data_unavailable``) for a path outside the roots, a file over ``max_bytes``, or a
    malformed line; and when the file holds no row at all.
    """
    with open_data_file(relative, max_bytes) as handle:
        yield from rows_of(relative, handle, file_format)


def rows_of(file: str, handle: BinaryIO, file_format: str, max_line_bytes: int | None = None) -> Iterator[Row]:
    """The rows of the open data file ``handle`` (named ``file`` in errors), in file order.

    ``max_line_bytes`` bounds each physical line (a longer one is a :class:`RowError`, so an
    untrusted file without newlines is never read into memory whole; the API's upload check
    sets it). Raises :class:`RowError` for a malformed line and :class:`TrainerError` when
    the file holds no row at all (both ``data_unavailable``).
    """
    lines = _lines(file, handle, max_line_bytes)
    rows = _jsonl_rows(file, lines) if file_format == "jsonl" else _csv_rows(file, lines)
    count = 0
    for row in rows:
        count += 1
        yield row
    if count == 0:
        raise TrainerError(FailureReason.DATA_UNAVAILABLE, f"dataset file {file!r} holds no rows")


def _raw_lines(file: str, handle: BinaryIO, max_line_bytes: int | None) -> Iterator[bytes]:
    if max_line_bytes is None:
        yield from handle
        return
    number = 0
    while raw := handle.readline(max_line_bytes + 1):
        number += 1
        if len(raw) > max_line_bytes:
            raise row_error(file, number, None, f"the line is longer than {max_line_bytes} bytes")
        yield raw


def _lines(file: str, handle: BinaryIO, max_line_bytes: int | None = None) -> Iterator[tuple[int, str]]:
    """``(line number, text)`` of each physical line, its line end kept; a leading UTF-8 BOM dropped.

    Decoded line by line, so a byte that is not UTF-8 is reported at its own line.
    """
    for number, raw in enumerate(_raw_lines(file, handle, max_line_bytes), start=1):
        if number == 1 and raw.startswith(_BOM):
            raw = raw[len(_BOM) :]
        try:
            yield number, raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise row_error(file, number, None, f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def _jsonl_rows(file: str, lines: Iterator[tuple[int, str]]) -> Iterator[Row]:
    for number, text in lines:
        if text.strip():
            yield Row(file, number, _json_object(file, number, text))


def _json_object(file: str, number: int, text: str) -> dict[str, object]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        hint = (
            " (a JSON array file is not JSON lines: write one object per line)" if text.lstrip().startswith("[") else ""
        )
        raise row_error(file, number, None, f"invalid JSON: {exc.msg} at column {exc.colno}{hint}") from None
    except RecursionError:
        raise row_error(file, number, None, "invalid JSON: nested too deep") from None
    except ValueError as exc:  # an integer of more than sys.get_int_max_str_digits() digits
        raise row_error(file, number, None, f"invalid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise row_error(file, number, None, f"expected a JSON object, got {json_type(value)}")
    return value


def _csv_rows(file: str, lines: Iterator[tuple[int, str]]) -> Iterator[Row]:
    csv.field_size_limit(CSV_FIELD_LIMIT)  # process-wide; the default (128 KiB) is too small for documents
    reader = csv.reader((text for _, text in lines), strict=True)
    header: list[str] | None = None
    while True:
        start = reader.line_num + 1
        try:
            cells = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            raise row_error(file, start, None, f"malformed CSV: {exc}") from None
        if not cells:
            continue
        if header is None:
            header = _csv_header(file, start, cells)
            continue
        if len(cells) != len(header):
            raise row_error(file, start, None, f"{len(cells)} fields, the header has {len(header)}")
        yield Row(file, start, dict(zip(header, cells, strict=True)))


def _csv_header(file: str, line: int, cells: list[str]) -> list[str]:
    names = [cell.strip() for cell in cells]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise row_error(file, line, duplicates[0], "column appears twice in the CSV header")
    return names


def json_type(value: object) -> str:
    """The JSON name of ``value``'s type (``string``, ``number``, ``array``, ...)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"
