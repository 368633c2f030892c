"""Quota enforcement at submission and upload: lock the owner, count what it has, refuse what would exceed a limit.

The check and the INSERT of the job must be one transaction that no other
submission of the same owner can interleave with, or N racing requests could all
count K-1 jobs and all be accepted. :func:`begin_owner_transaction` starts that
transaction:

- PostgreSQL: ``pg_advisory_xact_lock`` on a 64-bit key derived from the owner (held
  until commit or rollback). Under READ COMMITTED each statement sees what was
  committed before it, so the count taken after the lock includes every job of
  that owner committed by an earlier holder. Nothing is written to take the lock,
  so a refused request leaves no trace. Other owners are not blocked.
- SQLite: ``BEGIN IMMEDIATE`` (:data:`halfcast.core.db.engine.WRITE_TRANSACTION`): the
  database's single write lock is taken before the count, so writers are serialised.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from sqlalchemy import case, func, select
from sqlalchemy.orm import Session

from halfcast.core.db.engine import begin_write
from halfcast.core.db.models import ACTIVE_STATUSES, Job, RegisteredDataset, RegisteredModel
from halfcast.core.db.quotas import QuotaLimits, effective_limits


class QuotaExceeded(Exception):
    """Accepting the job would take its owner over ``limit`` (whose value is ``value``)."""

    def __init__(self, owner: str, limit: str, value: int, in_use: int) -> None:
        super().__init__(f"quota exceeded: {limit} is {value} for owner {owner!r} ({in_use} in use)")
        self.owner = owner
        self.limit = limit
        self.value = value
        self.in_use = in_use


@dataclass(frozen=True)
class Usage:
    """What one owner has now: jobs not yet terminal, their GPUs (sum of ``spec.gpus`` x ``spec.nodes``), jobs ``queued``."""

    active_jobs: int
    gpus: int
    queued_jobs: int


def owner_lock_key(owner: str) -> int:
    """The advisory-lock key of ``owner``: the first 8 bytes of SHA-256 of ``halfcast.quota:<owner>``, signed."""
    digest = hashlib.sha256(f"halfcast.quota:{owner}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def begin_owner_transaction(session: Session, owner: str) -> None:
    """Begin ``session``'s transaction holding ``owner``'s submission lock (see the module docstring).

    Blocks while another transaction holds it (SQLite: up to the busy timeout).
    Raises ``RuntimeError`` if ``session`` is already in a transaction (commit first).
    """
    if begin_write(session).dialect.name == "postgresql":
        session.execute(select(func.pg_advisory_xact_lock(owner_lock_key(owner))))


def usage(session: Session, owner: str) -> Usage:
    """``owner``'s :class:`Usage`, counted in the current transaction."""
    nodes = func.coalesce(Job.spec["nodes"].as_integer(), 1)  # a multi-node job holds gpus on each of its nodes
    gpus = func.coalesce(func.sum(func.coalesce(Job.spec["gpus"].as_integer(), 0) * nodes), 0)
    queued = func.coalesce(func.sum(case((Job.status == "queued", 1), else_=0)), 0)
    query = select(func.count(), gpus, queued).where(Job.owner == owner, Job.status.in_(sorted(ACTIVE_STATUSES)))
    active_jobs, gpu_sum, queued_jobs = session.execute(query).one()
    return Usage(active_jobs=int(active_jobs), gpus=int(gpu_sum), queued_jobs=int(queued_jobs))


def check(owner: str, limits: QuotaLimits, current: Usage, gpus: int) -> None:
    """Raise :class:`QuotaExceeded` for the first limit one more queued job of ``gpus`` GPUs would exceed.

    Order: ``max_active_jobs``, ``max_queued_jobs``, ``max_gpus``. A CPU job (``gpus``
    0) is never refused for ``max_gpus``, even when the owner is above it.
    """
    wanted = (
        ("max_active_jobs", current.active_jobs, 1),
        ("max_queued_jobs", current.queued_jobs, 1),
        ("max_gpus", current.gpus, gpus),
    )
    for limit, in_use, more in wanted:
        value = getattr(limits, limit)
        if value is not None and more > 0 and in_use + more > value:
            raise QuotaExceeded(owner, limit, value, in_use)


def enforce(session: Session, owner: str, gpus: int, defaults: QuotaLimits) -> None:
    """Raise :class:`QuotaExceeded` if ``owner`` may not have one more queued job of ``gpus`` GPUs.

    Run it inside :func:`begin_owner_transaction`'s transaction, before the INSERT;
    ``defaults`` are the server's limits, overridden by the owner's row. Ends no transaction.
    """
    limits = effective_limits(session, owner, defaults)
    if not limits.is_unlimited():
        check(owner, limits, usage(session, owner), gpus)


def storage_in_use(session: Session, owner: str) -> int:
    """Bytes of ``owner``'s registered datasets and models (each row counted, shared files too)."""
    total = 0
    for table in (RegisteredDataset, RegisteredModel):
        total += int(session.scalar(select(func.coalesce(func.sum(table.bytes), 0)).where(table.owner == owner)) or 0)
    return total


def enforce_storage(session: Session, owner: str, more_bytes: int, defaults: QuotaLimits) -> None:
    """Raise :class:`QuotaExceeded` (``max_storage_bytes``) if ``owner`` may not register ``more_bytes`` more.

    Run it inside :func:`begin_owner_transaction`'s transaction, before the INSERT. Ends no transaction.
    """
    limit = effective_limits(session, owner, defaults).max_storage_bytes
    if limit is None:
        return
    in_use = storage_in_use(session, owner)
    if in_use + more_bytes > limit:
        raise QuotaExceeded(owner, "max_storage_bytes", limit, in_use)
