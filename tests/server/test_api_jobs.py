"""POST/GET /jobs, /jobs/{id}, cancel: on SQLite and PostgreSQL with a fake queue."""

from __future__ import annotations

import copy
from datetime import datetime
from typing import Any

import pytest
from api_support import VALID_SPEC, FakeQueue, count_rows, insert_job
from fastapi.testclient import TestClient
from sqlalchemy import CursorResult, update
from sqlalchemy.orm import Session, sessionmaker

from halfcast.core.db.models import Job


def spec_with(**changes: Any) -> dict[str, Any]:
    """``VALID_SPEC`` with top-level fields replaced (``None`` removes one)."""
    spec = copy.deepcopy(VALID_SPEC)
    for key, value in changes.items():
        if value is None:
            spec.pop(key, None)
        else:
            spec[key] = value
    return spec


def set_status(sessions: sessionmaker[Session], job_id: str, status: str) -> None:
    with sessions() as session:
        session.execute(update(Job).where(Job.id == job_id).values(status=status))
        session.commit()


# ----------------------------------------------------------------------------- create


def test_create_returns_201_location_and_resource(
    client: TestClient, fake_queue: FakeQueue, sessions: sessionmaker[Session]
) -> None:
    response = client.post("/jobs", json=VALID_SPEC)

    assert response.status_code == 201, response.text
    job = response.json()
    assert response.headers["location"] == f"/jobs/{job['id']}"
    assert set(job) >= {
        "id",
        "name",
        "status",
        "spec",
        "created_at",
        "started_at",
        "finished_at",
        "error",
        "step",
        "max_steps",
        "world_size",
        "latest",
        "eval",
    }
    assert job["status"] == "queued"
    assert job["name"] == "digits-fp16"
    assert job["spec"]["loss_scale"]["init_scale"] == 16777216
    assert (job["step"], job["max_steps"], job["world_size"]) == (0, 50, 1)
    assert job["latest"] is None and job["eval"] is None and job["error"] is None
    assert job["started_at"] is None and job["finished_at"] is None
    assert datetime.fromisoformat(job["created_at"]).utcoffset() is not None
    assert fake_queue.sent == [job["id"]]
    assert count_rows(sessions) == 1
    assert client.get(response.headers["location"]).json() == job


def test_world_size_comes_from_processes(client: TestClient) -> None:
    job = client.post("/jobs", json=spec_with(processes=2, global_batch_size=128)).json()

    assert job["world_size"] == 2
    assert job["spec"]["global_batch_size"] == 128


def test_job_is_committed_before_it_is_enqueued(
    client: TestClient, fake_queue: FakeQueue, sessions: sessionmaker[Session]
) -> None:
    seen: list[str | None] = []

    def look(job_id: str) -> None:  # another connection, as a worker would see it
        with sessions() as session:
            job = session.get(Job, job_id)
            seen.append(job.status if job else None)

    fake_queue.on_enqueue = look
    response = client.post("/jobs", json=VALID_SPEC)

    assert response.status_code == 201
    assert seen == ["queued"]


INVALID_SPECS: list[tuple[str, dict[str, Any], list[str | int]]] = [
    ("unknown top-level field", spec_with(colour="red"), ["body", "colour"]),
    ("unknown model name", spec_with(model={"name": "resnet9000"}), ["body", "model"]),
    ("unknown dataset name", spec_with(dataset={"name": "imagenet"}), ["body", "dataset"]),
    (
        "unknown model config field",
        spec_with(model={"name": "mlp", "config": {"layers": 3}}),
        ["body", "model", "mlp", "config", "layers"],
    ),
    (
        "bad model config value",
        spec_with(model={"name": "mlp", "config": {"hidden_sizes": [0]}}),
        ["body", "model", "mlp", "config", "hidden_sizes", 0],
    ),
    ("model cannot take dataset", spec_with(model={"name": "gpt"}), ["body", "dataset"]),
    ("global batch not divisible", spec_with(global_batch_size=100, processes=2), ["body", "global_batch_size"]),
    ("negative max_steps", spec_with(max_steps=-5), ["body", "max_steps"]),
    ("absurd max_steps", spec_with(max_steps=10**12), ["body", "max_steps"]),
    ("zero micro_batch_size", spec_with(micro_batch_size=0), ["body", "micro_batch_size"]),
    ("loss_scale on bf16", spec_with(precision="bf16"), ["body", "loss_scale"]),
    ("fp8 without GPUs", spec_with(precision="fp8", loss_scale=None, gpus=0), ["body", "precision"]),
    ("faults without allow_faults", spec_with(faults={"nonfinite_grad_steps": [1]}), ["body", "faults"]),
    ("negative lr", spec_with(optimizer={"name": "sgd", "lr": -1.0}), ["body", "optimizer", "lr"]),
    ("string for an int", spec_with(max_steps="lots"), ["body", "max_steps"]),
    ("zero nodes", spec_with(nodes=0), ["body", "nodes"]),
    (
        "gang timeout on one node",
        spec_with(distributed={"gang_timeout_s": 30}),
        ["body", "distributed", "gang_timeout_s"],
    ),
    (
        "zero process group timeout",
        spec_with(nodes=2, distributed={"timeout_s": 0}),
        ["body", "distributed", "timeout_s"],
    ),
]


