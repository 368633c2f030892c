"""Helpers shared by the API tests (imported as ``api_support``; pytest puts this folder on ``sys.path``)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from anyio.from_thread import BlockingPortal
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session, sessionmaker
from starlette.applications import Starlette
from starlette.datastructures import State
from starlette.testclient import TestClient
from starlette.types import ASGIApp

from halfcast.core.db.engine import make_engine, make_session_factory
from halfcast.core.db.job_readers import JobReads
from halfcast.core.db.models import Job, StepRow
from halfcast.core.db.tokens import create_token
from server.http.recent_reads import RecentJobReads

#: A small valid job spec (the digits example, shortened).
VALID_SPEC: dict[str, Any] = {
    "name": "digits-fp16",
    "model": {"name": "mlp", "config": {"hidden_sizes": [64]}},
    "dataset": {"name": "digits"},
    "precision": "fp16",
    "loss_scale": {"mode": "dynamic", "init_scale": 16777216},
    "micro_batch_size": 32,
    "max_steps": 50,
}


class FakeQueue:
    """In-memory ``JobQueue``: records job ids, or raises ``error`` when set.

    ``on_enqueue`` runs before recording, e.g. to look at the database from another connection.
    """

    def __init__(self) -> None:
        self.sent: list[str] = []
        self.error: Exception | None = None
        self.on_enqueue: Callable[[str], None] | None = None

    def enqueue(self, job_id: str) -> None:
        if self.on_enqueue is not None:
            self.on_enqueue(job_id)
        if self.error is not None:
            raise self.error
        self.sent.append(job_id)


def app_state(app: ASGIApp) -> State:
    """``app.state`` of the FastAPI app a ``TestClient`` or ``LiveServer`` serves (typed there as any ASGI app)."""
    assert isinstance(app, Starlette), app
    return app.state


def database_reads(app: ASGIApp) -> JobReads:
    """What ``GET /jobs/{id}`` reads the database with: ``job_reads``, or what it keeps reads of (notified polls)."""
    reads: JobReads = app_state(app).job_reads
    return reads.inner if isinstance(reads, RecentJobReads) else reads


def record_step(record: Mapping[str, object]) -> int:
    """The ``step`` of a step record as the API returns it."""
    step = record["step"]
    assert isinstance(step, int), record
    return step


def portal(client: TestClient) -> BlockingPortal:
    """The portal into the event loop of an entered ``client`` (``with client:``; None before)."""
    assert client.portal is not None, "the client is not entered"
    return client.portal


#: Engines :func:`make_token` keeps open, by URL (the last few: each SQLite test database is a file of its own).
_TOKEN_ENGINES: dict[str, Engine] = {}
_KEPT_ENGINES = 4


def _token_engine(database_url: str) -> Engine:
    """An engine on ``database_url`` kept between calls: a test makes several tokens, and a new engine each time
    cost a connection (and its session settings) per token."""
    engine = _TOKEN_ENGINES.pop(database_url, None) or make_engine(database_url)
    _TOKEN_ENGINES[database_url] = engine  # the most recent last
    while len(_TOKEN_ENGINES) > _KEPT_ENGINES:
        _TOKEN_ENGINES.pop(next(iter(_TOKEN_ENGINES))).dispose()
    return engine


def make_token(database_url: str, owner: str, *, admin: bool = False) -> str:
    """Create a token for ``owner`` directly in the database at ``database_url``; return its secret."""
    with make_session_factory(_token_engine(database_url))() as session:
        return create_token(session, owner, admin=admin, actor="cli:test").secret


def count_rows(sessions: sessionmaker[Session], model: type[Job] | type[StepRow] = Job) -> int:
    """Number of rows in ``model``'s table."""
    with sessions() as session:
        return session.scalar(select(func.count()).select_from(model)) or 0


BASE_TIME = datetime(2030, 1, 1, tzinfo=UTC)


def insert_job(
    sessions: sessionmaker[Session],
    *,
    status: str = "queued",
    created_at: datetime | None = None,
    latest: dict[str, Any] | None = None,
    job_id: str | None = None,
    seconds: float = 0.0,
    owner: str | None = None,
) -> str:
    """Insert a job row directly (``created_at`` = ``BASE_TIME + seconds`` unless given); return its id.

    ``owner`` null makes a job from before authentication (only admins see it).
    """
    created = created_at or BASE_TIME + timedelta(seconds=seconds)
    job = Job(
        id=job_id or str(uuid.uuid4()),
        name=None,
        status=status,
        spec=dict(VALID_SPEC),
        created_at=created,
        updated_at=created,
        step=int(latest["step"]) if latest else 0,
        max_steps=50,
        world_size=1,
        latest=latest,
        attempt=0 if status == "queued" else 1,
        owner=owner,
    )
    with sessions() as session:
        session.add(job)
        session.commit()
    return job.id


def insert_steps(sessions: sessionmaker[Session], job_id: str, steps: range) -> None:
    """Insert one step record per step in ``steps`` (loss = 1/step, step 3 overflows)."""
    with sessions() as session:
        for step in steps:
            data = {
                "step": step,
                "time": 1000.0 + step,
                "loss": 1.0 / step,
                "loss_scale": 1024.0,
                "overflow": step == 3,
                "skipped_steps": int(step >= 3),
                "grad_norm": None if step == 3 else 0.5,
                "lr": 0.001,
                "samples_per_second": 500.0,
                "tokens_per_second": None,
            }
            session.add(StepRow(job_id=job_id, step=step, time=1000.0 + step, data=data))
        session.commit()
