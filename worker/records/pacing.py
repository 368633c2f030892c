"""How often a run's steps reach its job row: at most every ``HALFCAST_WORKER_PROGRESS_INTERVAL_S``.

The worker stores a run's step records every poll (``HALFCAST_WORKER_POLL_INTERVAL_S``, 0.1 s):
the event stream and ``GET /jobs/{id}/steps`` read them. The job row's ``step`` and ``latest``
(what ``GET /jobs/{id}`` shows) change with them, and every change of a job row is a new row
version, a trigger's notification and, for an API that keeps its poll reads until told
(``HALFCAST_POLL_READS=notified``, PostgreSQL's default), a database read of every poller's next poll. So a poll that
brings nothing but step records sets the job row only once the interval has passed since the
last write; the newest step it stored meanwhile is carried to the next write. Anything else a
poll brings (the first records, which move the job to ``running``, an evaluation, a precision
switch, a world size, a start-up phase, a data report) and the run's last records are written
to the job row at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from halfcast.contracts.records import StepRecord
from worker.store import Progress


@dataclass(frozen=True)
class Plan:
    """What to store for a poll: ``progress`` (its records, and the job row's values from them) and whether to set the row."""

    progress: Progress
    job_row: bool


class JobRowPacing:
    """Decides, poll by poll, whether the job row is set (see the module docs); one per attempt."""

    def __init__(self, interval_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s
        self.clock = clock
        self.written_at = float("-inf")
        #: The newest step record stored since the job row was last set (carried to the next write).
        self.deferred: StepRecord | None = None

    def plan(self, progress: Progress, *, now: bool = False) -> Plan:
        """The plan for a poll's ``progress``; ``now``: the job row is set whatever the interval (the last records)."""
        if progress.switches:  # a rewind: what was deferred may be a step trained again
            self.deferred = None
        if now or not _steps_only(progress) or self.clock() - self.written_at >= self.interval_s:
            return Plan(replace(progress, steps=(*_some(self.deferred), *progress.steps)), job_row=True)
        if progress.steps:
            self.deferred = max((*progress.steps, *_some(self.deferred)), key=lambda record: record.step)
        return Plan(progress, job_row=False)

    def pending(self, *, now: bool = False) -> Plan | None:
        """For a poll that read nothing: the deferred step's write once due (``now``: at once); else ``None``."""
        if self.deferred is None or (not now and self.clock() - self.written_at < self.interval_s):
            return None
        return Plan(Progress(steps=(self.deferred,)), job_row=True)

    def written(self, plan: Plan) -> None:
        """``plan`` was stored: a job row set starts the interval again and carries nothing more."""
        if plan.job_row:
            self.written_at = self.clock()
            self.deferred = None


def _some(record: StepRecord | None) -> tuple[StepRecord, ...]:
    return () if record is None else (record,)


def _steps_only(progress: Progress) -> bool:
    """The poll brings step records and nothing else the job row shows."""
    return not (
        progress.evals
        or progress.switches
        or progress.known_switches
        or progress.world_size is not None
        or progress.startup is not None
        or progress.data is not None
    )
