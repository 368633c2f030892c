"""Issue 24 item 1: every reference a spec holds resolves only to what the submitting owner may read.

``resume_from`` names a job (``<job id>`` or ``<job id>/<path in its run directory>``): another
owner's job is a 422 at ``body.resume_from`` worded exactly as for a missing one; a server path
(absolute, or climbing with ``..``) is a 422 before any lookup. An admin may name any owner's job
(docs/api.md). Runs on SQLite and PostgreSQL (``database_url``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from api_support import VALID_SPEC, FakeQueue, count_rows, insert_job, make_token
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from halfcast.core.settings import Settings
from server.app import create_app


def _client(settings: Settings, fake_queue: FakeQueue, token: str) -> Iterator[TestClient]:
    with TestClient(create_app(settings, fake_queue), headers={"Authorization": f"Bearer {token}"}) as client:
        yield client


@pytest.fixture
def alice(database_url: str, settings: Settings, fake_queue: FakeQueue) -> Iterator[TestClient]:
    yield from _client(settings, fake_queue, make_token(database_url, "alice"))


@pytest.fixture
def bob(database_url: str, settings: Settings, fake_queue: FakeQueue) -> Iterator[TestClient]:
    yield from _client(settings, fake_queue, make_token(database_url, "bob"))


def _resuming(resume_from: str) -> dict[str, Any]:
    return {**VALID_SPEC, "resume_from": resume_from}


def _error_at_resume_from(response: Any) -> dict[str, Any]:
    assert response.status_code == 422, response.text
    (error,) = response.json()["detail"]
    assert error["loc"] == ["body", "resume_from"], error
    return dict(error)


def test_another_owners_job_is_refused_exactly_as_a_missing_one(
    alice: TestClient, bob: TestClient, sessions: sessionmaker[Session]
) -> None:
    """The attack: bob names alice's job (by id and by a path into its run directory)."""
    alices = insert_job(sessions, status="succeeded", owner="alice")
    missing = "00000000-0000-4000-8000-000000000000"
    stolen = [
        _error_at_resume_from(bob.post("/jobs", json=_resuming(ref)))
        for ref in (alices, f"{alices}/attempt-1/checkpoints/final.pt")
    ]
    absent = _error_at_resume_from(bob.post("/jobs", json=_resuming(missing)))
    assert {error["msg"].replace(alices, "ID") for error in stolen} == {absent["msg"].replace(missing, "ID")}
    assert count_rows(sessions) == 1


def test_the_owner_and_an_admin_may_resume_from_the_job(
    alice: TestClient, client: TestClient, sessions: sessionmaker[Session]
) -> None:
    alices = insert_job(sessions, status="succeeded", owner="alice")
    assert alice.post("/jobs", json=_resuming(alices)).status_code == 201
    assert alice.post("/jobs", json=_resuming(f"{alices}/attempt-1/checkpoints/final.pt")).status_code == 201
    assert client.post("/jobs", json=_resuming(alices)).status_code == 201  # the admin token of ``client``


@pytest.mark.parametrize(
    "resume_from",
    ["/etc/passwd", "../../../../etc/passwd", "JOB/../../etc/passwd", "JOB/./x.pt", "JOB//x.pt", "JOB\\..\\x", "JOB/"],
)
def test_a_server_path_is_refused_at_submission(
    alice: TestClient, sessions: sessionmaker[Session], resume_from: str
) -> None:
    alices = insert_job(sessions, status="succeeded", owner="alice")
    error = _error_at_resume_from(alice.post("/jobs", json=_resuming(resume_from.replace("JOB", alices))))
    assert "job id" in error["msg"]
    assert count_rows(sessions) == 1


def test_a_job_from_before_authentication_is_only_an_admins_to_resume(
    alice: TestClient, client: TestClient, sessions: sessionmaker[Session]
) -> None:
    ownerless = insert_job(sessions, status="succeeded", owner=None)
    _error_at_resume_from(alice.post("/jobs", json=_resuming(ownerless)))
    assert client.post("/jobs", json=_resuming(ownerless)).status_code == 201
