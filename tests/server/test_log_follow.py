"""``GET /jobs/{id}/logs?follow=true``: SSE of a rank's new lines until the job ends; a closed stream stops.

A real uvicorn server in a thread (``live_server``): the tests append to log files and
move the job's status as the worker would, and look at ``app.state.log_streams``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from api_support import FakeQueue, insert_job
from live_server import (
    AsgiSpec24,
    Event,
    LiveServer,
    closed_streams,
    iter_events,
    last_closed_after,
    set_status,
    sqlite_copy,
    wait_until,
)
from sqlalchemy.orm import Session, sessionmaker
from starlette.types import ASGIApp

from halfcast.contracts.rundir import JobRuns
from halfcast.core.settings import Settings
from server.app import create_app
from server.streams.stats import EventStreamSettings, StreamStats

#: Seconds within which a server-side stream must end after its client disconnected (field case C24).
END_WITHIN_S = 2.0


@pytest.fixture
def database_url(data_dir: Path, sqlite_template: Path) -> str:
    """SQLite only: the stream's behaviour does not depend on the database."""
    return sqlite_copy(data_dir, sqlite_template)


def _app_and_stats(settings: Settings, spec_24: bool = False) -> tuple[ASGIApp, StreamStats]:
    settings.auth = False  # a stream test; authentication is tests/server/test_auth_routes.py's
    app = create_app(settings, FakeQueue())
    stats = app.state.log_streams = StreamStats(EventStreamSettings(poll_interval_s=0.05))
    return (AsgiSpec24(app) if spec_24 else app), stats


@pytest.fixture
def live(settings: Settings) -> Iterator[tuple[LiveServer, StreamStats]]:
    app, stats = _app_and_stats(settings)
    with LiveServer(app) as server:
        yield server, stats


