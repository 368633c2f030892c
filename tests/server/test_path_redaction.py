"""Issue 24 item 1: no error message a client reads holds a server path (:func:`halfcast.common.redact.redact_paths`).

A path into a run directory is shown run-relative, the form ``resume_from`` takes; any other
absolute path is cut to its last part. The ``jobs.error_message`` column applies it on every
write (:class:`halfcast.core.db.redacted.RedactedText`), on SQLite and PostgreSQL.
"""

from __future__ import annotations

import pytest
from api_support import insert_job
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from halfcast.common.redact import redact_for_client, redact_paths
from halfcast.core.db.models import Job

JOB = "3f2a9c1e-0b7d-4e55-9a1c-2d4e6f8a0b1c"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            f"checkpoint /srv/halfcast/runs/{JOB}/attempt-2/checkpoints/step-5.pt is at step 5",
            f"checkpoint {JOB}/attempt-2/checkpoints/step-5.pt is at step 5",
        ),
        ("cannot open '/etc/passwd'", "cannot open '.../passwd'"),
        ('File "/usr/lib/python3/dist-packages/torch/nn/x.py", line 3', 'File ".../x.py", line 3'),
        ("/var/lib/halfcast/data/models/", ".../models"),
        ("see http://api:8000/jobs/abc and s3://bucket/key/x", "see http://api:8000/jobs/abc and s3://bucket/key/x"),
        ("a relative/path and 1/2 and /healthz stay", "a relative/path and 1/2 and /healthz stay"),
    ],
    ids=["run-directory", "absolute-file", "traceback", "directory", "urls", "not-absolute"],
)
def test_redact_paths(text: str, expected: str) -> None:
    assert redact_paths(text) == expected


def test_redact_for_client_masks_passwords_and_paths() -> None:
    text = "postgresql://u:secret@db/halfcast failed reading /opt/halfcast/data/x.json"
    assert redact_for_client(text) == "postgresql://u:***@db/halfcast failed reading .../x.json"


def test_a_stored_error_message_never_holds_a_server_path(sessions: sessionmaker[Session]) -> None:
    job_id = insert_job(sessions, status="failed", owner="alice")
    message = f"cannot resume from /data/runs/{job_id}/attempt-1/checkpoints/final.pt: at step 5, not before 3"
    with sessions.begin() as session:
        session.execute(update(Job).where(Job.id == job_id).values(error_message=message))
    with sessions() as session:
        stored = session.scalar(select(Job.error_message).where(Job.id == job_id))
    assert stored == f"cannot resume from {job_id}/attempt-1/checkpoints/final.pt: at step 5, not before 3"
