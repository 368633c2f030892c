"""GET /workers (registry, live flag, running jobs) and the 422 for a GPU job no registered worker can hold."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from api_support import VALID_SPEC, FakeQueue, count_rows, insert_job
from fastapi.testclient import TestClient
from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from halfcast.core.db.models import Job, Worker, utcnow


def _worker(sessions: sessionmaker[Session], worker_id: str, gpus: list[int], age_s: float = 0.0) -> None:
    now = utcnow()
    with sessions() as session:
        session.add(
            Worker(
                id=worker_id,
                hostname=worker_id.split("/")[0],
                pid=7,
                gpus=gpus,
                concurrency=2,
                started_at=now - timedelta(hours=1),
                heartbeat_at=now - timedelta(seconds=age_s),
            )
        )
        session.commit()


def _owned_by(sessions: sessionmaker[Session], job_id: str, worker_id: str) -> None:
    with sessions() as session:
        session.execute(update(Job).where(Job.id == job_id).values(worker_id=worker_id))
        session.commit()


def test_workers_are_listed_with_gpus_liveness_and_running_jobs(
    client: TestClient, sessions: sessionmaker[Session]
) -> None:
    _worker(sessions, "gpu-host/1", [0, 1, 2, 3])
    _worker(sessions, "cpu-host/2", [], age_s=120)  # silent for 2 min: listed, not live
    _worker(sessions, "gone-host/3", [0], age_s=3600)  # past HALFCAST_WORKER_FORGET_S: not listed
    running = insert_job(sessions, status="running", seconds=1)
    cancelling = insert_job(sessions, status="cancelling", seconds=2)
    finished = insert_job(sessions, status="succeeded", seconds=3)
    for job_id in (running, cancelling, finished):
        _owned_by(sessions, job_id, "gpu-host/1")
    response = client.get("/workers")
    assert response.status_code == 200
    workers = {worker["id"]: worker for worker in response.json()["workers"]}
    assert list(workers) == ["cpu-host/2", "gpu-host/1"]
    gpu = workers["gpu-host/1"]
    assert (gpu["hostname"], gpu["pid"], gpu["gpus"], gpu["concurrency"], gpu["live"]) == (
        "gpu-host",
        7,
        [0, 1, 2, 3],
        2,
        True,
    )
    assert gpu["running_jobs"] == [running, cancelling]
    assert gpu["heartbeat_at"].endswith(("Z", "+00:00")) and gpu["started_at"] < gpu["heartbeat_at"]
    assert (workers["cpu-host/2"]["live"], workers["cpu-host/2"]["running_jobs"]) == (False, [])


def test_no_worker_registered_lists_nothing(client: TestClient) -> None:
    assert client.get("/workers").json() == {"workers": []}


def _post(client: TestClient, gpus: int, **headers: str) -> Any:
    return client.post("/jobs", json={**VALID_SPEC, "gpus": gpus}, headers=headers)


def test_a_gpu_job_larger_than_every_worker_is_rejected_naming_gpus(
    client: TestClient, sessions: sessionmaker[Session], fake_queue: FakeQueue
) -> None:
    _worker(sessions, "small/1", [0])
    _worker(sessions, "cpu/2", [])
    _worker(sessions, "gone/3", [0, 1, 2, 3, 4, 5, 6, 7], age_s=3600)  # forgotten: its GPUs do not count
    response = _post(client, 2)
    assert response.status_code == 422
    (error,) = response.json()["detail"]
    assert error["loc"] == ["body", "gpus"] and error["msg"] == "no worker has 2 GPUs (largest: 1)"
    assert count_rows(sessions) == 0 and fake_queue.sent == []  # nothing stored or sent
    assert _post(client, 1).status_code == 201
    assert _post(client, 0).status_code == 201  # CPU jobs are never rejected for this


def test_cpu_only_workers_reject_any_gpu_job_and_a_dead_but_remembered_worker_counts(
    client: TestClient, sessions: sessionmaker[Session]
) -> None:
    _worker(sessions, "cpu/1", [])
    assert _post(client, 1).json()["detail"][0]["msg"] == "no worker has 1 GPUs (largest: 0)"
    _worker(sessions, "restarting/2", [0, 1], age_s=120)  # not live, heard from lately: it will be back
    assert _post(client, 2).status_code == 201


def test_without_any_registered_worker_gpu_jobs_wait_in_the_queue(client: TestClient, fake_queue: FakeQueue) -> None:
    response = _post(client, 8)
    assert response.status_code == 201 and fake_queue.sent == [response.json()["id"]]


def test_a_repeated_idempotent_request_answers_with_its_job_even_if_capacity_shrank(
    client: TestClient, sessions: sessionmaker[Session]
) -> None:
    first = _post(client, 2, **{"Idempotency-Key": "gpu-job-1"})
    assert first.status_code == 201
    _worker(sessions, "small/1", [0])
    again = _post(client, 2, **{"Idempotency-Key": "gpu-job-1"})
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
    assert _post(client, 2, **{"Idempotency-Key": "gpu-job-2"}).status_code == 422


def test_the_job_resource_shows_each_attempts_gpus(client: TestClient, sessions: sessionmaker[Session]) -> None:
    from halfcast.core.db.models import Attempt

    job_id = insert_job(sessions, status="running")
    with sessions() as session:
        session.add(Attempt(job_id=job_id, attempt=1, worker_id="gpu-host/1", started_at=utcnow(), gpus=[2, 3]))
        session.commit()
    (attempt,) = client.get(f"/jobs/{job_id}").json()["attempts"]
    assert attempt["gpus"] == [2, 3]


def test_worker_heartbeats_are_prometheus_series(client: TestClient, sessions: sessionmaker[Session]) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    _worker(sessions, "gpu-host/1", [0, 1])
    _worker(sessions, "cpu-host/2", [], age_s=120)
    _worker(sessions, "gone-host/3", [0], age_s=3600)
    _owned_by(sessions, insert_job(sessions, status="running", seconds=1), "gpu-host/1")
    samples = {
        (s.name, s.labels["worker_id"]): s.value
        for family in text_string_to_metric_families(client.get("/metrics").text)
        for s in family.samples
        if s.name.startswith("halfcast_worker_")
    }
    assert samples[("halfcast_worker_up", "gpu-host/1")] == 1.0 and samples[("halfcast_worker_up", "cpu-host/2")] == 0.0
    assert samples[("halfcast_worker_gpus", "gpu-host/1")] == 2.0
    assert samples[("halfcast_worker_running_jobs", "gpu-host/1")] == 1.0
    heartbeats = {worker: value for (name, worker), value in samples.items() if name.endswith("timestamp_seconds")}
    assert set(heartbeats) == {"gpu-host/1", "cpu-host/2"} and heartbeats["gpu-host/1"] - heartbeats["cpu-host/2"] > 100
