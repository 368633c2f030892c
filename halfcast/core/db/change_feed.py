"""The changes of what ``GET /jobs/{id}`` reads, as PostgreSQL tells them (``LISTEN halfcast_job_reads``).

Migration 0017 has a trigger on ``jobs``, ``attempts``, ``job_members`` and ``api_tokens`` send
``job:<job id>`` or ``token:<token id>`` on :data:`CHANNEL` for every row changed, at commit,
whoever wrote it (the worker, the reaper, the CLI, another API process). :class:`ChangeFeed`
holds one connection listening on it and tells a :class:`ChangeListener`:

* ``synced()`` once it listens and a probe sent through a second connection has come back to it:
  from then on every committed change is told;
* ``changed(change)`` for each notification;
* ``lost()`` when a connection fails or a probe does not come back within ``check_timeout_s``
  (one is sent every ``check_interval_s`` when nothing came): changes may go untold until the
  next ``synced()``.

The probe is what makes listening safe to trust: it is a notification committed by another session,
as the worker's are, so a listener that would not hear those (behind a pooler in transaction mode,
such as PgBouncer's, or on another database than the writers) never syncs, and polls read the database.

It connects again after a loss, ``retry_s`` later (doubling up to ``max_retry_s``). Lives on one
event loop; :meth:`ChangeFeed.running` runs it for the length of a block.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import secrets
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import Protocol

import psycopg

from halfcast.core.db.async_pool import Connect

log = logging.getLogger(__name__)

#: The channel migration 0017's trigger notifies on.
CHANNEL = "halfcast_job_reads"
#: How often a feed being stopped is cancelled again until it ends (see :meth:`ChangeFeed.running`).
RECANCEL_S = 0.05
#: What a feed's probes begin with (``probe:<random hex>``); every listener hears every feed's probes.
PROBE_PREFIX = "probe:"


class ChangeKind(enum.StrEnum):
    """What changed: a job's row, attempts or gang members, or an API token."""

    JOB = "job"
    TOKEN = "token"


@dataclass(frozen=True)
class Change:
    """One notification: ``kind`` and the id of the job or token."""

    kind: ChangeKind
    id: str


def parse_change(payload: str) -> Change | None:
    """The change a payload tells (``job:<id>``, ``token:<id>``); ``None`` for anything else."""
    kind, sep, ident = payload.partition(":")
    if not sep or not ident or kind not in ChangeKind.__members__.values():
        return None
    return Change(ChangeKind(kind), ident)


class ChangeListener(Protocol):
    """What :class:`ChangeFeed` tells (from its event loop)."""

    def synced(self) -> None:
        """The feed listens: every change committed from now on will be told."""

    def lost(self) -> None:
        """The feed stopped listening: changes may go untold."""

    def changed(self, change: Change) -> None:
        """``change`` was committed."""


class ChangeFeed:
    """Listens on :data:`CHANNEL` through connections from ``connect`` (autocommit) and tells ``listener``."""

    def __init__(
        self,
        connect: Connect,
        listener: ChangeListener,
        *,
        check_interval_s: float = 5.0,
        check_timeout_s: float = 5.0,
        retry_s: float = 0.5,
        max_retry_s: float = 10.0,
    ) -> None:
        self._connect = connect
        self.listener = listener
        self.check_interval_s = check_interval_s
        self.check_timeout_s = check_timeout_s
        self.retry_s = retry_s
        self.max_retry_s = max_retry_s
        self.listening = False
        self.losses = 0  # times a listening connection was lost

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Run :meth:`run` for the length of the block; on leaving it, cancel it until it has ended.

        Once is not enough: on Python 3.11, ``asyncio.wait_for`` (which psycopg's waits use) drops a
        cancellation that arrives as the wait it guards ends, and the feed would go on listening (one
        stop in ten, cancelled at random moments), holding up the API's shutdown.
        """
        task = asyncio.create_task(self.run(), name="halfcast-job-read-changes")
        try:
            yield
        finally:
            while not task.done():
                task.cancel()
                await asyncio.wait({task}, timeout=RECANCEL_S)

    async def run(self) -> None:
        """Listen until cancelled, connecting again after every loss."""
        delay = self.retry_s
        while True:
            try:
                await self._listen()
            except (psycopg.Error, OSError, TimeoutError) as exc:
                log.warning("job read changes: listening stopped (%s); again in %.1f s", exc, delay)
            if self.listening:
                delay = self.retry_s
            self._lose()
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.max_retry_s)

    async def _listen(self) -> None:
        async with AsyncExitStack() as stack:
            listening = await self._open(stack)
            sending = await self._open(stack)  # the probes' session: not the listener's
            await listening.execute(f"LISTEN {CHANNEL}")
            await self._probe(listening, sending)
            self.listening = True
            self.listener.synced()
            while True:
                async for notify in listening.notifies(timeout=self.check_interval_s):
                    self._tell(notify.payload)
                await self._probe(listening, sending)

    async def _open(self, stack: AsyncExitStack) -> psycopg.AsyncConnection:
        conn = await asyncio.wait_for(self._connect(), self.check_timeout_s)
        stack.push_async_callback(conn.close)
        return conn

    async def _probe(self, listening: psycopg.AsyncConnection, sending: psycopg.AsyncConnection) -> None:
        """Commit a probe through ``sending`` and hear it on ``listening`` within ``check_timeout_s``.

        What else is heard meanwhile is told. Each ``notifies()`` is run to its end: it holds the
        connection's lock until then.
        """
        probe = f"{PROBE_PREFIX}{secrets.token_hex(8)}"
        await asyncio.wait_for(sending.execute("SELECT pg_notify(%s, %s)", (CHANNEL, probe)), self.check_timeout_s)
        deadline = time.monotonic() + self.check_timeout_s
        heard = False
        while not heard and (left := deadline - time.monotonic()) > 0:
            async for notify in listening.notifies(timeout=left, stop_after=1):
                if notify.payload == probe:
                    heard = True
                else:
                    self._tell(notify.payload)
        if not heard:
            msg = (
                f"a probe on {CHANNEL} did not come back within {self.check_timeout_s:g} s: polls read the"
                " database (behind a pooler in transaction mode, set HALFCAST_POLL_READS=database)"
            )
            raise TimeoutError(msg)

    def _tell(self, payload: str) -> None:
        if payload.startswith(PROBE_PREFIX):
            return  # another feed's probe (its own are waited for in _probe)
        change = parse_change(payload)
        if change is None:
            log.warning("job read changes: ignored the notification %r", payload[:100])
            return
        self.listener.changed(change)

    def _lose(self) -> None:
        if self.listening:
            self.listening = False
            self.losses += 1
        self.listener.lost()
