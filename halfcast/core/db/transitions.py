"""The job state machine, defined once, and the one fenced compare-and-set that writes a job row.

:data:`TRANSITIONS` says which status may go to which (:class:`halfcast.contracts.status.JobStatus`):

- ``queued`` → ``starting`` (a worker claims it), ``cancelled`` (cancelled while queued),
  ``failed`` (its message never reached the broker: ``enqueue_failed``);
- ``starting``/``running`` → ``cancelling`` (a cancel request), ``queued`` (a lost or stopped
  worker's job retried), or a terminal status; ``starting`` → ``running`` too;
- ``cancelling`` → a terminal status (the run is stopped, or ended first);
- ``failed`` → ``queued``: only a job that never reached the broker, replayed with its
  ``Idempotency-Key`` (:mod:`halfcast.core.db.requeue` guards its reason and attempt);
- ``succeeded`` and ``cancelled`` never change again.

Every write of a job row after its INSERT goes through :func:`compare_and_set`: an
``UPDATE jobs ... WHERE id = :id`` and what the writer expects the row still to be
(:class:`Expected`: its statuses, the attempt and owner of a fenced write, any other
guard), reporting whether it won the race (exactly one row changed). A status change
names its target (``to``) and is checked against the table first: an illegal one raises
:class:`IllegalTransition` before anything is written. Writes of progress columns inside
a transaction whose fenced write already matched the row use :func:`write_progress`.

Both work on a SQLAlchemy ``Connection`` (the worker) and an ORM ``Session`` (the API);
neither commits.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, cast

from sqlalchemy import ColumnElement, Connection, CursorResult, select, update
from sqlalchemy.orm import Session

from halfcast.contracts.status import LIVE_STATUSES, TERMINAL_STATUSES, JobStatus
from halfcast.core.db.models import Job

_S = JobStatus
#: Which status may go to which; a status missing from a set may never follow it.
TRANSITIONS: Mapping[JobStatus, frozenset[JobStatus]] = {
    _S.QUEUED: frozenset({_S.STARTING, _S.GATHERING, _S.CANCELLED, _S.FAILED}),
    # a multi-node job's gang forming (issue 16): complete, it starts; timed out, it is queued again
    _S.GATHERING: frozenset({_S.STARTING, _S.CANCELLING, _S.QUEUED, *TERMINAL_STATUSES}),
    _S.STARTING: frozenset({_S.RUNNING, _S.CANCELLING, _S.QUEUED, *TERMINAL_STATUSES}),
    _S.RUNNING: frozenset({_S.CANCELLING, _S.QUEUED, *TERMINAL_STATUSES}),
    _S.CANCELLING: frozenset(TERMINAL_STATUSES),
    _S.FAILED: frozenset({_S.QUEUED}),
    _S.SUCCEEDED: frozenset(),
    _S.CANCELLED: frozenset(),
}
#: The job columns only the progress of a claimed attempt writes (:func:`write_progress`).
PROGRESS_COLUMNS = frozenset({"step", "latest", "eval", "world_size", "startup", "precision_switches", "updated_at"})


class IllegalTransition(ValueError):
    """A status change :data:`TRANSITIONS` does not allow (``succeeded`` → ``running``, say); nothing was written."""

    def __init__(self, source: JobStatus, target: JobStatus) -> None:
        super().__init__(f"a job may not go from {source.value} to {target.value}")
        self.source = source
        self.target = target


def allowed(source: JobStatus | str, target: JobStatus | str) -> bool:
    """Whether a job in ``source`` may go to ``target``."""
    return JobStatus(target) in TRANSITIONS[JobStatus(source)]


def check(sources: Collection[JobStatus], target: JobStatus) -> None:
    """Raise :class:`IllegalTransition` unless every status of ``sources`` may go to ``target``."""
    for source in sorted(sources):
        if not allowed(source, target):
            raise IllegalTransition(source, target)


class Owner(Enum):
    """An owner guard that is no worker id: any owner at all, or none (``worker_id IS NULL``)."""

    ANY = "any"
    NONE = "none"


@dataclass(frozen=True)
class Fence:
    """Whose attempt a write belongs to: the job, its attempt number (fencing token) and owner (worker id)."""

    job_id: str
    attempt: int
    owner: str


@dataclass(frozen=True)
class Expected:
    """What the job row must still be for a write to apply.

    ``statuses``: the row's status is one of them (``None``: whichever, for a write that
    changes no status). ``attempt``: the row's attempt (``None``: any). ``owner``: the
    row's ``worker_id`` (a worker id, :attr:`Owner.NONE` for none, :attr:`Owner.ANY`).
    ``where``: further guards on the row (its error reason, its message hold, ...).
    """

    statuses: frozenset[JobStatus] | None
    attempt: int | None = None
    owner: str | Owner = Owner.ANY
    where: tuple[ColumnElement[bool], ...] = field(default=())

    def __post_init__(self) -> None:
        if self.statuses is not None:  # plain strings (a stored status) become members
            object.__setattr__(self, "statuses", frozenset(JobStatus(status) for status in self.statuses))

    @classmethod
    def of(cls, *statuses: JobStatus | str, **guards: Any) -> Expected:
        """The row in one of ``statuses``, with ``guards`` (``attempt``, ``owner``, ``where``)."""
        return cls(frozenset(JobStatus(status) for status in statuses), **guards)

    @classmethod
    def fenced(cls, fence: Fence, statuses: Collection[JobStatus | str] = LIVE_STATUSES) -> Expected:
        """The row still held by ``fence``'s attempt and owner, in one of ``statuses`` (default: live)."""
        return cls(frozenset(JobStatus(status) for status in statuses), attempt=fence.attempt, owner=fence.owner)

    def conditions(self, job_id: str) -> list[ColumnElement[bool]]:
        """The ``WHERE`` of a write of ``job_id`` that expects this."""
        conditions = [Job.id == job_id, *self.where]
        if self.statuses is not None:
            conditions.append(Job.status.in_(sorted(status.value for status in self.statuses)))
        if self.attempt is not None:
            conditions.append(Job.attempt == self.attempt)
        if self.owner is Owner.NONE:
            conditions.append(Job.worker_id.is_(None))
        elif isinstance(self.owner, str):
            conditions.append(Job.worker_id == self.owner)
        return conditions


