"""Many viewers of one job: their streams poll at the same ticks and share one database read per tick.

A real uvicorn server (``live_server``) on both backends; 20 event streams (or log
follows) of one running job while it writes a step (and a log line) every 50 ms.
Every stream must still get every record once and in order, and end after the job
does; the database must see about one read per poll tick, not one per stream.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import httpx
import pytest
from api_support import FakeQueue, insert_job
from live_server import LiveServer, add_steps, iter_events, set_status, step_record
from sqlalchemy import event
from sqlalchemy.orm import Session, sessionmaker

from halfcast.contracts.rundir import JobRuns
from halfcast.core.settings import Settings
from server.app import create_app
from server.streams.stats import EventStreamSettings, StreamStats

pytestmark = pytest.mark.slow  # a live uvicorn server and 20 streams: not in make check

VIEWERS = 20
POLL_S = 0.1
STEPS = 40
WRITE_EVERY_S = 0.05


@dataclass
class _Viewer:
    """One client following a stream to its end; what it received."""

    url: str
    params: dict[str, str]
    steps: list[int] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    last: str | None = None
    error: str | None = None

    def run(self) -> None:
        try:
            with httpx.Client(timeout=60) as client, client.stream("GET", self.url, params=self.params) as response:
                for ev in iter_events(response.iter_lines()):
                    self.last = ev.event
                    if ev.event == "step":
                        self.steps.append(ev.step())
                    elif ev.event == "lines":
                        self.lines += ev.data["lines"]
        except Exception as exc:  # noqa: BLE001  # reported by the test
            self.error = repr(exc)


def _write(settings: Settings, sessions: sessionmaker[Session], job_id: str) -> None:
    log_path = JobRuns.of(settings.runs_dir, job_id).attempt(1).rank_log(0)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    for step in range(1, STEPS + 1):
        add_steps(sessions, job_id, [step_record(step)])
        with log_path.open("a") as handle:
            handle.write(f"line {step}\n")
        time.sleep(WRITE_EVERY_S)
    set_status(sessions, job_id, "succeeded")


def _count_job_reads(app_engine: object, counter: list[int]) -> None:
    def before(_conn: object, _cursor: object, statement: str, *_: object) -> None:
        if statement.lstrip().upper().startswith("SELECT") and "FROM jobs" in statement:
            counter.append(1)

    event.listen(app_engine, "before_cursor_execute", before)


@pytest.mark.parametrize("kind", ["events", "logs"])
def test_viewers_of_one_job_share_one_database_read_per_tick(
    settings: Settings, sessions: sessionmaker[Session], kind: str
) -> None:
    job_id = insert_job(sessions, status="running")
    settings.auth = False
    app = create_app(settings, FakeQueue())
    stats = StreamStats(EventStreamSettings(poll_interval_s=POLL_S))
    setattr(app.state, "event_streams" if kind == "events" else "log_streams", stats)
    job_reads: list[int] = []
    with LiveServer(app) as server:
        _count_job_reads(app.state.engine, job_reads)  # the engine exists once the app has started
        url = f"{server.url}/jobs/{job_id}/{kind}"
        params = {} if kind == "events" else {"follow": "true"}
        viewers = [_Viewer(url, params) for _ in range(VIEWERS)]
        threads = [threading.Thread(target=v.run, daemon=True) for v in viewers]
        started = time.monotonic()
        for n, thread in enumerate(threads):
            thread.start()
            time.sleep(0.37 * POLL_S if n % 3 else 0.0)  # viewers open the page at different moments
        _write(settings, sessions, job_id)
        for thread in threads:
            thread.join(timeout=30)
        elapsed = time.monotonic() - started
        metrics = httpx.get(f"{server.url}/metrics", timeout=10).text
    assert all(v.error is None for v in viewers), {v.error for v in viewers}
    if kind == "events":
        assert all(v.steps == list(range(1, STEPS + 1)) and v.last == "status" for v in viewers)
    else:
        assert all(v.lines == [f"line {n}" for n in range(1, STEPS + 1)] and v.last == "end" for v in viewers)
    ticks = elapsed / POLL_S
    # Each viewer's first poll is its own; after that, one read per tick of the job (a few spares for scheduling).
    assert stats.shared.reads <= VIEWERS + 2 * ticks + 5, (stats.shared.reads, stats.polls, ticks)
    assert stats.polls >= 4 * stats.shared.reads, (stats.polls, stats.shared.reads)
    assert len(job_reads) - VIEWERS <= 2 * (VIEWERS + 2 * ticks + 5)  # the auth/404 check, then the shared polls
    name = "event" if kind == "events" else "log"
    assert f"halfcast_{name}_stream_reads_total {float(stats.shared.reads)}" in metrics.splitlines()
