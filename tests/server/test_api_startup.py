"""The job resource's start-up ``phase`` and ``startup`` times (issue 13 item 3), and the status events they send."""

from __future__ import annotations

from typing import Any

import pytest
from api_support import insert_job
from fastapi.testclient import TestClient
from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from halfcast.core.db.models import Job
from server.streams.events import read_snapshot

TIMES = {"launch_s": 1.5, "imports_s": 6.0, "data_s": 0.25, "model_s": None, "first_step_s": None}


def _set(sessions: sessionmaker[Session], job_id: str, status: str, phase: str | None) -> None:
    """The job in ``status`` with the newest phase record ``phase`` (``None``: none yet), as the worker stores them."""
    startup = None if phase is None else {"phase": phase, **TIMES}
    with sessions() as session:
        session.execute(update(Job).where(Job.id == job_id).values(status=status, startup=startup))
        session.commit()


@pytest.mark.parametrize(("status", "reported", "phase"), [
    ("queued", None, None),
    ("starting", None, "launching"),
    ("running", "data", "loading data"),
    ("running", "model", "building model"),
    ("running", "first_step", "first step"),
    ("running", "training", None),
    ("running", None, None),  # a trainer older than the phase records
    ("cancelling", "model", None),
    ("failed", "model", None),
])  # fmt: skip  # a case table, laid out by hand
def test_the_phase_is_what_a_starting_job_is_doing(
    status: str, reported: str | None, phase: str | None, client: TestClient, sessions: sessionmaker[Session]
) -> None:
    job_id = insert_job(sessions)
    _set(sessions, job_id, status, reported)
    job = client.get(f"/jobs/{job_id}").json()
    assert job["phase"] == phase
    assert job["startup"] == (None if reported is None else TIMES)  # kept after the job ended


def test_a_phase_change_changes_the_etag(client: TestClient, sessions: sessionmaker[Session]) -> None:
    job_id = insert_job(sessions)
    _set(sessions, job_id, "running", "data")
    tag = client.get(f"/jobs/{job_id}").headers["etag"]
    assert client.get(f"/jobs/{job_id}", headers={"If-None-Match": tag}).status_code == 304
    _set(sessions, job_id, "running", "model")
    changed = client.get(f"/jobs/{job_id}", headers={"If-None-Match": tag})
    assert changed.status_code == 200 and changed.json()["phase"] == "building model"


def test_the_event_stream_sends_the_resource_again_when_the_phase_changes(sessions: sessionmaker[Session]) -> None:
    job_id = insert_job(sessions)

    def poll(known: str | None) -> tuple[Any, str | None]:
        snapshot = read_snapshot(sessions, job_id, 0, known, 100)
        assert snapshot is not None
        return (snapshot.job or {}).get("phase", "(not sent)"), snapshot.state

    _set(sessions, job_id, "running", "data")
    phase, state = poll("running")
    assert (phase, state) == ("loading data", "running: loading data")
    assert poll(state) == ("(not sent)", state)  # unchanged: no status event
    _set(sessions, job_id, "running", "model")
    assert poll(state) == ("building model", "running: building model")
    _set(sessions, job_id, "running", "training")
    assert poll("running: building model") == (None, "running")
