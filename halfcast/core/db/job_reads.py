"""The read behind ``GET /jobs/{id}``: the caller's token, the job row and its attempts in one statement.

A poller asks for one job again and again, so this read is kept to one round trip
on one connection, with no transaction around it and no ORM objects::

    SELECT <token>, <job>, <attempt> FROM api_tokens
    LEFT JOIN jobs ON jobs.id = :job_id LEFT JOIN attempts ON attempts.job_id = jobs.id
    WHERE api_tokens.token_hash = :token_hash ORDER BY attempts.attempt

No row: the token is unknown. Without authentication the token part is left out.
A multi-node job's gang memberships (``job_members``) take a second statement, only for such jobs.
Only the columns the job resource is built from are read (not the lease, the run
directory or ``updated_at``, which change without the resource changing). The
token's ``last_used_at`` is refreshed as :func:`halfcast.core.db.tokens.resolve` does.

The statements (:func:`read_statement`, :func:`members_statement`) and the mapping of
their rows to views (:func:`job_view`, :func:`token_view`, :func:`with_members`,
:func:`needs_touch`) are shared by two executions: :func:`read_job`, through SQLAlchemy on
the engine's pool (:func:`halfcast.core.db.engine.read_connection`; SQLite, in a worker thread),
and :class:`halfcast.core.db.job_reads_async.AsyncJobReads`, on psycopg's async connections in
the event loop (PostgreSQL).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import cache
from typing import Any

from sqlalchemy import BindParameter, Engine, Select, bindparam, select
from sqlalchemy.exc import DBAPIError

from halfcast.core.db.engine import read_connection
from halfcast.core.db.models import ApiToken, Attempt, Job, JobMember, utcnow
from halfcast.core.db.tokens import last_use_is_stale, touch_statement

#: Columns of the token, the job and one attempt, in the order of the views' fields.
TOKEN_COLUMNS = (ApiToken.id, ApiToken.owner, ApiToken.admin, ApiToken.revoked_at, ApiToken.last_used_at)
JOB_COLUMNS = (
    Job.id,
    Job.owner,
    Job.name,
    Job.status,
    Job.spec,
    Job.created_at,
    Job.started_at,
    Job.finished_at,
    Job.error_reason,
    Job.error_message,
    Job.step,
    Job.max_steps,
    Job.world_size,
    Job.latest,
    Job.eval,
    Job.attempt,
    Job.precision_switches,
    Job.end_info,
    Job.startup,
    Job.data_report,
)
ATTEMPT_COLUMNS = (
    Attempt.attempt,
    Attempt.worker_id,
    Attempt.started_at,
    Attempt.ended_at,
    Attempt.status,
    Attempt.reason,
    Attempt.gpus,
    Attempt.resumed_from_step,
)


@dataclass(frozen=True)
class TokenView:
    """The token a request presented (``revoked_at`` set: revoked)."""

    id: int
    owner: str
    admin: bool
    revoked_at: datetime | None
    last_used_at: datetime | None


@dataclass(frozen=True)
class AttemptView:
    """One ``attempts`` row, as :class:`server.schemas.AttemptPublic` reads it."""

    attempt: int
    worker_id: str
    started_at: datetime
    ended_at: datetime | None
    status: str | None
    reason: str | None
    gpus: list[int] | None
    resumed_from_step: int | None = None


#: Columns of one gang membership, in the order of :class:`MemberView`'s fields.
MEMBER_COLUMNS = (
    JobMember.attempt,
    JobMember.node_rank,
    JobMember.worker_id,
    JobMember.host_address,
    JobMember.status,
    JobMember.exit_code,
    JobMember.joined_at,
    JobMember.ended_at,
)


@dataclass(frozen=True)
class MemberView:
    """One ``job_members`` row, as :class:`halfcast.contracts.resources.MemberPublic` reads it."""

    attempt: int
    node_rank: int
    worker_id: str
    host_address: str | None
    status: str
    exit_code: int | None
    joined_at: datetime
    ended_at: datetime | None


@dataclass(frozen=True)
class JobView:
    """The columns of a ``jobs`` row the job resource is built from, and its attempts, oldest first.

    Everything the resource shows is in here, so its ``repr`` determines the resource
    (:func:`server.http.etags.job_etag`).
    """

    id: str
    owner: str | None
    name: str | None
    status: str
    spec: dict[str, object]
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    error_reason: str | None
    error_message: str | None
    step: int
    max_steps: int
    world_size: int
    latest: dict[str, object] | None
    eval: dict[str, object] | None
    attempt: int
    precision_switches: list[dict[str, object]] | None
    end_info: dict[str, object] | None
    startup: dict[str, object] | None
    data_report: dict[str, object] | None
    # keyword-only: the row's columns fill the fields above, positionally
    attempts: tuple[AttemptView, ...] = field(default=(), kw_only=True)
    members: tuple[MemberView, ...] = field(default=(), kw_only=True)


@dataclass(frozen=True)
class JobRead:
    """What one read found: the token (``None``: unknown, or none asked for) and the job (``None``: no such job)."""

    token: TokenView | None
    job: JobView | None


@cache
def read_statement(with_token: bool) -> Select[*tuple[Any, ...]]:
    """The read, built once (bound parameters ``job_id`` and, with the token, ``token_hash``).

    Both drivers run it: SQLAlchemy on a pooled connection (:func:`read_job`), and
    :mod:`halfcast.core.db.job_reads_async` compiled once to psycopg's SQL.
    """
    job_id: BindParameter[str] = bindparam("job_id")
    query: Select[*tuple[Any, ...]]  # the row's columns differ with and without the token
    if not with_token:
        query = select(*JOB_COLUMNS, *ATTEMPT_COLUMNS).where(Job.id == job_id)
    else:
        query = (
            select(*TOKEN_COLUMNS, *JOB_COLUMNS, *ATTEMPT_COLUMNS)
            .select_from(ApiToken)
            .outerjoin(Job, Job.id == job_id)
            .where(ApiToken.token_hash == bindparam("token_hash"))
        )
    return query.outerjoin(Attempt, Attempt.job_id == Job.id).order_by(Attempt.attempt)


@cache
def members_statement() -> Select[*tuple[Any, ...]]:
    """The gang memberships of one attempt of a job, built once (bound parameters ``job_id`` and ``attempt``)."""
    return (
        select(*MEMBER_COLUMNS)
        .where(JobMember.job_id == bindparam("job_id"), JobMember.attempt == bindparam("attempt"))
        .order_by(JobMember.node_rank, JobMember.id)
    )


def read_params(job_id: str, token_hash: str | None) -> dict[str, str]:
    """The read's parameters. An id with NUL (which PostgreSQL cannot compare) is looked up as ``""``: no job."""
    params = {"job_id": "" if "\x00" in job_id else job_id}
    if token_hash is not None:
        params["token_hash"] = token_hash
    return params


