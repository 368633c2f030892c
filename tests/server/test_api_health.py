"""/healthz and /readyz: the database (at the newest schema) and the broker."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from api_support import VALID_SPEC, FakeQueue
from fastapi.testclient import TestClient

from halfcast.core.db.migrate import head_revision
from halfcast.core.settings import Settings
from server.app import create_app


def readyz(settings: Settings) -> tuple[int, dict[str, Any]]:
    with TestClient(create_app(settings)) as client:  # the real Celery queue creates the broker folders
        response = client.get("/readyz")
    return response.status_code, response.json()


def test_healthz_answers_without_dependencies(data_dir: Path) -> None:
    settings = Settings(data_dir=data_dir, database_url="postgresql+psycopg://nobody@127.0.0.1:1/none")

    with TestClient(create_app(settings, FakeQueue())) as client:
        response = client.get("/healthz")

    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


def test_ready_with_a_migrated_database_and_the_embedded_broker(settings: Settings) -> None:
    status, body = readyz(settings)

    assert status == 200, body
    assert body["checks"] == {"database": "ok", "broker": "ok"}


@pytest.mark.redis
def test_ready_with_redis(settings: Settings, redis_url: str) -> None:
    settings.broker_url = redis_url

    status, body = readyz(settings)

    assert status == 200, body


def test_not_ready_when_the_database_is_down(data_dir: Path) -> None:
    settings = Settings(data_dir=data_dir, database_url="postgresql+psycopg://nobody@127.0.0.1:1/none")

    status, body = readyz(settings)

    assert status == 503
    assert body["detail"] == "not ready: database down"
    assert body["checks"]["broker"] == "ok"


def test_not_ready_when_the_schema_is_not_migrated(data_dir: Path) -> None:
    settings = Settings(data_dir=data_dir)  # a fresh SQLite file: no migrations applied

    status, body = readyz(settings)

    assert status == 503
    assert body["detail"] == "not ready: database down"
    assert f"expected {head_revision()}" in body["checks"]["database"]


def test_not_ready_when_redis_is_down(settings: Settings) -> None:
    settings.broker_url = "redis://127.0.0.1:1/0"

    status, body = readyz(settings)

    assert status == 503
    assert body["detail"] == "not ready: broker down"
    assert body["checks"]["database"] == "ok"


def test_not_ready_when_the_broker_folder_is_gone(settings: Settings) -> None:
    with TestClient(create_app(settings)) as client:
        (settings.broker_dir / "in").rmdir()
        response = client.get("/readyz")

    assert response.status_code == 503
    assert response.json()["detail"] == "not ready: broker down"


def test_requests_get_503_json_while_the_database_is_down(data_dir: Path) -> None:
    settings = Settings(data_dir=data_dir, database_url="postgresql+psycopg://nobody@127.0.0.1:1/none")
    queue = FakeQueue()

    with TestClient(create_app(settings, queue)) as client:
        client.headers["Authorization"] = "Bearer hc_unverifiable"  # the token lookup itself needs the database
        responses = [client.get("/jobs"), client.post("/jobs", json=VALID_SPEC), client.get("/metrics")]

    assert [response.status_code for response in responses] == [503, 503, 503]
    assert all(response.json() == {"detail": "database unavailable"} for response in responses)
    assert queue.sent == []
