"""SQLAlchemy ORM models. The schema changes only through Alembic migrations (``migrations/``)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, ClassVar

from sqlalchemy import JSON, BigInteger, Boolean, DateTime, Float, ForeignKey, Index, Integer, String, Text, text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from halfcast.contracts import status
from halfcast.core.db.redacted import RedactedText

#: Job statuses (:class:`halfcast.contracts.status.JobStatus`, docs/results.md, "Statuses"), as the column stores them. Terminal
#: statuses never change again.
STATUSES: tuple[str, ...] = tuple(member.value for member in status.JobStatus)
TERMINAL_STATUSES: frozenset[str] = frozenset(member.value for member in status.TERMINAL_STATUSES)
ACTIVE_STATUSES: frozenset[str] = frozenset(STATUSES) - TERMINAL_STATUSES
#: How an attempt ended (``attempts.status``; null while it runs; :class:`halfcast.contracts.status.AttemptStatus`): a
#: job's terminal statuses, and ``requeued``: a graceful worker shutdown stopped it and handed the job back.
ATTEMPT_STATUSES: tuple[str, ...] = tuple(member.value for member in status.AttemptStatus)


def utcnow() -> datetime:
    """Timezone-aware current UTC time."""
    return datetime.now(UTC)


class Base(DeclarativeBase):
    type_annotation_map: ClassVar[dict[Any, Any]] = {
        dict[str, object]: JSON,
        list[dict[str, object]]: JSON,
        list[int]: JSON,
        list[str]: JSON,
        datetime: DateTime(timezone=True),
    }


class Job(Base):
    """One submitted job and its current state (the job resource is built from this row)."""

    __tablename__ = "jobs"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    name: Mapped[str | None] = mapped_column(String(200))
    status: Mapped[str] = mapped_column(String(16), index=True)
    spec: Mapped[dict[str, object]]
    created_at: Mapped[datetime] = mapped_column(default=utcnow, index=True)
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)
    error_reason: Mapped[str | None] = mapped_column(String(64))
    error_message: Mapped[str | None] = mapped_column(RedactedText)  # URL passwords and server paths hidden on write
    step: Mapped[int] = mapped_column(Integer, default=0)
    max_steps: Mapped[int] = mapped_column(Integer)
    world_size: Mapped[int] = mapped_column(Integer)
    latest: Mapped[dict[str, object] | None]
    eval: Mapped[dict[str, object] | None]
    worker_id: Mapped[str | None] = mapped_column(String(255))
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    run_dir: Mapped[str | None] = mapped_column(Text)
    cancel_requested_at: Mapped[datetime | None]
    #: The lease of the current attempt: owned by ``worker_id``, fenced by ``attempt``,
    #: renewed by the owner's heartbeat; past it, any worker's reaper may recover the job.
    lease_expires_at: Mapped[datetime | None]
    #: ``Idempotency-Key`` of the POST that created the job (unique per owner), and the hash of its spec.
    idempotency_key: Mapped[str | None] = mapped_column(String(255))
    request_hash: Mapped[str | None] = mapped_column(String(64))
    #: The worker whose task took the queued job's broker message and has neither claimed the
    #: job nor handed the message back, and since when (migration 0007; ``worker/messages/holds.py``).
    held_by: Mapped[str | None] = mapped_column(String(255))
    held_at: Mapped[datetime | None]
    #: The succeeded run's ``end`` record: counts, ``stopped_early``, ``exported_step`` (migration 0008).
    end_info: Mapped[dict[str, object] | None]
    #: Precision switches the run made (``on_divergence: "fallback_bf16"``), oldest first; null when none.
    precision_switches: Mapped[list[dict[str, object]] | None]
    #: The current attempt's start-up so far: its newest ``phase`` record (``worker/phase_record.py``,
    #: migration 0009); null until the trainer's first one, and cleared by each claim.
    startup: Mapped[dict[str, object] | None]
    #: The ``start`` record's data report (a file dataset's rows, splits, drops, pad token); null until then.
    data_report: Mapped[dict[str, object] | None]

    attempts: Mapped[list[Attempt]] = relationship(order_by="Attempt.attempt", lazy="selectin", viewonly=True)
    #: The gang memberships of a multi-node job, every attempt's (migration 0012).
    members: Mapped[list[JobMember]] = relationship(
        order_by="(JobMember.attempt, JobMember.node_rank, JobMember.id)", lazy="selectin", viewonly=True
    )

    #: Owner of the token that created the job (``server/auth.py``); null for jobs from before
    #: authentication (migration 0004), which only admins see.
    owner: Mapped[str | None] = mapped_column(String(255))

    __table_args__ = (
        Index("ix_jobs_status_created", "status", "created_at"),
        Index("ix_jobs_owner_created", "owner", "created_at"),
        Index("ix_jobs_owner_idempotency_key", "owner", "idempotency_key", unique=True),
        Index("ix_jobs_owner_status", "owner", "status"),  # quota usage at submission (migration 0005)
    )


class Attempt(Base):
    """One launch attempt of a job: who ran it, when, and how it ended (``status``, one of
    :data:`ATTEMPT_STATUSES`; null while it runs)."""

    __tablename__ = "attempts"

    job_id: Mapped[str] = mapped_column(String(36), ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer, primary_key=True)
    worker_id: Mapped[str] = mapped_column(String(255))
    started_at: Mapped[datetime]
    ended_at: Mapped[datetime | None]
    status: Mapped[str | None] = mapped_column(String(16))
    reason: Mapped[str | None] = mapped_column(String(64))
    #: GPU indices (on the worker's host) this attempt was given; null for CPU jobs.
    gpus: Mapped[list[int] | None]
    #: The step of the checkpoint a retry resumed from (0: none, it started over); null for a
    #: first attempt (migration 0009).
    resumed_from_step: Mapped[int | None] = mapped_column(Integer)


#: ``job_members.status`` values of an open membership (:data:`halfcast.contracts.status.OPEN_MEMBER_STATUSES`), as SQL.
OPEN_MEMBERSHIP = text("status IN ('joined', 'running')")
#: Memberships that keep their node rank in their attempt: all but ``released`` ones.
RANKED_MEMBERSHIP = text("status <> 'released'")


class JobMember(Base):
    """One node of a multi-node job's gang in one attempt (``worker/gang/formation.py``, migration 0012).

    ``status`` is a :class:`halfcast.contracts.status.MemberStatus`. A worker holds at most one open
    (``joined``/``running``) membership, and an attempt's node rank belongs to one membership that was
    not ``released`` (partial unique indexes). Node 0's row carries the rendezvous port it bound on
    ``host_address``; ``lease_expires_at`` is renewed by the member's worker while it is open.
    """

    __tablename__ = "job_members"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(String(36), ForeignKey("jobs.id", ondelete="CASCADE"))
    attempt: Mapped[int] = mapped_column(Integer)
    node_rank: Mapped[int] = mapped_column(Integer)
    worker_id: Mapped[str] = mapped_column(String(255))
    host_address: Mapped[str | None] = mapped_column(String(255))
    rendezvous_port: Mapped[int | None] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(16))
    exit_code: Mapped[int | None] = mapped_column(Integer)
    joined_at: Mapped[datetime] = mapped_column(default=utcnow)
    launched_at: Mapped[datetime | None]
    ended_at: Mapped[datetime | None]
    lease_expires_at: Mapped[datetime | None]

    __table_args__ = (
        Index("ix_job_members_job_attempt", "job_id", "attempt"),
        Index(
            "ux_job_members_open_worker",
            "worker_id",
            unique=True,
            sqlite_where=OPEN_MEMBERSHIP,
            postgresql_where=OPEN_MEMBERSHIP,
        ),
        Index(
            "ux_job_members_node_rank",
            "job_id",
            "attempt",
            "node_rank",
            unique=True,
            sqlite_where=RANKED_MEMBERSHIP,
            postgresql_where=RANKED_MEMBERSHIP,
        ),
    )


class StepRow(Base):
    """The row of one step record (docs/results.md, "Step records"; the record's model is
    :class:`halfcast.contracts.records.StepRecord`) of a job; ``data`` holds the whole record."""

    __tablename__ = "step_records"

    job_id: Mapped[str] = mapped_column(String(36), ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    step: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    time: Mapped[float] = mapped_column(Float)
    data: Mapped[dict[str, object]]


class EvalRow(Base):
    """The row of one evaluation record (``{"step", "time", "loss", "accuracy"|"perplexity"}``) of a job, in ``data``.

    Every evaluation the job ran, so its validation curve survives; ``jobs.eval`` holds the newest.
    """

    __tablename__ = "eval_records"

    job_id: Mapped[str] = mapped_column(String(36), ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    step: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    time: Mapped[float] = mapped_column(Float)
    data: Mapped[dict[str, object]]


class Worker(Base):
    """A worker process that registered; ``heartbeat_at`` is renewed while it lives (``GET /workers``)."""

    __tablename__ = "workers"

    id: Mapped[str] = mapped_column(String(255), primary_key=True)
    hostname: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int] = mapped_column(Integer)
    #: GPU indices on the host this worker may hand to jobs (``[]`` for a CPU-only worker).
    gpus: Mapped[list[int]]
    concurrency: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[datetime]
    heartbeat_at: Mapped[datetime] = mapped_column(index=True)
    #: The worker's model and data roots (absolute paths on its host); null: a worker too old to report them.
    model_roots: Mapped[list[str] | None]
    data_roots: Mapped[list[str] | None]


class ApiToken(Base):
    """A bearer token of the API: only the SHA-256 of the secret is stored (``server/auth.py``)."""

    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    owner: Mapped[str] = mapped_column(String(255), index=True)
    admin: Mapped[bool] = mapped_column(Boolean, default=False)
    #: Lowercase hex SHA-256 of the whole token string (prefix included).
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    revoked_at: Mapped[datetime | None]
    #: When the token last authenticated a request (updated at most once a minute); null if never.
    last_used_at: Mapped[datetime | None]


class AuditEvent(Base):
    """One audited action: who (``actor``), when (``at``), what (``action``), on what (``subject``)."""

    __tablename__ = "audit_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(default=utcnow, index=True)
    #: The owner of the token that acted, or ``cli:<os user>`` for operator commands.
    actor: Mapped[str] = mapped_column(String(255))
    #: One of ``halfcast.core.db.audit.ACTIONS`` (``job.create``, ``quota.set``, ...).
    action: Mapped[str] = mapped_column(String(64), index=True)
    #: The job id or the token id acted on; the owner for ``quota.*``.
    subject: Mapped[str] = mapped_column(String(255))
    details: Mapped[dict[str, object] | None]


class OwnerQuota(Base):
    """Per-owner submission limits (``halfcast/core/db/quotas.py``); a null limit means "the server's default"."""

    __tablename__ = "owner_quotas"

    owner: Mapped[str] = mapped_column(String(255), primary_key=True)
    #: Jobs not yet terminal (queued, starting, running, cancelling).
    max_active_jobs: Mapped[int | None] = mapped_column(Integer)
    #: Sum of ``spec.gpus`` over the owner's jobs not yet terminal.
    max_gpus: Mapped[int | None] = mapped_column(Integer)
    #: Jobs in ``queued``.
    max_queued_jobs: Mapped[int | None] = mapped_column(Integer)
    #: Bytes of the owner's registered datasets and models (migration 0009).
    max_storage_bytes: Mapped[int | None] = mapped_column(BigInteger)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)


class CancelRequest(Base):
    """A cancel the API could not apply at once because another session held the job's row (migration 0014).

    No foreign key on purpose: inserting a row that references ``jobs`` would wait for the very row
    lock that made the request pending. The worker that runs the job reads it as a cancel
    (:meth:`worker.store.JobStore.cancel_requested`); the row goes once the job ends.
    """

    __tablename__ = "cancel_requests"

    job_id: Mapped[str] = mapped_column(String(36), primary_key=True)
    requested_at: Mapped[datetime] = mapped_column(default=utcnow)
    requested_by: Mapped[str] = mapped_column(String(255))


class RegisteredDataset(Base):
    """An uploaded dataset (``POST /datasets``): its file is ``<registry>/datasets/<sha256>.<file_format>``,
    shared by every row with the same bytes (``server/registry/``, migration 0009)."""

    __tablename__ = "datasets"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    owner: Mapped[str] = mapped_column(String(255))
    name: Mapped[str] = mapped_column(String(200))
    #: The ``jsonl`` format its rows were checked against: ``text``, ``instruction``, ``chat``, ``classification``.
    format: Mapped[str] = mapped_column(String(16))
    #: ``jsonl`` or ``csv``.
    file_format: Mapped[str] = mapped_column(String(8))
    rows: Mapped[int] = mapped_column(BigInteger)
    bytes: Mapped[int] = mapped_column(BigInteger)
    #: Lowercase hex SHA-256 of the file (its name in the registry).
    sha256: Mapped[str] = mapped_column(String(64), index=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    #: ``Idempotency-Key`` of the upload that created it (unique per owner) and the hash of what it sent (0013).
    idempotency_key: Mapped[str | None] = mapped_column(String(255))
    request_hash: Mapped[str | None] = mapped_column(String(64))

    __table_args__ = (
        Index("ix_datasets_owner_created", "owner", "created_at"),
        Index("ix_datasets_owner_idempotency_key", "owner", "idempotency_key", unique=True),
    )


class RegisteredModel(Base):
    """A registered Hugging Face model directory, ``<registry>/models/<id>/``: uploaded (``POST /models``)
    or registered from a job's ``export/model`` (``source_job_id``) (migration 0009)."""

    __tablename__ = "models"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    owner: Mapped[str] = mapped_column(String(255))
    name: Mapped[str] = mapped_column(String(200))
    #: ``model_type`` of its ``config.json``.
    model_type: Mapped[str] = mapped_column(String(64))
    files: Mapped[int] = mapped_column(Integer)
    bytes: Mapped[int] = mapped_column(BigInteger)
    #: SHA-256 over the sorted file names and each file's SHA-256 (``server/registry/model_tree.py``).
    sha256: Mapped[str] = mapped_column(String(64))
    #: The job whose exported model this is; null for an upload.
    source_job_id: Mapped[str | None] = mapped_column(String(36))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    #: ``Idempotency-Key`` of the upload that created it (unique per owner) and the hash of what it sent (0013).
    idempotency_key: Mapped[str | None] = mapped_column(String(255))
    request_hash: Mapped[str | None] = mapped_column(String(64))

    __table_args__ = (
        Index("ix_models_owner_created", "owner", "created_at"),
        Index("ix_models_owner_idempotency_key", "owner", "idempotency_key", unique=True),
    )
