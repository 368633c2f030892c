"""Secrets stay in the worker: stored job errors mask URL passwords; the run's environment holds no secret.

Runs on SQLite and on the real PostgreSQL (the ``db`` fixture).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from sqlalchemy import Engine, select
from worker_support import insert_job, small_spec

from halfcast.contracts.spec import JobSpec
from halfcast.core.db.models import Job
from halfcast.core.settings import Settings
from worker.launch.process_tree import build_environment
from worker.lifecycle.recovery import Recovery
from worker.store import Fence, JobStore

CANARY = "CANARY-worker-7f3a"
DB_URL = f"postgresql+psycopg://halfcast:{CANARY}@db.internal:5432/halfcast"
BROKER_URL = f"redis://:{CANARY}@redis.internal:6379/0"
#: Names that look like a secret or a service address: none of them may reach a run.
SECRET_NAME = re.compile(r"_URL$|PASSWORD|PASSWD|TOKEN|SECRET|CREDENTIAL|API_KEY|_DSN$", re.IGNORECASE)


def _message(db: Engine, job_id: str) -> str:
    with db.connect() as conn:
        return str(conn.execute(select(Job.error_message).where(Job.id == job_id)).scalar_one())


def test_a_failure_message_quoting_a_url_is_stored_masked(db: Engine, tmp_path: Path) -> None:
    """Whatever the worker writes as a job's error (here an exception text with both URLs), no password is stored."""
    store = JobStore(db)
    job_id = insert_job(db, small_spec())
    store.claim(job_id, "w", tmp_path)
    message = f"OperationalError: cannot reach {DB_URL} nor {BROKER_URL}"
    assert store.finish(Fence(job_id, 1, "w"), "failed", "worker_error", message) is True
    stored = _message(db, job_id)
    assert CANARY not in stored
    assert "postgresql+psycopg://halfcast:***@db.internal:5432/halfcast" in stored
    assert "redis://:***@redis.internal:6379/0" in stored


def test_a_released_attempt_stores_its_message_masked(db: Engine, tmp_path: Path) -> None:
    """The retry path (:class:`worker.lifecycle.recovery.Recovery`) writes through the same masked column."""
    store = JobStore(db)
    job_id = insert_job(db, small_spec(max_attempts=1))
    store.claim(job_id, "w", tmp_path)
    Recovery(store, None).release(Fence(job_id, 1, "w"), "worker_lost", f"lost {BROKER_URL}")
    assert CANARY not in _message(db, job_id)


def _secret_env() -> dict[str, str]:
    return {
        "PATH": "/usr/bin",
        "HOME": "/home/u",
        "LANG": "C.UTF-8",
        "HALFCAST_DATABASE_URL": DB_URL,
        "HALFCAST_BROKER_URL": BROKER_URL,
        "DATABASE_URL": DB_URL,
        "REDIS_URL": BROKER_URL,
        "CELERY_BROKER_URL": BROKER_URL,
        "PGPASSWORD": CANARY,
        "HALFCAST_TOKEN": CANARY,
        "GITHUB_TOKEN": CANARY,
        "AWS_SECRET_ACCESS_KEY": CANARY,
        "OPENAI_API_KEY": CANARY,
        "SENTRY_DSN": DB_URL,
    }


def _assert_clean(env: dict[str, str]) -> None:
    assert CANARY not in repr(env)
    assert [name for name in env if SECRET_NAME.search(name)] == []


@pytest.mark.parametrize("allow_faults", [False, True])
def test_the_run_environment_never_holds_a_secret(tmp_path: Path, allow_faults: bool) -> None:
    """URLs, passwords and tokens in the worker's environment or settings never reach the run."""
    settings = Settings(data_dir=tmp_path, database_url=DB_URL, broker_url=BROKER_URL, allow_faults=allow_faults)
    _assert_clean(build_environment(JobSpec.model_validate(small_spec()), settings, _secret_env()))


def test_the_run_environment_from_the_process_environment_holds_no_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default base (``os.environ``, as in the worker) is filtered the same way."""
    for name, value in _secret_env().items():
        if name != "PATH":
            monkeypatch.setenv(name, value)
    settings = Settings()  # reads HALFCAST_DATABASE_URL and HALFCAST_BROKER_URL from the environment
    assert settings.database_url == DB_URL
    _assert_clean(
        build_environment(JobSpec.model_validate(small_spec()), settings.model_copy(update={"data_dir": tmp_path}))
    )
