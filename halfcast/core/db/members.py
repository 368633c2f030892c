"""Gang memberships of multi-node jobs (``job_members``, migration 0012), each change a compare-and-set.

Node 0 claims the job (``queued`` → ``gathering``, :meth:`worker.store.JobStore.claim`) and opens
rank 0 (:meth:`Members.open_node0`); other workers join with :meth:`Members.join`, which takes the
lowest free node rank. Two partial unique indexes make these safe without locks: a worker holds
at most one open membership, and a node rank of an attempt belongs to one membership that was not
``released``, so of two workers racing for a rank one insert fails and that worker tries the next.
The job's own gang transitions (``gathering`` → ``starting`` once complete, ``gathering`` →
``queued`` when the gang times out) are fenced on the attempt and node 0's worker.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine, delete, func, insert, or_, select, update
from sqlalchemy.exc import IntegrityError

from halfcast.common.timeutil import as_utc
from halfcast.contracts.status import OPEN_MEMBER_STATUSES, JobStatus, MemberStatus
from halfcast.core.db.engine import WRITE_TRANSACTION
from halfcast.core.db.models import Attempt, Job, JobMember, utcnow
from halfcast.core.db.stored_spec import stored_spec
from halfcast.core.db.transitions import Expected, compare_and_set

#: The open statuses as the column stores them.
OPEN: tuple[str, ...] = tuple(sorted(status.value for status in OPEN_MEMBER_STATUSES))


@dataclass(frozen=True)
class Member:
    """One membership row."""

    id: int
    job_id: str
    attempt: int
    node_rank: int
    worker_id: str
    host_address: str | None
    rendezvous_port: int | None
    status: MemberStatus
    exit_code: int | None
    lease_expires_at: datetime | None

    @property
    def open(self) -> bool:
        """Whether it still holds its worker."""
        return self.status.open

    def expired(self, now: datetime) -> bool:
        """Whether it is open but its worker stopped renewing it."""
        return self.open and (self.lease_expires_at is None or as_utc(self.lease_expires_at) < now)


@dataclass(frozen=True)
class GatheringJob:
    """A ``gathering`` job that still needs nodes: its attempt, nodes wanted and held, and its GPUs per node."""

    job_id: str
    attempt: int
    nodes: int
    held: int
    gpus: int
    created_at: datetime


COLUMNS = (
    JobMember.id,
    JobMember.job_id,
    JobMember.attempt,
    JobMember.node_rank,
    JobMember.worker_id,
    JobMember.host_address,
    JobMember.rendezvous_port,
    JobMember.status,
    JobMember.exit_code,
    JobMember.lease_expires_at,
)


def _member(row: Sequence[Any]) -> Member:
    """The :class:`Member` of a row of ``COLUMNS`` (the column's status as the enum)."""
    member_id, job_id, attempt, node_rank, worker_id, host_address, port, status, exit_code, lease_expires_at = row
    return Member(
        member_id,
        job_id,
        attempt,
        node_rank,
        worker_id,
        host_address,
        port,
        MemberStatus(status),
        exit_code,
        lease_expires_at,
    )


class Members:
    """Membership reads and compare-and-set writes, each in its own short transaction."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    @contextmanager
    def _begin(self) -> Iterator[Connection]:
        with self.engine.execution_options(**WRITE_TRANSACTION).begin() as conn:
            yield conn

    # ------------------------------------------------------------------ joining and leaving

    def open_node0(
        self, job_id: str, attempt: int, worker_id: str, host: str, port: int, ttl_s: float
    ) -> Member | None:
        """Node 0's membership of the attempt it claimed; ``None`` if this worker already holds an open one."""
        return self._insert(job_id, attempt, 0, worker_id, host, port, ttl_s)

    def join(self, job_id: str, worker_id: str, host: str, ttl_s: float) -> Member | None:
        """Take the lowest free node rank of a ``gathering`` job; ``None`` if it is not gathering, is full,
        or this worker already holds an open membership."""
        with self.engine.connect() as conn:
            row = conn.execute(select(Job.status, Job.attempt, Job.spec).where(Job.id == job_id)).one_or_none()
        if row is None or row.status != JobStatus.GATHERING:
            return None
        nodes = spec_nodes(job_id, row.spec)
        for rank in range(1, nodes):
            if rank in self._ranks_taken(job_id, row.attempt):
                continue
            member = self._insert(job_id, row.attempt, rank, worker_id, host, None, ttl_s, require_gathering=True)
            if member is not None:
                return member
            if self.open_membership(worker_id) is not None:
                return None
        return None

    def _ranks_taken(self, job_id: str, attempt: int) -> set[int]:
        query = select(JobMember.node_rank).where(
            JobMember.job_id == job_id, JobMember.attempt == attempt, JobMember.status != MemberStatus.RELEASED
        )
        with self.engine.connect() as conn:
            return set(conn.execute(query).scalars())

    def _insert(
        self,
        job_id: str,
        attempt: int,
        rank: int,
        worker_id: str,
        host: str,
        port: int | None,
        ttl_s: float,
        require_gathering: bool = False,
    ) -> Member | None:
        now = utcnow()
        values = dict(
            job_id=job_id,
            attempt=attempt,
            node_rank=rank,
            worker_id=worker_id,
            host_address=host,
            rendezvous_port=port,
            status=MemberStatus.JOINED.value,
            joined_at=now,
            lease_expires_at=now + timedelta(seconds=ttl_s),
        )
        try:
            with self._begin() as conn:
                if require_gathering and not _still_gathering(conn, job_id, attempt):
                    return None
                member_id = conn.execute(insert(JobMember).values(**values).returning(JobMember.id)).scalar_one()
        except IntegrityError:
            return None  # the rank was taken meanwhile, or this worker holds an open membership
        return self.get(member_id)

    def renew(self, member_id: int, ttl_s: float) -> bool:
        """Push an open membership's lease ``ttl_s`` ahead; ``False`` once it is closed."""
        expires = utcnow() + timedelta(seconds=ttl_s)
        with self._begin() as conn:
            statement = update(JobMember).where(JobMember.id == member_id, JobMember.status.in_(OPEN))
            return conn.execute(statement.values(lease_expires_at=expires)).rowcount == 1

    def mark_running(self, member_id: int) -> bool:
        """``joined`` → ``running`` (its torchrun was started); ``False`` if it was closed meanwhile."""
        with self._begin() as conn:
            statement = update(JobMember).where(JobMember.id == member_id, JobMember.status == MemberStatus.JOINED)
            return conn.execute(statement.values(status=MemberStatus.RUNNING.value, launched_at=utcnow())).rowcount == 1

    def close(self, member_id: int, status: MemberStatus, exit_code: int | None = None) -> bool:
        """Close an open membership with ``status``; ``False`` if it was already closed."""
        if status.open:
            raise ValueError(f"{status} is not a closed membership status")
        with self._begin() as conn:
            statement = update(JobMember).where(JobMember.id == member_id, JobMember.status.in_(OPEN))
            values = dict(status=status.value, exit_code=exit_code, ended_at=utcnow(), lease_expires_at=None)
            return conn.execute(statement.values(**values)).rowcount == 1

    def close_expired(self, job_id: str, attempt: int) -> int:
        """Close as ``lost`` the attempt's open memberships whose lease expired; how many."""
        with self._begin() as conn:
            return close_expired_members(conn, job_id, attempt, utcnow())

    # ------------------------------------------------------------------ reads

    def get(self, member_id: int) -> Member | None:
        """The membership ``member_id``."""
        with self.engine.connect() as conn:
            row = conn.execute(select(*COLUMNS).where(JobMember.id == member_id)).one_or_none()
        return None if row is None else _member(row)

    def of_attempt(self, job_id: str, attempt: int) -> list[Member]:
        """The attempt's memberships that were not released, by node rank."""
        query = (
            select(*COLUMNS)
            .where(JobMember.job_id == job_id, JobMember.attempt == attempt, JobMember.status != MemberStatus.RELEASED)
            .order_by(JobMember.node_rank)
        )
        with self.engine.connect() as conn:
            return [_member(row) for row in conn.execute(query)]

    def open_membership(self, worker_id: str) -> Member | None:
        """The open membership ``worker_id`` holds, if any."""
        query = select(*COLUMNS).where(JobMember.worker_id == worker_id, JobMember.status.in_(OPEN))
        with self.engine.connect() as conn:
            row = conn.execute(query).one_or_none()
        return None if row is None else _member(row)

    def gathering(self, created_before: datetime | None = None) -> list[GatheringJob]:
        """``gathering`` jobs that still need nodes, oldest first (created before ``created_before``, when given)."""
        held = (
            select(func.count())
            .where(JobMember.job_id == Job.id, JobMember.attempt == Job.attempt, JobMember.status.in_(OPEN))
            .scalar_subquery()
        )
        query = select(Job.id, Job.attempt, Job.spec, held, Job.created_at).where(Job.status == JobStatus.GATHERING)
        if created_before is not None:
            query = query.where(Job.created_at < created_before)
        with self.engine.connect() as conn:
            rows = conn.execute(query.order_by(Job.created_at)).all()
        found = [
            GatheringJob(
                row.id,
                row.attempt,
                spec_nodes(row.id, row.spec),
                int(row[3]),
                spec_gpus(row.id, row.spec),
                row.created_at,
            )
            for row in rows
        ]
        return [job for job in found if job.held < job.nodes]

    # ------------------------------------------------------------------ the job's gang transitions

    def launch(self, job_id: str, attempt: int, owner: str) -> bool:
        """``gathering`` → ``starting`` for node 0's attempt once its gang is complete; ``False`` if it moved on."""
        with self._begin() as conn:
            return compare_and_set(conn, job_id, _node0(attempt, owner), to=JobStatus.STARTING)

    def disband(self, job_id: str, attempt: int, owner: str) -> bool:
        """A gang that did not form: release every membership and put the job back in ``queued`` as it was.

        The attempt is taken back (``jobs.attempt`` one lower, its ``attempts`` row deleted): no launch was
        made, so it does not count against ``max_attempts``. ``False`` (nothing changed) if the job is no
        longer this attempt's ``gathering``.
        """
        with self._begin() as conn:
            if not compare_and_set(
                conn,
                job_id,
                _node0(attempt, owner),
                to=JobStatus.QUEUED,
                attempt=attempt - 1,
                worker_id=None,
                lease_expires_at=None,
                started_at=None,
                run_dir=None,
            ):
                return False
            conn.execute(delete(Attempt).where(Attempt.job_id == job_id, Attempt.attempt == attempt))
            _release_all(conn, job_id, attempt)
        return True

    def release_all(self, job_id: str, attempt: int) -> int:
        """Release every still ``joined`` membership of the attempt (its gang never launched); how many."""
        with self._begin() as conn:
            return _release_all(conn, job_id, attempt)


def close_expired_members(
    conn: Connection, job_id: str, attempt: int, now: datetime, dead_worker: str | None = None
) -> int:
    """In ``conn``: close as ``lost`` the attempt's open memberships whose lease expired before ``now``; how many.

    Node 0 calls it for its peers. The reaper calls it with ``dead_worker``, node 0's worker whose
    job lease expired, whose membership it closes too (renewed with the job's lease, it may
    expire a moment later; no one else would close it).
    """
    expired = JobMember.lease_expires_at < now
    statement = update(JobMember).where(
        JobMember.job_id == job_id,
        JobMember.attempt == attempt,
        JobMember.status.in_(OPEN),
        expired if dead_worker is None else or_(expired, JobMember.worker_id == dead_worker),
    )
    values = dict(status=MemberStatus.LOST.value, ended_at=now, lease_expires_at=None)
    return int(conn.execute(statement.values(**values)).rowcount)


def _release_all(conn: Connection, job_id: str, attempt: int) -> int:
    statement = update(JobMember).where(
        JobMember.job_id == job_id, JobMember.attempt == attempt, JobMember.status == MemberStatus.JOINED
    )
    values = dict(status=MemberStatus.RELEASED.value, ended_at=utcnow(), lease_expires_at=None)
    return conn.execute(statement.values(**values)).rowcount


def _node0(attempt: int, owner: str) -> Expected:
    """Node 0's attempt of the job, still gathering its gang."""
    return Expected.of(JobStatus.GATHERING, attempt=attempt, owner=owner)


def _still_gathering(conn: Connection, job_id: str, attempt: int) -> bool:
    query = select(Job.id).where(Job.id == job_id, Job.attempt == attempt, Job.status == JobStatus.GATHERING)
    return conn.execute(query).first() is not None


def spec_nodes(job_id: str, spec: object) -> int:
    """Job ``job_id``'s stored spec's ``nodes`` (its validated :class:`JobSpec`'s; 1 when it no longer validates)."""
    typed = stored_spec(job_id, spec)
    return typed.nodes if typed is not None else 1


def spec_gpus(job_id: str, spec: object) -> int:
    """Job ``job_id``'s stored spec's ``gpus`` per node (its validated :class:`JobSpec`'s; 0 when it no longer validates)."""
    typed = stored_spec(job_id, spec)
    return typed.gpus if typed is not None else 0
