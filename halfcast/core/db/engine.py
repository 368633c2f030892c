"""Engine and session factories. SQLite gets WAL, a busy timeout and foreign keys.

SQLite transactions are begun by SQLAlchemy, not by the driver, so a transaction
that reads before it writes can ask for the write lock up front: run it on
``engine.execution_options(**WRITE_TRANSACTION)`` (a session: call :func:`begin_write`
first) and it starts with ``BEGIN IMMEDIATE``. A deferred transaction that reads
first and then writes fails at once with "database is locked"
(``SQLITE_BUSY_SNAPSHOT``, no busy wait) when another connection committed in
between (phoenix#3949); an immediate one waits its turn.

The API passes :class:`PoolLimits` from its settings: how many connections it keeps
and how long a request waits for one (SQLAlchemy then raises
``sqlalchemy.exc.TimeoutError``, answered 503 by :mod:`server.http.errors`). Reads that are
one statement can skip the transaction round trips: :func:`read_connection`.

Every PostgreSQL connection carries :class:`StatementTimeouts` (``statement_timeout``,
``lock_timeout``, ``idle_in_transaction_session_timeout``, set as connection options): a stalled
database or a row lock held from outside (``SELECT ... FOR UPDATE`` in psql) makes a statement
fail after seconds (psycopg's ``QueryCanceled`` / ``LockNotAvailable``, answered ``503`` by the
API, retried by the worker) instead of hanging a request or a worker. The API and the worker take
them from their settings (``HALFCAST_DB_*_TIMEOUT_S``); migrations run without them (an index build
may take long).

A PostgreSQL connection is checked (``SELECT 1``, a round trip) when it leaves the pool,
so a connection the server dropped is replaced before a statement fails on it. The API
passes ``ping_after_idle_s`` (:data:`API_PING_AFTER_IDLE_S`): then only a connection
that sat in the pool longer than that is checked. Under load connections come back
within milliseconds, and a ping per request was a second round trip per poll; the
reads that poll (:func:`halfcast.core.db.job_reads.read_job`) run again once on a fresh
connection when theirs turns out dead.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypedDict

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.orm import Session, sessionmaker

#: How long a SQLite writer waits for the lock before failing (milliseconds).
SQLITE_BUSY_TIMEOUT_MS = 30_000
#: Execution options of a transaction that will write (``BEGIN IMMEDIATE`` on SQLite; no effect elsewhere).
WRITE_TRANSACTION: dict[str, bool] = {"halfcast_write": True}
#: Seconds a connection of the API may sit in the pool and still be used without a ping first.
API_PING_AFTER_IDLE_S = 1.0
#: Where a pooled connection's record keeps the ``time.monotonic()`` of its last return to the pool.
_RETURNED_AT = "halfcast_returned_at"


@dataclass(frozen=True)
class StatementTimeouts:
    """PostgreSQL's per-connection timeouts, in seconds (``None``: none).

    ``statement_s``: a statement runs at most this long; ``lock_s``: it waits at most this long
    for a lock (a row, a table, an advisory lock); ``idle_in_transaction_s``: a session idle inside
    an open transaction is ended after this long, releasing its locks.
    """

    statement_s: float | None = 60.0
    lock_s: float | None = 10.0
    idle_in_transaction_s: float | None = 120.0

    def connect_options(self) -> str:
        """The ``options`` connection parameter that sets them (``0``: PostgreSQL's "no timeout")."""
        settings = {
            "statement_timeout": self.statement_s,
            "lock_timeout": self.lock_s,
            "idle_in_transaction_session_timeout": self.idle_in_transaction_s,
        }
        return " ".join(f"-c {name}={round((value or 0) * 1000)}" for name, value in settings.items())


#: No timeouts: what migrations run with.
NO_TIMEOUTS = StatementTimeouts(None, None, None)


class PoolOptions(TypedDict, total=False):
    """``create_engine``'s pool keyword arguments (none given: SQLAlchemy's defaults)."""

    pool_size: int
    max_overflow: int
    pool_timeout: float


@dataclass(frozen=True)
class PoolLimits:
    """Connection pool of an engine: connections kept, extra ones allowed, seconds a checkout waits at most."""

    size: int = 10
    max_overflow: int = 20
    timeout_s: float = 30.0

    def options(self) -> PoolOptions:
        """``create_engine`` keyword arguments."""
        return {"pool_size": self.size, "max_overflow": self.max_overflow, "pool_timeout": self.timeout_s}


def _configure_sqlite(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()
    dbapi_connection.isolation_level = None  # the driver issues no BEGIN; _begin_sqlite does


def _begin_sqlite(conn: Connection) -> None:
    immediate = conn.get_execution_options().get("halfcast_write", False)
    conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


def _ping_when_idle(engine: Engine, idle_s: float) -> None:
    """Ping a connection at checkout only when it sat in the pool over ``idle_s`` seconds (or was never returned)."""
    dialect = engine.dialect

    def returned(_dbapi_connection: Any, record: Any) -> None:
        record.info[_RETURNED_AT] = time.monotonic()

    def checkout(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        if time.monotonic() - record.info.get(_RETURNED_AT, float("-inf")) <= idle_s:
            return
        try:
            dialect.do_ping(dbapi_connection)
        except Exception as exc:  # the pool drops this connection and checks out another
            raise DisconnectionError(f"connection failed its ping: {exc}") from exc

    event.listen(engine, "checkin", returned)
    event.listen(engine, "checkout", checkout)


def make_engine(
    url: str,
    pool: PoolLimits | None = None,
    *,
    ping_after_idle_s: float | None = None,
    timeouts: StatementTimeouts | None = None,
) -> Engine:
    """Create an engine for ``url`` (``sqlite:///…`` or ``postgresql+psycopg://…``).

    A bare ``postgresql://`` URL is read as psycopg 3. SQLite connections are set to
    WAL mode with a busy timeout, so concurrent writers wait instead of failing.
    ``pool`` sizes the connection pool (default: :class:`PoolLimits`' defaults on
    PostgreSQL, SQLAlchemy's on SQLite). PostgreSQL connections are pinged at every
    checkout, or with ``ping_after_idle_s`` only after sitting idle that long, and carry
    ``timeouts`` (default: :class:`StatementTimeouts`' defaults).
    """
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        url = "postgresql+psycopg://" + url.split("://", 1)[1]
    if url.startswith("sqlite"):
        limits: PoolOptions = (
            pool.options() if pool is not None and url not in ("sqlite://", "sqlite:///:memory:") else {}
        )
        connect_args = {"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000, "check_same_thread": False}
        engine = create_engine(url, connect_args=connect_args, **limits)
        event.listen(engine, "connect", _configure_sqlite)
        event.listen(engine, "begin", _begin_sqlite)
        return engine
    options = (pool or PoolLimits()).options()
    postgres_args = {"options": (timeouts or StatementTimeouts()).connect_options()}
    if ping_after_idle_s is None:
        return create_engine(url, pool_pre_ping=True, connect_args=postgres_args, **options)
    engine = create_engine(url, pool_pre_ping=False, connect_args=postgres_args, **options)
    _ping_when_idle(engine, ping_after_idle_s)
    return engine


@contextmanager
def read_connection(engine: Engine) -> Iterator[Connection]:
    """A connection for reads of one statement each, returned to the pool on exit.

    On PostgreSQL it runs in autocommit mode: no ``BEGIN`` and no ``ROLLBACK`` round
    trips around the statement, which sees one snapshot by itself. On SQLite (no round
    trips to save) it is a plain connection whose read transaction ends on exit.
    """
    conn = engine.connect()
    try:
        if engine.dialect.name == "postgresql":
            conn = conn.execution_options(isolation_level="AUTOCOMMIT")
        yield conn
    finally:
        conn.close()


def begin_write(session: Session) -> Connection:
    """Begin ``session``'s transaction as a write transaction (``BEGIN IMMEDIATE`` on SQLite; plain elsewhere).

    Call it before the first read of a transaction that will write: it waits for the
    write lock (up to the busy timeout) instead of failing at its first write when
    another connection, e.g. a worker storing step records, committed after the read.
    Returns the transaction's connection. Raises ``RuntimeError`` if ``session`` is
    already in a transaction (commit first).
    """
    if session.in_transaction():
        raise RuntimeError("begin_write needs a session with no transaction open (commit first)")
    return session.connection(execution_options=WRITE_TRANSACTION)


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    """Session factory whose objects stay readable after commit."""
    return sessionmaker(engine, expire_on_commit=False)
