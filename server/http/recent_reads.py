"""Kept reads of ``GET /jobs/{id}``: until PostgreSQL notifies a change, or for ``HALFCAST_POLL_MAX_AGE_S``.

A poll's database read costs the API a good part of its CPU and PostgreSQL some more
(bench/README.md, "Beside real training"). :class:`RecentJobReads` wraps the app's
:class:`halfcast.core.db.job_readers.JobReads` and answers a ``(job, token)`` read from memory:

* with ``HALFCAST_POLL_READS=notified`` (PostgreSQL's default, ``auto``), until a change of the job (its row, its
  attempts, its gang members) or of the token is told by the database
  (:class:`halfcast.core.db.change_feed.ChangeFeed`, migration 0017's trigger: whoever wrote it,
  the worker, the reaper, the CLI, another API process). A change shows once PostgreSQL has
  delivered its notification (about a millisecond on one host). While the feed is down (the
  connection lost, before it first listens) reads are kept ``HALFCAST_POLL_MAX_AGE_S`` at most,
  and every read kept before is forgotten, both when it is lost and when it listens again;
* else, while younger than ``HALFCAST_POLL_MAX_AGE_S`` (opt-in): a job's resource may then lag the
  database by that long.

Polls of one ``(job, token)`` that miss while a read of it is at the database wait for that
read instead of making their own (one read per change of a job, however many poll it), as
long as it counts as kept: begun after the last change told and younger than the max age.

Off by default: every poll then reads the database. What the cache never does: answer one token
with another token's read (the token is part of the key, and the visibility check runs on every
request), keep a missing job or an unknown token (a 404 or a 401 is never kept), keep a read
whose token is due its ``last_used_at`` refresh (once a minute: the database read makes it), keep
a read under way when anything was forgotten, or outlive a write made through this API process:
every request with an unsafe method (``POST``, ``PUT``, ``PATCH``, ``DELETE``) forgets every
read as its answer starts (:class:`ForgetOnWrite`), so a client that cancels a job and then
polls it sees its own write.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from halfcast.core.db.change_feed import Change, ChangeKind
from halfcast.core.db.job_readers import JobReads
from halfcast.core.db.job_reads import JobRead, needs_touch
from halfcast.core.db.models import utcnow

#: Reads kept at most (least recently used out first): every job polled at once by every token, on a busy server.
KEPT = 4096
#: Methods that never change anything (RFC 9110 section 9.2.1): they leave the kept reads alone.
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})


@dataclass(frozen=True)
class _Kept:
    began: float  # when the read began (its age counts from there: the database may have changed since)
    read: JobRead


@dataclass
class _Flight:
    """A read at the database that polls of its key share: kept once done, unless a forget made it stale meanwhile."""

    began: float
    task: asyncio.Task[JobRead]
    current: bool = True  # no forget touched it since it began (a stale flight is neither joined nor kept)


class RecentJobReads:
    """``inner``'s reads, each reused for ``max_age_s`` seconds; :meth:`forget` drops them all (event loop only)."""

    def __init__(
        self, inner: JobReads, max_age_s: float, kept: int = KEPT, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.inner = inner
        self.max_age_s = max_age_s
        self.unnotified_max_age_s = max_age_s  # the max age while no change feed tells this cache (see synced())
        self.kept = kept
        self.clock = clock
        self._reads: OrderedDict[tuple[str, str | None], _Kept] = OrderedDict()
        self._by_job: dict[str, set[str | None]] = {}  # the token hashes of each job's kept reads
        self._flights: dict[tuple[str, str | None], _Flight] = {}  # the reads at the database, by key
        self.answered_kept = 0  # polls answered from a kept read (halfcast_poll_reads_total)
        self.answered_shared = 0  # polls answered by a read another poll made (under way as they came)
        self.answered_read = 0  # polls answered by a read of ``inner`` of their own

    async def read(self, job_id: str, token_hash: str | None) -> JobRead:
        """The read of ``job_id`` with ``token_hash``: a kept one younger than ``max_age_s``, else a new one.

        A poll that finds a read of its key at the database and young enough waits for it
        (``answered_shared``) rather than making another.
        """
        key = (job_id, token_hash)
        now = self.clock()
        kept = self._reads.get(key)
        if kept is not None and now - kept.began < self.max_age_s and not _token_due(kept.read):
            self._reads.move_to_end(key)
            self.answered_kept += 1
            return kept.read
        flight = self._flights.get(key)
        if flight is not None and now - flight.began < self.max_age_s:
            self.answered_shared += 1
        else:
            self.answered_read += 1
            flight = self._take_off(key, now)
        return await asyncio.shield(flight.task)  # a poll cancelled (its client gone) leaves the read to the others

    def _take_off(self, key: tuple[str, str | None], now: float) -> _Flight:
        task = asyncio.get_running_loop().create_task(self.inner.read(*key))
        flight = _Flight(now, task)
        self._flights[key] = flight
        task.add_done_callback(lambda done: self._landed(key, flight, done))
        return flight

    def _landed(self, key: tuple[str, str | None], flight: _Flight, task: asyncio.Task[JobRead]) -> None:
        """Keep a flight's read (runs before any poll waiting for it resumes); take it off the board."""
        if self._flights.get(key) is flight:
            del self._flights[key]
        if task.cancelled() or task.exception() is not None:  # retrieved here: every poll may have gone
            return
        read = task.result()
        found = read.job is not None and (read.token is not None or key[1] is None)
        if found and flight.current and self.max_age_s > 0:
            self._keep(key, _Kept(flight.began, read))

    def _keep(self, key: tuple[str, str | None], kept: _Kept) -> None:
        self._reads[key] = kept
        self._reads.move_to_end(key)
        self._by_job.setdefault(key[0], set()).add(key[1])
        while len(self._reads) > self.kept:
            self._drop(next(iter(self._reads)))

    def _drop(self, key: tuple[str, str | None]) -> None:
        del self._reads[key]
        hashes = self._by_job[key[0]]
        hashes.discard(key[1])
        if not hashes:
            del self._by_job[key[0]]

    def forget(self) -> None:
        """Drop every kept read, and keep none of the reads under way."""
        self._ground(list(self._flights))
        self._reads.clear()
        self._by_job.clear()

    def forget_job(self, job_id: str) -> None:
        """Drop the kept reads of ``job_id``, and keep none of its reads under way."""
        self._ground([key for key in self._flights if key[0] == job_id])
        for token_hash in self._by_job.pop(job_id, ()):
            del self._reads[(job_id, token_hash)]

    def forget_token(self, token_id: str) -> None:
        """Drop the kept reads made with the token whose id is ``token_id``, and keep none of the reads under way.

        (A read under way has not found its token yet: every one is stale to be safe; tokens change rarely.)
        """
        self._ground(list(self._flights))
        made_with = [key for key, kept in self._reads.items() if _token_id(kept.read) == token_id]
        for key in made_with:
            self._drop(key)

    def _ground(self, keys: list[tuple[str, str | None]]) -> None:
        """The flights of ``keys`` are stale: polls from now on make a new read, and theirs is not kept."""
        for key in keys:
            self._flights.pop(key).current = False

    # -- told by a change feed (halfcast.core.db.change_feed.ChangeListener)

    def synced(self) -> None:
        """Every change is told from now on: keep reads until told (what was kept before is forgotten)."""
        self.forget()
        self.max_age_s = float("inf")

    def lost(self) -> None:
        """Changes may go untold: forget every read, and keep the next ones ``unnotified_max_age_s`` at most."""
        self.forget()
        self.max_age_s = self.unnotified_max_age_s

    def changed(self, change: Change) -> None:
        """Forget the reads ``change`` makes stale."""
        if change.kind is ChangeKind.JOB:
            self.forget_job(change.id)
        else:
            self.forget_token(change.id)

    def keeps(self, job_id: str) -> bool:
        """Whether a read of ``job_id`` is kept (with any token)."""
        return job_id in self._by_job

    def __len__(self) -> int:
        return len(self._reads)

    async def close(self) -> None:
        """Close the wrapped reads."""
        self.forget()
        await self.inner.close()


def _token_id(read: JobRead) -> str | None:
    return None if read.token is None else str(read.token.id)


def _token_due(read: JobRead) -> bool:
    """The read's token is due a ``last_used_at`` refresh (a read from the database makes it)."""
    return read.token is not None and needs_touch(read.token, utcnow())


class ForgetOnWrite:
    """ASGI middleware: a request with an unsafe method makes ``reads`` forget, as its answer starts (see the module docs).

    The forget comes before the response's first message goes out (the write is committed by
    then), so no poll the client sends after reading the answer can get a read kept from before.
    """

    def __init__(self, app: ASGIApp, reads: Callable[[], RecentJobReads | None]) -> None:
        self.app = app
        self.reads = reads

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass the request on; after an unsafe one, forget the kept reads as the answer starts, and once more at its end."""
        if scope["type"] != "http" or scope["method"] in SAFE_METHODS:
            await self.app(scope, receive, send)
            return

        async def forget_then_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                self._forget()
            await send(message)

        try:
            await self.app(scope, receive, forget_then_send)
        finally:
            self._forget()

    def _forget(self) -> None:
        reads = self.reads()
        if reads is not None:
            reads.forget()
