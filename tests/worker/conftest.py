"""Fixtures for worker tests: a SQLite job database (or SQLite and PostgreSQL), job rows, no stray processes."""

from __future__ import annotations

import contextlib
import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, event, text
from worker_support import MakeJob, insert_job

from halfcast.core.db.engine import make_engine
from halfcast.core.db.models import Base
from halfcast.core.settings import Settings
from worker.launch.process_tree import RunProcess
from worker.store import JobStore


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    """A SQLite database with the job tables."""
    engine = make_engine(f"sqlite:///{tmp_path / 'jobs.db'}")
    Base.metadata.create_all(engine)
    yield engine
    engine.dispose()


@pytest.fixture
def store(engine: Engine) -> JobStore:
    return JobStore(engine)


@pytest.fixture
def make_job(engine: Engine) -> MakeJob:
    def make(spec: dict[str, Any] | None = None, status: str = "queued") -> str:
        return insert_job(engine, spec, status)

    return make


@pytest.fixture(autouse=True)
def no_stray_processes() -> Iterator[None]:
    """After each test, SIGKILL every process the test's runs left behind (so a failing test leaks nothing)."""
    started: list[RunProcess] = []
    original = RunProcess.__init__

    def recording_init(self: RunProcess, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        started.append(self)

    patch = pytest.MonkeyPatch()  # its own: undone here, before the clean-up below, not with the test's
    patch.setattr(RunProcess, "__init__", recording_init)
    try:
        yield
    finally:
        patch.undo()
        for process in started:
            for info in process.tree.refresh():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(info.pid, signal.SIGKILL)
            with contextlib.suppress(Exception):
                process.popen.wait(timeout=5)


@pytest.fixture
def settings(data_dir: Path) -> Settings:
    return Settings(data_dir=data_dir, worker_poll_interval_s=0.05, cancel_grace_s=2.0)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    """The job tables on SQLite, then on the real PostgreSQL (in a schema of its own)."""
    if request.param == "sqlite":
        engine = make_engine(f"sqlite:///{tmp_path / 'jobs.db'}")
        Base.metadata.create_all(engine)
        yield engine
        engine.dispose()
        return
    yield from _postgres_schema(request.getfixturevalue("postgres_url"))


def _postgres_schema(url: str) -> Iterator[Engine]:
    schema = f"worker_store_{uuid.uuid4().hex[:10]}"
    engine = make_engine(url)
    with engine.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))

    @event.listens_for(engine, "connect")
    def _search_path(dbapi_connection, _record):
        with dbapi_connection.cursor() as cursor:
            cursor.execute(f'SET search_path TO "{schema}"')
        dbapi_connection.commit()

    engine.dispose()
    Base.metadata.create_all(engine)
    yield engine
    engine.dispose()
    cleanup = create_engine(make_engine(url).url)
    with cleanup.begin() as conn:
        conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
    cleanup.dispose()
