"""GET /jobs/{id}/metrics: step records in step order, paged by after_step/limit."""

from __future__ import annotations

from typing import Any

import pytest
from api_support import insert_job, insert_steps
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker


def test_records_come_in_step_order_with_every_field(client: TestClient, sessions: sessionmaker[Session]) -> None:
    job_id = insert_job(sessions, status="running")
    insert_steps(sessions, job_id, range(5, 0, -1))  # inserted newest first

    body = client.get(f"/jobs/{job_id}/metrics").json()

    assert body["job_id"] == job_id
    assert [point["step"] for point in body["points"]] == [1, 2, 3, 4, 5]
    third = body["points"][2]
    assert third["overflow"] is True and third["grad_norm"] is None and third["skipped_steps"] == 1
    assert set(third) >= {
        "step",
        "time",
        "loss",
        "loss_scale",
        "overflow",
        "skipped_steps",
        "grad_norm",
        "lr",
        "samples_per_second",
        "tokens_per_second",
    }


def test_after_step_and_limit_page_through_every_record(client: TestClient, sessions: sessionmaker[Session]) -> None:
    job_id = insert_job(sessions, status="running")
    insert_steps(sessions, job_id, range(1, 24))

    steps: list[int] = []
    after = 0
    for _ in range(10):  # 5 full or partial pages, then an empty one
        points = client.get(f"/jobs/{job_id}/metrics", params={"after_step": after, "limit": 5}).json()["points"]
        assert len(points) <= 5
        if not points:
            break
        steps += [point["step"] for point in points]
        after = points[-1]["step"]

    assert steps == list(range(1, 24))
    assert client.get(f"/jobs/{job_id}/metrics", params={"after_step": 20}).json()["points"][0]["step"] == 21


def test_records_of_other_jobs_are_not_returned(client: TestClient, sessions: sessionmaker[Session]) -> None:
    mine = insert_job(sessions, status="running", seconds=1)
    other = insert_job(sessions, status="running", seconds=2)
    insert_steps(sessions, mine, range(1, 3))
    insert_steps(sessions, other, range(1, 6))

    points = client.get(f"/jobs/{mine}/metrics").json()["points"]

    assert [point["step"] for point in points] == [1, 2]


def test_default_limit_is_1000(client: TestClient, sessions: sessionmaker[Session]) -> None:
    job_id = insert_job(sessions, status="running")
    insert_steps(sessions, job_id, range(1, 1003))

    points = client.get(f"/jobs/{job_id}/metrics").json()["points"]

    assert len(points) == 1000
    assert points[-1]["step"] == 1000


def test_job_without_records_has_no_points(client: TestClient, sessions: sessionmaker[Session]) -> None:
    job_id = insert_job(sessions)

    assert client.get(f"/jobs/{job_id}/metrics").json() == {"job_id": job_id, "points": []}


@pytest.mark.parametrize(
    ("params", "loc"),
    [
        ({"after_step": -1}, ["query", "after_step"]),
        ({"limit": 0}, ["query", "limit"]),
        ({"limit": 10_001}, ["query", "limit"]),
    ],
)
def test_bad_paging_parameters_are_422(
    client: TestClient, sessions: sessionmaker[Session], params: dict[str, Any], loc: list[str]
) -> None:
    job_id = insert_job(sessions)

    response = client.get(f"/jobs/{job_id}/metrics", params=params)

    assert response.status_code == 422
    assert [error["loc"] for error in response.json()["detail"]] == [loc]


def test_step_and_time_come_from_the_columns_when_the_record_lacks_them(
    client: TestClient, sessions: sessionmaker[Session]
) -> None:
    from halfcast.core.db.models import StepRow

    job_id = insert_job(sessions, status="running")
    with sessions() as session:
        session.add(StepRow(job_id=job_id, step=4, time=1234.5, data={"loss": 0.5}))
        session.commit()

    points = client.get(f"/jobs/{job_id}/metrics").json()["points"]

    assert points == [{"loss": 0.5, "step": 4, "time": 1234.5}]
