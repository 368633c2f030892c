"""The changes of what ``GET /jobs/{id}`` reads, as PostgreSQL tells them (``LISTEN halfcast_job_reads``).

Migration 0017 has a trigger on ``jobs``, ``attempts``, ``job_members`` and ``api_tokens`` send
``job:<job id>`` or ``token:<token id>`` on :data:`CHANNEL` for every row changed, at commit,
whoever wrote it (the worker, the reaper, the CLI, another API process). :class:`ChangeFeed`
holds one connection listening on it and tells a :class:`ChangeListener`:

* ``synced()`` once it listens: from then on every committed change is told;
* ``changed(change)`` for each notification;
* ``lost()`` when the connection fails or stops answering (a check every
  ``check_interval_s`` when nothing came): changes may go untold until the next ``synced()``.

It connects again after a loss, ``retry_s`` later (doubling up to ``max_retry_s``). Lives on one
event loop.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from dataclasses import dataclass
from typing import Protocol

import psycopg

from halfcast.core.db.async_pool import Connect

log = logging.getLogger(__name__)

#: The channel migration 0017's trigger notifies on.
CHANNEL = "halfcast_job_reads"


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
        conn = await asyncio.wait_for(self._connect(), self.check_timeout_s)
        try:
            await conn.execute(f"LISTEN {CHANNEL}")
            self.listening = True
            self.listener.synced()
            while True:
                async for notify in conn.notifies(timeout=self.check_interval_s):
                    self._tell(notify.payload)
                await asyncio.wait_for(conn.execute("SELECT 1"), self.check_timeout_s)
        finally:
            await conn.close()

    def _tell(self, payload: str) -> None:
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