@pytest.mark.parametrize(("spec", "loc"), [case[1:] for case in INVALID_SPECS], ids=[case[0] for case in INVALID_SPECS])
def test_invalid_spec_is_422_naming_the_field_and_stores_nothing(
    client: TestClient,
    fake_queue: FakeQueue,
    sessions: sessionmaker[Session],
    spec: dict[str, Any],
    loc: list[str | int],
) -> None:
    response = client.post("/jobs", json=spec)

    assert response.status_code == 422, response.text
    locs = [error["loc"] for error in response.json()["detail"]]
    assert loc in locs, locs
    assert all(error["msg"] for error in response.json()["detail"])
    assert count_rows(sessions) == 0
    assert fake_queue.sent == []


@pytest.mark.parametrize("body", [b"{not json", b"[]", b""], ids=["malformed", "array", "empty"])
def test_non_object_body_is_422(client: TestClient, sessions: sessionmaker[Session], body: bytes) -> None:
    response = client.post("/jobs", content=body, headers={"content-type": "application/json"})

    assert response.status_code == 422
    assert count_rows(sessions) == 0


def test_faults_are_accepted_when_the_server_allows_them(
    settings: Any, fake_queue: FakeQueue, auth_headers: dict[str, str]
) -> None:
    from server.app import create_app

    settings.allow_faults = True
    with TestClient(create_app(settings, fake_queue), headers=auth_headers) as client:
        response = client.post("/jobs", json=spec_with(faults={"nonfinite_grad_steps": [1, 2]}))

    assert response.status_code == 201, response.text
    assert response.json()["spec"]["faults"]["nonfinite_grad_steps"] == [1, 2]


def test_body_over_one_mib_is_413(client: TestClient, sessions: sessionmaker[Session]) -> None:
    big = spec_with(name="x" * 100, padding="y" * (1 << 20))

    response = client.post("/jobs", json=big)

    assert response.status_code == 413
    assert "detail" in response.json()
    assert count_rows(sessions) == 0


def test_chunked_body_over_one_mib_is_413(client: TestClient, sessions: sessionmaker[Session]) -> None:
    def chunks() -> Any:
        yield b'{"name": "'
        for _ in range(17):
            yield b"z" * 65536
        yield b'"}'

    response = client.post("/jobs", content=chunks(), headers={"content-type": "application/json"})

    assert response.status_code == 413
    assert count_rows(sessions) == 0


# ----------------------------------------------------------------------------- enqueue failure


def test_enqueue_failure_marks_job_failed_and_answers_503(
    client: TestClient, fake_queue: FakeQueue, sessions: sessionmaker[Session]
) -> None:
    fake_queue.error = ConnectionError("broker is down")

    response = client.post("/jobs", json=VALID_SPEC)

    assert response.status_code == 503
    body = response.json()
    assert "broker is down" in body["detail"]
    job = client.get(f"/jobs/{body['job_id']}").json()
    assert job["status"] == "failed"
    assert job["error"]["reason"] == "enqueue_failed"
    assert "broker is down" in job["error"]["message"]
    assert job["finished_at"] is not None
    assert count_rows(sessions) == 1


