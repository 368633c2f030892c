"""POST /jobs through the real CeleryJobQueue: Redis, the embedded filesystem broker, a dead broker."""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from api_support import VALID_SPEC
from fastapi.testclient import TestClient

from halfcast.core.broker.celery_app import RUN_JOB_TASK
from halfcast.core.settings import Settings
from server.app import create_app


def task_of(message: dict[str, Any]) -> tuple[str, list[Any]]:
    """``(task name, args)`` of a Celery protocol-2 message envelope."""
    body = json.loads(base64.b64decode(message["body"]))
    return message["headers"]["task"], body[0]


@pytest.fixture
def redis_queue(redis_url: str) -> Iterator[str]:
    """A unique queue name; its Redis keys are deleted afterwards."""
    name = f"halfcast-test-{uuid.uuid4().hex[:12]}"
    yield name
    client = redis.Redis.from_url(redis_url)
    client.delete(name, f"_kombu.binding.{name}")
    client.close()


@pytest.mark.redis
def test_job_id_reaches_redis(
    settings: Settings, redis_url: str, redis_queue: str, auth_headers: dict[str, str]
) -> None:
    settings.broker_url = redis_url
    settings.queue_name = redis_queue

    with TestClient(create_app(settings), headers=auth_headers) as client:
        response = client.post("/jobs", json=VALID_SPEC)

    assert response.status_code == 201, response.text
    raw = redis.Redis.from_url(redis_url).lrange(redis_queue, 0, -1)
    assert len(raw) == 1
    assert task_of(json.loads(raw[0])) == (RUN_JOB_TASK, [response.json()["id"]])


def test_job_id_reaches_the_filesystem_broker(settings: Settings, auth_headers: dict[str, str]) -> None:
    with TestClient(create_app(settings), headers=auth_headers) as client:
        response = client.post("/jobs", json=VALID_SPEC)

    assert response.status_code == 201, response.text
    files = list((settings.broker_dir / "in").glob(f"*.{settings.queue_name}.msg"))
    assert len(files) == 1
    assert task_of(json.loads(files[0].read_text())) == (RUN_JOB_TASK, [response.json()["id"]])


def test_unreachable_broker_fails_the_job_with_503(settings: Settings, auth_headers: dict[str, str]) -> None:
    settings.broker_url = "redis://127.0.0.1:1/0"

    with TestClient(create_app(settings), headers=auth_headers) as client:
        started = time.monotonic()
        response = client.post("/jobs", json=VALID_SPEC)
        elapsed = time.monotonic() - started
        job = client.get(f"/jobs/{response.json()['job_id']}").json()

    assert response.status_code == 503
    assert job["status"] == "failed"
    assert job["error"]["reason"] == "enqueue_failed"
    assert elapsed < 15
