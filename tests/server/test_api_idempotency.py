"""``Idempotency-Key`` on POST /jobs, and the attempts in the job resource: on SQLite and PostgreSQL."""

from __future__ import annotations

import copy
import threading
from datetime import datetime, timedelta
from typing import Any

import pytest
from api_support import VALID_SPEC, FakeQueue, count_rows, insert_job
from fastapi.testclient import TestClient
from sqlalchemy import insert, update
from sqlalchemy.orm import Session, sessionmaker

from halfcast.contracts.spec import JobSpec
from halfcast.core.db import jobs as repo
from halfcast.core.db.models import Attempt, Job, utcnow


def test_the_same_key_returns_the_same_job(
    client: TestClient, fake_queue: FakeQueue, sessions: sessionmaker[Session]
) -> None:
    first = client.post("/jobs", json=VALID_SPEC, headers={"Idempotency-Key": "order-17"})
    assert first.status_code == 201, first.text
    again = client.post("/jobs", json=VALID_SPEC, headers={"Idempotency-Key": "order-17"})
    assert again.status_code == 200, again.text
    assert again.json() == first.json() and again.headers["location"] == f"/jobs/{first.json()['id']}"
    assert count_rows(sessions) == 1 and fake_queue.sent == [first.json()["id"]]  # sent once
    other = client.post("/jobs", json=VALID_SPEC, headers={"Idempotency-Key": "order-18"})
    assert other.status_code == 201 and other.json()["id"] != first.json()["id"]
    assert client.post("/jobs", json=VALID_SPEC).status_code == 201  # no key: always a new job
    assert count_rows(sessions) == 3


def test_the_replay_shows_the_job_as_it_is_now(client: TestClient, sessions: sessionmaker[Session]) -> None:
    job = client.post("/jobs", json=VALID_SPEC, headers={"Idempotency-Key": "k"}).json()
    with sessions() as session:
        session.execute(update(Job).where(Job.id == job["id"]).values(status="cancelled"))
        session.commit()
    assert client.post("/jobs", json=VALID_SPEC, headers={"Idempotency-Key": "k"}).json()["status"] == "cancelled"


def test_an_equivalent_body_is_the_same_request(client: TestClient) -> None:
    """Bodies are compared as validated specs: key order and spelled-out defaults do not matter."""
    first = client.post("/jobs", json=VALID_SPEC, headers={"Idempotency-Key": "k"}).json()
    reordered = dict(reversed(list(VALID_SPEC.items())), precision="fp16", gpus=0)
    assert client.post("/jobs", json=reordered, headers={"Idempotency-Key": "k"}).json()["id"] == first["id"]


def test_the_same_key_with_another_spec_is_422(
    client: TestClient, fake_queue: FakeQueue, sessions: sessionmaker[Session]
) -> None:
    first = client.post("/jobs", json=VALID_SPEC, headers={"Idempotency-Key": "k"}).json()
    changed = copy.deepcopy(VALID_SPEC) | {"max_steps": 51}
    response = client.post("/jobs", json=changed, headers={"Idempotency-Key": "k"})
    assert response.status_code == 422
    [error] = response.json()["detail"]
    assert error["loc"] == ["header", "Idempotency-Key"] and first["id"] in error["msg"]
    assert count_rows(sessions) == 1 and fake_queue.sent == [first["id"]]


@pytest.mark.parametrize("key", ["", "x" * 256, "has space", "naïve"])
def test_a_malformed_key_is_422(client: TestClient, sessions: sessionmaker[Session], key: str) -> None:
    response = client.post("/jobs", json=VALID_SPEC, headers={b"Idempotency-Key": key.encode()})
    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["loc"] == ["header", "Idempotency-Key"]
    assert count_rows(sessions) == 0


def test_racing_requests_with_one_key_create_one_job(sessions: sessionmaker[Session]) -> None:
    """The unique index decides: every racer gets the one job, whichever INSERT won."""
    spec = JobSpec.model_validate(VALID_SPEC)
    barrier = threading.Barrier(8)
    results: list[tuple[str, bool]] = []
    errors: list[BaseException] = []

    def submit() -> None:
        try:
            with sessions() as session:
                barrier.wait()
                job, created = repo.create_job(session, spec, "race-key", owner="tester")
                results.append((job.id, created))
        except BaseException as exc:  # noqa: BLE001  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=submit) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    assert len({job_id for job_id, _ in results}) == 1 and len(results) == 8
    assert sum(created for _, created in results) == 1
    assert count_rows(sessions) == 1


def test_racing_http_requests_with_one_key_create_one_job(
    client: TestClient, fake_queue: FakeQueue, sessions: sessionmaker[Session]
) -> None:
    answers: list[Any] = []
    barrier = threading.Barrier(6)

    def post() -> None:
        barrier.wait()
        answers.append(client.post("/jobs", json=VALID_SPEC, headers={"Idempotency-Key": "http-race"}))

    threads = [threading.Thread(target=post) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(a.status_code for a in answers) == [200] * 5 + [201]
    assert len({a.json()["id"] for a in answers}) == 1
    assert count_rows(sessions) == 1 and len(fake_queue.sent) == 1


def test_the_resource_lists_every_attempt(client: TestClient, sessions: sessionmaker[Session]) -> None:
    job_id = insert_job(sessions, status="running")
    start = utcnow() - timedelta(minutes=5)
    with sessions() as session:
        session.execute(insert(Attempt), [
            {"job_id": job_id, "attempt": 3, "worker_id": "c/3", "started_at": start + timedelta(minutes=3),
             "resumed_from_step": 40},
            {"job_id": job_id, "attempt": 2, "worker_id": "b/2", "started_at": start + timedelta(minutes=2),
             "ended_at": start + timedelta(minutes=3), "status": "requeued", "reason": "worker_shutdown", "resumed_from_step": 0},
            {"job_id": job_id, "attempt": 1, "worker_id": "a/1", "started_at": start, "ended_at": start + timedelta(minutes=1),
             "status": "failed", "reason": "worker_lost"},
        ])  # fmt: skip  # a table, laid out by hand
        session.commit()
    job = client.get(f"/jobs/{job_id}").json()
    assert [
        (a["attempt"], a["worker_id"], a["status"], a["reason"], a["resumed_from_step"]) for a in job["attempts"]
    ] == [
        (1, "a/1", "failed", "worker_lost", None),
        (2, "b/2", "requeued", "worker_shutdown", 0),
        (3, "c/3", None, None, 40),
    ]
    assert job["attempts"][2]["ended_at"] is None
    assert datetime.fromisoformat(job["attempts"][0]["ended_at"]).utcoffset() == timedelta(0)
    assert client.get("/jobs").json()["jobs"][0]["attempts"] == job["attempts"]
    assert client.post("/jobs", json=VALID_SPEC).json()["attempts"] == []