def test_enqueue_failure_keeps_a_job_a_worker_already_took(
    client: TestClient, fake_queue: FakeQueue, sessions: sessionmaker[Session]
) -> None:
    """The publish errored after the message got through: the job is running, not failed."""
    fake_queue.on_enqueue = lambda job_id: set_status(sessions, job_id, "running")
    fake_queue.error = TimeoutError("confirm lost")

    response = client.post("/jobs", json=VALID_SPEC)

    assert response.status_code == 201
    assert response.json()["status"] == "running"
    assert response.json()["error"] is None


# ----------------------------------------------------------------------------- read


def test_unknown_job_is_404_json(client: TestClient) -> None:
    for path in ("/jobs/nope", "/jobs/nope/metrics"):
        response = client.get(path)
        assert response.status_code == 404
        assert response.json()["detail"] == "job nope not found"
    assert client.post("/jobs/nope/cancel").status_code == 404


def test_resource_reports_error_and_timestamps(client: TestClient, sessions: sessionmaker[Session]) -> None:
    job_id = insert_job(sessions, status="running", latest={"step": 7, "loss": 0.25, "loss_scale": 512.0})
    with sessions() as session:
        session.execute(
            update(Job)
            .where(Job.id == job_id)
            .values(status="failed", error_reason="rank_failed", error_message="boom")
        )
        session.commit()

    job = client.get(f"/jobs/{job_id}").json()

    assert job["error"] == {"reason": "rank_failed", "message": "boom"}
    assert job["step"] == 7
    assert job["latest"]["loss_scale"] == 512.0
    assert job["created_at"].startswith("2030-01-01T00:00:00")
    offset = datetime.fromisoformat(job["created_at"]).utcoffset()
    assert offset is not None and offset.total_seconds() == 0


# ----------------------------------------------------------------------------- list


def test_list_is_newest_first(client: TestClient, sessions: sessionmaker[Session]) -> None:
    ids = [insert_job(sessions, seconds=s) for s in (1, 3, 2)]

    listed = [job["id"] for job in client.get("/jobs").json()["jobs"]]

    assert listed == [ids[1], ids[2], ids[0]]


def test_list_filters_by_status(client: TestClient, sessions: sessionmaker[Session]) -> None:
    running = insert_job(sessions, status="running", seconds=1)
    insert_job(sessions, status="queued", seconds=2)
    also_running = insert_job(sessions, status="running", seconds=3)

    body = client.get("/jobs", params={"status": "running"}).json()

    assert [job["id"] for job in body["jobs"]] == [also_running, running]
    assert client.get("/jobs", params={"status": "succeeded"}).json() == {"jobs": [], "next_cursor": None}


@pytest.mark.parametrize(
    ("params", "loc"),
    [
        ({"status": "exploded"}, ["query", "status"]),
        ({"limit": 0}, ["query", "limit"]),
        ({"limit": 1001}, ["query", "limit"]),
        ({"cursor": "not-a-cursor"}, ["query", "cursor"]),
    ],
    ids=["bad status", "limit 0", "limit 1001", "bad cursor"],
)
def test_list_rejects_bad_parameters(client: TestClient, params: dict[str, Any], loc: list[str]) -> None:
    response = client.get("/jobs", params=params)

    assert response.status_code == 422
    assert [error["loc"] for error in response.json()["detail"]] == [loc]


def test_list_limit_and_cursor_walk_every_job_once(client: TestClient, sessions: sessionmaker[Session]) -> None:
    # seven jobs, three of them created in the same microsecond (the id breaks the tie)
    ids = [insert_job(sessions, seconds=s) for s in (1, 2, 2, 2, 3, 4, 5)]
    expected = [ids[6], ids[5], ids[4], *sorted(ids[1:4], reverse=True), ids[0]]

    seen: list[str] = []
    cursor: str | None = None
    pages = 0
    for _ in range(10):
        params: dict[str, Any] = {"limit": 2} | ({"cursor": cursor} if cursor else {})
        body = client.get("/jobs", params=params).json()
        assert len(body["jobs"]) <= 2
        seen += [job["id"] for job in body["jobs"]]
        pages += 1
        cursor = body["next_cursor"]
        if cursor is None:
            break

    assert seen == expected
    assert pages == 4


