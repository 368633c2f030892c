"""Server-Sent Events of one job (``GET /jobs/{id}/events``), polled from the database.

The stream is a loop of short polls: each poll opens a session, reads the job row
and then the step records after the last one sent, closes the session, and turns
what changed into SSE frames; then it sleeps ``poll_interval_s``. No session is held
across a sleep, and the loop checks ``request.is_disconnected()`` before every poll,
so a closed stream stops reading the database at its next wake-up (Starlette also
cancels the generator when the ASGI server reports the disconnect).

Events (``data`` is one line of JSON):

- ``event: status`` — the job resource (as ``GET /jobs/{id}``); sent first on every
  connection to a job that has not ended (a snapshot), then on every change of its status
  or of its start-up ``phase`` (:func:`server.schemas.current_phase`); a
  terminal status is always the last event (a job that already ended gets its records,
  then its one status), after which the server closes the stream. No ``id``.
- ``event: step``, ``id: <step>`` — one step record, in step order. A client that
  reconnects with ``Last-Event-ID: <step>`` (or ``?after_step=<step>``) gets exactly
  the records after that step: no gaps, no duplicates.
- ``event: eval`` — the newest evaluation record, when it changes.
- ``event: rewind``, ``id: <step>`` — a retried attempt resumed from a checkpoint at
  ``step``: records after it were discarded and will be sent again as they are redone.
  Only records this stream has seen are checked; a resume point the job has not
  reached yet is simply waited for.
- ``event: precision_switch`` — a switch from fp16 to bf16 (``on_divergence:
  "fallback_bf16"``) that happened while the stream was open (its record as in the
  resource's ``precision_switches``), followed by ``event: rewind`` to its
  ``rewound_to_step`` when this stream had sent records after it: those steps were
  trained again in bf16 and are sent again. (Switches before the connection are in the
  first ``status`` event.)
- ``: keepalive`` comments after ``heartbeat_s`` without an event.

The job is read before its step records, so a terminal status is only sent after
every record committed before it (the worker stores records before the outcome).
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, cast

import anyio
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict
from sqlalchemy.orm import Session, sessionmaker

from server.db import jobs as repo
from server.db.models import TERMINAL_STATUSES
from server.schemas import current_phase, job_public, step_point
from server.streams.shared_reads import SharedReads, next_tick_delay

log = logging.getLogger(__name__)

#: Reconnection delay the stream asks clients for (SSE ``retry:``), milliseconds.
RETRY_MS = 2000
#: How many closed streams :class:`StreamStats` remembers (for tests and debugging).
HISTORY = 256


class EventStreamSettings(BaseSettings):
    """Settings of the event stream, from ``HALFCAST_EVENTS_*`` environment variables."""

    model_config = SettingsConfigDict(env_prefix="HALFCAST_EVENTS_", extra="ignore")

    poll_interval_s: float = Field(default=0.1, gt=0.0, le=10.0, description="Seconds between two database polls of one stream")
    heartbeat_s: float = Field(default=15.0, gt=0.0, le=300.0, description="Seconds without events before a keepalive comment")
    page_size: int = Field(default=500, ge=1, le=10_000, description="Step records read per poll at most")


# ----------------------------------------------------------------------------- bookkeeping


@dataclass
class StreamRecord:
    """One stream's life: monotonic open/close times (``time.monotonic()``) and database polls made."""

    job_id: str
    opened_at: float
    closed_at: float | None = None
    polls: int = 0
    events: int = 0


@dataclass
class StreamStats:
    """Open event streams and their database polls, per app (``app.state.event_streams``).

    ``active`` is exported as the ``halfcast_event_streams`` gauge; ``polls`` (all
    streams, ever) as ``halfcast_event_stream_polls_total``. The last :data:`HISTORY`
    closed streams are kept in ``closed``. ``shared`` coalesces the database reads of
    streams asking the same question at the same tick (its ``reads`` are exported as
    ``halfcast_<kind>_stream_reads_total``).
    """

    settings: EventStreamSettings = field(default_factory=EventStreamSettings)
    open_streams: set[int] = field(default_factory=set)
    closed: deque[StreamRecord] = field(default_factory=lambda: deque(maxlen=HISTORY))
    opened_total: int = 0
    polls: int = 0
    _records: dict[int, StreamRecord] = field(default_factory=dict)
    shared: SharedReads[Any] = field(init=False)

    def __post_init__(self) -> None:
        self.shared = SharedReads(fresh_s=self.settings.poll_interval_s / 2)

    @property
    def active(self) -> int:
        """Streams open right now."""
        return len(self.open_streams)

    def open(self, job_id: str) -> StreamRecord:
        """Count a new stream of ``job_id``; the caller must :meth:`close` it."""
        record = StreamRecord(job_id=job_id, opened_at=time.monotonic())
        self.opened_total += 1
        self.open_streams.add(id(record))
        self._records[id(record)] = record
        return record

    def poll(self, record: StreamRecord) -> None:
        """Count one database poll of ``record``'s stream."""
        record.polls += 1
        self.polls += 1

    def close(self, record: StreamRecord) -> None:
        """Mark ``record``'s stream closed (idempotent)."""
        if self._records.pop(id(record), None) is None:
            return
        self.open_streams.discard(id(record))
        record.closed_at = time.monotonic()
        self.closed.append(record)


