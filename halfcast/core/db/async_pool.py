"""A small, bounded pool of psycopg async connections, for the API's reads in the event loop.

It follows the rules of the API's SQLAlchemy pool (:mod:`halfcast.core.db.engine`), so a read
answers the same whichever pool it ran on:

* at most ``size + max_overflow`` connections are out at once (:class:`PoolLimits`); a
  request that finds none free waits at most ``timeout_s`` and then gets
  :class:`PoolBusy` (answered ``503``, database busy, as SQLAlchemy's pool timeout is);
  at most ``size`` are kept open while idle;
* a connection that sat idle over ``ping_after_idle_s`` is pinged (``SELECT 1``) before
  use, and replaced when the ping fails;
* a connection found dead while in use (``broken``/``closed``: the server restarted or
  dropped it) is dropped with every idle one (opened before it, likely dead too), and the
  work is run once more on a new connection (:meth:`AsyncPool.run`);
* a database that cannot be reached raises ``psycopg.OperationalError`` (answered ``503``,
  database unavailable).

Connections are in autocommit mode: a one-statement read needs no ``BEGIN``/``ROLLBACK``.
Lives on one event loop; not thread-safe.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import psycopg

from halfcast.core.db.engine import PoolLimits

log = logging.getLogger(__name__)

T = TypeVar("T")
#: Opens a new connection (autocommit).
Connect = Callable[[], Awaitable[psycopg.AsyncConnection]]


class PoolBusy(Exception):
    """No connection of the pool came free within its timeout."""


class AsyncPool:
    """At most ``limits.size + limits.max_overflow`` connections out; ``limits.size`` kept while idle."""

    def __init__(self, connect: Connect, limits: PoolLimits, *, ping_after_idle_s: float) -> None:
        self._connect = connect
        self.limits = limits
        self.ping_after_idle_s = ping_after_idle_s
        self._slots = asyncio.Semaphore(limits.size + limits.max_overflow)
        #: Idle connections with the ``time.monotonic()`` of their return, most recent last.
        self._idle: deque[tuple[psycopg.AsyncConnection, float]] = deque()
        self._closed = False

    @property
    def idle(self) -> int:
        """Connections open and not in use."""
        return len(self._idle)

    async def run(self, work: Callable[[psycopg.AsyncConnection], Awaitable[T]]) -> T:
        """``work`` on a pooled connection; when that connection turns out dead, once more on a new one."""
        try:
            return await self._run(work)
        except DeadConnection as exc:
            log.warning("a pooled database connection was dead (%s); running again on a new one", exc)
            return await self._run(work)

    async def _run(self, work: Callable[[psycopg.AsyncConnection], Awaitable[T]]) -> T:
        conn = await self.acquire()
        try:
            result = await work(conn)
        except psycopg.OperationalError as exc:
            await self.release(conn, reusable=False)
            if conn.broken:
                await self._drop_idle()
                raise DeadConnection(*exc.args) from exc
            raise
        except BaseException:  # an error or a cancel mid-statement: the connection's state is unknown
            await self.release(conn, reusable=False)
            raise
        await self.release(conn)
        return result

    async def acquire(self) -> psycopg.AsyncConnection:
        """A connection: an idle one (pinged if it sat idle too long), else a new one. Raises :class:`PoolBusy`.

        Give it back with :meth:`release`; :meth:`run` does both.
        """
        if self._slots.locked():
            try:
                async with asyncio.timeout(self.limits.timeout_s):
                    await self._slots.acquire()
            except TimeoutError:
                raise PoolBusy(f"no connection came free within {self.limits.timeout_s:g} s") from None
        else:
            await self._slots.acquire()  # free: returns without waiting
        try:
            return await self._idle_or_new()
        except BaseException:
            self._slots.release()
            raise

    async def _idle_or_new(self) -> psycopg.AsyncConnection:
        while self._idle:
            conn, returned_at = self._idle.pop()
            if time.monotonic() - returned_at <= self.ping_after_idle_s or await _ping(conn):
                return conn
            await conn.close()
        return await self._connect()

    async def release(self, conn: psycopg.AsyncConnection, *, reusable: bool = True) -> None:
        """Give ``conn`` back: kept idle, or closed (not ``reusable``, dead, pool closed, ``size`` already idle).

        psycopg's ``close`` never suspends, so this completes in a cancelled task too.
        """
        self._slots.release()
        if not reusable or conn.closed or self._closed or len(self._idle) >= self.limits.size:
            await conn.close()
        else:
            self._idle.append((conn, time.monotonic()))

    async def _drop_idle(self) -> None:
        while self._idle:
            await self._idle.pop()[0].close()

    async def close(self) -> None:
        """Close the idle connections; those in use are closed when they come back."""
        self._closed = True
        await self._drop_idle()


class DeadConnection(psycopg.OperationalError):
    """The connection a statement ran on turned out broken (the server restarted or dropped it)."""


async def _ping(conn: psycopg.AsyncConnection) -> bool:
    """Whether ``conn`` answers ``SELECT 1``."""
    try:
        await conn.execute("SELECT 1")
    except psycopg.Error:
        return False
    return True


def connector(kwargs: dict[str, Any]) -> Connect:  # open mapping: psycopg's connect() keyword arguments
    """A :data:`Connect` for ``psycopg.AsyncConnection.connect(**kwargs)`` in autocommit mode."""

    async def connect() -> psycopg.AsyncConnection:
        return await psycopg.AsyncConnection.connect(autocommit=True, **kwargs)

    return connect
