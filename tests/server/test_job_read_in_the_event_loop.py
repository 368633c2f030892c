"""``GET /jobs/{id}``'s read in the event loop on PostgreSQL (:mod:`halfcast.core.db.job_reads_async`), and the SQLite path.

The async read must find what :func:`halfcast.core.db.job_reads.read_job` finds, view for
view; refresh a stale token's ``last_used_at``; replace a dead connection once (and
only once); and answer 503 when the database cannot be reached. On SQLite the read
stays :func:`read_job` in a worker thread.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Awaitable, Callable, Iterator
from datetime import timedelta
from typing import Any, TypeVar

import psycopg
import pytest
from api_support import BASE_TIME, FakeQueue, app_state, database_reads, insert_job, make_token, portal
from fastapi.testclient import TestClient
from sqlalchemy import Engine, event, insert, select, text, update
from sqlalchemy.orm import Session, sessionmaker

from halfcast.core.db.async_pool import AsyncPool, DeadConnection, PoolBusy, connector
from halfcast.core.db.engine import PoolLimits, make_engine, make_session_factory
from halfcast.core.db.job_readers import ThreadedJobReads, job_reads_for
from halfcast.core.db.job_reads import JobRead, read_job
from halfcast.core.db.job_reads_async import AsyncJobReads
from halfcast.core.db.models import ApiToken, Attempt, Job, JobMember, utcnow
from halfcast.core.db.tokens import hash_token
from halfcast.core.settings import Settings
from server.app import create_app, poll_pool_limits

T = TypeVar("T")
LIMITS = PoolLimits(size=2, max_overflow=0, timeout_s=0.2)


@pytest.fixture
def pg_engine(migrated_postgres_url: str) -> Iterator[Engine]:
    engine = make_engine(migrated_postgres_url)
    yield engine
    engine.dispose()


@pytest.fixture
def pg_sessions(pg_engine: Engine) -> sessionmaker[Session]:
    return make_session_factory(pg_engine)


def _async_reads(engine: Engine, ping_after_idle_s: float = 60.0) -> AsyncJobReads:
    reads = job_reads_for(engine, LIMITS, ping_after_idle_s=ping_after_idle_s)
    assert isinstance(reads, AsyncJobReads)
    return reads


def _in_loop(engine: Engine, work: Callable[[AsyncJobReads], Awaitable[T]]) -> T:
    """``work`` on fresh async reads of ``engine``, in an event loop of its own (the pool closed after)."""

    async def scenario() -> T:
        reads = _async_reads(engine)
        try:
            return await work(reads)
        finally:
            await reads.close()

    return asyncio.run(scenario())


def _token(url: str, owner: str, *, admin: bool = False, used_now: bool = True, revoked: bool = False) -> str:
    """A token's hash; ``used_now``: its ``last_used_at`` is fresh, so no read rewrites it."""
    secret = make_token(url, owner, admin=admin)
    engine = make_engine(url)
    values: dict[str, Any] = {"last_used_at": utcnow() if used_now else None}
    if revoked:
        values["revoked_at"] = utcnow()
    with engine.begin() as conn:
        conn.execute(update(ApiToken).where(ApiToken.token_hash == hash_token(secret)).values(**values))
    engine.dispose()
    return hash_token(secret)


def _full_job(sessions: sessionmaker[Session]) -> str:
    """A multi-node running job with every kind of column set, two attempts and gang memberships in both."""
    job_id = insert_job(sessions, status="running", latest={"step": 7, "loss": 0.125, "lr": 1e-3}, owner="alice")
    with sessions() as session:
        spec = dict(session.get_one(Job, job_id).spec, nodes=2)
        session.execute(
            update(Job)
            .where(Job.id == job_id)
            .values(
                spec=spec,
                attempt=2,
                started_at=BASE_TIME,
                eval={"step": 5, "loss": 0.5, "accuracy": 0.75},
                precision_switches=[{"step": 3, "from": "fp16", "to": "bf16"}],
                startup={"phase": "model", "seconds": 1.5},
                error_message="é ünïcode",
            )
        )
        for attempt, ended in ((1, BASE_TIME + timedelta(minutes=1)), (2, None)):
            session.execute(
                insert(Attempt).values(
                    job_id=job_id,
                    attempt=attempt,
                    worker_id=f"w/{attempt}",
                    started_at=BASE_TIME,
                    ended_at=ended,
                    gpus=[0, 1],
                )
            )
            for rank in (1, 0):
                session.execute(
                    insert(JobMember).values(
                        job_id=job_id,
                        attempt=attempt,
                        node_rank=rank,
                        worker_id=f"w/{attempt}/{rank}",
                        host_address="10.0.0.1",
                        status="running" if ended is None else "exited",
                        exit_code=None if ended is None else 0,
                        joined_at=BASE_TIME,
                        ended_at=ended,
                    )
                )
        session.commit()
    return job_id


