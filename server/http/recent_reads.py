"""An opt-in micro-cache of ``GET /jobs/{id}``'s reads: a read younger than ``HALFCAST_POLL_MAX_AGE_S`` is reused.

A poll's database read costs the API more than a third of its CPU and PostgreSQL some more
(bench/README.md, "Beside real training": 0.80-0.95 ms of API CPU per poll, 0.64-0.75 ms with
reads kept 0.5 s). With many pollers of the same jobs on a host that also
trains, an operator may trade freshness for that CPU: :class:`RecentJobReads` wraps the app's
:class:`halfcast.core.db.job_readers.JobReads` and answers a ``(job, token)`` read from memory
while it is younger than ``max_age_s``, so a job's resource may lag the database (a worker's
step, a status change, a token revoked from the CLI) by at most that long. Off (``0``) by
default: every poll then reads the database.

What the cache never does: answer one token with another token's read (the token is part of
the key, and the visibility check runs on every request), keep a missing job or an unknown token
(a 404 or a 401 is never cached), or outlive a write made through this API process: every request with an unsafe method
(``POST``, ``PUT``, ``PATCH``, ``DELETE``) forgets every read as its answer starts
(:class:`ForgetOnWrite`), and a read that was under way during such a write is not kept, so a
client that cancels a job and then polls it sees its own write. Writes made elsewhere (the
worker, another API process, the CLI) show within ``max_age_s``.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from halfcast.core.db.job_readers import JobReads
from halfcast.core.db.job_reads import JobRead

#: Reads kept at most (least recently used out first): every job polled at once by every token, on a busy server.
KEPT = 4096
#: Methods that never change anything (RFC 9110 section 9.2.1): they leave the kept reads alone.
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})


@dataclass(frozen=True)
class _Kept:
    began: float  # when the read began (its age counts from there: the database may have changed since)
    read: JobRead


class RecentJobReads:
    """``inner``'s reads, each reused for ``max_age_s`` seconds; :meth:`forget` drops them all (event loop only)."""

    def __init__(
        self, inner: JobReads, max_age_s: float, kept: int = KEPT, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.inner = inner
        self.max_age_s = max_age_s
        self.kept = kept
        self.clock = clock
        self._reads: OrderedDict[tuple[str, str | None], _Kept] = OrderedDict()
        self._generation = 0  # bumped by forget(): a read begun before a forget is not kept

    async def read(self, job_id: str, token_hash: str | None) -> JobRead:
        """The read of ``job_id`` with ``token_hash``: a kept one younger than ``max_age_s``, else a new one."""
        key = (job_id, token_hash)
        began = self.clock()
        kept = self._reads.get(key)
        if kept is not None and began - kept.began < self.max_age_s:
            self._reads.move_to_end(key)
            return kept.read
        generation = self._generation
        read = await self.inner.read(job_id, token_hash)
        found = read.job is not None and (read.token is not None or token_hash is None)
        if found and generation == self._generation:
            self._keep(key, _Kept(began, read))
        return read

    def _keep(self, key: tuple[str, str | None], kept: _Kept) -> None:
        self._reads[key] = kept
        self._reads.move_to_end(key)
        while len(self._reads) > self.kept:
            self._reads.popitem(last=False)

    def forget(self) -> None:
        """Drop every kept read, and keep none of the reads under way."""
        self._generation += 1
        self._reads.clear()

    def __len__(self) -> int:
        return len(self._reads)

    async def close(self) -> None:
        """Close the wrapped reads."""
        self._reads.clear()
        await self.inner.close()


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
