"""A replayed ``Idempotency-Key`` whose job the broker refused (``failed``/``enqueue_failed``, never claimed) is sent again.

On SQLite and PostgreSQL, with the in-memory queue failing and then working.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from api_support import VALID_SPEC, FakeQueue, app_state, count_rows
from fastapi.testclient import TestClient
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from halfcast.core.db.models import AuditEvent, Job

KEY = {"Idempotency-Key": "order-1"}


def events(sessions: sessionmaker[Session], action: str) -> list[AuditEvent]:
    with sessions() as session:
        return list(session.scalars(select(AuditEvent).where(AuditEvent.action == action).order_by(AuditEvent.id)))


def refused(client: TestClient, fake_queue: FakeQueue) -> dict[str, Any]:
    """POST with :data:`KEY` while the broker is down: 503, the job stored ``failed``/``enqueue_failed``."""
    fake_queue.error = ConnectionError("broker down")
    response = client.post("/jobs", json=VALID_SPEC, headers=KEY)
    assert response.status_code == 503 and response.headers["retry-after"] == "5", response.text
    job: dict[str, Any] = client.get(f"/jobs/{response.json()['job_id']}").json()
    assert (job["status"], job["error"]["reason"], job["attempt"]) == ("failed", "enqueue_failed", 0)
    return job


def test_a_replay_after_the_broker_came_back_sends_the_job(
    client: TestClient, fake_queue: FakeQueue, sessions: sessionmaker[Session]
) -> None:
    job = refused(client, fake_queue)
    still_down = client.post("/jobs", json=VALID_SPEC, headers=KEY)
    assert still_down.status_code == 503 and still_down.json()["job_id"] == job["id"]
    assert client.get(f"/jobs/{job['id']}").json()["error"]["reason"] == "enqueue_failed"  # failed again
    fake_queue.error = None

    replay = client.post("/jobs", json=VALID_SPEC, headers=KEY)

    assert replay.status_code == 200, replay.text
    body = replay.json()
    assert (body["id"], body["status"], body["error"], body["finished_at"]) == (job["id"], "queued", None, None)
    assert replay.headers["location"] == f"/jobs/{job['id']}"
    assert fake_queue.sent == [job["id"]] and count_rows(sessions) == 1
    requeues = events(sessions, "job.requeue")
    assert [(e.subject, e.actor, e.details) for e in requeues] == [
        (job["id"], "tester", {"owner": "tester", "reason": "enqueue_failed"})
    ] * 2
    again = client.post("/jobs", json=VALID_SPEC, headers=KEY)  # a plain replay now: nothing sent
    assert again.status_code == 200 and again.json()["status"] == "queued" and fake_queue.sent == [job["id"]]


@pytest.mark.parametrize("change", [{"attempt": 1}, {"error_reason": "worker_lost"}])
def test_other_failed_jobs_are_only_shown(
    client: TestClient, fake_queue: FakeQueue, sessions: sessionmaker[Session], change: dict[str, Any]
) -> None:
    job = refused(client, fake_queue)
    with sessions() as session:
        session.execute(update(Job).where(Job.id == job["id"]).values(**change))
        session.commit()
    fake_queue.error = None

    replay = client.post("/jobs", json=VALID_SPEC, headers=KEY)

    assert replay.status_code == 200 and replay.json()["status"] == "failed"
    assert fake_queue.sent == [] and events(sessions, "job.requeue") == []


def test_the_requeue_counts_against_the_quota(
    client: TestClient, fake_queue: FakeQueue, sessions: sessionmaker[Session]
) -> None:
    app_state(client.app).settings.quota_max_queued_jobs = 1
    job = refused(client, fake_queue)
    fake_queue.error = None
    assert client.post("/jobs", json=VALID_SPEC, headers={"Idempotency-Key": "order-2"}).status_code == 201

    replay = client.post("/jobs", json=VALID_SPEC, headers=KEY)

    assert replay.status_code == 429 and replay.json()["limit"] == "max_queued_jobs"
    assert client.get(f"/jobs/{job['id']}").json()["status"] == "failed"
    assert job["id"] not in fake_queue.sent and events(sessions, "job.requeue") == []


def test_racing_replays_send_the_job_once(
    client: TestClient, fake_queue: FakeQueue, sessions: sessionmaker[Session]
) -> None:
    """Even at a quota of one queued job, the replays that lose the race see the requeued job (200), not a 429."""
    app_state(client.app).settings.quota_max_queued_jobs = 1
    job = refused(client, fake_queue)
    fake_queue.error = None
    barrier = threading.Barrier(6)
    codes: list[int] = []

    def replay() -> None:
        barrier.wait()
        codes.append(client.post("/jobs", json=VALID_SPEC, headers=KEY).status_code)

    threads = [threading.Thread(target=replay) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    assert codes == [200] * 6
    assert fake_queue.sent == [job["id"]] and len(events(sessions, "job.requeue")) == 1
