"""Typed examples from rows: the fields each ``jsonl`` format reads, renamed and checked.

A row's fields are first renamed by ``column_map`` (file name -> format field); then
each format takes its fields, and any missing field, wrong type or bad value is a
:func:`~trainer.data.jsonl.rows.row_error` naming the file, line and field. Fields
a format does not read are ignored.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from trainer.data.jsonl.rows import Row, json_type, row_error

#: Roles a chat message may have.
CHAT_ROLES = ("system", "user", "assistant", "tool")
_CSV_INTEGER = re.compile(r"[0-9]+")
#: Highest class id a label may hold: a classification head has at most 65,536 classes (``num_labels``).
MAX_CLASS_ID = 65_535


@dataclass(frozen=True)
class TextExample:
    line: int
    text: str


@dataclass(frozen=True)
class InstructionExample:
    line: int
    instruction: str
    input: str
    output: str


@dataclass(frozen=True)
class ChatExample:
    """``messages``: the row's messages as given (each with a known ``role`` and a string ``content``)."""

    line: int
    messages: tuple[dict[str, object], ...]


@dataclass(frozen=True)
class ClassificationExample:
    """``label``: an integer class id, or a class name still to be mapped to one."""

    line: int
    text: str
    label: int | str


Example = TextExample | InstructionExample | ChatExample | ClassificationExample


def parse_row(row: Row, fmt: str, column_map: Mapping[str, str], *, csv: bool) -> Example:
    """The example of format ``fmt`` (the config's ``format``) in ``row``, fields renamed by ``column_map``.

    ``csv``: the row came from a CSV file (every value is a string; a label of decimal
    digits is an integer class id). Raises ``data_unavailable`` for a bad row.
    """
    fields = _renamed(row, column_map)
    reader = _FieldReader(row, fields)
    if fmt == "text":
        return TextExample(row.line, reader.text("text"))
    if fmt == "instruction":
        return InstructionExample(
            row.line, reader.text("instruction"), reader.text("input", optional=True), reader.text("output")
        )
    if fmt == "chat":
        return ChatExample(row.line, reader.messages("messages"))
    return ClassificationExample(row.line, reader.text("text"), reader.label("label", csv=csv))


def _renamed(row: Row, column_map: Mapping[str, str]) -> dict[str, object]:
    fields = {name: value for name, value in row.fields.items() if name not in column_map}
    for source, target in column_map.items():
        if source not in row.fields:
            continue
        if target in fields:
            raise row_error(row.file, row.line, target, f"given both as {source!r} (column_map) and as {target!r}")
        fields[target] = row.fields[source]
    return fields


@dataclass(frozen=True)
class _FieldReader:
    """Typed access to one row's (renamed) fields; every failure names the field."""

    row: Row
    fields: dict[str, object]

    def fail(self, field: str, what: str) -> Exception:
        return row_error(self.row.file, self.row.line, field, what)

    def text(self, name: str, *, optional: bool = False) -> str:
        """A string field; a required one must not be empty (an optional one may be missing or null)."""
        value = self.fields.get(name)
        if value is None and optional:
            return ""
        if name not in self.fields:
            raise self.fail(name, "missing")
        if not isinstance(value, str):
            raise self.fail(name, f"expected a string, got {json_type(value)}")
        if not optional and not value.strip():
            raise self.fail(name, "empty")
        return value

    def label(self, name: str, *, csv: bool) -> int | str:
        """A class id (a non-negative JSON integer, or digits in CSV) or a non-empty class name."""
        if name not in self.fields:
            raise self.fail(name, "missing")
        value = self.fields[name]
        if isinstance(value, int) and not isinstance(value, bool):
            return self._class_id(name, value)
        if not isinstance(value, str):
            raise self.fail(name, f"expected an integer class id or a class name, got {json_type(value)}")
        if not value.strip():
            raise self.fail(name, "empty")
        if csv and _CSV_INTEGER.fullmatch(value):
            if len(value.lstrip("0")) > len(str(MAX_CLASS_ID)):
                raise self.fail(name, f"class id {value[:12]}... is over {MAX_CLASS_ID}")
            return self._class_id(name, int(value))
        return value

    def _class_id(self, name: str, value: int) -> int:
        if value < 0:
            raise self.fail(name, f"class id {value} is negative")
        if value > MAX_CLASS_ID:
            raise self.fail(name, f"class id {str(value)[:12]}... is over {MAX_CLASS_ID} (at most 65,536 classes)")
        return value

    def messages(self, name: str) -> tuple[dict[str, object], ...]:
        """A non-empty array of ``{role, content}`` objects with known roles and string contents."""
        if name not in self.fields:
            raise self.fail(name, "missing")
        value = self.fields[name]
        if not isinstance(value, list):
            raise self.fail(name, f"expected an array of messages, got {json_type(value)}")
        if not value:
            raise self.fail(name, "empty: a chat needs at least one message")
        return tuple(self._message(f"{name}[{index}]", message) for index, message in enumerate(value))

    def _message(self, where: str, message: object) -> dict[str, object]:
        if not isinstance(message, dict):
            raise self.fail(where, f"expected a message object, got {json_type(message)}")
        role, content = message.get("role"), message.get("content")
        if "role" not in message:
            raise self.fail(f"{where}.role", "missing")
        if role not in CHAT_ROLES:
            raise self.fail(f"{where}.role", f"unknown role {role!r} (expected one of {', '.join(CHAT_ROLES)})")
        if "content" not in message:
            raise self.fail(f"{where}.content", "missing")
        if not isinstance(content, str):
            raise self.fail(f"{where}.content", f"expected a string, got {json_type(content)}")
        return dict(message)


@dataclass
class LabelCheck:
    """What a classification file's labels must be as a whole, checked one example at a time.

    Every label is of the first row's kind (integer class ids, or class names), and the
    file has at least two classes (an id above 0, or two distinct names). Used by the
    trainer (:func:`trainer.data.jsonl.samples.class_labels`) and by the API on upload.
    """

    file: str
    integers: bool | None = None
    first_line: int = 0
    max_id: int = 0
    names: set[str] = field(default_factory=set)

    def add(self, example: ClassificationExample) -> None:
        """Take ``example``; ``data_unavailable`` when its label kind differs from the first row's."""
        is_integer = isinstance(example.label, int)
        if self.integers is None:
            self.integers, self.first_line = is_integer, example.line
        elif is_integer != self.integers:
            kind = "a class name" if self.integers else "an integer class id"
            first = "integer class ids" if self.integers else "class names"
            raise row_error(self.file, example.line, "label", f"{kind} in a file whose first row has {first}")
        if isinstance(example.label, int):
            self.max_id = max(self.max_id, example.label)
        elif len(self.names) < 2:
            self.names.add(example.label)

    def finish(self) -> None:
        """``data_unavailable`` when the examples taken hold a single class."""
        classes = self.max_id + 1 if self.integers else len(self.names)
        if classes < 2:
            raise row_error(
                self.file, self.first_line, "label", "every row has the same class: classification needs two"
            )
