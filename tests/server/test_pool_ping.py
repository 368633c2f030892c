"""The API's pool pings only connections that sat idle; ``GET /jobs/{id}``'s read survives a dead connection.

PostgreSQL only: a connection is killed from the server side (``pg_terminate_backend``),
as a database restart or an idle timeout would.
"""

from __future__ import annotations

import pytest
from api_support import insert_job, make_token
from sqlalchemy import Engine, event, text
from sqlalchemy.engine.interfaces import DBAPIConnection

from halfcast.core.db.engine import make_engine, make_session_factory
from halfcast.core.db.job_reads import read_job
from halfcast.core.db.tokens import hash_token

pytestmark = pytest.mark.postgres


@pytest.fixture
def url(migrated_postgres_url: str) -> str:
    return migrated_postgres_url


def _pid(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())


def _kill(url: str, pid: int) -> None:
    other = make_engine(url)
    try:
        with other.connect() as conn:
            conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
            conn.commit()
    finally:
        other.dispose()


def _statements(engine: Engine) -> list[str]:
    seen: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda *args: seen.append(args[2]))
    return seen


def _pings(engine: Engine) -> list[int]:
    pings: list[int] = []
    dialect = engine.dialect
    original = dialect.do_ping

    def counted(dbapi_connection: DBAPIConnection) -> bool:
        pings.append(1)
        return bool(original(dbapi_connection))

    dialect.do_ping = counted  # type: ignore[method-assign]  # counts this engine's pings; no monkeypatch here
    return pings


def test_a_connection_back_from_the_pool_at_once_is_not_pinged(url: str) -> None:
    engine = make_engine(url, ping_after_idle_s=60)
    try:
        pings = _pings(engine)
        for _ in range(3):
            _pid(engine)
        assert len(pings) == 1  # the first checkout only (never returned before)
    finally:
        engine.dispose()


def test_an_idle_connection_is_pinged_and_a_dead_one_replaced(url: str) -> None:
    engine = make_engine(url, ping_after_idle_s=0)
    try:
        pings = _pings(engine)
        first = _pid(engine)
        _kill(url, first)
        assert _pid(engine) != first  # the ping found it dead; the pool connected again
        assert len(pings) >= 2
    finally:
        engine.dispose()


def test_the_job_read_runs_again_on_a_new_connection_when_its_connection_died(url: str) -> None:
    engine = make_engine(url, ping_after_idle_s=60)  # no ping: the read itself meets the dead connection
    try:
        sessions = make_session_factory(engine)
        job_id = insert_job(sessions, status="running")
        token = make_token(url, "alice", admin=True)
        _kill(url, _pid(engine))
        read = read_job(engine, job_id, hash_token(token))
        assert read.job is not None and read.job.id == job_id and read.token is not None
    finally:
        engine.dispose()
