"""Following one rank's log of a job as Server-Sent Events (``GET /jobs/{id}/logs?follow=true``).

The stream is a loop of short polls on the streams' one core (:mod:`server.streams.sse`), like the event stream:
each poll reads the job's status and attempt in a short database session, *then*
reads the lines appended to the log file since the last poll (in a worker thread,
never blocking the event loop); then it sleeps until the job's next tick. Streams
of one job poll at the same ticks and share one database read per tick
(``shared``). Because the worker records a terminal status only after the run has
exited, a poll that sees a terminal status and then drains the file has every line. The loop checks
``is_disconnected()`` before every poll, so a closed stream stops reading within one
poll interval (Starlette also cancels it on uvicorn's disconnect message).

Events (``data`` is one line of JSON):

- ``attempt`` — ``{"attempt", "rank"}``: the lines that follow come from this
  attempt's log (sent when the stream starts reading an attempt; without an
  explicit ``attempt`` the stream moves on to a retry's new attempt by itself).
- ``lines`` — ``{"attempt", "rank", "lines": [...]}``: the first one holds the last
  ``tail`` lines already written, later ones each new complete line, in order.
  A partial last line is sent only once the attempt is over.
- ``end`` — ``{"status", "attempt"}``: the job is terminal (or the attempt asked
  for has ended) and its log is drained; the server then closes the stream.
- ``: keepalive`` comments after ``heartbeat_s`` without an event.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from halfcast.contracts.rundir import JobRuns
from halfcast.core.db.models import TERMINAL_STATUSES, Job
from server.streams.logtail import LineFollower, read_tail
from server.streams.shared_reads import SharedReads, StreamReads
from server.streams.sse import Tick, frame, poll_stream
from server.streams.stats import StreamStats


@dataclass(frozen=True)
class JobState:
    """What one poll reads of the job: its status and its newest attempt (0: never claimed)."""

    status: str
    attempt: int


def read_job_state(sessions: sessionmaker[Session], job_id: str) -> JobState | None:
    """The job's status and attempt in one short session; ``None`` for an unknown job."""
    with sessions() as session:
        row = session.execute(select(Job.status, Job.attempt).where(Job.id == job_id)).one_or_none()
    return None if row is None else JobState(row.status, row.attempt)


StatePoller = Callable[[str], Awaitable[JobState | None]]


def database_state_poller(sessions: sessionmaker[Session], shared: SharedReads[Any] | None = None) -> StatePoller:
    """A poller running :func:`read_job_state` in a worker thread; with ``shared``, one read per job per tick.

    One poller per stream: it never hands its stream a shared read older than the last one it used.
    """
    reads = StreamReads(shared)

    async def poll(job_id: str) -> JobState | None:
        async def read() -> JobState | None:
            return await anyio.to_thread.run_sync(read_job_state, sessions, job_id)

        return await reads.get(("state", job_id), read)

    return poll


@dataclass(frozen=True)
class LogTarget:
    """Which log to follow: the job, the rank, where run directories live, and a fixed attempt (or ``None``: the newest)."""

    job_id: str
    rank: int
    runs_dir: Path
    attempt: int | None = None
    tail: int = 200

    def path(self, attempt: int) -> Path:
        """The rank's log file in ``attempt``'s run directory."""
        return JobRuns.of(self.runs_dir, self.job_id).attempt(attempt).rank_log(self.rank)


def _open_attempt(target: LogTarget, attempt: int, *, whole: bool, done: bool) -> tuple[LineFollower, list[str]]:
    """A follower of ``attempt``'s log placed after its complete lines, and its last ``target.tail`` lines.

    With ``whole`` (an attempt that began while the stream was open) the follower starts
    at the beginning of the file instead, so every line of it is sent. With ``done``
    (the attempt is over) a partial last line counts as one of the ``tail`` lines.
    """
    path = target.path(attempt)
    if whole:
        return LineFollower(path), []
    try:
        tail = read_tail(path, target.tail, complete_only=not done)
    except FileNotFoundError:
        return LineFollower(path), []  # not written yet: everything it gets is new
    return LineFollower(path, tail.end), tail.lines


def _drain(follower: LineFollower) -> list[str]:
    """Every line left in the file, the partial last one included (the writer is done)."""
    lines = follower.read()
    while follower.behind:
        lines += follower.read()
    return lines + follower.flush()


@dataclass
class _Following:
    """The attempt being read and its follower."""

    attempt: int
    follower: LineFollower


class _LogFrames:
    """Turns polls into frames: which attempt to read, its new lines, and the end."""

    def __init__(self, target: LogTarget) -> None:
        self.target = target
        self.current: _Following | None = None
        self.ended = False
        self.polled = False

    def _lines(self, attempt: int, lines: list[str]) -> list[str]:
        return [frame("lines", {"attempt": attempt, "rank": self.target.rank, "lines": lines})] if lines else []

    def _start(self, attempt: int, whole: bool, done: bool) -> list[str]:
        follower, lines = _open_attempt(self.target, attempt, whole=whole, done=done)
        self.current = _Following(attempt, follower)
        return [frame("attempt", {"attempt": attempt, "rank": self.target.rank}), *self._lines(attempt, lines)]

    def step(self, state: JobState) -> list[str]:
        """The frames for one poll of ``state`` (blocking file reads: call it in a worker thread)."""
        wanted = self.target.attempt or state.attempt
        out: list[str] = []
        finished = state.status in TERMINAL_STATUSES or (self.target.attempt is not None and state.attempt > wanted)
        current = self.current
        if current is not None and current.attempt != wanted:  # a retry began: finish the old attempt's log
            out += self._lines(current.attempt, _drain(current.follower))
            current = self.current = None
        if current is None and 0 < wanted <= state.attempt:
            # an attempt that began while this stream was open is sent whole
            out += self._start(wanted, whole=self.polled, done=finished)
        self.polled = True
        if self.current is not None:
            read = _drain if finished else LineFollower.read
            out += self._lines(self.current.attempt, read(self.current.follower))
        if finished:
            self.ended = True
            out.append(
                frame("end", {"status": state.status, "attempt": self.current.attempt if self.current else None})
            )
        return out

    @property
    def behind(self) -> bool:
        """More bytes were already waiting after the last read (read on without sleeping)."""
        return self.current is not None and self.current.follower.behind


def follow_log(
    target: LogTarget,
    poll: StatePoller,
    is_disconnected: Callable[[], Awaitable[bool]],
    stats: StreamStats,
) -> AsyncIterator[str]:
    """The SSE text following ``target``'s log until the job (or the attempt asked for) ends.

    A :func:`server.streams.sse.poll_stream` that ends after the ``end`` event, when the
    job disappears, or when the client has gone.
    """
    frames = _LogFrames(target)

    async def tick() -> Tick | None:
        state = await poll(target.job_id)
        if state is None:
            return None
        out = await anyio.to_thread.run_sync(frames.step, state)  # file reads: never on the event loop
        return Tick(out, done=frames.ended, more=frames.behind)

    return poll_stream("log", target.job_id, tick, is_disconnected, stats)
