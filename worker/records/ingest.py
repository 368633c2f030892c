"""What the worker makes of a run's records (:mod:`halfcast.contracts.records`): progress to store, the end, the job row's copies.

The records of one poll arrive in file order. Step and evaluation records are stored as
the trainer wrote them; a ``precision_switch`` drops the poll's records after its
``rewound_to_step`` (those steps are trained again and follow it); a ``start`` record gives
the world size, and the switch a resumed run repeats; the newest ``phase`` record is the
attempt's start-up so far (``jobs.startup``, migration 0009: :func:`startup_summary`); the
``end`` record's counts decide the outcome (:mod:`worker.lifecycle.outcomes`) and, for a succeeded
run, are kept in ``jobs.end_info`` (migration 0008: :func:`end_info`). A line that is no
known record, or does not validate, is skipped (:func:`halfcast.contracts.records.parse_record`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from halfcast.contracts.records import (
    EndRecord,
    EvalRecord,
    PhaseRecord,
    PrecisionSwitch,
    PrecisionSwitchRecord,
    Record,
    StartRecord,
    StepRecord,
    parse_record,
)
from worker.store import Progress

R = TypeVar("R", StepRecord, EvalRecord)

#: The fields of an ``end`` record that ``jobs.end_info`` keeps.
END_INFO_FIELDS = frozenset(
    {
        "steps",
        "skipped_steps",
        "applied_steps",
        "empty_windows",
        "stopped_early",
        "exported_step",
        "samples_per_second",
        "tokens_per_second",
    }
)


@dataclass(frozen=True)
class Ingested:
    """One poll's records: the progress to store, and the run's ``end`` record if the poll held one."""

    progress: Progress
    end: EndRecord | None = None


def parse_lines(lines: Iterable[Mapping[str, Any]]) -> list[Record]:
    """The records of ``lines`` (JSON objects, in file order), skipping those that are no valid record."""
    return [record for line in lines if (record := parse_record(line)) is not None]


def ingest(records: Iterable[Record]) -> Ingested:
    """The progress of ``records`` (in file order) and the last ``end`` record among them."""
    steps: list[StepRecord] = []
    evaluations: list[EvalRecord] = []
    switches: list[PrecisionSwitchRecord] = []
    known: list[PrecisionSwitch] = []
    world_size: int | None = None
    startup: dict[str, str | float | None] | None = None
    data: dict[str, object] | None = None
    end: EndRecord | None = None
    for record in records:
        match record:
            case StepRecord():
                steps.append(record)
            case EvalRecord():
                evaluations.append(record)
            case PrecisionSwitchRecord(rewound_to_step=rewound):
                steps, evaluations = _up_to(rewound, steps), _up_to(rewound, evaluations)
                switches.append(record)
            case StartRecord():
                world_size = record.world_size if record.world_size is not None else world_size
                known += [record.precision_switch] if record.precision_switch is not None else []
                data = record.data.model_dump(mode="json", exclude_none=True) if record.data is not None else data
            case PhaseRecord():
                startup = startup_summary(record)
            case EndRecord():
                end = record
    progress = Progress(
        steps=steps,
        evals=evaluations,
        world_size=world_size,
        switches=switches,
        known_switches=known,
        startup=startup,
        data=data,
    )
    return Ingested(progress, end)


def _up_to(step: int, records: list[R]) -> list[R]:
    """The records of ``records`` at or before ``step``."""
    return [record for record in records if record.step <= step]


def startup_summary(record: PhaseRecord) -> dict[str, str | float | None]:
    """What the job row keeps of a ``phase`` record (``jobs.startup``): the phase, then every time (``None`` included)."""
    return {"phase": record.phase, **record.startup.model_dump()}


def end_info(record: EndRecord) -> dict[str, object]:
    """What the job row keeps of a succeeded run's ``end`` record (``jobs.end_info``): its counts, as plain JSON."""
    return record.model_dump(mode="json", include=set(END_INFO_FIELDS), exclude_none=True)
