"""Shared fixtures: isolated settings, and a fresh PostgreSQL database per test session.

PostgreSQL and Redis are the real servers on this machine (``HALFCAST_TEST_POSTGRES_URL``,
``HALFCAST_TEST_REDIS_URL``); tests marked ``postgres``/``redis`` are skipped when
they do not answer, unless ``HALFCAST_REQUIRE_SERVICES=1`` (CI) turns that into a failure.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import pytest

POSTGRES_ADMIN_URL = os.environ.get("HALFCAST_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("HALFCAST_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
REQUIRE_SERVICES = os.environ.get("HALFCAST_REQUIRE_SERVICES") == "1"


def _answers(url: str, default_port: int) -> bool:
    parsed = urlparse(url.replace("+psycopg", ""))
    try:
        with socket.create_connection((parsed.hostname or "127.0.0.1", parsed.port or default_port), timeout=1):
            return True
    except OSError:
        return False


def _need(url: str, port: int, what: str) -> None:
    if not _answers(url, port):
        if REQUIRE_SERVICES:
            pytest.fail(f"{what} at {url} does not answer (HALFCAST_REQUIRE_SERVICES=1)")
        pytest.skip(f"{what} at {url} does not answer")


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """URL of a fresh, empty PostgreSQL database, dropped after the session."""
    _need(POSTGRES_ADMIN_URL, 5432, "PostgreSQL")
    from sqlalchemy import create_engine, text

    name = f"halfcast_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    base = POSTGRES_ADMIN_URL.rsplit("/", 1)[0]
    try:
        yield f"{base}/{name}"
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(scope="session")
def redis_url() -> str:
    """URL of the Redis server (a fresh logical database is not needed: queues are per test)."""
    _need(REDIS_URL, 6379, "Redis")
    return REDIS_URL


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    """An empty data directory for one test."""
    path = tmp_path / "halfcast-data"
    path.mkdir()
    return path
