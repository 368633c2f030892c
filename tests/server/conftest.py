"""Fixtures for the API tests: a migrated database on each backend, a fake queue, a client.

``client`` authenticates as an admin (``admin_token``), so tests that are not about
authentication need no token handling; ``tests/server/test_auth_routes.py`` covers it.

``database_url`` is parametrized over SQLite (a migrated file in the test's data dir)
and PostgreSQL (the session database, migrated once, emptied before each test), so
every test that uses it runs on both backends. The schema always comes from the
Alembic migrations, never ``create_all``.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from api_support import FakeQueue, make_token
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session, sessionmaker

from halfcast.core.db.engine import make_engine, make_session_factory
from halfcast.core.db.migrate import upgrade_database
from halfcast.core.db.models import Base
from halfcast.core.settings import PollReads, Settings
from server.app import create_app


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite file migrated to head once per session; tests get a copy."""
    path = tmp_path_factory.mktemp("sqlite-template") / "halfcast.db"
    upgrade_database(f"sqlite:///{path}")
    return path


@pytest.fixture(scope="session")
def migrated_postgres_url(postgres_url: str) -> str:
    """The session's PostgreSQL database, migrated to head."""
    upgrade_database(postgres_url)
    return postgres_url


#: Every sequence of the public schema back to its start (what ``TRUNCATE ... RESTART IDENTITY`` does).
_RESTART_SEQUENCES = text(
    "SELECT setval(oid::regclass, 1, false) FROM pg_class WHERE relkind = 'S' AND relnamespace = 'public'::regnamespace"
)


def _empty_postgres(url: str) -> None:
    """Delete every row of the models' tables and restart their ids.

    ``DELETE`` rather than ``TRUNCATE``: on a few rows it writes no new files and waits for no
    checkpoint-sized flush (12 ms against 33 ms on a quiet machine, far more under the suite's
    load, for each of some 750 PostgreSQL tests).
    """
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            for table in reversed(Base.metadata.sorted_tables):  # children before parents
                conn.execute(table.delete())
            conn.execute(_RESTART_SEQUENCES)
    finally:
        engine.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database_url(request: pytest.FixtureRequest, data_dir: Path, sqlite_template: Path) -> str:
    """URL of an empty, migrated database: a SQLite file, or the PostgreSQL test database."""
    if request.param == "sqlite":
        path = data_dir / "halfcast.db"
        shutil.copyfile(sqlite_template, path)
        return f"sqlite:///{path}"
    url: str = request.getfixturevalue("migrated_postgres_url")
    _empty_postgres(url)
    return url


@pytest.fixture
def settings(data_dir: Path, database_url: str) -> Settings:
    """Settings for one test: its data dir and database, the embedded broker, faults refused, every poll read.

    ``poll_reads=database``: these tests write to the database directly (as the worker does) and poll at
    once, which PostgreSQL's default (``auto``: reads kept until notified) answers from a kept read until
    the notification arrives, a millisecond or so later. tests/server/test_notified_reads.py tests the
    default, and what it keeps and drops.
    """
    return Settings(
        data_dir=data_dir,
        database_url=database_url,
        broker_url=None,
        allow_faults=False,
        poll_reads=PollReads.DATABASE,
    )


@pytest.fixture
def fake_queue() -> FakeQueue:
    """A fresh in-memory queue."""
    return FakeQueue()


@pytest.fixture
def admin_token(database_url: str) -> str:
    """A live admin token (owner ``tester``) in the test database."""
    return make_token(database_url, "tester", admin=True)


@pytest.fixture
def auth_headers(admin_token: str) -> dict[str, str]:
    """``Authorization`` header of :func:`admin_token`."""
    return {"Authorization": f"Bearer {admin_token}"}


@pytest.fixture
def client(settings: Settings, fake_queue: FakeQueue, auth_headers: dict[str, str]) -> Iterator[TestClient]:
    """A client of an app on ``settings`` with the fake queue (lifespan started), authenticated as an admin."""
    with TestClient(create_app(settings, fake_queue), headers=auth_headers) as test_client:
        yield test_client


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    """A separate engine on the test database, for arranging and checking rows directly."""
    engine = make_engine(database_url)
    yield engine
    engine.dispose()


@pytest.fixture
def sessions(engine: Engine) -> sessionmaker[Session]:
    """Session factory on :func:`engine`."""
    return make_session_factory(engine)


@pytest.fixture
def clean_cli_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No ``HALFCAST_*`` from outside; whatever the commands write is undone after the test."""
    for name in (
        "HALFCAST_API_WORKERS",
        "HALFCAST_HOST",
        "HALFCAST_PORT",
        "HALFCAST_DATA_DIR",
        "HALFCAST_DATABASE_URL",
    ):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    monkeypatch.setenv("HALFCAST_DATA_DIR", str(tmp_path / "data"))
