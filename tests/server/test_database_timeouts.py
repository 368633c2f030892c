"""Issue 24 item 5 (first part): every PostgreSQL connection carries a statement, a lock and an idle-in-transaction
timeout, so a stalled database or a row lock held from outside fails a statement in seconds instead of hanging.

Before: none was set, and a worker blocked 60 s behind a ``SELECT ... FOR UPDATE`` held in psql.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
from celery import Celery
from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError, OperationalError

from halfcast.core.db.engine import NO_TIMEOUTS, StatementTimeouts, make_engine
from halfcast.core.settings import Settings
from worker.tasks import WorkerRuntime

pytestmark = pytest.mark.postgres


@pytest.fixture
def table(postgres_url: str) -> Iterator[str]:
    """A table of one row, ``id = 1``, dropped afterwards."""
    name = f"timeouts_{uuid.uuid4().hex[:8]}"
    engine = make_engine(postgres_url, timeouts=NO_TIMEOUTS)
    with engine.begin() as conn:
        conn.execute(text(f"CREATE TABLE {name} (id int PRIMARY KEY, v int)"))
        conn.execute(text(f"INSERT INTO {name} VALUES (1, 0)"))
    yield name
    with engine.begin() as conn:
        conn.execute(text(f"DROP TABLE {name}"))
    engine.dispose()


def _engine(url: str, **seconds: float | None) -> Engine:
    return make_engine(
        url,
        timeouts=StatementTimeouts(**{"statement_s": None, "lock_s": None, "idle_in_transaction_s": None, **seconds}),
    )


def test_a_write_behind_a_row_lock_held_elsewhere_fails_after_the_lock_timeout(postgres_url: str, table: str) -> None:
    holder, waiter = _engine(postgres_url), _engine(postgres_url, lock_s=0.5)
    with holder.connect() as held:
        held.execute(text(f"SELECT * FROM {table} WHERE id = 1 FOR UPDATE"))  # psql's row lock, kept open
        started = time.monotonic()
        with pytest.raises(OperationalError, match="lock timeout"), waiter.begin() as conn:
            conn.execute(text(f"UPDATE {table} SET v = 1 WHERE id = 1"))
        assert time.monotonic() - started < 5
        held.rollback()
    holder.dispose()
    waiter.dispose()


def test_a_statement_running_too_long_is_cancelled(postgres_url: str) -> None:
    engine = _engine(postgres_url, statement_s=0.3)
    started = time.monotonic()
    with pytest.raises(OperationalError, match="statement timeout"), engine.connect() as conn:
        conn.execute(text("SELECT pg_sleep(10)"))
    assert time.monotonic() - started < 5
    engine.dispose()


def test_a_session_idle_in_a_transaction_is_ended_and_its_locks_released(postgres_url: str, table: str) -> None:
    idle, other = _engine(postgres_url, idle_in_transaction_s=0.3), _engine(postgres_url, lock_s=5)
    conn = idle.connect()
    conn.execute(text(f"SELECT * FROM {table} WHERE id = 1 FOR UPDATE"))
    time.sleep(1.0)  # idle inside the transaction: PostgreSQL ends the session
    with other.begin() as writer:  # the lock is gone: no wait
        writer.execute(text(f"UPDATE {table} SET v = 2 WHERE id = 1"))
    with pytest.raises(DBAPIError):
        conn.execute(text("SELECT 1"))
    conn.invalidate()
    conn.close()
    idle.dispose()
    other.dispose()


def test_the_settings_give_the_api_and_worker_their_timeouts_and_zero_means_none(postgres_url: str) -> None:
    settings = Settings(db_statement_timeout_s=7, db_lock_timeout_s=2.5, db_idle_in_transaction_timeout_s=0)
    assert settings.statement_timeouts() == StatementTimeouts(7.0, 2.5, None)
    assert Settings().statement_timeouts() == StatementTimeouts()  # the documented defaults: 60, 10, 120
    engine = make_engine(postgres_url, timeouts=settings.statement_timeouts())
    with engine.connect() as conn:
        shown = [
            conn.execute(text(f"SHOW {name}")).scalar()
            for name in ("statement_timeout", "lock_timeout", "idle_in_transaction_session_timeout")
        ]
    engine.dispose()
    assert shown == ["7s", "2500ms", "0"]


def test_a_worker_s_idle_transaction_ends_within_half_a_lease() -> None:
    """A worker's engine ends a session idle in a transaction within half a lease, whatever
    ``db_idle_in_transaction_timeout_s`` says: a worker cut off mid-transaction by a network partition (the server
    hears nothing) otherwise held the job's row past its lease, and the reaper's update of that row waited
    (``tests/e2e/test_multi_node.py``'s partitioned node: the job stayed ``running`` 79 s and more)."""
    assert Settings(lease_ttl_s=30).worker_statement_timeouts() == StatementTimeouts(60.0, 10.0, 15.0)
    assert Settings(lease_ttl_s=600).worker_statement_timeouts().idle_in_transaction_s == 120.0  # the setting's
    unbounded = Settings(lease_ttl_s=30, db_idle_in_transaction_timeout_s=0)
    assert unbounded.worker_statement_timeouts().idle_in_transaction_s == 15.0  # 0 ("none") is bounded too
    assert Settings(lease_ttl_s=1).worker_statement_timeouts().idle_in_transaction_s == 1.0  # at least a second


def test_the_worker_s_engine_frees_a_row_its_silent_transaction_held_within_half_a_lease(
    postgres_url: str, table: str
) -> None:
    runtime = WorkerRuntime(Settings(database_url=postgres_url, lease_ttl_s=2), Celery())
    reaper = _engine(postgres_url, lock_s=5)
    cut_off = runtime.store.engine.connect()
    cut_off.execute(text(f"UPDATE {table} SET v = 1 WHERE id = 1"))  # the row lock, then silence
    started = time.monotonic()
    with reaper.begin() as conn:  # waits for the lock until the server ends the silent session (1 s)
        conn.execute(text(f"UPDATE {table} SET v = 2 WHERE id = 1"))
    assert time.monotonic() - started < 3
    cut_off.invalidate()
    cut_off.close()
    runtime.store.engine.dispose()
    reaper.dispose()
