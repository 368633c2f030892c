"""Fixtures for CLI tests against a live API on SQLite: import them into a test module.

``from cli_live_support import database_url_fixture, url_fixture  # noqa: F401``
(registered under their names, ``database_url`` and ``url``, so a test's parameter does not shadow the import): ``database_url``
overrides the backend parametrisation (the CLI's behaviour does not depend on the
database) and ``url`` serves the app on a free port, with ``HALFCAST_URL`` and an admin
``HALFCAST_TOKEN`` set for the CLI.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from api_support import FakeQueue
from live_server import LiveServer, sqlite_copy

from halfcast.core.settings import Settings
from server.app import create_app


@pytest.fixture(name="database_url")
def database_url_fixture(data_dir: Path, sqlite_template: Path) -> str:
    """SQLite only: the CLI's behaviour does not depend on the database."""
    return sqlite_copy(data_dir, sqlite_template)


@pytest.fixture(name="url")
def url_fixture(settings: Settings, monkeypatch: pytest.MonkeyPatch, admin_token: str) -> Iterator[str]:
    """A live API; ``HALFCAST_URL`` points at it and ``HALFCAST_TOKEN`` holds an admin token."""
    with LiveServer(create_app(settings, FakeQueue())) as live:
        monkeypatch.setenv("HALFCAST_URL", live.url)
        monkeypatch.setenv("HALFCAST_TOKEN", admin_token)
        yield live.url