def _append(settings: Settings, job_id: str, attempt: int, text: str, rank: int = 0) -> None:
    path = JobRuns.of(settings.runs_dir, job_id).attempt(attempt).rank_log(rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        handle.write(text)


def _follow(url: str, events: list[Event], params: dict[str, int] | None = None) -> threading.Thread:
    """Read the whole stream in a thread, appending each event to ``events`` as it arrives."""

    def read() -> None:
        with (
            httpx.Client(timeout=30) as client,
            client.stream("GET", url, params={"follow": "true", **(params or {})}) as response,
        ):
            assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
            events.extend(iter_events(response.iter_lines()))

    thread = threading.Thread(target=read, daemon=True)  # a stream that never ends fails the test, not hangs it
    thread.start()
    return thread


def _lines(events: list[Event]) -> list[str]:
    return [line for event in events if event.event == "lines" for line in event.data["lines"]]


def test_follow_sends_the_tail_then_new_lines_and_ends_with_the_job(
    live: tuple[LiveServer, StreamStats], settings: Settings, sessions: sessionmaker[Session]
) -> None:
    server, stats = live
    job_id = insert_job(sessions, status="running")
    _append(settings, job_id, 1, "".join(f"old {i}\n" for i in range(10)) + "half")
    events: list[Event] = []
    reader = _follow(f"{server.url}/jobs/{job_id}/logs", events, {"tail": 2})
    assert wait_until(lambda: _lines(events) == ["old 8", "old 9"], 10), events  # the partial line is held back
    _append(settings, job_id, 1, " done\nnew 1\nnew 2\nlast, no newline")
    assert wait_until(lambda: _lines(events)[-1:] == ["new 2"], 10), events
    set_status(sessions, job_id, "failed")
    reader.join(timeout=10)
    assert not reader.is_alive(), "the stream did not end with the job"
    assert _lines(events) == ["old 8", "old 9", "half done", "new 1", "new 2", "last, no newline"]
    assert [e.event for e in events][:2] == ["attempt", "lines"] and events[0].data == {"attempt": 1, "rank": 0}
    assert events[-1].event == "end" and events[-1].data == {"status": "failed", "attempt": 1}
    assert wait_until(lambda: stats.active == 0, 5)


def test_follow_waits_for_a_queued_job_and_moves_on_to_a_retry(
    live: tuple[LiveServer, StreamStats], settings: Settings, sessions: sessionmaker[Session]
) -> None:
    server, _ = live
    job_id = insert_job(sessions, status="queued")
    events: list[Event] = []
    reader = _follow(f"{server.url}/jobs/{job_id}/logs", events)
    time.sleep(0.3)
    assert events == [] and reader.is_alive()
    _append(settings, job_id, 1, "attempt 1 says hi\n")
    set_status(sessions, job_id, "running", attempt=1)
    assert wait_until(lambda: _lines(events) == ["attempt 1 says hi"], 10), events
    _append(settings, job_id, 1, "lost its worker\n")
    set_status(sessions, job_id, "queued")  # retried (the attempt number moves at the next claim)
    _append(settings, job_id, 2, "".join(f"attempt 2 line {i}\n" for i in range(300)))
    set_status(sessions, job_id, "running", attempt=2)
    set_status(sessions, job_id, "succeeded")
    reader.join(timeout=10)
    assert not reader.is_alive()
    # the whole of attempt 2 (it began while the stream was open), not only a tail
    assert _lines(events) == ["attempt 1 says hi", "lost its worker"] + [f"attempt 2 line {i}" for i in range(300)]
    assert [e.data["attempt"] for e in events if e.event == "attempt"] == [1, 2]
    assert events[-1].data == {"status": "succeeded", "attempt": 2}


def test_follow_of_an_earlier_attempt_ends_at_once(
    live: tuple[LiveServer, StreamStats], settings: Settings, sessions: sessionmaker[Session]
) -> None:
    server, _ = live
    job_id = insert_job(sessions, status="running")
    set_status(sessions, job_id, "running", attempt=2)
    _append(settings, job_id, 1, "one\ntwo")
    events: list[Event] = []
    _follow(f"{server.url}/jobs/{job_id}/logs", events, {"attempt": 1}).join(timeout=10)
    assert _lines(events) == ["one", "two"] and events[-1].data == {"status": "running", "attempt": 1}


def test_follow_of_a_job_cancelled_while_queued_ends_without_lines(
    live: tuple[LiveServer, StreamStats], sessions: sessionmaker[Session]
) -> None:
    server, _ = live
    job_id = insert_job(sessions, status="cancelled")
    set_status(sessions, job_id, "cancelled", attempt=0)
    events: list[Event] = []
    _follow(f"{server.url}/jobs/{job_id}/logs", events).join(timeout=10)
    assert [(e.event, e.data) for e in events] == [("end", {"status": "cancelled", "attempt": None})]


@pytest.mark.parametrize("asgi_spec", ["2.3", "2.4"])
def test_a_closed_follow_stream_stops_within_two_seconds_and_stops_polling(
    settings: Settings, sessions: sessionmaker[Session], asgi_spec: str
) -> None:
    """C24 for logs: the client reads one batch and disconnects while the job keeps writing; 5 times."""
    job_id = insert_job(sessions, status="running")
    stop = threading.Event()

    def write() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            _append(settings, job_id, 1, f"line {n}\n")
            stop.wait(0.02)

    app, stats = _app_and_stats(settings, spec_24=asgi_spec == "2.4")
    writer = threading.Thread(target=write)
    delays: list[float] = []
    with LiveServer(app) as server:
        writer.start()
        try:
            for n in range(5):
                params = {"follow": "true"}
                with (
                    httpx.Client(timeout=10) as client,
                    client.stream("GET", f"{server.url}/jobs/{job_id}/logs", params=params) as response,
                ):
                    events = iter_events(response.iter_lines())
                    assert next(events).event == "attempt" and next(events).event == "lines"
                    assert stats.active == 1
                closed_at = time.monotonic()
                assert wait_until(closed_streams(stats, n + 1), END_WITHIN_S + 3), f"stream {n} still open"
                delays.append(last_closed_after(stats, closed_at))
            polls = stats.polls
            time.sleep(0.5)
            assert stats.polls == polls, "closed streams still poll"
        finally:
            stop.set()
            writer.join()
    assert stats.active == 0 and max(delays) < END_WITHIN_S, delays
