"""Under load the API answers 503 with ``Retry-After`` instead of hanging: a busy pool, a full admission line.

The pool tests hold the app's only database connection (``HALFCAST_DB_POOL_SIZE=1``,
no overflow), and on PostgreSQL the only one of ``GET /jobs/{id}``'s own pool too
(:mod:`halfcast.core.db.async_pool`, the same limits), so every request's checkout times out; the admission tests take every
place of the app's limiter, as requests in flight would. Probes and cancels are exempt
from admission. :class:`server.http.admission.Limiter` itself is tested on its own at the end.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import anyio
import pytest
from api_support import FakeQueue, app_state, database_reads, insert_job, portal
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker
from starlette.types import Message, Receive, Scope, Send

from halfcast.core.db.job_reads_async import AsyncJobReads
from halfcast.core.settings import Settings
from server.app import create_app
from server.http.admission import AdmissionMiddleware, Limiter, Shed


def _client(settings: Settings, queue: FakeQueue, headers: dict[str, str], **changes: Any) -> TestClient:
    return TestClient(create_app(settings.model_copy(update=changes), queue), headers=headers)


@pytest.fixture
def one_connection(settings: Settings, fake_queue: FakeQueue, auth_headers: dict[str, str]) -> Iterator[TestClient]:
    """An app whose pool has one connection and waits 0.2 s for it."""
    with _client(
        settings, fake_queue, auth_headers, db_pool_size=1, db_max_overflow=0, db_pool_timeout_s=0.2
    ) as client:
        yield client


def _assert_busy(response: Any, words: str) -> None:
    assert response.status_code == 503, response.text
    assert response.headers["retry-after"] == "1"
    assert words in response.json()["detail"]


@contextmanager
def _every_connection_held(client: TestClient) -> Iterator[None]:
    """Hold the only connection of the app's engine and, on PostgreSQL, of the job resource's own pool."""
    state = app_state(client.app)
    held = state.engine.connect()
    reads = database_reads(client.app)
    pool = reads.pool if isinstance(reads, AsyncJobReads) else None
    polls = portal(client).call(pool.acquire) if pool is not None else None
    try:
        yield
    finally:
        held.close()
        if pool is not None and polls is not None:
            portal(client).call(pool.release, polls)


def test_no_free_database_connection_is_503_not_a_hang(
    one_connection: TestClient, sessions: sessionmaker[Session]
) -> None:
    job_id = insert_job(sessions)
    with _every_connection_held(one_connection):
        for path in (f"/jobs/{job_id}", "/jobs", f"/jobs/{job_id}/metrics"):
            _assert_busy(one_connection.get(path), "database busy")
    assert one_connection.get(f"/jobs/{job_id}").status_code == 200


@pytest.fixture
def no_line(settings: Settings, fake_queue: FakeQueue, auth_headers: dict[str, str]) -> Iterator[TestClient]:
    """An app that works on one request at a time and lets none wait."""
    with _client(settings, fake_queue, auth_headers, api_max_concurrency=1, api_max_queue=0) as client:
        yield client


def test_a_full_admission_line_is_503_but_probes_and_cancels_get_through(
    no_line: TestClient, sessions: sessionmaker[Session]
) -> None:
    job_id = insert_job(sessions)
    limiter: Limiter = app_state(no_line.app).limiter
    limiter.active = limiter.max_active  # every place taken, as by requests in flight
    try:
        _assert_busy(no_line.get(f"/jobs/{job_id}"), "HALFCAST_API_MAX_QUEUE")
        _assert_busy(no_line.post("/jobs", json={}), "server busy")
        assert no_line.get("/healthz").status_code == 200
        assert "server busy" not in no_line.get("/readyz").text
        assert no_line.post(f"/jobs/{job_id}/cancel").status_code == 202
    finally:
        limiter.active = 0
    assert no_line.get(f"/jobs/{job_id}").json()["status"] == "cancelled"
    assert 'halfcast_api_requests_shed_total{reason="queue_full"} 2.0' in no_line.get("/metrics").text


def test_a_request_that_waits_too_long_for_admission_is_503(
    settings: Settings, fake_queue: FakeQueue, auth_headers: dict[str, str], sessions: sessionmaker[Session]
) -> None:
    job_id = insert_job(sessions)
    with _client(settings, fake_queue, auth_headers, api_max_concurrency=1, api_queue_timeout_s=0.1) as client:
        limiter: Limiter = app_state(client.app).limiter
        limiter.active = 1
        try:
            _assert_busy(client.get(f"/jobs/{job_id}"), "HALFCAST_API_QUEUE_TIMEOUT_S")
            assert limiter.waiting == 0 and limiter.shed["timeout"] == 1
        finally:
            limiter.active = 0
        assert client.get(f"/jobs/{job_id}").status_code == 200 and limiter.active == 0


# ----------------------------------------------------------------------------- the limiter on its own


def test_limiter_hands_places_over_in_order_and_sheds_when_full_or_late() -> None:
    async def scenario() -> list[str]:
        limiter = Limiter(max_active=1, max_waiting=2, timeout_s=5.0)
        order: list[str] = []
        await limiter.acquire()

        async def wait(name: str) -> None:
            await limiter.acquire()
            order.append(name)

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(wait, "first")
            await anyio.sleep(0.01)
            tasks.start_soon(wait, "second")
            await anyio.sleep(0.01)
            with pytest.raises(Shed) as full:
                await limiter.acquire()
            assert full.value.reason == "queue_full" and limiter.waiting == 2
            limiter.release()  # to "first"
            await anyio.sleep(0.01)
            limiter.release()  # to "second"
        assert limiter.active == 1 and limiter.waiting == 0
        late = Limiter(max_active=1, max_waiting=1, timeout_s=0.05)
        await late.acquire()
        with pytest.raises(Shed) as timed_out:
            await late.acquire()
        assert timed_out.value.reason == "timeout" and late.waiting == 0 and late.active == 1
        return order

    assert anyio.run(scenario) == ["first", "second"]


def test_a_waiter_that_is_cancelled_leaves_the_line_and_passes_on_a_place_it_was_given() -> None:
    async def scenario() -> None:
        limiter = Limiter(max_active=1, max_waiting=4, timeout_s=5.0)
        await limiter.acquire()
        with anyio.move_on_after(0.02):
            await limiter.acquire()  # cancelled while waiting
        assert limiter.waiting == 0 and limiter.active == 1
        limiter.release()
        assert limiter.active == 0

    anyio.run(scenario)


def test_a_streaming_response_gives_its_place_back_when_it_starts() -> None:
    limiter = Limiter(max_active=1, max_waiting=0, timeout_s=1.0)
    seen: list[int] = []

    async def streaming_app(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        seen.append(limiter.active)  # the stream goes on without a place
        await send({"type": "http.response.body", "body": b"x", "more_body": False})

    async def scenario() -> None:
        sent: list[Message] = []

        async def send(message: Message) -> None:
            sent.append(message)

        async def receive() -> Message:
            return {"type": "http.request", "body": b""}

        scope = {"type": "http", "method": "GET", "path": "/jobs/x/events", "headers": []}
        await AdmissionMiddleware(streaming_app, limiter)(scope, receive, send)
        assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]

    anyio.run(scenario)
    assert seen == [0] and limiter.active == 0