def test_exactly_full_last_page_has_no_cursor(client: TestClient, sessions: sessionmaker[Session]) -> None:
    ids = [insert_job(sessions, seconds=s) for s in (1, 2, 3, 4)]

    first = client.get("/jobs", params={"limit": 2}).json()
    second = client.get("/jobs", params={"limit": 2, "cursor": first["next_cursor"]}).json()
    whole = client.get("/jobs", params={"limit": 4}).json()

    assert [job["id"] for job in second["jobs"]] == [ids[1], ids[0]]
    assert second["next_cursor"] is None
    assert len(whole["jobs"]) == 4 and whole["next_cursor"] is None


def test_list_cursor_combines_with_status_filter(client: TestClient, sessions: sessionmaker[Session]) -> None:
    queued = [insert_job(sessions, status="queued", seconds=s) for s in (1, 3, 5)]
    insert_job(sessions, status="running", seconds=4)

    first = client.get("/jobs", params={"status": "queued", "limit": 2}).json()
    second = client.get("/jobs", params={"status": "queued", "limit": 2, "cursor": first["next_cursor"]}).json()

    assert [job["id"] for job in first["jobs"]] == [queued[2], queued[1]]
    assert [job["id"] for job in second["jobs"]] == [queued[0]]
    assert second["next_cursor"] is None


def test_list_default_limit_is_50(client: TestClient, sessions: sessionmaker[Session]) -> None:
    for second in range(51):
        insert_job(sessions, seconds=second)

    body = client.get("/jobs").json()

    assert len(body["jobs"]) == 50
    assert body["next_cursor"] is not None


# ----------------------------------------------------------------------------- cancel


def test_cancel_queued_job_cancels_it_at_once(client: TestClient, fake_queue: FakeQueue) -> None:
    job_id = client.post("/jobs", json=VALID_SPEC).json()["id"]

    response = client.post(f"/jobs/{job_id}/cancel")

    assert response.status_code == 202
    job = response.json()
    assert job["status"] == "cancelled"
    assert job["finished_at"] is not None
    assert client.get(f"/jobs/{job_id}").json()["status"] == "cancelled"


@pytest.mark.parametrize("status", ["starting", "running"])
def test_cancel_live_job_asks_the_worker(client: TestClient, sessions: sessionmaker[Session], status: str) -> None:
    job_id = insert_job(sessions, status=status)

    response = client.post(f"/jobs/{job_id}/cancel")

    assert response.status_code == 202
    assert response.json()["status"] == "cancelling"
    assert response.json()["finished_at"] is None
    with sessions() as session:
        job = session.get(Job, job_id)
        assert job is not None and job.cancel_requested_at is not None


def test_cancel_twice_while_cancelling_is_accepted(client: TestClient, sessions: sessionmaker[Session]) -> None:
    job_id = insert_job(sessions, status="running")

    client.post(f"/jobs/{job_id}/cancel")
    again = client.post(f"/jobs/{job_id}/cancel")

    assert again.status_code == 202
    assert again.json()["status"] == "cancelling"


@pytest.mark.parametrize("status", ["succeeded", "failed", "cancelled"])
def test_cancel_terminal_job_is_409(client: TestClient, sessions: sessionmaker[Session], status: str) -> None:
    job_id = insert_job(sessions, status=status)

    response = client.post(f"/jobs/{job_id}/cancel")

    assert response.status_code == 409
    assert response.json() == {"detail": f"job {job_id} is already {status}", "job_id": job_id}
    assert client.get(f"/jobs/{job_id}").json()["status"] == status


def test_worker_claim_fails_after_a_queued_job_is_cancelled(
    client: TestClient, sessions: sessionmaker[Session]
) -> None:
    """The worker claims with ``UPDATE ... WHERE status = 'queued'``: nothing to claim after a cancel."""
    job_id = client.post("/jobs", json=VALID_SPEC).json()["id"]
    client.post(f"/jobs/{job_id}/cancel")

    with sessions() as session:
        result = session.execute(update(Job).where(Job.id == job_id, Job.status == "queued").values(status="starting"))
        assert isinstance(result, CursorResult)  # an UPDATE's result counts its rows
        claimed = result.rowcount
        session.commit()

    assert claimed == 0