@pytest.mark.postgres
def test_the_async_read_finds_what_the_sync_read_finds(
    pg_engine: Engine, pg_sessions: sessionmaker[Session], migrated_postgres_url: str
) -> None:
    url = migrated_postgres_url
    full = _full_job(pg_sessions)
    plain = insert_job(pg_sessions, owner="bob")
    admin, alice = _token(url, "root", admin=True), _token(url, "alice")
    revoked = _token(url, "carol", revoked=True)
    cases: list[tuple[str, str | None]] = [
        (full, admin),
        (full, alice),
        (plain, alice),  # another owner's job: found; the route decides visibility
        (full, None),  # authentication off
        (plain, None),
        ("no-such-job", admin),
        ("a\x00b", admin),
        (full, revoked),
        (full, hash_token("hc_unknown")),
        ("no-such-job", None),
    ]
    expected = [read_job(pg_engine, job_id, token_hash) for job_id, token_hash in cases]

    async def reads(async_reads: AsyncJobReads) -> list[JobRead]:
        return [await async_reads.read(job_id, token_hash) for job_id, token_hash in cases]

    got = _in_loop(pg_engine, reads)
    assert got == expected
    assert expected[0].job is not None and len(expected[0].job.members) == 2 and len(expected[0].job.attempts) == 2
    assert expected[-2] == JobRead(None, None)


@pytest.mark.postgres
def test_the_async_read_refreshes_a_stale_tokens_last_use(
    pg_engine: Engine, pg_sessions: sessionmaker[Session], migrated_postgres_url: str
) -> None:
    job_id = insert_job(pg_sessions)
    token_hash = _token(migrated_postgres_url, "dave", used_now=False)
    before = utcnow()
    read = _in_loop(pg_engine, lambda reads: reads.read(job_id, token_hash))
    with pg_engine.connect() as conn:
        used = conn.execute(select(ApiToken.last_used_at).where(ApiToken.token_hash == token_hash)).scalar_one()
    assert used is not None and used >= before
    assert read.token is not None and read.token.last_used_at == used  # as refreshed: not due again when kept


def _kill(url: str, pid: int) -> None:
    engine = make_engine(url)
    with engine.begin() as conn:
        conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
    engine.dispose()


@pytest.mark.postgres
def test_a_dead_connection_is_replaced_and_the_read_made_again(
    pg_engine: Engine, pg_sessions: sessionmaker[Session], migrated_postgres_url: str
) -> None:
    job_id = insert_job(pg_sessions)
    token_hash = _token(migrated_postgres_url, "erin", admin=True)

    async def scenario(reads: AsyncJobReads) -> tuple[JobRead, int, int]:
        conn = await reads.pool.acquire()
        first = conn.info.backend_pid
        await reads.pool.release(conn)
        _kill(migrated_postgres_url, first)  # the pool's idle connection dies (not pinged: idle < 60 s)
        read = await reads.read(job_id, token_hash)
        conn = await reads.pool.acquire()
        second = conn.info.backend_pid
        await reads.pool.release(conn)
        return read, first, second

    read, first, second = _in_loop(pg_engine, scenario)
    assert read.job is not None and read.job.id == job_id and read.token is not None
    assert second != first


@pytest.mark.postgres
def test_work_that_keeps_meeting_a_dead_connection_is_run_twice_then_fails(pg_engine: Engine) -> None:
    attempts: list[int] = []

    async def dies(conn: psycopg.AsyncConnection) -> None:
        attempts.append(conn.info.backend_pid)
        await conn.execute("SELECT pg_terminate_backend(pg_backend_pid())")

    async def scenario(reads: AsyncJobReads) -> None:
        await reads.pool.run(dies)

    with pytest.raises(DeadConnection):
        _in_loop(pg_engine, scenario)
    assert len(attempts) == 2 and attempts[0] != attempts[1]


