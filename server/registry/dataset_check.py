"""Every row of an uploaded dataset file checked with the trainer's own parser, so the API accepts what the trainer reads.

The rows are read by :func:`trainer.data.jsonl.rows.rows_of` (JSON lines or CSV, line numbers,
UTF-8) and each is parsed as an example of the upload's format by
:func:`trainer.data.jsonl.formats.parse_row`; a classification file's labels are checked as a
whole by :class:`~trainer.data.jsonl.formats.LabelCheck`. The first bad row rejects the file
(:class:`DatasetRejected`, naming its line and field). Blocking: run it in a worker thread.
"""

from __future__ import annotations

from pathlib import Path

from trainer.data.jsonl.formats import ClassificationExample, LabelCheck, parse_row
from trainer.data.jsonl.rows import RowError, rows_of
from trainer.errors import TrainerError

#: Longest line of an uploaded file (the check reads line by line: a file without newlines is refused, not held whole).
MAX_LINE_BYTES = 64 << 20


class DatasetRejected(Exception):
    """The file is not a dataset of its format: at ``line`` (1-based; ``None``: the file as a whole),
    ``field`` (``None``: the row itself), because ``message``."""

    def __init__(self, line: int | None, field: str | None, message: str) -> None:
        super().__init__(message)
        self.line = line
        self.field = field
        self.message = message


def check_dataset_file(path: Path, name: str, file_format: str, fmt: str) -> int:
    """The number of rows of the file at ``path``, each a valid example of format ``fmt``.

    ``file_format`` is ``jsonl`` or ``csv``; ``name`` names the file in messages. Raises
    :class:`DatasetRejected` for the first bad row, or a file without rows.
    """
    labels = LabelCheck(name) if fmt == "classification" else None
    count = 0
    try:
        with path.open("rb") as handle:
            for row in rows_of(name, handle, file_format, max_line_bytes=MAX_LINE_BYTES):
                example = parse_row(row, fmt, {}, csv=file_format == "csv")
                if labels is not None and isinstance(example, ClassificationExample):
                    labels.add(example)
                count += 1
        if labels is not None:
            labels.finish()
    except RowError as exc:
        where = f"line {exc.line}: " + (f"field {exc.field}: " if exc.field is not None else "")
        raise DatasetRejected(exc.line, exc.field, where + exc.what) from None
    except TrainerError as exc:
        raise DatasetRejected(None, None, exc.message) from None
    return count
