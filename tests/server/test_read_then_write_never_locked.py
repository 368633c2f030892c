"""C23 variant: an API or operator write that reads first never meets "database is locked" (phoenix#3949).

On SQLite (WAL), a transaction that has read and then writes fails at once with
``SQLITE_BUSY_SNAPSHOT`` ("database is locked", no busy wait) when another connection
committed in between, e.g. a worker storing a step record. These tests make that
interleaving certain instead of lucky: a function each operation calls between its
read and its write (``audit.utcnow``, ``tokens.generate_secret``) is wrapped so a
worker-like write from another connection is committed right then (in a thread, so an
operation that already holds the write lock simply makes it wait).

Operations: cancelling a job through the API (``POST /jobs/{id}/cancel``, then its
audit event), revoking a token, setting and clearing a quota (``halfcast tokens
revoke`` / ``halfcast quota set|clear``), and the first-token bootstrap of ``halfcast
up``. Both backends (``database_url``); PostgreSQL never had the problem and must keep working.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from api_support import insert_job
from fastapi.testclient import TestClient
from live_server import add_steps, step_record
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from halfcast.core.db import audit, tokens
from halfcast.core.db.models import ApiToken, AuditEvent, StepRow
from halfcast.core.db.quotas import clear_quota, set_quota
from halfcast.core.db.tokens import create_token, revoke_token
from halfcast.core.settings import Settings
from server.cli.bootstrap import ensure_first_token


class Interjection:
    """Commits one step record of ``job_id`` from another connection each time it is triggered."""

    def __init__(self, sessions: sessionmaker[Session], job_id: str) -> None:
        self.sessions = sessions
        self.job_id = job_id
        self.step = 0
        self.errors: list[str] = []
        self.threads: list[threading.Thread] = []

    def write(self) -> None:
        """Commit the next step record, waiting up to 1 s (a holder of the write lock makes it wait longer)."""
        self.step += 1
        record = step_record(self.step)

        def commit() -> None:
            try:
                add_steps(self.sessions, self.job_id, [record])
            except Exception as exc:  # noqa: BLE001  # the "worker" must not fail either
                self.errors.append(repr(exc))

        thread = threading.Thread(target=commit, daemon=True)
        thread.start()
        thread.join(timeout=1.0)
        self.threads.append(thread)

    def wrap(self, function: Callable[..., Any]) -> Callable[..., Any]:
        """``function`` preceded by a committed write from another connection."""

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            self.write()
            return function(*args, **kwargs)

        return wrapped

    def settle(self, sessions: sessionmaker[Session]) -> int:
        """Wait for every write; the number of step records the "worker" stored."""
        for thread in self.threads:
            thread.join(timeout=60)
        assert self.errors == []
        with sessions() as session:
            return session.scalar(select(func.count()).select_from(StepRow)) or 0


@pytest.fixture
def worker_writes(sessions: sessionmaker[Session]) -> Interjection:
    """A running job whose "worker" can be made to commit a step record at a chosen moment."""
    return Interjection(sessions, insert_job(sessions, status="running"))


def _audited(sessions: sessionmaker[Session], action: str) -> int:
    with sessions() as session:
        return session.scalar(select(func.count()).select_from(AuditEvent).where(AuditEvent.action == action)) or 0


def test_cancel_with_a_worker_write_between_its_read_and_its_audit(
    client: TestClient, sessions: sessionmaker[Session], worker_writes: Interjection, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(audit, "utcnow", worker_writes.wrap(audit.utcnow))
    response = client.post(f"/jobs/{worker_writes.job_id}/cancel")
    assert response.status_code == 202, response.text
    assert response.json()["status"] == "cancelling"
    again = client.post(f"/jobs/{worker_writes.job_id}/cancel")  # cancelling already: still accepted and audited
    assert again.status_code == 202, again.text
    assert worker_writes.settle(sessions) == 2 and _audited(sessions, "job.cancel") == 2


def test_token_revoke_with_a_worker_write_between_its_read_and_its_write(
    sessions: sessionmaker[Session], worker_writes: Interjection, monkeypatch: pytest.MonkeyPatch
) -> None:
    with sessions() as session:
        token_id = create_token(session, "someone", actor="cli:test").row.id
    monkeypatch.setattr(audit, "utcnow", worker_writes.wrap(audit.utcnow))
    with sessions() as session:
        assert revoke_token(session, token_id, actor="cli:test").revoked_at is not None
    assert worker_writes.settle(sessions) == 1 and _audited(sessions, "token.revoke") == 1


def test_quota_set_and_clear_with_a_worker_write_between_read_and_write(
    sessions: sessionmaker[Session], worker_writes: Interjection, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(audit, "utcnow", worker_writes.wrap(audit.utcnow))
    with sessions() as session:
        assert set_quota(session, "someone", {"max_active_jobs": 3}, actor="cli:test").max_active_jobs == 3
    with sessions() as session:
        assert set_quota(session, "someone", {"max_gpus": 1}, actor="cli:test").max_active_jobs == 3  # an update
    with sessions() as session:
        assert clear_quota(session, "someone", actor="cli:test")
    assert worker_writes.settle(sessions) == 3
    assert _audited(sessions, "quota.set") == 2 and _audited(sessions, "quota.clear") == 1


def test_first_token_bootstrap_with_a_worker_write_between_count_and_insert(
    settings: Settings, sessions: sessionmaker[Session], worker_writes: Interjection, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tokens, "generate_secret", worker_writes.wrap(tokens.generate_secret))
    assert ensure_first_token(settings) is not None
    assert ensure_first_token(settings) is None  # a token exists now: nothing is created
    with sessions() as session:
        assert session.scalar(select(func.count()).select_from(ApiToken)) == 1
    assert worker_writes.settle(sessions) == 1
