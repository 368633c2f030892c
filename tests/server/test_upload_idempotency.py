"""Issue 24 item 9: ``Idempotency-Key`` on ``POST /datasets`` and ``POST /models``, as on ``POST /jobs``.

A client that disconnected after sending the whole body had its upload stored without seeing the id,
and its retry stored a second copy. Runs on SQLite and PostgreSQL (``database_url``).
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from api_support import FakeQueue, make_token
from fastapi.testclient import TestClient
from registry_support import model_files, model_tar, registry_counts
from sqlalchemy.orm import Session, sessionmaker

from halfcast.core.settings import Settings
from server.app import create_app

ROWS = b'{"text": "one"}\n{"text": "two"}\n'
OTHER_ROWS = b'{"text": "three"}\n'


def _dataset(client: TestClient, body: bytes = ROWS, key: str | None = "k-1", **params: Any) -> Any:
    headers = {"content-type": "application/jsonl", **({"Idempotency-Key": key} if key else {})}
    return client.post("/datasets", params={"format": "text", **params}, content=body, headers=headers)


def _model(client: TestClient, body: bytes | None = None, key: str | None = "k-1", **params: Any) -> Any:
    headers = {"content-type": "application/x-tar", **({"Idempotency-Key": key} if key else {})}
    return client.post("/models", params=params, content=body or model_tar(), headers=headers)


UPLOADS = {
    "dataset": (_dataset, ROWS, OTHER_ROWS),
    "model": (_model, model_tar(), model_tar(model_files(None, **{"x.txt": b"x"}))),
}


@pytest.mark.parametrize("kind", sorted(UPLOADS))
def test_a_retry_with_the_key_answers_the_first_upload_and_stores_nothing(
    client: TestClient, sessions: sessionmaker[Session], kind: str
) -> None:
    post, body, _ = UPLOADS[kind]
    first = post(client, body)
    assert first.status_code == 201, first.text
    retried = post(client, body)
    assert retried.status_code == 200, retried.text
    assert retried.json() == first.json() and retried.headers["location"] == first.headers["location"]
    assert registry_counts(sessions) == ((1, 0) if kind == "dataset" else (0, 1))
    assert post(client, body, key="k-2").status_code == 201  # another key is another upload


@pytest.mark.parametrize("kind", sorted(UPLOADS))
def test_the_key_with_another_upload_is_a_422_at_the_header(
    client: TestClient, sessions: sessionmaker[Session], kind: str
) -> None:
    post, body, other = UPLOADS[kind]
    assert post(client, body).status_code == 201
    for answer in (post(client, other), post(client, body, name="renamed")):
        assert answer.status_code == 422, answer.text
        assert answer.json()["detail"][0]["loc"] == ["header", "Idempotency-Key"]
    assert registry_counts(sessions) == ((1, 0) if kind == "dataset" else (0, 1))


def test_a_retry_is_answered_even_at_the_storage_quota(
    settings: Settings, fake_queue: FakeQueue, auth_headers: dict[str, str], sessions: sessionmaker[Session]
) -> None:
    """The first upload took the owner to its quota: the retry stores nothing, so it is no 429."""
    app = create_app(settings.model_copy(update={"quota_max_storage_bytes": len(ROWS)}), fake_queue)
    with TestClient(app, headers=auth_headers) as client:
        first = _dataset(client)
        assert first.status_code == 201, first.text
        assert _dataset(client, key="k-2").status_code == 429
        retried = _dataset(client)
    assert (retried.status_code, retried.json()["id"]) == (200, first.json()["id"])


@pytest.mark.parametrize("kind", sorted(UPLOADS))
def test_concurrent_first_uploads_with_one_key_store_one(
    settings: Settings, fake_queue: FakeQueue, auth_headers: dict[str, str], sessions: sessionmaker[Session], kind: str
) -> None:
    post, body, _ = UPLOADS[kind]
    app = create_app(settings.model_copy(update={"max_concurrent_uploads_per_owner": 4}), fake_queue)
    with TestClient(app, headers=auth_headers) as client, ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda _: post(client, body), range(4)))
    assert sorted(a.status_code for a in answers) == [200, 200, 200, 201], [a.text for a in answers]
    assert len({a.json()["id"] for a in answers}) == 1
    assert registry_counts(sessions) == ((1, 0) if kind == "dataset" else (0, 1))


@pytest.fixture
def alice(database_url: str, settings: Settings, fake_queue: FakeQueue) -> Iterator[TestClient]:
    token = make_token(database_url, "alice")
    with TestClient(create_app(settings, fake_queue), headers={"Authorization": f"Bearer {token}"}) as test_client:
        yield test_client


def test_keys_are_per_owner(client: TestClient, alice: TestClient, sessions: sessionmaker[Session]) -> None:
    mine, theirs = _dataset(alice), _dataset(client)
    assert (mine.status_code, theirs.status_code) == (201, 201)
    assert mine.json()["id"] != theirs.json()["id"] and registry_counts(sessions) == (2, 0)
