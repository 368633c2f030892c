"""A real uvicorn server in a thread of the test process, and helpers that write like the worker.

The streaming tests need a real HTTP server (TestClient buffers a streamed body
and cannot disconnect mid-stream); running it in-process lets them look at
``app.state`` directly. Imported as ``live_server`` (this folder is on ``sys.path``).
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import httpx
import uvicorn
from parallel_support import free_port
from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker
from starlette.types import ASGIApp, Receive, Scope, Send

from halfcast.core.db.models import Job, StepRow, utcnow
from server.streams.stats import StreamStats


def sqlite_copy(data_dir: Path, template: Path) -> str:
    """URL of a copy of the migrated SQLite ``template`` in ``data_dir`` (for tests that need one backend only)."""
    path = data_dir / "halfcast.db"
    shutil.copyfile(template, path)
    return f"sqlite:///{path}"


def wait_until(predicate: Callable[[], bool], timeout_s: float) -> bool:
    """Poll ``predicate`` every 10 ms until it holds (``True``) or ``timeout_s`` passed (``False``)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return False


class AsgiSpec24:
    """ASGI wrapper announcing HTTP spec version 2.4 to the app, as some servers do (uvicorn says 2.3).

    Starlette then stops watching ``http.disconnect`` while it streams a response and
    relies on ``send`` failing, which uvicorn never does after a disconnect: only the
    stream's own ``request.is_disconnected()`` checks can end it.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            scope = {**scope, "asgi": {**scope.get("asgi", {}), "spec_version": "2.4"}}
        await self.app(scope, receive, send)


class LiveServer:
    """``with LiveServer(app) as server:`` serves ``app`` (lifespan included) at ``server.url``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="live-server", daemon=True)

    def __enter__(self) -> Self:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the live server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


@dataclass
class Event:
    """One parsed SSE event."""

    event: str
    data: Any
    id: str | None

    def step(self) -> int:
        """The step a ``step`` event carries as its id."""
        assert self.event == "step" and self.id is not None, self
        return int(self.id)


def iter_events(lines: Iterator[str]) -> Iterator[Event]:
    """Parse SSE lines (as from ``httpx.Response.iter_lines``) into events; comments and ``retry`` are skipped."""
    fields: dict[str, str] = {}
    for line in lines:
        if line == "":
            if "data" in fields:
                yield Event(fields.get("event", "message"), json.loads(fields["data"]), fields.get("id"))
            fields = {}
        elif not line.startswith(":"):
            name, _, value = line.partition(":")
            fields[name] = value.removeprefix(" ")


def read_events(url: str, headers: dict[str, str] | None = None, timeout_s: float = 30) -> list[Event]:
    """Every event of a stream, until the server closes it."""
    with httpx.Client(timeout=timeout_s) as client, client.stream("GET", url, headers=headers) as response:
        response.raise_for_status()
        return list(iter_events(response.iter_lines()))


# ----------------------------------------------------------------------------- writing like the worker


def step_record(step: int, **fields: Any) -> dict[str, Any]:
    """A step record for ``step`` (loss 1/step, scale 1024, no overflow) with ``fields`` replaced."""
    record = {
        "step": step,
        "time": time.time(),
        "loss": 1.0 / step,
        "loss_scale": 1024.0,
        "overflow": False,
        "skipped_steps": 0,
        "grad_norm": 0.5,
        "lr": 0.001,
        "samples_per_second": 500.0,
        "tokens_per_second": None,
    }
    record.update(fields)
    return record


def add_steps(sessions: sessionmaker[Session], job_id: str, records: list[dict[str, Any]]) -> None:
    """Insert step records and move the job's ``step``/``latest`` in one transaction, as the worker does."""
    with sessions() as session:
        for record in records:
            session.add(StepRow(job_id=job_id, step=record["step"], time=record["time"], data=record))
        session.execute(
            update(Job)
            .where(Job.id == job_id)
            .values(step=records[-1]["step"], latest=records[-1], updated_at=utcnow())
        )
        session.commit()


def set_status(sessions: sessionmaker[Session], job_id: str, status: str, **values: Any) -> None:
    """Set the job's status (and other columns) directly."""
    with sessions() as session:
        session.execute(update(Job).where(Job.id == job_id).values(status=status, updated_at=utcnow(), **values))
        session.commit()


def closed_streams(stats: StreamStats, count: int) -> Callable[[], bool]:
    """For :func:`wait_until`: whether ``stats`` has recorded ``count`` closed streams."""
    return lambda: len(stats.closed) == count


def last_closed_after(stats: StreamStats, since: float) -> float:
    """Seconds from ``since`` (a ``time.monotonic()``) to when the last stream ``stats`` recorded closed."""
    closed_at = stats.closed[-1].closed_at
    assert closed_at is not None, "a stream is recorded closed with its time"
    return closed_at - since
