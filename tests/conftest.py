"""Shared fixtures: isolated settings, and a fresh PostgreSQL database per test session; the suite's order.

Modules run longest first, each module's tests together: on several xdist workers (``make test``,
``--dist loadscope --no-loadscope-reorder``) the long ones start at once while the short ones fill
the gaps, instead of one long module ending the run alone. A module's length is what a measured
run recorded (``tests/module_durations.json``, written by ``tests/module_durations.py``); a module
not in it counts by its markers (``e2e`` long, ``slow`` less so).

PostgreSQL and Redis are the real servers on this machine (``HALFCAST_TEST_POSTGRES_URL``,
``HALFCAST_TEST_REDIS_URL``); tests marked ``postgres``/``redis`` are skipped when
they do not answer, unless ``HALFCAST_REQUIRE_SERVICES=1`` (CI) turns that into a failure.
"""

from __future__ import annotations

import json
import os
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import pytest
from parallel_support import redis_database, worker_index

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


#: Seconds per module (file path) of a measured run: the order of a run, longest first.
MODULE_DURATIONS = Path(__file__).with_name("module_durations.json")
#: Seconds assumed for a module missing from that file, by the markers of its tests (else 0).
_UNMEASURED_S = {"e2e": 60.0, "slow": 20.0}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Longest modules first (see the module docstring); a stable sort, so each module keeps its own order."""
    measured: dict[str, float] = json.loads(MODULE_DURATIONS.read_text())
    weight: dict[str, float] = {}
    for item in items:
        module = _module(item)
        guess = max((_UNMEASURED_S.get(mark.name, 0.0) for mark in item.iter_markers()), default=0.0)
        weight[module] = measured.get(module, max(weight.get(module, 0.0), guess))
    items.sort(key=lambda item: -weight[_module(item)])


def _module(item: pytest.Item) -> str:
    """The test file of ``item`` (its node id up to the first ``::``)."""
    return item.nodeid.split("::", 1)[0]


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
    """URL of the Redis server, on this xdist worker's own database index (queue names are per test too)."""
    _need(REDIS_URL, 6379, "Redis")
    return redis_database(REDIS_URL, worker_index())


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    """An empty data directory for one test."""
    path = tmp_path / "halfcast-data"
    path.mkdir()
    return path
