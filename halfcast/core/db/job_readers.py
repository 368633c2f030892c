"""Which read ``GET /jobs/{id}`` makes: in the event loop on PostgreSQL, in a worker thread elsewhere (SQLite).

The API keeps one :class:`JobReads` on ``app.state.job_reads`` (built in its lifespan
by :func:`job_reads_for`). On PostgreSQL through psycopg it is
:class:`halfcast.core.db.job_reads_async.AsyncJobReads`, with a pool of its own sized like the
engine's; on any other database (the embedded SQLite) it is :class:`ThreadedJobReads`:
:func:`halfcast.core.db.job_reads.read_job` on the engine, in Starlette's thread pool, as before.
"""

from __future__ import annotations

from typing import Any, Protocol

import anyio.to_thread
from sqlalchemy import Engine

from halfcast.core.db.async_pool import AsyncPool, Connect, connector
from halfcast.core.db.engine import PoolLimits
from halfcast.core.db.job_reads import JobRead, read_job
from halfcast.core.db.job_reads_async import AsyncJobReads


class JobReads(Protocol):
    """The job resource's read: the job and, with ``token_hash``, the caller's token (:class:`JobRead`)."""

    async def read(self, job_id: str, token_hash: str | None) -> JobRead:
        """The job ``job_id`` and the token whose hash is ``token_hash`` (``None``: authentication off)."""
        ...

    async def close(self) -> None:
        """Release what the reads hold (connections)."""
        ...


class ThreadedJobReads:
    """:func:`halfcast.core.db.job_reads.read_job` on ``engine``, in a worker thread."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    async def read(self, job_id: str, token_hash: str | None) -> JobRead:
        """See :class:`JobReads`."""
        return await anyio.to_thread.run_sync(read_job, self.engine, job_id, token_hash)

    async def close(self) -> None:
        """Nothing of its own: the engine is the app's."""


def job_reads_for(engine: Engine, limits: PoolLimits, *, ping_after_idle_s: float) -> JobReads:
    """The reads for ``engine``'s database: async on PostgreSQL with psycopg (a pool of ``limits``), else threaded."""
    connect = async_connector(engine)
    if connect is None:
        return ThreadedJobReads(engine)
    return AsyncJobReads(AsyncPool(connect, limits, ping_after_idle_s=ping_after_idle_s), engine.dialect)


def async_connector(engine: Engine) -> Connect | None:
    """Opens psycopg async connections (autocommit) to ``engine``'s database, as it connects; ``None`` off psycopg."""
    dialect = engine.dialect
    if dialect.name != "postgresql" or dialect.driver != "psycopg":
        return None
    args, kwargs = dialect.create_connect_args(engine.url)  # what SQLAlchemy connects with: host, dbname, adapters...
    connect_kwargs: dict[str, Any] = dict(kwargs)  # open mapping: psycopg's connect() keyword arguments
    if args:
        connect_kwargs["conninfo"] = args[0]
    return connector(connect_kwargs)
