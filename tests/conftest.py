"""Shared fixtures: isolated settings, and a fresh PostgreSQL database per test session; the suite's order.

Modules run longest first, each module's tests together: on several xdist workers (``make test``,
``--dist loadscope --no-loadscope-reorder``) the long ones start at once while the short ones fill
the gaps, instead of one long module ending the run alone. A module's length is what a measured
run recorded (``tests/module_durations.json``, written by ``tests/module_durations.py``; the ordering
is ``tests/suite_order.py``); a module not in it counts by its markers (``e2e`` long, ``slow`` less so).

PostgreSQL and Redis are the real servers on this machine (``HALFCAST_TEST_POSTGRES_URL``,
``HALFCAST_TEST_REDIS_URL``); tests marked ``postgres``/``redis`` are skipped when
they do not answer, unless ``HALFCAST_REQUIRE_SERVICES=1`` (CI) turns that into a failure.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import pytest
from database_support import fresh_database
from parallel_support import redis_database, worker_index
from suite_order import order_longest_first

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


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Longest modules first (see the module docstring and ``tests/suite_order.py``)."""
    order_longest_first(items)


@pytest.fixture(scope="session")
def postgres_admin_url() -> str:
    """URL of the PostgreSQL server's admin database (where test databases are created)."""
    _need(POSTGRES_ADMIN_URL, 5432, "PostgreSQL")
    return POSTGRES_ADMIN_URL


@pytest.fixture(scope="session")
def postgres_url(postgres_admin_url: str) -> Iterator[str]:
    """URL of a fresh, empty PostgreSQL database, dropped after the session (e2e modules get one each)."""
    yield from fresh_database(postgres_admin_url)


@pytest.fixture(scope="session")
def redis_url() -> str:
    """URL of the Redis server, on this xdist worker's own database index (queue names are per test too)."""
    _need(REDIS_URL, 6379, "Redis")
    return redis_database(REDIS_URL, worker_index())


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    """An empty data directory for one test."""
    path = tmp_path / "halfcast-data"
    path.mkdir()
    return path
