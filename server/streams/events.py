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

The loop, its framing, keep-alive and disconnect checks are the streams' one core,
:func:`server.streams.sse.poll_stream`; this module reads the job and turns what changed into events.
The job is read before its step records, so a terminal status is only sent after
every record committed before it (the worker stores records before the outcome).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio
from sqlalchemy.orm import Session, sessionmaker

from halfcast.core.db import jobs as repo
from halfcast.core.db.models import TERMINAL_STATUSES
from server.schemas import current_phase, job_public, step_point
from server.streams.shared_reads import SharedReads, StreamReads
from server.streams.sse import Tick, frame, poll_stream
from server.streams.stats import StreamStats

#: Reconnection delay the stream asks clients for (SSE ``retry:``), milliseconds.
RETRY_MS = 2000

# ----------------------------------------------------------------------------- polling


@dataclass(frozen=True)
class Snapshot:
    """What one poll read: the job's status, step, eval, its resource if the status changed, new records."""

    status: str
    step: int
    eval: dict[str, object] | None
    #: The job resource as JSON (``None``: its state did not change).
    job: dict[str, object] | None
    #: The step records after the cursor, as the API returns them (:func:`server.schemas.step_point`).
    records: list[dict[str, object]]
    #: The record at the poll's ``after_step`` still exists (``True`` when ``after_step`` is 0).
    has_cursor_record: bool = True
    #: The job's precision switches, oldest first (``jobs.precision_switches``).
    switches: list[dict[str, object]] = field(default_factory=list)
    #: What a ``status`` event reports, :func:`job_state` (``None``: just ``status``).
    state: str | None = None


def job_state(status: str, startup: Mapping[str, object] | None) -> str:
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
    eval: dict[str, object] | None = None
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
        step = _step_of(record)
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


def _step_of(record: Mapping[str, object]) -> int:
    """A step point's ``step`` as ``int()`` makes it (a number, a numeric string; any other JSON value: ``TypeError``)."""
    value = record["step"]
    if isinstance(value, int | float | str):
        return int(value)
    raise TypeError(f"a step record's step is {type(value).__name__}, not a number")


def _new_switches(snapshot: Snapshot, cursor: _Cursor) -> tuple[list[str], int | None]:
    """Frames for the precision switches made since the last poll, and the earliest step they rewound to."""
    known, cursor.switches = cursor.switches, len(snapshot.switches)
    new = snapshot.switches[known:] if known is not None else []
    rewound = [int(value) for s in new if isinstance(value := s.get("rewound_to_step"), int)]
    return [frame("precision_switch", s) for s in new], min(rewound, default=None)


Poller = Callable[[str, int, str | None], Awaitable[Snapshot | None]]


def database_poller(sessions: sessionmaker[Session], page_size: int, shared: SharedReads[Any] | None = None) -> Poller:
    """A poller reading :func:`read_snapshot` in a worker thread (the event loop never blocks on the database).

    With ``shared``, streams asking the same question (job, cursor, known status) at
    the same tick share one read; one made a poller is per stream, and never hands its
    stream a read older than the last one it used (:class:`StreamReads`).
    """
    reads = StreamReads(shared)

    async def poll(job_id: str, after_step: int, known_status: str | None) -> Snapshot | None:
        async def read() -> Snapshot | None:
            return await anyio.to_thread.run_sync(read_snapshot, sessions, job_id, after_step, known_status, page_size)

        return await reads.get(("snapshot", job_id, after_step, known_status, page_size), read)

    return poll


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

    return poll_stream("event", job_id, tick, is_disconnected, stats, retry_ms=RETRY_MS)
