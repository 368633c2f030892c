"""Helpers for worker tests: tiny specs, job rows, the fake trainer command."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Engine, insert, select
from sqlalchemy.orm import Session

from halfcast.contracts.spec import JobSpec
from halfcast.core.db.models import Attempt, Job

FAKE_TRAINER = Path(__file__).with_name("fake_trainer.py")

MakeJob = Callable[..., str]


def small_spec(**overrides: Any) -> dict[str, Any]:
    """A valid, tiny job spec (synthetic data, a few steps)."""
    spec: dict[str, Any] = {"model": {"name": "mlp"}, "dataset": {"name": "synthetic"}, "max_steps": 5}
    spec.update(overrides)
    return JobSpec.model_validate(spec).model_dump(mode="json", exclude_none=True)


def fake_command(spec: JobSpec, spec_path: Path, run_dir: Path) -> list[str]:
    """Run the fake trainer instead of torchrun."""
    return [sys.executable, str(FAKE_TRAINER), "--spec", str(spec_path), "--run-dir", str(run_dir)]


def insert_job(
    engine: Engine, spec: dict[str, Any] | None = None, status: str = "queued", owner: str | None = None
) -> str:
    """Insert a job row the way the API does (``owner``: the submitting token's owner); return its id."""
    spec = spec if spec is not None else small_spec()
    job_id = str(uuid.uuid4())
    row = {
        "id": job_id,
        "name": spec.get("name"),
        "status": status,
        "spec": spec,
        "max_steps": spec.get("max_steps", 5),
        "world_size": spec.get("processes", 1),
        "owner": owner,
    }
    with engine.begin() as conn:
        conn.execute(insert(Job).values(**row))
    return job_id


def job_row(engine: Engine, job_id: str) -> Job:
    """The job's row as stored now (read in a session of its own, which is closed: the row is a detached copy)."""
    with Session(engine) as session:
        return session.scalars(select(Job).where(Job.id == job_id)).one()


def attempt_row(engine: Engine, job_id: str, attempt: int) -> Attempt:
    """An attempt's row as stored now (a detached copy, as :func:`job_row`)."""
    with Session(engine) as session:
        return session.scalars(select(Attempt).where(Attempt.job_id == job_id, Attempt.attempt == attempt)).one()


T = TypeVar("T")


def present(value: T | None) -> T:
    """``value``, which the test expects to be there (a stored message, a run folder, an outcome): not None."""
    assert value is not None
    return value
