"""Helpers for worker tests: tiny specs, job rows, the fake trainer command."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, insert

from halfcast.contracts.spec import JobSpec
from halfcast.core.db.models import Job

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