@pytest.mark.postgres
def test_a_pool_with_every_connection_out_says_busy_after_its_timeout(pg_engine: Engine) -> None:
    async def scenario(reads: AsyncJobReads) -> float:
        held = [await reads.pool.acquire() for _ in range(LIMITS.size + LIMITS.max_overflow)]
        started = asyncio.get_running_loop().time()
        try:
            with pytest.raises(PoolBusy):
                await reads.pool.acquire()
            return asyncio.get_running_loop().time() - started
        finally:
            for conn in held:
                await reads.pool.release(conn)

    waited = _in_loop(pg_engine, scenario)
    assert LIMITS.timeout_s * 0.9 <= waited < LIMITS.timeout_s + 1.0


def test_an_unreachable_database_is_503_on_the_poll_as_on_the_other_routes(tmp_path: Any) -> None:
    settings = Settings(
        data_dir=tmp_path, database_url="postgresql+psycopg://postgres@127.0.0.1:1/nowhere", broker_url=None
    )
    with TestClient(create_app(settings, FakeQueue()), headers={"Authorization": "Bearer hc_x"}) as client:
        assert isinstance(database_reads(client.app), AsyncJobReads)
        poll, listing = client.get(f"/jobs/{uuid.uuid4()}"), client.get("/jobs")
    assert poll.status_code == listing.status_code == 503
    assert poll.json() == listing.json() == {"detail": "database unavailable"}
    assert poll.headers["retry-after"] == listing.headers["retry-after"] == "5"


def test_an_unreachable_database_raises_from_the_pool() -> None:
    async def scenario() -> None:
        pool = AsyncPool(connector({"host": "127.0.0.1", "port": 1, "dbname": "x"}), LIMITS, ping_after_idle_s=1.0)
        for _ in range(LIMITS.size + LIMITS.max_overflow + 1):  # more than its slots: a leaked slot would be PoolBusy
            with pytest.raises(psycopg.OperationalError):
                await pool.run(lambda conn: conn.execute("SELECT 1"))
        assert pool.idle == 0

    asyncio.run(scenario())


def test_on_sqlite_the_poll_reads_in_a_worker_thread(
    settings: Settings, auth_headers: dict[str, str], sessions: sessionmaker[Session], database_url: str
) -> None:
    if not database_url.startswith("sqlite"):
        pytest.skip("the SQLite path")
    job_id = insert_job(sessions)
    with TestClient(create_app(settings, FakeQueue()), headers=auth_headers) as client:
        state = app_state(client.app)
        assert isinstance(state.job_reads, ThreadedJobReads) and state.job_reads.engine is state.engine
        threads: list[int] = []
        event.listen(state.engine, "before_cursor_execute", lambda *_: threads.append(threading.get_ident()))
        loop_thread = portal(client).call(threading.get_ident)
        assert client.get(f"/jobs/{job_id}").status_code == 200
    assert threads and loop_thread not in threads


@pytest.mark.postgres
def test_on_postgres_the_poll_runs_no_statement_on_the_engine(
    migrated_postgres_url: str, tmp_path: Any, pg_sessions: sessionmaker[Session]
) -> None:
    job_id = insert_job(pg_sessions)
    token = make_token(migrated_postgres_url, "frank", admin=True)
    settings = Settings(data_dir=tmp_path, database_url=migrated_postgres_url, broker_url=None)
    with TestClient(create_app(settings, FakeQueue()), headers={"Authorization": f"Bearer {token}"}) as client:
        statements: list[str] = []
        event.listen(app_state(client.app).engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
        for _ in range(3):
            assert client.get(f"/jobs/{job_id}").status_code == 200
    assert statements == []


def test_the_polls_pool_is_the_engines_capped_at_the_admitted_requests(tmp_path: Any) -> None:
    defaults = Settings(data_dir=tmp_path)
    assert poll_pool_limits(defaults) == PoolLimits(size=10, max_overflow=6, timeout_s=5.0)  # 16 admitted at once
    small = defaults.model_copy(update={"db_pool_size": 1, "db_max_overflow": 0, "db_pool_timeout_s": 0.2})
    assert poll_pool_limits(small) == PoolLimits(size=1, max_overflow=0, timeout_s=0.2)
    narrow = defaults.model_copy(update={"api_max_concurrency": 4})
    assert poll_pool_limits(narrow) == PoolLimits(size=4, max_overflow=0, timeout_s=5.0)
