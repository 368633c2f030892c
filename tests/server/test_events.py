"""``GET /jobs/{id}/events``: order of events, resume without gaps or duplicates, end at a terminal status."""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx
import pytest
from api_support import FakeQueue, app_state, insert_job, insert_steps, record_step
from fastapi.testclient import TestClient
from live_server import (
    LiveServer,
    add_steps,
    iter_events,
    read_events,
    set_status,
    step_record,
)
from sqlalchemy.orm import Session, sessionmaker

from halfcast.core.settings import Settings
from server.app import create_app
from server.streams.events import Snapshot, job_events
from server.streams.stats import EventStreamSettings, StreamStats

# ----------------------------------------------------------------------------- the generator, with a scripted poller


def _snapshot(status: str, records: range = range(0), step: int | None = None, **extra: Any) -> Snapshot:
    points = [step_record(n) for n in records]
    return Snapshot(
        status,
        step if step is not None else (records[-1] if records else 0),
        extra.get("eval"),
        {"status": status},
        points,
        extra.get("has_cursor_record", True),
    )


def _run(
    snapshots: list[Snapshot | None],
    after_step: int = 0,
    settings: EventStreamSettings | None = None,
    disconnect_after: int | None = None,
) -> tuple[str, list[tuple[int, str | None]], StreamStats]:
    """Drive :func:`job_events` over ``snapshots``.

    Returns the text, the (after_step, known_status) of each poll, and the stats.
    """
    stats = StreamStats(settings or EventStreamSettings(poll_interval_s=0.001))
    polls: list[tuple[int, str | None]] = []

    async def poll(_job_id: str, after: int, known: str | None) -> Snapshot | None:
        polls.append((after, known))
        snapshot = snapshots[min(len(polls), len(snapshots)) - 1]
        if snapshot is not None and snapshot.status == known:
            snapshot = Snapshot(
                snapshot.status,
                snapshot.step,
                snapshot.eval,
                None,
                [r for r in snapshot.records if record_step(r) > after],
                snapshot.has_cursor_record,
            )
        return snapshot

    async def disconnected() -> bool:
        return disconnect_after is not None and len(polls) >= disconnect_after

    async def collect() -> str:
        stream: AsyncIterator[str] = job_events("job", after_step, poll, disconnected, stats)
        return "".join([chunk async for chunk in stream])

    return anyio.run(collect), polls, stats


def _parse(text: str) -> list[tuple[str, str | None, Any]]:
    return [(e.event, e.id, e.data) for e in iter_events(iter(text.split("\n")))]


def test_status_first_then_steps_in_order_and_the_terminal_status_last() -> None:
    text, polls, stats = _run([
        _snapshot("queued"),
        _snapshot("running", range(1, 3)),
        _snapshot("running", range(1, 5), eval={"step": 4, "loss": 0.5}),
        _snapshot("succeeded", range(1, 7), eval={"step": 6, "loss": 0.25}),
    ])  # fmt: skip  # a table, laid out by hand
    assert text.startswith("retry: ")
    events = _parse(text)
    assert [(kind, event_id) for kind, event_id, _ in events] == [
        ("status", None), ("status", None), ("step", "1"), ("step", "2"), ("step", "3"), ("step", "4"),
        ("eval", None), ("step", "5"), ("step", "6"), ("eval", None), ("status", None),
    ]  # fmt: skip  # a table, laid out by hand
    assert [data["status"] for kind, _, data in events if kind == "status"] == ["queued", "running", "succeeded"]
    assert [after for after, _ in polls] == [0, 0, 2, 4]
    assert stats.active == 0 and stats.closed[-1].polls == 4 and stats.polls == 4


def test_resume_sends_only_the_records_after_the_last_event_id() -> None:
    text, polls, _ = _run([_snapshot("succeeded", range(1, 10))], after_step=6)
    assert [event_id for kind, event_id, _ in _parse(text) if kind == "step"] == ["7", "8", "9"]
    assert polls == [(6, None)]


def test_a_full_page_is_followed_by_another_read_without_sleeping() -> None:
    settings = EventStreamSettings(poll_interval_s=5.0, page_size=2)
    started = time.monotonic()
    text, _, _ = _run([_snapshot("running", range(1, 3)), _snapshot("succeeded", range(1, 4))], settings=settings)
    assert time.monotonic() - started < 2
    assert [event_id for kind, event_id, _ in _parse(text) if kind == "step"] == ["1", "2", "3"]


def test_heartbeat_comments_while_idle_and_the_disconnect_check_stops_polling() -> None:
    settings = EventStreamSettings(poll_interval_s=0.01, heartbeat_s=0.02)
    text, polls, stats = _run([_snapshot("running")], settings=settings, disconnect_after=12)
    assert ": keepalive" in text
    assert len(polls) == 12 and stats.active == 0 and stats.closed[-1].closed_at is not None


def test_a_vanished_job_ends_the_stream() -> None:
    text, polls, stats = _run([_snapshot("running", range(1, 2)), None])
    assert [kind for kind, _, _ in _parse(text)] == ["status", "step"] and len(polls) == 2 and stats.active == 0


def test_a_resume_point_ahead_of_the_job_is_waited_for_not_rewound() -> None:
    text, _, _ = _run(
        [
            _snapshot("running", range(1, 3), has_cursor_record=False),
            _snapshot("running", range(1, 5), has_cursor_record=False),
            _snapshot("succeeded", range(1, 7)),
        ],
        after_step=4,
    )
    assert [(kind, event_id) for kind, event_id, _ in _parse(text) if kind != "status"] == [
        ("step", "5"),
        ("step", "6"),
    ]


