"""The records sink: rank 0 appends JSON lines to ``<run_dir>/records.jsonl``.

Every line is a record of :mod:`halfcast.contracts.records` (the run-directory contract of
docs/architecture.md), built and validated here and written as :meth:`~halfcast.contracts.records.RecordBase.line`
gives it. Lines are flushed as soon as they are written (step lines in one batch per logging
interval, see :mod:`trainer.run.telemetry`), so the worker can tail the file while training runs.
JSON has no NaN or infinity: a non-finite float is written as ``null``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import IO, Any, Self, TypedDict

from halfcast.contracts.records import (
    EndRecord,
    EvalRecord,
    PhaseRecord,
    PrecisionSwitchRecord,
    RecordBase,
    StartRecord,
    StepRecord,
)
from halfcast.contracts.rundir import RECORDS_FILE, RunDir

__all__ = ["RECORDS_FILE", "RecordSink", "StepFields", "StepRecord", "read_records"]


class StepFields(TypedDict, total=False):
    """:attr:`RecordSink.step_fields`: what every later ``step`` line carries (``precision`` after a switch)."""

    precision: str


def step_line(record: StepRecord) -> str:
    """``record.line()`` as JSON text, serialised by pydantic in one call (a step line per step makes
    this the flush's cost): the same object, keys in the same order (``type`` first, ``precision`` only
    when set, non-finite floats as ``null``), compact separators."""
    unset = set() if "precision" in record.model_fields_set else {"precision"}
    return record.model_dump_json(by_alias=True, exclude=unset)


class RecordSink:
    """Appends one JSON object per line to ``path``; with ``path=None`` (ranks other than 0) it writes nothing.

    Use as a context manager, or call :meth:`close`. ``OSError`` from the file system propagates.
    """

    def __init__(self, path: Path | None) -> None:
        self.path = path
        #: Fields merged into every later ``step`` line (``{"precision": "bf16"}`` after a precision switch).
        self.step_fields: StepFields = {}
        self._file: IO[str] | None = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = path.open("a", encoding="utf-8")

    def write(self, record: RecordBase) -> None:
        """Append ``record``'s line (its ``time`` now, unless it has one) and flush."""
        self._write_line(record)
        if self._file is not None:
            self._file.flush()

    def _write_line(self, record: RecordBase) -> None:
        if self._file is None:
            return
        if record.time is None:
            record = record.model_copy(update={"time": time.time()})
        text = step_line(record) if isinstance(record, StepRecord) else json.dumps(record.line(), allow_nan=False)
        self._file.write(text + "\n")

    def start(self, **fields: Any) -> None:
        """The ``start`` line: world_size, device, precision, compute_dtype, accumulation_steps, ..., startup."""
        self.write(StartRecord(**fields))

    def phase(self, phase: str, startup: Mapping[str, float | None]) -> None:
        """A ``phase`` line: start-up phase ``phase`` begins; ``startup``: the seconds of those ended (:mod:`trainer.startup`)."""
        self.write(PhaseRecord.model_validate({"phase": phase, "startup": dict(startup)}))

    def step(self, record: StepRecord, when: float | None = None) -> None:
        """A ``step`` line from ``record`` (``when``: the step's unix time, default now)."""
        self.write(self._stamped(record, when))

    def steps(self, records: Iterable[tuple[float, StepRecord]]) -> None:
        """``step`` lines for ``(unix time, record)`` pairs, written and flushed at once."""
        if self._file is None:
            return
        self._file.write("".join(step_line(self._stamped(record, when)) + "\n" for when, record in records))
        self._file.flush()

    def _stamped(self, record: StepRecord, when: float | None) -> StepRecord:
        """``record`` at unix time ``when`` (``None``: now), with :attr:`step_fields`; ``record`` itself
        when it already holds them (the flusher builds its records so: no copy per line)."""
        if (
            when is not None
            and record.time == when
            and (not self.step_fields or all(getattr(record, k, None) == v for k, v in self.step_fields.items()))
        ):
            return record
        return record.model_copy(update={**self.step_fields, "time": when})

    def eval(self, step: int, metrics: Mapping[str, float | None]) -> None:
        """An ``eval`` line: ``step`` and ``loss`` plus ``accuracy`` or ``perplexity`` (:mod:`trainer.run.evaluate`)."""
        self.write(EvalRecord.model_validate({**metrics, "step": step}))

    def precision_switch(self, switch: Mapping[str, Any]) -> None:
        """A ``precision_switch`` line (``on_divergence: "fallback_bf16"``, see :mod:`trainer.run.fallback`).

        ``switch``: ``step`` (where the divergence guard tripped), ``from``, ``to``,
        ``reason`` (the guard's typed reason), ``message``, ``rewound_to_step`` (the
        checkpoint step training continues from, 0 for the start) and ``time`` (unix
        seconds, the line's time).
        """
        self.write(PrecisionSwitchRecord.model_validate(dict(switch)))

    def end(self, steps: int, skipped_steps: int, empty_windows: int = 0, **fields: Any) -> None:
        """The ``end`` line, written last on success: attempted, skipped, empty (no supervised token: no update,
        not skipped) and applied (the rest) steps.

        ``fields``: ``stopped_early`` (``{"step", "metric", "best_step", "best_value"}``, when early
        stopping ended the job at ``steps`` before ``max_steps``) and ``exported_step`` (the step
        whose weights an ``hf`` job's exports hold: the best evaluated one with ``keep_best``).
        """
        applied = steps - skipped_steps - empty_windows
        empty = {"empty_windows": empty_windows} if empty_windows else {}  # absent: none
        self.write(EndRecord(steps=steps, skipped_steps=skipped_steps, applied_steps=applied, **empty, **fields))

    def close(self) -> None:
        """Close the file (idempotent)."""
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_records(run_dir: Path) -> list[dict[str, object]]:
    """All complete lines of ``<run_dir>/records.jsonl`` as dicts, JSON as read (for tests and tools)."""
    path = RunDir(run_dir).records
    lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    return [json.loads(line) for line in lines if line.strip()]
