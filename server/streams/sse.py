"""The one Server-Sent Events core under every stream of the API (job events, log follow).

A stream is a loop of short polls: :func:`poll_stream` calls the stream's ``tick`` (one
poll: its own short database session inside, never held across a sleep), sends the
frames it returns, and sleeps until the job's next tick. What the loop does the same
for every stream:

- framing: :func:`frame` (``event``, optional ``id``, ``data`` as one line of JSON with
  non-finite floats as ``null``), :func:`comment`, and an optional ``retry:`` first;
- keep-alive: a ``: keepalive`` comment after ``heartbeat_s`` without an event;
- disconnect detection: ``is_disconnected()`` is checked before every poll, so a closed
  stream stops reading the database at its next wake-up (Starlette also cancels the
  generator when the ASGI server reports the disconnect);
- stop on terminal: a tick that is ``done`` (the job ended, its last frames sent) ends
  the stream, and so does a job that disappears;
- bookkeeping: the stream counts as open in its :class:`StreamStats` until it ends, whichever way.

The answer itself is :func:`sse_response`: ``text/event-stream``, never cached, never buffered.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio
from fastapi.responses import StreamingResponse

from server.streams.shared_reads import next_tick_delay
from server.streams.stats import StreamStats

log = logging.getLogger(__name__)

#: Headers of every stream: never cached, never buffered by a reverse proxy (nginx honours ``X-Accel-Buffering``).
STREAM_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


# ----------------------------------------------------------------------------- frames


def finite(value: Any) -> Any:
    """``value`` with non-finite floats replaced by ``None`` (JSON has no NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, list):
        return [finite(item) for item in value]
    return value


def frame(event: str, data: Any, event_id: int | None = None) -> str:
    """One SSE event: ``event``, optional ``id``, ``data`` as one line of JSON, blank line."""
    head = f"event: {event}\n" + (f"id: {event_id}\n" if event_id is not None else "")
    return f"{head}data: {json.dumps(finite(data), separators=(',', ':'), allow_nan=False)}\n\n"


def comment(text: str) -> str:
    """An SSE comment line (ignored by clients; keeps proxies and idle connections alive)."""
    return f": {text}\n\n"


def retry(milliseconds: int) -> str:
    """The reconnection delay the stream asks clients for (SSE ``retry:``)."""
    return f"retry: {milliseconds}\n\n"


# ----------------------------------------------------------------------------- the loop


@dataclass(frozen=True)
class Tick:
    """What one poll of a stream produced: its frames, whether the stream is over, whether more is already waiting."""

    frames: list[str]
    done: bool = False
    more: bool = False


#: One poll of a stream (its own short database session inside): a :class:`Tick`, or ``None`` when the job is gone.
Ticker = Callable[[], Awaitable[Tick | None]]


async def poll_stream(
    kind: str,
    job_id: str,
    tick: Ticker,
    is_disconnected: Callable[[], Awaitable[bool]],
    stats: StreamStats,
    retry_ms: int | None = None,
) -> AsyncIterator[str]:
    """The SSE text of a stream of polls: ``retry:`` (with ``retry_ms``), then each ``tick()``'s frames, until done.

    Checks ``is_disconnected()`` before every poll; between polls sleeps until the
    job's next tick (:func:`next_tick_delay`: every ``poll_interval_s``, at the same
    instants for every stream of the job; not when the tick says more is waiting) and sends a keepalive comment after
    ``heartbeat_s`` without an event. Stops when a tick is ``done`` (after sending its
    frames), when the job is gone, or when the client has gone; cancellation
    (Starlette's disconnect watcher) stops it at its current ``await``. ``stats``
    counts it open until it ends, whichever way. ``kind`` names the stream in logs.
    """
    settings = stats.settings
    record = stats.open(job_id)
    try:
        if retry_ms is not None:
            yield retry(retry_ms)
        last_sent = time.monotonic()
        while not await is_disconnected():
            stats.poll(record)
            result = await tick()
            if result is None:
                log.info("%s stream of job %s: the job is gone", kind, job_id)
                return
            if result.frames:
                record.events += len(result.frames)
                yield "".join(result.frames)
                last_sent = time.monotonic()
            if result.done:
                return
            if result.more:
                continue  # read on without sleeping
            if time.monotonic() - last_sent >= settings.heartbeat_s:
                yield comment("keepalive")
                last_sent = time.monotonic()
            await anyio.sleep(next_tick_delay(job_id, settings.poll_interval_s))
    finally:
        stats.close(record)
        log.debug("%s stream of job %s closed after %d polls", kind, job_id, record.polls)


def sse_response(body: AsyncIterator[str]) -> StreamingResponse:
    """The streaming answer of ``body``: ``text/event-stream`` with :data:`STREAM_HEADERS`."""
    return StreamingResponse(body, media_type="text/event-stream", headers=STREAM_HEADERS)
