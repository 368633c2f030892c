"""Field case C24 — a closed stream stops costing (fastapi/fastapi#1342).

A client opens the live event stream of a running job, reads 2 events and
disconnects; 20 times. Each server-side stream must end within ~2 s of its
disconnect, and no database reads may continue for closed streams: the app's
stream bookkeeping (``app.state.event_streams``, exported as the
``halfcast_event_streams`` gauge) shows every stream closed and the poll counter
standing still while the job keeps writing records.
"""

from __future__ import annotations

import re
import threading
import time

import httpx
import pytest
from api_support import FakeQueue, insert_job
from live_server import (
    AsgiSpec24,
    LiveServer,
    add_steps,
    closed_streams,
    iter_events,
    last_closed_after,
    step_record,
    wait_until,
)
from sqlalchemy.orm import Session, sessionmaker

from halfcast.core.settings import Settings
from server.app import create_app
from server.streams.stats import EventStreamSettings, StreamStats

pytestmark = pytest.mark.slow  # live uvicorn servers, streams timed until they stop: not in make check

STREAMS = 20
#: Seconds within which a server-side stream must end after its client disconnected.
END_WITHIN_S = 2.0


@pytest.mark.parametrize("asgi_spec", ["2.3", "2.4"])
def test_closed_streams_stop_within_two_seconds_and_stop_reading(
    settings: Settings, sessions: sessionmaker[Session], asgi_spec: str
) -> None:
    """C24: With spec 2.3 (uvicorn) Starlette cancels the stream on disconnect; with 2.4 only the stream's own check can."""
    job_id = insert_job(sessions, status="running")
    stop = threading.Event()

    def run_job() -> None:  # the "worker": a step record every 50 ms until the test ends
        step = 0
        while not stop.is_set():
            step += 1
            add_steps(sessions, job_id, [step_record(step)])
            stop.wait(0.05)

    settings.auth = False  # a stream test; authentication is tests/server/test_auth_routes.py's
    app = create_app(settings, FakeQueue())
    stats = app.state.event_streams = StreamStats(EventStreamSettings(poll_interval_s=0.1))
    writer = threading.Thread(target=run_job)
    end_delays: list[float] = []
    with LiveServer(AsgiSpec24(app) if asgi_spec == "2.4" else app) as server:
        writer.start()
        try:
            for n in range(STREAMS):
                with (
                    httpx.Client(timeout=10) as client,
                    client.stream("GET", f"{server.url}/jobs/{job_id}/events") as response,
                ):
                    assert response.status_code == 200
                    events = iter_events(response.iter_lines())
                    received = [next(events), next(events)]
                    assert stats.active == 1
                disconnected_at = time.monotonic()
                assert received[0].event == "status" and received[0].data["status"] == "running"
                assert received[1].event == "step"
                assert wait_until(closed_streams(stats, n + 1), END_WITHIN_S + 3), f"stream {n} still open"
                end_delays.append(last_closed_after(stats, disconnected_at))
            polls_after_close = stats.polls
            time.sleep(1.0)  # the job keeps writing; nobody listens
            assert stats.polls == polls_after_close, "closed streams still read the database"
            gauge = httpx.get(f"{server.url}/metrics").text
        finally:
            stop.set()
            writer.join()
    assert stats.active == 0 and stats.opened_total == STREAMS
    assert re.search(r"^halfcast_event_streams 0\.0$", gauge, re.MULTILINE), gauge
    assert max(end_delays) < END_WITHIN_S, end_delays
    print(
        f"C24 (ASGI {asgi_spec}) stream end after disconnect: max {max(end_delays) * 1000:.1f} ms over {STREAMS} streams"
    )
