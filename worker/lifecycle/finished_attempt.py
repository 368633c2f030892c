"""An earlier attempt that finished its run although its outcome was never recorded (the database stalled).

An attempt whose worker could not write to the database (a row lock held for a minute, a stalled
server) can finish every step, write ``final.pt`` and its ``end`` record, and still lose its
lease: its ``succeeded`` is dropped and the reaper requeues the job. The next attempt must not
train again. Before it launches, the runner looks through the job's earlier attempts, newest
first, for one with ``final.pt`` and an ``end`` record whose outcome is ``succeeded``
(:func:`worker.lifecycle.outcomes.ended_outcome`, against the spec's ``max_steps``): that attempt's
result is recorded instead (its step records backfilled, its ``end`` counts kept), and no step
runs twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from halfcast.contracts.records import EndRecord, parse_record
from halfcast.contracts.rundir import JobRuns, RunDir
from halfcast.contracts.status import JobStatus
from worker.lifecycle.outcomes import ended_outcome
from worker.records.tail import RecordTail


@dataclass(frozen=True)
class FinishedAttempt:
    """Attempt ``attempt`` (its run directory ``run``) finished: ``end`` is its ``end`` record."""

    attempt: int
    run: RunDir
    end: EndRecord


def _last_end(records: Path) -> EndRecord | None:
    ends = [
        record
        for line in RecordTail(records).drain()
        if line.get("type") == "end" and isinstance(record := parse_record(line), EndRecord)
    ]
    return ends[-1] if ends else None


def finished_attempt(job_dir: Path, attempt: int, max_steps: int) -> FinishedAttempt | None:
    """The newest attempt before ``attempt`` under ``job_dir`` that finished with ``succeeded``; ``None`` if none did."""
    runs = JobRuns(job_dir)
    for number in sorted((n for n in runs.attempt_numbers() if n < attempt), reverse=True):
        run = runs.attempt(number)
        if not run.final_checkpoint.is_file():
            continue
        end = _last_end(run.records)
        if end is not None and ended_outcome(end, max_steps).status == JobStatus.SUCCEEDED:
            return FinishedAttempt(number, run, end)
    return None