def test_a_rewind_is_announced_and_the_redone_steps_follow() -> None:
    text, _, _ = _run([
        _snapshot("running", range(1, 6)),
        _snapshot("running", range(1, 3), step=2, has_cursor_record=False),
        _snapshot("succeeded", range(1, 5)),
    ])  # fmt: skip  # a table, laid out by hand
    assert [(kind, event_id) for kind, event_id, _ in _parse(text) if kind != "status"] == [
        ("step", "1"), ("step", "2"), ("step", "3"), ("step", "4"), ("step", "5"), ("rewind", "2"), ("step", "3"), ("step", "4"),
    ]  # fmt: skip  # a table, laid out by hand


# ----------------------------------------------------------------------------- the route (SQLite and PostgreSQL)


def test_unknown_job_is_404_and_a_bad_last_event_id_422(client: TestClient) -> None:
    response = client.get("/jobs/nope/events")
    assert response.status_code == 404 and response.json()["job_id"] == "nope"
    job_id = insert_job(app_state(client.app).session_factory, status="succeeded")
    response = client.get(f"/jobs/{job_id}/events", headers={"Last-Event-ID": "x"})
    assert response.status_code == 422 and response.json()["detail"][0]["loc"] == ["header", "Last-Event-ID"]


def test_a_finished_job_streams_its_records_then_its_status_and_closes(
    client: TestClient, sessions: sessionmaker[Session]
) -> None:
    job_id = insert_job(sessions, status="succeeded", latest={"step": 5})
    insert_steps(sessions, job_id, range(1, 6))
    response = client.get(f"/jobs/{job_id}/events")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    assert response.headers["cache-control"] == "no-cache"
    events = list(iter_events(iter(response.text.split("\n"))))
    assert [(e.event, e.id) for e in events] == [*[("step", str(n)) for n in range(1, 6)], ("status", None)]
    assert (
        events[2].data["overflow"] is True
        and events[-1].data["id"] == job_id
        and events[-1].data["status"] == "succeeded"
    )
    resumed = client.get(f"/jobs/{job_id}/events", headers={"Last-Event-ID": "3"})
    assert [e.id for e in iter_events(iter(resumed.text.split("\n")))] == ["4", "5", None]
    by_query = client.get(f"/jobs/{job_id}/events", params={"after_step": 4})
    assert [e.id for e in iter_events(iter(by_query.text.split("\n")))] == ["5", None]


def _app(settings: Settings, poll_interval_s: float = 0.05) -> Any:
    settings.auth = False  # a stream test; authentication is tests/server/test_auth_routes.py's
    app = create_app(settings, FakeQueue())
    app.state.event_streams = StreamStats(EventStreamSettings(poll_interval_s=poll_interval_s))
    return app


def test_live_job_events_arrive_as_written_and_a_reconnect_resumes_without_gaps(
    settings: Settings, sessions: sessionmaker[Session]
) -> None:
    job_id = insert_job(sessions, status="queued")
    with LiveServer(_app(settings)) as server:
        url = f"{server.url}/jobs/{job_id}/events"
        first: list[Any] = []

        def work() -> None:
            time.sleep(0.3)
            set_status(sessions, job_id, "starting")
            set_status(sessions, job_id, "running")
            for step in range(1, 21):
                add_steps(sessions, job_id, [step_record(step)])
                time.sleep(0.03)
            set_status(sessions, job_id, "succeeded", eval={"step": 20, "loss": 0.1, "accuracy": 0.9})

        writer = threading.Thread(target=work)
        with httpx.Client(timeout=30) as http, http.stream("GET", url) as response:
            writer.start()
            for event in iter_events(response.iter_lines()):
                first.append(event)
                if event.event == "step" and event.id == "7":
                    break  # disconnect mid-job
        rest = read_events(url, headers={"Last-Event-ID": "7"})
        writer.join()
    statuses = [e.data["status"] for e in first if e.event == "status"]
    assert statuses[0] == "queued" and "running" in statuses
    steps = [int(e.id) for e in first + rest if e.event == "step"]
    assert steps == list(range(1, 21))
    assert (
        rest[-1].event == "status"
        and rest[-1].data["status"] == "succeeded"
        and rest[-1].data["eval"]["accuracy"] == 0.9
    )
    assert [e.event for e in rest].count("eval") == 1 and rest[-2].event == "eval"


def test_between_polls_a_stream_sleeps_until_its_jobs_next_tick(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every stream of a job wakes at the job's ticks, not ``poll_interval_s`` after its own poll.

    So their reads can be shared.
    """
    asked: list[tuple[str, float]] = []

    def next_tick(key: str, interval_s: float) -> float:
        asked.append((key, interval_s))
        return 0.0

    monkeypatch.setattr("server.streams.sse.next_tick_delay", next_tick)
    settings = EventStreamSettings(poll_interval_s=7.0)  # a plain sleep of the interval would time the test out
    started = time.monotonic()
    _, polls, _ = _run(
        [_snapshot("running", range(1, 3)), _snapshot("running", range(1, 3)), _snapshot("succeeded", range(1, 3))],
        settings=settings,
    )
    assert time.monotonic() - started < 5
    assert len(polls) == 3 and asked == [("job", 7.0), ("job", 7.0)]
