"""One database read shared by every stream that asks the same question at the same moment.

Many viewers of one job (dashboard tabs, ``halfcast logs -f``, client event streams)
poll the same rows every ``poll_interval_s``. Their polls are aligned to a per-job
phase of the clock (:func:`next_tick_delay`), so the streams of one job that are
caught up ask the same question (same job, same cursor, same known status) within
milliseconds of each other. :class:`SharedReads` runs that read once and hands its
result to every caller that asks for the same key while it is in flight or within
``fresh_s`` after it started: N viewers of a job cost one read per poll interval,
not N. A caller can also refuse reads that started before one it has already used
(:meth:`SharedReads.get_timed`), so its view never goes back in time.

A result is reused only within ``fresh_s`` of the read's start, which is kept below
the poll interval, so a stream never gets a result older than one it could have read
itself at its previous poll; results are immutable snapshots (the caller must not
mutate them). A leader that is cancelled (its client went away) hands the read to the
next caller instead of failing the others; a read that raises is raised to every
caller that shared it.
"""

from __future__ import annotations

import math
import time
import zlib
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar, cast

import anyio

T = TypeVar("T")


@dataclass
class _Read(Generic[T]):
    """One read: when it started (``time.monotonic()``), its outcome once ``done`` is set."""

    started_at: float
    done: anyio.Event = field(default_factory=anyio.Event)
    value: T | None = None
    error: BaseException | None = None
    abandoned: bool = False


class SharedReads(Generic[T]):
    """Single-flight reads with a short reuse window, keyed by what is asked.

    ``fresh_s`` (seconds, > 0): how long after a read started its result is handed to
    new callers. ``reads`` counts the reads actually run, ``shared`` the calls answered
    by another caller's read. Lives on one event loop (an app's); not thread-safe.
    """

    def __init__(self, fresh_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        if fresh_s <= 0:
            raise ValueError(f"fresh_s must be > 0, got {fresh_s}")
        self.fresh_s = fresh_s
        self.reads = 0
        self.shared = 0
        self._clock = clock
        self._entries: dict[Hashable, _Read[T]] = {}
        self._swept_at = clock()

    def now(self) -> float:
        """The clock's time (what :meth:`get_timed` compares ``not_before`` with)."""
        return self._clock()

    async def get(self, key: Hashable, read: Callable[[], Awaitable[T]]) -> T:
        """``read()``'s result for ``key``, from a read in flight or started within ``fresh_s``, else a new one.

        Raises whatever ``read()`` raised (for every caller sharing that read).
        """
        value, _ = await self.get_timed(key, read)
        return value

    async def get_timed(
        self, key: Hashable, read: Callable[[], Awaitable[T]], not_before: float = -math.inf
    ) -> tuple[T, float]:
        """Like :meth:`get`, and when the read it returns started (the clock's time).

        A read that started before ``not_before`` is not shared with this caller: a stream
        passes the start of the read it used last, so it never gets a view older than one
        it has already seen (an earlier evaluation, fewer precision switches), even when
        another stream asked the same question a moment before it.
        """
        while True:
            entry = self._entries.get(key)
            if (
                entry is None
                or entry.abandoned
                or entry.started_at < not_before
                or self._clock() - entry.started_at >= self.fresh_s
            ):
                return await self._lead(key, read)
            await entry.done.wait()
            if entry.abandoned:
                continue  # its leader was cancelled: read again (one of the waiters leads)
            self.shared += 1
            if entry.error is not None:
                raise entry.error
            return entry.value, entry.started_at  # type: ignore[return-value]  # set whenever done without error

    async def _lead(self, key: Hashable, read: Callable[[], Awaitable[T]]) -> tuple[T, float]:
        self._sweep()
        entry: _Read[T] = _Read(started_at=self._clock())
        self._entries[key] = entry
        self.reads += 1
        try:
            value = await read()
            entry.value = value
            return value, entry.started_at
        except Exception as exc:
            entry.error = exc
            raise
        except BaseException:
            entry.abandoned = True  # cancelled: the result never came
            if self._entries.get(key) is entry:
                del self._entries[key]
            raise
        finally:
            entry.done.set()

    def _sweep(self) -> None:
        """Drop finished entries past their reuse window (at most once per ``fresh_s``)."""
        now = self._clock()
        if now - self._swept_at < self.fresh_s:
            return
        self._swept_at = now
        stale = [k for k, e in self._entries.items() if e.done.is_set() and now - e.started_at >= self.fresh_s]
        for key in stale:
            del self._entries[key]


class StreamReads:
    """One stream's reads through ``shared`` (``None``: every read its own), never older than the stream or its last read.

    Each stream makes its own (it keeps the start of the read it used last): a caught-up
    stream shares the read of another stream of the job at the same tick, but is never
    handed a view older than one it has already seen, nor one that started before the
    stream was opened: a client that changed a job and then opens a stream sees its change
    (another stream's read of the old state, still fresh, is not handed to it).
    """

    def __init__(self, shared: SharedReads[Any] | None) -> None:
        self.shared = shared
        self.last_started = -math.inf if shared is None else shared.now()

    async def get(self, key: Hashable, read: Callable[[], Awaitable[T]]) -> T:
        """``read()``'s result, or that of a shared read of ``key`` no older than this stream's last one."""
        if self.shared is None:
            return await read()
        value, self.last_started = await self.shared.get_timed(key, read, self.last_started)
        return cast("T", value)


def next_tick_delay(key: str, interval_s: float, now: float | None = None) -> float:
    """Seconds until the next poll tick of ``key``: ticks every ``interval_s``, at a phase fixed by ``key``.

    Every stream of one job wakes at the same instants (so :class:`SharedReads` can
    share their reads); different jobs get different phases (CRC-32 of ``key``), so
    their reads are spread over the interval. A tick less than a tenth of an interval
    away is skipped (a stream that just polled, or woke a hair early, waits for the
    next one), so the value is in ``[interval_s / 10, interval_s * 1.1)``.
    """
    now = time.monotonic() if now is None else now
    phase = (zlib.crc32(key.encode()) / 2**32) * interval_s
    delay = (phase - now) % interval_s
    return delay + interval_s if delay < interval_s / 10 else delay