class StreamCollector:
    """Prometheus collector of :class:`StreamStats`: ``halfcast_<kind>_streams`` and its polls counter.

    ``kind`` is ``event`` (``GET /jobs/{id}/events``) or ``log`` (``GET /jobs/{id}/logs?follow=true``).
    """

    def __init__(self, stats: StreamStats, kind: str = "event") -> None:
        self.stats = stats
        self.kind = kind

    def collect(self) -> Iterator[Metric]:
        """The gauge of open streams and the counter of their database polls."""
        name = f"halfcast_{self.kind}_stream"
        yield GaugeMetricFamily(f"{name}s", f"Open job {self.kind} streams (SSE)", value=self.stats.active)
        yield CounterMetricFamily(f"{name}_polls", f"Polls made by job {self.kind} streams", value=self.stats.polls)
        yield CounterMetricFamily(
            f"{name}_reads", f"Database reads made for job {self.kind} streams (polls of one job at one tick share one)",
            value=self.stats.shared.reads,
        )


# ----------------------------------------------------------------------------- frames


def _finite(value: Any) -> Any:
    """``value`` with non-finite floats replaced by ``None`` (JSON has no NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_finite(item) for item in value]
    return value


def frame(event: str, data: Any, event_id: int | None = None) -> str:
    """One SSE event: ``event``, optional ``id``, ``data`` as one line of JSON, blank line."""
    head = f"event: {event}\n" + (f"id: {event_id}\n" if event_id is not None else "")
    return f"{head}data: {json.dumps(_finite(data), separators=(',', ':'), allow_nan=False)}\n\n"


def comment(text: str) -> str:
    """An SSE comment line (ignored by clients; keeps proxies and idle connections alive)."""
    return f": {text}\n\n"


# ----------------------------------------------------------------------------- polling


@dataclass(frozen=True)
class Snapshot:
    """What one poll read: the job's status, step, eval, its resource if the status changed, new records."""

    status: str
    step: int
    eval: dict[str, Any] | None
    job: dict[str, Any] | None
    records: list[dict[str, Any]]
    #: The record at the poll's ``after_step`` still exists (``True`` when ``after_step`` is 0).
    has_cursor_record: bool = True
    #: The job's precision switches, oldest first (``jobs.precision_switches``).
    switches: list[dict[str, Any]] = field(default_factory=list)
    #: What a ``status`` event reports, :func:`job_state` (``None``: just ``status``).
    state: str | None = None


def job_state(status: str, startup: dict[str, Any] | None) -> str:
    """``status``, with the start-up phase while there is one (``running: loading data``): a change sends ``status``."""
    phase = current_phase(status, startup)
    return f"{status}: {phase}" if phase is not None and status == "running" else status


def read_snapshot(
    sessions: sessionmaker[Session], job_id: str, after_step: int, known_status: str | None, limit: int
) -> Snapshot | None:
    """Read the job, then its step records after ``after_step`` (at most ``limit``), in one short session.

    ``job`` (the resource as JSON) is filled only when the job's state (:func:`job_state`)
    differs from ``known_status``. Returns ``None`` if the job does not exist (any more).
    """
    with sessions() as session:
        try:
            job = repo.get_job(session, job_id)
        except repo.JobNotFound:
            return None
        state = job_state(job.status, job.startup)
        resource = job_public(job).model_dump(mode="json") if state != known_status else None
        start = max(after_step - 1, 0)  # include the record at after_step: is it still there?
        rows = repo.list_step_records(session, job_id, after_step=start, limit=limit + 1)
        has_cursor_record = after_step == 0 or (bool(rows) and rows[0].step == after_step)
        records = [step_point(row) for row in rows if row.step > after_step][:limit]
        switches = list(job.precision_switches or [])
        return Snapshot(job.status, job.step, job.eval, resource, records, has_cursor_record, switches, state)


@dataclass
class _Cursor:
    """What this stream has sent so far."""

    step: int
    #: The job state last sent (:func:`job_state`).
    status: str | None = None
    eval: dict[str, Any] | None = None
    #: The record at ``step`` was seen by this stream (sent, or found by a poll): its later absence means a rewind.
    confirmed: bool = False
    #: Precision switches known to this stream (``None`` before the first poll).
    switches: int | None = None