def job_view(rows: Sequence[Sequence[Any]], with_token: bool) -> JobView | None:
    """The job of the read's ``rows``, or ``None`` when the outer join found none (no members yet)."""
    start = len(TOKEN_COLUMNS) if with_token else 0
    if not rows or rows[0][start] is None:
        return None
    end = start + len(JOB_COLUMNS)
    attempts = tuple(AttemptView(*row[end:]) for row in rows if row[end] is not None)
    return JobView(*rows[0][start:end], attempts=attempts)


def token_view(rows: Sequence[Sequence[Any]]) -> TokenView | None:
    """The token of the read's ``rows`` (read with the token), or ``None`` when no token has the hash."""
    return TokenView(*rows[0][: len(TOKEN_COLUMNS)]) if rows else None


def members_params(job: JobView | None) -> dict[str, str | int] | None:
    """The parameters of :func:`members_statement` for ``job``; ``None`` when it has none to read (not multi-node)."""
    if job is None or not _multi_node(job.spec):
        return None
    return {"job_id": job.id, "attempt": job.attempt}


def with_members(job: JobView, rows: Iterable[Sequence[Any]]) -> JobView:
    """``job`` with the gang memberships of :func:`members_statement`'s ``rows``."""
    return replace(job, members=tuple(MemberView(*row) for row in rows))


def needs_touch(token: TokenView, now: datetime) -> bool:
    """Whether the live ``token``'s ``last_used_at`` is to be refreshed now (:func:`.tokens.last_use_is_stale`)."""
    return token.revoked_at is None and last_use_is_stale(token.last_used_at, now)


def touched(token: TokenView, now: datetime) -> TokenView:
    """``token`` as it is once its ``last_used_at`` was refreshed at ``now``."""
    return replace(token, last_used_at=now)


def read_job(engine: Engine, job_id: str, token_hash: str | None) -> JobRead:
    """The job ``job_id`` and, when ``token_hash`` is given, the token with that hash, in one statement.

    Without ``token_hash`` (authentication off) ``token`` is ``None``. An id with NUL
    (which PostgreSQL cannot compare) finds no job. A live token whose ``last_used_at``
    is stale gets it refreshed, in a transaction of its own after the read.

    A connection found dead (the API's pool pings only connections that sat idle:
    :mod:`halfcast.core.db.engine`) is dropped and the read made once more, on a new one.
    """
    params = read_params(job_id, token_hash)
    try:
        return _read_job(engine, params, token_hash)
    except DBAPIError as exc:
        if not exc.connection_invalidated:
            raise
        return _read_job(engine, params, token_hash)  # the pool replaced the dead connection


def _read_job(engine: Engine, params: dict[str, str], token_hash: str | None) -> JobRead:
    with read_connection(engine) as conn:
        rows = conn.execute(read_statement(token_hash is not None), params).all()
        job = job_view(rows, token_hash is not None)
        extra = members_params(job)
        if job is not None and extra is not None:
            job = with_members(job, conn.execute(members_statement(), extra))
        conn.commit()  # end the read (SQLite) before the write that may follow
        if token_hash is None:
            return JobRead(None, job)
        token = token_view(rows)
        if token is None:
            return JobRead(None, None)
        now = utcnow()
        if needs_touch(token, now):
            conn.execute(touch_statement(token.id, now))
            conn.commit()
            token = touched(token, now)
        return JobRead(token, job)


def _multi_node(spec: Any) -> bool:
    nodes = spec.get("nodes", 1) if isinstance(spec, dict) else 1
    return isinstance(nodes, int) and nodes > 1
