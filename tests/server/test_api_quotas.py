"""Per-owner quotas at POST /jobs: each limit, defaults vs overrides, replays, admins, and racing submissions.

Every test runs on SQLite and PostgreSQL (``database_url``). A refused submission is
``429 {"detail", "limit", "value"}`` with ``Retry-After`` and stores, audits and
sends nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from api_support import VALID_SPEC, FakeQueue, count_rows, insert_job, make_token
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from halfcast.core.db.models import AuditEvent
from halfcast.core.db.quotas import set_quota
from halfcast.core.settings import Settings
from halfcast.errors import QuotaExceeded, raise_for_status
from server.app import create_app
from server.quotas import QUOTA_RETRY_AFTER_S

Post = Callable[..., Any]


@pytest.fixture
def app_client(settings: Settings, fake_queue: FakeQueue) -> Iterator[Callable[..., TestClient]]:
    """Start the app with the given ``HALFCAST_QUOTA_*`` defaults (as keyword arguments) and return its client."""
    clients: list[TestClient] = []

    def start(**defaults: int) -> TestClient:
        for name, value in defaults.items():
            setattr(settings, f"quota_{name}", value)
        client = TestClient(create_app(settings, fake_queue))
        clients.append(client.__enter__())
        return client

    yield start
    for client in clients:
        client.__exit__(None, None, None)


def poster(client: TestClient, database_url: str, owner: str) -> Post:
    """``post(**spec_changes)``: POST /jobs as ``owner`` (a plain token) with :data:`VALID_SPEC` changed."""
    headers = {"Authorization": f"Bearer {make_token(database_url, owner)}"}

    def post(key: str | None = None, **changes: Any) -> Any:
        extra = {"Idempotency-Key": key} if key else {}
        return client.post("/jobs", json=VALID_SPEC | changes, headers=headers | extra)

    return post


def override(sessions: sessionmaker[Session], owner: str, **values: int | None) -> None:
    with sessions() as session:
        set_quota(session, owner, values, actor="cli:test")


def audited(sessions: sessionmaker[Session], action: str) -> int:
    with sessions() as session:
        return session.scalar(select(func.count()).select_from(AuditEvent).where(AuditEvent.action == action)) or 0


def assert_refused(response: Any, limit: str, value: int) -> None:
    assert response.status_code == 429, response.text
    body = response.json()
    assert (body["limit"], body["value"]) == (limit, value)
    assert limit in body["detail"] and response.headers["retry-after"] == str(QUOTA_RETRY_AFTER_S)


def test_max_queued_jobs(
    app_client: Callable[..., TestClient], database_url: str, sessions: sessionmaker[Session], fake_queue: FakeQueue
) -> None:
    post = poster(app_client(max_queued_jobs=2), database_url, "alice")
    insert_job(sessions, status="running", owner="alice")  # active but not queued
    insert_job(sessions, status="queued", owner="bob")  # another owner's
    assert [post().status_code for _ in range(2)] == [201, 201]

    assert_refused(post(), "max_queued_jobs", 2)

    assert count_rows(sessions) == 4 and len(fake_queue.sent) == 2 and audited(sessions, "job.create") == 2


def test_max_active_jobs_counts_every_status_not_yet_terminal(
    app_client: Callable[..., TestClient], database_url: str, sessions: sessionmaker[Session]
) -> None:
    post = poster(app_client(max_active_jobs=4), database_url, "alice")
    for status in ("starting", "running", "cancelling", "succeeded", "failed", "cancelled"):
        insert_job(sessions, status=status, owner="alice")
    assert post().status_code == 201

    assert_refused(post(), "max_active_jobs", 4)
    assert count_rows(sessions) == 7


def test_max_gpus_sums_the_gpus_of_jobs_not_yet_terminal(
    app_client: Callable[..., TestClient], database_url: str, sessions: sessionmaker[Session]
) -> None:
    post = poster(app_client(max_gpus=3), database_url, "alice")
    assert post(gpus=2).status_code == 201

    assert_refused(post(gpus=2), "max_gpus", 3)
    assert post(gpus=1).status_code == 201  # 3 of 3
    assert post().status_code == 201  # a CPU job uses no GPU
    override(sessions, "alice", max_gpus=2)  # now above the limit
    assert_refused(post(gpus=1), "max_gpus", 2)
    assert post().status_code == 201  # a CPU job is still accepted
    assert count_rows(sessions) == 4


def test_a_multi_node_job_counts_its_gpus_on_every_node(
    app_client: Callable[..., TestClient], database_url: str, sessions: sessionmaker[Session]
) -> None:
    post = poster(app_client(max_gpus=4), database_url, "alice")
    assert_refused(post(gpus=2, nodes=3), "max_gpus", 4)  # 6 GPUs over 3 hosts
    assert post(gpus=2, nodes=2).status_code == 201  # 4 of 4
    assert_refused(post(gpus=1), "max_gpus", 4)
    assert count_rows(sessions) == 1


def test_an_owner_override_beats_the_default_limit_by_limit(
    app_client: Callable[..., TestClient], database_url: str, sessions: sessionmaker[Session]
) -> None:
    client = app_client(max_queued_jobs=1, max_gpus=1)
    alice, bob = poster(client, database_url, "alice"), poster(client, database_url, "bob")
    override(sessions, "alice", max_queued_jobs=3)  # max_gpus stays the default

    assert bob().status_code == 201
    assert_refused(bob(), "max_queued_jobs", 1)
    assert [alice().status_code for _ in range(3)] == [201] * 3
    assert_refused(alice(), "max_queued_jobs", 3)
    override(sessions, "alice", max_queued_jobs=None, max_active_jobs=10)
    assert_refused(alice(), "max_queued_jobs", 1)  # back to the default
    override(sessions, "carol", max_queued_jobs=0)  # 0 stops an owner submitting at all
    assert_refused(poster(client, database_url, "carol")(), "max_queued_jobs", 0)


def test_an_idempotent_replay_is_not_counted(
    app_client: Callable[..., TestClient], database_url: str, sessions: sessionmaker[Session]
) -> None:
    post = poster(app_client(max_queued_jobs=1), database_url, "alice")
    first = post(key="k1")
    assert first.status_code == 201

    again = post(key="k1")

    assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
    assert_refused(post(key="k2"), "max_queued_jobs", 1)
    assert count_rows(sessions) == 1


def test_quotas_apply_to_admin_tokens_too(app_client: Callable[..., TestClient], database_url: str) -> None:
    client = app_client(max_active_jobs=1)
    headers = {"Authorization": f"Bearer {make_token(database_url, 'root', admin=True)}"}
    assert client.post("/jobs", json=VALID_SPEC, headers=headers).status_code == 201
    assert_refused(client.post("/jobs", json=VALID_SPEC, headers=headers), "max_active_jobs", 1)


def test_racing_submissions_accept_exactly_the_limit(
    app_client: Callable[..., TestClient], database_url: str, sessions: sessionmaker[Session], fake_queue: FakeQueue
) -> None:
    """12 requests of one owner at once with ``max_queued_jobs`` 5: exactly 5 stored, 7 refused."""
    post = poster(app_client(max_queued_jobs=5), database_url, "alice")
    barrier = threading.Barrier(12)
    codes: list[int] = []

    def submit() -> None:
        barrier.wait()
        codes.append(post().status_code)

    threads = [threading.Thread(target=submit) for _ in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)

    assert sorted(codes) == [201] * 5 + [429] * 7
    assert count_rows(sessions) == 5 and len(fake_queue.sent) == 5 and audited(sessions, "job.create") == 5


def test_the_429_is_declared_in_the_openapi_schema() -> None:
    operation = create_app(Settings()).openapi()["paths"]["/jobs"]["post"]
    declared = operation["responses"]["429"]
    assert "Retry-After" in declared["headers"]
    schema = declared["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]
    properties = create_app(Settings()).openapi()["components"]["schemas"][schema]["properties"]
    assert {"detail", "limit", "value"} <= set(properties)


def test_the_client_raises_quota_exceeded_with_the_limit(
    app_client: Callable[..., TestClient], database_url: str
) -> None:
    answer = poster(app_client(max_queued_jobs=0), database_url, "alice")()
    response = httpx.Response(answer.status_code, headers=answer.headers, content=answer.content)

    with pytest.raises(QuotaExceeded) as raised:
        raise_for_status(response)

    assert (raised.value.status_code, raised.value.limit, raised.value.value) == (429, "max_queued_jobs", 0)
    assert raised.value.retry_after == QUOTA_RETRY_AFTER_S and "max_queued_jobs" in str(raised.value)