def _frames(snapshot: Snapshot, cursor: _Cursor) -> list[str]:
    """The frames for one poll, advancing ``cursor``: status (non-terminal), rewind, steps, eval, terminal status."""
    out: list[str] = []
    status_frame = frame("status", snapshot.job) if snapshot.job is not None else None
    terminal = snapshot.status in TERMINAL_STATUSES
    if status_frame is not None and not terminal:
        out.append(status_frame)
    records = snapshot.records
    switch_frames, rewound_to = _new_switches(snapshot, cursor)
    out += switch_frames
    if rewound_to is not None and rewound_to < cursor.step:
        # Steps after the switch's checkpoint were trained again: re-read them from there next poll.
        out.append(frame("rewind", {"step": rewound_to}, rewound_to))
        cursor.step, cursor.confirmed, records = rewound_to, False, []
    elif cursor.confirmed and not snapshot.has_cursor_record and snapshot.step < cursor.step:
        # A retry resumed from an earlier checkpoint; the records read are re-read from there next poll.
        out.append(frame("rewind", {"step": snapshot.step}, snapshot.step))
        cursor.step, cursor.confirmed, records = snapshot.step, False, []
    elif snapshot.has_cursor_record:
        cursor.confirmed = True  # (a resume point the job has not reached yet stays unconfirmed: no rewind)
    for record in records:
        step = int(record["step"])
        if step > cursor.step:
            out.append(frame("step", record, step))
            cursor.step, cursor.confirmed = step, True
    if snapshot.eval is not None and snapshot.eval != cursor.eval:
        out.append(frame("eval", snapshot.eval))
    cursor.eval = snapshot.eval
    if status_frame is not None and terminal:
        out.append(status_frame)
    cursor.status = snapshot.state or snapshot.status
    return out


def _new_switches(snapshot: Snapshot, cursor: _Cursor) -> tuple[list[str], int | None]:
    """Frames for the precision switches made since the last poll, and the earliest step they rewound to."""
    known, cursor.switches = cursor.switches, len(snapshot.switches)
    new = snapshot.switches[known:] if known is not None else []
    rewound = [int(s["rewound_to_step"]) for s in new if isinstance(s.get("rewound_to_step"), int)]
    return [frame("precision_switch", s) for s in new], min(rewound, default=None)


Poller = Callable[[str, int, str | None], Awaitable[Snapshot | None]]


def database_poller(sessions: sessionmaker[Session], page_size: int, shared: SharedReads[Any] | None = None) -> Poller:
    """A poller reading :func:`read_snapshot` in a worker thread (the event loop never blocks on the database).

    With ``shared``, streams asking the same question (job, cursor, known status) at
    the same tick share one read; one made a poller is per stream, and never hands its
    stream a read older than the last one it used.
    """

    async def read(job_id: str, after_step: int, known_status: str | None) -> Snapshot | None:
        return await anyio.to_thread.run_sync(read_snapshot, sessions, job_id, after_step, known_status, page_size)

    last_started = -math.inf  # this stream's newest read: never take a shared one that started before it

    async def poll(job_id: str, after_step: int, known_status: str | None) -> Snapshot | None:
        nonlocal last_started
        if shared is None:
            return await read(job_id, after_step, known_status)
        key = ("snapshot", job_id, after_step, known_status, page_size)
        snapshot, last_started = await shared.get_timed(key, lambda: read(job_id, after_step, known_status), last_started)
        return cast("Snapshot | None", snapshot)

    return poll


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
    first: str = "",
) -> AsyncIterator[str]:
    """The SSE text of a stream of polls: ``first``, then each ``tick()``'s frames, until it is done.

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
        if first:
            yield first
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


def job_events(
    job_id: str,
    after_step: int,
    poll: Poller,
    is_disconnected: Callable[[], Awaitable[bool]],
    stats: StreamStats,
) -> AsyncIterator[str]:
    """The SSE text of one job's stream, from records after ``after_step`` until the job is terminal.

    A :func:`poll_stream` that ends after sending a terminal status, when the job
    disappears, or when the client has gone.
    """
    cursor = _Cursor(step=after_step)
    page_size = stats.settings.page_size

    async def tick() -> Tick | None:
        snapshot = await poll(job_id, cursor.step, cursor.status)
        if snapshot is None:
            return None
        frames = _frames(snapshot, cursor)
        return Tick(frames, done=snapshot.status in TERMINAL_STATUSES, more=len(snapshot.records) >= page_size)

    return poll_stream("event", job_id, tick, is_disconnected, stats, first=f"retry: {RETRY_MS}\n\n")
