"""Readiness probes: can this API reach its database (at the newest schema) and its broker?

Each probe returns ``None`` when healthy and raises ``ProbeFailed`` (or the client
library's error) with a short reason otherwise.
"""

from __future__ import annotations

import os

import redis
from alembic.runtime.migration import MigrationContext
from kombu import Connection
from sqlalchemy import Engine, text

from halfcast.core.db.migrate import head_revision
from halfcast.core.settings import Settings

#: Seconds a probe waits for a server before calling it down.
PROBE_TIMEOUT_S = 2.0


class ProbeFailed(RuntimeError):
    """A dependency answered, but not in a usable state."""


def check_database(engine: Engine) -> None:
    """``SELECT 1`` answers and the schema is at the newest migration."""
    with engine.connect() as conn:
        conn.execute(text("SELECT 1"))
        revision = MigrationContext.configure(conn).get_current_revision()
    if revision != head_revision():
        raise ProbeFailed(f"schema is at {revision}, expected {head_revision()} (run the migrations)")


def check_broker(settings: Settings) -> None:
    """Redis answers ``PING``; the filesystem broker's folder is writable; others connect."""
    url = settings.effective_broker_url
    if url.startswith(("redis://", "rediss://")):
        _ping_redis(url)
    elif url.startswith("filesystem://"):
        _check_folder(settings.broker_dir / "in")
    else:
        with Connection(url, connect_timeout=PROBE_TIMEOUT_S) as conn:
            conn.ensure_connection(max_retries=1, timeout=PROBE_TIMEOUT_S)


def _ping_redis(url: str) -> None:
    client = redis.Redis.from_url(url, socket_connect_timeout=PROBE_TIMEOUT_S, socket_timeout=PROBE_TIMEOUT_S)
    try:
        if not client.ping():
            raise ProbeFailed("redis did not answer PING")
    finally:
        client.close()


def _check_folder(folder: os.PathLike[str]) -> None:
    if not os.path.isdir(folder):
        raise ProbeFailed(f"broker folder {os.fspath(folder)} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ProbeFailed(f"broker folder {os.fspath(folder)} is not writable")