Executor = Connection | Session


def compare_and_set(db: Executor, job_id: str, expected: Expected, to: JobStatus | None = None, **values: Any) -> bool:
    """Set ``values`` (and status ``to``) on job ``job_id`` if the row is as ``expected``; whether it was.

    ``to`` must be allowed from every expected status (else :class:`IllegalTransition`),
    which therefore must be given; ``values`` name columns of ``jobs`` other than ``status``
    (``TypeError`` otherwise). Nothing is committed: the caller's transaction holds the write.
    """
    _check_columns(values)
    if to is not None:
        if expected.statuses is None:
            raise ValueError(f"a change to {JobStatus(to).value} must say which statuses it expects")
        check(expected.statuses, JobStatus(to))
        values["status"] = JobStatus(to).value
    if not values:
        raise ValueError("a compare-and-set must write something")
    statement = (
        update(Job).where(*expected.conditions(job_id)).values(**values).execution_options(synchronize_session=False)
    )
    # Session.execute types every result as Result; an UPDATE's is a CursorResult (it has a rowcount) either way
    result = cast("CursorResult[Any]", db.execute(statement))
    return bool(result.rowcount == 1)


def lock_if(db: Executor, job_id: str, expected: Expected) -> bool:
    """Lock job ``job_id``'s row if it is as ``expected`` (as an update of it would); whether it is. Writes nothing.

    For a transaction that writes other tables under the row's fence without changing the row
    itself (no new row version, no change told to the API's kept reads). The lock is the one an
    ``UPDATE`` of non-key columns takes (``FOR NO KEY UPDATE``), so it orders the transaction
    against a concurrent status change exactly as a :func:`compare_and_set` would (SQLite: the
    write transaction's own lock).
    """
    statement = select(Job.id).where(*expected.conditions(job_id)).with_for_update(key_share=True)
    return db.execute(statement).first() is not None


def write_progress(db: Executor, job_id: str, **values: Any) -> None:
    """Set progress columns (:data:`PROGRESS_COLUMNS`) of job ``job_id``, unguarded.

    Only inside a transaction whose fenced :func:`compare_and_set` already matched the row
    (its row lock orders this write): never a status, never a lease or an owner.
    """
    _check_columns(values)
    if not values or not set(values) <= PROGRESS_COLUMNS:
        raise TypeError(f"not progress columns: {sorted(set(values) - PROGRESS_COLUMNS) or 'none given'}")
    db.execute(update(Job).where(Job.id == job_id).values(**values).execution_options(synchronize_session=False))


def _check_columns(values: Mapping[str, Any]) -> None:
    if "status" in values:
        raise TypeError("a status changes only through compare_and_set(..., to=...), checked against TRANSITIONS")
    unknown = set(values) - set(Job.__table__.columns.keys())
    if unknown:
        raise TypeError(f"jobs has no columns {sorted(unknown)}")
